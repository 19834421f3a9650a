import pytest

from meshlab.core.errors import PlanError
from meshlab.core.mesh import AbstractMesh


def test_resolve_infers_one_axis():
    mesh = AbstractMesh.resolve({"data": -1, "model": 4}, 8)
    assert mesh.as_dict() == {"data": 2, "model": 4}
    assert mesh.names == ("data", "model") and mesh.shape == (2, 4)


@pytest.mark.parametrize(
    "sizes, message",
    [({"data": -1, "model": -1}, "more than one"), ({"data": 3, "model": -1}, "cannot infer"),
     ({"data": 2, "model": 2}, "has 4 devices but the hardware has 8")],
)
def test_resolve_rejects(sizes, message):
    with pytest.raises(PlanError, match=message):
        AbstractMesh.resolve(sizes, 8)


def test_coordinates_are_row_major():
    mesh = AbstractMesh((("data", 2), ("model", 4)))
    assert mesh.coordinates(0) == {"data": 0, "model": 0}
    assert mesh.coordinates(5) == {"data": 1, "model": 1}
    assert mesh.coordinates(7) == {"data": 1, "model": 3}


def test_unknown_axis_lists_valid_ones():
    mesh = AbstractMesh((("data", 2), ("model", 4)))
    with pytest.raises(PlanError, match=r"unknown mesh axis 'tensor'.*\['data', 'model'\]"):
        mesh.size("tensor")


def test_repeated_names_rejected():
    with pytest.raises(PlanError, match="repeat"):
        AbstractMesh((("a", 2), ("a", 4)))


def test_ravel_and_unravel_are_row_major_and_inverse():
    from meshlab.core.mesh import AbstractMesh, ravel, unravel

    assert unravel(5, (2, 4)) == (1, 1) and unravel(7, (2, 4)) == (1, 3)  # 5 = 1 x 4 + 1
    assert ravel((1, 3), (2, 4)) == 7
    assert all(ravel(unravel(p, (3, 2, 4)), (3, 2, 4)) == p for p in range(24))
    mesh = AbstractMesh((("data", 2), ("model", 4)))
    assert mesh.coordinates(6) == {"data": 1, "model": 2} and mesh.position({"model": 2, "data": 1}) == 6
