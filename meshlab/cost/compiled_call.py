"""One transformer call as a TPU front end compiles it, priced by meshlab beside XLA:TPU's own schedule of it. Pure.

XLA:TPU's latency-hiding scheduler estimates the program it compiled (meshlab.check.tpu_schedule): its cost model,
not a measurement. `meshlab check --backend tpu` shows it beside meshlab's prediction of the same program, and at
full depth and the strategy's own size keeps it with the plan's measured compile (meshlab.plan.compile_times), so
that `meshlab explain` shows it too. The same program means the attention the front end compiled: torch_xla's
stock attention materialises its scores (torch's math attention, in float32), torchax's is XLA:TPU's online
softmax (flash), whatever the strategy's ``flash_attention`` says.
"""

from __future__ import annotations

from collections import Counter

from meshlab.strategy.schema import Strategy


def strategy_as_compiled(strategy: Strategy, front_end: str) -> Strategy:
    """The strategy with the attention the front end's program has (see the module); itself where it says so."""
    flash = front_end != "torch-xla"
    if strategy.workload.flash_attention == flash:
        return strategy
    return strategy.model_copy(update={"workload": strategy.workload.model_copy(update={"flash_attention": flash})})


def predicted_as_compiled(plan, strategy: Strategy, hardware, front_end: str | None):
    """meshlab's prediction of the program `front_end` compiled (the strategy's own where None): the strategy with
    that front end's attention (`strategy_as_compiled`)."""
    from meshlab.cost.predict import predict

    return predict(plan, strategy_as_compiled(strategy, front_end) if front_end else strategy, hardware)


def predicted_call(prediction) -> dict:
    """meshlab's seconds for one transformer call, term by term: the ops (each the longer of its FLOPs and its HBM
    bytes) and the collectives by kind, exposed (a collective matmul's permutes less what their matmul slices
    hide)."""
    step = prediction.step
    by_kind = Counter()
    for t in step.collectives:
        if not t.collective.per_step:
            by_kind[t.collective.kind] += t.collective.count * t.seconds
    local = step.local / step.calls
    return {"total_s": local + sum(by_kind.values()), "compute_s": local, "collective_s": sum(by_kind.values()),
            "collective_s_by_kind": dict(by_kind),
            "overlap": "a collective matmul's permutes show what outlasts their slice of the matmul; the other "
                       "collectives add to the ops' time"}


def schedule_beside(planned) -> dict | None:
    """XLA:TPU's schedule of this plan's program, kept by its measured compile, beside meshlab's prediction of that
    program (its front end's attention); None where no check kept one."""
    measured = planned.hardware.compile_measured
    if measured is None or measured.schedule is None:
        return None
    prediction = predicted_as_compiled(planned.plan, planned.strategy, planned.hardware, measured.front_end)
    flash = strategy_as_compiled(planned.strategy, measured.front_end).workload.flash_attention
    return {"front_end": measured.front_end, "measured_at": measured.measured_at,
            "attention": "flash" if flash else "stock, float32 scores",
            "attention_as_priced_above": flash == planned.strategy.workload.flash_attention,
            "xla": measured.schedule.model_dump(), "meshlab": predicted_call(prediction),
            "what": "XLA:TPU's latency-hiding scheduler's estimate of one call of the compiled program (its cost "
                    "model, not a measurement), beside meshlab's prediction of the same program"}
