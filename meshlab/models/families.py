"""What differs between the diffusers transformer families meshlab supports, and the shapes of one forward (pure:
the check's setup and the card importer both read them; the torch side that builds a forward from them is
meshlab.models.importer.forward_inputs).

One row of ``FAMILIES`` per class: its block lists, the latent layout its forward takes (``tokens``: packed
``[batch, tokens, channels]``; ``image``: ``[batch, channels, height, width]``; ``video``: ``[batch, channels,
frames, height, width]``; ``frames``: ``[batch, frames, channels, height, width]``), how many
latent pixels one token covers per side (and per frame), and the config key of its text embedding width.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from meshlab.core.errors import InputError
from meshlab.models.card import ModelCard, token_frames


@dataclass(frozen=True)
class Geometry:
    """The shapes of one forward: samples, image tokens per column and row, token frames, text tokens."""

    batch: int
    grid: tuple[int, int]  # image tokens per column and per row (one frame)
    text_tokens: int
    frames: int = 1  # token frames (latent frames over the temporal patch); 1 for an image
    reference: int = 0  # a conditioning image's tokens (Wan I2V's CLIP image embedding); 0 for none

    @property
    def image_tokens(self) -> int:
        return self.frames * self.grid[0] * self.grid[1]


@dataclass(frozen=True)
class Family:
    """What differs between transformer families (see the module's docstring)."""

    blocks: tuple[tuple[str, str], ...]  # (ModuleList attribute, config key of its depth), dual-stream first
    latent: str  # "tokens", "image", "video" or "frames"
    patch: Callable[[dict], int]  # latent pixels per token side
    text_width: str  # config key of the text embedding width
    temporal_patch: Callable[[dict], int] = lambda config: 1  # latent frames per token frame
    #: (spatial, temporal) VAE compression when a card is imported without its VAE: what the pipeline assumes
    #: then (WanPipeline: 8 and 4; the image pipelines: 8)
    vae_default: tuple[int, int] = (8, 1)
    #: tokens of the conditioning image's embedding the forward takes beside the text (the "reference" stream)
    reference_tokens: Callable[[dict], int] = lambda config: 0
    #: text tokens the forward requires, where it does (None: any)
    text_tokens: Callable[[dict], int | None] = lambda config: None

    @property
    def video(self) -> bool:
        """A video model: its pipeline's VAE compresses frames (LTX-Video packs its video latent into tokens)."""
        return self.vae_default[1] > 1


#: Wan 2.1 image-to-video: WanImageToVideoPipeline encodes the conditioning image with its image_encoder, CLIP
#: ViT-H/14 at 224 px (16 x 16 patches and a class token: 257 tokens, the penultimate layer's, 1280 wide, the
#: config's image_dim), and the transformer's cross-attention splits its context as [image, text] at 512 text tokens
#: (diffusers' WanAttnProcessor: "512 is the context length of the text encoder, hardcoded for now").
WAN_IMAGE_TOKENS, WAN_I2V_TEXT = 257, 512

#: One row per supported class. Patch sizes are the pipeline's packing: QwenImagePipeline packs 2x2 as its
#: config says; FluxPipeline and Flux2Pipeline pack 2x2 before the model although their configs say patch 1;
#: SD3, Wan, HunyuanVideo and CogVideoX patchify inside the model with the config's patch size ((t, h, w) for Wan;
#: patch_size and patch_size_t for HunyuanVideo and CogVideoX, whose CogVideoX 1.0 models leave patch_size_t null:
#: one frame); LTXPipeline packs its video latent into tokens by the config's patch_size and patch_size_t. The VAE
#: defaults are the pipelines' when they run without a VAE (LTXPipeline: 32 and 8; CogVideoXPipeline: 8 and 4).
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
                                    lambda c: c["patch_size"][0], vae_default=(8, 4),
                                    reference_tokens=lambda c: (c.get("pos_embed_seq_len") or WAN_IMAGE_TOKENS)
                                    if c.get("image_dim") else 0,  # FLF2V: two images, pos_embed_seq_len 514
                                    text_tokens=lambda c: WAN_I2V_TEXT if c.get("added_kv_proj_dim") else None),
    "HunyuanVideoTransformer3DModel": Family(
        (("transformer_blocks", "num_layers"), ("single_transformer_blocks", "num_single_layers")), "video",
        lambda c: c["patch_size"], "text_embed_dim", lambda c: c["patch_size_t"], vae_default=(8, 4)),
    "CogVideoXTransformer3DModel": Family(
        (("transformer_blocks", "num_layers"),), "frames", lambda c: c["patch_size"], "text_embed_dim",
        lambda c: c.get("patch_size_t") or 1, vae_default=(8, 4),
        # without rotary embeddings (CogVideoX-2b) its positional embedding spans max_text_seq_length text tokens
        text_tokens=lambda c: None if c.get("use_rotary_positional_embeddings") else c.get("max_text_seq_length", 226)),
    "LTXVideoTransformer3DModel": Family((("transformer_blocks", "num_layers"),), "tokens", lambda c: c["patch_size"],
                                         "caption_channels", lambda c: c["patch_size_t"], vae_default=(32, 8)),
    "SanaTransformer2DModel": Family((("transformer_blocks", "num_layers"),), "image", lambda c: c["patch_size"],
                                     "caption_channels", vae_default=(32, 1)),
}


def family(class_name: str) -> Family:
    if class_name not in FAMILIES:
        raise InputError(f"meshlab cannot build forward inputs for {class_name!r}: no row for it in "
                         "meshlab.models.families.FAMILIES (its block lists, latent layout and patch size)",
                         f"supported classes: {', '.join(FAMILIES)}")
    return FAMILIES[class_name]


def geometry(card: ModelCard, height: int, width: int, text_tokens: int, batch: int, frames: int = 1) -> Geometry:
    """Image tokens as the pipeline packs them; a size (or frame count) that does not pack, or a text length the
    class cannot take, is an InputError."""
    required = card.architecture.text_tokens
    if required and text_tokens != required:
        raise InputError(f"{card.name} takes exactly {required} text tokens (its forward is built for that count), "
                         f"not {text_tokens}", f"set workload.text_tokens: {required}")
    step = card.architecture.vae_scale_factor * card.architecture.patch_size
    for side, value in (("height", height), ("width", width)):
        if value < step or value % step:
            raise InputError(f"--{side} {value} is not a positive multiple of {step} "
                             f"(VAE {card.architecture.vae_scale_factor}x, patch {card.architecture.patch_size})",
                             f"use a multiple of {step}, e.g. {max(step, value // step * step)}")
    return Geometry(batch, (height // step, width // step), text_tokens, token_frames(frames, card.architecture),
                    card.architecture.reference_tokens)
