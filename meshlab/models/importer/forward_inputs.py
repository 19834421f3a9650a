"""A valid forward for a diffusers transformer, built from its config and a geometry (needs torch).

One builder serves every supported class: it reads the forward's signature and makes each argument it names
from the config (text width, pooled width, RoPE axes, guidance) and the geometry (batch, token grid, frames,
text tokens). What differs between families is one row of ``meshlab.models.families.FAMILIES``: the block lists, the
latent layout the forward takes, how many latent pixels one token covers per side (and per frame), and the config key of
the text embedding width. A class with no row, or a forward argument with no default that the builder cannot make, is an
InputError naming what is missing.

Latent layouts:

- ``tokens``: ``[batch, tokens, channels]``, packed by the pipeline before the model (Qwen-Image, Flux, Flux.2);
- ``image``: ``[batch, channels, height, width]`` latents, patchified inside the model (SD3);
- ``video``: ``[batch, channels, frames, height, width]`` latents, patchified inside the model (Wan,
  HunyuanVideo);
- ``frames``: ``[batch, frames, channels, height, width]`` latents, patchified inside the model (CogVideoX).

LTX-Video takes its video packed as ``tokens`` and the latent's frames, height and width beside it, from which it
makes its rotary embeddings; CogVideoX takes its rotary embeddings made by the pipeline (``image_rotary_emb``: a
cosine and a sine per image token and head feature).
"""

from __future__ import annotations

import inspect

from meshlab.core.errors import InputError
from meshlab.models.families import Family, Geometry, family


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
        shape = ((b, channels, geo.frames * pt, h * p, w * p) if fam.latent == "video"
                 else (b, geo.frames * pt, channels, h * p, w * p))
    return torch.randn(shape, generator=generator).to(dtype)


def _text(fam: Family, config: dict, geo: Geometry, dtype, generator):
    import torch

    return torch.randn(geo.batch, geo.text_tokens, config[fam.text_width], generator=generator).to(dtype)


def _reference(fam: Family, config: dict, geo: Geometry, dtype, generator):
    """Wan I2V's CLIP image embedding: the reference stream's tokens at the config's image_dim (FLF2V, with a
    pos_embed_seq_len: two images' embeddings, which its image embedder views as one sequence per sample)."""
    import torch

    if not geo.reference:
        return None
    images = 2 if config.get("pos_embed_seq_len") else 1
    shape = (images * geo.batch, geo.reference // images, config["image_dim"])
    return torch.randn(shape, generator=generator).to(dtype)


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


def _latent_frames(fam: Family, config: dict, geo: Geometry, dtype, generator) -> int:
    return geo.frames * fam.temporal_patch(config)


def _latent_height(fam: Family, config: dict, geo: Geometry, dtype, generator) -> int:
    return geo.grid[0] * fam.patch(config)


def _latent_width(fam: Family, config: dict, geo: Geometry, dtype, generator) -> int:
    return geo.grid[1] * fam.patch(config)


def _rotary(fam: Family, config: dict, geo: Geometry, dtype, generator):
    """CogVideoXPipeline's rotary embeddings (``get_3d_rotary_pos_embed``): a cosine and a sine per image token,
    each as wide as a head; None where the config uses none (CogVideoX-2b)."""
    import torch

    if not config.get("use_rotary_positional_embeddings"):
        return None
    shape = (geo.image_tokens, config["attention_head_dim"])
    return tuple(torch.rand(shape, generator=generator).to(torch.float32) for _ in ("cos", "sin"))


_MAKERS = {
    "hidden_states": _hidden_states,
    "encoder_hidden_states": _text,
    "encoder_hidden_states_image": _reference,  # Wan I2V
    "encoder_hidden_states_mask": _text_mask,
    "encoder_attention_mask": _text_mask,  # HunyuanVideo's name for it
    "timestep": _timestep,
    "pooled_projections": _pooled,
    "guidance": _guidance,
    "img_ids": _image_ids,
    "txt_ids": _text_ids,
    "img_shapes": _image_shapes,
    "additional_t_cond": _additional_t_cond,
    # LTX-Video: the latent's frames, height and width (its rotary embeddings' grid)
    "num_frames": _latent_frames,
    "height": _latent_height,
    "width": _latent_width,
    "image_rotary_emb": _rotary,  # CogVideoX
}
