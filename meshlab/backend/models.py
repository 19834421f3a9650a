"""Build a card's diffusers transformer at real widths and reduced depth, and inputs for one forward.

The weights are random from a fixed seed, drawn straight into the plan's dtype with no initialisation pass
that is thrown away: each parameter is a window, at an offset of its own, onto one pool of about a million
random values (tiling the pool costs a copy; drawing 380 M values one by one costs seconds). Windows of one
weight's shards start at different points of the pool, so shards in the wrong place change the output. Inputs follow the pipeline's packing: ``(height / (vae * patch))``
by ``(width / ...)`` image tokens.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from meshlab.cards.card import ModelCard
from meshlab.errors import InputError


@dataclass(frozen=True)
class Geometry:
    """The shapes of one forward."""

    batch: int
    grid: tuple[int, int]  # image tokens per column and per row
    text_tokens: int

    @property
    def image_tokens(self) -> int:
        return self.grid[0] * self.grid[1]


@dataclass(frozen=True)
class ModelSpec:
    blocks: tuple[tuple[str, str], ...]  # (ModuleList attribute, config key of its depth)
    inputs: Callable[[dict, Geometry, object, object], dict]  # (config, geometry, dtype, generator) -> kwargs


def geometry(card: ModelCard, height: int, width: int, text_tokens: int, batch: int) -> Geometry:
    """Image tokens as the pipeline packs them; a size that does not pack is an InputError."""
    step = card.architecture.vae_scale_factor * card.architecture.patch_size
    for side, value in (("height", height), ("width", width)):
        if value < step or value % step:
            raise InputError(f"--{side} {value} is not a positive multiple of {step} "
                             f"(VAE {card.architecture.vae_scale_factor}x, patch {card.architecture.patch_size})",
                             f"use a multiple of {step}, e.g. {max(step, value // step * step)}")
    return Geometry(batch, (height // step, width // step), text_tokens)


def model_spec(class_name: str) -> ModelSpec:
    if class_name not in MODELS:
        raise InputError(f"meshlab cannot build {class_name!r}", f"supported classes: {', '.join(MODELS)}")
    return MODELS[class_name]


def depth_config(card: ModelCard, layers: int) -> dict:
    """The card's diffusers config with every block list cut to at most `layers` blocks."""
    config = dict(card.source.get("config") or {})
    if not config:
        raise InputError(f"card {card.name!r} carries no diffusers config", "regenerate it with the importer")
    for _attr, key in model_spec(card.class_name).blocks:
        config[key] = min(layers, int(config[key]))
    return config


def build_model(card: ModelCard, layers: int, dtype: str, seed: int):
    """The transformer of `card` with `layers` blocks per list, random weights in `dtype`, in eval mode."""
    import diffusers
    import torch
    from diffusers.models.modeling_utils import no_init_weights

    cls = getattr(diffusers, card.class_name)
    with no_init_weights():
        model = cls.from_config(depth_config(card, layers))
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
    import torch

    generator = torch.Generator().manual_seed(seed + 1)
    return model_spec(card.class_name).inputs(dict(card.source["config"]), geo, getattr(torch, dtype), generator)


def forward(model, inputs: dict):
    """The sample the transformer returns (the first element of its tuple output)."""
    return model(**inputs, return_dict=False)[0]


def _qwen_inputs(config: dict, geo: Geometry, dtype, generator) -> dict:
    import torch

    b, t = geo.batch, geo.text_tokens
    h, w = geo.grid
    inputs = {
        "hidden_states": torch.randn(b, h * w, config["in_channels"], generator=generator).to(dtype),
        "encoder_hidden_states": torch.randn(b, t, config["joint_attention_dim"], generator=generator).to(dtype),
        "encoder_hidden_states_mask": torch.ones(b, t, dtype=torch.long),
        "timestep": torch.full((b,), 0.5, dtype=dtype),
        "img_shapes": [(1, h, w)] * b,
    }
    if config.get("use_additional_t_cond"):
        inputs["additional_t_cond"] = torch.zeros(b, dtype=torch.long)
    return inputs


def _flux_inputs(config: dict, geo: Geometry, dtype, generator) -> dict:
    import torch

    b, t = geo.batch, geo.text_tokens
    h, w = geo.grid
    img_ids = torch.zeros(h, w, 3)
    img_ids[..., 1] += torch.arange(h)[:, None]
    img_ids[..., 2] += torch.arange(w)[None, :]
    inputs = {
        "hidden_states": torch.randn(b, h * w, config["in_channels"], generator=generator).to(dtype),
        "encoder_hidden_states": torch.randn(b, t, config["joint_attention_dim"], generator=generator).to(dtype),
        "pooled_projections": torch.randn(b, config["pooled_projection_dim"], generator=generator).to(dtype),
        "timestep": torch.full((b,), 0.5, dtype=dtype),
        "img_ids": img_ids.reshape(h * w, 3).to(dtype),
        "txt_ids": torch.zeros(t, 3, dtype=dtype),
    }
    if config.get("guidance_embeds"):
        # Flux multiplies guidance by 1000 in the model's dtype: 3500 rounds to 3504 in bfloat16 and turns the
        # sinusoidal embedding into noise next to a float32 reference; 4000 is exact
        inputs["guidance"] = torch.full((b,), 4.0, dtype=dtype)
    return inputs


MODELS = {
    "QwenImageTransformer2DModel": ModelSpec((("transformer_blocks", "num_layers"),), _qwen_inputs),
    "FluxTransformer2DModel": ModelSpec(
        (("transformer_blocks", "num_layers"), ("single_transformer_blocks", "num_single_layers")), _flux_inputs),
}
