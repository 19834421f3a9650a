"""What a run writes in its record (meshlab.experiments.records holds the file and the RunRecord model it is read
back through): the strategy and workload, the prediction for what ran, the versions, and the outcome. No torch here.
"""

from __future__ import annotations

import datetime
import platform
from pathlib import Path

from meshlab.core.errors import InputError, MeshlabError
from meshlab.experiments.compile_cache import package_version
from meshlab.experiments.records import strategy_identity
from meshlab.plan.planned import PlannedStrategy
from meshlab.runtime.devices import accelerator_platform
from meshlab.runtime.protocol import WorkerFailed
from meshlab.experiments.options import RunOptions

PACKAGES = ("meshlab", "torch", "torch_xla", "diffusers", "transformers")


def base_record(planned: PlannedStrategy, workload: dict, options: RunOptions) -> dict:
    return {
        "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "experiment": options.experiment,
        "status": "error",
        "reason": None,
        "strategy": {"name": planned.strategy.name, **strategy_identity(Path(planned.loaded.document.file))},
        "model": planned.card.name,
        "checkpoint": options.checkpoint,
        **({"layers": planned.card.source["truncated"]["layers_per_list"]} if options.checkpoint == "random" else {}),
        "backend": options.backend,
        "hardware": {"platform": (accelerator_platform() or "cpu").lower(), "devices": planned.plan.mesh.device_count,
                     "host": platform.node()},
        "versions": versions(),
        "workload": workload,
        "prediction": prediction(planned),
    }


def prediction(at_run: PlannedStrategy) -> dict:
    """meshlab's prediction for this run's workload on the strategy's hardware (a catalog entry, or a profile)."""
    from meshlab.cost.document import priced_document
    from meshlab.cost.predict import predict

    predicted = predict(at_run.plan, at_run.strategy, at_run.hardware)
    return {"hardware": at_run.hardware.name, "kind": at_run.hardware.kind, "chips": at_run.hardware.chips,
            **({"profile": at_run.hardware.profile.path,
                "profile_backend": at_run.hardware.profile.device.get("backend"),
                "profile_digest": at_run.hardware.profile.digest}
               if at_run.hardware.profile is not None else {}),
            "model": at_run.card.name,
            "config_digest": at_run.card.config_digest, "batch": at_run.strategy.workload.batch,
            "dtype": at_run.strategy.workload.dtype, "step_s": predicted.step.total,
            "seconds_per_image": predicted.seconds_per_image,
            "denoise_seconds_per_image": predicted.denoise_seconds_per_image, "terms": predicted.terms.to_json(),
            "compute_s": predicted.step.compute,
            "local_s": predicted.step.local, "collective_s": predicted.step.collective,
            "overhead_s": predicted.step.overhead, "launch_wait_s": predicted.step.launch_wait,
            "launch_floor_s": predicted.step.launch_floor,
            "peak_bytes_per_chip": at_run.memory.most_loaded.total, "fits": at_run.memory.fits,
            "text_tokens": at_run.strategy.workload.text_tokens,
            "elementwise": at_run.strategy.compile.elementwise,
            "priced": priced_document(predicted),
            "note": ("predicted from the profile named as the strategy's hardware" if at_run.hardware.profile
                     is not None else "predicted for the strategy's catalog hardware at this run's workload, "
                     "not for its devices")}


def versions() -> dict:
    return {"python": platform.python_version()} | {package: package_version(package) for package in PACKAGES}


def failure(error: MeshlabError) -> dict:
    if isinstance(error, WorkerFailed):
        return {"status": error.status, "reason": error.problem}
    return {"status": "refused" if isinstance(error, InputError) else "error", "reason": error.problem}


def success(result: dict, image: Path | None) -> dict:
    summary = result["summary"]
    timings = summary["timings"] | {"compile_s": summary["counters"].get("compile_s")}
    return {"status": "ok", "reason": None, "timings": timings, "cache": result.get("cache"),
            "host_transfers": summary["counters"].get("host_transfers"), "scanned": result.get("scanned", []),
            "compiles": {"total": summary["counters"]["compiles_total"],
                         "steady": summary["counters"]["compiles_steady"]},
            "fallbacks": summary["counters"].get("run_fallbacks", {}),
            "mismatches": result.get("mismatches", []), "memory": result.get("memory"),
            "hardware_seen": result.get("hardware"), "image": str(image) if image else None,
            "max_abs_error_vs_cpu": result.get("max_abs_error"), "ran": result.get("ran")}
