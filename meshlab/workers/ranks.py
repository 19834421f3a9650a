"""Start one process per device for torch.distributed on this host, or join the ranks torchrun started.

``spawn(target, world, payload, result)`` runs ``target(payload, folder)`` on every rank of a fresh gloo process
group (``torch.multiprocessing``, no torchrun needed) and returns each rank's result, read through the type `result`
(a model of meshlab.runtime.results, or a list of one) as the parent reads a worker's payload. The ranks meet
through a file in their own scratch folder (torch.distributed's ``FileStore``), not at a port picked
beforehand, which another process on the host could take before rank 0 listens on it. A rank's failure
comes back as that rank's meshlab error; the ranks die with the process that started them (Linux
``PR_SET_PDEATHSIG``; forked from a forkserver, through the server, which dies with it), and
``torch.multiprocessing`` stops the others when one fails, so no rank is left behind.
Under ``torchrun`` (``RANK`` and ``WORLD_SIZE`` set), ``joined()`` initialises the group from the environment
instead: nccl on CUDA, else gloo.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

from meshlab.runtime.protocol import _ERRORS, WorkerError, die_with_parent, error_document, read_payload
from meshlab.core.errors import BackendError

#: How long a rank waits on the others before the group gives up (a rank that died leaves the rest waiting).
RANK_TIMEOUT = timedelta(seconds=600)

Target = Callable[[Any, Path], Any]


def spawn(target: Target, world: int, payload: Any, result: Any, folder: Path | None = None,
          preload: tuple[str, ...] = ()) -> list:
    """`target(payload, folder)` on `world` gloo ranks of this host; each rank's JSON-ready result, by rank, once
    read through `result`. Without CUDA the ranks are forked from one fresh server process that has imported
    torch and the modules in `preload` (multiprocessing's forkserver): the imports, seconds of CPU each, are paid
    once and not once per rank; the server runs no torch op. A CUDA host spawns each rank afresh (no process that
    may have touched the driver is forked). The server is started, with its preloads, by a process's first spawn:
    a worker spawns its ranks once."""
    import multiprocessing

    import torch.multiprocessing as mp

    method = "spawn" if _cuda_host() else "forkserver"
    if method == "forkserver":  # read once, when the server starts: one spawn per worker process
        multiprocessing.get_context(method).set_forkserver_preload(
            ["meshlab.workers.rank_server", "torch", "torch.distributed", _module_of(target), *preload])
    with tempfile.TemporaryDirectory(prefix="meshlab-ranks-", dir=folder) as scratch:
        try:
            mp.start_processes(_rank, args=(world, target, payload, scratch), nprocs=world, join=True,
                               start_method=method)
        except Exception as exc:  # noqa: BLE001 - the ranks' own error files say what went wrong
            _raise_rank_error(Path(scratch), world, exc)
        return [read_payload(json.loads((Path(scratch) / f"rank{r}.json").read_text())["result"], result,
                             f"rank {r} of {world}") for r in range(world)]


def _module_of(target: Target) -> str:
    """The module `target` is defined in, by its import name: a worker run as ``python -m`` is ``__main__``, which
    the forkserver does not preload (each rank imports it again as ``__mp_main__``, its imports already there)."""
    module = target.__module__
    spec = getattr(sys.modules.get(module), "__spec__", None)
    return spec.name if module == "__main__" and spec is not None else module


def _cuda_host() -> bool:
    """Whether this host shows CUDA devices (decided without touching the driver)."""
    return os.path.exists("/dev/nvidiactl") and os.environ.get("CUDA_VISIBLE_DEVICES") not in ("", "-1")


def under_torchrun() -> bool:
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def joined() -> None:
    """Join the process group torchrun describes in the environment (nccl with CUDA, else gloo)."""
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo",
                                timeout=RANK_TIMEOUT)


def _rank(rank: int, world: int, target: Target, payload: Any, scratch: str) -> None:
    import torch
    import torch.distributed as dist

    die_with_parent()
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    folder = Path(scratch)
    try:
        store = dist.FileStore(os.path.abspath(folder / "rendezvous"), world)  # a path, not a URL: as written
        store.set_timeout(RANK_TIMEOUT)  # as init_method's store had (its own: 300 s)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world,
                                timeout=RANK_TIMEOUT)
        _write(folder / f"rank{rank}.json", {"result": target(payload, folder)})
    except BaseException as exc:  # noqa: BLE001 - every failure goes back as this rank's error
        _write(folder / f"error{rank}.json", error_document(exc, f"rank {rank} of {world}").model_dump())
        raise SystemExit(1) from None
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def _raise_rank_error(folder: Path, world: int, exc: BaseException) -> None:
    for rank in range(world):
        path = folder / f"error{rank}.json"
        if path.exists():
            error = WorkerError.model_validate_json(path.read_text())
            raise _ERRORS[error.type](error.problem, error.fix) from None
    raise BackendError(f"the ranks could not start or stopped: {str(exc).strip().splitlines()[-1][:300]}",
                       "check that this host can start processes, write its temporary folder and open local TCP "
                       "ports; rerun with MESHLAB_DEBUG=1 for the traceback") from None


def _write(path: Path, document: dict) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(document))
    os.replace(tmp, path)


