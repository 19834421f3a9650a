"""`meshlab check --backend dtensor`: plan here (no torch), run the ranks through meshlab.workers.check_dtensor,
hold every rank's local shards and the sharded forward against the plan.

What is compared, per parameter and rank: the DTensor placements, the local shard shape (``torch.chunk`` rule,
meshlab.plan.placements) and whether the local tensor is exactly the slice of the whole weight the plan gives that
rank. The forward's output against the unsharded float32 reference, within the dtype's tolerance. The collectives
DTensor's ops issued (``CommDebugMode``) are recorded beside meshlab's prediction, which prices what XLA's
partitioner does: DTensor propagates shardings op by op and may move other data, so they are shown, not held to it.
"""

from __future__ import annotations

import importlib.util
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from meshlab.runtime.protocol import Progress, WorkerFailed, call_worker
from meshlab.runtime.results import DTensorCheckPayload
from meshlab.runtime.requests import CheckJob, DTensorCheckRequest
from meshlab.check.setup import CheckOptions, CheckSetup, check_setup
from meshlab.check.verdict import OutputVerdict, predicted_per_block
from meshlab.runtime.devices import torch_environment
from meshlab.core.errors import InputError, MeshlabError, MissingExtra
from meshlab.plan.placements import local_shape, placements_of, required
from meshlab.core.spec import PartitionSpec


@dataclass(frozen=True)
class RankedParameter:
    """One parameter on every rank: the plan's placements and local shapes against what each rank holds."""

    name: str
    shape: tuple[int, ...]
    spec: PartitionSpec
    predicted_placements: str
    placements: tuple[str, ...]  # per rank
    predicted_shard_shapes: tuple[tuple[int, ...], ...]  # per rank
    shard_shapes: tuple[tuple[int, ...], ...]  # per rank
    holds_its_slice: tuple[bool, ...]  # per rank

    @property
    def disagreeing_ranks(self) -> tuple[int, ...]:
        return tuple(r for r, (p, s, held, placed) in enumerate(zip(
            self.predicted_shard_shapes, self.shard_shapes, self.holds_its_slice, self.placements))
            if p != s or not held or placed != self.predicted_placements)

    @property
    def agrees(self) -> bool:
        return not self.disagreeing_ranks

    def to_json(self) -> dict:
        return {"name": self.name, "shape": list(self.shape), "predicted_spec": self.spec.to_json(),
                "predicted_placements": self.predicted_placements, "placements": self.placements[0],
                "predicted_shard_shape": list(self.predicted_shard_shapes[0]),
                "shard_shape": list(self.shard_shapes[0]),
                "predicted_shard_shapes_per_rank": [list(s) for s in self.predicted_shard_shapes],
                "shard_shapes_per_rank": [list(s) for s in self.shard_shapes],
                "disagreeing_ranks": list(self.disagreeing_ranks), "agrees": self.agrees}


@dataclass(frozen=True)
class DTensorCheckReport(OutputVerdict):
    setup: CheckSetup
    parameters: tuple[RankedParameter, ...]
    max_abs_error: float
    reference_max_abs: float
    collectives: dict[str, int]  # what DTensor issued in the whole forward (rank 0), by kind
    collectives_per_block: dict[str, dict[str, int]]  # by block ("transformer_blocks.0"), rank 0
    local_weight_bytes: tuple[int, ...]  # per rank
    timings: dict

    @property
    def world(self) -> int:
        return len(self.local_weight_bytes)

    @property
    def agrees(self) -> bool:
        return not self.mismatches and self.output_agrees

    @property
    def predicted_weight_bytes(self) -> tuple[int, ...]:
        """Per rank, the plan's local weight bytes under DTensor's chunking (meshlab.plan.placements)."""
        mesh = self.setup.plan.mesh
        return tuple(sum(math.prod(local_shape(p.shape, p.spec, mesh, rank)) * _itemsize(p.parameter.dtype)
                         for p in self.setup.plan.parameters) for rank in range(mesh.device_count))

    def predicted_per_block(self) -> dict[str, Counter]:
        return predicted_per_block(self.setup)


def _itemsize(dtype: str) -> int:
    from meshlab.models.card import DTYPE_BYTES

    return DTYPE_BYTES.get(dtype, 2)


def run_dtensor_check(path: str | Path, options: CheckOptions, progress: Progress = lambda _: None,
                      ) -> DTensorCheckReport:
    (report,) = run_dtensor_checks([path], options, progress)
    return report


def run_dtensor_checks(paths: list[str | Path], options: CheckOptions, progress: Progress = lambda _: None,
                       ) -> list[DTensorCheckReport]:
    """Check several strategy files on one set of ranks (they must plan for the same number of devices)."""
    if options.scan:
        raise InputError("--scan runs block lists through torch_xla's scan, which the DTensor backend does not have",
                         "drop --scan with --backend dtensor")
    setups = [check_setup(path, options) for path in paths]
    for setup in setups:
        try:
            refuse_inexpressible(setup)
        except MeshlabError as exc:
            raise setup.planned.loaded.place(exc) from None
    require_torch()
    worlds = {s.plan.mesh.device_count for s in setups}
    if len(worlds) > 1:
        raise InputError(f"the strategies plan for different device counts {sorted(worlds)}", "check them one by one")
    world = worlds.pop()
    request = DTensorCheckRequest(jobs=[CheckJob(strategy=str(path), options=options.to_json()) for path in paths],
                                  world=world)
    try:
        results = call_worker("meshlab.workers.check_dtensor", request, torch_environment(),
                              DTensorCheckPayload, progress=progress)["results"]
    except WorkerFailed as error:
        if error.status != "oom":
            raise
        raise WorkerFailed(error.problem, f"check fewer blocks (--layers 1) or a smaller image; the {world} ranks "
                           "each build the model in this host's memory", status="oom") from None
    return [build_report(setup, ranks) for setup, ranks in zip(setups, results)]


def refuse_inexpressible(setup: CheckSetup) -> None:
    """The plan's specs DTensor cannot hold, refused before any process starts, with the first reason."""
    from meshlab.plan.activations import rule_spec

    mesh = setup.plan.mesh
    for p in setup.plan.parameters:
        required(p.spec, mesh, p.name)
    for index, rule in enumerate(setup.strategy.activations.rules):
        required(rule_spec(rule), mesh, f"{rule.point} (activations.rules[{index}])", ("activations", "rules", index))


def require_torch() -> None:
    for package in ("torch", "diffusers"):
        if importlib.util.find_spec(package) is None:
            raise MissingExtra(f"{package} is not installed, and the DTensor check needs it",
                               "pip install -e '.[xla]' (torch and diffusers; torch_xla is not needed for DTensor)")


def build_report(setup: CheckSetup, ranks: list[dict]) -> DTensorCheckReport:
    mesh = setup.plan.mesh
    held = [{p["name"]: p for p in rank["parameters"]} for rank in ranks]
    positions = [rank["position"] for rank in ranks]
    parameters = []
    for p in setup.plan.parameters:
        measured = [h[p.name] for h in held]
        parameters.append(RankedParameter(
            p.name, p.shape, p.spec, str(placements_of(p.spec, mesh)), tuple(m["placements"] for m in measured),
            tuple(local_shape(p.shape, p.spec, mesh, pos) for pos in positions),
            tuple(tuple(m["shard_shape"]) for m in measured), tuple(m["holds_its_slice"] for m in measured)))
    first = ranks[0]
    per_block = {}
    for fqn, counts in first["collectives_per_module"].items():
        parts = fqn.split(".")
        if len(parts) == 3 and parts[2].isdigit():  # Class.list.index: one block
            per_block[f"{parts[1]}.{parts[2]}"] = counts
    return DTensorCheckReport(setup, tuple(parameters), first["max_abs_error"], first["reference_max_abs"],
                              first["collectives"], per_block, tuple(r["local_weight_bytes"] for r in ranks),
                              first["timings"])


def dtensor_check_document(report: DTensorCheckReport) -> dict:
    """The JSON of `meshlab check --backend dtensor --json`."""
    setup = report.setup
    return {
        "backend": "dtensor",
        "strategy": {"name": setup.strategy.name, "file": str(setup.planned.loaded.path)},
        "model": {"name": setup.card.name, "class": setup.card.class_name, "blocks": setup.checked_blocks,
                  "full_blocks": setup.full_blocks},
        "device": {"type": "cpu", "count": report.world, "process_group": "gloo"},
        "options": setup.options.to_json(),
        "forward": {"batch": setup.geometry.batch, "image_tokens": setup.geometry.image_tokens,
                    "text_tokens": setup.geometry.text_tokens, "dtype": setup.strategy.workload.dtype},
        "agrees": report.agrees,
        "mismatches": [p.name for p in report.mismatches],
        "parameters": [p.to_json() for p in report.parameters],
        "weights_per_rank": {"predicted": list(report.predicted_weight_bytes),
                             "dtensor": list(report.local_weight_bytes)},
        "collectives_issued": report.collectives,
        "collectives_issued_per_block": report.collectives_per_block,
        "predicted_collectives_per_block": {k: dict(v) for k, v in report.predicted_per_block().items()},
        "collectives_note": "predicted: what XLA's partitioner does for the plan (meshlab's cost model); issued: "
                            "what DTensor's sharding propagation issued (CommDebugMode). Recorded side by side, "
                            "not held to each other.",
        "max_abs_error": report.max_abs_error,
        "reference_max_abs": report.reference_max_abs,
        "tolerance": report.tolerance,
        "timings_seconds": report.timings,
    }
