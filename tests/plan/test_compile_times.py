"""XLA:TPU compile times kept per plan (meshlab.plan.compile_times): what makes two plans one, what a strategy then
reads back, and a file that is not meshlab's. Pure (no compile: the entries are made by hand)."""

import json

import pytest

from meshlab.plan.compile_times import KeptSchedule, MeasuredCompile, compile_key, measured_compile, record_compile
from meshlab.plan.planned import plan_file

from tests.conftest import REPO

MEASURED = MeasuredCompile(seconds=163.0, strategy="2d", front_end="torch-xla", system="v6e-8", host="h", cores=2,
                           libtpu="0.0.52", measured_at="2026-12-05T04:00:00+00:00")


@pytest.fixture
def times(tmp_path, monkeypatch):
    path = tmp_path / "times.json"
    monkeypatch.setenv("MESHLAB_COMPILE_TIMES", str(path))
    return path


def strategy_file(tmp_path, old: str = "", new: str = ""):
    path = tmp_path / "s.yaml"
    path.write_text((REPO / "strategies" / "2d.yaml").read_text().replace(old, new))
    return plan_file(path)


def test_a_kept_compile_is_the_plan_s_and_only_its(times, tmp_path):
    planned = strategy_file(tmp_path)
    record_compile(planned.strategy, planned.card, "v6e-8", MEASURED)
    again = strategy_file(tmp_path, "steps: 50", "steps: 20")  # steps change no program
    assert again.hardware.compile_measured == MEASURED
    assert measured_compile(again.strategy, again.card, "v6e-8") == MEASURED
    for old, new in (("height: 1024", "height: 512"), ("  data: 2\n  model: 4", "  model: 4\n  data: 2"),
                     ("rewrites: [layernorm-rows]", "rewrites: []")):
        other = strategy_file(tmp_path, old, new)  # another size, mesh order or rewrite is another program
        assert other.hardware.compile_measured is None, (old, new)
    assert measured_compile(planned.strategy, planned.card, "v6e-16") is None


def test_the_mesh_s_order_is_part_of_the_key(tmp_path):
    one = strategy_file(tmp_path)
    other = strategy_file(tmp_path, "  data: 2\n  model: 4", "  model: 4\n  data: 2")
    assert compile_key(one.strategy, one.card, "v6e-8") != compile_key(other.strategy, other.card, "v6e-8")


def test_a_file_that_is_not_meshlab_s_is_read_as_none_and_kept_aside(times, tmp_path):
    times.write_text('{"meshlab_compile_times": 2, "entries": {}, "from": "a newer meshlab"}')
    planned = strategy_file(tmp_path)
    assert planned.hardware.compile_measured is None
    record_compile(planned.strategy, planned.card, "v6e-8", MEASURED)
    assert json.loads(times.with_name("times.json.unreadable").read_text())["from"] == "a newer meshlab"
    assert strategy_file(tmp_path).hardware.compile_measured == MEASURED


def test_a_gpu_plan_never_reads_it(times, tmp_path):
    planned = strategy_file(tmp_path, "hardware: v6e-8", "hardware: h100")
    record_compile(planned.strategy, planned.card, "h100", MEASURED)
    assert strategy_file(tmp_path, "hardware: v6e-8", "hardware: h100").hardware.compile_measured is None


def test_explain_shows_xla_tpu_s_schedule_kept_with_the_compile_beside_meshlab_s_same_program(times, tmp_path):
    """A check at full depth keeps XLA:TPU's schedule of one call with the compile (figures of 2d.yaml's torch_xla
    program, v6e-8); explain then prices that program (its stock attention, scores in float32, not the strategy's
    flash kernel) and shows both, labelled as the compiler's model."""
    import os
    import subprocess
    import sys

    from meshlab.cost.compiled_call import predicted_call, schedule_beside
    from meshlab.cost.predict import predict

    planned = strategy_file(tmp_path)
    assert schedule_beside(planned) is None  # nothing kept yet
    xla = {"total_s": 0.2591, "compute_s": 0.2454, "collective_s": 0.0137,
           "collective_s_by_kind": {"all-gather": 0.0136, "all-reduce": 0.0001}}
    kept = MEASURED.model_copy(update={"schedule": KeptSchedule(**xla)})
    record_compile(planned.strategy, planned.card, "v6e-8", kept)
    record_compile(planned.strategy, planned.card, "v6e-16", MEASURED)
    assert '"schedule": null' not in times.read_text()  # an entry without one writes none: older readers forbid it
    planned = strategy_file(tmp_path)
    beside = schedule_beside(planned)
    assert beside["xla"] == xla and beside["front_end"] == "torch-xla" and not beside["attention_as_priced_above"]
    assert planned.strategy.workload.flash_attention  # the strategy's kernel is flash; the program's is not
    flash = predicted_call(predict(planned.plan, planned.strategy, planned.hardware), planned.hardware)
    assert beside["meshlab"]["compute_s"] > 2 * flash["compute_s"]  # float32 scores written and read
    assert beside["meshlab"]["collective_s"] == flash["collective_s"]  # the same collectives
    done = subprocess.run([sys.executable, "-m", "meshlab", "explain", str(tmp_path / "s.yaml"), "--json"],
                          capture_output=True, text=True, cwd=REPO)
    assert json.loads(done.stdout)["xla_schedule"]["meshlab"] == beside["meshlab"]
    shown = subprocess.run([sys.executable, "-m", "meshlab", "explain", str(tmp_path / "s.yaml")],
                           capture_output=True, text=True, cwd=REPO, env={**os.environ, "COLUMNS": "200"})
    words = " ".join(shown.stdout.split())  # a title wraps where the table's width puts it
    assert "XLA:TPU schedule" in words and "259.1 ms" in words and "not a measurement" in words


def test_explain_splits_a_kept_schedule_s_ops_beside_meshlab_s(times, tmp_path):
    """A schedule kept with its ops by class (2d.yaml's torch_xla program at full depth on v6e-8, as `meshlab check
    --backend tpu` split it on 2026-12-05: matmuls 73.8 ms, attention 145.0 ms, elementwise and reductions 26.6 ms;
    its idle 0.1 ms made 0.5 here, as a time meshlab does not price shows from 0.05% of the ops) shows a row for
    each beside meshlab's, with the rate each time implies; the JSON keeps the split."""
    import os
    import subprocess
    import sys

    planned = strategy_file(tmp_path)
    split = {"matmuls": 0.0738, "attention": 0.1450, "elementwise and reductions": 0.0266, "idle": 0.0005}
    xla = {"total_s": 0.2591, "compute_s": sum(split.values()), "collective_s": 0.0137,
           "collective_s_by_kind": {"all-gather": 0.0136, "all-reduce": 0.0001}, "compute_s_by_op": split}
    record_compile(planned.strategy, planned.card, "v6e-8", MEASURED.model_copy(
        update={"schedule": KeptSchedule(**xla)}))
    done = subprocess.run([sys.executable, "-m", "meshlab", "explain", str(tmp_path / "s.yaml"), "--json"],
                          capture_output=True, text=True, cwd=REPO)
    kept = json.loads(done.stdout)["xla_schedule"]
    assert kept["xla"]["compute_s_by_op"] == split and set(kept["meshlab"]["compute_s_by_op"]) == set(split) - {"idle"}
    shown = subprocess.run([sys.executable, "-m", "meshlab", "explain", str(tmp_path / "s.yaml")],
                           capture_output=True, text=True, cwd=REPO, env={**os.environ, "COLUMNS": "200"})
    rows = {line.split("│")[1].strip(): line for line in shown.stdout.splitlines() if line.count("│") >= 5}
    assert "73.8 ms" in rows["matmuls"] and "TFLOP/s" in rows["matmuls"]
    assert "145.0 ms" in rows["attention"] and "TB/s" in rows["attention"]  # float32 scores: their bytes
    assert "not priced" in rows["idle"] and "0.5 ms" in rows["idle"]
