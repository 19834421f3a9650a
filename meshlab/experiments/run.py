"""`meshlab run`: the whole pipeline with a plan applied, timed, and recorded in experiments/results/.

The parent (this module, no torch) plans the strategy, refuses a plan that does not fit unless forced, starts
the torch worker (``meshlab.workers.run_xla``) in a child process with the device environment, and writes
the outcome: the image (moved into place atomically) and one record appended atomically to
``<results>/<strategy>.jsonl``. Every outcome, refused, failed or ok, leaves a record; none leaves a partial file.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import shutil
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from meshlab.runtime.protocol import WorkerFailed, call_worker
from meshlab.runtime.results import BuiltPayload, RunPayload
from meshlab.runtime.requests import BuildTinyRequest, TorchRunRequest, XlaRunRequest
from meshlab.runtime.devices import child_environment, torch_environment
from meshlab.core.errors import BackendError, InputError, Location, MeshlabError, MissingExtra
from meshlab.experiments.records import RunRecord, append_record, run_record
from meshlab.core.files import cache_root, file_stem, output_folder
from meshlab.experiments.compile_cache import cache_for
from meshlab.experiments.definition import given
from meshlab.experiments.options import RUN_BACKENDS, RunOptions
from meshlab.experiments.recording import base_record, failure, prediction, success
from meshlab.experiments.refusals import refuse_placement, refuse_ring
from meshlab.plan.planned import (PlannedStrategy, at_depth, gives_elementwise, plan_file, with_elementwise,
                              with_workload)

@dataclass(frozen=True)
class RunOutcome:
    record: RunRecord
    record_path: Path
    image: Path | None = None
    warnings: tuple[str, ...] = field(default=())


def run_strategy(path: Path, options: RunOptions) -> RunOutcome:
    """Run one strategy file end to end; raises after recording when the run did not succeed."""
    planned, workload = preflight(path, options)
    options = replace(options, backend=resolve_backend(options.backend, planned.plan.mesh.device_count))
    notes = []
    ran, said = RUNS_ELEMENTWISE.get(options.backend), planned.strategy.compile.elementwise  # unknown: refused below
    if ran is not None and said != ran:  # price what runs, as the text length below
        planned = with_elementwise(planned, ran)
        notes.append(f"priced with compile: {{elementwise: {ran}}}, as --backend {options.backend} runs it (the "
                     + (f"strategy says {said})" if gives_elementwise(planned.loaded) else
                        f"strategy leaves it out: {said} on its system)"))
    if options.checkpoint == "random":
        from meshlab.models.truncate import block_lists
        from meshlab.models.truncate import card_as_built

        options = replace(options, layers=options.layers or max(block_lists(planned.card).values()))
        planned = at_depth(planned, options.layers)
        built = card_as_built(planned.card, options.layers)
        planned = replace(planned, card=built, plan=replace(planned.plan, card=built))
    elif options.layers is not None:
        raise InputError("--layers cuts the blocks of a pipeline meshlab builds, and a saved checkpoint is run whole",
                         "use --checkpoint random with --layers, or drop --layers")
    record = base_record(planned, workload, options)
    record_path = options.results_dir / f"{file_stem(planned.strategy.name)}.jsonl"
    if record_path.is_dir():
        raise InputError(f"{record_path} is a folder, where this strategy's records go",
                         "move it away, or give --results another folder", Location("command line"))
    try:
        _refuse_if_too_big(planned, options)
        _require_backend(planned, options)
        if options.checkpoint == "random":
            from meshlab.models.truncate import refuse_unless_buildable

            refuse_unless_buildable(planned.card)
        checkpoint = _checkpoint(options.checkpoint, planned.card.class_name)
        result = _run_worker(path, planned, checkpoint, workload, options)
    except MeshlabError as error:
        try:
            append_record(record_path, record | failure(error))
        except BackendError as unrecorded:  # the run's own failure is what the user must see
            raise error from unrecorded
        raise
    image = _keep_image(result, planned, options) if result.get("is_writer", True) else None
    record |= success(result, image)
    seen = result.get("hardware") or {}
    if seen.get("device_type"):  # the worker saw the device; the parent (no torch) guessed it
        record["hardware"] = record["hardware"] | {"platform": str(seen["device_type"]).lower()}
    encoded = ran_text_tokens(result["summary"].get("text_tokens") or [])
    if encoded and encoded != planned.strategy.workload.text_tokens:  # price what ran, not the strategy's padding
        record["prediction"] = prediction(with_workload(planned, text_tokens=encoded)) | {
            "text_tokens": encoded, "strategy_text_tokens": planned.strategy.workload.text_tokens}
    written = append_record(record_path, record) if result.get("is_writer", True) else run_record(record)
    return RunOutcome(written, record_path, image, (*notes, *result["summary"].get("warnings", [])))


def ran_text_tokens(lengths: list[int]) -> int | None:
    """The text length a run's prediction is made at: the mean of the lengths its transformer calls got (the
    pipeline encodes each prompt to its own length; a backend that pads the pair reports the padded length), to
    the nearest token. Per-call time is near linear in text tokens, so two calls at the mean cost what both do."""
    return round(sum(lengths) / len(lengths)) if lengths else None


#: How each backend runs elementwise work: XLA fuses it; plain PyTorch and DTensor run each op eagerly
RUNS_ELEMENTWISE = {"xla": "fused", "torch": "eager", "dtensor": "eager"}


def resolve_backend(backend: str, devices: int) -> str:
    """``auto``: on a CUDA host plain PyTorch for one device and DTensor for more (torch_xla's CUDA build is not on
    PyPI); elsewhere PyTorch/XLA. Decided without importing torch (``/dev/nvidiactl``, or CUDA_VISIBLE_DEVICES)."""
    if backend != "auto":
        return backend
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    cuda = os.path.exists("/dev/nvidiactl") and visible not in ("", "-1")
    return ("torch" if devices == 1 else "dtensor") if cuda else "xla"


def preflight(path: Path, options: RunOptions) -> tuple[PlannedStrategy, dict]:
    """What a run checks before anything is built or written: the strategy planned at the workload the run uses
    (bounds checked), finite guidance, folders that are folders. An experiment checks all its runs this way
    before the first starts."""
    planned = plan_file(path)
    refuse_ring(planned, "run")
    refuse_placement(planned, "run")
    _check_options(options)
    workload = _workload(planned, options)
    planned = with_workload(planned, height=workload["height"], width=workload["width"], steps=workload["steps"],
                            batch=workload["batch"], cfg=workload["cfg"])  # fits and predictions at what runs
    return planned, workload


def _workload(planned: PlannedStrategy, options: RunOptions) -> dict:
    """The workload this run uses: the strategy's dtype, and its sizes, steps, batch and guidance where the
    command line (or an experiment) set none; 0 is a value (refused by the workload's bounds), not unset."""
    w = planned.strategy.workload
    cfg = given(options.cfg, w.cfg)
    return {"height": given(options.height, w.height), "width": given(options.width, w.width),
            "steps": given(options.steps, w.steps), "cfg": cfg, "batch": given(options.batch, w.batch),
            "dtype": w.dtype, "cfg_scale": options.cfg_scale if cfg else 1.0}


def _check_options(options: RunOptions) -> None:
    """What the command line gave, before anything is built or written: finite guidance, and folders that are
    folders (or can be made)."""
    if not math.isfinite(options.cfg_scale):
        raise InputError(f"--cfg-scale {options.cfg_scale} is not a finite number", "give e.g. --cfg-scale 4.0",
                         Location("command line"))
    for folder, flag in ((options.out_dir, "--out"), (options.results_dir, "--results"),
                         (options.cache_dir, "--cache-dir")):
        if folder is not None:
            output_folder(folder, flag, Location("command line"))


def _joint_guidance(planned: PlannedStrategy) -> bool:
    """Does the strategy put the guidance branches on a mesh axis? Then the run makes one call of twice the batch
    for both, split over that axis: the call the prediction prices."""
    from meshlab.plan.axes import guidance_axis

    return bool(guidance_axis(planned.plan.mesh) and planned.strategy.workload.cfg)


def _load_dtype(options: RunOptions, workload: dict) -> str | None:
    """Real checkpoints load in the workload's dtype; the tiny one stays float32 (it is compared with the stock
    float32 pipeline pixel for pixel, and its runs are never held against a full model's prediction)."""
    return None if options.checkpoint == "tiny" else workload["dtype"]


def _refuse_if_too_big(planned: PlannedStrategy, options: RunOptions) -> None:
    chip = planned.memory.most_loaded
    if chip.headroom < 0 and not options.force:
        raise InputError(
            f"{planned.strategy.name} does not fit {planned.hardware.name}: {chip.total / 2**30:.2f} GiB per chip "
            f"predicted, {chip.hbm / 2**30:.2f} GiB usable (refused before loading any weights)",
            "pick a plan that fits (meshlab compare) or pass --force to try anyway",
        )


def _require_backend(planned: PlannedStrategy, options: RunOptions) -> None:
    from importlib.util import find_spec

    if options.backend not in RUN_BACKENDS:
        raise InputError(f"unknown backend {options.backend!r}", f"use --backend {', '.join(RUN_BACKENDS)}")
    if options.backend == "torch" and planned.plan.mesh.device_count != 1:
        raise InputError(f"plain PyTorch runs on one device, and {planned.strategy.name} plans for "
                         f"{planned.plan.mesh.device_count}", "use --backend dtensor (or xla), or a one-device plan")
    if options.backend == "torch" and options.verify:
        raise InputError("--verify compares a sharded run with the stock pipeline, and --backend torch is the stock "
                         "pipeline", "drop --verify")
    needed = ("torch", "diffusers", "transformers") + (("torch_xla",) if options.backend == "xla" else ())
    missing = [name for name in needed if find_spec(name) is None]
    if missing:
        raise MissingExtra(f"running a pipeline needs {', '.join(missing)}, which is not installed",
                           "install the extra: pip install -e '.[xla]'")
    if options.backend == "dtensor":
        if _joint_guidance(planned):
            raise InputError("the DTensor run calls the transformer once per guidance branch, as the stock pipeline "
                             "does, so a cfg mesh axis (both branches in one call) has nothing to split",
                             "run this plan with --backend xla, or use a plan without a cfg axis")
        if options.scan:
            raise InputError("--scan is torch_xla's; the DTensor backend has no scan", "drop --scan")
    if options.backend == "torch" and options.scan:
        raise InputError("--scan is torch_xla's; plain PyTorch has no scan", "drop --scan, or use --backend xla")


def _checkpoint(name: str, transformer: str) -> Path | str:
    """The pipeline to run: "random" (built in the worker), the tiny one, or a saved folder whose index parses and
    whose transformer is the strategy's model's class (`transformer`)."""
    if name == "random":
        return name  # built in the worker from the card (meshlab.pipelines.random_pipeline)
    path = _tiny_checkpoint() if name == "tiny" else Path(name).expanduser()
    if not (path / "model_index.json").is_file():
        raise InputError(f"no pipeline at {path} (model_index.json missing)",
                         "give a local folder saved with save_pretrained; meshlab never downloads checkpoints")
    try:
        index = json.loads((path / "model_index.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{path / 'model_index.json'} is not a pipeline index ({exc})",
                         "save the pipeline again with save_pretrained") from None
    if not isinstance(index, dict) or not isinstance(index.get("_class_name"), str):
        raise InputError(f"{path / 'model_index.json'} names no pipeline class (_class_name)",
                         "save the pipeline again with save_pretrained")
    found = index.get("transformer")
    if isinstance(found, list) and len(found) == 2 and found[1] != transformer:
        raise InputError(f"the pipeline at {path} has a {found[1]}, and the strategy's model is a {transformer}",
                         "use a strategy that applies to this checkpoint's model")
    return path


def _tiny_checkpoint() -> Path:
    """The tiny offline Qwen-Image pipeline, built once into the user's cache (a few seconds)."""
    cache = cache_root() / "tiny-qwen-image"
    if not (cache / "model_index.json").is_file():
        building = cache.with_name(f"{cache.name}.building-{os.getpid()}")
        call_worker("meshlab.workers.run_xla", BuildTinyRequest(build_tiny=str(building)), dict(os.environ),
                    BuiltPayload, timeout_s=600)
        try:
            os.replace(building, cache)  # whole or not at all; a concurrent builder may have won
        except OSError:
            shutil.rmtree(building, ignore_errors=True)
    return cache


def _run_worker(path: Path, planned: PlannedStrategy, checkpoint: Path, workload: dict, options: RunOptions) -> dict:
    options.out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".meshlab-run-", dir=options.out_dir) as scratch:
        scratch = Path(scratch)
        if options.backend in ("dtensor", "torch"):
            return _run_torch(path, planned, checkpoint, workload, options, scratch)
        request = XlaRunRequest(
            strategy=str(path), checkpoint=str(checkpoint), workload=workload, layers=options.layers,
            joint_guidance=_joint_guidance(planned), prompt=options.prompt, negative_prompt=options.negative_prompt,
            seed=options.seed, verify=options.verify, load_dtype=_load_dtype(options, workload),
            scan=planned.strategy.compile.scan_blocks if options.scan is None else options.scan,
            scratch=str(scratch), cache_dir=str(cache_for(planned, checkpoint, options) or ""))
        dump = scratch / "xla-dump"
        flags = f"--xla_dump_to={dump} --xla_dump_hlo_as_text"  # its memory-usage reports: per-device peak
        env = child_environment(planned.plan.mesh.device_count, flags, planned.strategy.compile.libtpu_flags)
        try:
            result = call_worker("meshlab.workers.run_xla", request, env, RunPayload, folder=scratch,
                                 timeout_s=options.timeout_s)
        except InputError as error:
            raise InputError(error.problem, "use a strategy that applies to this checkpoint's model") from None
        except WorkerFailed as error:
            fix = "use a plan with more headroom (meshlab compare)" if error.status == "oom" else error.fix
            raise WorkerFailed(error.problem, fix, status=error.status) from None
        if result.get("image"):
            result["image_bytes"] = Path(result["image"]).read_bytes()
        return result


def _run_torch(path: Path, planned: PlannedStrategy, checkpoint: Path | str, workload: dict, options: RunOptions,
               scratch: Path) -> dict:
    """The DTensor run (meshlab.workers.run_dtensor) or the plain-PyTorch one (meshlab.workers.run_torch)."""
    request = TorchRunRequest(
        strategy=str(path), checkpoint=str(checkpoint), workload=workload, layers=options.layers,
        world=planned.plan.mesh.device_count, prompt=options.prompt, negative_prompt=options.negative_prompt,
        seed=options.seed, verify=options.verify, load_dtype=_load_dtype(options, workload), scratch=str(scratch))
    env = torch_environment()
    module = "meshlab.workers.run_dtensor" if options.backend == "dtensor" else "meshlab.workers.run_torch"
    try:
        result = call_worker(module, request, env, RunPayload, folder=scratch, timeout_s=options.timeout_s)
    except InputError as error:
        raise InputError(error.problem, "use a strategy that applies to this checkpoint's model") from None
    if result.get("image"):
        result["image_bytes"] = Path(result["image"]).read_bytes()
    return result


def _keep_image(result: dict, planned: PlannedStrategy, options: RunOptions) -> Path | None:
    data = result.pop("image_bytes", None)
    if data is None:
        return None
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S%f")
    final = options.out_dir / f"{file_stem(planned.strategy.name)}-{stamp}.png"
    with tempfile.NamedTemporaryFile(dir=options.out_dir, prefix=".meshlab-", suffix=".png", delete=False) as handle:
        handle.write(data)
    os.replace(handle.name, final)
    return final


