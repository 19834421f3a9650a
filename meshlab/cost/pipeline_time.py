"""Seconds per image end to end, term by term: text encode, denoise, VAE decode, host transfers, per-step overhead.

Pure, no torch. Every term is predicted, and each says what it rests on:

- **text_encode_s**: each text encoder's FLOPs per prompt token (the card: 2 x the parameters of its text path,
  plus an output head its forward computes) x the workload's text tokens and the template tokens the pipeline puts
  before each prompt (Qwen-Image: 34) x the prompts one call encodes (two with guidance: the negative prompt too; the
  pipeline encodes a prompt once for all its images), each encoder where ``placement`` puts it (``text_encoder``,
  or its own entry in ``encoders``): at the host's ``host_flops`` on ``cpu`` (an assumption in the catalog until it
  is measured) or at the chip's effective peak on the device;
  ``sharded`` (FSDP over every chip) adds each encode's all-gather of the layers' weights, (n - 1) / n of them,
  at one chip's ``ici_link_bandwidth`` (not overlapped with the encode; the root unit stays gathered). An image
  encoder (Wan 2.1 image-to-video's CLIP) adds its FLOPs per token x the card's reference tokens, once per image.
  Not priced: the image-to-video pipeline's VAE encode of its conditioning frames;
- **denoise_s**: the steps at the predicted step time less its host overhead (meshlab.cost.timing);
- **vae_decode_s**: the images one chip decodes (its share of the batch split), each its pixels (and frames) x
  the card's figures per output pixel (real decodes on the CPU, meshlab.models.importer.decode_trace): the convolutions'
  and matmuls' FLOPs at the chip's effective peak, plus the bytes the other ops move at its effective HBM
  bandwidth (each op its own kernel on a GPU, where diffusers runs the VAE eager; fused gaps on a TPU, where
  XLA compiles it); on a GPU at least the ops it dispatches (per latent frame, or per decode for a VAE whose one
  decoder call makes the whole video: LTX-Video's) at the catalog's
  ``eager_dispatch_s``. ``placement.vae: cpu``: the FLOPs at the host's rate (no host bandwidth is catalogued).
  Under ``placement.vae_decode`` (meshlab.plan.memory.decode_share): 'tiled' decodes its overlapping tiles, each
  paying the dispatches; 'parallel' one chip's rows of the image. With a profile as hardware and a full decode,
  the decode it measured at that resolution, else the measured decodes' rate;
- **transfer_s**: the prompt embeddings in and the decoded pixels (float32) out over one chip's host link;
- **overhead_s**: the catalog's host overhead per step.

A term whose figure the card lacks (a card imported before it was recorded) is 0 and named in ``unknown``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from meshlab.models.card import DTYPE_BYTES, Component, ModelCard
from meshlab.core.hardware import Hardware
from meshlab.plan.memory import decode_share
from meshlab.strategy.schema import Strategy

TERMS = ("text_encode_s", "denoise_s", "vae_decode_s", "transfer_s", "overhead_s")
PIXEL_BYTES = 4  # the pipeline hands images back as float32 (output_type "np" or "pt" before PIL)


@dataclass(frozen=True)
class Terms:
    """One image's share of one pipeline call, in seconds (predicted)."""

    text_encode_s: float
    denoise_s: float
    vae_decode_s: float
    transfer_s: float
    overhead_s: float
    unknown: tuple[str, ...] = field(default=())  # terms left at 0 because the card lacks their figure
    text_encode_host_s: float = 0.0  # the part of text_encode_s the encoders on the host take (not a term)

    @property
    def total(self) -> float:
        return sum(getattr(self, name) for name in TERMS)

    def to_json(self) -> dict:
        return {**{name: getattr(self, name) for name in TERMS}, "unknown": list(self.unknown)}


def pipeline_terms(card: ModelCard, strategy: Strategy, hardware: Hardware, steps: int, step_s: float,
                   step_overhead_s: float, images: int, batch_split: int) -> Terms:
    """The terms for `images` images per call, `steps` steps of `step_s` (of which `step_overhead_s` host
    overhead), on a mesh whose batch axis splits the images `batch_split` ways."""
    workload, placement = strategy.workload, strategy.placement
    device_flops = hardware.bf16_flops * hardware.compute_efficiency
    unknown = []
    encoders = card.encoders
    if any(c.flops_per_token == 0 for c in encoders):
        unknown.append("text_encode_s")
    prompts = 2 if workload.cfg else 1
    encode_s = host_s = 0.0
    image_encoders = card.image_encoders
    for c in encoders if "text_encode_s" not in unknown else ():
        where = placement.encoder_place(c.name)
        # the text encoders encode each prompt; an image encoder (Wan I2V's CLIP) the conditioning image once per
        # image, its reference tokens, the call's images at once
        image = c in image_encoders
        tokens = c.encode_tokens(workload.text_tokens + c.prefix_tokens)  # CLIP: every prompt at its 77
        seconds = ((c.flops_per_token * card.architecture.reference_tokens * images if image else
                    (c.flops_per_token + c.head_flops_per_token) * tokens * prompts)
                   / (hardware.host_flops if where == "cpu" else device_flops))
        encode_s += seconds
        host_s += seconds if where == "cpu" else 0.0
        if where == "sharded" and hardware.chips > 1:  # each encode gathers the layers; the root unit stays gathered
            gathered = (c.parameters - c.root_parameters) * DTYPE_BYTES[workload.dtype] * (hardware.chips - 1) \
                / hardware.chips
            encode_s += (1 if image else prompts) * gathered / hardware.ici_link_bandwidth
    vae = next((c for c in card.components if c.name == "vae"), None)
    if vae is None or vae.decode_flops_per_pixel == 0 or (placement.vae != "cpu"
                                                         and decode_bytes_per_pixel(vae, hardware) == 0):
        unknown.append("vae_decode_s")
    pixels = workload.height * workload.width * workload.frames
    decoded_per_chip = -(-images // batch_split)
    decode_flops = (vae.decode_flops_per_pixel if vae else 0.0) * pixels * decoded_per_chip
    decode_s = 0.0
    if "vae_decode_s" not in unknown:
        share = decode_share(vae, placement.vae_decode, workload.height, workload.width,
                             hardware.chips // batch_split)
        decode_s = vae_decode_seconds(vae, hardware, placement.vae, share.computed_pixels * workload.frames,
                                      vae.decoder_runs(card.architecture.latent_frames(workload.frames)) * share.pieces,
                                      decoded_per_chip)
    profile = hardware.profile
    if profile is not None and placement.vae != "cpu" and placement.vae_decode == "full" and decode_flops:
        # measured at a resolution, else its rate
        priced = profile.op_seconds("vae_decode", (workload.height, workload.width), decode_flops / decoded_per_chip)
        decode_s = priced.seconds * decoded_per_chip if priced is not None else decode_s
    embeddings = workload.text_tokens * card.architecture.text_dim * DTYPE_BYTES[workload.dtype] * prompts
    moved = embeddings + 3 * pixels * PIXEL_BYTES * decoded_per_chip
    return Terms(
        text_encode_s=encode_s / images,
        denoise_s=steps * (step_s - step_overhead_s) / images,
        vae_decode_s=decode_s / images,
        transfer_s=moved / hardware.host_link_bandwidth / images,
        overhead_s=steps * step_overhead_s / images,
        unknown=tuple(unknown),
        text_encode_host_s=host_s / images,
    )


def vae_decode_seconds(vae: Component, hardware: Hardware, where: str, pixels: int, decodes: int,
                       samples: int = 1) -> float:
    """`samples` samples decoded in one call on the chip or (`where` "cpu") on the host, each `pixels` output pixels
    (every frame, tiles' overlaps included), the decoder run `decodes` times a call (latent frames, or one for a
    whole-video decoder, x tiles; the batch goes through each run together): see the module's docstring."""
    flops = vae.decode_flops_per_pixel * pixels * samples
    if where == "cpu":
        return flops / hardware.host_flops
    kernels = (flops / (hardware.bf16_flops * hardware.compute_efficiency)
               + decode_bytes_per_pixel(vae, hardware) * pixels * samples
               / (hardware.hbm_bandwidth * hardware.hbm_efficiency))
    return max(kernels, vae.decode_dispatches * decodes * dispatch_seconds(hardware))


def decode_bytes_per_pixel(vae: Component, hardware: Hardware) -> float:
    """Bytes per output pixel the decode's ops other than convolutions, matmuls and attention move: fused gaps on a
    TPU (XLA compiles the decode), every op's own on a GPU (diffusers runs the VAE eager)."""
    return vae.decode_fused_bytes_per_pixel if hardware.kind == "tpu" else vae.decode_bytes_per_pixel


def dispatch_seconds(hardware: Hardware) -> float:
    """The host's cost of dispatching one eager op: a GPU's catalogued ``eager_dispatch_s``; 0 on a TPU, where XLA
    runs the decode as one program."""
    return (hardware.eager_dispatch_s or 0.0) if hardware.kind == "gpu" else 0.0
