"""Build a card's diffusers transformer at real widths and reduced depth, and inputs for one forward.

The weights are random from a fixed seed, drawn straight into the plan's dtype with no initialisation pass
that is thrown away: each parameter is a window, at an offset of its own, onto one pool of about a million
random values (tiling the pool costs a copy; drawing 380 M values one by one costs seconds). Windows of one
weight's shards start at different points of the pool, so shards in the wrong place change the output. Inputs follow the
pipeline's packing: ``(height / (vae * patch))`` by ``(width / ...)`` image tokens.
"""

from __future__ import annotations

import math

from meshlab.models.families import Geometry, family
from meshlab.models.importer.forward_inputs import forward_inputs
from meshlab.models.card import ModelCard
from meshlab.core.errors import InputError

__all__ = ["depth_config", "build_model", "example_inputs", "forward"]


def depth_config(card: ModelCard, layers: int) -> dict:
    """The card's diffusers config with every block list cut to at most `layers` blocks."""
    config = dict(card.source.get("config") or {})
    if not config:
        raise InputError(f"card {card.name!r} carries no diffusers config", "regenerate it with the importer")
    for _attr, key in family(card.class_name).blocks:
        config[key] = min(layers, int(config[key]))
    return config


def build_model(card: ModelCard, layers: int, dtype: str, seed: int):
    """The transformer of `card` with `layers` blocks per list, random weights in `dtype`, in eval mode; its
    buffers as ``from_pretrained(torch_dtype=dtype)`` loads them (card_import.as_loaded: SD3.5's positional table,
    which the checkpoint holds, in `dtype`; Wan's rotary tables, made by the class, float32), as the card records
    them and meshlab's memory prices them."""
    import diffusers
    import torch
    from diffusers.models.modeling_utils import no_init_weights

    from meshlab.models.importer.card_import import as_loaded

    cls = getattr(diffusers, card.class_name)
    with no_init_weights():
        model = cls.from_config(depth_config(card, layers))
    return as_loaded(randomize(model, dtype, seed), getattr(torch, dtype), parameters=False)


def randomize(model, dtype: str, seed: int):
    """Every parameter of `model` drawn from the seeded pool into `dtype` (replacing whatever it held); eval mode."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    pool = torch.empty(POOL, dtype=getattr(torch, dtype)).uniform_(-1.0, 1.0, generator=generator)
    offsets = torch.randint(0, POOL, (len(list(model.parameters())),), generator=generator).tolist()
    with torch.no_grad():
        for (name, param), offset in zip(model.named_parameters(), offsets):
            value = _window(pool, offset, tuple(param.shape)).mul_(_scale(name, param.shape))
            param.data = value.add_(1.0) if _is_norm_scale(name, param.shape) else value
    return model.eval().requires_grad_(False)


POOL = 1_048_573  # a prime, so no weight's shards line up with the pool's period


def _window(pool, offset: int, shape: tuple[int, ...]):
    numel = math.prod(shape)
    return pool.repeat(-(-(offset + numel) // pool.numel()))[offset:offset + numel].clone().view(shape)


def _scale(name: str, shape) -> float:
    """Weights keep activations at unit size; biases stay small; norm scales stay near one."""
    if len(shape) >= 2:
        return (3.0 / max(1, shape[-1])) ** 0.5
    return 0.02 if name.endswith(".bias") else 0.1


def _is_norm_scale(name: str, shape) -> bool:
    return len(shape) == 1 and not name.endswith(".bias")


def example_inputs(card: ModelCard, geo: Geometry, dtype: str, seed: int) -> dict:
    import diffusers
    import torch

    generator = torch.Generator().manual_seed(seed + 1)
    cls = getattr(diffusers, card.class_name)
    return forward_inputs(cls, dict(card.source["config"]), geo, getattr(torch, dtype), generator)


def forward(model, inputs: dict):
    """The sample the transformer returns (the first element of its tuple output)."""
    return model(**inputs, return_dict=False)[0]
