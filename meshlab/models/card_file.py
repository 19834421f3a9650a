"""The model card file (schema 5), as pydantic models: what `meshlab models import` writes and `load_card` reads.

`meshlab.models.card.card_from_json` reads a card's JSON through `CardFile`, then builds the frozen dataclasses the
planner uses (a card of 2,000 parameters is read on every `try`; the dataclasses stay light to pass around and
hash). The card importer checks the document it is about to write against the same model. What crosses entries (a
dispatch count naming a block list the parameters have) is checked by the reader.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, Optional

from pydantic import Field, model_validator

from meshlab.core.closed import Closed, Int

Stream = Literal["image", "text", "joint", "conditioning", "reference", "none"]
Dtype = Literal["float32", "bfloat16", "float16", "float8_e4m3fn", "int8"]
Count = Annotated[Int, Field(ge=0)]


class ParameterEntry(Closed):
    """One parameter of the transformer: its path, shape and dtype, the module kind that owns it, the token stream
    it serves, and its block (null outside the repeated blocks)."""

    name: str
    shape: list[Int]
    dtype: Dtype
    kind: Literal["linear", "conv", "norm", "embedding", "other"]
    stream: Stream
    block: Optional[Int] = None


class AttentionEntry(Closed):
    """One attention: its heads, the streams of its queries, its q/k/v and output projections, and (cross
    attention) the streams of its keys."""

    module: str
    heads: Int = Field(ge=1)
    head_dim: Int = Field(ge=1)
    streams: list[Stream]
    keys: list[Stream] = []
    fused_width: Int = Field(0, ge=0)
    kind: Literal["softmax", "linear"] = "softmax"
    masked: bool = Field(False, description="the forward passes this attention a mask (attn_mask)")
    qkv: list[str]
    out: list[str]


class ComponentEntry(Closed):
    """A pipeline component beside the transformer (a text encoder, the VAE), with what its cost and memory read."""

    name: str
    class_name: str
    parameters: Int = Field(ge=0)
    dtype: Dtype
    working_bytes_per_pixel: float = Field(0.0, ge=0)
    working_latent_frames: Int = Field(0, ge=0)
    working_bytes_per_pixel_per_latent_frame: float = Field(0.0, ge=0)
    output_copies: Int = Field(0, ge=0, le=2)
    decode_flops_per_pixel: float = Field(0.0, ge=0)
    decode_bytes_per_pixel: float = Field(0.0, ge=0)
    decode_fused_bytes_per_pixel: float = Field(0.0, ge=0)
    decode_dispatches: Int = Field(0, ge=0)
    tile: list[Int] = Field([0, 0], min_length=2, max_length=2)
    tile_stride: list[Int] = Field([0, 0], min_length=2, max_length=2)
    largest_layer_parameters: Int = Field(0, ge=0)
    root_parameters: Int = Field(0, ge=0)
    flops_per_token: float = Field(0.0, ge=0)
    head_flops_per_token: float = Field(0.0, ge=0)
    prefix_tokens: Int = Field(0, ge=0)
    encode_working_bytes: list[tuple[Annotated[Int, Field(ge=0)], Annotated[Int, Field(ge=0)]]] = []
    fixed_tokens: Int = Field(0, ge=0)

    @model_validator(mode="after")
    def _tiles(self) -> ComponentEntry:
        if min(self.tile + self.tile_stride) < 0 or (any(self.tile) and min(self.tile_stride) < 1):
            raise ValueError(f"component {self.name!r}: tile and tile_stride must be [height, width], a tile with "
                             "a positive stride")
        tokens = [n for n, _ in self.encode_working_bytes]
        if len(tokens) == 2 or tokens != sorted(set(tokens)):
            raise ValueError(f"component {self.name!r}: encode_working_bytes must be [tokens, bytes] points at "
                             "increasing tokens, one or at least three")
        return self


class ModulationEntry(Closed):
    norm: str
    stream: Stream
    width: Int = Field(ge=0)
    rms: bool = False
    dtype: Literal[""] | Dtype = ""  # the pieces' dtype where it is not the weights'


class QkNormEntry(Closed):
    module: str
    width: Int = Field(ge=1)


class FlowEntry(Closed):
    """One Linear of the traced forward: what it reads, the attention it feeds, the norms it modulates, whether it
    joins a residual stream, and the q/k norm and rotary embedding its output passes through."""

    module: str
    reads: list[str]
    attention: Optional[str] = None
    residual: bool = False
    modulates: list[ModulationEntry] = []
    qk_norm: Optional[QkNormEntry] = None
    rotary: Literal["", "whole", "halves"] = ""
    gated: Int = Field(0, ge=0)
    rotary_joint: bool = False
    rotary_part: bool = False


class JoinEntry(Closed):
    module: str
    kind: Literal["concat", "split"]
    width: Int = Field(ge=0)
    edge: Literal["", "start", "end"] = ""


class ElementwiseEntry(Closed):
    """The bytes per token one block's elementwise ops move, on one stream, at one side of a Linear."""

    blocks: str
    stream: Literal["image", "text", "joint", "reference"]
    bytes_per_token: float = Field(ge=0)
    side: Literal["", "in", "out", "attention"] = ""
    linear: str = ""
    execution: Literal["fused", "eager"] = "fused"

    @model_validator(mode="after")
    def _linear_where_its_side_has_one(self) -> ElementwiseEntry:
        if bool(self.linear) != (self.side in ("in", "out")):
            raise ValueError(f"elementwise entry of {self.blocks!r}: a Linear is named on the 'in' and 'out' sides "
                             "and only there")
        return self


class BufferEntry(Closed):
    """A floating buffer of the transformer: its path, shape, dtype as loaded at the card's dtype, and whether the
    checkpoint holds it (persistent: from_pretrained converts it to the dtype it loads in)."""

    name: str
    shape: list[Int]
    dtype: Dtype
    persistent: bool


class ArchitectureEntry(Closed):
    hidden_size: Int = Field(ge=1)
    num_layers: Int = Field(ge=1)
    num_attention_heads: Int = Field(ge=1)
    attention_head_dim: Int = Field(ge=1)
    patch_size: Int = Field(ge=1)
    in_channels: Int = Field(ge=1)
    text_dim: Int = Field(ge=0)
    vae_scale_factor: Int = Field(ge=1)
    mlp_ratio: float = Field(ge=0)
    temporal_scale_factor: Int = Field(1, ge=1)
    temporal_patch: Int = Field(1, ge=1)
    reference_tokens: Int = Field(0, ge=0)
    text_tokens: Int = Field(0, ge=0)


class CardFile(Closed):
    """A model card (schema 5): the parameter inventory and traced forward meshlab plans and prices over."""

    schema_version: Literal[5]
    name: str
    class_name: str
    source: dict[str, Any] = Field(description="how it was made: diffusers version, config, preset")
    architecture: ArchitectureEntry
    parameters: list[ParameterEntry]
    attention: list[AttentionEntry]
    components: list[ComponentEntry] = []
    dataflow: list[FlowEntry] = Field(min_length=1, description="every Linear, in the order the forward calls them")
    joins: list[JoinEntry] = []
    elementwise: list[ElementwiseEntry] = []
    dispatches: dict[str, Count] = Field({}, description="eager ops the host dispatches per block list, and "
                                                         "'outside'")
    buffers: Optional[list[BufferEntry]] = Field(None, description="the transformer's floating buffers, held whole "
                                                 "on every chip; absent from a card imported before they were "
                                                 "recorded")
