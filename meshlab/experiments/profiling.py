"""`meshlab profile`: measure the local device at a plan's shapes and write a profile file. No torch here.

The parent plans the strategy, lists what to measure (each Linear's shard GEMM and the attention at every text
length, the whole call at one block per list and one block alone, the VAE decode at the workload's resolution,
the host's matmul and transfer), starts the torch worker (meshlab.workers.measure) with the device
environment, fits one curve per op class (meshlab.core.profile_points.fit) and writes the file atomically
(meshlab.core.files.write_atomic): a profile is whole or absent, never partial.

Text lengths: the strategy's ``text_tokens`` and, by default, 8 and 32 as well, because the stock pipeline encodes
each prompt to its own length (a short prompt is 10 to 20 tokens) and a run is priced at the length it encoded.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

from meshlab.runtime.protocol import Progress, call_worker
from meshlab.runtime.results import ProfilePayload
from meshlab.runtime.requests import ProfileRequest
from meshlab.runtime.devices import child_environment, torch_environment
from meshlab.core.errors import InputError, Location, MeshlabError
from meshlab.plan.planned import PlannedStrategy, plan_file, with_workload
from meshlab.core.files import output_path, write_atomic

DEFAULT_TEXT_TOKENS = (8, 32)
#: The deeper transformer the profile times beside the one-block one: the slope between them is a block's time
#: inside a whole program (see meshlab.cost.profile).
STACK_DEPTH = 3
#: Collectives the profile makes on the devices (XLA's partitioner inserts them between two shardings; a
#: collective-permute between one spec on the mesh and on the mesh with its devices moved one step along an axis).
MEASURED_COLLECTIVES = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
BACKENDS = ("auto", "xla", "torch")
#: CUDA device names to catalog entries (the first that the name contains).
GPU_NAMES = (("H200", "h200"), ("H100", "h100"), ("A100", "a100-80gb"))


@dataclass(frozen=True)
class ProfileOptions:
    out: Path
    text_tokens: tuple[int, ...] = ()  # () : the strategy's and DEFAULT_TEXT_TOKENS
    backend: str = "auto"
    hardware: str | None = None  # the catalog entry of a GPU or TPU (default: from the device's name)
    blocks: bool = True
    vae: bool = True
    seed: int = 0
    timeout_s: float = 1800.0


@dataclass(frozen=True)
class ProfileOutcome:
    path: Path
    document: dict
    seconds: float


def profile_strategy(path: str | Path, options: ProfileOptions, progress: Progress = lambda _: None) -> ProfileOutcome:
    from meshlab.experiments.run import resolve_backend

    from meshlab.experiments.refusals import refuse_placement, refuse_ring

    planned = plan_for_profiling(Path(path))
    refuse_ring(planned, "profile")
    refuse_placement(planned, "profile")
    devices = planned.plan.mesh.device_count
    if options.backend not in BACKENDS:
        raise InputError(f"unknown backend {options.backend!r}", f"use --backend {', '.join(BACKENDS)}")
    backend = resolve_backend(options.backend, devices)
    backend = "torch" if backend == "dtensor" else backend
    if backend == "torch" and devices != 1:
        raise InputError(f"plain PyTorch profiles one device, and {planned.strategy.name} plans for {devices}",
                         "profile a one-device strategy on a GPU, or use --backend xla")
    _writable(options.out, path)
    if options.hardware:  # an unknown name is an error naming the catalog, before the worker starts
        from meshlab.core.hardware import load_hardware

        try:
            load_hardware(options.hardware)
        except InputError as exc:
            raise InputError(f"--hardware {options.hardware!r} is not a catalog entry", exc.fix) from None
    request = _request(path, planned, backend, options)
    env = child_environment(devices) if backend == "xla" else torch_environment()
    started = time.perf_counter()
    result = call_worker("meshlab.workers.measure", request, env, ProfilePayload, timeout_s=options.timeout_s,
                         progress=progress)
    seconds = time.perf_counter() - started
    device = result["device"] | {"hardware": _catalog_name(result["device"], planned, options)}
    document = _document(planned, request, device, result, seconds)
    write_atomic(options.out, json.dumps(document, indent=1) + "\n", [path], "-o")
    return ProfileOutcome(options.out, document, seconds)


def plan_for_profiling(path: Path) -> PlannedStrategy:
    """The strategy planned for its shapes. Its hardware may be the profile being written, which need not exist
    yet (or may be stale or broken): a profile as hardware is never read here, and the plan is made on a stand-in
    entry of the mesh's device count instead (shapes do not depend on the entry)."""
    from meshlab.core.hardware import load_hardware
    from meshlab.plan.planned import plan_strategy
    from meshlab.strategy.loader import load_strategy

    loaded = load_strategy(path)
    name = loaded.strategy.hardware_name
    if not name.endswith(".json"):
        return plan_file(path)
    sizes = loaded.strategy.mesh.values()
    if -1 in sizes:
        raise loaded.place(InputError(f"the hardware {name} is not measured yet, so the mesh cannot take its size "
                                      "from it", "give every mesh axis a size", field=("mesh",)))
    if math.prod(sizes) > 8:
        raise loaded.place(InputError(f"the hardware {name} is not measured yet", "name a catalog entry while "
                                      "profiling a mesh of more than 8 devices", field=("hardware",)))
    stand_in = load_hardware("h200").using(math.prod(sizes))
    try:
        return plan_strategy(loaded, replace(stand_in, usable_hbm_bytes=stand_in.hbm_bytes))
    except MeshlabError as exc:
        raise loaded.place(exc) from None


def text_lengths(planned: PlannedStrategy, given: tuple[int, ...]) -> tuple[int, ...]:
    """The text lengths to time: the defaults and the workload's, or those given; only the one a model's forward
    requires (Wan I2V: 512), where it requires one (another given length is refused at --text-tokens)."""
    required = planned.card.architecture.text_tokens
    if required:
        if given and set(given) != {required}:
            raise InputError(f"--text-tokens {','.join(map(str, given))}: {planned.card.name}'s forward takes exactly "
                             f"{required} text tokens", f"drop --text-tokens, or give {required}",
                             Location("command line"))
        return (required,)
    return tuple(sorted(set(given or (*DEFAULT_TEXT_TOKENS, planned.strategy.workload.text_tokens))))


def _request(path, planned: PlannedStrategy, backend: str, options: ProfileOptions) -> ProfileRequest:
    """What to measure: the shapes the plan gives each chip at every text length."""
    from meshlab.models.truncate import block_lists
    from meshlab.cost.predict import predict
    from meshlab.plan.axes import guidance_axis

    w = planned.strategy.workload
    lengths = text_lengths(planned, options.text_tokens)
    linear, attention, collectives = {}, {}, {}
    for text in lengths:
        at = with_workload(planned, text_tokens=text)
        predicted = predict(at.plan, at.strategy, replace(at.hardware, profile=None))
        for work in predicted.work:
            if work.kind == "linear":
                linear[work.shape] = None
            elif work.kind == "attention":
                attention[work.shape] = None
        for c in predicted.collectives:
            if c.kind in MEASURED_COLLECTIVES and backend == "xla":
                collectives[(c.kind, c.axes, c.bytes)] = None
    text_encoder = next((c for c in planned.card.components if c.name.startswith("text_encoder")), None)
    joint = bool(guidance_axis(planned.plan.mesh) and w.cfg)
    return ProfileRequest(
        strategy=str(path), backend=backend, devices=planned.plan.mesh.device_count, dtype=w.dtype, seed=options.seed,
        text_tokens=list(lengths), workload={"height": w.height, "width": w.width, "batch": w.batch},
        call_batch=w.batch * (2 if joint else 1), calls=2 if w.cfg and not joint else 1, depth=STACK_DEPTH,
        linear=[list(s) for s in linear], attention=[list(s) for s in attention],
        collectives=[(kind, list(axes), nbytes) for kind, axes, nbytes in collectives],
        mesh=planned.plan.mesh.as_dict(), blocks=options.blocks, block_lists=len(block_lists(planned.card)),
        vae=[w.height, w.width] if options.vae and _has_vae(planned) else None,
        model=planned.strategy.model, model_dir=str(planned.loaded.path.parent),
        host={"tokens": w.text_tokens, "width": planned.card.architecture.text_dim} if text_encoder else None)


def _has_vae(planned: PlannedStrategy) -> bool:
    return bool(((planned.card.source.get("components") or {}).get("vae") or {}).get("config"))


def _catalog_name(device: dict, planned: PlannedStrategy, options: ProfileOptions) -> str | None:
    """The catalog entry whose figures a GPU's or TPU's profile keeps (None for the CPU)."""
    if device["platform"] == "cpu":
        return None
    if options.hardware:
        return options.hardware
    if device["platform"] == "cuda":
        found = next((entry for marker, entry in GPU_NAMES if marker in device.get("name", "")), None)
        if found:
            return found
    if planned.hardware.kind == ("gpu" if device["platform"] == "cuda" else "tpu"):
        return planned.hardware.name.split(":")[0]
    raise InputError(f"no catalog entry is known for {device.get('name')!r}",
                     "name it with --hardware (meshlab hardware lists them)")


def _document(planned: PlannedStrategy, request: ProfileRequest, device: dict, result: dict, seconds: float) -> dict:
    from meshlab.cost.predict import layout_of, profile_key
    from meshlab.core.profile_file import profile_document
    from meshlab.core.profile_points import Point

    points = tuple(Point(p["op"], tuple(p["shape"]), p["flops"], p["bytes"], p["seconds"], p.get("label", ""))
                   for p in result["points"])
    w = planned.strategy.workload
    plan = {"key": profile_key(planned.plan, planned.strategy), "strategy": planned.strategy.name,
            "model": planned.card.name, "config_digest": planned.card.config_digest,
            "mesh": planned.plan.mesh.as_dict(), "height": w.height, "width": w.width, "batch": w.batch,
            "dtype": w.dtype, "image_tokens": layout_of(planned.plan, planned.strategy).tokens.image,
            "text_tokens": request.text_tokens}
    return profile_document(device, result["versions"], plan, points, round(seconds, 1))


def _writable(out: Path, strategy: Path) -> None:
    """Before minutes of measuring: -o names a .json file, not a folder or the strategy, in a writable folder."""
    folder = out.parent if str(out.parent) else Path(".")
    if out.suffix != ".json":
        raise InputError(f"{out}: a profile is a .json file", "name the output FILE.json")
    if not folder.is_dir() or not os.access(folder, os.W_OK):
        raise InputError(f"cannot write {out}: {folder} is not a writable folder",
                         "give -o a path in a writable folder")
    output_path(out, [strategy], "-o")
