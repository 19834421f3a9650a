"""XLA:TPU compile times measured ahead of time, kept per plan, size and TPU system, so that a plan's time to first
image takes the compiler's own figure where one was measured instead of the catalog's model of it.

`meshlab check S.yaml --backend tpu` at full depth and at the strategy's own workload writes one entry
(`record_compile`); loading a strategy reads it back (`measured_compile`, from `plan_strategy`). The file is a
cache: ``$MESHLAB_COMPILE_TIMES``, else ``tpu-compile-times.json`` under ``$MESHLAB_CACHE`` (default
``~/.cache/meshlab``). A file that does not read as one is ignored when reading; a write moves it aside (to
``*.unreadable``) rather than over it, and holds a lock while it reads, adds and rewrites, so two checks at once
both keep their entries.

The key is what decides the program XLA:TPU compiles: the model's config digest, the TPU system, the mesh and its
DCN axes, the rules, activations, rewrites, scan and libtpu flags, and the workload's shapes (not its steps, prices
or placement, which change no program). The compile seconds are this host's: a TPU VM's host has more cores.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from meshlab.core.files import cache_root, write_atomic
from meshlab.models.card import ModelCard
from meshlab.strategy.schema import Strategy

FORMAT = 1


class KeptSchedule(BaseModel):
    """XLA:TPU's latency-hiding scheduler's estimate of one call of the program (its cost model, not a
    measurement; meshlab.check.tpu_schedule), in seconds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    total_s: float
    compute_s: float
    collective_s: float
    collective_s_by_kind: dict[str, float]
    compute_s_by_op: dict[str, float] | None = None  # by what the ops are (meshlab.cost.compiled_call.OP_CLASSES)
    kernel_s_by_op: dict[str, float] | None = None  # of those, what Pallas kernels hold (their own cost estimates)
    #: the cycles it waits on async collectives, by its statistics' names (all_to_all, collective_permute, total)
    wasted_s: dict[str, float] | None = None


class MeasuredCompile(BaseModel):
    """One XLA:TPU compile of a whole plan, measured."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    seconds: float
    strategy: str  # the strategy's name when it was measured
    front_end: str  # whose program: torch-xla or torchax
    system: str  # the TPU system compiled for, e.g. v6e-8
    host: str
    cores: int | None
    libtpu: str | None
    measured_at: str  # UTC, ISO 8601
    schedule: KeptSchedule | None = None  # left out of the file when there is none (older readers forbid it)

    def describe(self) -> str:
        return (f"measured: XLA:TPU ahead of time, {self.front_end}'s program, on {self.host} "
                f"({self.cores} cores, libtpu {self.libtpu}, {self.measured_at[:10]}), kept in {compile_times_path()} "
                "by `meshlab check --backend tpu`")


class CompileTimesFile(BaseModel):
    """The file: plan key -> its measured compile."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    meshlab_compile_times: Literal[1] = FORMAT
    entries: dict[str, MeasuredCompile] = {}


def compile_times_path() -> Path:
    given = os.environ.get("MESHLAB_COMPILE_TIMES")
    if given:
        return Path(given)
    return cache_root() / "tpu-compile-times.json"


def compile_key(strategy: Strategy, card: ModelCard, system: str) -> str:
    workload = strategy.workload.model_dump(exclude={"steps", "weights_dtype"})  # memory-only: not the program
    identity = [card.config_digest, system, list(strategy.mesh.items()), list(strategy.dcn.items()),  # order matters
                [r.model_dump(mode="json") for r in strategy.rules], strategy.activations.identity(),
                list(strategy.rewrites), strategy.compile.scan_blocks, list(strategy.compile.libtpu_flags), workload]
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


def _read(path: Path) -> CompileTimesFile | None:
    """The file; None when it does not read as one."""
    try:
        return CompileTimesFile.model_validate_json(path.read_bytes())
    except (OSError, ValidationError, ValueError):
        return None


def read_compile_times() -> CompileTimesFile:
    """The kept compiles (none where there is no file, or it does not read as one)."""
    path = compile_times_path()
    found = _read(path) if path.is_file() else None
    return found if found is not None else CompileTimesFile()


def measured_compile(strategy: Strategy, card: ModelCard, system: str,
                     kept: CompileTimesFile | None = None) -> MeasuredCompile | None:
    """The compile measured for this plan, size and system; None when none was. `kept`: the file already read (a
    sweep reads it once for all its candidates)."""
    kept = kept if kept is not None else read_compile_times()
    return kept.entries.get(compile_key(strategy, card, system)) if kept.entries else None


def record_compile(strategy: Strategy, card: ModelCard, system: str, measured: MeasuredCompile) -> Path:
    """Keep `measured` as this plan's compile (the file written whole, or not at all; see the module's docstring)."""
    import fcntl

    path = compile_times_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        found = _read(path) if path.exists() else CompileTimesFile()
        if found is None:  # not meshlab's, or a newer meshlab's: kept aside, never written over
            os.replace(path, path.with_name(path.name + ".unreadable"))
            found = CompileTimesFile()
        entries = {**found.entries, compile_key(strategy, card, system): measured}
        return write_atomic(path, CompileTimesFile(entries=entries).model_dump_json(indent=1, exclude_none=True),
                            what="the compile times")
