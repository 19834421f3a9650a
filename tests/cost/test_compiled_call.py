"""meshlab's call, term by term, in the classes of XLA:TPU's schedule (meshlab.cost.compiled_call)."""

import pytest

from meshlab.cost.compiled_call import predicted_as_compiled, predicted_call, schedule_rows
from meshlab.cost.timing import op_seconds
from meshlab.plan.planned import plan_file
from tests.conftest import REPO


@pytest.fixture(scope="module")
def planned():
    return plan_file(REPO / "strategies" / "2d.yaml")


@pytest.mark.parametrize("front_end, attention_bound", [("torch-xla", "HBM"), ("torchax", "FLOPs")])
def test_the_call_s_ops_split_into_matmuls_attention_and_elementwise(planned, front_end, attention_bound):
    """The classes sum to the call's ops; the matmuls are the Linears' seconds; torch_xla's math attention is its
    float32 scores' bytes, torchax's flash kernel its FLOPs (the strategy's own attention)."""
    prediction = predicted_as_compiled(planned.plan, planned.strategy, planned.hardware, front_end)
    call = predicted_call(prediction, planned.hardware)
    by_op = call["compute_s_by_op"]
    assert set(by_op) == {"matmuls", "attention", "elementwise and reductions"}
    assert sum(by_op.values()) == pytest.approx(call["compute_s"], rel=1e-12)
    linears = [w for w in prediction.work if w.kind == "linear"]
    assert by_op["matmuls"] == pytest.approx(sum(w.count * op_seconds(w, planned.hardware) for w in linears))
    assert call["flops_by_op"]["matmuls"] == pytest.approx(sum(w.count * w.flops for w in linears))
    assert call["bound_by_op"]["attention"] == attention_bound and call["bound_by_op"]["matmuls"] == "FLOPs"
    attentions = [w for w in prediction.work if w.kind == "attention"]
    assert by_op["attention"] == pytest.approx(sum(w.count * op_seconds(w, planned.hardware) for w in attentions))


def test_a_ring_s_passes_and_merges_are_its_attention_s_seconds():
    """flux-usp-h100.yaml runs its attention as a ring (meshlab.cost.ring): the attention class holds the ring's
    passes and merges, not the one attention it stands for, and the classes still sum to the call's ops."""
    usp = plan_file(REPO / "strategies" / "flux-usp-h100.yaml")
    prediction = predicted_as_compiled(usp.plan, usp.strategy, usp.hardware, None)
    call = predicted_call(prediction, usp.hardware)
    rings = prediction.step.rings
    assert rings and sum(call["compute_s_by_op"].values()) == pytest.approx(call["compute_s"], rel=1e-12)
    ringed = {r.module for r in rings}
    one_pass = sum(w.count * op_seconds(w, usp.hardware) for w in prediction.work if w.name in ringed)
    assert call["compute_s_by_op"]["attention"] == pytest.approx(sum(r.count * r.compute_seconds for r in rings)
                                                                 + sum(w.count * op_seconds(w, usp.hardware)
                                                                       for w in prediction.work
                                                                       if w.kind == "attention"
                                                                       and w.name not in ringed))
    assert call["compute_s_by_op"]["attention"] != pytest.approx(one_pass)


def test_rows_hold_each_class_beside_xla_tpu_s_with_the_rates_each_implies(planned):
    call = predicted_call(predicted_as_compiled(planned.plan, planned.strategy, planned.hardware, "torch-xla"),
                          planned.hardware)
    mine = call["compute_s_by_op"]
    xla = {"total_s": 1.0, "compute_s": 0.9, "collective_s": 0.1, "collective_s_by_kind": {"all-gather": 0.1},
           "compute_s_by_op": {"matmuls": 2 * mine["matmuls"], "attention": 0.3, "idle": 0.01,
                               "elementwise and reductions": 0.2, "copies": 1e-9}}
    rows = {term.strip(): (ours, theirs, implied) for term, ours, theirs, implied in schedule_rows(call, xla)}
    assert list(rows)[:5] == ["ops", "matmuls", "attention", "elementwise and reductions", "idle"]  # copies: < 1 us
    assert rows["idle"][0] is None  # meshlab prices no idle time
    tflop = call["flops_by_op"]["matmuls"] / 1e12
    assert rows["matmuls"][2] == (f"{tflop:.2f} TFLOP at {tflop / mine['matmuls']:.0f} vs "
                                  f"{tflop / (2 * mine['matmuls']):.0f} TFLOP/s")
    assert rows["attention"][2].endswith("TB/s")  # float32 scores: bytes
    assert rows["one call"][:2] == (call["total_s"], 1.0) and rows["all-gather, exposed"][1] == 0.1
    # a schedule kept before XLA:TPU's ops were split has only their whole
    whole = {k: v for k, v in xla.items() if k != "compute_s_by_op"}
    terms = [term for term, *_ in schedule_rows(call, whole)]
    assert terms[0] == "ops" and terms[-1] == "one call" and not [t for t in terms if t.startswith(" ")]
    # where Pallas kernels hold most of a class, XLA:TPU's time for it is their own estimate, and the row says so
    for held, noted in ((0.2, True), (0.1, False)):
        rows = {term.strip(): implied for term, _, _, implied in schedule_rows(call, {**xla, "kernel_s_by_op": {
            "attention": held}})}
        assert rows["attention"].endswith("(XLA:TPU's: Pallas kernels' own estimates)") == noted
        assert not rows["matmuls"].endswith("estimates)")


def test_xla_tpu_s_waits_on_an_async_kind_are_that_kind_s_exposed_time(planned):
    """XLA:TPU's schedule counts an async collective's exposed time as cycles wasted waiting on it (the timeline's
    idle ops), not as the kind's own ops: the rows move them onto the kind, as meshlab counts it, and the call's
    total stays the schedule's (hybrid.yaml with async all-to-alls at full depth: 12.416 ms waited)."""
    call = predicted_call(predicted_as_compiled(planned.plan, planned.strategy, planned.hardware, "torch-xla"),
                          planned.hardware)
    xla = {"total_s": 0.2808, "compute_s": 0.2646, "collective_s": 0.0162,
           "collective_s_by_kind": {"all-reduce": 0.0162, "all-to-all": 2.4e-7},
           "wasted_s": {"all_to_all": 0.012416, "collective_permute": 0.000505, "total": 0.012921},
           "compute_s_by_op": {"matmuls": 0.0804, "attention": 0.1449, "elementwise and reductions": 0.0263,
                               "idle": 0.012921}}
    rows = {term.strip(): theirs for term, _, theirs, _ in schedule_rows(call, xla)}
    assert rows["all-to-all, exposed"] == pytest.approx(0.012416 + 2.4e-7)
    assert rows["collective-permute, exposed"] == pytest.approx(0.000505)
    assert rows["ops"] == pytest.approx(0.2646 - 0.012921) and "idle" not in rows  # nothing left idle
    assert rows["one call"] == 0.2808
    kept = {k: v for k, v in xla.items() if k != "wasted_s"}  # kept before the waits were: as the schedule has it
    assert {term.strip(): theirs for term, _, theirs, _ in schedule_rows(call, kept)}["ops"] == 0.2646
