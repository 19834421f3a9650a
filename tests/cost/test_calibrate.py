"""Calibration recovers a known slow-down and host overhead from synthetic records, and refuses CPU runs."""

import pytest

from meshlab.cost.calibrate import calibrate
from meshlab.errors import InputError
from meshlab.hardware import load_hardware


def record(local, collective, measured, platform="tpu", hardware="v6e-8", status="ok"):
    return {"status": status, "hardware": {"platform": platform},
            "prediction": {"hardware": hardware, "local_s": local, "collective_s": collective, "overhead_s": 0.001},
            "timings": {"steady_step_median_s": measured}}


def test_recovers_slowdown_and_overhead():
    k, o = 1.6, 0.004
    records = tuple(record(local, 0.01, k * local + 0.01 + o) for local in (0.02, 0.05, 0.2))
    result = calibrate(records + (record(0.1, 0.0, 9.9, platform="cpu"),), "v6e-8")
    assert result.points == 3
    assert result.slowdown == pytest.approx(k) and result.overhead_s == pytest.approx(o)
    assert result.compute_efficiency == pytest.approx(load_hardware("v6e-8").compute_efficiency / k)
    assert result.error_after_pct == pytest.approx(0, abs=1e-9) and result.error_before_pct > 10


def test_one_point_fits_the_slowdown_only():
    result = calibrate((record(0.1, 0.02, 0.2 + 0.02 + 0.001),), "v6e-8")
    assert result.slowdown == pytest.approx(2.0) and result.overhead_s == 0.001


def test_cpu_runs_are_refused():
    with pytest.raises(InputError, match="ran on cpu"):
        calibrate((record(0.1, 0.0, 1.0, platform="cpu"),), "v6e-8")
