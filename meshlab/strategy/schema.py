"""The strategy file's schema: closed, immutable pydantic models (``meshlab.core.closed``), every field described.

Loading stays pure: these models only validate values; resolving names (model card, hardware) and
planning happen later, in ``meshlab.plan``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import AfterValidator, ConfigDict, Field, ValidationInfo, WithJsonSchema, field_validator, model_validator

from meshlab.core.closed import Closed, Int

_AXIS_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _axis_name(name: str) -> str:
    if not _AXIS_NAME.fullmatch(name):  # fullmatch: Python's `$` also matches before a final newline
        raise ValueError(f"{name!r} is not a mesh axis name (letters, digits and _, not starting with a digit)")
    return name


AxisName = Annotated[str, AfterValidator(_axis_name),
                     WithJsonSchema({"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"})]
SpecEntry = Union[None, AxisName, list[AxisName]]


class Rule(Closed):
    """How the parameters whose path matches shard. Rules are tried in order; the first match wins."""

    match: Optional[str] = Field(
        None,
        description="glob over the dotted parameter path (fnmatch: '*' matches any run of characters, dots "
        "included; '?' one character; '[qkv]' one of), e.g. 'transformer_blocks.*.attn.to_q.*'",
    )
    regex: Optional[str] = Field(None, description="a Python regular expression that must match the whole path")
    shard: Union[Literal["largest", "column", "row", "replicate"], list[SpecEntry]] = Field(
        description="'largest': the largest dim on `axis` (ties go to the lowest dim, so a square Linear "
        "weight shards its output dim); 'column' / 'row': a Linear weight's output dim / input dim on `axis`, "
        "its bias follows the weight's output sharding; 'replicate'; or an explicit spec, one entry per dim "
        "(an axis name, a list of axis names, or null)"
    )
    axis: Optional[Union[AxisName, list[AxisName]]] = Field(
        None, description="mesh axis (or axes, major to minor) for largest / column / row"
    )
    min_rank: Int = Field(
        0, ge=0, description="match only parameters with at least this many dims (2 skips biases and norms)"
    )
    note: Optional[str] = Field(None, description="why this rule exists; shown in the plan")

    @model_validator(mode="after")
    def _check(self) -> Rule:
        """Exactly one pattern, a regex that compiles, and an axis exactly where the shard needs one."""
        if (self.match is None) == (self.regex is None):
            raise ValueError("give exactly one of `match` (a glob) or `regex`")
        if self.regex is not None:
            try:
                re.compile(self.regex)
            except re.error as exc:
                raise ValueError(f"invalid regex {self.regex!r}: {exc}") from None
        needs_axis = self.shard in ("largest", "column", "row")
        if needs_axis and not self.axes:
            raise ValueError(f"shard: {self.shard} needs `axis: <mesh axis>`")
        if not needs_axis and self.axis is not None:
            raise ValueError(f"`axis` is only for largest / column / row, not for shard: {self.shard}")
        return self

    @property
    def pattern(self) -> str:
        return self.match if self.match is not None else f"re:{self.regex}"

    @property
    def axes(self) -> tuple[str, ...]:
        if self.axis is None:
            return ()
        return (self.axis,) if isinstance(self.axis, str) else tuple(self.axis)


#: Named points inside every block where an activation rule can annotate a tensor ([batch, tokens, features]).
ACTIVATION_POINTS = {
    "block.input": "the stream's hidden states as the block receives them",
    "attention.qkv": "each q, k and v projection's output (features are heads x head dim), before attention",
    "attention.output": "the attention output as the output projection reads it (features are heads x head dim)",
    "linear.output": "the output of every Linear inside the blocks (a 2-D output takes the batch and features "
    "entries); pinning it to the batch split makes XLA gather a weight split over the batch axis (FSDP) rather "
    "than the activations",
}


class ActivationRule(Closed):
    """Split an activation at a named point of every block: one spec entry per dim of [batch, tokens, features].

    Ulysses: `attention.qkv` split on heads over the sequence axis, `attention.output` back on tokens; XLA moves
    between the two with all-to-alls."""

    point: str = Field(description=f"one of {', '.join(ACTIVATION_POINTS)}")
    stream: Optional[str] = Field(None, description="only this token stream (image, text); null: every stream")
    attention: Optional[Literal["self", "cross"]] = Field(
        None, description="attention.qkv and attention.output only: only self-attention (keys from the queries' "
                          "own sequence) or only cross-attention (keys from another stream, Wan's text); null: every "
                          "attention")
    spec: list[SpecEntry] = Field(
        min_length=3, max_length=3,
        description="[batch, tokens, features]: a mesh axis, a list of axes (major to minor), or null each")
    note: Optional[str] = Field(None, description="why this rule exists; shown in the plan")

    @field_validator("point")
    @classmethod
    def _known_point(cls, point: str) -> str:
        if point not in ACTIVATION_POINTS:
            raise ValueError(f"unknown activation point {point!r}; the points are {', '.join(ACTIVATION_POINTS)}")
        return point


class Activations(Closed):
    """How the activations (the transformer's inputs and everything computed from them) shard."""

    batch: Optional[AxisName] = Field(None, description="mesh axis that splits the batch (null: not split)")
    sequence: Optional[Union[AxisName, list[AxisName]]] = Field(
        None, description="mesh axis, or list of axes (major to minor), that splits the token sequence of the image "
        "stream (null: not split). An axis that the attention.qkv rule for self-attention moves onto the heads is a "
        "Ulysses axis; any other splits the tokens at the attention kernel too, a ring axis (see "
        "`sequence_parallel`). USP, Ulysses x ring: [ring, ulysses] with the qkv rule [batch, ring, ulysses]")
    sequence_parallel: Literal["partitioner", "diffusers", "xdit"] = Field(
        "partitioner", description="what runs the sequence split: 'partitioner', XLA's SPMD partitioner or torch "
        "DTensor (what meshlab applies and runs): every chip gathers the keys and values of a ring axis and runs one "
        "attention over them, no ring (`ring` gather), and the streams are re-split to be joined; 'diffusers', its "
        "context parallelism (ContextParallelConfig): a ring gathers k and v once, then runs one attention pass per "
        "rank over its block, each merged into the running output (gather-passes); 'xdit', xDiT (yunchang, "
        "ring-flash-attention): one pass per rank while the next block comes from the neighbour by async send/recv "
        "(p2p-passes). Both tools join each chip's own text and image shards on the chip")
    rules: list[ActivationRule] = Field(
        default_factory=list, max_length=100,
        description="splits of intermediate activations at named points of every block (see ActivationRule)")

    @field_validator("sequence")
    @classmethod
    def _sequence_axes(cls, sequence: str | list[str] | None, info: ValidationInfo) -> str | list[str] | None:
        """A sequence list of distinct axes, none of them the batch axis (declared, so validated, before)."""
        axes = () if sequence is None else (sequence,) if isinstance(sequence, str) else tuple(sequence)
        if isinstance(sequence, list) and not axes:
            raise ValueError("an empty list of sequence axes; give axes, or null (not split)")
        if len(set(axes)) != len(axes):
            raise ValueError(f"an axis is named twice in {list(axes)}")
        batch = info.data.get("batch")
        if batch is not None and batch in axes:
            raise ValueError(f"axis {batch!r} splits the batch; it cannot also split the sequence")
        return sequence

    @property
    def ring(self) -> str:
        """How a ring axis's attention runs under `sequence_parallel`: gather, gather-passes or p2p-passes."""
        return {"partitioner": "gather", "diffusers": "gather-passes", "xdit": "p2p-passes"}[self.sequence_parallel]

    def identity(self) -> dict:
        """The record as JSON, in the form keys were made from before `sequence` took lists and `sequence_parallel`
        and a rule's `attention` were added (a one-axis list is its name; defaults are left out): a plan's identity
        in profiles and caches."""
        found = self.model_dump(mode="json")
        if found.get("sequence_parallel") == "partitioner":
            del found["sequence_parallel"]
        for rule in found.get("rules", []):
            if rule.get("attention") is None:  # every attention, as every rule was before rules could choose
                rule.pop("attention", None)
        if isinstance(found.get("sequence"), list) and len(found["sequence"]) == 1:
            found["sequence"] = found["sequence"][0]
        return found

    @property
    def sequence_axes(self) -> tuple[str, ...]:
        """The axes that split the tokens, major to minor (() when none)."""
        if self.sequence is None:
            return ()
        return (self.sequence,) if isinstance(self.sequence, str) else tuple(self.sequence)


class Workload(Closed):
    """What one generation asks of the model.

    In a strategy file, height, width, frames, steps, cfg and text_tokens left out are the model's pipeline's defaults
    (meshlab/data/pipelines.yaml; the defaults below are for a model without them), but a mesh with a cfg axis keeps
    cfg: true."""

    height: Int = Field(1024, ge=16, le=16384, description="image height in pixels")
    width: Int = Field(1024, ge=16, le=16384, description="image width in pixels")
    frames: Int = Field(1, ge=1, le=10000, description="video frames per sample (video models only; Wan: 1 + 4k, "
                        "e.g. 81); 1 for an image")
    batch: Int = Field(1, ge=1, le=4096, description="images (or videos) per call")
    steps: Int = Field(50, ge=1, le=1000, description="denoising steps")
    cfg: bool = Field(True, description="classifier-free guidance: the transformer runs twice per step")
    text_tokens: Int = Field(512, ge=1, le=65536, description="text tokens per prompt after padding")
    dtype: Literal["bfloat16", "float16", "float32"] = Field("bfloat16", description="weights and activations")
    weights_dtype: Optional[Literal["bfloat16", "float16", "float32"]] = Field(
        None, description="the dtype the transformer's weights are held in between uses, where it differs from "
        "dtype (mixed precision: Wan's official code loads float32 weights and computes in bfloat16 under autocast, "
        "its FSDP keeping the shards in float32 and gathering them in bfloat16); memory only: the time prices the "
        "weights as they are computed with")
    flash_attention: bool = Field(
        True, description="attention without materialising the scores (TPU flash kernel); false adds them"
    )


def output_noun(workloads) -> str:
    """What the plans of `workloads` make, for the words of tables and reasons: "video" where every one makes
    several frames, "image" where none does, "output" where they mix (the JSON keeps its `_per_image` keys)."""
    kinds = {"video" if w.frames > 1 else "image" for w in workloads}
    return kinds.pop() if len(kinds) == 1 else "output"


def with_article(noun: str) -> str:
    """"an image", "a video"."""
    return f"an {noun}" if noun[0] in "aeiou" else f"a {noun}"


EncoderPlace = Literal["cpu", "device", "sharded"]


class Placement(Closed):
    """Where the pipeline's other components live."""

    text_encoder: EncoderPlace = Field(
        "cpu", description="every encoder of the conditioning (text encoders, and an image encoder such as Wan "
        "2.1 image-to-video's CLIP) but those `encoders` names: 'cpu': on the host; 'device': replicated in HBM on "
        "every chip; 'sharded': split over every chip (FSDP, as Wan's --t5_fsdp), one layer gathered at a time "
        "while it encodes")
    encoders: dict[str, EncoderPlace] = Field(
        default_factory=dict, description="encoders placed otherwise than `text_encoder` says, each by its name in "
        "the model card (text_encoder, text_encoder_2, text_encoder_3, image_encoder; `meshlab models list` shows "
        "them), e.g. {image_encoder: device} beside text_encoder: sharded, as Wan's I2V script shards T5 and keeps "
        "CLIP whole on every GPU")
    vae: Literal["device", "cpu"] = Field("device", description="'device': weights and decode working set in HBM")
    vae_dtype: Optional[Literal["bfloat16", "float16", "float32"]] = Field(
        None, description="the VAE's dtype where it differs from workload.dtype (Wan's official code and diffusers' "
        "Wan examples run the VAE in float32, and a Wan file that leaves this out takes float32): its weights and "
        "decode working set in memory; the decode's time is priced at workload.dtype")
    vae_decode: Literal["full", "tiled", "parallel"] = Field(
        "full", description="how the VAE decodes: 'full', the whole image at once (diffusers' default); 'tiled', "
        "diffusers' vae.enable_tiling(): overlapping tiles of the VAE's own size one at a time; 'parallel', the "
        "image's rows split over the chips that decode it (xDiT's parallel VAE; GPUs only)")

    def encoder_place(self, name: str) -> str:
        """Where the encoder the card names `name` lives: its own entry in `encoders`, else `text_encoder`."""
        return self.encoders.get(name, self.text_encoder)

    def places(self, names) -> dict[str, str]:
        """Where each of the encoders `names` lives, by name, in their order."""
        return {n: self.encoder_place(n) for n in names}

    def field_of(self, name: str) -> tuple[str, ...]:
        """The field that places the encoder `name`: its own entry in `encoders`, or ``text_encoder``."""
        return ("placement", "encoders", name) if name in self.encoders else ("placement", "text_encoder")

    def first_at(self, place: str, names) -> tuple[str, ...] | None:
        """The field that puts the first of the encoders `names` at `place`, None where none lives there."""
        name = next((n for n in names if self.encoder_place(n) == place), None)
        return None if name is None else self.field_of(name)


class Compile(Closed):
    """How the plan is compiled."""

    elementwise: Literal["fused", "eager"] = Field(
        "fused", description="how the elementwise ops between matmuls (norms, modulation, RoPE, activations, "
        "residual adds) run, for the time: 'fused', one pass per gap between matmuls (XLA, torch.compile); 'eager', "
        "every op its own kernel reading and writing its tensors (plain PyTorch, as `meshlab run --backend torch` "
        "runs); left out of a file: fused on a TPU, eager on a GPU")
    scan_blocks: bool = Field(
        False, description="run every block list through torch_xla's scan: one compiled loop body instead of one "
        "copy per block (compile time stops growing with depth; every block of a list must share its specs)")
    libtpu_flags: list[str] = Field(
        default_factory=list, description="XLA:TPU flags the plan is compiled with, as LIBTPU_INIT_ARGS takes them "
        "(e.g. --xla_tpu_enable_windowed_einsum_for_all_gather=false, or MaxText's async collective flags): "
        "`check --backend tpu` compiles with them, `run` on a TPU sets them and `export --format torch-xla` "
        "writes them; the time model prices the windowed-einsum ones (collective matmuls off), "
        "--xla_tpu_enable_async_all_to_all and --xla_enable_async_all_gather (where the chip's catalog entry gives "
        "the share XLA:TPU's schedule hides), no other")

    @field_validator("libtpu_flags")
    @classmethod
    def _flags(cls, flags: list[str]) -> list[str]:
        for flag in flags:
            if not _LIBTPU_FLAG.fullmatch(flag):
                raise ValueError(f"{flag!r} is not a libtpu flag: write --name or --name=value, one flag per item "
                                 "(e.g. --xla_tpu_enable_windowed_einsum_for_all_gather=false)")
            name, value = flag_setting(flag)
            if name.startswith("xla_tpu_enable_") and value is None:
                raise ValueError(f"{flag!r} sets an on/off flag to a value that is neither: write =true or =false")
        return flags


_LIBTPU_FLAG = re.compile(r"--[A-Za-z0-9_]+(=\S+)?")
_TRUE, _FALSE = ("true", "1", "yes", "t", "y"), ("false", "0", "no", "f", "n")


def flag_setting(flag: str) -> tuple[str, bool | None]:
    """A libtpu flag's name and on/off value as absl's parser reads a boolean: ``--name`` and ``--name=true`` on,
    ``--noname`` and ``--name=false`` off (None: a value that is neither, or a flag that is not on/off)."""
    name, given, value = flag.removeprefix("--").partition("=")
    if not given:
        return (name[2:], False) if name.startswith("no") else (name, True)
    value = value.lower()
    return name, True if value in _TRUE else False if value in _FALSE else None


def flag_value(flags, name: str, default: bool) -> bool:
    """The on/off value the last of a strategy's libtpu `flags` naming `name` sets (absl's parser: the last wins),
    `default` where none does or the last sets neither (XLA's ``=auto``, which leaves the chip's default; an
    ``xla_tpu_enable_*`` flag set to neither is refused by the schema)."""
    settings = [value for flag, value in map(flag_setting, flags) if flag == name]
    return default if not settings or settings[-1] is None else settings[-1]


#: the XLA flag that runs all-gathers asynchronously (=auto, the chip's default, reads as unset): on by default, yet
#: XLA:TPU keeps FSDP's weight gathers synchronous on v6e and runs 6 of a block's 8 async on v5e (fsdp.yaml at full
#: depth), where =false makes them all synchronous (python benchmarks/tpu_async_overlap.py --strategy fsdp --hardware
#: v5e-8 ...); on v4 =true makes all 14 of fsdp.yaml's async over its 4 chips, where they are synchronous by default
#: (the catalog's ``async_weight_gathers``); ``async_weight_gather_hidden`` prices what that hides, and a chip that
#: runs them async is priced holding two blocks gathered
ASYNC_ALL_GATHER_FLAG = "xla_enable_async_all_gather"


def async_all_gathers(libtpu_flags: tuple[str, ...] | list[str] = ()) -> bool:
    """Whether a strategy's libtpu flags leave XLA's async all-gathers on (the default)."""
    return flag_value(libtpu_flags, ASYNC_ALL_GATHER_FLAG, True)


def weight_gathers_run_async(mode: str, libtpu_flags: tuple[str, ...] | list[str] = ()) -> bool:
    """Whether FSDP's weight gathers run async on a chip whose catalog ``async_weight_gathers`` is `mode` under these
    flags: "by-default" unless they turn XLA's async all-gathers off, "with-flag" only where they set them on."""
    return (mode == "by-default" and async_all_gathers(libtpu_flags)) or (
        mode == "with-flag" and flag_value(libtpu_flags, ASYNC_ALL_GATHER_FLAG, False))


#: Model rewrites a strategy can ask for: what each changes, and which collectives it removes.
REWRITES = {
    "layernorm-rows": "every LayerNorm computes mean and variance over the last dim (in float32, cast back) "
    "instead of PyTorch/XLA's batch-norm lowering over [1, batch x tokens, features]: the same values within bf16 "
    "rounding, and no all-gather of the rows a batch, guidance or sequence split cuts",
}


def _override_properties(schema: dict) -> None:
    """A HardwareRef's schema names every figure it may override, as `HardwareFigures` reads it, and no other key."""
    from meshlab.core.hardware_figures import HardwareFigures

    schema["properties"] = {**schema["properties"], **HardwareFigures.model_json_schema()["properties"]}
    schema["additionalProperties"] = False


class HardwareRef(Closed):
    """A catalog entry by name, with any of its figures overridden."""

    # the figures overridden, by name: read and checked by meshlab.core.hardware.with_overrides when the plan loads
    model_config = ConfigDict(extra="allow", json_schema_extra=_override_properties)

    name: str = Field(description="catalog name, e.g. v6e-8 (see `meshlab hardware`)")

    @property
    def extra(self) -> dict[str, Any]:
        """The figures overridden, by name."""
        return dict(self.model_extra or {})


class Strategy(Closed):
    """One sharding plan for one model on one kind of hardware."""

    EXAMPLE = "strategies/2d.yaml"

    name: str = Field(min_length=1, max_length=200, description="short name shown in tables")
    description: str = Field("", max_length=10000, description="what the plan is for")
    model: str = Field(description="a built-in model card (qwen-image, flux-dev) or a path to a card .json")
    hardware: Union[str, HardwareRef] = Field(description="catalog name, or {name: ..., <figure>: <override>}, or a "
                                              "profile file from `meshlab profile` (a path ending .json)")
    mesh: dict[AxisName, Int] = Field(
        description="ordered mesh axes, name to size; one size may be -1 (inferred from the device count)"
    )
    dcn: dict[AxisName, Int] = Field(
        default_factory=dict,
        description="on several slices (hardware v6e-8x2): the mesh axes that cross slices, each with the number of "
        "slices it spans (data: 2 is 2 slices x the rest of data within each); their product is the slice count")
    rules: list[Rule] = Field(default_factory=list, max_length=1000, description="first match wins")
    activations: Activations = Field(default_factory=Activations)
    workload: Workload = Field(default_factory=Workload)
    placement: Placement = Field(default_factory=Placement)
    compile: Compile = Field(default_factory=Compile)
    rewrites: list[str] = Field(
        default_factory=list, max_length=20,
        description="model rewrites applied before the plan, by name: " + "; ".join(
            f"'{name}': {what}" for name, what in REWRITES.items()))

    @field_validator("rewrites")
    @classmethod
    def _known_rewrites(cls, rewrites: list[str]) -> list[str]:
        """Known rewrites, each once."""
        for name in rewrites:
            if name not in REWRITES:
                raise ValueError(f"unknown rewrite {name!r}; the rewrites are {', '.join(REWRITES)}")
        if len(set(rewrites)) != len(rewrites):
            raise ValueError("a rewrite is named twice")
        return rewrites

    @field_validator("mesh")
    @classmethod
    def _mesh_sizes(cls, mesh: dict[str, int]) -> dict[str, int]:
        """A mesh of positive (or one inferred) sizes."""
        if not mesh:
            raise ValueError("the mesh needs at least one axis, e.g. {model: 8}")
        for name, size in mesh.items():
            if size != -1 and size < 1:
                raise ValueError(f"axis {name!r} has size {size}; sizes are positive or -1 (inferred)")
        return mesh

    @field_validator("dcn")
    @classmethod
    def _dcn_spans(cls, dcn: dict[str, int]) -> dict[str, int]:
        """dcn spans of positive counts."""
        for name, size in dcn.items():
            if size < 1:
                raise ValueError(f"dcn axis {name!r} spans {size} slices; give a positive count")
        return dcn

    @property
    def hardware_name(self) -> str:
        return self.hardware if isinstance(self.hardware, str) else self.hardware.name

    @property
    def hardware_overrides(self) -> dict[str, object]:
        if isinstance(self.hardware, str):
            return {}
        return dict(self.hardware.extra)
