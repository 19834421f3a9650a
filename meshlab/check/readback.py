"""Hold what torch_xla reports about each parameter against the plan. Pure, no torch.

For every parameter: the HLO sharding string XLA holds, the padded shard shape it implies on each device, and
the slice of real data each device holds, each compared with what the plan predicts.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

from meshlab.check.hlo import HloSharding, parse_sharding
from meshlab.models.card import DTYPE_BYTES
from meshlab.core.mesh import AbstractMesh
from meshlab.plan.plan import PlannedParameter
from meshlab.core.spec import PartitionSpec

Slices = list[list[tuple[int, int]]]  # per device id, per dim: [start, stop)


@dataclass(frozen=True)
class AppliedParameter:
    """One parameter as planned and as XLA holds it."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    predicted_spec: PartitionSpec
    xla_sharding: str
    predicted_shard_shape: tuple[int, ...]
    xla_shard_shape: tuple[int, ...]
    misplaced: tuple[int, ...]  # devices whose slice of real data is not the one the plan gives them
    predicted_sharding: str = ""  # the HLO sharding the plan implies
    same_tiling: bool = True  # XLA's sharding tiles the tensor over the devices as the predicted one does
    problem: str = ""  # why XLA's sharding could not be read, when it could not

    @property
    def agrees(self) -> bool:
        return (not self.problem and not self.misplaced and self.same_tiling
                and self.predicted_shard_shape == self.xla_shard_shape)

    @property
    def predicted_bytes(self) -> int:
        return math.prod(self.predicted_shard_shape) * DTYPE_BYTES.get(self.dtype, 2)

    @property
    def xla_bytes(self) -> int:
        return math.prod(self.xla_shard_shape) * DTYPE_BYTES.get(self.dtype, 2)

    def to_json(self) -> dict:
        return {
            "name": self.name, "shape": list(self.shape), "predicted_spec": self.predicted_spec.to_json(),
            "predicted_sharding": self.predicted_sharding, "xla_sharding": self.xla_sharding,
            "predicted_shard_shape": list(self.predicted_shard_shape),
            "xla_shard_shape": list(self.xla_shard_shape), "misplaced_devices": list(self.misplaced),
            "agrees": self.agrees, **({"problem": self.problem} if self.problem else {}),
        }


def compare_parameter(planned: PlannedParameter, mesh: AbstractMesh, device_ids: tuple[int, ...],
                      sharding: str, slices: Slices, dtype: str | None = None) -> AppliedParameter:
    """`sharding` and `slices` as torch_xla reports them for the parameter; `device_ids[p]`: device at position p."""
    predicted = planned.shard_shape(mesh)
    expected = predicted_sharding(planned.spec, mesh, device_ids)
    rank, count = len(planned.shape), mesh.device_count
    try:
        held = parse_sharding(sharding, rank, count)
        xla_shape, same, problem = held.shard_shape(planned.shape), _same(held, parse_sharding(expected, rank, count)), ""
    except ValueError as exc:
        xla_shape, same, problem = (), False, str(exc)
    misplaced = tuple(d for p, d in enumerate(device_ids)
                      if d >= len(slices) or _normal(slices[d]) != expected_slices(planned, mesh, p))
    return AppliedParameter(planned.name, planned.shape, dtype or planned.parameter.dtype, planned.spec, sharding,
                            predicted, tuple(xla_shape), misplaced, expected, same, problem)


def predicted_sharding(spec: PartitionSpec, mesh: AbstractMesh, device_ids: tuple[int, ...]) -> str:
    """The HLO sharding string torch_xla builds for `spec`: tiles in spec order, the unused axes replicating."""
    tiles = spec.split_counts(mesh)
    if math.prod(tiles) == 1:
        return "{replicated}"
    used = [axis for entry in spec.entries if entry for axis in entry]
    order = used + [axis for axis in mesh.names if axis not in used]
    devices = []
    for index in itertools.product(*(range(mesh.size(axis)) for axis in order)):
        coords = dict(zip(order, index))
        devices.append(device_ids[mesh.position(coords)])
    replicas = mesh.device_count // math.prod(tiles)
    dims = list(tiles) + ([replicas] if replicas > 1 else [])
    suffix = " last_tile_dim_replicate" if replicas > 1 else ""
    return f"{{devices=[{','.join(map(str, dims))}]{','.join(map(str, devices))}{suffix}}}"



def _same(a: HloSharding, b: HloSharding) -> bool:
    if a.is_replicated and b.is_replicated:
        return True
    return (a.tiles, a.replicas, a.devices) == (b.tiles, b.replicas, b.devices)


def expected_slices(planned: PlannedParameter, mesh: AbstractMesh, position: int) -> list[tuple[int, int]]:
    """The ``[start, stop)`` per dim of the real data the plan puts on the device at mesh `position`."""
    return planned.shard_slices(position, mesh)


def _normal(slices: list[tuple[int, int]]) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in slices]


@dataclass(frozen=True)
class LocalParameter:
    """One parameter as planned and as DTensor holds it on one rank (meshlab.plan.placements)."""

    name: str
    shape: tuple[int, ...]
    predicted_spec: PartitionSpec
    predicted_placements: str
    placements: str
    predicted_local_shape: tuple[int, ...]
    local_shape: tuple[int, ...]
    holds_its_slice: bool  # the local tensor equals the slice of the whole weight the plan gives this rank

    @property
    def agrees(self) -> bool:
        return (self.predicted_placements == self.placements and self.holds_its_slice
                and self.predicted_local_shape == self.local_shape)

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "predicted_spec": self.predicted_spec.to_json(),
                "predicted_placements": self.predicted_placements, "placements": self.placements,
                "predicted_shard_shape": list(self.predicted_local_shape), "shard_shape": list(self.local_shape),
                "holds_its_slice": self.holds_its_slice, "agrees": self.agrees}


def weights_per_device(parameters: tuple[AppliedParameter, ...]) -> tuple[int, int]:
    """(predicted, XLA) bytes of padded weight shards on one device."""
    return sum(p.predicted_bytes for p in parameters), sum(p.xla_bytes for p in parameters)
