"""`meshlab check`: plan here (no torch), run the torch half in a worker process, read XLA's dump, compare.

The worker gets its environment before torch_xla starts: with no accelerator, ``PJRT_DEVICE=CPU`` and
``CPU_NUM_DEVICES=<mesh size>`` give it that many virtual devices; ``XLA_FLAGS`` points the HLO dump at a
temporary folder; ``XLA_HLO_DEBUG=1`` keeps the op names that say which layer caused each collective.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from meshlab.check import hlo
from meshlab.parallelisms import xla
from meshlab.runtime.protocol import Progress, WorkerFailed, call_worker
from meshlab.runtime.results import XlaCheckPayload
from meshlab.check.verdict import (
    CheckReport, checked_prediction, collectives_of, predicted_flops, predicted_full_depth, predicted_per_block,
)
from meshlab.check.readback import compare_parameter
from meshlab.runtime.requests import CheckJob, CheckRequest
from meshlab.check.setup import CheckOptions, CheckSetup, check_setup
from meshlab.runtime.devices import child_environment
from meshlab.core.errors import InputError, MissingExtra
from meshlab.core.files import dump_folder


def run_check(path: str | Path, options: CheckOptions, progress: Progress = lambda _: None) -> CheckReport:
    (report,) = run_checks([path], options, progress)
    return report


def run_checks(paths: list[str | Path], options: CheckOptions, progress: Progress = lambda _: None,
               ) -> list[CheckReport]:
    """Check several strategy files in one worker process (they must plan for the same number of devices)."""
    setups = [check_setup(path, options) for path in paths]
    require_backend()
    counts = {s.plan.mesh.device_count for s in setups}
    if len(counts) > 1:
        raise InputError(f"the strategies plan for different device counts {sorted(counts)}", "check them one by one")
    with dump_folder(options.dump_dir, "meshlab-dump-") as dump_dir:
        jobs = [CheckJob(strategy=str(path), options=options.to_json()) for path in paths]
        results = run_worker(jobs, dump_dir, counts.pop(), progress)
        progress("reading XLA's partitioned program and buffer assignment")
        return [build_report(setup, result, dump_dir) for setup, result in zip(setups, results)]


def require_backend() -> None:
    xla.require()
    if importlib.util.find_spec("diffusers") is None:
        raise MissingExtra("diffusers is not installed, and the check builds the model from it", xla.INSTALL_FIX)


def run_worker(jobs: list[CheckJob], dump_dir: Path, device_count: int, progress: Progress) -> list[dict]:
    """Run the jobs in one worker process (meshlab.runtime.protocol); its errors come back as meshlab's errors."""
    request = CheckRequest(jobs=jobs, dump_dir=str(dump_dir))
    try:
        return call_worker("meshlab.workers.check_xla", request, worker_env(dump_dir, device_count),
                           XlaCheckPayload, progress=progress)["results"]
    except WorkerFailed as error:
        if error.status != "oom":
            raise
        raise WorkerFailed(error.problem, "check fewer blocks (--layers 1) or a smaller image; every virtual "
                           "device holds its shards in this host's memory", status="oom") from None


def worker_env(dump_dir: Path, device_count: int) -> dict[str, str]:
    env = child_environment(device_count, f"--xla_dump_to={dump_dir} --xla_dump_hlo_as_text")
    env["XLA_HLO_DEBUG"] = "1"
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env


def build_report(setup: CheckSetup, result: dict, dump_dir: Path) -> CheckReport:
    ids = tuple(result["device_ids"])
    read = result["parameters"]
    parameters = tuple(compare_parameter(p, setup.plan.mesh, ids, read[p.name]["sharding"], read[p.name]["slices"],
                                         read[p.name]["dtype"]) for p in setup.plan.parameters)
    module = forward_module(result["forwards"], dump_dir)
    prediction = checked_prediction(setup)
    collectives, memory, dot_flops = (), None, None
    if module is not None:
        text = module.read_text()
        collectives = collectives_of(hlo.parse_collectives(text), setup, ids)
        dot_flops = hlo.dot_flops(text) if not result.get("scanned") else None  # a loop body runs many times
        assignment = module.with_name(module.name.replace(".txt", "-buffer-assignment.txt"))
        memory = hlo.parse_buffer_assignment(assignment.read_text()) if assignment.exists() else None
    return CheckReport(
        setup, parameters, collectives, memory, result["max_abs_error"], result["reference_max_abs"],
        result["device_type"], result["device_count"],
        tuple({k: f[k] for k in ("compiles", "seconds", "compile_seconds", "host_transfers") if k in f}
              for f in result["forwards"]),
        result["timings"], module.name if module else None, predicted_per_block(setup, prediction),
        predicted_full_depth(setup), tuple(result.get("scanned", ())), predicted_flops(setup, prediction), dot_flops)


def forward_module(forwards: list[dict], dump_dir: Path) -> Path | None:
    """The partitioned program of the last forward that compiled one: its largest module."""
    for forward in reversed(forwards):
        candidates = [dump_dir / f for f in forward["dump_files"]
                      if f.endswith("after_optimizations.txt") and "ReplicateShardedData" not in f]
        if candidates:
            return max(candidates, key=lambda p: p.stat().st_size)
    return None
