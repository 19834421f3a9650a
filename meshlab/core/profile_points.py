"""A measured profile's values: its points (an op class at a shape, with FLOPs, bytes and seconds), the curve fitted
to each op class (seconds = latency + size / rate, least squares), and the profile with its lookups (measured,
interpolated or fitted, with how far each figure extrapolates). Pure. The file format is
``meshlab.core.profile_file``; pricing a plan's call from a profile is ``meshlab.cost.profile``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

#: Op classes a profile may hold, with their shapes. linear / attention: as `Work.shape` gives it; outer / block:
#: (image tokens, text tokens, calls in one program) for the whole call at one block per list / one block alone;
#: stack: the same with a fourth figure, the blocks per list of a deeper whole call; vae_decode: (height, width);
#: collective (label "<kind> over <axes>"): (group size, bytes per chip); dispatch: an empty program's trace and
#: run; copy: device memory read + write; host_matmul: the host CPU's Linear at the text encoder's width;
#: host_transfer: device to host; launch (eager PyTorch on a GPU): (ops,), the host's seconds to issue one forward of
#: that many ops the card traced, its kernels queued and not waited for.
OPS = ("linear", "attention", "collective", "outer", "block", "stack", "vae_decode", "dispatch", "copy", "host_matmul",
       "host_transfer", "launch")
#: Which figure a point's size is: FLOPs, bytes, or text tokens.
BASIS = {"linear": "flops", "attention": "flops", "collective": "bytes", "outer": "tokens", "block": "tokens",
         "stack": "tokens", "vae_decode": "flops", "copy": "bytes", "host_matmul": "flops", "host_transfer": "bytes"}
#: Op classes priced from their own points rather than a class curve: the call points over text tokens, and each
#: collective over its own axes.
NOT_FITTED = ("outer", "block", "stack", "collective")


@dataclass(frozen=True)
class Point:
    op: str
    shape: tuple[int, ...]
    flops: float
    bytes: float
    seconds: float
    label: str = ""  # block points: the block list

    def size(self) -> float:
        basis = BASIS.get(self.op, "flops")
        return self.shape[1] if basis == "tokens" else (self.bytes if basis == "bytes" else self.flops)

    def to_json(self) -> dict:
        return {"op": self.op, "shape": list(self.shape), "flops": self.flops, "bytes": self.bytes,
                "seconds": self.seconds, **({"label": self.label} if self.label else {})}


@dataclass(frozen=True)
class Curve:
    """seconds = latency_s + size / rate, least squares over one op class's points; measured over [low, high]."""

    op: str
    latency_s: float
    rate: float
    low: float
    high: float

    def seconds(self, size: float) -> float:
        return self.latency_s + size / self.rate

    def stretch(self, size: float) -> float:
        """How far outside the measured sizes `size` is, as a ratio (1: inside)."""
        if size <= 0 or self.low <= 0:
            return 1.0
        return max(size / self.high, self.low / size, 1.0)

    def to_json(self) -> dict:
        return {"basis": BASIS.get(self.op, "flops"), "latency_s": self.latency_s, "rate": self.rate,
                "low": self.low, "high": self.high}


@dataclass(frozen=True)
class Priced:
    """An op's (or a call's) seconds from a profile, and how: measured, interpolated, fitted (a curve)."""

    seconds: float
    how: str
    stretch: float = 1.0  # > 1: extrapolated that many times beyond the measured sizes


@dataclass(frozen=True)
class Profile:
    path: str
    device: dict  # platform, devices, name, hardware (a catalog name or None), host, cores, memory_bytes
    versions: dict
    plan: dict  # key, strategy, model, mesh, image_tokens, height, width, dtype, text_tokens
    points: tuple[Point, ...]
    curves: dict = field(default_factory=dict)  # op -> Curve
    duration_s: float = 0.0
    digest: str = ""  # of the file's bytes: which measurement a run's prediction came from

    @property
    def platform(self) -> str:
        return str(self.device["platform"])

    @property
    def devices(self) -> int:
        return int(self.device["devices"])

    def of(self, op: str, label: str | None = None) -> list[Point]:
        return [p for p in self.points if p.op == op and (label is None or p.label == label)]

    def single(self, op: str) -> Point | None:
        points = self.of(op)
        return min(points, key=lambda p: p.seconds) if points else None

    def rate(self, op: str) -> float | None:
        """The op class's fitted rate (FLOP/s or bytes/s), None when it was not measured."""
        curve = self.curves.get(op)
        return curve.rate if curve else None

    def op_seconds(self, op: str, shape: tuple[int, ...], size: float) -> Priced | None:
        """A Linear's or attention's seconds at `shape` (whose FLOPs are `size`), None when nothing was measured."""
        exact = [p for p in self.of(op) if p.shape == tuple(shape)]
        if exact:
            return Priced(exact[0].seconds, "measured")
        if op == "linear" and len(shape) == 3:  # same weight shape at other token counts
            along = sorted((p.shape[0], p.seconds) for p in self.of(op) if p.shape[1:] == tuple(shape[1:]))
            if len(along) >= 2:
                seconds, stretch = interpolate(along, shape[0])
                return Priced(max(seconds, 0.0), "interpolated", stretch)
        curve = self.curves.get(op)
        if curve is None:
            return None
        return Priced(curve.seconds(size), "fitted", curve.stretch(size))

    def collective_seconds(self, kind: str, axes: tuple[str, ...], nbytes: float) -> Priced | None:
        """One collective of `kind` over `axes` moving a per-chip buffer of `nbytes`: measured at that size,
        interpolated between sizes, or (one size) scaled by bytes; None when that kind over those axes was not."""
        along = sorted((p.bytes, p.seconds) for p in self.of("collective", f"{kind} over {','.join(axes)}"))
        if not along:
            return None
        exact = [s for b, s in along if b == nbytes]
        if exact:
            return Priced(exact[0], "measured")
        if len(along) == 1:
            (b, s), = along
            return Priced(s * nbytes / b, "fitted", max(nbytes / b, b / max(nbytes, 1.0)))
        seconds, stretch = interpolate(along, nbytes)
        return Priced(max(seconds, 0.0), "interpolated", stretch)

    def sequence(self, op: str, text_tokens: float, label: str = "", calls: int = 1) -> Priced | None:
        """An outer or block point's seconds per call at `text_tokens`, interpolated between the measured text
        lengths; points timed at `calls` calls per program when there are any (else per call of what there is)."""
        points = self.of(op, label)
        same = [p for p in points if _calls(p) == calls]
        along = sorted((p.shape[1], p.seconds / _calls(p)) for p in (same or points))
        if not along:
            return None
        if len(along) == 1:
            exact = along[0][0] == text_tokens
            return Priced(along[0][1], "measured" if exact else "fitted", 1.0 if exact else
                          max(text_tokens / along[0][0], along[0][0] / max(text_tokens, 1)))
        seconds, stretch = interpolate(along, text_tokens)
        how = "measured" if any(t == text_tokens for t, _ in along) else "interpolated"
        return Priced(max(seconds, 0.0), how, stretch)


def _calls(point: Point) -> int:
    """Transformer calls an outer or block point ran in one program (its shape's third figure; 1 when absent)."""
    return point.shape[2] if len(point.shape) > 2 else 1


def interpolate(points: list[tuple[float, float]], x: float) -> tuple[float, float]:
    """Piecewise-linear through sorted (x, y) points; beyond them the nearest segment's line, with how far
    outside the measured xs `x` lies as a ratio (1 inside)."""
    xs = [p[0] for p in points]
    if x <= xs[0]:
        (x0, y0), (x1, y1) = points[0], points[1]
        stretch = xs[0] / x if x > 0 else math.inf
    elif x >= xs[-1]:
        (x0, y0), (x1, y1) = points[-2], points[-1]
        stretch = x / xs[-1]
    else:
        i = next(i for i in range(1, len(xs)) if xs[i] >= x)
        (x0, y0), (x1, y1) = points[i - 1], points[i]
        stretch = 1.0
    y = y0 if x1 == x0 else y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return y, max(stretch, 1.0)


def fit(op: str, points: list[Point]) -> Curve | None:
    """Least squares of seconds = latency + size / rate over `points` (latency >= 0); None without two sizes."""
    sizes = [p.size() for p in points]
    if len(set(sizes)) < 2:
        if len(points) == 1 and sizes[0] > 0 and points[0].seconds > 0:
            return Curve(op, 0.0, sizes[0] / points[0].seconds, sizes[0], sizes[0])
        return None
    mean_x, mean_y = sum(sizes) / len(sizes), sum(p.seconds for p in points) / len(points)
    spread = sum((x - mean_x) ** 2 for x in sizes)
    slope = sum((x - mean_x) * (p.seconds - mean_y) for x, p in zip(sizes, points)) / spread
    latency = mean_y - slope * mean_x
    if slope <= 0 or latency < 0:  # noise at close sizes, or no fixed cost: through the origin instead
        slope, latency = sum(x * p.seconds for x, p in zip(sizes, points)) / sum(x * x for x in sizes), 0.0
    return Curve(op, latency, 1.0 / slope, min(sizes), max(sizes))


def fit_all(points: tuple[Point, ...]) -> dict[str, Curve]:
    curves = {}
    for op in OPS:
        if op in BASIS and op not in NOT_FITTED:
            curve = fit(op, [p for p in points if p.op == op])
            if curve is not None:
                curves[op] = curve
    return curves
