"""`meshlab models list --json`: one row per built-in card, and its model (see meshlab.core.document)."""

from __future__ import annotations

from pydantic import Field, RootModel

from meshlab.core.document import Document
from meshlab.models.card import ModelCard


class CardRow(Document):
    name: str
    class_: str = Field(alias="class", description="the diffusers class of the transformer")
    parameters: int
    blocks: int
    hidden: int
    heads: int
    components: dict[str, int] = Field(description="component (vae, text_encoder, ...) -> parameters")


class CardList(RootModel[list[CardRow]]):
    """`meshlab models list --json`: the built-in cards."""


def card_row(card: ModelCard) -> dict:
    return {"name": card.name, "class": card.class_name, "parameters": card.total_params,
            "blocks": card.architecture.num_layers, "hidden": card.architecture.hidden_size,
            "heads": card.architecture.num_attention_heads,
            "components": {c.name: c.parameters for c in card.components}}
