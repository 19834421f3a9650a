import pytest

from meshlab.core.errors import PlanError
from meshlab.plan.planner import make_plan
from meshlab.strategy.schema import Strategy

from tests.conftest import small_card


def strategy(**overrides) -> Strategy:
    base = {"name": "t", "model": "small", "hardware": "v6e-8", "mesh": {"data": 2, "model": 4},
            "rules": [{"match": "*", "min_rank": 2, "shard": "largest", "axis": "model"}],
            "activations": {"batch": "data"}, "workload": {"batch": 2}}
    base.update(overrides)
    return Strategy.model_validate(base)


def test_every_parameter_planned_in_card_order():
    card = small_card()
    plan = make_plan(strategy(), card, 8)
    assert [p.name for p in plan.parameters] == [p.name for p in card.parameters]
    assert {p.rule for p in plan.parameters if p.parameter.rank >= 2} == {0}
    assert all(p.spec.is_replicated for p in plan.replicated)


def test_chunk_misaligned_padding_is_warned():
    card = small_card(width=60, heads=4)  # a 60-wide input dim over 8 devices pads to 8 x 8
    plan = make_plan(strategy(rules=[{"match": "*_mod.1.weight", "shard": [None, ["data", "model"]]}]), card, 8)
    [warning] = plan.warnings
    assert "4 parameter(s)" in warning and "need padding" in warning
    mod = next(p for p in plan.parameters if p.name.endswith("img_mod.1.weight"))
    assert mod.shard_shape(plan.mesh) == (360, 8)
    real = [mod.real_bytes_on(d, plan.mesh) for d in range(8)]
    assert real[:7] == [360 * 8 * 2] * 7 and real[7] == 360 * 4 * 2  # the last device holds columns 56..59


def test_heads_not_divisible_is_an_error():
    with pytest.raises(PlanError, match="4 heads, not divisible by 8") as info:
        make_plan(strategy(mesh={"model": 8}, activations={}, rules=[
            {"match": "*.attn.to_q.*", "shard": "column", "axis": "model"}]), small_card(), 8)
    assert info.value.field == ("rules", 0, "axis")


def test_mesh_and_activation_errors_point_at_fields():
    with pytest.raises(PlanError) as info:
        make_plan(strategy(mesh={"data": 2, "model": 2}), small_card(), 8)
    assert info.value.field == ("mesh",)
    assert "XLA pads it to 2" in make_plan(strategy(workload={"batch": 1}), small_card(), 8).warnings[0]
    with pytest.raises(PlanError, match="activations.batch") as info:
        make_plan(strategy(activations={"batch": "rows"}), small_card(), 8)


def test_unmatched_rules_are_reported():
    plan = make_plan(strategy(rules=[{"match": "nothing.*", "shard": "replicate"},
                                     {"match": "*", "shard": "replicate"}]), small_card(), 8)
    assert plan.unmatched_rules == (0,)


def test_workload_dtype_sets_parameter_bytes():
    plan = make_plan(strategy(workload={"batch": 2, "dtype": "float32"}), small_card(), 8)
    assert {p.parameter.dtype for p in plan.parameters} == {"float32"}
