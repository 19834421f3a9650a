"""Eager PyTorch's launch floor: the host dispatches a call's ops one by one, so a step takes at least their count x
the hardware's `eager_dispatch_s` (meshlab.cost.timing.step_time, meshlab.cost.layout.eager_dispatches)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshlab.models.card import load_card
from meshlab.models.truncate import block_lists
from meshlab.cost.layout import eager_dispatches
from meshlab.cost.predict import predict
from meshlab.core.hardware import load_hardware
from meshlab.plan.planner import make_plan
from meshlab.strategy.schema import Strategy

PROFILES = Path(__file__).resolve().parents[2] / "experiments" / "profiles"
EAGER_BLOCKS = PROFILES / "h200-eager-blocks.json"  # 1 and 2 blocks a list, a text mask: CUDA's kernel counts
EAGER_FORWARDS = PROFILES / "h200-eager-blocks-4-12.json"  # 4 and 12 blocks a list, as the pipelines call them


def one_gpu(side: int, execution: str = "eager", hardware: str = "h200:1", mesh: dict | None = None,
            activations: dict | None = None):
    mesh = mesh or {"data": 1}
    s = Strategy.model_validate({
        "name": "t", "model": "qwen-image", "hardware": hardware, "mesh": mesh, "rules": [],
        "activations": activations or {},
        "workload": {"batch": 1, "height": side, "width": side, "text_tokens": 64, "cfg": True},
        "compile": {"elementwise": execution}})
    card = load_card("qwen-image")
    return predict(make_plan(s, card, sum(mesh.values()) if len(mesh) == 1 else 8), s, load_hardware(hardware))


def test_a_forward_dispatches_each_block_lists_count_times_its_blocks_and_the_rest():
    card = load_card("qwen-image")
    assert block_lists(card) == {"transformer_blocks": 60}
    assert eager_dispatches(card) == 60 * card.dispatches["transformer_blocks"] + card.dispatches["outside"]
    flux = load_card("flux-dev")
    assert eager_dispatches(flux) == (19 * flux.dispatches["transformer_blocks"]
                                      + 38 * flux.dispatches["single_transformer_blocks"]
                                      + flux.dispatches["outside"])


def test_a_launch_bound_step_is_the_hosts_dispatch_time():
    """Qwen-Image at 512x512 on one H200: the GPU's own work per call is shorter than its 5805 dispatches, so the
    step is two calls' dispatches at eager_dispatch_s, plus the host overhead."""
    p = one_gpu(512)
    step = p.step
    dispatch_s = load_hardware("h200:1").eager_dispatch_s
    assert step.dispatches == 2 * eager_dispatches(load_card("qwen-image"))
    assert step.launch_floor == pytest.approx(step.dispatches * dispatch_s)
    assert step.local < step.launch_floor
    assert step.launch_wait == pytest.approx(step.launch_floor - step.local)
    assert step.total == pytest.approx(step.launch_floor + step.overhead)
    assert step.launch_wait > 0.4 * step.total  # launch-bound indeed


def test_a_step_longer_than_its_launches_waits_on_nothing():
    step = one_gpu(1024).step
    assert step.local > step.launch_floor > 0
    assert step.launch_wait == 0
    assert step.total == pytest.approx(step.local + step.collective + step.overhead)


def test_compiled_work_and_tpus_have_no_launch_floor():
    fused = one_gpu(512, execution="fused").step
    assert (fused.dispatches, fused.launch_floor, fused.launch_wait) == (0, 0.0, 0.0)
    tpu = one_gpu(512, hardware="v6e-1").step  # XLA compiles the call whatever the strategy says
    assert (tpu.dispatches, tpu.launch_floor, tpu.launch_wait) == (0, 0.0, 0.0)


def test_each_collective_the_host_issues_is_one_more_dispatch():
    """CFG 2 x Ulysses 4 on 8 GPUs: one call a step, each of its all-to-alls a host call too, and the guidance
    branches' all-gather once a step."""
    p = one_gpu(512, hardware="h100:8", mesh={"cfg": 2, "sp": 4}, activations={"sequence": "sp"})
    per_call = sum(c.count for c in p.issued_collectives if not c.per_step)
    per_step = sum(c.count for c in p.issued_collectives if c.per_step)
    assert p.layout.calls == 1 and per_call > 0 and per_step > 0
    assert p.step.dispatches == eager_dispatches(load_card("qwen-image")) + per_call + per_step


def test_a_call_a_profile_timed_whole_already_waited_on_its_launches():
    """The profile timed this plan's eager call whole on the device: no floor on top. At another size the profile
    prices the call op by op from kernel times, which leave the launches out: the floor applies again."""
    from meshlab.api import load_plan

    root = Path(__file__).resolve().parents[2]
    planned = load_plan(root / "experiments/strategies/qwen-image-one-h200-profiled-512.yaml")
    p = predict(planned.plan, planned.strategy, planned.hardware)
    assert p.measured.basis == "blocks" and p.step.dispatches > 0
    assert (p.step.launch_wait, p.step.launch_floor) == (0.0, 0.0)
    other = planned.strategy.model_copy(update={"workload": planned.strategy.workload.model_copy(
        update={"height": 256, "width": 256})})
    by_ops = predict(make_plan(other, planned.card, 1), other, planned.hardware)
    assert by_ops.measured.basis == "ops"
    assert by_ops.step.launch_floor == pytest.approx(by_ops.step.dispatches * planned.hardware.eager_dispatch_s)
    assert by_ops.step.launch_wait > 0


def test_the_catalogs_dispatch_cost_is_the_h200_measurement():
    """eager_dispatch_s comes from benchmarks/gpu_eager_blocks.py on the H200: a 12-blocks-a-list forward's median
    time over the ops the card traces for it, each model's least (the host at its calmest), averaged over the
    two models; the ops counted from today's cards."""
    from meshlab.models.truncate import truncate_card

    measured = json.loads(EAGER_FORWARDS.read_text())
    assert measured["blocks"] == [4, 12]
    per_op = []
    for model in ("qwen-image", "flux-dev"):
        cases = [c for c in measured["cases"] if c["model"] == model]
        assert {c["traced_ops_12"] for c in cases} == {eager_dispatches(truncate_card(load_card(model), 12))}
        per_op.append(min(c["wall_s_12"] / c["traced_ops_12"] for c in cases))
    assert load_hardware("h200").eager_dispatch_s == pytest.approx(sum(per_op) / 2, rel=0.01)


def test_the_traced_count_against_the_kernels_cuda_launched():
    """Ops the trace counts per block against the kernels CUDA's profiler counted (with the text mask the card is
    traced with): Qwen-Image's block within 10% (an op or two launch helpers); Flux's pair traces a third more
    ops than it launches kernels (ops that launch none). The dispatch cost is measured per traced op, so it
    carries the difference."""
    measured = json.loads(EAGER_BLOCKS.read_text())

    def kernels(model: str) -> int:
        return min(c["block_kernels"] for c in measured["cases"] if c["model"] == model)

    qwen, flux = load_card("qwen-image").dispatches, load_card("flux-dev").dispatches
    assert 0.9 * kernels("qwen-image") <= qwen["transformer_blocks"] <= kernels("qwen-image")
    pair = flux["transformer_blocks"] + flux["single_transformer_blocks"]
    assert 1.2 * kernels("flux-dev") <= pair <= 1.5 * kernels("flux-dev")
