"""A valid forward for a diffusers transformer, built from its config and a geometry (needs torch).

One builder serves every supported class: it reads the forward's signature and makes each argument it names
from the config (text width, pooled width, RoPE axes, guidance) and the geometry (batch, token grid, frames,
text tokens). What differs between families is one row of ``FAMILIES``: the block lists, the latent layout the
forward takes, how many latent pixels one token covers per side (and per frame), and the config key of the text
embedding width. A class with no row, or a forward argument with no default that the builder cannot make, is an
InputError naming what is missing.

Latent layouts:

- ``tokens``: ``[batch, tokens, channels]``, packed by the pipeline before the model (Qwen-Image, Flux, Flux.2);
- ``image``: ``[batch, channels, height, width]`` latents, patchified inside the model (SD3);
- ``video``: ``[batch, channels, frames, height, width]`` latents, patchified inside the model (Wan).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

from meshlab.core.errors import InputError


@dataclass(frozen=True)
class Geometry:
    """The shapes of one forward: samples, image tokens per column and row, token frames, text tokens."""

    batch: int
    grid: tuple[int, int]  # image tokens per column and per row (one frame)
    text_tokens: int
    frames: int = 1  # token frames (latent frames over the temporal patch); 1 for an image

    @property
    def image_tokens(self) -> int:
        return self.frames * self.grid[0] * self.grid[1]


@dataclass(frozen=True)
class Family:
    """What differs between transformer families (see the module's docstring)."""

    blocks: tuple[tuple[str, str], ...]  # (ModuleList attribute, config key of its depth), dual-stream first
    latent: str  # "tokens", "image" or "video"
    patch: Callable[[dict], int]  # latent pixels per token side
    text_width: str  # config key of the text embedding width
    temporal_patch: Callable[[dict], int] = lambda config: 1  # latent frames per token frame
    #: (spatial, temporal) VAE compression when a card is imported without its VAE: what the pipeline assumes
    #: then (WanPipeline: 8 and 4; the image pipelines: 8)
    vae_default: tuple[int, int] = (8, 1)


#: One row per supported class. Patch sizes are the pipeline's packing: QwenImagePipeline packs 2x2 as its
#: config says; FluxPipeline and Flux2Pipeline pack 2x2 before the model although their configs say patch 1;
#: SD3 and Wan patchify inside the model with the config's patch size ((t, h, w) for Wan).
FAMILIES: dict[str, Family] = {
    "QwenImageTransformer2DModel": Family((("transformer_blocks", "num_layers"),), "tokens",
                                          lambda c: c["patch_size"], "joint_attention_dim"),
    "FluxTransformer2DModel": Family(
        (("transformer_blocks", "num_layers"), ("single_transformer_blocks", "num_single_layers")), "tokens",
        lambda c: 2, "joint_attention_dim"),
    "Flux2Transformer2DModel": Family(
        (("transformer_blocks", "num_layers"), ("single_transformer_blocks", "num_single_layers")), "tokens",
        lambda c: 2, "joint_attention_dim"),
    "SD3Transformer2DModel": Family((("transformer_blocks", "num_layers"),), "image",
                                    lambda c: c["patch_size"], "joint_attention_dim"),
    "WanTransformer3DModel": Family((("blocks", "num_layers"),), "video", lambda c: c["patch_size"][1], "text_dim",
                                    lambda c: c["patch_size"][0], vae_default=(8, 4)),
}


def family(class_name: str) -> Family:
    if class_name not in FAMILIES:
        raise InputError(f"meshlab cannot build forward inputs for {class_name!r}: no row for it in "
                         "meshlab.models.importer.forward_inputs.FAMILIES (its block lists, latent layout and patch size)",
                         f"supported classes: {', '.join(FAMILIES)}")
    return FAMILIES[class_name]


def forward_inputs(cls: type, config: dict, geo: Geometry, dtype, generator) -> dict:
    """Keyword arguments of one forward of ``cls`` built from ``config``; arguments with defaults that the
    builder has no maker for are left out."""
    fam = family(cls.__name__)
    signature = inspect.signature(cls.forward)
    inputs = {}
    for name, parameter in signature.parameters.items():
        if name in ("self", "return_dict") or parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        maker = _MAKERS.get(name)
        value = maker(fam, config, geo, dtype, generator) if maker else None
        if value is not None:
            inputs[name] = value
        elif parameter.default is inspect.Parameter.empty:
            raise InputError(f"cannot build forward argument {name!r} of {cls.__name__}",
                             "add a maker for it to meshlab.models.importer.forward_inputs._MAKERS")
    return inputs


def _hidden_states(fam: Family, config: dict, geo: Geometry, dtype, generator):
    import torch

    b, (h, w), channels = geo.batch, geo.grid, config["in_channels"]
    if fam.latent == "tokens":
        shape = (b, geo.image_tokens, channels)
    elif fam.latent == "image":
        p = fam.patch(config)
        shape = (b, channels, h * p, w * p)
    else:
        p, pt = fam.patch(config), fam.temporal_patch(config)
        shape = (b, channels, geo.frames * pt, h * p, w * p)
    return torch.randn(shape, generator=generator).to(dtype)


def _text(fam: Family, config: dict, geo: Geometry, dtype, generator):
    import torch

    return torch.randn(geo.batch, geo.text_tokens, config[fam.text_width], generator=generator).to(dtype)


def _text_mask(fam: Family, config: dict, geo: Geometry, dtype, generator):
    import torch

    return torch.ones(geo.batch, geo.text_tokens, dtype=torch.long)


def _timestep(fam: Family, config: dict, geo: Geometry, dtype, generator):
    import torch

    return torch.full((geo.batch,), 0.5, dtype=dtype)


def _pooled(fam: Family, config: dict, geo: Geometry, dtype, generator):
    import torch

    width = config.get("pooled_projection_dim")
    return torch.randn(geo.batch, width, generator=generator).to(dtype) if width else None


def _guidance(fam: Family, config: dict, geo: Geometry, dtype, generator):
    import torch

    # Flux multiplies guidance by 1000 in the model's dtype: 3500 rounds to 3504 in bfloat16 and turns the
    # sinusoidal embedding into noise next to a float32 reference; 4000 is exact
    return torch.full((geo.batch,), 4.0, dtype=dtype) if config.get("guidance_embeds") else None


def _rope_axes(config: dict) -> int:
    return len(config.get("axes_dims_rope") or (16, 56, 56))


def _image_ids(fam: Family, config: dict, geo: Geometry, dtype, generator):
    """Position ids of the image tokens as Flux's and Flux.2's pipelines make them: (.., row, column, ..)."""
    import torch

    h, w = geo.grid
    ids = torch.zeros(h, w, _rope_axes(config))
    ids[..., 1] += torch.arange(h)[:, None]
    ids[..., 2] += torch.arange(w)[None, :]
    return ids.reshape(h * w, -1).to(dtype)


def _text_ids(fam: Family, config: dict, geo: Geometry, dtype, generator):
    import torch

    return torch.zeros(geo.text_tokens, _rope_axes(config), dtype=dtype)


def _image_shapes(fam: Family, config: dict, geo: Geometry, dtype, generator):
    return [(geo.frames, *geo.grid)] * geo.batch


def _additional_t_cond(fam: Family, config: dict, geo: Geometry, dtype, generator):
    import torch

    return torch.zeros(geo.batch, dtype=torch.long) if config.get("use_additional_t_cond") else None


_MAKERS = {
    "hidden_states": _hidden_states,
    "encoder_hidden_states": _text,
    "encoder_hidden_states_mask": _text_mask,
    "timestep": _timestep,
    "pooled_projections": _pooled,
    "guidance": _guidance,
    "img_ids": _image_ids,
    "txt_ids": _text_ids,
    "img_shapes": _image_shapes,
    "additional_t_cond": _additional_t_cond,
}
