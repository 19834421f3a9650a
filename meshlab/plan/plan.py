"""The plan: a partition spec for every parameter over an abstract mesh, and what each costs per device."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

from meshlab.core.tpu_tiles import tiled_bytes
from meshlab.models.card import DTYPE_BYTES, ModelCard, Parameter
from meshlab.core.mesh import AbstractMesh, ravel
from meshlab.core.spec import PartitionSpec


@dataclass(frozen=True)
class PlannedParameter:
    """One parameter with its spec, and which rule gave it (None: no rule matched, so replicated)."""

    parameter: Parameter
    spec: PartitionSpec
    rule: int | None  # index into the strategy's rules

    @property
    def name(self) -> str:
        return self.parameter.name

    @property
    def shape(self) -> tuple[int, ...]:
        return self.parameter.shape

    def shard_shape(self, mesh: AbstractMesh) -> tuple[int, ...]:
        return self.spec.shard_shape(self.parameter.shape, mesh)

    def bytes_per_device(self, mesh: AbstractMesh) -> int:
        """What XLA allocates on each device: the padded shard."""
        return math.prod(self.shard_shape(mesh)) * DTYPE_BYTES[self.parameter.dtype]

    def tiled_bytes_per_device(self, mesh: AbstractMesh, itemsize: int | None = None) -> int:
        """What a TPU allocates for the shard: its shape in the tiled layout that pads least
        (meshlab.core.tpu_tiles), at `itemsize` bytes per element (its dtype's unless given)."""
        return tiled_bytes(self.shard_shape(mesh), itemsize or DTYPE_BYTES[self.parameter.dtype])

    def shard_slices(self, device: int, mesh: AbstractMesh) -> list[tuple[int, int]]:
        """The ``[start, stop)`` per dim of the real data `device` holds (the rest of its shard is padding).

        A dim split over several axes is split major-to-minor in the order the spec lists them.
        """
        coords = mesh.coordinates(device)
        slices = []
        for n, k, entry in zip(self.shape, self.spec.split_counts(mesh), self.spec.entries):
            size = -(-n // k)  # the shard's index: its coordinates on the entry's axes, major to minor
            index = ravel([coords[axis] for axis in entry or ()], [mesh.size(axis) for axis in entry or ()])
            slices.append((min(n, index * size), min(n, (index + 1) * size)))
        return slices

    def real_bytes_on(self, device: int, mesh: AbstractMesh) -> int:
        """Bytes of real (unpadded) data that `device` holds; the rest of its shard is padding."""
        elements = math.prod(stop - start for start, stop in self.shard_slices(device, mesh))
        return elements * DTYPE_BYTES[self.parameter.dtype]


@dataclass(frozen=True)
class Plan:
    """The output of planning: every parameter of `card` with its spec on `mesh`."""

    strategy_name: str
    card: ModelCard
    mesh: AbstractMesh
    parameters: tuple[PlannedParameter, ...]
    unmatched_rules: tuple[int, ...]  # rules that matched no parameter
    warnings: tuple[str, ...]

    def spec_map(self) -> dict[str, PartitionSpec]:
        return {p.name: p.spec for p in self.parameters}

    @cached_property
    def alike(self) -> tuple[tuple[PlannedParameter, int], ...]:
        """One parameter of each shape, dtype and spec, with how many the plan has: they hold the same shard on
        every device, so a sum of bytes over the parameters is a sum over these (a model's blocks repeat their
        parameters: Qwen-Image's 1,933 under 2d.yaml are 16 kinds). Computed once per plan."""
        counts: dict[tuple, list] = {}
        for p in self.parameters:
            key = (p.parameter.shape, p.parameter.dtype, p.spec)
            if key in counts:
                counts[key][1] += 1
            else:
                counts[key] = [p, 1]
        return tuple((p, n) for p, n in counts.values())

    @property
    def replicated(self) -> tuple[PlannedParameter, ...]:
        """Parameters that no rule matched (and so stay whole on every device)."""
        return tuple(p for p in self.parameters if p.rule is None)
