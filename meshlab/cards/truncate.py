"""A card cut to its first blocks, for checking a plan on a model of reduced depth. Pure, no torch.

Each list of repeated blocks (``transformer_blocks``, Flux's ``single_transformer_blocks``) keeps its first
`layers` entries. Names of the kept parameters are unchanged, so a plan of the cut card gives every kept
parameter the spec the full plan gives it; ``block`` is renumbered as the importer numbers a model of that depth
(each list after the one before it).
"""

from __future__ import annotations

import dataclasses

from meshlab.cards.card import ModelCard, Parameter, block_position
from meshlab.errors import InputError

def block_lists(card: ModelCard) -> dict[str, int]:
    """Each list of repeated blocks and how many blocks it has, in the order the card lists them."""
    lists: dict[str, int] = {}
    for p in card.parameters:
        position = block_position(p.name) if p.block is not None else None
        if position:
            lists[position[0]] = max(lists.get(position[0], 0), position[1] + 1)
    return lists


def truncate_card(card: ModelCard, layers: int) -> ModelCard:
    """The card of the same model with at most `layers` blocks in each block list."""
    if layers < 1:
        raise InputError(f"--layers must be at least 1, got {layers}", "check one block or more")
    lists = block_lists(card)
    kept = {name: min(count, layers) for name, count in lists.items()}
    offsets, start = {}, 0
    for name, count in kept.items():
        offsets[name], start = start, start + count
    parameters = tuple(_renumber(p, offsets) for p in card.parameters if p.block is None or _kept(p.name, kept))
    attention = tuple(a for a in card.attention if _kept(a.module, kept))
    architecture = dataclasses.replace(card.architecture, num_layers=start)
    source = {**card.source, "truncated": {"layers_per_list": kept, "of": lists}}
    return dataclasses.replace(card, source=source, architecture=architecture, parameters=parameters,
                               attention=attention)


def _kept(path: str, kept: dict[str, int]) -> bool:
    position = block_position(path)
    return position is None or position[0] not in kept or position[1] < kept[position[0]]


def _renumber(p: Parameter, offsets: dict[str, int]) -> Parameter:
    position = block_position(p.name) if p.block is not None else None
    if position is None or position[0] not in offsets:
        return p
    return dataclasses.replace(p, block=offsets[position[0]] + position[1])
