"""Which physical chip each mesh position is on inside one TPU slice, as ``xs.HybridMesh`` lays a mesh out.

meshlab's TPU programs run on ``xs.HybridMesh`` (meshlab.parallelisms.xla, and the export), which places the mesh with
torch_xla's ``_create_device_mesh_for_nd_torus(physical_mesh, mesh_shape, allow_split_physical_axes=True)`` over
the chips' torus coordinates (jax's ``mesh_utils`` algorithm): the mesh axes are taken last to first (the last
is the most communication-heavy), each onto whole physical axes whose sizes multiply to it, preferring more axes;
where none fit, physical axes are split. It is not a row-major reshape of the device ids (libtpu numbers chips x
fastest), and it differs from one on most meshes that are not the slice's own shape (v6e-8 as 4x2: the 4 runs
along the 4-chip physical axis).

Written here by hand because the cost model is pure Python (no numpy, no torch_xla, whose function is private
and imports torch); `tests/cost/test_device_layout.py` holds this port equal to torch_xla's function on every
catalog TPU system and every mesh shape of up to three axes, and to the layout HybridMesh's own code gives over
libtpu's ahead-of-time device coordinates.
"""

from __future__ import annotations

import itertools
import math
from functools import lru_cache

from meshlab.core.mesh import unravel

Coords = tuple[int, ...]


@lru_cache(maxsize=512)
def mesh_coordinates(mesh_shape: tuple[int, ...], topology: tuple[int, ...]) -> tuple[Coords, ...]:
    """The physical coordinates (in `topology`'s dims) of the chip at each row-major position of a mesh of
    `mesh_shape` covering one slice of `topology`."""
    physical = tuple(topology) + (1,) * (3 - len(topology))  # libtpu's coordinates are 3-D
    if math.prod(mesh_shape) != math.prod(physical):
        raise ValueError(f"a mesh of {mesh_shape} does not cover a {topology} slice")
    order = _whole_axes(mesh_shape, physical)
    if order is None:
        coords, shape = _split_axes(mesh_shape, physical)
    else:
        coords, shape = _transpose(_grid(physical), physical, order)
    if coords is None:  # torch_xla's layout fails (never on the catalog's systems): the devices in id order, x
        # fastest, as meshlab's TPU check (meshlab.workers.check_tpu.hybrid_mesh_ordinals) falls back
        coords = tuple(_x_fastest(i, physical) for i in range(math.prod(physical)))
    return tuple(c[:len(topology)] for c in coords)


def _grid(shape: tuple[int, ...]) -> tuple[Coords, ...]:
    """Every coordinate of `shape` in row-major order (the physical mesh, each entry its own coordinates)."""
    return tuple(itertools.product(*(range(n) for n in shape)))


def _x_fastest(index: int, shape: tuple[int, ...]) -> Coords:
    """Coordinates with the first dim varying fastest (a TPU's x): row-major over the reversed shape."""
    return unravel(index, shape[::-1])[::-1]


def _transpose(flat: tuple, shape: tuple[int, ...], order: list[int]) -> tuple[tuple | None, tuple[int, ...]]:
    """``np.transpose(a, order)`` of a row-major array given flat; None where `order` is not a permutation (where
    numpy raises)."""
    if sorted(order) != list(range(len(shape))):
        return None, shape
    new_shape = tuple(shape[a] for a in order)
    strides = [math.prod(shape[a + 1:]) for a in range(len(shape))]
    out = []
    for index in itertools.product(*(range(n) for n in new_shape)):
        out.append(flat[sum(i * strides[a] for i, a in zip(index, order))])
    return tuple(out), new_shape


def _whole_axes(mesh_shape: tuple[int, ...], physical: tuple[int, ...]) -> list[int] | None:
    """torch_xla's first pass: each mesh axis, last first, onto a set of whole physical axes (more axes first);
    the physical axes in the order the mesh axes take them, or None where an axis fits no set (then split)."""
    assignable = list(physical)
    assignment: list[tuple[int, ...]] = [() for _ in mesh_shape]
    for axis in reversed(range(len(mesh_shape))):
        for count in (3, 2, 1):
            for combo in itertools.combinations(enumerate(assignable), count):
                indices, sizes = zip(*combo)
                if math.prod(sizes) == mesh_shape[axis]:
                    assignment[axis] = indices
                    assignable = [0 if i in indices else v for i, v in enumerate(assignable)]
                    break
            if assignment[axis]:
                break
        else:
            if mesh_shape[axis] > 1:
                return None
    return [p for indices in assignment for p in indices]


def _split_axes(mesh_shape: tuple[int, ...], physical: tuple[int, ...]) -> tuple[tuple | None, tuple[int, ...]]:
    """torch_xla's ``_create_device_mesh_for_nd_torus_splitting_axes``: each mesh axis, last first, takes the
    feasible split of the physical axes its heuristics prefer; the mesh read out of that assignment."""
    assignment = [[1] * len(mesh_shape) for _ in physical]  # [physical axis][mesh axis] -> size
    for axis in reversed(range(len(mesh_shape))):
        best = None
        for candidate in _feasible(physical, assignment, mesh_shape[axis]):
            if best is None or _prefer(candidate, best, physical, assignment):
                best = candidate
        if best is None:  # torch_xla's layout fails too
            return None, physical
        for p, size in enumerate(best):
            assignment[p][axis] = size
    pieces = tuple(size for row in assignment for size in row)  # the physical mesh reshaped [p][l]
    order = [k for _, _, k in sorted((k % len(mesh_shape), k // len(mesh_shape), k) for k in range(len(pieces)))]
    return _transpose(_grid(physical), pieces, order)


def _feasible(physical: tuple[int, ...], assignment: list[list[int]], size: int):
    """Splits of `size` over the physical axes' room left, by prime factor (torch_xla's enumeration)."""
    factors: dict[int, int] = {}
    for f in _prime_factors(size):
        factors[f] = factors.get(f, 0) + 1
    room = [n // math.prod(row) for n, row in zip(physical, assignment)]
    by_factor: dict[int, list[int]] = {}
    for p, n in enumerate(room):
        for f in _prime_factors(n):
            if f in factors:
                by_factor.setdefault(f, []).append(p)
    choices = [set(itertools.combinations(by_factor.get(f, []), m)) for f, m in factors.items()]
    for picked in itertools.product(*choices):
        result = [1] * len(physical)
        for f, axes in zip(factors, picked):
            for p in axes:
                result[p] *= f
        yield result


def _prefer(x: list[int], y: list[int], physical: tuple[int, ...], assignment: list[list[int]]) -> bool:
    """torch_xla's ``_prefer_first_logical_axis_assignment``."""
    def whole(a):
        return math.prod(s for i, s in enumerate(a) if s == physical[i])

    def whole_count(a):
        return sum(1 for i, s in enumerate(a) if s == physical[i] and s > 1)

    taken = [math.prod(row) for row in assignment]

    def overlapping(a):
        return math.prod(s for i, s in enumerate(a) if taken[i] > 1)

    for key in (whole, whole_count, overlapping):
        if key(x) != key(y):
            return key(x) > key(y)
    return tuple(x) > tuple(y)


def _prime_factors(n: int) -> list[int]:
    factors = []
    for p in range(2, math.isqrt(n) + 2):
        while n % p == 0:
            factors.append(p)
            n //= p
        if n == 1:
            return factors
    return [n]
