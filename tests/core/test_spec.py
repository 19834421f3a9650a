import pytest

from meshlab.core.errors import PlanError
from meshlab.core.mesh import AbstractMesh
from meshlab.core.spec import PartitionSpec

MESH = AbstractMesh((("data", 2), ("model", 4)))


def test_canonical_forms_are_equal():
    assert PartitionSpec("model", None) == PartitionSpec(["model"], None) == PartitionSpec(("model",), [])
    assert PartitionSpec(("data", "model")).to_torch_xla() == (("data", "model"),)
    assert PartitionSpec("model", None).to_torch_xla() == ("model", None)
    assert PartitionSpec(["data", "model"], None).to_json() == [["data", "model"], None]


def test_axis_used_twice_is_an_error():
    with pytest.raises(PlanError, match="used twice"):
        PartitionSpec("model", "model")


def test_shard_shape_pads_like_xla():
    assert PartitionSpec("model", None).shard_shape((18432, 3072), MESH) == (4608, 3072)
    assert PartitionSpec(("data", "model")).shard_shape((10,), MESH) == (2,)  # ceil(10 / 8)
    assert PartitionSpec(None, "model").shard_shape((5, 6), MESH) == (5, 2)


def test_str_and_replicated():
    assert str(PartitionSpec("model")) == "(model,)"
    assert PartitionSpec.replicated(2).is_replicated
    assert str(PartitionSpec(("data", "model"), None)) == "((data, model), None)"
