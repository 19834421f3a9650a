"""A device-free mesh: ordered axis names and sizes, for planning (like jax's AbstractMesh).

Devices are numbered row-major over the axes, as ``np.arange(n).reshape(shape)`` numbers them, which is
how ``xs.Mesh(np.arange(n), shape, names)`` lays them out. Only the backend ever meets real devices.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

from meshlab.core.errors import PlanError


@dataclass(frozen=True)
class AbstractMesh:
    """Ordered ``(axis name, size)`` pairs. Invalid meshes cannot be built."""

    axes: tuple[tuple[str, int], ...]

    def __post_init__(self) -> None:
        names = [name for name, _ in self.axes]
        if not self.axes:
            raise PlanError("the mesh has no axes", "give at least one axis, e.g. mesh: {model: 8}")
        if len(set(names)) != len(names):
            raise PlanError(f"mesh axis names repeat: {names}", "give every axis a distinct name")
        for name, size in self.axes:
            if not isinstance(size, int) or size < 1:
                raise PlanError(f"mesh axis {name!r} has size {size}", "sizes are positive integers")

    @classmethod
    def resolve(cls, sizes: Mapping[str, int], device_count: int) -> "AbstractMesh":
        """Build a mesh from ``{axis: size}``, inferring at most one ``-1`` from the device count."""
        inferred = [name for name, size in sizes.items() if size == -1]
        if len(inferred) > 1:
            raise PlanError(f"more than one mesh axis is -1: {inferred}", "leave at most one axis to be inferred")
        known = math.prod(size for size in sizes.values() if size != -1)
        if inferred:
            if known < 1 or device_count % known:
                raise PlanError(
                    f"cannot infer mesh axis {inferred[0]!r}: {device_count} devices are not divisible by {known}",
                    f"make the other axes multiply to a divisor of {device_count}",
                )
            sizes = {name: (device_count // known if size == -1 else size) for name, size in sizes.items()}
        mesh = cls(tuple(sizes.items()))
        if mesh.device_count != device_count:
            raise PlanError(
                f"the mesh {mesh.describe()} has {mesh.device_count} devices but the hardware has {device_count}",
                f"make the axis sizes multiply to {device_count} (or use -1 for one axis)",
            )
        return mesh

    def __hash__(self) -> int:
        return hash(self.axes)

    @cached_property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.axes)

    @cached_property
    def shape(self) -> tuple[int, ...]:
        return tuple(size for _, size in self.axes)

    @property
    def device_count(self) -> int:
        return math.prod(self.shape)

    def size(self, axis: str) -> int:
        return self.shape[self.index(axis)]

    def index(self, axis: str) -> int:
        if axis not in self.names:
            raise PlanError(f"unknown mesh axis {axis!r}", f"use one of {list(self.names)}")
        return self.names.index(axis)

    def coordinates(self, device: int) -> dict[str, int]:
        """The device's position along each axis (row-major numbering)."""
        return dict(zip(self.names, unravel(device, self.shape)))

    def position(self, coordinates: Mapping[str, int]) -> int:
        """The row-major device number at `coordinates` (one per axis): `coordinates`' inverse."""
        return ravel([coordinates[name] for name in self.names], self.shape)

    def as_dict(self) -> dict[str, int]:
        return dict(self.axes)

    def describe(self) -> str:
        return "x".join(str(s) for s in self.shape) + " (" + ", ".join(self.names) + ")"


def unravel(position: int, sizes: Sequence[int]) -> tuple[int, ...]:
    """The coordinates of `position` in a grid of `sizes` numbered row-major (the last size varies fastest)."""
    coordinates = []
    for size in reversed(sizes):
        position, c = divmod(position, size)
        coordinates.append(c)
    return tuple(reversed(coordinates))


def ravel(coordinates: Sequence[int], sizes: Sequence[int]) -> int:
    """The row-major position of `coordinates` in a grid of `sizes`: `unravel`'s inverse."""
    position = 0
    for c, size in zip(coordinates, sizes, strict=True):
        position = position * size + c
    return position
