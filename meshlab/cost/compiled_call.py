"""One transformer call as a TPU front end compiles it, priced by meshlab beside XLA:TPU's own schedule of it. Pure.

XLA:TPU's latency-hiding scheduler estimates the program it compiled (meshlab.check.tpu_schedule): its cost model,
not a measurement. `meshlab check --backend tpu` shows it beside meshlab's prediction of the same program, and at
full depth and the strategy's own size keeps it with the plan's measured compile (meshlab.plan.compile_times), so
that `meshlab explain` shows it too. The same program means the attention the front end compiled: torch_xla's
stock attention materialises its scores (torch's math attention, in float32), whatever the strategy's
``flash_attention`` says; torchax's is what the strategy says: a flash kernel (jax's Pallas TPU flash attention, as a
TPU user runs one: meshlab.workers.check_tpu.flash_sdpa), or without one torch's reference math, priced as torch's
math attention (XLA:TPU writes its scores in bf16, not float32, and libtpu rewrites the softmax and the second
product into one online-softmax kernel that reads them back; torch_xla's head gathers at two samples a chip,
meshlab.plan.axes.heads_gathered, may not happen in torchax's 4-D products; not modelled or measured). XLA:TPU's
schedule times a Pallas kernel by the cost estimate the kernel declares (its FLOPs at the MXU's peak): no model of
its rate (`_kernels`).
"""

from __future__ import annotations

from collections import Counter

from meshlab.cost.collectives import COLLECTIVE_KINDS
from meshlab.strategy.schema import Strategy


#: What the ops of a compiled program's timeline are, in the terms meshlab prices them (XLA:TPU's schedule's ops are
#: told apart by meshlab.check.tpu_schedule.op_class)
MATMULS = "matmuls"  # an op that holds a convolution or dot outside the attention: the Linears (and convolutions)
ATTENTION = "attention"  # an op of the attention call: its products, softmax, mask (SDPA, as the front end lowers it)
ELEMENTWISE = "elementwise and reductions"  # the other fusions: norms, modulation, activations, residual adds
COPIES = "copies"  # a layout change or a copy between memories
OTHER = "other ops"
IDLE = "idle"  # the timeline's cycles no op holds: waiting on an async collective's data
UNPRICED_OPS = (COPIES, OTHER, IDLE)  # no op of meshlab's is one of these
OP_CLASSES = (MATMULS, ATTENTION, ELEMENTWISE, *UNPRICED_OPS)
#: meshlab's ops (meshlab.cost.flops.Work.kind) by the class that runs them
OP_TERMS = {"linear": MATMULS, "conv": MATMULS, "attention": ATTENTION, "linear-attention": ATTENTION,
            "elementwise": ELEMENTWISE, "other": ELEMENTWISE}


def strategy_as_compiled(strategy: Strategy, front_end: str) -> Strategy:
    """The strategy with the attention the front end's program has (see the module): torch_xla's stock attention,
    never a flash kernel; torchax's, the strategy's own."""
    if front_end != "torch-xla" or not strategy.workload.flash_attention:
        return strategy
    return strategy.model_copy(update={"workload": strategy.workload.model_copy(update={"flash_attention": False})})


def predicted_as_compiled(plan, strategy: Strategy, hardware, front_end: str | None):
    """meshlab's prediction of the program `front_end` compiled (the strategy's own where None): the strategy with
    that front end's attention (`strategy_as_compiled`)."""
    from meshlab.cost.predict import predict

    return predict(plan, strategy_as_compiled(strategy, front_end) if front_end else strategy, hardware)


def predicted_call(prediction, hardware) -> dict:
    """meshlab's seconds for one transformer call, term by term: the ops (each the longer of its FLOPs and its HBM
    bytes), also by the class of XLA:TPU's ops that runs them (`OP_TERMS`), and the collectives by kind, exposed (a
    collective matmul's permutes less what their matmul slices hide, an async collective less its hidden share)."""
    from meshlab.cost.timing import op_compute_seconds, op_seconds

    step = prediction.step
    by_kind = Counter()
    for t in step.collectives:
        if not t.collective.per_step:
            by_kind[t.collective.kind] += t.collective.count * t.seconds
    local = step.local / step.calls
    by_op, flops, nbytes, flop_s = Counter(), Counter(), Counter(), Counter()
    if prediction.measured is None:  # a profile times a call whole, not op by op
        ringed = {r.module: r for r in step.rings}  # an attention run as a ring: its passes and merges
        for w in prediction.work:
            term = OP_TERMS[w.kind]
            by_op[term] += w.count * (ringed[w.name].compute_seconds if w.name in ringed else op_seconds(w, hardware))
            flops[term] += w.count * w.flops
            nbytes[term] += w.count * w.hbm_bytes
            flop_s[term] += w.count * op_compute_seconds(w, hardware)
    bandwidth = hardware.hbm_bandwidth * hardware.hbm_efficiency
    return {"total_s": local + sum(by_kind.values()), "compute_s": local, "collective_s": sum(by_kind.values()),
            "collective_s_by_kind": dict(by_kind), "compute_s_by_op": dict(by_op), "flops_by_op": dict(flops),
            "hbm_bytes_by_op": dict(nbytes),
            "bound_by_op": {t: "FLOPs" if flop_s[t] >= nbytes[t] / bandwidth else "HBM" for t in by_op},
            "overlap": "a collective matmul's permutes show what outlasts their slice of the matmul, an async "
                       "collective (all-to-alls under the plan's flag, v5e's FSDP weight gathers) the share XLA:TPU's "
                       "schedule leaves of it; the other collectives add to the ops' time"}


def schedule_rows(ours: dict, theirs: dict) -> list[tuple[str, float | None, float, str]]:
    """One call term by term, meshlab's seconds (None: a term it does not price) beside XLA:TPU's schedule's, and
    for a class of ops the rate each implies for meshlab's count of its work: the ops, then each class of them where
    XLA:TPU's schedule split them (a schedule kept before it did has only the whole; a term under a microsecond in
    both is left out, and one meshlab does not price under 0.05% of XLA:TPU's ops), the collectives by kind
    (`ours`: `predicted_call`; `theirs`: a schedule's JSON)."""
    theirs = waits_as_collectives(theirs)
    rows: list[tuple[str, float | None, float, str]] = [("ops", ours["compute_s"], theirs["compute_s"], "")]
    split, mine = theirs.get("compute_s_by_op") or {}, ours.get("compute_s_by_op") or {}
    if split and mine:
        rows += [(f"  {term}", None if term in UNPRICED_OPS else mine.get(term, 0.0), split.get(term, 0.0),
                  _implied(ours, term, mine.get(term, 0.0), split.get(term, 0.0)) + _kernels(theirs, term))
                 for term in OP_CLASSES if max(split.get(term, 0.0), mine.get(term, 0.0)) >= 1e-6
                 and (term not in UNPRICED_OPS or split.get(term, 0.0) >= 5e-4 * theirs["compute_s"])]
    both = set(ours["collective_s_by_kind"]) | set(theirs["collective_s_by_kind"])
    order = lambda k: COLLECTIVE_KINDS.index(k) if k in COLLECTIVE_KINDS else len(COLLECTIVE_KINDS)
    rows += [(f"{kind}, exposed", ours["collective_s_by_kind"].get(kind, 0.0),
              theirs["collective_s_by_kind"].get(kind, 0.0), "") for kind in sorted(both, key=order)]
    return rows + [("one call", ours["total_s"], theirs["total_s"], "")]


def waits_as_collectives(schedule: dict) -> dict:
    """A schedule's JSON with the cycles it waits on each async collective kind (its statistics' wasted cycles, by
    kind) moved from the idle ops onto that kind's exposed time, as meshlab counts a collective's exposed time (no
    more than the idle ops hold, shared among the kinds as they waited); as it was where it kept no waits."""
    waits = {kind: (schedule.get("wasted_s") or {}).get(kind.replace("-", "_"), 0.0) for kind in COLLECTIVE_KINDS}
    waited = sum(waits.values())
    by_op = dict(schedule.get("compute_s_by_op") or {})
    idle = by_op.get(IDLE, 0.0) if by_op else waited  # a schedule kept whole: its waits are in its ops
    moved = min(waited, idle)  # the statistics count the entry computation's waits, the idle ops a loop's too
    if not moved:
        return schedule
    if by_op:
        by_op[IDLE] = idle - moved
    kinds = dict(schedule["collective_s_by_kind"])
    for kind, seconds in waits.items():
        if seconds:
            kinds[kind] = kinds.get(kind, 0.0) + seconds * moved / waited
    return {**schedule, "compute_s": schedule["compute_s"] - moved, "collective_s": schedule["collective_s"] + moved,
            "collective_s_by_kind": kinds, **({"compute_s_by_op": by_op} if by_op else {})}


def _kernels(theirs: dict, term: str) -> str:
    """A note where Pallas kernels hold most of a class's time in XLA:TPU's schedule: it times them by the cost
    estimate each declares (a flash attention's FLOPs at the MXU's peak), so there it is no model of their rate."""
    held = (theirs.get("kernel_s_by_op") or {}).get(term, 0.0)
    whole = (theirs.get("compute_s_by_op") or {}).get(term, 0.0)
    return " (XLA:TPU's: Pallas kernels' own estimates)" if whole and held >= 0.5 * whole else ""


def _implied(ours: dict, term: str, mine: float, xla: float) -> str:
    """The rate meshlab's time for a class of ops and XLA:TPU's each imply for meshlab's count of its work: FLOP/s
    where its FLOPs set more of meshlab's time, else HBM bandwidth."""
    bound = (ours.get("bound_by_op") or {}).get(term)
    work = (ours.get("flops_by_op" if bound == "FLOPs" else "hbm_bytes_by_op") or {}).get(term, 0.0)
    if not bound or not work or not mine or not xla:
        return ""
    if bound == "FLOPs":
        return f"{work / 1e12:.2f} TFLOP at {work / mine / 1e12:.0f} vs {work / xla / 1e12:.0f} TFLOP/s"
    return f"{work / 1e9:.2f} GB at {work / mine / 1e12:.2f} vs {work / xla / 1e12:.2f} TB/s"


def schedule_beside(planned) -> dict | None:
    """XLA:TPU's schedule of this plan's program, kept by its measured compile, beside meshlab's prediction of that
    program (its front end's attention); None where no check kept one."""
    measured = planned.hardware.compile_measured
    if measured is None or measured.schedule is None:
        return None
    prediction = predicted_as_compiled(planned.plan, planned.strategy, planned.hardware, measured.front_end)
    flash = strategy_as_compiled(planned.strategy, measured.front_end).workload.flash_attention
    return {"front_end": measured.front_end, "measured_at": measured.measured_at,
            "attention": "flash" if flash else "stock, scores written",
            "attention_as_priced_above": flash == planned.strategy.workload.flash_attention,
            "xla": measured.schedule.model_dump(exclude_none=True),
            "meshlab": predicted_call(prediction, planned.hardware),
            "what": "XLA:TPU's latency-hiding scheduler's estimate of one call of the compiled program (its cost "
                    "model, not a measurement), beside meshlab's prediction of the same program"}
