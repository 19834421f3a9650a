"""Measured GEMM rates on a grid of shapes, and the interpolation between them (`MatmulRates`).

A hardware entry may carry the FLOP/s one bf16 GEMM reaches at each shape of a measured grid (``matmul_rates`` in
``meshlab/data/hardware.yaml``, with its source); the cost model prices each Linear at the rate of its shard's
shape. Written by hand because the planning path imports no numpy or scipy (`try` answers in a quarter of a second):
scipy's RegularGridInterpolator over log rates and log dims would do the same interpolation, not the rules at the
edges (below the grid the trend continues, above it the largest shape's rate holds).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class MatmulRates:
    """Measured FLOP/s of one bf16 GEMM ``[m, k] x [k, n]`` on a grid of shapes: `rates` holds one figure per
    (m, n, k) point, m-major then n then k. `rate` interpolates log rate linearly in the log of each dim. Below
    the grid along a dim it continues the trend of that dim's first two points (small GEMMs run at a falling rate:
    on the sm_90 table, halving m from 512 to 256 rows takes 0.79 of the time, not half; the HBM roofline still
    bounds a tiny one from below); above the grid the largest measured shape's rate stands (the table flattens
    there, and a trend would pass the peak)."""

    m: tuple[int, ...]
    n: tuple[int, ...]
    k: tuple[int, ...]
    rates: tuple[float, ...]

    def problems(self) -> list[str]:
        grid = [("m", self.m), ("n", self.n), ("k", self.k)]
        problems = [f"matmul_rates {name} ({list(axis)}) must be positive whole numbers, increasing"
                    for name, axis in grid
                    if not axis or not all(_is_int(x) and x >= 1 for x in axis) or list(axis) != sorted(set(axis))]
        if not problems and len(self.rates) != len(self.m) * len(self.n) * len(self.k):
            problems.append(f"matmul_rates has {len(self.rates)} rates for a {len(self.m)} x {len(self.n)} x "
                            f"{len(self.k)} grid")
        if not problems and not all(isinstance(r, float) and math.isfinite(r) and r > 0 for r in self.rates):
            problems.append("matmul_rates must all be positive FLOP/s")
        return problems

    def rate(self, m: int, k: int, n: int) -> float:
        """FLOP/s of a ``[m, k] x [k, n]`` GEMM (a Linear's tokens, in and out features, as `Work.shape` has them)."""
        (i, ti), (j, tj), (l, tl) = (_bracket(axis, x) for axis, x in ((self.m, m), (self.n, n), (self.k, k)))
        nn, nk = len(self.n), len(self.k)
        corners = [(wa * wb * wc, self.rates[(a * nn + b) * nk + c])
                   for a, wa in ((i, 1 - ti), (i + 1, ti)) for b, wb in ((j, 1 - tj), (j + 1, tj))
                   for c, wc in ((l, 1 - tl), (l + 1, tl)) if wa * wb * wc]
        if len(corners) == 1:  # a grid point, exactly as measured
            return corners[0][1]
        return math.exp(sum(weight * math.log(rate) for weight, rate in corners))

    def stretch(self, m: int, k: int, n: int) -> tuple[float, float]:
        """How many times below and above the measured grid the shape lies along its farthest dim (1: within)."""
        dims = ((self.m, m), (self.n, n), (self.k, k))
        return max(max(axis[0] / x, 1.0) for axis, x in dims), max(max(x / axis[-1], 1.0) for axis, x in dims)

    def to_json(self) -> dict[str, Any]:
        nn, nk = len(self.n), len(self.k)
        return {"m": list(self.m), "n": list(self.n), "k": list(self.k),
                "flops": [[list(self.rates[(a * nn + b) * nk:(a * nn + b + 1) * nk]) for b in range(nn)]
                          for a in range(len(self.m))]}


def _bracket(axis: tuple[int, ...], x: float) -> tuple[int, float]:
    """(index of the grid point at or below `x`, fraction of the way to the next in log x): negative below the
    grid (the first two points' trend continues), held at the top."""
    if len(axis) == 1:
        return 0, 0.0
    if x < axis[0]:
        return 0, math.log(x / axis[0]) / math.log(axis[1] / axis[0])
    if x >= axis[-1]:
        return len(axis) - 2, 1.0
    i = max(j for j, point in enumerate(axis) if point <= x)
    return i, math.log(x / axis[i]) / math.log(axis[i + 1] / axis[i])


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
