"""Run records: one JSON object per line in ``experiments/results/<strategy>.jsonl`` (git-ignored; the records the
repository ships as examples are in ``experiments/records/``).

Appends are atomic: the whole line goes out in one ``write`` on an ``O_APPEND`` descriptor under an
exclusive ``flock``, so concurrent runs never interleave or lose a record, and a crash leaves either the whole
line or nothing. A line something else cut short is ended before the next record, so only that line is lost.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

from meshlab.errors import InputError, Location
from meshlab.files import is_device

RECORD_SCHEMA_VERSION = 1
STATUSES = ("ok", "oom", "error", "refused")


def strategy_identity(path: Path) -> dict:
    """The strategy as run: its file, the exact content, and a hash that keys compile caches and records."""
    content = path.read_text(encoding="utf-8")
    return {"file": str(path), "sha256": hashlib.sha256(content.encode()).hexdigest(), "content": content}


def append_record(path: Path, record: dict) -> None:
    if record.get("status") not in STATUSES:
        raise ValueError(f"record status must be one of {STATUSES}")
    line = (json.dumps({"schema_version": RECORD_SCHEMA_VERSION, **record}, sort_keys=False) + "\n").encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
        end = os.lseek(descriptor, 0, os.SEEK_END)
        if end and os.pread(descriptor, 1, end - 1) != b"\n":  # a line cut short (a killed writer): end it first,
            line = b"\n" + line                                 # so this record is not glued onto it
        written = os.write(descriptor, line)
        if written != len(line):  # a short write on a regular file means a full disk: undo it
            os.ftruncate(descriptor, os.lseek(descriptor, 0, os.SEEK_END) - written)
            raise OSError("short write while appending a run record (disk full?)")
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


@dataclass(frozen=True)
class RecordSet:
    """Records read back from one or more JSONL files, in file order."""

    records: tuple[dict, ...]


def read_records(paths: list[Path]) -> RecordSet:
    records = []
    for path in paths:
        records.extend(_read_file(path))
    if paths and not records:
        raise InputError("no run records in " + ", ".join(map(str, paths)), "record runs with `meshlab run` first, "
                         "or give the .jsonl files it wrote (experiments/results/)")
    return RecordSet(tuple(records))


def _read_file(path: Path) -> list[dict]:
    if path.is_dir():
        raise InputError("is a folder", f"give the .jsonl files in it, e.g. {path}/*.jsonl", Location(str(path)))
    if is_device(path):  # /dev/zero never ends; a pipe is read
        raise InputError("is a device, not a records file", "give a .jsonl file written by meshlab run",
                         Location(str(path)))
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise InputError("no such file", "record runs with `meshlab run` first", Location(str(path))) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read records: {exc}", "give a .jsonl file written by meshlab run", Location(str(path))) from None
    records = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise InputError(f"not a JSON record: {exc.msg}", "remove or fix that line", Location(str(path), number, exc.colno)) from None
        if not isinstance(record, dict) or record.get("schema_version") != RECORD_SCHEMA_VERSION:
            raise InputError("not a meshlab run record", "give a file written by meshlab run", Location(str(path), number))
        problem = record_problem(record)
        if problem:
            raise InputError(problem, "remove or fix that line (meshlab run writes valid records)",
                             Location(str(path), number))
        records.append(record | {"_source": f"{path}:{number}"})
    return records


#: The fields `report` and `calibrate` read, and what each must be where present (absent or null is allowed):
#: text, mapping, count (a whole number >= 0), number (a finite number >= 0), positive (> 0), and
#: numbers (a list of them).
FIELDS = {
    "status": "status", "time": "text", "strategy": "mapping", "strategy.name": "text", "strategy.file": "text",
    "hardware": "mapping", "hardware.platform": "text", "hardware.devices": "count", "backend": "text",
    "hardware_seen": "mapping", "hardware_seen.device_type": "text",
    "workload": "mapping", "ran": "mapping", "ran.model": "text", "ran.batch": "count", "ran.dtype": "text",
    "prediction": "mapping", "prediction.hardware": "text", "prediction.kind": "text", "prediction.chips": "count",
    "prediction.model": "text", "prediction.batch": "count", "prediction.dtype": "text",
    "prediction.profile": "text", "prediction.profile_backend": "text", "prediction.profile_digest": "text",
    "prediction.step_s": "positive", "prediction.local_s": "positive", "prediction.collective_s": "number",
    "prediction.overhead_s": "number", "prediction.launch_wait_s": "number", "prediction.launch_floor_s": "number",
    "prediction.compute_s": "number", "prediction.seconds_per_image": "number",
    "prediction.denoise_seconds_per_image": "number", "prediction.peak_bytes_per_chip": "number",
    "timings": "mapping", "timings.steady_step_median_s": "positive", "timings.first_step_s": "number",
    "timings.second_step_s": "number", "timings.total_s": "number", "timings.compile_s": "number",
    "timings.text_encode_s": "number", "timings.vae_decode_s": "number", "timings.step_s": "numbers",
    "memory": "mapping", "memory.peak_bytes_per_device": "number", "compiles": "mapping",
    "compiles.total": "count", "compiles.steady": "count",
}
#: What the kinds mean, for the message.
KINDS = {"status": f"one of {', '.join(STATUSES)}", "text": "a string", "mapping": "a mapping",
         "count": "a whole number >= 0", "number": "a finite number >= 0", "positive": "a finite number > 0",
         "numbers": "a list of finite numbers >= 0"}


def record_problem(record: dict) -> str | None:
    """What is wrong with a record's fields (see FIELDS), or None."""
    for name, kind in FIELDS.items():
        value = _at(record, name)
        if value is not None and not _is(kind, value):
            return f"{name} must be {KINDS[kind]}, not {json.dumps(value)[:60]}"
    prediction = record.get("prediction") or {}
    if "local_s" in prediction and any(prediction.get(k) is None for k in ("collective_s", "overhead_s")):
        return "prediction.local_s comes with prediction.collective_s and prediction.overhead_s, which are missing"
    return None


def _at(record: dict, name: str):
    value = record
    for part in name.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return value


def _is(kind: str, value) -> bool:
    number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return {"status": lambda: value in STATUSES, "text": lambda: isinstance(value, str),
            "mapping": lambda: isinstance(value, dict),
            "count": lambda: isinstance(value, int) and not isinstance(value, bool) and value >= 0,
            "number": lambda: number and value >= 0, "positive": lambda: number and value > 0,
            "numbers": lambda: isinstance(value, list) and all(_is("number", v) for v in value)}[kind]()
