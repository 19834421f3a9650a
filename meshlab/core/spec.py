"""A partition spec: for each tensor dim, the mesh axes that split it (or None when it is whole).

Immutable and canonical, like jax's PartitionSpec: an entry is ``None`` or a non-empty tuple of axis names.
``to_torch_xla()`` gives the form ``xs.mark_sharding`` takes: ``None``, ``"model"`` or ``("data", "model")``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Union

from meshlab.core.errors import PlanError
from meshlab.core.mesh import AbstractMesh

Entry = Union[None, str, Sequence[str]]


def _canonical_entry(entry: Entry) -> tuple[str, ...] | None:
    if entry is None:
        return None
    if isinstance(entry, str):
        return (entry,)
    axes = tuple(entry)
    if not all(isinstance(a, str) for a in axes):
        raise PlanError(f"a spec entry must name mesh axes, got {entry!r}", "use an axis name, a list of names, or null")
    return axes or None


@dataclass(frozen=True, eq=True)
class PartitionSpec:
    entries: tuple[tuple[str, ...] | None, ...]

    def __init__(self, *entries: Entry):
        canonical = tuple(_canonical_entry(e) for e in entries)
        used = [axis for entry in canonical if entry for axis in entry]
        repeated = sorted({a for a in used if used.count(a) > 1})
        if repeated:
            raise PlanError(
                f"mesh axis {repeated[0]!r} is used twice in one spec {_show(canonical)}",
                "an axis may split at most one dim of a tensor",
            )
        object.__setattr__(self, "entries", canonical)
        object.__setattr__(self, "_hash", hash(canonical))

    def __hash__(self) -> int:  # specs key the split-count cache: hash once, not per lookup
        return self._hash

    @classmethod
    def replicated(cls, rank: int) -> "PartitionSpec":
        return _interned(*([None] * rank))

    @classmethod
    def of(cls, *entries: str | tuple[str, ...] | None) -> "PartitionSpec":
        """The same as the constructor for hashable entries, but shared: plans reuse a handful of specs."""
        return _interned(*entries)

    @property
    def rank(self) -> int:
        return len(self.entries)

    @property
    def axes(self) -> tuple[str, ...]:
        return tuple(a for entry in self.entries if entry for a in entry)

    @property
    def is_replicated(self) -> bool:
        return not self.axes

    def split_counts(self, mesh: AbstractMesh) -> tuple[int, ...]:
        """Into how many pieces each dim is split on `mesh`."""
        return _split_counts(self, mesh)

    def shard_shape(self, shape: Sequence[int], mesh: AbstractMesh) -> tuple[int, ...]:
        """Per-device shard shape, padded to ceil(n / k) on each dim as XLA pads it."""
        return tuple(-(-n // k) for n, k in zip(shape, self.split_counts(mesh)))

    def to_torch_xla(self) -> tuple[str | tuple[str, ...] | None, ...]:
        return tuple(None if e is None else (e[0] if len(e) == 1 else e) for e in self.entries)

    def to_json(self) -> list[str | list[str] | None]:
        return [None if e is None else (e[0] if len(e) == 1 else list(e)) for e in self.entries]

    def __str__(self) -> str:
        return _show(self.entries)


@functools.lru_cache(maxsize=4096)
def _interned(*entries: str | tuple[str, ...] | None) -> PartitionSpec:
    return PartitionSpec(*entries)


@functools.lru_cache(maxsize=4096)
def _split_counts(spec: PartitionSpec, mesh: AbstractMesh) -> tuple[int, ...]:
    return tuple(math.prod(mesh.size(a) for a in entry) if entry else 1 for entry in spec.entries)


def _show(entries: tuple[tuple[str, ...] | None, ...]) -> str:
    parts = ["None" if e is None else (e[0] if len(e) == 1 else "(" + ", ".join(e) + ")") for e in entries]
    return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"
