"""Run records: one JSON object per line in ``experiments/results/<strategy>.jsonl``.

Appends are atomic: the whole line goes out in one ``write`` on an ``O_APPEND`` descriptor under an
exclusive ``flock``, so concurrent runs never interleave or lose a record, and a crash leaves either the whole
line or nothing.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from meshlab.errors import InputError, Location

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
    descriptor = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX)
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
    return RecordSet(tuple(records))


def _read_file(path: Path) -> list[dict]:
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
        records.append(record | {"_source": f"{path}:{number}"})
    return records
