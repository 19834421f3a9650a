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
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from meshlab.core.errors import BackendError, InputError, Location
from meshlab.core.files import is_device
from meshlab.core.closed import problem_line

RECORD_SCHEMA_VERSION = 1


def strategy_identity(path: Path) -> dict:
    """The strategy as run: its file, the exact content, and a hash that keys compile caches and records."""
    content = path.read_text(encoding="utf-8")
    return {"file": str(path), "sha256": hashlib.sha256(content.encode()).hexdigest(), "content": content}


def run_record(record: dict) -> RunRecord:
    """The record meshlab.experiments.run built, as `report` and `calibrate` will read it back; a record they could not
    read is a BackendError (the writer and RunRecord disagree: a bug in meshlab, not in the user's input)."""
    record = {"schema_version": RECORD_SCHEMA_VERSION, **record}
    problem = record_problem(record)
    if problem is not None:
        raise BackendError(f"meshlab built a run record it could not read back: {problem}",
                           "a bug in meshlab, not in the strategy: report it with the strategy")
    return RunRecord.model_validate(record)


def append_record(path: Path, record: dict) -> RunRecord:
    """Append `record` (as meshlab.experiments.run builds it) after checking it is one `report` and `calibrate` can
    read."""
    checked = run_record(record)
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
    return checked


@dataclass(frozen=True)
class RecordSet:
    """Records read back from one or more JSONL files, in file order."""

    records: tuple[RunRecord, ...]


def read_records(paths: list[Path]) -> RecordSet:
    records = []
    for path in paths:
        records.extend(_read_file(path))
    if paths and not records:
        raise InputError("no run records in " + ", ".join(map(str, paths)), "record runs with `meshlab run` first, "
                         "or give the .jsonl files it wrote (experiments/results/)")
    return RecordSet(tuple(records))


def _read_file(path: Path) -> list[RunRecord]:
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
        if problem is not None:
            raise InputError(problem, "remove or fix that line (meshlab run writes valid records)",
                             Location(str(path), number))
        records.append(RunRecord.model_validate(record).model_copy(update={"source": f"{path}:{number}"}))
    return records


Count = Annotated[int, Field(ge=0)]
#: a finite number >= 0 (> 0), kept an int where the record has one (a byte count stays a whole number)
Number = Union[Annotated[int, Field(ge=0)], Annotated[float, Field(ge=0, allow_inf_nan=False)]]
Positive = Union[Annotated[int, Field(gt=0)], Annotated[float, Field(gt=0, allow_inf_nan=False)]]


class _Part(BaseModel):
    """A part of a run record: the fields `report` and `calibrate` read are typed and checked (strictly: JSON that
    meshlab wrote, no conversions); anything else the writer put there is kept as it was."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=True)

    @model_validator(mode="before")
    @classmethod
    def _null_is_empty(cls, data: object) -> object:
        return {} if data is None else data


class StrategyRun(_Part):
    name: Optional[str] = None
    file: Optional[str] = None


class HardwareUsed(_Part):
    platform: Optional[str] = None
    devices: Optional[Count] = None


class HardwareSeen(_Part):
    device_type: Optional[str] = None


class Ran(_Part):
    """Which model, config, batch and dtype the worker ran."""

    model: Optional[str] = None
    config_digest: Optional[str] = None
    batch: Optional[Count] = None
    dtype: Optional[str] = None


class Prediction(_Part):
    """meshlab's prediction for the run's workload on the strategy's hardware
    (``meshlab.experiments.recording.prediction``)."""

    hardware: Optional[str] = None
    kind: Optional[str] = None
    chips: Optional[Count] = None
    model: Optional[str] = None
    config_digest: Optional[str] = None
    batch: Optional[Count] = None
    dtype: Optional[str] = None
    profile: Optional[str] = None
    profile_backend: Optional[str] = None
    profile_digest: Optional[str] = None
    step_s: Optional[Positive] = None
    local_s: Optional[Positive] = None
    collective_s: Optional[Number] = None
    overhead_s: Optional[Number] = None
    launch_wait_s: Optional[Number] = None
    launch_floor_s: Optional[Number] = None
    compute_s: Optional[Number] = None
    seconds_per_image: Optional[Number] = None
    denoise_seconds_per_image: Optional[Number] = None
    peak_bytes_per_chip: Optional[Number] = None
    text_tokens: Optional[Count] = None  # the text length priced: what the run encoded

    @model_validator(mode="after")
    def _local_comes_with_its_parts(self) -> Prediction:
        if self.local_s is not None and (self.collective_s is None or self.overhead_s is None):
            raise ValueError("local_s comes with collective_s and overhead_s, which are missing")
        return self


class Timings(_Part):
    steady_step_median_s: Optional[Positive] = None
    first_step_s: Optional[Number] = None
    second_step_s: Optional[Number] = None
    total_s: Optional[Number] = None
    compile_s: Optional[Number] = None
    text_encode_s: Optional[Number] = None
    vae_decode_s: Optional[Number] = None
    step_s: Optional[list[Number]] = None


class MemorySeen(_Part):
    peak_bytes_per_device: Optional[Number] = None


class Compiles(_Part):
    total: Optional[Count] = None
    steady: Optional[Count] = None


class RunRecord(_Part):
    """One line of a run record file: what `meshlab run` wrote (``meshlab.experiments.run``) and `report` and
    `calibrate` read. Writer and reader agree through this model: ``append_record`` refuses a record it does not
    validate, and ``read_records`` gives these models, each placed at its file and line (`source`)."""

    schema_version: Literal[1]
    status: Literal["ok", "oom", "error", "refused"]
    time: Optional[str] = None
    reason: Optional[str] = None
    backend: Optional[str] = None
    strategy: StrategyRun = Field(default_factory=StrategyRun)
    hardware: HardwareUsed = Field(default_factory=HardwareUsed)
    hardware_seen: HardwareSeen = Field(default_factory=HardwareSeen)
    workload: dict[str, Any] = Field(default_factory=dict)
    ran: Optional[Ran] = None  # absent in records of an older meshlab: then nothing says what ran
    prediction: Prediction = Field(default_factory=Prediction)
    timings: Timings = Field(default_factory=Timings)
    memory: MemorySeen = Field(default_factory=MemorySeen)
    compiles: Compiles = Field(default_factory=Compiles)
    source: str = Field("", exclude=True)  # file:line, when read back

    @model_validator(mode="before")
    @classmethod
    def _null_is_empty(cls, data: object) -> object:
        if isinstance(data, dict):  # a part written as null is an empty part (ran: null stays "not said")
            return {k: v for k, v in data.items() if not (v is None and k in _PARTS)}
        return data


_PARTS = ("strategy", "hardware", "hardware_seen", "workload", "prediction", "timings", "memory", "compiles")


def record_problem(record: dict) -> str | None:
    """What is wrong with a record (see RunRecord), or None: the first problem, named by its field."""
    try:
        RunRecord.model_validate(record)
    except ValidationError as exc:
        return problem_line(exc, record, "the record")
    return None
