"""How long a collective takes over the chips of a mesh axis, given how those chips are wired.

Mesh positions are numbered row-major over the mesh axes, and each sits on the chip ``xs.HybridMesh`` gives it
inside its slice (meshlab.cost.device_layout: the last mesh axis onto whole physical axes first; held against
torch_xla's layout over libtpu's device coordinates). The chips of one group of a collective (all positions that
differ only along its mesh axes) then form:

- a line along one physical axis: an open line (v6e-8 is 2x4 with no wraparound) moves data at one link's
  bandwidth each way, ``W``, with ``n - 1`` hops; a ring (wraparound, the full axis) at ``2W``, ``n / 2`` hops;
- a full sub-grid over several physical axes: a ring fits through it (one side is even), so ``2W``, ``n / 2``
  hops;
- anything else (strided chips): a line through intermediate chips, ``W`` and ``n - 1`` hops of the largest
  stride;
- on an NVSwitch node every group is switched: ``W`` (the GPU's whole NVLink bandwidth), ``n - 1`` steps.

Costs (jax-ml/scaling-book, sharding.md): an all-gather or reduce-scatter of ``V`` bytes moves
``V (n - 1) / n`` per chip; an all-reduce twice that; a collective-permute moves its ``V`` once over one link.
An all-to-all of a per-chip buffer ``B`` is bisection-bound on a torus: a quarter of the whole array, ``n B / 4``,
crosses the middle of the group each way, over the links that cut it: two on a ring (``n B / 8W``, a quarter of
the all-gather's time as the scaling book states for a bidirectional ring), one on an open line (``n B / 4W``);
a switch sends each GPU's ``B (n - 1) / n`` at its own bandwidth.
Every step adds the hardware's per-hop latency.

Across slices (a strategy's ``dcn``, hardware ``v6e-8x2``): a mesh axis of size ``n`` spanning ``k`` slices has
``n / k`` chips inside each slice, numbered minor, as ``HybridMesh`` lays devices out. A collective over axes that
cross slices runs hierarchically, as XLA's multi-slice collectives do: the ICI part among the ``n_i`` chips of
the group inside one slice (routed as above), and a DCN part among the ``k`` slices, at each chip's share of its
host's DCN bandwidth. The DCN part moves, per chip: for an all-gather or reduce-scatter the ICI-sized piece
``V / n_i`` times ``(k - 1) / k``; an all-reduce twice that (reduce-scatter in the slice, all-reduce of the piece
over DCN, all-gather in the slice); an all-to-all the ``(k - 1) / k`` of its buffer bound for other slices (the
rest is an all-to-all inside the slice); a collective-permute its whole buffer. DCN latency is not modelled.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import lru_cache

from meshlab.cost.device_layout import mesh_coordinates
from meshlab.core.hardware import Hardware
from meshlab.core.mesh import AbstractMesh, unravel


@dataclass(frozen=True)
class Route:
    """How a group of chips runs a collective."""

    chips: int
    bandwidth: float  # bytes/s each chip moves, both directions together
    hops: int  # latency steps of one all-gather
    shape: str  # "ring", "line", "grid", "strided", "switch", "local"; "+dcn" when it crosses slices
    slices: int = 1  # slices the group spans (1: it stays inside one slice)
    dcn_bandwidth: float = math.inf  # bytes/s each chip sends over DCN


def route(axes: tuple[str, ...], mesh: AbstractMesh, hardware: Hardware,
          dcn: Mapping[str, int] | None = None) -> Route:
    """How the group of `axes` runs on `hardware`; `dcn` (axis -> slices it spans) puts part of axes on DCN."""
    dcn = dcn or {}
    inside = tuple((name, size // dcn.get(name, 1)) for name, size in mesh.axes)  # the mesh within one slice
    ici = _route(axes, inside, hardware.topology, hardware.wraparound, hardware.interconnect,
                 hardware.ici_link_bandwidth)
    slices = math.prod(dcn.get(a, 1) for a in axes)
    if slices == 1:
        return ici
    return replace(ici, shape=f"{ici.shape}+dcn", slices=slices, dcn_bandwidth=hardware.dcn_bandwidth_per_chip)


@lru_cache(maxsize=512)
def _route(axes, mesh_axes, topology, wraparound, interconnect, link) -> Route:
    sizes = dict(mesh_axes)
    n = math.prod(sizes[a] for a in axes)
    if n == 1:
        return Route(1, math.inf, 0, "local")
    if interconnect == "nvswitch":
        return Route(n, link, n - 1, "switch")
    layout = _layout(tuple(size for _, size in mesh_axes), topology)
    coords = [layout[p] for p in _group(axes, mesh_axes)]
    varying = [i for i in range(len(topology)) if len({c[i] for c in coords}) > 1]
    ranges = [sorted({c[i] for c in coords}) for i in varying]
    contiguous = all(r == list(range(r[0], r[0] + len(r))) for r in ranges) and math.prod(map(len, ranges)) == n
    if contiguous and len(varying) == 1:
        axis = varying[0]
        if wraparound[axis] and n == topology[axis]:
            return Route(n, 2 * link, n // 2, "ring")
        return Route(n, link, n - 1, "line")
    if contiguous:
        return Route(n, 2 * link, n // 2, "grid")
    stride = max(max(r) - min(r) for r in ranges) // max(1, min(len(r) for r in ranges) - 1)
    return Route(n, link, (n - 1) * max(1, stride), "strided")


def _layout(mesh_shape: tuple[int, ...], topology: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Each mesh position's physical coordinates; a mesh that does not cover the slice has its positions in row-major
    order over the topology."""
    if math.prod(mesh_shape) != math.prod(topology):
        return tuple(unravel(p, topology) for p in range(math.prod(mesh_shape)))
    return mesh_coordinates(mesh_shape, topology)


def _group(axes, mesh_axes) -> list[int]:
    """Devices of the group through device 0: every device whose coordinates off `axes` are 0."""
    names = [name for name, _ in mesh_axes]
    shape = [size for _, size in mesh_axes]
    devices = []
    for d in range(math.prod(shape)):
        coords = unravel(d, shape)
        if all(c == 0 for c, name in zip(coords, names) if name not in axes):
            devices.append(d)
    return devices


def collective_seconds(kind: str, nbytes: float, r: Route, hop_latency: float) -> float:
    """Time of one collective whose per-chip buffer is `nbytes` (see `Collective.bytes`): its ICI part, and its
    DCN part when the group spans slices."""
    inside = nbytes / r.slices if kind == "all-to-all" else nbytes
    return _ici_seconds(kind, inside, r, hop_latency) + dcn_seconds(kind, nbytes, r)


def dcn_seconds(kind: str, nbytes: float, r: Route) -> float:
    """The part of one collective that crosses slices (0 inside one slice); see the module's docstring."""
    k = r.slices
    if k == 1:
        return 0.0
    if kind == "collective-permute":
        return nbytes / r.dcn_bandwidth
    if kind == "all-to-all":
        return nbytes * (k - 1) / k / r.dcn_bandwidth
    piece = nbytes / r.chips * (k - 1) / k
    return (2 if kind == "all-reduce" else 1) * piece / r.dcn_bandwidth


def _ici_seconds(kind: str, nbytes: float, r: Route, hop_latency: float) -> float:
    if r.chips == 1:
        return 0.0
    moved = nbytes * (r.chips - 1) / r.chips
    if kind == "all-reduce":
        return 2 * moved / r.bandwidth + 2 * r.hops * hop_latency
    if kind == "collective-permute":
        return nbytes / (r.bandwidth / 2 if r.shape in ("ring", "grid") else r.bandwidth) + hop_latency
    if kind == "all-to-all":
        if r.shape == "switch":
            return moved / r.bandwidth + r.hops * hop_latency
        return r.chips * nbytes / (4 * r.bandwidth) + r.hops * hop_latency  # ring/grid: bandwidth is 2W
    return moved / r.bandwidth + r.hops * hop_latency  # all-gather, reduce-scatter
