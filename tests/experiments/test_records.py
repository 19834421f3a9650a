"""Run records: atomic appends under concurrency, and located errors on bad files."""

import json
import multiprocessing

import pytest

from meshlab.core.errors import BackendError, InputError
from meshlab.experiments.records import append_record, read_records, strategy_identity

from tests.conftest import REPO


def _append_many(path, writer: int, count: int) -> None:
    payload = "x" * 20_000  # larger than a pipe buffer and a page: a torn write would show
    for i in range(count):
        append_record(path, {"status": "ok", "writer": writer, "i": i, "payload": payload})


def test_concurrent_appends_never_interleave_or_lose_records(tmp_path):
    path = tmp_path / "results" / "s.jsonl"
    context = multiprocessing.get_context("fork")
    workers = [context.Process(target=_append_many, args=(path, w, 40)) for w in range(6)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    records = read_records([path]).records
    assert len(records) == 240
    assert {(r.writer, r.i) for r in records} == {(w, i) for w in range(6) for i in range(40)}
    assert all(r.schema_version == 1 and len(r.payload) == 20_000 for r in records)


def test_what_is_written_is_what_the_readers_read(tmp_path):
    """append_record refuses a record RunRecord does not validate, before writing anything."""
    with pytest.raises(BackendError, match="status: Input should be"):
        append_record(tmp_path / "r.jsonl", {"status": "maybe"})
    with pytest.raises(BackendError, match="timings.steady_step_median_s: Input should be greater than 0"):
        append_record(tmp_path / "r.jsonl", {"status": "ok", "timings": {"steady_step_median_s": 0}})
    assert not (tmp_path / "r.jsonl").exists()
    append_record(tmp_path / "r.jsonl", {"status": "ok", "prediction": None, "timings": {"step_s": [0.5, 0.25]}})
    [read] = read_records([tmp_path / "r.jsonl"]).records
    assert read.timings.step_s == [0.5, 0.25] and read.prediction.step_s is None
    assert read.source == f"{tmp_path / 'r.jsonl'}:1" and "source" not in read.model_dump()


def test_bad_lines_are_located(tmp_path):
    path = tmp_path / "r.jsonl"
    append_record(path, {"status": "ok"})
    with path.open("a") as handle:
        handle.write("{not json\n")
    with pytest.raises(InputError) as info:
        read_records([path])
    assert info.value.location.line == 2
    with pytest.raises(InputError, match="no such file"):
        read_records([tmp_path / "missing.jsonl"])


def test_strategy_identity_hashes_content(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("abc")
    # SHA-256 of "abc": the published test vector (FIPS 180-2, appendix B.1)
    assert strategy_identity(path) == {"file": str(path), "content": "abc",
                                       "sha256": "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"}


def test_strategy_names_become_safe_file_names():
    from meshlab.core.files import file_stem

    assert file_stem("2d") == "2d" and file_stem("../etc/x y") == "_etc_x_y" and file_stem("...") == "strategy"


SHIPPED = REPO / "experiments" / "records" / "qwen-image-one-cpu.jsonl"


@pytest.mark.parametrize("field, value, says", [
    (("prediction", "step_s"), "4.5", "prediction.step_s: Input should be a valid integer or a valid number"),  # JSON: no conversions
    (("prediction", "local_s"), 0, "prediction.local_s: Input should be greater than 0"),
    (("timings", "steady_step_median_s"), float("nan"), "timings.steady_step_median_s: Input should be a valid integer or a finite number"),
    (("timings", "steady_step_median_s"), [4.4], "timings.steady_step_median_s: Input should be a valid integer or a"),
    (("hardware",), "cpu", "hardware: Input should be a valid dictionary"),
    (("status",), 3, "status: Input should be 'ok', 'oom', 'error' or 'refused'"),
    (("prediction", "kind"), ["cpu"], "prediction.kind: Input should be a valid string"),
    (("memory", "peak_bytes_per_device"), "lots", "memory.peak_bytes_per_device: Input should be a valid integer or a"),
    (("timings", "step_s"), [4.4, -1], "timings.step_s.1: Input should be greater than or equal to 0"),
    (("prediction", "overhead_s"), None, "prediction: local_s comes with collective_s and overhead_s, which are missing"),
])
def test_a_record_with_a_wrong_field_is_an_error_at_its_line(tmp_path, field, value, says):
    """report and calibrate read these fields: a wrong one is one located line, not a traceback deep inside."""
    record = json.loads(SHIPPED.read_text().splitlines()[0])
    holder = record
    for part in field[:-1]:
        holder = holder[part]
    holder[field[-1]] = value
    path = tmp_path / "runs.jsonl"
    path.write_text(SHIPPED.read_text().splitlines()[0] + "\n" + json.dumps(record) + "\n")
    with pytest.raises(InputError, match="prediction|timings|hardware|status|memory") as error:
        read_records([path])
    assert says in error.value.one_line() and f"{path}:2" in error.value.one_line()


def test_the_shipped_records_read_back():
    for path in (REPO / "experiments" / "records").glob("*.jsonl"):
        lines = [line for line in path.read_text().splitlines() if line.strip()]
        records = read_records([path]).records
        assert len(records) == len(lines) >= 1
        assert [r.source for r in records] == [f"{path}:{n}" for n, line in
                                              enumerate(path.read_text().splitlines(), 1) if line.strip()]


def test_no_records_at_all_is_an_error_not_an_empty_report(tmp_path):
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(InputError, match="no run records in"):
        read_records([tmp_path / "empty.jsonl"])


def test_a_record_after_a_line_cut_short_starts_its_own_line(tmp_path):
    path = tmp_path / "r.jsonl"
    append_record(path, {"status": "ok"})
    with path.open("a") as handle:
        handle.write('{"schema_version": 1, "status": "o')  # a writer killed mid-line
    append_record(path, {"status": "refused"})
    lines = path.read_text().splitlines()
    assert len(lines) == 3 and json.loads(lines[2])["status"] == "refused"
    with pytest.raises(InputError) as info:  # the cut line is the one bad line, located
        read_records([path])
    assert info.value.location.line == 2
