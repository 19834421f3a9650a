"""The torch half of `meshlab check --backend dtensor`: ``python -m meshlab.workers.check_dtensor REQUEST RESULT``.

It runs the float32 reference forward on the unsharded model, then starts one gloo process per device
(meshlab.workers.ranks). Every rank builds the same random weights, applies the plan with
``meshlab.apply(..., backend="dtensor")``, reads back its local shards, and runs the sharded forward under
``CommDebugMode``, which counts the collectives DTensor issues.
"""

from __future__ import annotations

import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from meshlab.runtime.protocol import report_progress as progress
from meshlab.runtime.protocol import serve
from meshlab.runtime.requests import CheckJob, DTensorCheckRequest
from meshlab.runtime.results import DTensorRankCheck

#: CommDebugMode's op names, as the kinds meshlab's cost model and XLA's HLO use.
KINDS = {"all_reduce": "all-reduce", "all_gather_into_tensor": "all-gather", "reduce_scatter_tensor": "reduce-scatter",
         "all_to_all_single": "all-to-all", "shard_dim_alltoall": "all-to-all", "all_gather": "all-gather",
         "broadcast": "broadcast", "scatter": "scatter", "reduce_scatter": "reduce-scatter", "all_to_all": "all-to-all"}


#: What every rank imports, imported once in the server the ranks are forked from (meshlab.workers.ranks).
RANK_MODULES = ("torch.distributed.tensor.debug", "meshlab.api", "meshlab.parallelisms.dtensor",
                "meshlab.models.importer.build", "meshlab.check.setup", "diffusers.models.transformers")


def handle(request: DTensorCheckRequest) -> dict:
    import torch

    from meshlab.workers.ranks import spawn

    jobs, world = request.jobs, request.world
    with tempfile.TemporaryDirectory(prefix="meshlab-references-") as scratch:
        references, reference_s = [], []
        for index, job in enumerate(jobs):
            start = time.perf_counter()
            progress(f"running the unsharded reference forward on the CPU (float32), {index + 1} of {len(jobs)}")
            references.append(str(Path(scratch) / f"reference{index}.pt"))
            torch.save(_reference(job), references[-1])
            reference_s.append(time.perf_counter() - start)
        progress(f"starting {world} gloo processes; each builds the model and applies the plan with DTensor")
        ranks = spawn(_check_rank, world, {"jobs": jobs, "references": references}, list[DTensorRankCheck],
                      preload=RANK_MODULES)
    for index, seconds in enumerate(reference_s):
        ranks[0][index]["timings"]["reference"] = seconds
    return {"results": [[rank[index] for rank in ranks] for index in range(len(jobs))]}


def _reference(job: CheckJob):
    import torch

    from meshlab.models.importer.build import build_model, example_inputs, forward
    from meshlab.check.setup import CheckOptions, check_setup

    setup = check_setup(job.strategy, CheckOptions(**job.options))
    model = build_model(setup.card, setup.options.layers, setup.strategy.workload.dtype, setup.options.seed).float()
    inputs = example_inputs(setup.card, setup.geometry, setup.strategy.workload.dtype, setup.options.seed)
    inputs = {k: v.float() if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in inputs.items()}
    with torch.no_grad():
        return forward(model, inputs).float()


def _check_rank(payload: dict, _folder: Path) -> list[dict]:
    import torch.distributed as dist

    rank = dist.get_rank()
    return [_run_rank(rank, job, reference) for job, reference in zip(payload["jobs"], payload["references"])]


def _run_rank(rank: int, job: CheckJob, reference_path: str) -> dict:
    import torch
    from torch.distributed.tensor.debug import CommDebugMode

    from meshlab.api import apply, shard_inputs
    from meshlab.parallelisms import dtensor
    from meshlab.models.importer.build import build_model, example_inputs, forward
    from meshlab.check.setup import CheckOptions, check_setup

    timings: dict[str, float] = {}
    setup = check_setup(job.strategy, CheckOptions(**job.options))
    start = time.perf_counter()
    model = build_model(setup.card, setup.options.layers, setup.strategy.workload.dtype, setup.options.seed)
    inputs = example_inputs(setup.card, setup.geometry, setup.strategy.workload.dtype, setup.options.seed)
    applied = apply(model, setup.plan, strategy=setup.strategy, backend="dtensor")
    sharded = shard_inputs(applied, setup.planned, **inputs)
    timings["build_and_apply"] = time.perf_counter() - start
    if rank == 0:
        progress(f"running the sharded forward on every rank ({setup.strategy.name})")
    start = time.perf_counter()
    with dtensor.forward_context(), CommDebugMode() as comm, dtensor.missing_rules():
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
        reference = torch.load(reference_path)
        found["max_abs_error"] = float((whole - reference).abs().max())
        found["reference_max_abs"] = float(reference.abs().max())
    return found


def _kinds(counts) -> dict[str, int]:
    kinds: Counter = Counter()
    for op, count in counts.items():
        name = str(op).rsplit(".", 1)[-1].removesuffix(".default")
        kinds[KINDS.get(name, name)] += int(count)
    return dict(kinds)


def main(argv: list[str]) -> int:
    return serve(handle, argv, "the DTensor check", DTensorCheckRequest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
