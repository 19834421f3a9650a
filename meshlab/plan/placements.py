"""A partition spec as DTensor places it: one placement per mesh axis, and the slice each rank then holds. Pure.

DTensor lists placements by mesh dim (``[Shard(0), Replicate()]``), where a spec lists mesh axes by tensor dim.
The two say the same thing except in two places:

- **Several axes on one dim.** DTensor splits a dim over its mesh dims in mesh order (the first mesh dim
  outermost), so the spec entry ``("data", "model")`` on a ``(data, model)`` mesh is ``[Shard(d), Shard(d)]``.
  The reverse order ``("model", "data")`` has no public DTensor placement (only the private ``_StridedShard``),
  so meshlab says it cannot express it rather than place the data elsewhere than XLA would.
- **Uneven dims.** XLA pads every shard to ``ceil(n / k)``; DTensor cuts as ``torch.chunk`` does: chunks of
  ``ceil(n / k)`` rows, so the last ranks hold fewer rows, or none (5 rows over 4 ranks: 2, 2, 1, 0 where XLA
  holds 2, 2, 2, 2 with three rows of padding). A dim split over two axes is cut by the first, then each piece by
  the second, so uneven rows also sit elsewhere than XLA puts them: 20 rows over (data 2, model 4) are 10 + 10,
  then 3, 3, 3, 1 of each, where XLA's flat split gives 3, 3, 3, 3, 3, 3, 2, 0. Since
  ``ceil(ceil(n / a) / b) == ceil(n / (a * b))``, the rank at coordinate 0 on every axis holds exactly XLA's
  padded shard. The busiest chip, which is what the memory model reports, is therefore the same under both
  backends; only the lighter ranks differ (``local_shape`` gives each, and ``check --backend dtensor`` holds
  every rank to it).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshlab.core.errors import PlanError
from meshlab.core.mesh import AbstractMesh
from meshlab.core.spec import PartitionSpec

#: One mesh axis's placement: ``("shard", dim)`` or ``("replicate",)``.
Placement = tuple


@dataclass(frozen=True)
class Placements:
    """A spec's DTensor placements on a mesh, or why DTensor cannot hold it."""

    placements: tuple[Placement, ...]  # one per mesh axis, in mesh order
    problem: str = ""

    @property
    def expressible(self) -> bool:
        return not self.problem

    def __str__(self) -> str:
        if self.problem:
            return "(not expressible)"
        return "[" + ", ".join(f"Shard({p[1]})" if p[0] == "shard" else "Replicate()" for p in self.placements) + "]"


def placements_of(spec: PartitionSpec, mesh: AbstractMesh) -> Placements:
    """Each mesh axis's placement for `spec`: ``Shard(d)`` where the axis splits dim d, else ``Replicate()``."""
    placements: list[Placement] = [("replicate",)] * len(mesh.axes)
    for dim, entry in enumerate(spec.entries):
        order = [mesh.index(axis) for axis in entry or ()]
        if order != sorted(order):
            return Placements((), f"dim {dim} is split over {', '.join(entry)} in an order that is not the mesh's "
                                  f"({', '.join(mesh.names)}); DTensor nests splits of one dim in mesh order")
        for index in order:
            placements[index] = ("shard", dim)
    return Placements(tuple(placements))


def required(spec: PartitionSpec, mesh: AbstractMesh, what: str, field: tuple = ()) -> Placements:
    """`spec`'s placements, or a PlanError naming `what` (a parameter, an activation rule) and why DTensor cannot
    hold it."""
    placements = placements_of(spec, mesh)
    if not placements.expressible:
        raise PlanError(f"DTensor cannot hold {what} as planned ({spec}): {placements.problem}",
                        "list the axes of that dim in mesh order, or use the torch_xla backend", field=field)
    return placements


def local_slices(shape: tuple[int, ...], spec: PartitionSpec, mesh: AbstractMesh,
                 position: int) -> list[tuple[int, int]]:
    """The ``[start, stop)`` per dim that the rank at mesh `position` holds under DTensor (``torch.chunk`` rule)."""
    coords = mesh.coordinates(position)
    slices = []
    for n, entry in zip(shape, spec.entries):
        start, stop = 0, n
        for axis in sorted(entry or (), key=mesh.index):  # mesh order, as DTensor nests them
            size, k = stop - start, mesh.size(axis)
            chunk = -(-size // k)
            start, stop = min(stop, start + coords[axis] * chunk), min(stop, start + (coords[axis] + 1) * chunk)
        slices.append((start, stop))
    return slices


def local_shape(shape: tuple[int, ...], spec: PartitionSpec, mesh: AbstractMesh, position: int) -> tuple[int, ...]:
    """The local tensor's shape on the rank at mesh `position` under DTensor (no padding)."""
    return tuple(stop - start for start, stop in local_slices(shape, spec, mesh, position))
