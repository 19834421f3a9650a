"""Measured op profiles (`meshlab profile`): reading one, checking it, and pricing a plan's ops from it. Pure.

A profile is a JSON file of points measured on one device, each an op class at a shape with its FLOPs, bytes and
seconds, plus one fitted curve per op class (seconds = latency + size / rate over the sizes measured). It names
its device (platform, device count, the catalog entry for a GPU or TPU, the host's cores and memory) and the
plan it was measured for (model config, mesh, rules, image tokens, dtype), so its points are that plan's shard
shapes.

Two ways to price one transformer call from it:

- **blocks**: the transformer under the plan at one block per list (the "outer" point: embeddings, one block,
  output) and at three ("stack"), each compiled and timed whole, as many calls in one program as a step makes, at
  a few text lengths. A call of depth L costs outer + (L - 1) x the slope between the two, interpolated between
  text lengths (each block timed alone stands in when there is no stack point). On an XLA device a fused program
  is not the sum of its ops, and collectives inside the blocks are measured with them. Used when the plan, image
  tokens and dtype are the profile's.
- **ops**: each Linear and attention priced from its measured point at that shape, else interpolated along
  tokens between points of the same weight shape, else from its class's curve; the rest of the call's work
  (norm weights) at the measured copy bandwidth; each collective from its measured points over its axes, else
  as the topology model times it.

Measured on this machine's CPU (torch_xla, 1 device, benchmarks/cpu_validation.py): blocks composes within 5% of
a full run, each block timed alone about 19% over, and op by op about 35% over (each op alone pays its own dtype
conversions and dispatch, which XLA fuses away in a whole program), so blocks is used wherever it applies.

Anything priced outside the measured range says how far it extrapolates (`Priced.stretch`).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from meshlab.core.errors import BackendError, InputError
from meshlab.core.files import is_device
from meshlab.strategy.closed import first_problem

FORMAT = 1
#: Op classes a profile may hold, with their shapes. linear / attention: as `Work.shape` gives it; outer / block:
#: (image tokens, text tokens, calls in one program) for the whole call at one block per list / one block alone;
#: stack: the same with a fourth figure, the blocks per list of a deeper whole call; vae_decode: (height, width);
#: collective (label "<kind> over <axes>"): (group size, bytes per chip); dispatch: an empty program's trace and
#: run; copy: device memory read + write; host_matmul: the host CPU's Linear at the text encoder's width;
#: host_transfer: device to host.
OPS = ("linear", "attention", "collective", "outer", "block", "stack", "vae_decode", "dispatch", "copy", "host_matmul",
       "host_transfer")
#: Which figure a point's size is: FLOPs, bytes, or text tokens.
BASIS = {"linear": "flops", "attention": "flops", "collective": "bytes", "outer": "tokens", "block": "tokens",
         "stack": "tokens", "vae_decode": "flops", "copy": "bytes", "host_matmul": "flops", "host_transfer": "bytes"}
#: Op classes priced from their own points rather than a class curve: the call points over text tokens, and each
#: collective over its own axes.
NOT_FITTED = ("outer", "block", "stack", "collective")
FIX = "measure it again with `meshlab profile STRATEGY -o FILE.json`"


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


# ---- the file ----


def profile_document(device: dict, versions: dict, plan: dict, points: tuple[Point, ...], duration_s: float) -> dict:
    """The JSON a profile file holds (curves fitted here, so the file says what the cost model will use), checked
    against the model the loader reads (ProfileFile) before anything is written."""
    document = {"meshlab_profile": FORMAT, "device": device, "versions": versions, "plan": plan,
                "duration_s": duration_s, "points": [p.to_json() for p in points],
                "curves": {op: c.to_json() for op, c in fit_all(points).items()}}
    try:
        ProfileFile.model_validate(document)  # the writer and the reader agree, or this is meshlab's bug
    except ValidationError as exc:
        loc, _kind, message = first_problem(exc, document)
        raise BackendError(f"the profile just measured would not load back ({'.'.join(map(str, loc))}: {message})",
                           "a bug in meshlab, not in the strategy: report it with the strategy and the device") \
            from None
    return document


def load_profile(path: str | Path) -> Profile:
    """A profile file, checked; anything wrong is an InputError naming the file and the fix."""
    path = Path(path)
    if path.is_dir() or is_device(path):  # a folder fails, a device never ends; a pipe is read
        raise InputError(f"{path}: a {'folder' if path.is_dir() else 'device'}, not a profile", FIX)
    try:
        raw = path.read_bytes()
        data = json.loads(raw.decode("utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: no such profile", "measure it with `meshlab profile STRATEGY -o FILE.json`") \
            from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path}: not a readable profile (corrupt or truncated: {exc})", FIX) from None
    try:
        return replace(_profile(path, data), digest=hashlib.sha256(raw).hexdigest()[:16])
    except ValueError as exc:
        raise InputError(f"{path}: not a meshlab profile ({exc})", FIX) from None


#: How many figures a shape has, where the op class fixes it, and which of them count calls or blocks (>= 1).
ARITY = {"outer": 3, "block": 3, "stack": 4, "vae_decode": 2, "collective": 2}
COUNTS = {"outer": (2,), "block": (2,), "stack": (2, 3)}

_Amount = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class _File(BaseModel):
    """A part of the profile file: strict (JSON meshlab wrote: no conversions), extra keys kept."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=True)


class PointFile(_File):
    """One measured point as the file holds it."""

    op: Literal[OPS]
    shape: list[Annotated[int, Field(ge=0)]] = Field(min_length=1)
    flops: _Amount
    bytes: _Amount
    seconds: Annotated[float, Field(gt=0, allow_inf_nan=False)]
    label: str = ""

    @model_validator(mode="after")
    def _shape_fits_its_op(self) -> PointFile:
        """The op class fixes how many figures the shape has, and which count calls or blocks (>= 1)."""
        if self.op in ARITY and len(self.shape) != ARITY[self.op]:
            raise ValueError(f"a {self.op} point has shape {self.shape}, not {ARITY[self.op]} figures")
        if any(self.shape[i] < 1 for i in COUNTS.get(self.op, ())):
            raise ValueError(f"a {self.op} point has shape {self.shape}: its calls and blocks are at least 1")
        return self


class DeviceFile(_File):
    """The device the points were measured on (name, hardware, host, cores and backend kept as written)."""

    platform: Literal["cpu", "cuda", "tpu"]
    devices: int = Field(ge=1)
    memory_bytes: Optional[int] = Field(None, ge=0)  # 0: not known


class ProfileFile(_File):
    """A profile file (format 1), as `meshlab profile` writes it (``profile_document``)."""

    meshlab_profile: Literal[1]
    device: DeviceFile
    versions: Optional[dict[str, Any]] = None  # null in older files: none recorded
    plan: dict[str, Any]
    duration_s: _Amount = 0.0
    points: list[PointFile]
    curves: Any = None  # written for the reader's eye; the loader fits them again from the points


def _profile(path: Path, data: object) -> Profile:
    """The profile the file's data describes; what is wrong is a ValueError naming the first problem's field."""
    if not isinstance(data, dict) or data.get("meshlab_profile") != FORMAT:
        found = data.get("meshlab_profile") if isinstance(data, dict) else None
        raise ValueError(f"format {found!r}, this meshlab reads format {FORMAT}")
    try:
        checked = ProfileFile.model_validate(data)
    except ValidationError as exc:
        loc, _kind, message = first_problem(exc, data)
        raise ValueError(f"{'.'.join(str(part) for part in loc) or 'the profile'}: {message}") from None
    points = tuple(Point(p.op, tuple(p.shape), p.flops, p.bytes, p.seconds, p.label) for p in checked.points)
    return Profile(str(path), checked.device.model_dump(), dict(checked.versions or {}), dict(checked.plan), points,
                   fit_all(points), checked.duration_s)


def plan_key(model_digest: str, mesh: dict, rules: list, activations: dict, image_tokens: int, batch: int,
             dtype: str, cfg_axis: bool) -> str:
    """What makes a profile's outer and block points this plan's: the same shard shapes at every text length."""
    import hashlib

    identity = json.dumps([model_digest, mesh, rules, activations, image_tokens, batch, dtype, cfg_axis],
                          sort_keys=True, default=str)
    return hashlib.sha256(identity.encode()).hexdigest()[:16]


# ---- pricing a call ----


@dataclass(frozen=True)
class MeasuredCall:
    """One transformer call on one chip, priced from a profile."""

    basis: str  # "blocks" (the call compiled and timed whole) or "ops" (op by op)
    seconds: float
    collectives_included: bool  # blocks on several devices: the collectives ran inside what was timed
    measured: tuple[str, ...]  # what the figure rests on that was measured
    assumed: tuple[str, ...]  # what fell back to the catalog's assumed efficiencies
    stretch: float = 1.0  # the largest extrapolation beyond the measured sizes (1: none)
    note: str = ""
    #: collectives of a call and step priced from measured points, and those priced by the topology model (when
    #: they are not inside the timed call)
    collectives_measured: int = 0
    collectives_assumed: int = 0


def price_call(profile: Profile, key: str, blocks: dict[str, int], text_tokens: float, work: tuple,
               fallback, calls: int = 1) -> MeasuredCall:
    """A call of `blocks` (list -> blocks) at `text_tokens`, by blocks when the profile measured this plan (`key`),
    else op by op; `fallback(work)` gives an op's seconds from the catalog's assumptions."""
    if profile.plan.get("key") == key and profile.of("outer"):
        priced = by_blocks(profile, blocks, text_tokens, calls)
        if priced is not None:
            return priced
    note = ("" if profile.plan.get("key") == key else
            f"the profile was measured for {profile.plan.get('strategy')!r} at {profile.plan.get('image_tokens')} "
            "image tokens; this plan's call is priced op by op")
    return by_ops(profile, work, fallback, note)


def by_blocks(profile: Profile, blocks: dict[str, int], text_tokens: float, calls: int = 1) -> MeasuredCall | None:
    """Seconds per call: the one-block call plus each further block at the slope between it and the deeper call
    (shared among block lists as their blocks alone compare), else at a block alone's time."""
    outer = profile.sequence("outer", text_tokens, calls=calls)
    if outer is None:
        return None
    seconds, stretch, measured = outer.seconds, outer.stretch, [f"one-block call ({outer.how})"]
    alone = {name: profile.sequence("block", text_tokens, name, calls) for name in blocks}
    stack = profile.sequence("stack", text_tokens, calls=calls)
    if stack is not None:
        depth = max(p.shape[3] for p in profile.of("stack"))
        slope = (stack.seconds - outer.seconds) / (depth - 1)
        known = {n: a.seconds for n, a in alone.items() if a is not None}
        share = {n: known[n] / sum(known.values()) if len(known) == len(blocks) and sum(known.values()) else
                 1 / len(blocks) for n in blocks}
        stretch = max(stretch, stack.stretch)
        per_block = {n: slope * share[n] for n in blocks}  # the slope adds one block to every list
        measured.append(f"{depth}-block call ({stack.how})")
        how = f"a block at the slope between the 1- and {depth}-block calls"
    elif all(a is not None for a in alone.values()):
        per_block = {n: a.seconds for n, a in alone.items()}
        stretch = max([stretch] + [a.stretch for a in alone.values()])
        how = "each further block timed alone"
    else:
        return None
    for name, count in blocks.items():
        if count > 1:
            seconds += (count - 1) * per_block[name]
            measured.append(f"{name} x {count - 1}")
    return MeasuredCall("blocks", seconds, profile.devices > 1, tuple(measured), (), stretch,
                        f"the call at one block per list, plus {how}, at the plan's shapes")


def by_ops(profile: Profile, work: tuple, fallback, note: str = "") -> MeasuredCall:
    seconds, stretch, measured, assumed = 0.0, 1.0, [], []
    copy = profile.rate("copy")
    for w in work:
        priced = profile.op_seconds(w.kind, w.shape, w.flops) if w.kind in ("linear", "attention") else None
        if priced is None and w.kind in ("other", "elementwise") and copy:
            priced = Priced(w.hbm_bytes / copy, "fitted")
        if priced is None:
            seconds += w.count * fallback(w)
            assumed.append(w.name)
            continue
        seconds += w.count * priced.seconds
        stretch = max(stretch, priced.stretch)
        measured.append(w.name)
    return MeasuredCall("ops", seconds, False, tuple(measured), tuple(assumed), stretch, note)


# ---- a profile as a hardware entry ----


def profile_hardware(path: str | Path, devices: int | None, overrides: dict | None = None):
    """The hardware entry a profile stands for: a GPU's or TPU's catalog entry with the profile's measured host
    figures, or (CPU) an entry made of the profile's measured rates; the profile rides along for the cost model.
    `devices`: what the strategy's mesh uses (None: not known yet)."""
    from meshlab.core.hardware import load_hardware

    profile = load_profile(path)
    if devices is not None and devices != profile.devices:
        raise InputError(f"{path} was measured on {profile.devices} {profile.platform} device(s), and this mesh uses "
                         f"{devices}: devices sharing a host do not run at one device's rates",
                         f"profile a strategy with a {devices}-device mesh (meshlab profile STRATEGY -o FILE.json)")
    source = f"measured: meshlab profile {Path(path).name}"
    host = {}
    for op, figure in (("host_matmul", "host_flops"), ("host_transfer", "host_link_bandwidth")):
        if rate := profile.rate(op):
            host[figure] = rate
    dispatch = profile.single("dispatch")
    if dispatch is not None:
        host["step_overhead_s"] = dispatch.seconds
    if profile.platform != "cpu":
        if not profile.device.get("hardware"):
            raise InputError(f"{path} names no catalog entry for its {profile.platform} device",
                             "profile again with --hardware NAME (meshlab hardware lists them)")
        base = load_hardware(str(profile.device["hardware"])).using(profile.devices)
        hardware = replace(base, **host, sources={**base.sources, **{k: source for k in host}},
                           name=f"{base.name} (profile {Path(path).name})")
    else:
        hardware = _cpu_hardware(profile, host, source, Path(path).name)
    if overrides:
        from meshlab.core.hardware import with_overrides

        hardware = with_overrides(hardware, overrides)
    return replace(hardware, profile=profile)


def _cpu_hardware(profile: Profile, host: dict, source: str, name: str):
    from meshlab.core.hardware import Hardware

    linear, copy = profile.rate("linear"), profile.rate("copy")
    if not linear or not copy:
        raise InputError(f"{profile.path} holds no linear or copy points, which a CPU entry is made of", FIX)
    memory = int(profile.device.get("memory_bytes") or 0) or 2**34
    n = profile.devices
    assumed = "assumption: not measured by meshlab profile"
    sources = {
        "interconnect": "the virtual devices share the host's memory: any reaches any (modelled as a switch)",
        "chips": source, "hosts": source, "ici_links": assumed, "topology": source, "wraparound": assumed,
        "hbm_bytes": "the host's memory shared by its virtual devices", "usable_hbm_bytes": "as hbm_bytes",
        "runtime_reserve_bytes": assumed, "host_memory_bytes": source,
        "hbm_bandwidth": f"{source} (copy)", "bf16_flops": f"{source} (linear curve's rate)",
        "ici_link_bandwidth": f"{assumed}; the copy rate", "dcn_bandwidth_per_host": "not applicable: one host",
        "host_link_bandwidth": host.get("host_link_bandwidth") and source or assumed,
        "host_flops": host.get("host_flops") and source or assumed,
        "compute_efficiency": "1: bf16_flops is already the rate reached", "hbm_efficiency": "1: as bf16_flops",
        "collective_latency_s": assumed, "step_overhead_s": source if "step_overhead_s" in host else assumed,
        "checkpoint_read_bandwidth": assumed, "compile_seconds_base": assumed, "compile_seconds_per_block": assumed,
    }
    return Hardware(
        name=f"cpu-{n} (profile {name})", kind="cpu", chip=str(profile.device.get("name") or "host CPU"),
        interconnect="nvswitch", chips=n, hosts=1, ici_links=1, topology=(n,), wraparound=(True,),
        hbm_bytes=memory // n, usable_hbm_bytes=memory // n, runtime_reserve_bytes=0, host_memory_bytes=memory,
        hbm_bandwidth=copy, bf16_flops=linear, ici_link_bandwidth=copy, dcn_bandwidth_per_host=1.0,
        host_link_bandwidth=host.get("host_link_bandwidth", copy), host_flops=host.get("host_flops", linear),
        compute_efficiency=1.0, hbm_efficiency=1.0, collective_latency_s=1e-5,
        step_overhead_s=host.get("step_overhead_s", 1e-3), checkpoint_read_bandwidth=1e9, compile_seconds_base=0.0,
        compile_seconds_per_block=0.0, sources=sources)
