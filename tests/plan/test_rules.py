import pytest

from meshlab.models.card import Parameter
from meshlab.core.errors import PlanError
from meshlab.core.mesh import AbstractMesh
from meshlab.plan.rules import check_rule_axes, compile_rules, resolve
from meshlab.core.spec import PartitionSpec
from meshlab.strategy.schema import Rule

MESH = AbstractMesh((("data", 2), ("model", 4)))
Q_WEIGHT = Parameter("blocks.0.attn.to_q.weight", (3072, 3072), "bfloat16", "linear", "image", 0)
Q_BIAS = Parameter("blocks.0.attn.to_q.bias", (3072,), "bfloat16", "linear", "image", 0)
MLP_OUT = Parameter("blocks.0.mlp.net.2.weight", (3072, 12288), "bfloat16", "linear", "image", 0)
NORM = Parameter("blocks.0.attn.norm_q.weight", (128,), "bfloat16", "norm", "image", 0)


def rules(*items: dict):
    return compile_rules([Rule(**item) for item in items])


def test_first_match_wins_and_unmatched_is_replicated():
    compiled = rules({"match": "*.to_q.*", "shard": "column", "axis": "model"},
                     {"match": "*", "shard": "largest", "axis": "data"})
    assert resolve(Q_WEIGHT, compiled, MESH) == (PartitionSpec("model", None), 0)
    assert resolve(MLP_OUT, compiled, MESH) == (PartitionSpec(None, "data"), 1)
    assert resolve(NORM, rules({"match": "*.to_q.*", "shard": "replicate"}), MESH) == (PartitionSpec(None), None)


def test_column_row_and_bias_follow_output_dim():
    column = rules({"match": "*.to_q.*", "shard": "column", "axis": "model"})
    row = rules({"match": "*.to_q.*", "shard": "row", "axis": "model"})
    assert resolve(Q_BIAS, column, MESH)[0] == PartitionSpec("model")
    assert resolve(Q_WEIGHT, row, MESH)[0] == PartitionSpec(None, "model")
    assert resolve(Q_BIAS, row, MESH)[0] == PartitionSpec(None)


def test_largest_breaks_ties_to_the_lowest_dim():
    compiled = rules({"match": "*", "shard": "largest", "axis": "model"})
    assert resolve(Q_WEIGHT, compiled, MESH)[0] == PartitionSpec("model", None)
    assert resolve(MLP_OUT, compiled, MESH)[0] == PartitionSpec(None, "model")


def test_min_rank_skips_biases_and_regex_matches_whole_path():
    compiled = rules({"regex": r"blocks\.\d+\.attn\.to_q\.(weight|bias)", "min_rank": 2, "shard": "column", "axis": "model"})
    assert resolve(Q_WEIGHT, compiled, MESH)[1] == 0
    assert resolve(Q_BIAS, compiled, MESH)[1] is None
    assert resolve(MLP_OUT, rules({"regex": "mlp", "shard": "replicate"}), MESH)[1] is None  # fullmatch only


def test_multi_axis_and_explicit_specs():
    compiled = rules({"match": "*.net.2.*", "shard": [None, ["data", "model"]]})
    spec = resolve(MLP_OUT, compiled, MESH)[0]
    assert spec == PartitionSpec(None, ("data", "model")) and spec.shard_shape(MLP_OUT.shape, MESH) == (3072, 1536)


@pytest.mark.parametrize(
    "rule, parameter, message",
    [({"match": "*", "shard": ["model"]}, Q_WEIGHT, "spec of 1 entries"),
     ({"match": "*", "shard": ["model", "model"]}, Q_WEIGHT, "used twice"),
     ({"match": "*", "shard": "column", "axis": "model"}, NORM, "not a Linear")],
)
def test_resolve_errors_name_the_rule_field(rule, parameter, message):
    with pytest.raises(PlanError, match=message) as info:
        resolve(parameter, rules(rule), MESH)
    assert info.value.field == ("rules", 0, "shard")


def test_unknown_axis_is_caught_even_without_a_match():
    with pytest.raises(PlanError, match="unknown mesh axis 'tensor'") as info:
        check_rule_axes(rules({"match": "nothing", "shard": "largest", "axis": "tensor"}), MESH)
    assert info.value.field == ("rules", 0, "axis")
