"""The torch half of `meshlab run`, in its own process: ``python -m meshlab.workers.run_xla REQUEST``.

The parent (``meshlab.experiments.run``) sets the device environment before torch_xla starts. The request names the
strategy, the local checkpoint, the workload and a scratch folder (or ``{"build_tiny": DIR}``); the payload, in
meshlab.runtime.protocol's result file, is the run's summary, the image path, what apply read back, and the
per-device memory XLA reported. Failures go back as the protocol's errors (refused, oom, error).
"""

from __future__ import annotations

import sys
from pathlib import Path

from meshlab.runtime.requests import BuildTinyRequest, XlaRunRequest


def run(request: XlaRunRequest) -> dict:
    """One run; bad input (a plan that does not apply to the checkpoint) raises InputError, reported as refused."""
    import torch_xla.runtime as xr

    xr.use_spmd()  # before any XLA tensor exists
    if request.cache_dir:
        xr.initialize_cache(request.cache_dir, readonly=False)
    from meshlab.parallelisms import xla
    from meshlab.plan.inputs import input_spec
    from meshlab.pipelines.runner import run_pipeline, run_reference
    from meshlab.pipelines.stock import load_checkpoint

    w = request.workload
    negative = request.negative_prompt if w.cfg else None
    knobs = (request.prompt, negative, w.steps, w.height, w.width, w.cfg_scale, request.seed)
    reference = None
    if request.verify:  # the stock pipeline on the CPU, on a second copy of the weights
        reference, _ = run_reference(load_checkpoint(request), *knobs)
    pipe = load_checkpoint(request)
    strategy, card, plan = plan_for(request.strategy, pipe.transformer)
    applied = {}

    def shard(transformer, vae):
        from meshlab.api import apply

        applied["value"] = apply(transformer, plan, scan=bool(request.scan), strategy=strategy)
        return applied["value"].mesh

    def mark_input(name, tensor):
        xla.mark(tensor, applied["value"].mesh, input_spec(name, tuple(tensor.shape), strategy.activations,
                                                          plan.mesh), name)

    before = xla.persistent_cache()
    result = run_pipeline(pipe, *knobs, shard=shard, batch=w.batch, mark_input=mark_input,
                          joint_guidance=bool(request.joint_guidance))
    cache = None
    summary = result.summary()
    if request.cache_dir:
        after = xla.persistent_cache()
        cache = cache_outcome(request.cache_dir, {k: after[k] - before[k] for k in after})
        if cache["deserialize_failures"]:
            summary["warnings"].append(cache["note"])
    image = Path(request.scratch) / "image.png"
    result.image.save(image)
    mismatches = [p.name for p in applied["value"].mismatches]
    return {"summary": summary, "image": str(image), "mismatches": mismatches,
            "memory": xla_memory(Path(request.scratch) / "xla-dump"), "is_writer": xr.process_index() == 0,
            "hardware": {"device_type": xr.device_type(), "devices": xr.global_runtime_device_count()},
            "cache": cache, "scanned": list(applied["value"].scanned),
            "ran": {"model": card.name, "config_digest": card.config_digest, "batch": w.batch,
                    "dtype": str(pipe.transformer.dtype).removeprefix("torch.")},
            "max_abs_error": None if reference is None else float(abs(result.pixels - reference).max())}


def cache_outcome(folder: str, counted: dict) -> dict:
    """Whether the compile cache was read (`counted`: this run's ``xla.persistent_cache()`` counts): hits, misses,
    and programs found but not loadable (torch_xla 2.9 cannot deserialize the executables it wrote on the CPU,
    pytorch/xla#9094: it then compiles again, and says so here)."""
    hits, misses, failures = counted["hits"], counted["misses"], counted["deserialize_failures"]
    outcome = {"dir": folder, "hits": hits, "misses": misses, "deserialize_failures": failures,
               "hit": hits > 0 and misses == 0 and failures == 0}
    if failures:
        outcome["note"] = (f"the compile cache held {failures} program(s) of this plan but torch_xla could not load "
                           "them (PersistentCacheDeserializeFailure, pytorch/xla#9094): XLA compiled them again")
    return outcome


def plan_for(strategy_path: str, transformer, devices: int | None = None):
    """The strategy, the card of the checkpoint's own transformer (a shipped card when it is one), and the
    strategy's rules planned over that card for `devices` (None: torch_xla's device count)."""
    from meshlab.models.card import builtin_cards, load_card
    from meshlab.plan.planner import make_plan
    from meshlab.plan.planned import plan_file

    planned = plan_file(strategy_path)
    config = {k: v for k, v in dict(transformer.config).items() if not k.startswith("_")}
    card = next((c for c in map(load_card, builtin_cards()) if _same_model(c, transformer, config)), None)
    if card is None:  # a shipped model cut to fewer blocks (--checkpoint random --layers N): its card, cut alike
        card = next((_cut(c, config) for c in map(load_card, builtin_cards())
                     if _same_model(c, transformer, config, ignore=_depth_keys(c))), None)
    if card is None:
        from meshlab.models.importer.card_import import import_card

        card = import_card(type(transformer).__name__, config, name="checkpoint")
    if devices is None:
        import torch_xla.runtime as xr

        devices = xr.global_runtime_device_count()
    return planned.strategy, card, make_plan(planned.strategy, card, devices)


def _same_model(card, transformer, config: dict, ignore: tuple[str, ...] = ()) -> bool:
    source = card.source.get("config", {})
    return card.class_name == type(transformer).__name__ and all(source.get(k) == v for k, v in config.items()
                                                                 if k in source and k not in ignore)


def _depth_keys(card) -> tuple[str, ...]:
    """The config keys that give a block list's depth (meshlab.models.importer.forward_inputs' families)."""
    from meshlab.models.families import FAMILIES

    family = FAMILIES.get(card.class_name)
    return tuple(key for _attr, key in family.blocks) if family else ()


def _cut(card, config: dict):
    """`card` cut to the blocks per list `config` has: same name and config digest (the full model's), so a run of
    the cut model is compared with the prediction for it (meshlab.plan.planned.at_depth)."""
    from meshlab.models.truncate import truncate_card

    return truncate_card(card, max(int(config[key]) for key in _depth_keys(card)))


def xla_memory(dump: Path) -> dict | None:
    """The largest per-device "Total bytes used" over the dumped programs (None when XLA wrote no report).

    Under SPMD the runtime has no memory API (``xm.get_memory_info`` raises for the SPMD virtual device), so the
    compiler's buffer assignment is the per-device figure on every platform."""
    from meshlab.check.hlo import total_bytes_used

    reports = sorted(dump.glob("*memory-usage-report.txt")) if dump.is_dir() else []
    totals = [t for t in (total_bytes_used(r.read_text()) for r in reports) if t is not None]
    if not totals:
        return None
    return {"source": "XLA dump memory-usage reports (largest program)", "peak_bytes_per_device": max(totals),
            "programs": len(totals)}


def handle(request: XlaRunRequest | BuildTinyRequest) -> dict:
    if isinstance(request, BuildTinyRequest):
        from meshlab.pipelines.tiny import build_tiny_pipeline

        build_tiny_pipeline(Path(request.build_tiny))
        return {"built": request.build_tiny}
    return run(request)


def main(argv: list[str]) -> int:
    from meshlab.runtime.protocol import serve

    return serve(handle, argv, "the run", XlaRunRequest | BuildTinyRequest)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
