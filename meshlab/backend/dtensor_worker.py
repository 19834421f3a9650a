"""The torch half of `meshlab check --backend dtensor`: ``python -m meshlab.backend.dtensor_worker REQUEST RESULT``.

It runs the float32 reference forward on the unsharded model, then starts one process per device with
``torch.multiprocessing`` (the gloo backend on the CPU: no torchrun needed). Every rank builds the same random
weights, applies the plan with ``meshlab.apply(..., backend="dtensor")``, reads back its local shards, and runs
the sharded forward under ``CommDebugMode``, which counts the collectives DTensor issues. Each rank writes its
findings to its own file; a rank's failure comes back as that rank's error. The ranks die with this process
(``PR_SET_PDEATHSIG``) and ``torch.multiprocessing`` stops the others when one fails, so no process is left behind.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import tempfile
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path

from meshlab.backend.protocol import _ERRORS, error_document, serve
from meshlab.backend.protocol import report_progress as progress
from meshlab.errors import BackendError

#: CommDebugMode's op names, as the kinds meshlab's cost model and XLA's HLO use.
KINDS = {"all_reduce": "all-reduce", "all_gather_into_tensor": "all-gather", "reduce_scatter_tensor": "reduce-scatter",
         "all_to_all_single": "all-to-all", "shard_dim_alltoall": "all-to-all", "all_gather": "all-gather",
         "broadcast": "broadcast", "scatter": "scatter", "reduce_scatter": "reduce-scatter", "all_to_all": "all-to-all"}
#: How long a rank waits on the others before gloo gives up (a rank that died leaves the rest waiting).
RANK_TIMEOUT_S = 600


def handle(request: dict) -> dict:
    import torch
    import torch.multiprocessing as mp

    job, world = request["job"], request["world"]
    with tempfile.TemporaryDirectory(prefix="meshlab-ranks-") as scratch:
        start = time.perf_counter()
        progress("running the unsharded reference forward on the CPU (float32)")
        torch.save(_reference(job), Path(scratch) / "reference.pt")
        reference_s = time.perf_counter() - start
        progress(f"starting {world} gloo processes; each builds the model and applies the plan with DTensor")
        try:
            mp.start_processes(_rank, args=(world, _free_port(), job, scratch), nprocs=world, join=True,
                               start_method="spawn")
        except Exception as exc:  # noqa: BLE001 - the ranks' own error files say what went wrong
            _raise_rank_error(Path(scratch), world, exc)
        ranks = [json.loads((Path(scratch) / f"rank{r}.json").read_text()) for r in range(world)]
    ranks[0]["timings"]["reference"] = reference_s
    return {"ranks": ranks}


def _reference(job: dict):
    import torch

    from meshlab.backend.models import build_model, example_inputs, forward
    from meshlab.backend.setup import CheckOptions, check_setup

    setup = check_setup(job["strategy"], CheckOptions(**job["options"]))
    model = build_model(setup.card, setup.options.layers, setup.strategy.workload.dtype, setup.options.seed).float()
    inputs = example_inputs(setup.card, setup.geometry, setup.strategy.workload.dtype, setup.options.seed)
    inputs = {k: v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in inputs.items()}
    with torch.no_grad():
        return forward(model, inputs).float()


def _rank(rank: int, world: int, port: int, job: dict, scratch: str) -> None:
    import torch
    import torch.distributed as dist

    _die_with_parent()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    folder = Path(scratch)
    try:
        dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=RANK_TIMEOUT_S))
        found = _run_rank(rank, job, folder)
        _write(folder / f"rank{rank}.json", found)
    except BaseException as exc:  # noqa: BLE001 - every failure goes back as this rank's error
        _write(folder / f"error{rank}.json", error_document(exc, f"rank {rank} of the DTensor check"))
        raise SystemExit(1) from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _run_rank(rank: int, job: dict, folder: Path) -> dict:
    import torch
    from torch.distributed.tensor.debug import CommDebugMode

    from meshlab.api import apply, shard_inputs
    from meshlab.backend import dtensor
    from meshlab.backend.models import build_model, example_inputs, forward
    from meshlab.backend.setup import CheckOptions, check_setup

    timings: dict[str, float] = {}
    setup = check_setup(job["strategy"], CheckOptions(**job["options"]))
    start = time.perf_counter()
    model = build_model(setup.card, setup.options.layers, setup.strategy.workload.dtype, setup.options.seed)
    inputs = example_inputs(setup.card, setup.geometry, setup.strategy.workload.dtype, setup.options.seed)
    applied = apply(model, setup.plan, strategy=setup.strategy, backend="dtensor")
    sharded = shard_inputs(applied, setup.planned, **inputs)
    timings["build_and_apply"] = time.perf_counter() - start
    if rank == 0:
        progress("running the sharded forward on every rank")
    start = time.perf_counter()
    with dtensor.forward_context(), CommDebugMode() as comm:
        output = forward(model, sharded)
    timings["forward"] = time.perf_counter() - start
    whole = dtensor.whole(output).float()
    found = {"rank": rank, "position": dtensor.mesh_position(applied.mesh, setup.plan.mesh),
             "parameters": [p.to_json() for p in applied.parameters],
             "local_weight_bytes": dtensor.local_bytes(model),
             "collectives": _kinds(comm.get_comm_counts()),
             "collectives_per_module": {fqn: _kinds(counts["forward"])
                                        for fqn, counts in comm.comm_module_counts.items() if counts["forward"]},
             "timings": timings}
    if rank == 0:
        reference = torch.load(folder / "reference.pt")
        found["max_abs_error"] = float((whole - reference).abs().max())
        found["reference_max_abs"] = float(reference.abs().max())
    return found


def _kinds(counts) -> dict[str, int]:
    kinds: Counter = Counter()
    for op, count in counts.items():
        name = str(op).rsplit(".", 1)[-1].removesuffix(".default")
        kinds[KINDS.get(name, name)] += int(count)
    return dict(kinds)


def _raise_rank_error(folder: Path, world: int, exc: BaseException) -> None:
    for rank in range(world):
        path = folder / f"error{rank}.json"
        if path.exists():
            error = json.loads(path.read_text())
            raise _ERRORS.get(error["type"], BackendError)(error["problem"], error["fix"]) from None
    raise BackendError(f"the DTensor ranks could not start or stopped: {str(exc).strip().splitlines()[-1][:300]}",
                       "check that this host can start processes and open local TCP ports; rerun with "
                       "MESHLAB_DEBUG=1 for the traceback") from None


def _write(path: Path, document: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(document))
    os.replace(tmp, path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent() -> None:
    """Linux: this rank gets SIGKILL when the worker that started it dies, however it dies."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass


def main(argv: list[str]) -> int:
    return serve(handle, argv, "the DTensor check")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
