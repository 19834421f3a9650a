"""The model card: the inventory meshlab plans over, as plain immutable values (no torch).

Cards are generated from the real diffusers classes by ``meshlab.models.importer.card_import`` (which needs torch) and
shipped as JSON inside the package, so planning never imports torch.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

from pydantic import ValidationError

from meshlab.core.closed import problem_line
from meshlab.core.errors import InputError, Location, PlanError
from meshlab.models.card_file import CardFile

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "int8": 1}

#: Which token stream a Linear (or any parameter) serves; the cost model multiplies by its token count.
STREAMS = ("image", "text", "joint", "conditioning", "reference", "none")
#: Module kinds the planner distinguishes (column/row apply only to ``linear``).
MODULE_KINDS = ("linear", "conv", "norm", "embedding", "other")

#: 2: the traced dataflow (``ModelCard.dataflow``); 3: video models, cross-attention keys; 4: rotary embeddings and
#: q/k norms traced (``Flow.rotary``, ``Flow.qk_norm``); 5: rotary embeddings of joined streams or of part of a joint
#: sequence, and the joins at a block's edges (``Flow.rotary_joint``, ``Flow.rotary_part``, ``Join.edge``)
CARD_SCHEMA_VERSION = 5


@dataclass(frozen=True)
class Parameter:
    """One parameter of the model: its dotted path, shape, dtype, and what the planner and cost model need."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    kind: str  # one of MODULE_KINDS: the kind of the module that owns it
    stream: str  # one of STREAMS
    block: int | None = None  # index of the repeated block it belongs to, None outside blocks

    # read for every parameter of every plan a sweep prices: worked out once a parameter (the record stays
    # immutable: a cached value is derived from its fields, stored beside them, and left out of eq and hash)
    @cached_property
    def numel(self) -> int:
        return math.prod(self.shape)

    @cached_property
    def rank(self) -> int:
        return len(self.shape)

    @cached_property
    def is_bias(self) -> bool:
        return self.name.endswith(".bias")

    @cached_property
    def module(self) -> str:
        return self.name.rsplit(".", 1)[0]

    @property
    def bytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]

    @property
    def pointwise(self) -> bool:
        """A convolution weight of shape [out, in, 1, ..., 1]. Where the card's dataflow also traced its module as
        a Linear (the importer does so for one group and stride 1: SANA's GLUMBConv), it is one: applied at every
        position (`meshlab.cost.graph`)."""
        return self.kind == "conv" and self.rank >= 3 and all(d == 1 for d in self.shape[2:])


@dataclass(frozen=True)
class Buffer:
    """A floating tensor the transformer holds beside its parameters (``register_buffer``): SD3.5's positional
    table, Wan's rotary tables. Every chip holds it whole: no plan shards a buffer (meshlab.apply leaves buffers
    as the model has them, and XLA:TPU's program takes SD3.5's table whole on every chip)."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # as from_pretrained loads it at the card's dtype (meshlab.models.importer.card_import.as_loaded)
    persistent: bool  # in the checkpoint (from_pretrained converts it to the dtype it loads in), or made by the class

    def bytes_at(self, dtype: str) -> int:
        """Its bytes in a pipeline loaded in `dtype`: a persistent buffer is converted to `dtype`, as the planner
        prices every parameter in the dtype the weights are held in (a class's ``_keep_in_fp32_modules`` aside, for
        buffers as for parameters); a non-persistent one keeps the dtype the class made it in (Wan's rotary tables
        stay float32)."""
        return math.prod(self.shape) * DTYPE_BYTES[dtype if self.persistent else self.dtype]


@dataclass(frozen=True)
class Attention:
    """One attention module: heads and head dim, and the Linears that make its q/k/v and output."""

    module: str
    heads: int
    head_dim: int
    streams: tuple[str, ...]  # token streams of its queries (joined in one sequence), e.g. ("text", "image")
    qkv: tuple[str, ...]  # module paths of the q/k/v projections (all streams)
    out: tuple[str, ...]  # module paths of the output projections
    #: token streams of its keys and values; () means the queries' own sequence (self or joint attention).
    #: A cross-attention (Wan's attn2) has image queries against text keys: streams ("image",), keys ("text",).
    keys: tuple[str, ...] = ()
    #: one Linear makes q, k, v and more (Flux.2's single blocks: ``to_qkv_mlp_proj``, q | k | v | MLP-in along
    #: its output): the width of its q, k and v part; 0 where each of q, k and v has its own Linear
    fused_width: int = 0
    #: "softmax": scores of every query against every key (``F.scaled_dot_product_attention``); "linear": SANA's
    #: ReLU linear attention, ``relu(K)^T [V; 1]`` first (a (head_dim + 1) x head_dim state per head, summed over
    #: the tokens), then that state times ``relu(Q)``, in float32: no scores, linear in the tokens
    kind: str = "softmax"
    #: the forward, given the text's mask as ``meshlab check`` gives it (all ones), passes this attention's
    #: ``F.scaled_dot_product_attention`` a mask (``attn_mask``), which torch's math attention adds to the scores:
    #: Qwen-Image's and HunyuanVideo's joint attention, LTX-Video's and SANA's cross-attention. A run may not
    #: (QwenImagePipeline drops an all-ones mask, meshlab's TPU runner drops full masks): where
    #: ``Hardware.mask_broadcast_keys`` applies (a self- or joint attention split by no ring) it is priced
    #: as the check compiles it, one buffer on the safe side
    masked: bool = False

    @property
    def is_linear(self) -> bool:
        return self.kind == "linear"

    @property
    def key_streams(self) -> tuple[str, ...]:
        return self.keys or self.streams


_BLOCK = re.compile(r"^([A-Za-z_]\w*)\.(\d+)(?:\.|$)")


def block_position(path: str) -> tuple[str, int] | None:
    """``("transformer_blocks", 3)`` for ``transformer_blocks.3.attn.to_q.weight``; None outside numbered lists."""
    match = _BLOCK.match(path)
    return (match.group(1), int(match.group(2))) if match else None


def module_pattern(path: str, block_lists: set[str] | frozenset[str]) -> str:
    """``transformer_blocks.*.attn.to_q`` for ``transformer_blocks.7.attn.to_q``: one name for every block."""
    position = block_position(path)
    if position is None or position[0] not in block_lists:
        return path
    name, index = position
    return f"{name}.*{path[len(f'{name}.{index}'):]}"


def concrete_path(pattern: str, like: str) -> str:
    """The pattern's path in the block `like` sits in: (``transformer_blocks.*.attn``, ``transformer_blocks.7.x``)
    gives ``transformer_blocks.7.attn``."""
    head, star, tail = pattern.partition(".*")
    position = block_position(like)
    if not star or position is None or position[0] != head:
        return pattern
    return f"{head}.{position[1]}{tail}"


@dataclass(frozen=True)
class Modulation:
    """A norm over the hidden width that a Linear's output conditions (shift and scale pieces)."""

    norm: str  # module pattern of the norm (see ``Flow``)
    stream: str  # the token stream the norm normalizes
    width: int  # features of each piece that meets the norm's output (a chunk of the Linear's output)
    #: an RMS norm (a mean of squares over the features, diffusers' ``RMSNorm``: LTX-Video's): one statistic a row,
    #: where a LayerNorm has two (mean and variance)
    rms: bool = False
    #: "float32" where the class computes the pieces in float32 whatever its weights' dtype (Wan adds its table to
    #: ``temb.float()``; read from a bfloat16 trace); "": in the weights' dtype
    dtype: str = ""


@dataclass(frozen=True)
class QkNorm:
    """A norm inside an attention that a q/k Linear's output passes through (its ``norm_q``)."""

    module: str  # module pattern of the norm
    width: int  # the features it normalizes over: a head's, or every head's at once (Wan's across heads)


@dataclass(frozen=True)
class Flow:
    """What one Linear reads and what reads it, traced from the real forward (meshlab.models.importer.dataflow_trace).

    ``module`` is a pattern: the path with the block index replaced by ``*``, one entry for every block of a list.
    ``reads`` are producer labels: ``linear:<pattern>``, ``attention:<pattern>``, ``norm:<pattern>|<stream>``
    (a residual stream's norm) or ``input:<forward argument>``.
    """

    module: str
    reads: tuple[str, ...]
    attention: str | None = None  # the attention (pattern) whose q/k/v this Linear makes
    modulates: tuple[Modulation, ...] = ()
    residual: bool = False  # its output joins a residual stream (reaches a norm's input) or the model output
    qk_norm: QkNorm | None = None  # the norm inside its attention that its output passes through
    #: rotary embeddings rotate its output: "whole" (each head's pairs at once), "halves" (written as two
    #: interleaved halves of each head, Wan's ``out[..., 0::2]``: XLA then moves each half on its own where an
    #: activation rule re-splits them), "" (not rotated)
    rotary: str = ""
    #: its output is cut along its features into this many pieces, two of which are multiplied (a gated unit, GLU:
    #: FLUX.2's MLP, SANA's GLUMBConv); 0: not cut so
    gated: int = 0
    #: the rotary embeddings rotate the joint sequence: its output was concatenated with the other streams' along
    #: the tokens first (Flux's and FLUX.2's double blocks rotate the joined q and k; Qwen-Image and HunyuanVideo
    #: rotate each stream's before joining them)
    rotary_joint: bool = False
    #: the rotary embeddings rotate part of its output's tokens, the image's of a joint sequence, which are then
    #: joined with the rest again (HunyuanVideo's single blocks; not CogVideoX's, written back in place)
    rotary_part: bool = False

    def sources(self, kind: str) -> tuple[str, ...]:
        """Producers of one kind (``linear``, ``attention``, ``norm``, ``input``), as patterns."""
        return tuple(label.split(":", 1)[1] for label in self.reads if label.startswith(kind + ":"))


@dataclass(frozen=True)
class Join:
    """The text and image streams concatenated into one joint sequence along the tokens (``concat``), or a joint
    sequence cut back into them (``split``), in the module ``module`` (a pattern): outside attention, or an attention
    module's join of the two streams it was called with, before its projections (CogVideoX's attn1; not the q/k/v
    concatenations inside attention, which are the attention's own)."""

    module: str
    kind: str  # "concat" or "split"
    width: int  # features of the joint tensor
    #: "start": a block's concatenation of its own arguments; "end": a block's cut whose parts it returns; "": any
    #: other (inside a block, or outside the blocks)
    edge: str = ""


#: How elementwise work runs: "fused", one pass per gap between matmuls (XLA, torch.compile); "eager", every op
#: its own kernel reading and writing its tensors (plain PyTorch)
ELEMENTWISE_EXECUTIONS = ("fused", "eager")


@dataclass(frozen=True)
class Elementwise:
    """HBM bytes one block of ``blocks`` moves per token of ``stream`` in its elementwise work (norms, modulation,
    RoPE, activations, residual adds, casts) when each gap between its matmuls runs as one fused pass
    (``execution`` "fused") or when every op runs as its own kernel ("eager"): traced from the real forward at the
    card's dtype (meshlab.models.importer.elementwise_trace)."""

    blocks: str  # the block list (``transformer_blocks``)
    stream: str  # "image", "text" or "joint"
    bytes_per_token: float
    #: the matmul these tensors meet: "out" (made by `linear`), "in" (read by `linear`, and by other Linears
    #: only), "attention" (q/k/v going in, or the output coming out), "" (none: the residual stream and the rest)
    side: str = ""
    linear: str = ""  # the Linear's module pattern (``transformer_blocks.*.attn.to_q``) for "out" and "in"
    execution: str = "fused"  # one of ELEMENTWISE_EXECUTIONS


@dataclass(frozen=True)
class Component:
    """A pipeline component meshlab does not shard (VAE, text encoder): its size, and a decode working set."""

    name: str
    class_name: str
    parameters: int
    dtype: str
    #: Peak working set while decoding, in bytes per output pixel per image (VAE only): the tensors two real
    #: decodes allocate, measured on the CPU (meshlab.models.importer.decode_trace), as a slope over the pixels
    working_bytes_per_pixel: float = 0.0
    #: video VAE only: the latent frames of the decode that working set was measured at (a pass in the decode's
    #: steady state), and what it grows by per latent frame more, per output pixel of one frame (measured between
    #: two decodes a period apart: LTX-Video's decoder holds every frame at once and grows; Wan's, which caches a
    #: latent frame at a time, holds about the same). 0: not known, or an image VAE
    working_latent_frames: int = 0
    working_bytes_per_pixel_per_latent_frame: float = 0.0
    #: video VAE only: copies of the decoded video its decode holds at once (2: it concatenates decoded pieces, as
    #: Wan's frames; 1: one decoder call makes the whole video, as LTX-Video's, whose ``decode_dispatches`` are
    #: then a whole decode's: the one field says both, as the importer reads both from the decode's structure);
    #: 0: not known (counted as 2)
    output_copies: int = 0
    #: FLOPs of one decode per output pixel per image (VAE only; convolutions and matmuls as torch's
    #: FlopCounterMode counts them in the same traced decode). 0: not known (a card from before it was recorded).
    decode_flops_per_pixel: float = 0.0
    #: FLOPs of one encode per prompt token (text encoders: 2 x the parameters of the text path, without token
    #: embeddings, output head or a text encoder's vision tower; an image encoder, Wan I2V's CLIP: 2 x its
    #: parameters but the position embedding, per image token). 0: not known.
    flops_per_token: float = 0.0
    #: FLOPs per token of an output head the encoder's forward computes though the pipeline reads hidden states
    #: (Qwen2.5-VL's LM head: 2 x its parameters); it does not shrink when the encoder is cut to fewer layers.
    head_flops_per_token: float = 0.0
    #: Tokens the pipeline's prompt template puts before each prompt and drops from the embedding (Qwen-Image: 34).
    prefix_tokens: int = 0
    #: HBM bytes per output pixel of the decode's ops other than convolutions, matmuls and attention, each op
    #: its own kernel (eager: diffusers on a GPU); and with each gap between heavy ops fused (XLA). VAE only; 0:
    #: not known
    decode_bytes_per_pixel: float = 0.0
    decode_fused_bytes_per_pixel: float = 0.0
    #: ops the host dispatches in one decode of one latent frame, or of the whole video for a VAE whose one decoder
    #: call makes it (``output_copies`` 1) (eager's floor)
    decode_dispatches: int = 0
    #: the tiles diffusers' tiled decode (``vae.enable_tiling()``) cuts an image into, in output pixels: (height,
    #: width) of a tile and the stride between tiles' starts; (0, 0): not a VAE, or one without tiling
    tile: tuple[int, int] = (0, 0)
    tile_stride: tuple[int, int] = (0, 0)
    #: parameters of its largest repeated layer (a text encoder's transformer layer): what a sharded encoder
    #: (FSDP) gathers at a time
    largest_layer_parameters: int = 0
    #: parameters outside every layer list (token embeddings, final norm, heads): FSDP's root unit, whole on
    #: every chip of a sharded encoder
    root_parameters: int = 0
    #: encoders: the most bytes one encode holds at once besides its parameters, as (tokens, bytes) points: a text
    #: encoder's one prompt of each length as its pipeline encodes it (the hidden states it keeps, a KV cache, the
    #: logits of an output head, a layer's temporaries, T5's attention scores), traced at 16 to 4,096 tokens
    #: (meshlab.models.importer.encode_trace), or at the one length its pipeline tokenizes every prompt to; an image
    #: encoder's one image, ((0, bytes),). At 2 bytes an element. (): not known, or not an encoder
    encode_working_bytes: tuple[tuple[int, int], ...] = ()
    #: the tokens the pipeline tokenizes every prompt to, padded or cut (CLIP's 77: ``padding="max_length"``); 0: the
    #: prompt's own
    fixed_tokens: int = 0

    @property
    def bytes(self) -> int:
        return self.parameters * DTYPE_BYTES[self.dtype]

    def encode_tokens(self, prompt_tokens: int) -> int:
        """The tokens the encoder encodes for a prompt of `prompt_tokens` (its template's included)."""
        return self.fixed_tokens or prompt_tokens

    def encode_working_set(self, prompt_tokens: int, itemsize: int) -> int:
        """Bytes one encode holds at once besides the parameters, for a prompt of `prompt_tokens` (an image encoder:
        its one image), at `itemsize` bytes an element (the figures are at 2): the traced point at that length, or
        the quadratic through the three traced lengths around it (past the longest, through the last three)."""
        points = self.encode_working_bytes
        if len(points) < 3:
            return round(points[0][1] * itemsize / 2) if points else 0
        n = self.encode_tokens(prompt_tokens)
        at = next((i for i, (tokens, _) in enumerate(points) if tokens >= n), len(points))
        three = points[min(max(at - 1, 0), len(points) - 3):][:3]
        value = sum(y * math.prod((n - x2) / (x - x2) for x2, _ in three if x2 != x) for x, y in three)
        return max(0, round(value * itemsize / 2))

    def decoder_runs(self, latent_frames: int) -> int:
        """Times a video's decode runs the decoder, each dispatching ``decode_dispatches`` ops: once per latent
        frame, or once for a VAE whose one decoder call makes the whole video (``output_copies`` 1)."""
        return 1 if self.output_copies == 1 else latent_frames


@dataclass(frozen=True)
class Architecture:
    """Figures the workload and cost model need: widths, patching, and how pixels become tokens."""

    hidden_size: int
    num_layers: int  # repeated blocks in all (dual-stream plus single-stream)
    num_attention_heads: int
    attention_head_dim: int
    patch_size: int
    in_channels: int  # width of one image token at the transformer's input (after 2x2 packing)
    text_dim: int  # width of one text token at the transformer's input
    vae_scale_factor: int  # pixels per latent pixel along each side
    mlp_ratio: float
    #: video models: pixel frames per latent frame past the first (Wan's VAE: 4, so 81 frames are 21 latent
    #: frames); 1 for an image model, whatever its VAE can do
    temporal_scale_factor: int = 1
    temporal_patch: int = 1  # latent frames per token frame
    #: tokens of a conditioning image's embedding that every sample carries whatever the workload (the "reference"
    #: stream: Wan 2.1 image-to-video's CLIP image tokens, 257); 0 for a model without one
    reference_tokens: int = 0
    #: the text tokens the forward requires, where it requires a count (Wan 2.1 I2V's cross-attention cuts its
    #: context at 512; CogVideoX-2b's positional embedding spans 226); 0: any
    text_tokens: int = 0

    @property
    def is_video(self) -> bool:
        return self.temporal_scale_factor > 1

    def latent_frames(self, frames: int) -> int:
        """Latent frames of `frames` pixel frames: the VAE keeps the first and compresses the rest
        ``temporal_scale_factor`` to one (Wan: 81 -> 21); 1 for an image model."""
        return (frames - 1) // self.temporal_scale_factor + 1 if self.is_video else 1


def token_frames(frames: int, arch: Architecture) -> int:
    """Token frames of a sample of `frames` pixel frames: the VAE keeps the first frame and compresses the rest
    `temporal_scale_factor` to one (Wan: 81 frames -> 21 latent frames), then the patch groups latent frames.
    Frames on an image model, or a count that does not compress or patch evenly, is a PlanError."""
    if not arch.is_video:
        if frames != 1:
            raise PlanError(f"workload.frames is {frames}, but this is an image model (its VAE compresses no frames)",
                            "drop workload.frames, or use a video model card such as wan-2.1-t2v-14b",
                            field=("workload", "frames"))
        return 1
    t = arch.temporal_scale_factor
    if (frames - 1) % t:
        fix = (frames - 1) // t * t + 1
        raise PlanError(f"workload.frames {frames} is not 1 + a multiple of {t} (the VAE compresses {t} frames to one "
                        "after the first)", f"use {fix} or {fix + t}", field=("workload", "frames"))
    latent = arch.latent_frames(frames)
    if latent % arch.temporal_patch:
        raise PlanError(f"workload.frames {frames} gives {latent} latent frames, not a multiple of the temporal "
                        f"patch {arch.temporal_patch}",
                        f"pick frames whose latent count divides by {arch.temporal_patch}",
                        field=("workload", "frames"))
    return latent // arch.temporal_patch


@dataclass(frozen=True)
class ModelCard:
    name: str
    class_name: str
    source: dict  # how it was made: diffusers version, config, preset
    architecture: Architecture
    parameters: tuple[Parameter, ...]
    attention: tuple[Attention, ...]
    components: tuple[Component, ...] = field(default=())
    dataflow: tuple[Flow, ...] = field(default=())  # every Linear, in the order the traced forward calls them
    joins: tuple[Join, ...] = field(default=())  # stream concatenations and splits outside attention's q/k/v
    elementwise: tuple[Elementwise, ...] = field(default=())  # per block; () on a card imported before it was traced
    #: the floating buffers; () for a class that has none; None for a card file imported before they were recorded
    #: (the planner warns: its buffers, if it has any, are not counted)
    buffers: tuple[Buffer, ...] | None = field(default=())
    #: ops a block of each list dispatches from the host in eager PyTorch (not each a kernel: see
    #: meshlab.models.importer.elementwise_trace), and "outside": the rest of one forward's; {} on a card imported before
    #: they were counted
    dispatches: dict = field(default_factory=dict, hash=False, compare=False)

    def buffer_bytes(self, dtype: str) -> int:
        """Bytes of the transformer's buffers on every chip, in a pipeline loaded in `dtype` (`Buffer.bytes_at`); 0
        where the card does not record them."""
        return sum(b.bytes_at(dtype) for b in self.buffers or ())

    @property
    def total_params(self) -> int:
        return sum(p.numel for p in self.parameters)

    @property
    def config_digest(self) -> str:
        """A short hash of the diffusers config the card was made from: two cards of one model share it."""
        return config_digest(self.source.get("config") or {})

    @cached_property
    def block_lists(self) -> frozenset[str]:
        """Names of the lists of repeated blocks (``transformer_blocks``, ...); computed once per card (a sweep
        asks thousands of times)."""
        return frozenset(p.name.split(".", 1)[0] for p in self.parameters if p.block is not None)

    @cached_property
    def block_counts(self) -> tuple[tuple[str, int], ...]:
        """Each list of repeated blocks and how many blocks it has, in the order the card lists them
        (meshlab.models.truncate.block_lists reads it); computed once per card."""
        lists: dict[str, int] = {}
        for p in self.parameters:
            position = block_position(p.name) if p.block is not None else None
            if position:
                lists[position[0]] = max(lists.get(position[0], 0), position[1] + 1)
        return tuple(lists.items())

    @cached_property
    def linear_modules(self) -> frozenset[str]:
        """Module paths of every Linear: each Linear with a 2-D weight, and each pointwise convolution (a weight of
        shape [out, in, 1, 1]) whose module the dataflow traced as a Linear (SANA's GLUMBConv: one group, stride 1,
        a Linear applied at every position)."""
        traced = {f.module for f in self.dataflow}
        return frozenset(p.module for p in self.parameters if not p.is_bias and (
            p.kind == "linear" and p.rank == 2
            or p.pointwise and module_pattern(p.module, self.block_lists) in traced))

    def component(self, name: str) -> Component | None:
        return next((c for c in self.components if c.name == name), None)

    @property
    def text_encoders(self) -> tuple[Component, ...]:
        """The text encoders (SD3.5 has three), in the pipeline's order."""
        return tuple(c for c in self.components if c.name.startswith("text_encoder"))

    @property
    def encoders(self) -> tuple[Component, ...]:
        """Every encoder of the conditioning that ``placement`` places (``text_encoder``, or an entry of
        ``encoders``): the text encoders and an image encoder (Wan 2.1 image-to-video's CLIP, which its pipeline
        keeps beside the text encoder)."""
        return tuple(c for c in self.components if c.name.startswith(("text_encoder", "image_encoder")))

    @property
    def image_encoders(self) -> tuple[Component, ...]:
        """The encoders of a conditioning image (Wan 2.1 image-to-video's CLIP), which encode once per image."""
        return tuple(c for c in self.components if c.name.startswith("image_encoder"))

    def to_json(self) -> dict:
        return card_to_json(self)


def config_digest(config: dict) -> str:
    """sha256 (16 hex digits) of a diffusers config without its private keys (``_class_name``, ...)."""
    import hashlib

    public = {k: v for k, v in config.items() if not str(k).startswith("_")}
    return hashlib.sha256(json.dumps(public, sort_keys=True, default=str).encode()).hexdigest()[:16]


def card_to_json(card: ModelCard) -> dict:
    arch = card.architecture
    return {
        "schema_version": CARD_SCHEMA_VERSION,
        "name": card.name,
        "class_name": card.class_name,
        "source": card.source,
        "architecture": {k: getattr(arch, k) for k in Architecture.__dataclass_fields__
                         if k not in ("reference_tokens", "text_tokens") or getattr(arch, k)},
        "parameters": [
            {"name": p.name, "shape": list(p.shape), "dtype": p.dtype, "kind": p.kind, "stream": p.stream, "block": p.block}
            for p in card.parameters
        ],
        "attention": [
            {"module": a.module, "heads": a.heads, "head_dim": a.head_dim, "streams": list(a.streams),
             "keys": list(a.keys), "fused_width": a.fused_width,
             "qkv": list(a.qkv), "out": list(a.out), **({"kind": a.kind} if a.kind != "softmax" else {}),
             **({"masked": True} if a.masked else {})}
            for a in card.attention
        ],
        "components": [
            {"name": c.name, "class_name": c.class_name, "parameters": c.parameters, "dtype": c.dtype,
             "working_bytes_per_pixel": c.working_bytes_per_pixel,
             **({"working_latent_frames": c.working_latent_frames,
                 "working_bytes_per_pixel_per_latent_frame": c.working_bytes_per_pixel_per_latent_frame,
                 "output_copies": c.output_copies}
                if c.working_latent_frames else {}),
             "decode_flops_per_pixel": c.decode_flops_per_pixel, "decode_bytes_per_pixel": c.decode_bytes_per_pixel,
             "decode_fused_bytes_per_pixel": c.decode_fused_bytes_per_pixel, "decode_dispatches": c.decode_dispatches,
             "tile": list(c.tile), "tile_stride": list(c.tile_stride),
             "largest_layer_parameters": c.largest_layer_parameters, "root_parameters": c.root_parameters,
             "flops_per_token": c.flops_per_token,
             **({"head_flops_per_token": c.head_flops_per_token} if c.head_flops_per_token else {}),
             **({"prefix_tokens": c.prefix_tokens} if c.prefix_tokens else {}),
             **({"encode_working_bytes": [list(p) for p in c.encode_working_bytes]} if c.encode_working_bytes else {}),
             **({"fixed_tokens": c.fixed_tokens} if c.fixed_tokens else {})}
            for c in card.components
        ],
        "dataflow": [
            {"module": f.module, "reads": list(f.reads), "attention": f.attention, "residual": f.residual,
             "modulates": [{"norm": m.norm, "stream": m.stream, "width": m.width, **({"rms": True} if m.rms else {}),
                            **({"dtype": m.dtype} if m.dtype else {})} for m in f.modulates],
             **({"qk_norm": {"module": f.qk_norm.module, "width": f.qk_norm.width}} if f.qk_norm else {}),
             **({"rotary": f.rotary} if f.rotary else {}), **({"rotary_joint": True} if f.rotary_joint else {}),
             **({"rotary_part": True} if f.rotary_part else {}),
             **({"gated": f.gated} if f.gated else {})}
            for f in card.dataflow
        ],
        "joins": [{"module": j.module, "kind": j.kind, "width": j.width, **({"edge": j.edge} if j.edge else {})}
                  for j in card.joins],
        "elementwise": [{"blocks": e.blocks, "stream": e.stream, "bytes_per_token": e.bytes_per_token,
                         **({"side": e.side} if e.side else {}), **({"linear": e.linear} if e.linear else {}),
                         **({"execution": e.execution} if e.execution != "fused" else {})}
                        for e in card.elementwise],
        **({"dispatches": dict(card.dispatches)} if card.dispatches else {}),
        **({"buffers": [{"name": b.name, "shape": list(b.shape), "dtype": b.dtype, "persistent": b.persistent}
                        for b in card.buffers]} if card.buffers is not None else {}),
    }


def card_from_json(data: dict, origin: str = "<card>") -> ModelCard:
    """Build a card from its JSON form, read through the pydantic model of the file (`meshlab.models.card_file`);
    a malformed card is one InputError naming the file and the first problem's field."""
    version = data.get("schema_version") if isinstance(data, dict) else None
    if isinstance(version, int) and version < CARD_SCHEMA_VERSION:
        raise InputError(
            f"model card of schema {version}, older than this meshlab's {CARD_SCHEMA_VERSION}: "
            + ("it has no traced dataflow (which Linear feeds which), which the cost model reads" if version < 2 else
               "it records no video compression or cross-attention keys, which token counts and FLOPs read"
               if version < 3 else "it records no traced rotary embeddings or q/k norms, which collectives read"
               if version < 4 else "it records no rotary embeddings of joined streams or of part of a joint sequence, "
               "nor which joins sit at a block's edges, which collectives under a sequence split read"),
            f"regenerate it: {regenerate_command(data.get('source') or {})}",
            Location(origin),
        )

    def refused(problem: str) -> InputError:
        return InputError(f"not a valid meshlab model card: {problem}", "generate one with `meshlab models import`",
                          Location(origin))

    if not isinstance(data, dict) or version != CARD_SCHEMA_VERSION:
        raise refused(f"schema_version must be {CARD_SCHEMA_VERSION}")
    try:
        checked = CardFile.model_validate(data)
    except ValidationError as exc:
        raise refused(problem_line(exc, data, "the card")) from None
    card = ModelCard(
        name=checked.name,
        class_name=checked.class_name,
        source=dict(checked.source),
        architecture=Architecture(**checked.architecture.model_dump()),
        parameters=tuple(Parameter(p.name, tuple(p.shape), p.dtype, p.kind, p.stream, p.block)
                         for p in checked.parameters),
        attention=tuple(Attention(a.module, a.heads, a.head_dim, tuple(a.streams), tuple(a.qkv), tuple(a.out),
                                  tuple(a.keys), a.fused_width, a.kind, a.masked) for a in checked.attention),
        components=tuple(Component(**{**c.model_dump(), "tile": tuple(c.tile), "tile_stride": tuple(c.tile_stride),
                                      "encode_working_bytes": tuple(map(tuple, c.encode_working_bytes))})
                         for c in checked.components),
        dataflow=tuple(Flow(f.module, tuple(f.reads), f.attention,
                            tuple(Modulation(m.norm, m.stream, m.width, m.rms, m.dtype) for m in f.modulates),
                            f.residual,
                            QkNorm(f.qk_norm.module, f.qk_norm.width) if f.qk_norm else None, f.rotary, f.gated,
                            f.rotary_joint, f.rotary_part)
                       for f in checked.dataflow),
        joins=tuple(Join(j.module, j.kind, j.width, j.edge) for j in checked.joins),
        elementwise=tuple(Elementwise(e.blocks, e.stream, e.bytes_per_token, e.side, e.linear, e.execution)
                          for e in checked.elementwise),
        dispatches=dict(checked.dispatches),
        buffers=(None if checked.buffers is None
                 else tuple(Buffer(b.name, tuple(b.shape), b.dtype, b.persistent) for b in checked.buffers)),
    )
    lists = {position[0] for p in card.parameters if p.block is not None
             for position in [block_position(p.name)] if position}
    if set(card.dispatches) - lists - {"outside"}:
        raise refused(f"dispatches names {sorted(set(card.dispatches) - lists - {'outside'})}, not a block list of "
                      f"the card ({', '.join(sorted(lists))}) or 'outside'")
    return card


def regenerate_command(source: dict) -> str:
    """The command that imports a card again, from its ``source``."""
    preset = source.get("preset")
    if preset:
        return f"meshlab models import {preset} -o <card>.json"
    return "meshlab models import --config <its diffusers config.json> -o <card>.json"


BUILTIN_DIR = Path(__file__).parent / "cards"  # the built-in cards, one JSON file each


def builtin_cards() -> list[str]:
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.json"))


def load_card(name_or_path: str, relative_to: Path | None = None) -> ModelCard:
    """A built-in card by name (``qwen-image``) or a card JSON file by path."""
    if name_or_path in builtin_cards():
        path = BUILTIN_DIR / f"{name_or_path}.json"
    else:
        path = Path(name_or_path)
        if relative_to is not None and not path.is_absolute():
            path = relative_to / path
        if path.suffix == ".json" and not path.is_file():
            raise InputError(f"no such model card file {str(path)!r}",
                             "check the path (a strategy file's is relative to that file), or use a built-in card "
                             f"({', '.join(builtin_cards())})")
        if path.suffix != ".json":
            raise InputError(
                f"unknown model {name_or_path!r}",
                f"use a built-in card ({', '.join(builtin_cards())}) or a path to a card .json file",
            )
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"cannot read model card: {exc}", "regenerate it with `meshlab models import`", Location(str(path))) from None
    return card_from_json(data, str(path))
