"""The hardware catalog: what each accelerator and slice can hold and move, with a source for every figure.

The figures live in ``meshlab/data/hardware.yaml`` (one ``accelerators`` entry per chip, one ``systems`` entry
per name a user can give, e.g. ``v6e-8``). This module reads that file once, merges each system with its
accelerator, reads the figures through the pydantic models of ``meshlab.core.hardware_figures`` (as it reads a
strategy's overrides), and checks what holds across figures in the frozen `Hardware` value. It imports nothing
heavier than yaml and pydantic.

>>> hw = load_hardware("v6e-8", {"usable_hbm_bytes": "30GiB"})
>>> hw.chips, hw.topology, hw.usable_hbm_bytes == 30 * 2**30, hw.sources["usable_hbm_bytes"]
(8, (2, 4), True, 'override')
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from typing import Any

import yaml
from pydantic import ValidationError

from meshlab.core.closed import first_problem, problem_line
from meshlab.core.errors import InputError
from meshlab.core.hardware_figures import (
    BYTES_HELP, INTERCONNECTS, OPTIONAL_NUMBERS, CatalogEntry, CatalogFile, HardwareFigures,
)
from meshlab.core.matmul_rates import MatmulRates

CHIP_KINDS = ("tpu", "gpu", "cpu")  # cpu: only from a profile (meshlab.core.profile_hardware)
# INTERCONNECTS: "ici-torus": nearest-neighbour links along each topology axis; an axis with wraparound is a ring.
# "nvswitch": every device reaches every other through switches at its full link bandwidth.

COUNT_FIELDS = ("chips", "hosts", "ici_links")
BYTE_FIELDS = ("hbm_bytes", "usable_hbm_bytes", "runtime_reserve_bytes", "host_memory_bytes")
RATE_FIELDS = ("hbm_bandwidth", "bf16_flops", "ici_link_bandwidth", "dcn_bandwidth_per_host", "host_link_bandwidth",
               "host_flops", "checkpoint_read_bandwidth")
TIME_FIELDS = ("collective_latency_s", "step_overhead_s", "compile_seconds_base", "compile_seconds_per_block",
               "compile_seconds_per_scanned_block")
FRACTION_FIELDS = ("compute_efficiency", "hbm_efficiency")
# Every field that is a figure: each carries a source, and each can be overridden.
FIGURES = (
    ("interconnect",) + COUNT_FIELDS + ("topology", "wraparound")
    + BYTE_FIELDS + RATE_FIELDS + FRACTION_FIELDS + TIME_FIELDS
)
LABELS = ("kind", "chip")  # plain strings in the YAML, no source
#: Figures only some entries have (each with a source where it is given): the attention kernel a run uses on
#: this chip and the published forward rates of the kernels, by sequence length (head dim 128, non-causal); and
#: measured GEMM rates by shape (`MatmulRates`).
OPTIONAL_FIGURES = ("attention_kernel", "attention_rates", "matmul_rates", "usd_per_chip_hour", "fp32_flops",
                    "eager_dispatch_s", "collective_matmul_flop_per_byte", "sm_count", "async_all_to_all_hidden",
                    "async_weight_gather_hidden", "async_weight_gathers", "reduce_scatter_combine_bytes",
                    "fused_softmax_keys", "recomputed_softmax_keys", "mask_broadcast_keys")
#: the head dim the published attention rates were measured at; other head dims use compute_efficiency
ATTENTION_RATES_HEAD_DIM = 128
#: queries per tile of the flash kernels at head dim 128: FlashAttention-2's forward, which torch's flash backend
#: vendors (csrc/flash_attn/src/flash_fwd_launch_template.h, run_mha_fwd_hdim128: Flash_fwd_kernel_traits<128, 128,
#: 64, 4> off sm86/sm89, a grid of ceil(queries / kBlockM) x batch x heads), and FlashAttention-3's (hopper/
#: flash_fwd_launch_template.h, run_mha_fwd_hdim128: kBlockM 128); cuDNN's tile is not published and taken alike
ATTENTION_TILE_QUERIES = 128
#: the published rates' own setup (FlashAttention-3 paper v1, batch x sequence = 16k tokens, 16 heads, at every
#: length): 16384 / 128 x 16 = 2048 tiles on an H100 SXM5's 132 SMs (the rates' own chip, whatever chip borrows
#: them), 16 waves, the last one 64 tiles short
ATTENTION_RATES_TILES = 2048
ATTENTION_RATES_SMS = 132

@dataclass(frozen=True)
class Hardware:
    """One named system: a slice of TPU chips or a GPU node, per-chip figures and cost-model knobs.

    Bytes are ints, rates floats, all per chip unless named otherwise. Bandwidths are one way.
    On ``ici-torus`` hardware each chip has ``ici_links`` links of ``ici_link_bandwidth`` each, and an axis of
    ``topology`` is a ring where ``wraparound`` says so, else an open line. On ``nvswitch`` hardware the node is
    one axis with ``wraparound`` true and a single link carrying the GPU's whole NVLink bandwidth.
    The memory report counts `runtime_reserve_bytes` as one component of each chip's total, held against usable HBM.
    Several slices (``v6e-8x2``) count every chip and host of all of them; ``topology`` is one slice's, and a
    collective that crosses slices moves over the data-center network at `dcn_bandwidth_per_chip`.
    """

    name: str
    kind: str  # "tpu" or "gpu"
    chip: str  # human name, e.g. "TPU v6e (Trillium)"
    interconnect: str  # one of INTERCONNECTS
    chips: int  # devices in the slice or node
    hosts: int  # physical hosts (1 for a sub-host slice)
    ici_links: int  # links per chip (TPU ICI ports; 1 switched port on GPUs)
    topology: tuple[int, ...]  # chips along each physical axis; product == chips
    wraparound: tuple[bool, ...]  # per topology axis: does it close into a ring
    hbm_bytes: int  # physical HBM per chip
    usable_hbm_bytes: int  # what the runtime reports as allocatable per chip
    runtime_reserve_bytes: int  # further margin per chip for compiler scratch, collectives, fragmentation
    host_memory_bytes: int  # DRAM per host (what the VM gets on a sub-host slice)
    hbm_bandwidth: float  # bytes/s per chip
    bf16_flops: float  # dense bf16 peak FLOP/s per chip
    ici_link_bandwidth: float  # bytes/s one way per link (GPUs: whole NVLink bandwidth one way)
    dcn_bandwidth_per_host: float  # bytes/s a host sends over the data-center network
    host_link_bandwidth: float  # bytes/s one way between one chip and its host (PCIe)
    host_flops: float  # FLOP/s the host CPU gives a component placed on it
    compute_efficiency: float  # fraction of bf16_flops a large matmul reaches
    hbm_efficiency: float  # fraction of hbm_bandwidth a streaming kernel reaches
    collective_latency_s: float  # fixed latency per collective hop/step
    step_overhead_s: float  # host overhead per step
    checkpoint_read_bandwidth: float  # bytes/s one host reads a checkpoint from its storage
    compile_seconds_base: float  # compiling the denoising step: a fixed part ...
    compile_seconds_per_block: float  # ... and a part per transformer block (0 and 0: eager, nothing compiled)
    compile_seconds_per_scanned_block: float  # a scanned list: its one body per block above, and this per block
    sources: dict[str, str] = field(default_factory=dict, hash=False, compare=False)
    overridden: tuple[str, ...] = ()
    slices: int = 1  # slices joined by DCN (a `<system>x<k>` name)
    #: the attention kernel a run uses ("" when the catalog has no published rates for this chip); a key of
    #: `attention_rates`
    attention_kernel: str = ""
    #: per kernel, (sequence length, FLOP/s) of its published forward pass at head dim 128, non-causal
    attention_rates: tuple[tuple[str, tuple[tuple[int, float], ...]], ...] = ()
    #: measured GEMM rates by shape (None: every matmul at compute_efficiency)
    matmul_rates: MatmulRates | None = None
    #: what renting one chip (one GPU) costs per hour, on demand at list price (None: no price known)
    usd_per_chip_hour: float | None = None
    #: dense float32 matmul peak FLOP/s as the frameworks run float32 by default (None: not in the catalog)
    fp32_flops: float | None = None
    #: the host's seconds to dispatch one op of eager PyTorch (a traced op of the card's `dispatches`): a call takes
    #: the longer of its dispatches and its kernels (None: not priced, as on a TPU, where XLA runs the call whole;
    #: a GPU's torch.compile'd call, `elementwise: fused`, is assumed to hide its launches, unmeasured)
    eager_dispatch_s: float | None = None
    #: a GPU's streaming multiprocessors: the tiles of an attention kernel that run at once
    #: (`attention_occupancy`; None: attention at its published rate whatever its size)
    sm_count: int | float | None = None
    #: XLA:TPU's collective matmul: a matmul fed by an all-gather (or drained by a reduce-scatter) over n chips runs
    #: as async permutes when its FLOPs per chip per byte of that collective reach this x 2 / n, over 3 chips or more
    #: (None: not modelled)
    collective_matmul_flop_per_byte: float | None = None
    #: XLA:TPU's schedule of a plan whose libtpu flags make its all-to-alls async: the share of their time it hides
    #: under compute (None: not measured for this chip, and not priced)
    async_all_to_all_hidden: float | None = None
    #: XLA:TPU's schedule of FSDP's weight all-gathers where they run async on this chip (`async_weight_gathers`):
    #: the share of their time it hides under compute (None: synchronous here, or not measured: priced synchronous)
    async_weight_gather_hidden: float | None = None
    #: when XLA:TPU runs FSDP's weight gathers async here: "by-default", "with-flag" (a plan's
    #: --xla_enable_async_all_gather=true), or "" (never; meshlab.plan.memory.weight_gathers_async)
    async_weight_gathers: str = ""
    #: XLA:TPU's all-reduce combiner on a block phase's reduce-scatters (all-reduce-scatter fusions): (chips in the
    #: group, the most bytes they move together and still run as one op; 0: never), group sizes increasing
    #: (`combine_limit`; empty: combined whatever their size, not measured)
    reduce_scatter_combine_bytes: tuple[tuple[int, int], ...] = ()
    #: XLA:TPU's program of torch's math attention (no flash kernel): where a row of scores has at most this many
    #: keys it holds one float32 buffer of a block's scores (the softmax fused into it), above it two, the scores
    #: and the probabilities (None: two, whatever the keys; not measured)
    fused_softmax_keys: int | float | None = None
    #: the same program where a row has more keys than this: one float32 buffer again, the scores alone, the
    #: probabilities recomputed where they are read (None: as fused_softmax_keys says, whatever the keys)
    recomputed_softmax_keys: int | float | None = None
    #: the same program, for a self- or joint attention called with a mask (``Attention.masked``) and split by no ring
    #: (no sequence split, or Ulysses alone), where it holds two buffers and a row has more keys than this: the mask
    #: broadcast to every head and query besides, one more buffer of a block's scores, once a forward (None: none,
    #: whatever the keys)
    mask_broadcast_keys: int | float | None = None
    #: a measured profile (meshlab.core.profile_points.Profile) the cost model prices ops from, when the strategy's
    #: hardware is a profile file
    profile: Any = field(default=None, hash=False, compare=False, repr=False)
    #: XLA:TPU's compile of this very plan and size, measured ahead of time (meshlab.plan.compile_times); the
    #: startup takes its seconds in place of the compile_seconds model
    compile_measured: Any = field(default=None, hash=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "topology", tuple(self.topology))
        object.__setattr__(self, "wraparound", tuple(self.wraparound))
        object.__setattr__(self, "overridden", tuple(self.overridden))
        for name in RATE_FIELDS + TIME_FIELDS + FRACTION_FIELDS + OPTIONAL_NUMBERS:
            if _is_int(getattr(self, name)):
                object.__setattr__(self, name, float(getattr(self, name)))
        if self.sm_count is not None and float(self.sm_count).is_integer():  # a count: whole, shown as one
            object.__setattr__(self, "sm_count", int(self.sm_count))
        problems = _problems(self)
        if problems:  # the first broken invariant; fixing it reveals the next
            raise ValueError(f"hardware {self.name!r}: {problems[0]}")

    @property
    def dcn_bandwidth_per_chip(self) -> float:
        """Each chip's share of its host's DCN bandwidth (the hosts of a slice share theirs among its chips)."""
        return self.dcn_bandwidth_per_host * self.hosts / self.chips

    @property
    def usd_per_hour(self) -> float | None:
        """What the whole system costs per hour: every chip of it at `usd_per_chip_hour` (None: no price)."""
        return None if self.usd_per_chip_hour is None else self.usd_per_chip_hour * self.chips

    @property
    def kernel_rates(self) -> tuple[tuple[int, float], ...]:
        """The published (sequence length, FLOP/s) points of `attention_kernel`; () when there is no kernel."""
        return dict(self.attention_rates).get(self.attention_kernel, ())

    def attention_occupancy(self, batch: int, heads: int, queries: int) -> float:
        """How full this GPU's SMs run an attention of `batch` x `heads` x `queries` against how full they ran in
        the published rates' setup (1.0 without `sm_count`). The kernel cuts the queries into tiles of
        `ATTENTION_TILE_QUERIES` per sample and head; each SM runs its tiles one after another, so the kernel lasts
        as many tile-times as the busiest SM holds (`ceil(tiles / sm_count)`: an SM's throughput is shared by the
        tiles it holds at once), and a partial last tile costs a whole one. The published rates filled 16 such waves
        but for 64 tiles (0.97 full); a ring's pass or a Ulysses shard of one 1024x1024 image has 108 to 432 tiles:
        one to four waves on 132 SMs, about 0.82 full. The tiles are counted as the kernel runs them, after any
        Ulysses all-to-all (meshlab.cost.flops.Work.kernel_rows)."""
        if self.sm_count is None:
            return 1.0
        return sm_fill(batch * heads, queries, int(self.sm_count)) / sm_fill(
            ATTENTION_RATES_TILES, ATTENTION_TILE_QUERIES, ATTENTION_RATES_SMS)

    def attention_rate(self, keys: int, head_dim: int) -> float | None:
        """FLOP/s of one attention of `keys` keys per query on this chip's `attention_kernel`, interpolated
        (in log sequence length) between its published rates and held at the ends; None where none applies
        (no kernel, or another head dim), and compute_efficiency prices it."""
        points = self.kernel_rates
        if not points or head_dim != ATTENTION_RATES_HEAD_DIM or keys < 1:
            return None
        if keys <= points[0][0]:
            return points[0][1]
        for (n0, r0), (n1, r1) in zip(points, points[1:]):
            if keys <= n1:
                t = math.log(keys / n0) / math.log(n1 / n0)
                return r0 + t * (r1 - r0)
        return points[-1][1]

    @property
    def rated_ops(self) -> tuple[str, ...]:
        """The op kinds this entry prices at rates of their own, not compute_efficiency: "linear" (measured GEMM
        rates), "attention" (its kernel's published rates)."""
        return tuple(kind for kind, given in (("linear", self.matmul_rates is not None),
                                              ("attention", bool(self.attention_kernel))) if given)

    @property
    def tiled_layouts(self) -> bool:
        """XLA:TPU lays every array out in tiles that pad it (meshlab.core.tpu_tiles); a GPU allocates the bytes."""
        return self.kind == "tpu"

    def matmul_rate(self, m: int, k: int, n: int) -> float | None:
        """FLOP/s of a ``[m, k] x [k, n]`` GEMM from the measured `matmul_rates`; None where the entry has none
        (compute_efficiency prices it)."""
        return self.matmul_rates.rate(m, k, n) if self.matmul_rates is not None and min(m, k, n) >= 1 else None

    def at_dtype(self, dtype: str) -> "Hardware":
        """This entry for a workload in `dtype`: float32 runs at `fp32_flops`, and the measured GEMM and published
        attention rates (bf16 figures) no longer apply; bf16 and float16 are the bf16 figures."""
        if dtype != "float32" or self.fp32_flops is None or self.profile is not None:
            return self
        sources = {**self.sources, "bf16_flops": f"float32: {self.sources.get('fp32_flops', '')}"}
        return replace(self, bf16_flops=self.fp32_flops, matmul_rates=None, attention_kernel="", sources=sources)

    def using(self, devices: int) -> "Hardware":
        """The same system using `devices` of its devices: any count up to a GPU node's (one GPU, or four of
        eight, behind the same switch); a TPU slice is used whole (another count is another slice, e.g. v6e-4)."""
        if devices == self.chips:
            return self
        if self.kind != "gpu" or not 1 <= devices < self.chips:
            return self  # the mesh check says what is wrong
        return replace(self, name=f"{self.name}:{devices}", chips=devices, topology=(devices,),
                       wraparound=(True,))


def _problems(hw: Hardware) -> list[str]:
    """Every broken invariant of `hw`, as sentences naming the field, its value and the constraint."""
    problems = [f"kind {hw.kind!r} is not one of {list(CHIP_KINDS)}"] if hw.kind not in CHIP_KINDS else []
    if hw.interconnect not in INTERCONNECTS:
        problems.append(f"interconnect {hw.interconnect!r} is not one of {list(INTERCONNECTS)}")
    for name in COUNT_FIELDS:
        if not _is_int(getattr(hw, name)) or getattr(hw, name) < 1:
            problems.append(f"{name} ({getattr(hw, name)!r}) must be a positive integer")
    if not hw.topology or not all(_is_int(n) and n >= 1 for n in hw.topology):
        problems.append(f"topology {list(hw.topology)} must be a non-empty list of positive integers")
    elif not _is_int(hw.slices) or hw.slices < 1:
        problems.append(f"slices ({hw.slices!r}) must be a positive integer")
    elif math.prod(hw.topology) * hw.slices != hw.chips:
        per = f" per slice over {hw.slices} slices" if hw.slices > 1 else ""
        problems.append(f"topology {list(hw.topology)} holds {math.prod(hw.topology)} chips{per}, not chips "
                        f"({hw.chips})")
    if len(hw.wraparound) != len(hw.topology) or not all(isinstance(w, bool) for w in hw.wraparound):
        problems.append(f"wraparound {list(hw.wraparound)} must be one true/false per topology axis")
    problems += _byte_problems(hw)
    for name in RATE_FIELDS + TIME_FIELDS + FRACTION_FIELDS:
        value = getattr(hw, name)
        low_ok = value >= 0 if name in TIME_FIELDS else value > 0
        if not isinstance(value, float) or not low_ok or (name in FRACTION_FIELDS and value > 1):
            bound = "in (0, 1]" if name in FRACTION_FIELDS else (">= 0" if name in TIME_FIELDS else "> 0")
            problems.append(f"{name} ({value!r}) must be a number {bound}")
    for name, low, high in (("usd_per_chip_hour", 0.0, 1e6), ("fp32_flops", 1.0, math.inf),
                            ("eager_dispatch_s", 0.0, 1.0), ("collective_matmul_flop_per_byte", 1.0, 1e9),
                            ("sm_count", 1.0, 1e5), ("async_all_to_all_hidden", 0.0, 1.0),
                            ("async_weight_gather_hidden", 0.0, 1.0), ("fused_softmax_keys", 1.0, 1e9),
                            ("recomputed_softmax_keys", 1.0, 1e9), ("mask_broadcast_keys", 1.0, 1e9)):
        value = getattr(hw, name)
        number = isinstance(value, (float, int)) and not isinstance(value, bool)
        if value is not None and (not number or not math.isfinite(value) or not low <= value <= high):
            problems.append(f"{name} ({value!r}) must be a number from {low:g} to {high:g}")
    if hw.async_weight_gathers not in ("", "by-default", "with-flag"):
        problems.append(f"async_weight_gathers ({hw.async_weight_gathers!r}) must be by-default, with-flag or none")
    if hw.async_weight_gather_hidden is not None and not hw.async_weight_gathers:
        problems.append(f"async_weight_gather_hidden ({hw.async_weight_gather_hidden!r}) is the share hidden of "
                        "gathers that run async, and async_weight_gathers is none: give async_weight_gathers "
                        "by-default or with-flag, or async_weight_gather_hidden none as well")
    fused, recomputed = hw.fused_softmax_keys, hw.recomputed_softmax_keys
    if isinstance(fused, (int, float)) and isinstance(recomputed, (int, float)) and recomputed < fused:
        problems.append(f"recomputed_softmax_keys ({recomputed!r}) must be at least fused_softmax_keys ({fused!r}): "
                        "the scores alone are held above it, fused or both below")
    broadcast = hw.mask_broadcast_keys
    if isinstance(broadcast, (int, float)) and isinstance(recomputed, (int, float)) and broadcast >= recomputed:
        problems.append(f"mask_broadcast_keys ({broadcast!r}) must be below recomputed_softmax_keys ({recomputed!r}): "
                        "the mask broadcast is held beside two score buffers, which end there")
    if hw.sm_count is not None and hw.sm_count != int(hw.sm_count):
        problems.append(f"sm_count ({hw.sm_count!r}) must be a whole number of SMs")
    missing = [name for name in FIGURES if not hw.sources.get(name)]
    missing += [name for name in OPTIONAL_FIGURES if figure_given(hw, name) and not hw.sources.get(name)]
    if missing:
        problems.append(f"figures without a source: {missing}")
    kernels = [k for k, _ in hw.attention_rates]
    if hw.attention_kernel and hw.attention_kernel not in kernels:
        problems.append(f"attention_kernel {hw.attention_kernel!r} has no published attention rates on this chip "
                        f"(it has: {', '.join(kernels) or 'none'})")
    for kernel, points in hw.attention_rates:
        if not points or any(n < 1 or r <= 0 for n, r in points) or [n for n, _ in points] != sorted(
                {n for n, _ in points}):
            problems.append(f"attention_rates of {kernel!r} must be (sequence length, FLOP/s) pairs, lengths "
                            "increasing, rates positive")
    if hw.matmul_rates is not None:
        problems += hw.matmul_rates.problems()
    return problems


def combine_limit(limits: tuple[tuple[int, int], ...], chips: int) -> int | None:
    """The most bytes a block phase's reduce-scatters over `chips` chips move together and still run as one op,
    from a chip's `reduce_scatter_combine_bytes` (None where it has none: combined whatever their size). A group
    size not listed takes the nearest listed one's (in ratio; a tie goes to the smaller group): not measured."""
    if not limits:
        return None
    return min(limits, key=lambda limit: (abs(math.log(limit[0] / chips)), limit[0]))[1]


def sm_fill(rows: int, queries: int, sms: int) -> float:
    """The fraction of `sms` SMs' tile-times an attention kernel of `rows` (batch x heads) rows of `queries`
    queries each fills with useful queries (`Hardware.attention_occupancy`)."""
    tiles = rows * -(-queries // ATTENTION_TILE_QUERIES)
    return rows * queries / ATTENTION_TILE_QUERIES / (sms * -(-tiles // sms))


def _byte_problems(hw: Hardware) -> list[str]:
    problems = [
        f"{name} ({getattr(hw, name)!r}) must be a whole number of bytes >= 0"
        for name in BYTE_FIELDS
        if not _is_int(getattr(hw, name)) or getattr(hw, name) < 0
    ]
    if problems:
        return problems
    if not 0 < hw.usable_hbm_bytes <= hw.hbm_bytes:
        problems.append(f"usable_hbm_bytes ({hw.usable_hbm_bytes}) must be in (0, hbm_bytes ({hw.hbm_bytes})]")
    if hw.runtime_reserve_bytes >= hw.usable_hbm_bytes:
        problems.append(
            f"runtime_reserve_bytes ({hw.runtime_reserve_bytes}) must be below usable_hbm_bytes "
            f"({hw.usable_hbm_bytes})"
        )
    return problems


def figure_given(hw: Hardware, name: str) -> bool:
    """Whether the optional figure `name` has a value on `hw` (a price of 0 is one)."""
    value = getattr(hw, name)
    return value is not None if name in OPTIONAL_NUMBERS else bool(value)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# ---- the catalog ----


def catalog() -> dict[str, Hardware]:
    """Every named system, in the catalog's order. Loaded once; a fresh dict on every call."""
    return dict(_load())


def load_hardware(name: str, overrides: dict[str, object] | None = None) -> Hardware:
    """The named system, with any figure replaced by `overrides` (recorded with source ``"override"``).

    Byte fields take human units (see `meshlab.core.hardware_figures.parse_bytes`); ``topology`` takes ``[2, 4]``
    or ``"2x4"``.
    Raises `InputError` for an unknown name or field, an ill-typed value, or overrides that contradict
    each other (e.g. ``chips`` without a matching ``topology``).
    """
    table = catalog()
    slices = _MULTISLICE.fullmatch(name)
    if slices and slices.group(1) in table and table[slices.group(1)].kind == "tpu" and int(slices.group(2)) >= 2:
        hardware = multislice(table[slices.group(1)], int(slices.group(2)))
        return with_overrides(hardware, overrides) if overrides else hardware
    base, _, part = name.partition(":")  # "h100:1": one GPU of an h100 node (what `Hardware.using` names)
    if base not in table or (part and not (part.isdigit() and table[base].kind == "gpu"
                                           and 1 <= int(part) <= table[base].chips)):
        if base in table and table[base].kind == "gpu":
            asks = f"asks for {part} of the {base} node's" if part.isdigit() else \
                f"names no count after ':' of the {base} node's"
            raise InputError(f"{name!r} {asks} {table[base].chips} GPUs",
                             f"name 1 to {table[base].chips} of them ({base}:1 ... {base}:{table[base].chips}), "
                             f"or {base} for the whole node")
        if base in table:
            raise InputError(f"{name!r}: a TPU system is named whole (its size is in its name)",
                             f"use one of: {', '.join(n for n, h in table.items() if h.kind == 'tpu')}")
        raise InputError(f"unknown hardware {name!r}", f"use one of: {', '.join(table)} (a GPU node's name takes "
                         ":N for N of its GPUs, e.g. h100:4; a TPU system's name takes xK for K slices)")
    hardware = table[base].using(int(part)) if part else table[base]
    return with_overrides(hardware, overrides) if overrides else hardware


_MULTISLICE = re.compile(r"(.+)x([0-9]+)")


def multislice(one: Hardware, slices: int) -> Hardware:
    """`slices` copies of the slice `one`, joined by DCN: every chip and host counted, one slice's topology."""
    if one.slices != 1:
        raise InputError(f"{one.name} is already {one.slices} slices", "name a single slice, e.g. v6e-8x2")
    sources = {**one.sources, "chips": f"{slices} slices of {one.name}: {one.sources['chips']}",
               "hosts": f"{slices} slices of {one.name}: {one.sources['hosts']}"}
    return replace(one, name=f"{one.name}x{slices}", chips=one.chips * slices, hosts=one.hosts * slices,
                   slices=slices, sources=sources)


def with_overrides(hardware: Hardware, overrides: dict[str, object]) -> Hardware:
    """`hardware` with figures replaced by `overrides` (each recorded with source ``"override"``)."""
    unknown = [key for key in overrides if key not in FIGURES + OPTIONAL_FIGURES]
    if unknown:
        raise InputError(
            f"unknown hardware field{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}",
            f"override one of: {', '.join(FIGURES + OPTIONAL_FIGURES)}",
        )
    changes = {key: _override(key, value) for key, value in overrides.items()}  # the first problem in file order
    sources = {**hardware.sources, **{key: "override" for key in changes}}
    overridden = tuple(dict.fromkeys(hardware.overridden + tuple(changes)))
    try:
        return replace(hardware, **changes, sources=sources, overridden=overridden)
    except ValueError as error:
        if "attention_kernel" in changes and "attention_kernel" in str(error):
            kernels = [k for k, _ in hardware.attention_rates]
            raise InputError(f"hardware override attention_kernel: {error}",
                             f"give one of {', '.join(kernels)}, or none" if kernels else "leave attention_kernel out"
                             ) from None
        if "usd_per_chip_hour" in changes and "usd_per_chip_hour" in str(error):
            raise InputError(f"hardware override usd_per_chip_hour: {changes['usd_per_chip_hour']!r} is not a price",
                             "give US dollars per chip-hour as a number from 0 to 1e6 (e.g. 1.2), or none") from None
        if "matmul_rates" in changes and "matmul_rates" in str(error):
            raise InputError(f"hardware override {str(error).partition(': ')[2]}",
                             "give positive FLOP/s for every point of an increasing m, n, k grid, or none") from None
        raise InputError(
            f"the overrides do not fit together: {error}",
            "override related figures together (chips with topology and wraparound; usable HBM within HBM)",
        ) from None


def _override(key: str, value: object) -> Any:
    """One override read as `HardwareFigures` reads the figure `key`; its problem is one line with the fix."""
    try:
        return getattr(HardwareFigures.model_validate({key: value}), key)
    except OverflowError:  # an integer past what a float holds (10**400), alone or inside a list
        raise InputError(f"hardware override {key}: {str(value)[:20]}... is too large a number",
                         f"give {key} a value of the same kind as the catalog's") from None
    except ValidationError as error:
        _, _, message = first_problem(error, {key: value})
        fix = BYTES_HELP if key in BYTE_FIELDS else f"give {key} a value of the same kind as the catalog's"
        raise InputError(f"hardware override {key}: {message}", fix) from None


@lru_cache(maxsize=1)
def _load() -> tuple[tuple[str, Hardware], ...]:
    text = (resources.files("meshlab") / "data" / "hardware.yaml").read_text(encoding="utf-8")
    # libyaml's parser when PyYAML has it: the pure-Python one takes ~0.4 s on this catalog
    data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    try:
        file = CatalogFile.model_validate(data)
    except ValidationError as error:
        raise InputError(f"meshlab/data/hardware.yaml: {problem_line(error, data, 'the catalog')}",
                         "fix the catalog's layout: accelerators, systems and multislice") from None
    systems = {name: _build(name, entry, file.accelerators) for name, entry in file.systems.items()}
    for name in file.multislice:
        base, slices = _MULTISLICE.fullmatch(name).groups()
        systems[name] = multislice(systems[base], int(slices))
    return tuple(systems.items())


def _build(name: str, system: dict[str, Any], accelerators: dict[str, Any]) -> Hardware:
    """Merge a system with its accelerator and read every figure; errors name the entry and field."""
    where = f"meshlab/data/hardware.yaml: systems.{name}"
    if system.get("accelerator") not in accelerators:
        raise InputError(f"{where}.accelerator: {system.get('accelerator')!r} is not an accelerator of the catalog",
                         f"use one of: {', '.join(accelerators)}")
    merged = {**accelerators[system["accelerator"]], **{k: v for k, v in system.items() if k != "accelerator"}}
    try:
        entry = CatalogEntry.model_validate(merged)
    except ValidationError as error:
        raise _catalog_problem(where, error, merged) from None
    given = {figure: getattr(entry, figure) for figure in entry.model_fields_set if figure not in LABELS}
    written = {figure: sourced.value for figure, sourced in given.items()}
    try:
        figures = HardwareFigures.model_validate(written)
    except ValidationError as error:
        raise _catalog_problem(where, error, written) from None
    values = {label: getattr(entry, label) for label in LABELS}
    values |= {figure: getattr(figures, figure) for figure in given}
    sources = {figure: sourced.source for figure, sourced in given.items()}
    try:
        return Hardware(name=name, sources=sources, **values)
    except ValueError as error:
        raise InputError(f"{where}: {error}", "fix the catalog entry") from None


def _catalog_problem(where: str, error: ValidationError, data: dict) -> InputError:
    """The first problem of a catalog entry as one line naming the entry and field."""
    path, kind, message = first_problem(error, data)
    inside = "".join(f".{part}" for part in path[:-1])
    if kind == "missing":
        return InputError(f"{where}{inside}: {path[-1]} is missing",
                          "give every figure once, as {value: ..., source: ...}")
    if kind == "extra_forbidden":
        fix = (f"give only the catalog's figures: {', '.join(HardwareFigures.model_fields)}" if len(path) == 1 else
               "a figure is {value: ..., source: ...} and nothing else")
        return InputError(f"{where}{inside}: unknown field {path[-1]}", fix)
    fix = "fix the catalog entry" if path and path[0] in LABELS else "write it as {value: ..., source: ...}"
    return InputError(f"{where}.{'.'.join(map(str, path))}: {message}", fix)
