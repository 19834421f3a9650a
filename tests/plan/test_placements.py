"""A spec as DTensor places it: placements per mesh axis, torch.chunk local shapes, and what it cannot express."""

from __future__ import annotations

import math

import pytest

from meshlab.core.mesh import AbstractMesh
from meshlab.plan.placements import local_shape, local_slices, placements_of
from meshlab.plan.planned import plan_file
from meshlab.core.spec import PartitionSpec

from tests.conftest import STRATEGIES

MESH = AbstractMesh((("data", 2), ("model", 4)))


def test_one_placement_per_mesh_axis():
    assert str(placements_of(PartitionSpec("model", None), MESH)) == "[Replicate(), Shard(0)]"
    assert str(placements_of(PartitionSpec(None, "data"), MESH)) == "[Shard(1), Replicate()]"
    assert str(placements_of(PartitionSpec(None, None), MESH)) == "[Replicate(), Replicate()]"


def test_two_axes_on_one_dim_in_mesh_order_nest_as_dtensor_does():
    placements = placements_of(PartitionSpec(("data", "model")), MESH)
    assert str(placements) == "[Shard(0), Shard(0)]"
    # device (d, m) holds block d * 4 + m of 16 rows: the order XLA's spec ("data", "model") gives it
    assert [local_slices((16,), PartitionSpec(("data", "model")), MESH, p)[0] for p in range(8)] == [
        (2 * i, 2 * i + 2) for i in range(8)]


def test_two_axes_against_mesh_order_are_refused_with_the_reason():
    placements = placements_of(PartitionSpec(("model", "data")), MESH)
    assert not placements.expressible
    assert "mesh order" in placements.problem and "dim 0" in placements.problem


def test_uneven_dims_follow_torch_chunk_not_xla_padding():
    spec = PartitionSpec("model")
    # 5 rows over 4 ranks: torch.chunk gives 2, 2, 1, 0 where XLA pads every shard to 2
    assert [local_shape((5,), spec, MESH, p)[0] for p in range(4)] == [2, 2, 1, 0]
    assert spec.shard_shape((5,), MESH) == (2,)
    # 6 rows over 4: chunks of 2, so the last rank holds nothing
    assert [local_shape((6,), spec, MESH, p)[0] for p in range(4)] == [2, 2, 2, 0]


def test_local_slices_match_torch_chunk_nested_in_mesh_order():
    torch = pytest.importorskip("torch")
    spec = PartitionSpec(("data", "model"), None)
    value = torch.arange(11 * 3).view(11, 3)
    for position in range(8):
        coords = MESH.coordinates(position)
        outer = torch.chunk(value, 2, dim=0)
        outer = outer[coords["data"]] if coords["data"] < len(outer) else value[:0]
        inner = torch.chunk(outer, 4, dim=0)
        expected = inner[coords["model"]] if coords["model"] < len(inner) else outer[:0]
        (start, stop), _ = local_slices((11, 3), spec, MESH, position)
        assert torch.equal(value[start:stop], expected), position


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda p: p.stem)
def test_the_busiest_rank_holds_exactly_the_xla_padded_shard(strategy):
    """Why the memory model (the busiest chip) holds for both backends: mesh position 0 always holds
    ceil(n / k) rows of every split dim, which is XLA's padded shard; the other ranks hold that or less."""
    plan = plan_file(strategy).plan
    mesh = plan.mesh
    for p in plan.parameters:
        assert placements_of(p.spec, mesh).expressible, p.name
        padded = p.spec.shard_shape(p.shape, mesh)
        assert local_shape(p.shape, p.spec, mesh, 0) == padded, p.name
        assert all(math.prod(local_shape(p.shape, p.spec, mesh, r)) <= math.prod(padded)
                   for r in range(mesh.device_count)), p.name
