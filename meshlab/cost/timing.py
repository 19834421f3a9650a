"""Predicted time per denoising step and per image: compute, HBM, collectives, overlap and host overhead.

Every figure here is a prediction. The model, op by op on the busiest chip (all chips do the same work):

- an op takes the longer of its FLOPs at ``bf16_flops x compute_efficiency`` and its HBM bytes at
  ``hbm_bandwidth x hbm_efficiency`` (a roofline per op, so memory-bound modulation Linears cost their weight
  reads, compute-bound matmuls their FLOPs); where the catalog has measured GEMM rates by shape or published
  attention rates for the chip, a Linear or an attention runs at those instead of compute_efficiency;
- collectives take the time `meshlab.cost.topology` gives them; a fraction ``overlap`` of it hides under
  compute (default 0: tensor-parallel all-reduces sit on the critical path between dependent matmuls); a
  collective matmul's permutes hide under their matmul slices, and on a TPU that runs them async (all-to-alls
  under a plan's flag, v5e's FSDP weight gathers by default), the share of their time XLA:TPU's schedule hides
  (``Assumptions.async_hidden``);
- a step runs ``calls`` transformer calls (2 with classifier-free guidance unless a ``cfg`` axis splits the
  branches), plus the once-per-step collectives, plus the hardware's ``step_overhead_s`` of host time;
- with a profile as hardware (meshlab.cost.profile), one call's seconds come from it instead of the rooflines;
- the text encoder, the VAE decode and host transfers are meshlab.cost.pipeline_time's terms.

The roofline beside each prediction: the same chip's FLOPs at 100% of peak, or its HBM bytes at 100% of the
bandwidth if that is longer; no collectives, no overhead. MFU: the model's useful FLOPs (unsharded, no
redundancy) over all chips' peak for the predicted time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from meshlab.cost.collectives import TRUTHS, WEIGHTS_PHASE, Collective, async_all_to_alls, known_differences
from meshlab.cost.flops import Work
from meshlab.cost.layout import Layout
from meshlab.cost.ring import ring_attentions
from meshlab.cost.topology import Route, collective_seconds, dcn_seconds
from meshlab.core.hardware import ATTENTION_RATES_SMS, ATTENTION_RATES_TILES, ATTENTION_TILE_QUERIES, Hardware
from meshlab.plan.memory import weight_gathers_async


@dataclass(frozen=True)
class Assumptions:
    """Knobs of the time model that are not properties of the hardware."""

    overlap: float = 0.0  # fraction of collective time hidden under compute
    #: (what, share): the collectives that run async on a TPU under the plan's libtpu flags ("all-to-all", or
    #: "weight all-gather": FSDP's, `async_class`), and the share of their time XLA:TPU's schedule hides under
    #: compute (the catalog's async_all_to_all_hidden and async_weight_gather_hidden; `async_hidden_of`)
    async_hidden: tuple[tuple[str, float], ...] = ()

    def describe(self, hardware: Hardware, model_class: str | None = None) -> list[dict]:
        """Each assumption with its source; with `model_class` (a card's diffusers class), the known differences
        from XLA measured on that class and those that hold for every class (meshlab.cost.collectives
        .known_differences), with a count of the rest."""
        hw = hardware
        truths = ("xla-tpu", "xla-cpu") if hw.kind == "tpu" else ("xla-cpu",)
        differences = " ".join(_held_against(truth, model_class, hw.kind == "tpu") for truth in truths)
        return [
            {"name": "compute_efficiency", "value": hw.compute_efficiency,
             "source": hw.sources["compute_efficiency"] + _compute_efficiency_scope(hw)},
            {"name": "hbm_efficiency", "value": hw.hbm_efficiency, "source": hw.sources["hbm_efficiency"]},
            {"name": "collective_latency_s", "value": hw.collective_latency_s,
             "source": hw.sources["collective_latency_s"]},
            {"name": "step_overhead_s", "value": hw.step_overhead_s, "source": hw.sources["step_overhead_s"]},
            *([{"name": "attention_kernel", "value": hw.attention_kernel,
                 "source": hw.sources.get("attention_kernel", "")},
               {"name": "attention_rates", "value": None,
                "source": f"attention on {hw.attention_kernel} at its published forward rate for the sequence length "
                          f"(head dim 128; other head dims at compute_efficiency): "
                          f"{hw.sources.get('attention_rates', '')}"},
               *([{"name": "sm_count", "value": hw.sm_count,
                   "source": f"{hw.sources.get('sm_count', '')}; an attention's tiles of {ATTENTION_TILE_QUERIES} "
                             "queries per sample and head fill the SMs in waves: its rate is the published one times "
                             "how full its waves run over how full the published setup's did "
                             f"({ATTENTION_RATES_TILES} tiles on {ATTENTION_RATES_SMS} SMs); one 1024x1024 image's "
                             "attention split 4 or 8 ways runs about 0.84 as fast"}]
                 if hw.sm_count is not None else [])] if hw.attention_kernel else []),
            *([{"name": "matmul_rates", "value": None,
                "source": "each Linear at the measured rate of a GEMM of its shard's shape (interpolated in log m, "
                          "n, k; below the grid its trend continues, above it the edge's rate holds): "
                          + hw.sources.get("matmul_rates", "")}]
              if hw.matmul_rates is not None else []),
            {"name": "overlap", "value": self.overlap,
             "source": "collectives do not overlap compute, but for the permutes of XLA:TPU's collective matmuls "
                       "and, on a TPU that runs them async, all-to-alls and FSDP's weight gathers. A permute runs "
                       "beside its 1/n slice of the matmul and shows only what outlasts it (XLA:TPU's schedule of "
                       "2d.yaml at full depth leaves 0.1 ms of them exposed per forward). On a TPU this is the "
                       "program's own: XLA:TPU's compiles of pairs, 2d, fsdp and hybrid at full depth on v6e-8 "
                       "(libtpu's default flags) run every all-reduce, all-gather and all-to-all of a middle block "
                       "synchronously (0 of them async: pairs' all-reduces, fsdp's 8 weight gathers, hybrid's 7 "
                       "Ulysses all-to-alls), and only the collective matmuls' permutes asynchronously "
                       "(benchmarks/results/tpu_aot.txt). An async collective shows the share of its time XLA:TPU's "
                       "schedule leaves exposed, from two full-depth compiles of one plan, with it async and without "
                       "(python benchmarks/tpu_async_overlap.py; one slice's: what crosses slices over DCN stays "
                       "whole): a plan that sets --xla_tpu_enable_async_all_to_all=true hides the catalog's "
                       "async_all_to_all_hidden of each all-to-all (hybrid.yaml's rules on v6e-8, and on v5p's "
                       "and v4's 4 chips), and a chip that runs FSDP's "
                       "weight gathers async with libtpu's defaults hides its async_weight_gather_hidden of each, "
                       "unless the plan sets --xla_enable_async_all_gather=false (v5e: 6 of fsdp.yaml's 8 a block "
                       "async; MaxText's all-gather collective fusion changes nothing there, and is refused off "
                       "v5e); on v4 --xla_enable_async_all_gather=true runs them async (its share not measured: "
                       "priced synchronous, as two blocks' gathered weights held). No other flag is priced: on v6e "
                       "--xla_enable_async_all_gather and _all_reduce leave fsdp's gathers and pairs' all-reduces "
                       "synchronous (benchmarks/results/tpu_async_flags.txt). "
                       "On a GPU an assumption: each all-reduce or all-gather feeds the next op"},
            {"name": "per-op roofline", "value": None,
             "source": "each op takes max(FLOPs / effective peak, bytes / effective HBM bandwidth); elementwise "
                       "work runs as one fused pass per gap between matmuls (compile: {elementwise: fused}, the "
                       "default; fusing into the matmuls moves less) or every op as its own kernel (eager), at the "
                       "bytes the card traced for that; eager, the host dispatches every op the card traced at the "
                       "hardware's eager_dispatch_s, and a step takes the longer of its kernels and its launches"},
            {"name": "device order", "value": None,
             "source": "each mesh position sits on the chip xs.HybridMesh gives it in its slice (meshlab.cost."
                       "device_layout, held against torch_xla's layout over libtpu's device coordinates); open lines "
                       "move W each way, rings 2W"},
            {"name": "scope", "value": None,
             "source": "end to end: text encoding, denoising, VAE decode, host transfers and per-step overhead "
                       "(meshlab.cost.pipeline_time); the scheduler's elementwise step is not counted"},
            {"name": "collectives vs XLA", "value": None, "source": differences},
            {"name": "guidance", "value": None,
             "source": "with CFG and no 'cfg' mesh axis the transformer runs twice per step; a 'cfg' axis of size 2 "
                       "runs both branches as one call split over it (prompts padded to one length)"},
        ]


def async_hidden_of(strategy, hardware: Hardware) -> tuple[tuple[str, float], ...]:
    """The collectives that run async on `hardware` under a plan, each with the share of its time XLA:TPU's
    schedule hides (`Assumptions.async_hidden`): the all-to-alls where its libtpu flags turn them on, and FSDP's
    weight gathers in its blocks where the chip runs them async (meshlab.plan.memory.weight_gathers_async), each
    where the chip's catalog entry gives the share; nothing on a GPU."""
    if hardware.kind != "tpu":
        return ()
    hidden = []
    if hardware.async_all_to_all_hidden is not None and async_all_to_alls(strategy.compile.libtpu_flags):
        hidden.append(("all-to-all", hardware.async_all_to_all_hidden))
    if weight_gathers_async(strategy, hardware) and hardware.async_weight_gather_hidden is not None:
        hidden.append(("weight all-gather", hardware.async_weight_gather_hidden))
    return tuple(hidden)


def async_class(c: Collective) -> str:
    """What `Assumptions.async_hidden` calls a collective: "all-to-all", "weight all-gather" (the gather of a block's
    weight split over an axis that splits activations too: FSDP's; one outside the blocks runs before any compute
    it could hide under), or "" (neither)."""
    if c.kind == "all-to-all":
        return "all-to-all"
    weights = c.kind == "all-gather" and c.phase.endswith(WEIGHTS_PHASE) and c.block is not None
    return "weight all-gather" if weights else ""


def _held_against(truth: str, model_class: str | None, on_tpu: bool) -> str:
    """The known differences held against one program (`TRUTHS`): every entry, or with `model_class` those of its
    class and the general ones, with a count of the rest. On a TPU, XLA:TPU's program wins where the two differ."""
    said = f"Held against {TRUTHS[truth]}" + (
        ", which a TPU runs and which wins where the two differ (benchmarks/results/tpu_matrix_256.txt: the "
        "matrix's other plans agree, collective-permutes not held)" if truth == "xla-tpu" else
        ", whose collectives XLA:TPU's passes then rewrite (its collective-permutes are held here only)" if on_tpu
        else "") + ": "
    if model_class is None:
        return said + ("; ".join(known_differences(truth=truth)) or "none") + "."
    own = known_differences(model_class, general=False, truth=truth)
    general = tuple(d for d in known_differences(model_class, truth=truth) if d not in own)
    others = len(known_differences(truth=truth)) - len(own) - len(general)
    return said + "; ".join((own or (f"none measured on {model_class}",)) + general) + (
        f" ({others} more, measured on other model classes: meshlab/data/known_differences.yaml)" if others
        else "") + "."


def _compute_efficiency_scope(hw: Hardware) -> str:
    priced = [{"linear": "Linears", "attention": "attention"}[kind] for kind in hw.rated_ops]
    return f" (here: every op but {' and '.join(priced)}, which run at the rates below)" if priced else ""


@dataclass(frozen=True)
class TimedCollective:
    collective: Collective
    route: Route
    seconds: float  # exposed: what compute does not hide
    dcn_seconds: float = 0.0  # the part of `seconds` spent crossing slices
    hidden: float = 0.0  # the seconds compute hides: a collective matmul's permute's slice, or an async share
    #: what hides it: "matmul" (a collective matmul's slice) or "async" (XLA:TPU's schedule of an async collective)
    hidden_by: str = ""


@dataclass(frozen=True)
class StepTime:
    """Per step on one chip, predicted (seconds unless named otherwise)."""

    calls: int
    flops: float  # this chip's FLOPs per step
    hbm_bytes: float
    compute: float  # each op's FLOPs at its rate (`op_compute_seconds`), summed over ops
    hbm: float  # bytes at the effective bandwidth, summed over ops
    local: float  # per-op max of compute and HBM, summed
    collective: float  # after overlap
    collective_bytes: float  # per chip per step
    overhead: float
    roofline: float  # 100% peak or 100% HBM bandwidth, no collectives, no overhead
    collectives: tuple[TimedCollective, ...] = field(default=())
    dcn: float = 0.0  # the part of `collective` spent crossing slices (DCN)
    elementwise_bytes: float = 0.0  # the part of `hbm_bytes` in elementwise passes
    elementwise: float | None = None  # the part of `local` they take (None: inside a call a profile timed whole)
    #: eager PyTorch: the host dispatches the ops one by one and the GPU runs them as they come, so a step takes
    #: the longer of the two: how long the chip waits on the host beyond its own work (small images, many chips
    #: splitting the tokens); 0 without the hardware's `eager_dispatch_s` or where a profile timed the call whole
    launch_wait: float = 0.0
    dispatches: int = 0  # ops the host dispatches per step (0 where the hardware has no `eager_dispatch_s`)
    launch_floor: float = 0.0  # the host's predicted time to dispatch them
    #: attentions run as a ring (meshlab.cost.ring), one call's each; their passes and merges are in `local`, the
    #: transfers their passes do not hide in `collective`
    rings: tuple = ()

    @property
    def total(self) -> float:
        return self.local + self.collective + self.launch_wait + self.overhead


def op_seconds(w: Work, hardware: Hardware) -> float:
    """One op on one chip from the catalog: the longer of its FLOPs and its HBM bytes."""
    return max(op_compute_seconds(w, hardware), w.hbm_bytes / (hardware.hbm_bandwidth * hardware.hbm_efficiency))


def op_compute_seconds(w: Work, hardware: Hardware) -> float:
    """An op's FLOPs at its rate: a Linear at the measured GEMM rate for its shard's shape and an attention at
    its kernel's published rate for its sequence length, scaled by how full its tiles keep the GPU's SMs
    (`Hardware.attention_occupancy`), where the catalog has them (`Hardware.matmul_rate`,
    `Hardware.attention_rate`); everything else at the assumed ``compute_efficiency`` of the peak: a linear
    attention (float32, diffusers' SanaLinearAttnProcessor2_0) of the float32 peak where the catalog gives one."""
    rate = op_rate(w, hardware)
    if rate is None:
        fp32 = w.kind == "linear-attention" and hardware.fp32_flops
        rate = (hardware.fp32_flops if fp32 else hardware.bf16_flops) * hardware.compute_efficiency
    return w.flops / rate


def op_rate(w: Work, hardware: Hardware) -> float | None:
    """The published or measured FLOP/s the catalog gives this op, None where compute_efficiency prices it."""
    if w.kind == "attention" and len(w.shape) == 5:
        rate = hardware.attention_rate(w.shape[3], w.shape[4])
        return None if rate is None else rate * hardware.attention_occupancy(*w.kernel_rows)
    if w.kind == "linear" and len(w.shape) == 3:
        return hardware.matmul_rate(*w.shape)
    return None


@dataclass(frozen=True)
class CatalogPricing:
    """What a catalog prediction's ops rest on: how many Linears ran at measured GEMM rates (and how far beyond
    the measured grid the farthest lies) and how many attentions at published rates; the rest is assumed."""

    linears_measured: int
    #: how far below and above the measured grid the farthest Linear whose time its rate sets lies (1: within)
    linears_below: float
    linears_above: float
    attention_published: int
    assumed: int  # ops at compute_efficiency / hbm_efficiency alone

    @staticmethod
    def of(work: tuple[Work, ...], hardware: Hardware) -> "CatalogPricing":
        rated = [w for w in work if op_rate(w, hardware) is not None]
        linears = [w for w in rated if w.kind == "linear"]
        bandwidth = hardware.hbm_bandwidth * hardware.hbm_efficiency
        stretches = [hardware.matmul_rates.stretch(*w.shape) for w in linears
                     if op_compute_seconds(w, hardware) >= w.hbm_bytes / bandwidth]
        return CatalogPricing(sum(w.count for w in linears), max((b for b, _ in stretches), default=1.0),
                              max((a for _, a in stretches), default=1.0),
                              sum(w.count for w in rated if w.kind == "attention"),
                              sum(w.count for w in work) - sum(w.count for w in rated))


def step_time(work: tuple[Work, ...], collectives: tuple[Collective, ...], routes: dict, layout: Layout,
              hardware: Hardware, assumptions: Assumptions, measured=None, collective_price=None) -> StepTime:
    """`measured` (a meshlab.cost.profile.MeasuredCall): one call's seconds from a profile, in place of the ops'
    rooflines; when it timed the call whole on several devices its collectives are in it and add nothing.
    `collective_price(c)`: a collective's measured seconds, None where the topology model prices it.
    A strategy that runs its attention as a ring (meshlab.cost.ring) prices it as one, where the catalog prices
    the call (a profile timed the attention it ran)."""
    bandwidth = hardware.hbm_bandwidth * hardware.hbm_efficiency
    calls = layout.calls
    rings = () if measured is not None else ring_attentions(work, layout, routes.get(layout.ring_axes), hardware,
                                                            lambda w: op_seconds(w, hardware))
    ringed = {r.module: r for r in rings}
    local = measured.seconds if measured is not None else sum(
        w.count * (ringed[w.name].compute_seconds if w.name in ringed else op_seconds(w, hardware)) for w in work)
    exposed = calls * sum(r.count * r.exposed_transfer for r in rings)
    inside = measured is not None and measured.collectives_included
    flops = sum(w.count * w.flops for w in work)
    nbytes = sum(w.count * w.hbm_bytes for w in work)

    def seconds(c: Collective) -> float:
        found = collective_price(c) if collective_price is not None else None
        if found is not None:
            return found
        alone = collective_seconds(c.kind, c.bytes, routes[c.axes], hardware.collective_latency_s)
        return alone / 2 if c.both_ways and routes[c.axes].shape in ("ring", "grid") else alone

    async_share = dict(assumptions.async_hidden)

    def timed_collective(c: Collective) -> TimedCollective:
        alone, dcn_part = seconds(c), dcn_seconds(c.kind, c.bytes, routes[c.axes])
        if c.beside_flops:  # a collective matmul's permute runs beside its slice of the matmul: what outlasts it shows
            hidden = min(alone, c.beside_flops / (hardware.bf16_flops * hardware.compute_efficiency))
            return TimedCollective(c, routes[c.axes], alone - hidden,
                                   dcn_part * (1 - hidden / alone) if alone else 0.0, hidden, "matmul")
        share = async_share.get(async_class(c))
        if share is not None:  # an async collective: the share XLA:TPU's schedule of one slice hides of it, what
            hidden = share * max(0.0, alone - dcn_part)  # crosses slices left whole
            return TimedCollective(c, routes[c.axes], alone - hidden, dcn_part, hidden, "async")
        return TimedCollective(c, routes[c.axes], alone, dcn_part)

    timed = tuple(timed_collective(c) for c in collectives)
    dcn = sum(t.collective.count * t.dcn_seconds * (1 if t.collective.per_step else calls) for t in timed)
    per_call = sum(t.collective.count * t.seconds for t in timed if not t.collective.per_step)
    per_step = sum(t.collective.count * t.seconds for t in timed if t.collective.per_step)
    coll_bytes = sum(c.count * c.bytes * (1 if c.per_step else calls) for c in collectives) + calls * sum(
        r.count * r.transferred_bytes for r in rings)
    roofline = calls * max(flops / hardware.bf16_flops, nbytes / hardware.hbm_bandwidth)
    elementwise = [w for w in work if w.kind == "elementwise"]
    collective = 0.0 if inside else (1 - assumptions.overlap) * (calls * per_call + per_step) + exposed
    dispatches = 0  # each collective the host issues is one more dispatch
    if layout.dispatches and hardware.eager_dispatch_s is not None:
        dispatches = (sum(c.count * (1 if c.per_step else calls) for c in collectives) + calls * layout.dispatches
                      + calls * sum(r.count * r.dispatches for r in rings))
    # a call a profile timed whole already waited on its launches; one priced op by op (kernel times) did not
    timed_whole = measured is not None and measured.basis == "blocks"
    floor = 0.0 if timed_whole or not dispatches else dispatches * hardware.eager_dispatch_s
    waited = max(0.0, floor - (calls * local + collective))
    return StepTime(
        calls=calls, flops=calls * flops, hbm_bytes=calls * nbytes,
        compute=calls * sum(w.count * op_compute_seconds(w, hardware) for w in work), hbm=calls * nbytes / bandwidth,
        local=calls * local,
        collective=collective, collective_bytes=coll_bytes, overhead=hardware.step_overhead_s, roofline=roofline,
        collectives=timed,
        dcn=0.0 if inside else (1 - assumptions.overlap) * dcn,
        elementwise_bytes=calls * sum(w.count * w.hbm_bytes for w in elementwise),
        elementwise=None if measured is not None else calls * sum(w.count * op_seconds(w, hardware)
                                                                  for w in elementwise),
        launch_wait=waited, dispatches=dispatches, launch_floor=floor, rings=rings,
    )
