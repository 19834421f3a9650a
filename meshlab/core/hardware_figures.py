"""How hardware figures are written, as pydantic types: the catalog file's entries (``meshlab/data/hardware.yaml``,
each figure ``{value: ..., source: ...}``) and a strategy's overrides (``hardware: {name: v6e-8, <figure>: ...}``).

Both read a figure the same way, through one field of `HardwareFigures`: bytes as a number or with a unit
("31.25GiB", "32GB"), a topology as ``[2, 4]`` or ``"2x4"``, rates as numbers (``1.6e12`` or ``"1.6e12"``), an
optional figure as ``none``. The parsers are hand-written (as PlainValidators) because YAML reads ``1.6e12`` as a
string (PyYAML's YAML 1.1 wants a sign in the exponent), which pydantic's ByteSize refuses ("could not interpret
byte unit: e12") and its float reads only in lax mode, and ``2x4`` is no type of pydantic's. Each field's problem is
a ValueError that names the value; `meshlab.core.hardware` turns it into a one-line InputError with the fix. The checks
across figures (usable HBM within HBM, a topology holding the chips) are the `Hardware` value's.
"""

from __future__ import annotations

import math
import re
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import ConfigDict, Field, PlainValidator, create_model

from meshlab.core.closed import Closed
from meshlab.core.matmul_rates import MatmulRates

INTERCONNECTS = ("ici-torus", "nvswitch")

_BYTE_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_BYTES_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")
BYTES_HELP = 'give bytes as a number (34359738368, 1.6e12) or with a unit: "31.25GiB", "32GB", "512MiB", "2TiB"'


def parse_bytes(value: object) -> int:
    """Bytes from an int, a float (``1.6e12``) or a string with an optional unit (``"31.25GiB"``, ``"32GB"``).

    GB/TB are powers of ten, GiB/TiB powers of two; units are case-insensitive. Raises ValueError."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a byte count")
    if isinstance(value, (int, float)):
        number, scale = float(value), 1
    elif isinstance(value, str) and (match := _BYTES_RE.match(value)):
        unit = match.group(2).lower()
        if unit not in _BYTE_UNITS:
            raise ValueError(f"unknown byte unit {match.group(2)!r} in {value!r}")
        number, scale = float(match.group(1)), _BYTE_UNITS[unit]
    else:
        raise ValueError(f"{value!r} is not a byte count")
    if not math.isfinite(number) or number < 0:
        raise ValueError(f"{value!r} is not a byte count >= 0")
    return round(number * scale)


def parse_number(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{value!r} is not a number")
    try:
        number = float(value)
    except ValueError:
        raise ValueError(f"{value!r} is not a number") from None
    if not math.isfinite(number):
        raise ValueError(f"{value!r} is not a finite number")
    return number


def parse_optional_number(value: object) -> float | None:
    """A number, or None for ``none`` (an optional figure not given: no price, no float32 peak)."""
    return None if value in (None, "none") else parse_number(value)


def parse_count(value: object) -> int:
    number = parse_number(value)
    if not number.is_integer():
        raise ValueError(f"{value!r} is not a whole number")
    return int(number)


def parse_topology(value: object) -> tuple[int, ...]:
    if isinstance(value, str):  # "2x4" as a command line gives it
        value = value.lower().split("x")
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"{value!r} is not a topology; give a list of ints like [2, 4] or '2x4'")
    return tuple(parse_count(n) for n in value)


def parse_wraparound(value: object) -> tuple[bool, ...]:
    if not isinstance(value, (list, tuple)) or not all(isinstance(w, bool) for w in value):
        raise ValueError(f"{value!r} is not a wraparound; give a list of true/false, one per topology axis")
    return tuple(value)


def parse_interconnect(value: object) -> str:
    if value not in INTERCONNECTS:
        raise ValueError(f"{value!r} is not one of {list(INTERCONNECTS)}")
    return str(value)


def parse_kernel(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"expected the name of a kernel, got {value!r}")
    return "" if value in ("", "none") else value


def parse_attention_rates(value: object) -> tuple[tuple[str, tuple[tuple[int, float], ...]], ...]:
    shape_help = "expected {kernel: [[sequence length, FLOP/s], ...]}"
    if not isinstance(value, dict) or not all(
            isinstance(points, list) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in points)
            for points in value.values()):
        raise ValueError(shape_help)
    return tuple((str(k), tuple((parse_count(n), parse_number(r)) for n, r in points)) for k, points in value.items())


ASYNC_GATHER_MODES = ("by-default", "with-flag")


def parse_async_gathers(value: object) -> str:
    """When a chip runs FSDP's weight gathers async: one of `ASYNC_GATHER_MODES`, or "" for none (never)."""
    if value in (None, "none", ""):
        return ""
    if value not in ASYNC_GATHER_MODES:
        raise ValueError(f"{value!r} is not one of {[*ASYNC_GATHER_MODES, 'none']}")
    return str(value)


def parse_group_bytes(value: object) -> tuple[tuple[int, int], ...]:
    """[[chips in the group, bytes], ...], the group sizes increasing; [] or none for not given."""
    if value in (None, "none"):
        return ()
    shape_help = "expected [[chips in the group, bytes], ...], the group sizes increasing, or none"
    if not isinstance(value, list) or not all(isinstance(p, (list, tuple)) and len(p) == 2 for p in value):
        raise ValueError(shape_help)
    pairs = tuple((parse_count(n), parse_bytes(b)) for n, b in value)
    if any(n < 2 for n, _ in pairs):
        raise ValueError(f"{value!r}: a group is 2 chips or more")
    if [n for n, _ in pairs] != sorted({n for n, _ in pairs}):
        raise ValueError(f"{value!r}: give each group size once, increasing")
    return pairs


def parse_matmul_rates(value: object) -> MatmulRates | None:
    """{m: [...], n: [...], k: [...], flops: [[[FLOP/s per k] per n] per m]}, or none."""
    if value in (None, "none"):
        return None
    shape_help = "expected {m: [...], n: [...], k: [...], flops: [[[FLOP/s for each k] for each n] for each m]}"
    if not isinstance(value, dict) or set(value) != {"m", "n", "k", "flops"}:
        raise ValueError(shape_help + ", or none")
    axes = [value[name] for name in ("m", "n", "k")]
    if not all(isinstance(axis, list) for axis in axes):
        raise ValueError(shape_help)
    m, n, k = (tuple(parse_count(x) for x in axis) for axis in axes)
    flops = value["flops"]
    if not (isinstance(flops, list) and len(flops) == len(m) and all(
            isinstance(row, list) and len(row) == len(n) and all(isinstance(r, list) and len(r) == len(k) for r in row)
            for row in flops)):
        raise ValueError(f"flops must be {len(m)} x {len(n)} x {len(k)} (m, then n, then k)")
    return MatmulRates(m, n, k, tuple(parse_number(r) for row in flops for line in row for r in line))


def _figure(parse, written: Any) -> PlainValidator:
    return PlainValidator(parse, json_schema_input_type=written)


_NUMBER = Union[float, str]
Bytes = Annotated[int, _figure(parse_bytes, Union[int, float, str])]
Count = Annotated[int, _figure(parse_count, _NUMBER)]
Number = Annotated[float, _figure(parse_number, _NUMBER)]
OptionalNumber = Annotated[Optional[float], _figure(parse_optional_number, Union[float, str, None])]
Topology = Annotated[tuple[int, ...], _figure(parse_topology, Union[list[int], str])]
Wraparound = Annotated[tuple[bool, ...], _figure(parse_wraparound, list[bool])]
Interconnect = Annotated[str, _figure(parse_interconnect, Literal["ici-torus", "nvswitch"])]
Kernel = Annotated[str, _figure(parse_kernel, str)]
AttentionRates = Annotated[tuple[tuple[str, tuple[tuple[int, float], ...]], ...],
                           _figure(parse_attention_rates, dict[str, list[tuple[int, float]]])]
AsyncGathers = Annotated[str, _figure(parse_async_gathers, Optional[Literal["by-default", "with-flag", "none"]])]
_GROUP_BYTES = Union[list[tuple[int, Union[int, float, str]]], Literal["none"], None]
GroupBytes = Annotated[tuple[tuple[int, int], ...], _figure(parse_group_bytes, _GROUP_BYTES)]
MatmulGrid = Annotated[Optional[MatmulRates], _figure(parse_matmul_rates, Union[dict[str, list], str, None])]


def _no_null_defaults(schema: dict) -> None:
    """A figure that takes no null (all but the optional ones) shows no null default in the schema."""
    for name, field in schema["properties"].items():
        if name not in OPTIONAL and field.get("default", 0) is None:
            del field["default"]


#: Optional figures that are numbers, where 0 is a value (an own cluster's price) and None means not given.
OPTIONAL_NUMBERS = ("usd_per_chip_hour", "fp32_flops", "eager_dispatch_s", "collective_matmul_flop_per_byte",
                    "sm_count", "async_all_to_all_hidden", "async_weight_gather_hidden", "fused_softmax_keys",
                    "recomputed_softmax_keys", "mask_broadcast_keys")
#: the figures that take none (null): no GEMM rates, and the optional numbers
OPTIONAL = ("matmul_rates", "reduce_scatter_combine_bytes", *OPTIONAL_NUMBERS)


class HardwareFigures(Closed):
    """The figures of a hardware entry, each as the catalog and an override write it. Every field may be left
    out here: an override names only what it changes, and `CatalogEntry` says which figures an entry must have."""

    model_config = ConfigDict(arbitrary_types_allowed=True, json_schema_extra=_no_null_defaults)

    interconnect: Interconnect = Field(None, description="ici-torus (TPU links to neighbours) or nvswitch (GPUs)")
    chips: Count = Field(None, description="devices in the slice or node")
    hosts: Count = Field(None, description="physical hosts (1 for a sub-host slice)")
    ici_links: Count = Field(None, description="links per chip (TPU ICI ports; 1 switched port on GPUs)")
    topology: Topology = Field(None, description="chips along each physical axis, [2, 4] or '2x4'")
    wraparound: Wraparound = Field(None, description="per topology axis: does it close into a ring")
    hbm_bytes: Bytes = Field(None, description="physical HBM per chip")
    usable_hbm_bytes: Bytes = Field(None, description="what the runtime reports as allocatable per chip")
    runtime_reserve_bytes: Bytes = Field(None, description="a further margin per chip the planner keeps free")
    host_memory_bytes: Bytes = Field(None, description="DRAM per host")
    hbm_bandwidth: Number = Field(None, description="bytes/s per chip")
    bf16_flops: Number = Field(None, description="dense bf16 peak FLOP/s per chip")
    ici_link_bandwidth: Number = Field(None, description="bytes/s one way per link (GPUs: the whole NVLink)")
    dcn_bandwidth_per_host: Number = Field(None, description="bytes/s a host sends over the data-center network")
    host_link_bandwidth: Number = Field(None, description="bytes/s one way between one chip and its host")
    host_flops: Number = Field(None, description="FLOP/s the host CPU gives a component placed on it")
    checkpoint_read_bandwidth: Number = Field(None, description="bytes/s one host reads a checkpoint")
    compute_efficiency: Number = Field(None, description="fraction of bf16_flops a large matmul reaches, (0, 1]")
    hbm_efficiency: Number = Field(None, description="fraction of hbm_bandwidth a streaming kernel reaches, (0, 1]")
    collective_latency_s: Number = Field(None, description="fixed latency per collective hop or step")
    step_overhead_s: Number = Field(None, description="host overhead per denoising step")
    compile_seconds_base: Number = Field(None, description="compiling the denoising step: a fixed part")
    compile_seconds_per_block: Number = Field(None, description="... and a part per transformer block")
    compile_seconds_per_scanned_block: Number = Field(None, description="... a scanned list compiles one block "
                                                      "body, and this part per block it stacks")
    attention_kernel: Kernel = Field(None, description="the attention kernel a run uses (none: priced by "
                                                        "compute_efficiency)")
    attention_rates: AttentionRates = Field(None, description="per kernel, [sequence length, FLOP/s] of its "
                                                               "published forward pass at head dim 128")
    matmul_rates: MatmulGrid = Field(None, description="measured GEMM rates: {m, n, k, flops}, or none")
    usd_per_chip_hour: OptionalNumber = Field(None, description="on-demand list price of one chip-hour, or none")
    fp32_flops: OptionalNumber = Field(None, description="dense float32 matmul peak FLOP/s, or none")
    eager_dispatch_s: OptionalNumber = Field(None, description="host seconds to dispatch one eager PyTorch op, or "
                                                               "none")
    collective_matmul_flop_per_byte: OptionalNumber = Field(
        None, description="XLA:TPU runs a matmul fed or drained by a collective over n chips as a collective matmul "
        "(async permutes) when its FLOPs per chip per byte of that collective reach this x 2 / n; or none")
    sm_count: OptionalNumber = Field(None, description="a GPU's streaming multiprocessors: how many tiles of an "
                                                       "attention kernel run at once, or none")
    async_all_to_all_hidden: OptionalNumber = Field(
        None, description="the share of its all-to-alls' time XLA:TPU's schedule hides under compute when a plan's "
        "libtpu flags make them async (--xla_tpu_enable_async_all_to_all=true), from 0 to 1; or none (not priced)")
    async_weight_gather_hidden: OptionalNumber = Field(
        None, description="the share of FSDP's weight all-gathers' time XLA:TPU's schedule hides under compute where "
        "they run async on this chip (as async_weight_gathers says), from 0 to 1; or none (synchronous, or the share "
        "not measured: priced synchronous)")
    async_weight_gathers: AsyncGathers = Field(
        None, description="when XLA:TPU runs FSDP's weight gathers in the blocks async on this chip, started early "
        "(priced as two blocks' gathered weights held): by-default (libtpu's defaults; a plan's "
        "--xla_enable_async_all_gather=false makes them synchronous), with-flag (only where a plan sets "
        "--xla_enable_async_all_gather=true), or none (synchronous, flag or not, or not measured)")
    fused_softmax_keys: OptionalNumber = Field(
        None, description="XLA:TPU's program of torch's math attention (no flash kernel) holds one float32 buffer of "
        "a block's scores, the softmax fused into it, where a row has at most this many keys, and two (the scores "
        "and the probabilities) above; or none (two, whatever the keys)")
    recomputed_softmax_keys: OptionalNumber = Field(
        None, description="XLA:TPU's program of torch's math attention holds one float32 buffer, the scores, where a "
        "row has more than this many keys, and recomputes the probabilities where they are read; or none (as "
        "fused_softmax_keys says, whatever the keys)")
    mask_broadcast_keys: OptionalNumber = Field(
        None, description="XLA:TPU's program of torch's math attention, for a self- or joint attention called with a "
        "mask and split by no ring (no sequence split, or Ulysses alone), where it holds two float32 score buffers and "
        "a row has more than this many keys, also holds the mask broadcast to every head and query, one more such "
        "buffer, once a forward; or none (none, whatever the keys)")
    reduce_scatter_combine_bytes: GroupBytes = Field(
        None, description="[[chips in the group, bytes], ...]: XLA:TPU combines a block phase's reduce-scatters over "
        "a group of that many chips into one op while together they move at most the bytes (0: never), the nearest "
        "listed group standing for another; or none (combined whatever their size, not measured)")


class SourcedFigure(Closed):
    """One figure of the catalog: its value, as `HardwareFigures` reads it, and where it comes from."""

    value: Any = Field(description="the figure, written as the field of the same name in an override (the loader "
                                   "reads it as `meshlab schema hardware-overrides` describes that field)")
    source: str = Field("", description="a citation without a URL, or 'assumption: ...' with why")


def _entry_model(name: str, doc: str, required: tuple[str, ...], extra: dict) -> type[Closed]:
    # an optional figure may be left out, not written as null (validate_default is off, so None stands for absent)
    fields: dict[str, Any] = {figure: (SourcedFigure, None) for figure in HardwareFigures.model_fields}
    fields.update({figure: (SourcedFigure, ...) for figure in required})
    return create_model(name, __base__=Closed, __doc__=doc, **fields, **extra)


#: the figures every system has (its own or its accelerator's), each with a source
REQUIRED = ("interconnect", "chips", "hosts", "ici_links", "topology", "wraparound", "hbm_bytes", "usable_hbm_bytes",
            "runtime_reserve_bytes", "host_memory_bytes", "hbm_bandwidth", "bf16_flops", "ici_link_bandwidth",
            "dcn_bandwidth_per_host", "host_link_bandwidth", "host_flops", "checkpoint_read_bandwidth",
            "compute_efficiency", "hbm_efficiency", "collective_latency_s", "step_overhead_s",
            "compile_seconds_base", "compile_seconds_per_block", "compile_seconds_per_scanned_block")

#: a system merged with its accelerator: labels and every required figure
CatalogEntry = _entry_model(
    "CatalogEntry", "A system as meshlab loads it: its accelerator's figures with its own on top.", REQUIRED,
    {"kind": (Literal["tpu", "gpu", "cpu"], ...), "chip": (str, ...)})


class CatalogFile(Closed):
    """``meshlab/data/hardware.yaml``: accelerators, systems (an accelerator plus the slice around it), and the
    multi-slice names `meshlab hardware` lists. Entries are merged, then read as `CatalogEntry`."""

    model_config = ConfigDict(extra="allow")  # `shared:` holds YAML anchors the entries reuse

    accelerators: dict[str, dict[str, Any]]
    systems: dict[str, dict[str, Any]]
    multislice: list[str] = []
