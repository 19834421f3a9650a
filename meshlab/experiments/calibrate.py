"""Calibrate the time model's efficiency and host overhead from recorded runs (`meshlab calibrate`). Pure.

Model: a measured steady step = k x (predicted per-op compute/HBM time) + predicted collective time + o, or in
eager PyTorch the host's predicted time to dispatch the step's ops where that is longer (a step bound by its
launches says nothing about k, so the fit leaves such steps out, and refuses when none remain).
k > 1 means the chip reached a smaller fraction of its peak than the catalog assumes: the calibrated
efficiencies are the catalog's divided by k, and so are the published attention rates of the entry's kernel and
its measured GEMM rates (where it has them, attention and Linears are priced from those, not from
compute_efficiency). o is the host overhead per step. Least squares over the records (k alone, with o kept, when
there is one record). Only runs on the hardware their prediction is for count.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from pydantic import Field

from meshlab.core.document import Document
from meshlab.core.errors import InputError
from meshlab.core.hardware import MatmulRates, load_hardware
from meshlab.core.hardware_figures import HardwareFigures
from meshlab.experiments.comparable import comparison_problem
from meshlab.experiments.records import RunRecord


@dataclass(frozen=True)
class Point:
    local_s: float  # predicted per-op compute/HBM time per step
    collective_s: float
    overhead_s: float
    measured_s: float  # measured steady step (median)
    launch_floor_s: float = 0.0  # eager: the host's predicted time to dispatch the step's ops (0: compiled)

    def launch_bound(self) -> bool:
        """Does the catalog's prediction put this step below the host's launches?"""
        return self.launch_floor_s > self.local_s + self.collective_s


@dataclass(frozen=True)
class Calibration:
    hardware: str
    points: int
    slowdown: float  # k
    overhead_s: float  # o
    compute_efficiency: float
    hbm_efficiency: float
    error_before_pct: float  # mean |predicted - measured| / measured, catalog figures
    error_after_pct: float
    #: the entry's attention kernel and its published rates divided by k ("" and () when it has none)
    attention_kernel: str = ""
    attention_rates: tuple[tuple[int, float], ...] = ()
    #: the entry's measured GEMM rates divided by k (None when it has none)
    matmul_rates: MatmulRates | None = None

    def overrides(self) -> dict:
        rates = ({"attention_kernel": self.attention_kernel,
                  "attention_rates": {self.attention_kernel: [[n, float(f"{r:.4g}")] for n, r in self.attention_rates]}}
                 if self.attention_kernel else {})
        if self.matmul_rates is not None:
            rates["matmul_rates"] = replace(self.matmul_rates, rates=tuple(
                float(f"{r:.4g}") for r in self.matmul_rates.rates)).to_json()
        return {"name": self.hardware, "compute_efficiency": round(self.compute_efficiency, 4),
                "hbm_efficiency": round(self.hbm_efficiency, 4), "step_overhead_s": round(self.overhead_s, 6),
                **rates}


class CalibratedFigures(HardwareFigures):
    """The catalog entry's name and the figures the calibration sets (a strategy's `hardware:` block)."""

    name: str


class CalibrationDocument(Document):
    """`meshlab calibrate --json`: the fit, the overrides it gives, and the error before and after."""

    points: int = Field(description="the recorded runs the fit rests on")
    slowdown: float = Field(description="measured steps over the predicted compute/HBM time")
    overrides: CalibratedFigures
    error_before_pct: float
    error_after_pct: float


def calibration_document(result: Calibration) -> dict:
    return {"points": result.points, "slowdown": result.slowdown, "overrides": result.overrides(),
            "error_before_pct": result.error_before_pct, "error_after_pct": result.error_after_pct}


def comparable_points(records: tuple[RunRecord, ...], hw) -> list[Point]:
    """Points from ok runs of exactly the work predicted for the entry `hw`: its kind of chip and chip count, and
    the predicted model, config, batch and dtype (meshlab.experiments.comparable)."""
    return [Point(r.prediction.local_s, r.prediction.collective_s, r.prediction.overhead_s,
                  r.timings.steady_step_median_s, r.prediction.launch_floor_s or 0.0)
            for r in records if _problem(r, hw) is None]


def _problem(record: RunRecord, hw) -> str | None:
    """Why a record is not a point for `hw` (None: it is one)."""
    prediction = record.prediction
    problem = comparison_problem(record)  # ran elsewhere, or did not finish: the clearest reason first
    if problem is not None:
        return problem
    if prediction.hardware != hw.name:
        return "predicted for other hardware"
    if hw.profile is not None and prediction.profile_digest is None:
        return "recorded before runs named their profile's content, so which measurement priced it is unknown"
    if hw.profile is not None and prediction.profile_digest != hw.profile.digest:
        return f"predicted from another measurement than {hw.profile.path} (its content differs)"
    if not record.timings.steady_step_median_s or prediction.local_s is None:
        return "no steady step or no predicted local time"
    return None


def entry(hardware: str):
    """A catalog entry by name, or the entry a profile file stands for (its runs' predictions name it so): with a
    profile, a slowdown near 1 says the profile and the recorded runs agree on this device."""
    if hardware.endswith(".json"):
        from meshlab.core.profile_hardware import profile_hardware

        return profile_hardware(hardware, None)
    return load_hardware(hardware)


def calibrate(records: tuple[RunRecord, ...], hardware: str) -> Calibration:
    hw = entry(hardware)  # read once (a profile is a file); an unknown name is an error naming the catalog
    points = comparable_points(records, hw)
    if not points:
        reasons = sorted({_problem(r, hw) or "" for r in records} - {""})
        raise InputError(
            f"none of the {len(records)} records ran what was predicted for {hardware} ({'; '.join(reasons[:3])})",
            f"run `meshlab run` on the device with {hardware} as the strategy's hardware first" if hw.profile
            is not None else f"record steady-state runs on {hardware} with `meshlab run` first; CPU runs say "
            "nothing about a TPU",
        )
    if all(p.launch_bound() for p in points):
        raise InputError(
            f"all {len(points)} comparable records of {hardware} are bound by eager PyTorch's launches (their "
            "predicted launch_floor_s outlasts their work): they time the host, not the chip",
            "record a run whose chip work outlasts its launches (a larger image, fewer chips, or torch.compile)")
    slowdown, overhead = _fit(points)
    rates, gemm = hw.kernel_rates, hw.matmul_rates
    return Calibration(hardware, len(points), slowdown, overhead, hw.compute_efficiency / slowdown,
                       hw.hbm_efficiency / slowdown, _error(points, 1.0, None), _error(points, slowdown, overhead),
                       hw.attention_kernel if rates else "", tuple((n, r / slowdown) for n, r in rates),
                       None if gemm is None else replace(gemm, rates=tuple(r / slowdown for r in gemm.rates)))


def _fit(points: list[Point]) -> tuple[float, float]:
    """Least squares of measured - collectives = k x local + o; with one point (or one local time), o stays."""
    points = [p for p in points if not p.launch_bound()]
    ys = [p.measured_s - p.collective_s for p in points]
    xs = [p.local_s for p in points]
    n, mean_x, mean_y = len(points), sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mean_x) ** 2 for x in xs)
    if n < 2 or spread <= 1e-12 * sum(x * x for x in xs):  # one local time (repeats of one run): no slope to fit
        overhead = points[0].overhead_s
        return max(sum(y - overhead for y in ys) / sum(xs), 1e-6), overhead
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / spread
    return max(slope, 1e-6), max(mean_y - slope * mean_x, 0.0)


def _error(points: list[Point], slowdown: float, overhead: float | None) -> float:
    def predicted(p: Point) -> float:
        return (max(slowdown * p.local_s + p.collective_s, p.launch_floor_s)
                + (p.overhead_s if overhead is None else overhead))

    return 100.0 * sum(abs(predicted(p) - p.measured_s) / p.measured_s for p in points) / len(points)
