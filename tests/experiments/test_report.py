"""`meshlab report`: rows from records, errors only where the hardware matches, and the plot."""

from meshlab.cli.render_run import plot_report
from meshlab.experiments.records import append_record, read_records
from meshlab.experiments.measured import report_rows
from tests.conftest import REPO


WORK = {"model": "qwen-image", "config_digest": "abc", "batch": 2, "dtype": "bfloat16"}


def record(platform: str, measured: float, predicted: float, **ran) -> dict:
    return {"status": "ok", "time": "2026-12-02T10:00:00+00:00", "strategy": {"name": "2d"},
            "hardware": {"platform": platform, "devices": 8}, "workload": {"height": 64, "width": 64, "steps": 4},
            "timings": {"steady_step_median_s": measured}, "ran": WORK | ran,
            "prediction": {"hardware": "v6e-8", "step_s": predicted, "chips": 8} | WORK}


def test_error_only_where_the_run_was_on_the_predicted_hardware(tmp_path):
    path = tmp_path / "2d.jsonl"
    append_record(path, record("tpu", measured=0.2, predicted=0.15))
    append_record(path, record("cpu", measured=0.1, predicted=0.15))
    tpu, cpu = report_rows(read_records([path]))
    assert round(tpu.step_error_pct, 6) == -25.0 and cpu.step_error_pct is None
    assert tpu.time == "12-02 10:00" and cpu.ran_on == "cpu x8"


def test_plot_writes_a_png(tmp_path):
    path = tmp_path / "2d.jsonl"
    append_record(path, record("tpu", measured=0.2, predicted=0.15))
    plot_report(report_rows(read_records([path])), tmp_path / "report.png")
    assert (tmp_path / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not list(tmp_path.glob(".*.tmp.png"))


def test_a_run_of_other_work_is_not_compared(tmp_path):
    """The tiny checkpoint, another batch or dtype, or a record without what it ran: no error is computed."""
    path = tmp_path / "2d.jsonl"
    append_record(path, record("tpu", 0.2, 0.15, model="checkpoint", config_digest="tiny"))
    append_record(path, record("tpu", 0.2, 0.15, batch=1))
    append_record(path, record("tpu", 0.2, 0.15, dtype="float32"))
    old = record("tpu", 0.2, 0.15)
    del old["ran"]
    append_record(path, old)
    rows = report_rows(read_records([path]))
    assert [r.step_error_pct for r in rows] == [None] * 4
    assert [r.not_compared for r in rows] == [
        "ran model 'checkpoint', predicted for 'qwen-image'", "ran batch 1, predicted for 2",
        "ran dtype 'float32', predicted for 'bfloat16'",
        "the record does not say which model, batch and dtype ran (recorded by an older meshlab)"]


def test_the_platform_is_what_the_worker_saw(tmp_path):
    """A plain-PyTorch run's parent imports no torch and once recorded cpu for an H200; the worker's
    hardware_seen decides, and the shipped H200 records are compared with their profiles."""
    path = tmp_path / "2d.jsonl"
    seen = record("cpu", 0.2, 0.15) | {"hardware_seen": {"device_type": "TPU", "devices": 8}}
    append_record(path, seen)
    (row,) = report_rows(read_records([path]))
    assert row.ran_on == "tpu x8" and round(row.step_error_pct, 6) == -25.0
    shipped = sorted((REPO / "experiments" / "records").glob("qwen-image-one-h200-profiled-*.jsonl"))
    rows = report_rows(read_records(shipped))
    assert [r.ran_on for r in rows] == ["cuda x1", "cuda x1"] and all(r.not_compared is None for r in rows)
