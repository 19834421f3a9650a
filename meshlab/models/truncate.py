"""A card cut to its first blocks, for checking a plan on a model of reduced depth. Pure, no torch.

Each list of repeated blocks (``transformer_blocks``, Flux's ``single_transformer_blocks``) keeps its first
`layers - 1` entries and its last, renamed into the last slot: diffusers builds a model of reduced depth with
the list's last block last (SD3.5's has no text output). Names of the other kept parameters are unchanged, so a
plan of the cut card gives every kept parameter the spec the full plan gives it; ``block`` is renumbered as the
importer numbers a model of that depth (each list after the one before it).
"""

from __future__ import annotations

import dataclasses

from meshlab.models.card import Attention, ModelCard, Parameter, block_position
from meshlab.core.errors import InputError

def block_lists(card: ModelCard) -> dict[str, int]:
    """Each list of repeated blocks and how many blocks it has, in the order the card lists them."""
    return dict(card.block_counts)


def truncate_card(card: ModelCard, layers: int) -> ModelCard:
    """The card of the same model with at most `layers` blocks in each block list."""
    if layers < 1:
        raise InputError(f"--layers must be at least 1, got {layers}", "check one block or more")
    lists = block_lists(card)
    kept = {name: min(count, layers) for name, count in lists.items()}
    offsets, start = {}, 0
    for name, count in kept.items():
        offsets[name], start = start, start + count
    parameters = tuple(_renumber(_as_last(p, lists, kept), offsets) for p in card.parameters
                       if p.block is None or _kept(p.name, lists, kept))
    attention = tuple(_attention_as_last(a, lists, kept) for a in card.attention if _kept(a.module, lists, kept))
    architecture = dataclasses.replace(card.architecture, num_layers=start)
    source = {**card.source, "truncated": {"layers_per_list": kept, "of": lists}}
    return dataclasses.replace(card, source=source, architecture=architecture, parameters=parameters,
                               attention=attention)


def _kept(path: str, lists: dict[str, int], kept: dict[str, int]) -> bool:
    """The first `kept - 1` blocks of a list, and its last block (which stands in as the cut list's last)."""
    position = block_position(path)
    if position is None or position[0] not in kept:
        return True
    name, index = position
    return index < kept[name] - 1 or index == lists[name] - 1


def _moved(path: str, lists: dict[str, int], kept: dict[str, int]) -> str:
    """A path of a list's last block renamed into the cut list's last slot (``blocks.39.x`` -> ``blocks.1.x``)."""
    position = block_position(path)
    if position is None or position[0] not in kept or position[1] != lists[position[0]] - 1:
        return path
    name, index = position
    return f"{name}.{kept[name] - 1}{path[len(f'{name}.{index}'):]}"


def _as_last(p: Parameter, lists: dict[str, int], kept: dict[str, int]) -> Parameter:
    """A model built at reduced depth makes its last block the list's last (SD3's last block has no text
    output: no ``to_add_out``, no ``ff_context``), so the cut card takes the full card's last block there."""
    return dataclasses.replace(p, name=_moved(p.name, lists, kept))


def _attention_as_last(a: Attention, lists: dict[str, int], kept: dict[str, int]) -> Attention:
    move = lambda path: _moved(path, lists, kept)  # noqa: E731
    return dataclasses.replace(a, module=move(a.module), qkv=tuple(map(move, a.qkv)), out=tuple(map(move, a.out)))


def _renumber(p: Parameter, offsets: dict[str, int]) -> Parameter:
    position = block_position(p.name) if p.block is not None else None
    if position is None or position[0] not in offsets:
        return p
    return dataclasses.replace(p, block=offsets[position[0]] + position[1])


#: The one pipeline `--checkpoint random` builds (meshlab.pipelines.random_pipeline).
PIPELINE_CLASS = "QwenImageTransformer2DModel"


def refuse_unless_buildable(card: ModelCard) -> None:
    """`card` must carry the configs the random pipeline is built from (pure: the CLI asks before any worker)."""
    if card.class_name != PIPELINE_CLASS:
        raise InputError(f"--checkpoint random builds a Qwen-Image pipeline, and card {card.name!r} is a "
                         f"{card.class_name}", "run a strategy for a Qwen-Image card (meshlab models list)")
    components = card.source.get("components") or {}
    missing = [name for name in ("vae", "text_encoder") if not (components.get(name) or {}).get("config")]
    if not card.source.get("config") or missing:
        what = ", ".join(missing) if card.source.get("config") else "transformer"
        raise InputError(f"card {card.name!r} carries no diffusers config for its {what}, which --checkpoint "
                         "random builds from", "regenerate the card with `meshlab models import`")


def card_as_built(card: ModelCard, layers: int) -> ModelCard:
    """`card` as the random pipeline builds it at `layers`: the text encoder keeps `layers` of its decoder layers,
    so its FLOPs per token scale by that share (the transformer's cut is meshlab.models.truncate's)."""
    import dataclasses

    configs = card.source.get("components") or {}
    components = []
    for c in card.components:
        config = (configs.get(c.name) or {}).get("config") or {}
        total = int(config.get("num_hidden_layers") or 0)
        if c.name == "text_encoder" and total > layers:
            c = dataclasses.replace(c, flops_per_token=c.flops_per_token * layers / total)
        components.append(c)
    return dataclasses.replace(card, components=tuple(components))
