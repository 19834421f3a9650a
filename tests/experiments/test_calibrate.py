"""Calibration recovers a known slow-down and host overhead from synthetic records, and refuses CPU runs."""

import pytest

from meshlab.experiments.calibrate import calibrate as calibrate_records
from meshlab.core.errors import InputError
from meshlab.experiments.records import RunRecord
from meshlab.core.hardware import load_hardware


WORK = {"model": "qwen-image", "config_digest": "abc", "batch": 2, "dtype": "bfloat16"}


def record(local, collective, measured, platform="tpu", hardware="v6e-8", status="ok", devices=8, **ran):
    return {"status": status, "hardware": {"platform": platform, "devices": devices}, "ran": WORK | ran,
            "prediction": {"hardware": hardware, "local_s": local, "collective_s": collective, "overhead_s": 0.001}
            | WORK, "timings": {"steady_step_median_s": measured}}


def run(record: dict) -> RunRecord:
    """A record as `meshlab report` and `calibrate` read it back."""
    return RunRecord.model_validate({"schema_version": 1} | record)


def calibrate(records: tuple[dict, ...], hardware: str):
    return calibrate_records(tuple(run(r) for r in records), hardware)


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


@pytest.mark.parametrize("local", [0.1, 4.46])
def test_repeats_of_one_run_fit_the_slowdown_only(local):
    """Seven records of one prediction: their local times agree to the last bit or nearly (float sums), so there is
    no slope to fit, only the mean slowdown with the predicted overhead kept."""
    records = tuple(record(local * (1 + i * 1e-16), 0.0, 1.5 * local + 0.001 + 1e-3 * (i - 3)) for i in range(7))
    result = calibrate(records, "v6e-8")
    assert result.points == 7 and result.overhead_s == 0.001
    assert result.slowdown == pytest.approx(1.5)


def test_a_step_bound_by_its_launches_stays_out_of_the_fit_and_is_priced_at_the_floor():
    """Eager PyTorch: a step whose predicted launches (launch_floor_s) outlast its predicted work measured the host,
    not the chip: the fit leaves it out, and the error prices it at the floor."""
    k, o = 1.6, 0.004
    bound = record(0.05, 0.0, 0.3 + o)
    bound["prediction"]["launch_floor_s"] = 0.3
    records = tuple(record(local, 0.01, k * local + 0.01 + o) for local in (0.2, 0.5, 0.9)) + (bound,)
    result = calibrate(records, "v6e-8")
    assert result.points == 4
    assert result.slowdown == pytest.approx(k) and result.overhead_s == pytest.approx(o)
    assert result.error_after_pct == pytest.approx(0, abs=1e-9)


def test_only_launch_bound_steps_are_refused():
    bound = record(0.05, 0.0, 0.3)
    bound["prediction"]["launch_floor_s"] = 0.3
    with pytest.raises(InputError, match="bound by eager PyTorch's launches"):
        calibrate((bound,), "v6e-8")


def test_cpu_runs_are_refused():
    with pytest.raises(InputError, match="ran on cpu"):
        calibrate((record(0.1, 0.0, 1.0, platform="cpu"),), "v6e-8")


def test_runs_of_other_work_never_enter_the_fit():
    """A tiny-checkpoint run, another device count, batch or dtype would each move k if it were fitted."""
    k = 1.6
    good = tuple(record(local, 0.01, k * local + 0.011) for local in (0.02, 0.05, 0.2))
    wrong = (record(0.1, 0.0, 9.9, model="checkpoint", config_digest="tiny"), record(0.1, 0.0, 9.9, devices=4),
             record(0.1, 0.0, 9.9, batch=1), record(0.1, 0.0, 9.9, dtype="float32"))
    result = calibrate(good + wrong, "v6e-8")
    assert result.points == 3 and result.slowdown == pytest.approx(k)
    with pytest.raises(InputError, match="ran model 'checkpoint', predicted for 'qwen-image'"):
        calibrate(wrong[:1], "v6e-8")


def test_runs_predicted_from_a_profile_are_compared_only_on_its_device_and_backend():
    from meshlab.experiments.comparable import comparison_problem

    profiled = {"hardware": "cpu-1 (profile cpu.json)", "kind": "cpu", "chips": 1, "profile": "cpu.json",
                "profile_backend": "xla"}
    ok = record(0.1, 0.0, 0.1, platform="cpu", devices=1) | {"backend": "xla"}
    ok["prediction"] |= profiled
    assert comparison_problem(run(ok)) is None
    assert comparison_problem(run(ok | {"backend": "torch"})) == "ran with backend torch, its profile was measured with xla"
    on_tpu = ok | {"hardware": {"platform": "tpu", "devices": 1}}
    assert comparison_problem(run(on_tpu)) == "ran on tpu, predicted for cpu-1 (profile cpu.json) (cpu)"


def test_a_profile_calibrates_only_the_runs_predicted_from_its_own_measurement(tmp_path):
    """Runs are matched to the profile by its content, not its file name: a profile measured again (or edited)
    under the same name does not take credit for the old runs."""
    import json
    import shutil

    from meshlab.experiments.calibrate import entry
    from tests.conftest import REPO

    path = tmp_path / "cpu-1.json"
    shutil.copy(REPO / "experiments" / "profiles" / "cpu-1.json", path)
    hw = entry(str(path))
    ran = record(0.1, 0.0, 0.2, platform="cpu", devices=1, hardware=hw.name) | {"backend": "xla"}
    ran["prediction"] |= {"kind": "cpu", "chips": 1, "profile": str(path), "profile_backend": "xla",
                          "profile_digest": hw.profile.digest}
    assert calibrate((ran,), str(path)).slowdown == pytest.approx(1.99, rel=0.01)
    document = json.loads(path.read_text())
    document["points"][0]["seconds"] *= 10
    path.write_text(json.dumps(document))
    with pytest.raises(InputError, match="predicted from another measurement than .*cpu-1.json"):
        calibrate((ran,), str(path))


def test_on_a_gpu_with_published_attention_rates_the_rates_slow_down_with_k():
    """On the H100, attention is priced from its kernel's published rates and Linears from measured GEMM rates,
    not compute_efficiency: the calibrated overrides divide those rates by k too, and load back as a valid
    hardware entry."""
    k = 1.25
    records = (record(0.4, 0.0, k * 0.4 + 0.001, platform="cuda", hardware="h100:1", devices=1),)
    result = calibrate(records, "h100:1")
    assert result.slowdown == pytest.approx(k)
    overrides = result.overrides()
    assert overrides["attention_kernel"] == "fa2"
    assert overrides["attention_rates"]["fa2"][0] == [512, pytest.approx(309e12 / k, rel=1e-3)]
    name = overrides.pop("name")
    calibrated = load_hardware(name, overrides)
    assert calibrated.attention_rate(512, 128) == pytest.approx(309e12 / k, rel=1e-3)
    assert calibrated.compute_efficiency == pytest.approx(load_hardware("h100").compute_efficiency / k, rel=1e-3)
    for shape in ((4096, 4096, 4096), (1024, 3072, 12288), (256, 2048, 2048)):  # so are the measured GEMM rates
        assert calibrated.matmul_rate(*shape) == pytest.approx(load_hardware("h100").matmul_rate(*shape) / k, rel=1e-3)
