"""The torch half of `meshlab check`, run in its own process: ``python -m meshlab.workers.check_xla REQUEST RESULT``.

The CLI sets the environment before torch_xla starts (``PJRT_DEVICE``, ``CPU_NUM_DEVICES``, ``XLA_FLAGS`` with
the dump folder, ``XLA_HLO_DEBUG=1`` for op metadata). The request is JSON: ``{"jobs": [{"strategy", "options"},
...], "dump_dir"}``; the payload is ``{"results": [...]}`` in meshlab.runtime.protocol's result file. Several
jobs share one process (and its ~10 s of imports) in the tests.
"""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path

from meshlab.api import apply, shard_inputs
from meshlab.parallelisms import xla
from meshlab.models.importer.build import build_model, example_inputs, forward
from meshlab.runtime.protocol import report_progress as progress
from meshlab.runtime.protocol import serve
from meshlab.runtime.requests import CheckJob, CheckRequest
from meshlab.check.setup import CheckOptions, CheckSetup, check_setup
from meshlab.core.errors import BackendError, error_message

#: The first forward's graph also computes the RoPE tables diffusers caches on the device; from the second on they
#: are inputs, so the second compiles the graph every later step runs.
FORWARDS = 2


def run_job(job: CheckJob, dump_dir: Path) -> dict:
    setup = check_setup(job.strategy, CheckOptions(**job.options))
    timings: dict[str, float] = {}
    with _timed(timings, "build"):
        progress(f"building {setup.card.class_name} ({_depth(setup)}) with random weights")
        model = build_model(setup.card, setup.options.layers, setup.strategy.workload.dtype, setup.options.seed)
        inputs = example_inputs(setup.card, setup.geometry, setup.strategy.workload.dtype, setup.options.seed)
    with _timed(timings, "reference"):
        progress("running the unsharded reference forward on the CPU (float32)")
        reference = _reference(model, inputs)
    with _timed(timings, "apply"):
        progress(f"applying the plan on {xla.device_count()} {xla.device_type()} devices")
        applied = apply(model, setup.plan, scan=setup.scan, strategy=setup.strategy)
        sharded = shard_inputs(applied, setup.planned, **inputs)  # same mesh and activations
    runs = [_run(model, sharded, i, dump_dir, timings) for i in range(FORWARDS)]
    output = [run.pop("output") for run in runs][-1]  # the steady state's
    return {
        "device_type": xla.device_type(),
        "device_count": xla.device_count(),
        "device_ids": list(xla.mesh_device_ids(applied.mesh)),
        "parameters": {name: {"sharding": xla.sharding_string(t), "slices": xla.device_slices(t),
                              "dtype": str(t.dtype).removeprefix("torch.")}
                       for name, t in model.named_parameters()},
        "forwards": runs,
        "scanned": list(applied.scanned),
        "max_abs_error": float((output - reference).abs().max()),
        "reference_max_abs": float(reference.abs().max()),
        "timings": timings,
    }


def _depth(setup: CheckSetup) -> str:
    return ", ".join(f"{n} of {setup.full_blocks[k]} {k}" for k, n in setup.checked_blocks.items())


def _reference(model, inputs: dict):
    import torch

    reference_model = copy.deepcopy(model).float()
    as_float = {k: v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v
                for k, v in inputs.items()}
    with torch.no_grad():
        output = forward(reference_model, as_float).float()
    del reference_model
    return output


def _run(model, inputs: dict, index: int, dump_dir: Path, timings: dict) -> dict:
    import torch

    progress(f"forward {index + 1} of {FORWARDS}: tracing, compiling and running on the XLA devices")
    before, compiles, compile_s, traffic = _listing(dump_dir), xla.compile_count(), xla.compile_seconds(), xla.traffic()
    start = time.perf_counter()
    try:
        with torch.no_grad(), xla.tag_layers(model):
            output = forward(model, inputs)
        xla.sync()  # as a pipeline ends each step; it also materialises the RoPE tables diffusers caches
        output = output.cpu().float()
    except RuntimeError as exc:
        raise BackendError(f"XLA failed to compile or run the sharded forward: {error_message(exc)}",
                           "run `meshlab try` on the strategy; report the message if the plan looks right") from None
    timings[f"forward_{index + 1}"] = time.perf_counter() - start
    moved = xla.traffic_since(traffic)
    return {"compiles": xla.compile_count() - compiles, "seconds": timings[f"forward_{index + 1}"],
            "compile_seconds": xla.compile_seconds() - compile_s,
            "host_transfers": {"from_device": moved.pop("from_device", 0), "to_device": moved.pop("to_device", 0),
                               "syncs": moved.pop("syncs", 0),
                               "causes": moved},
            "dump_files": sorted(set(_listing(dump_dir)) - set(before)), "output": output}


def _listing(folder: Path) -> list[str]:
    return [p.name for p in folder.iterdir()] if folder.is_dir() else []


class _timed:
    def __init__(self, timings: dict, key: str):
        self.timings, self.key = timings, key

    def __enter__(self):
        self.start = time.perf_counter()

    def __exit__(self, *exc):
        self.timings[self.key] = time.perf_counter() - self.start


def handle(request: CheckRequest) -> dict:
    xla.require()
    xla.enable_spmd()
    return {"results": [run_job(job, Path(request.dump_dir)) for job in request.jobs]}


def main(argv: list[str]) -> int:
    return serve(handle, argv, "the check", CheckRequest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
