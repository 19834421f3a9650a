"""``python -m meshlab.pipelines.runner_cli``: `meshlab.pipelines.runner` from the command line, for a saved (or the
tiny) pipeline without a strategy file. SPMD is switched on before the first XLA tensor exists, so a sharded run
needs this fresh process:

    PJRT_DEVICE=CPU CPU_NUM_DEVICES=8 python -m meshlab.pipelines.runner_cli --tiny DIR --out OUT.json \\
        --shard my_module:shard_fn
"""

from __future__ import annotations

from typing import Union

from meshlab.core.document import document_text
from meshlab.core.errors import BackendError
from meshlab.core.files import write_atomic
from meshlab.pipelines.runner import Shard, run_pipeline, run_reference
from meshlab.runtime.results import Payload, RunSummary


class RunnerRun(RunSummary):
    """One run: its summary, and the files its image and float pixels went to."""

    image: str
    pixels: str


class ReferenceRun(Payload):
    """The stock pipeline on the CPU (--reference)."""

    device: str
    total_s: float


class RunnerOutput(Payload):
    """The JSON file ``--out`` names."""

    runs: Union[list[RunnerRun], list[ReferenceRun]]


def main(argv: list[str] | None = None) -> int:
    """``python -m meshlab.pipelines.runner_cli``: run a saved (or the tiny) pipeline, write JSON, PNG and NPY files.

    The JSON is ``{"runs": [summary, ...]}``; run i also writes ``OUT-run{i}.png`` and ``OUT-run{i}.npy`` (float
    pixels). ``--reference`` runs the stock pipeline on the CPU instead (no XLA) and writes ``OUT-reference.*``.
    """
    import numpy as np

    args = _parser().parse_args(argv)
    shard = _load_callable(args.shard) if args.shard else None
    if shard is not None:
        import torch_xla.runtime as xr

        xr.use_spmd()  # before the first XLA tensor: nothing below may create one earlier
    pipe = _load(args)
    knobs = (args.prompt, args.negative_prompt, args.steps, args.height, args.width, args.cfg, args.seed)
    out = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    if args.reference:
        pixels, seconds = run_reference(pipe, *knobs)
        np.save(out.with_name(f"{out.stem}-reference.npy"), pixels)
        document = {"runs": [{"device": "cpu (stock pipeline)", "total_s": seconds}]}
        write_atomic(out, document_text(document, RunnerOutput), what="--out")
        return 0
    runs = []
    for i in range(args.runs):
        result = run_pipeline(pipe, *knobs, shard=shard, warm_rope=not args.no_warm_rope)
        image, array = out.with_name(f"{out.stem}-run{i}.png"), out.with_name(f"{out.stem}-run{i}.npy")
        result.image.save(image)
        np.save(array, result.pixels)
        runs.append(result.summary() | {"image": str(image), "pixels": str(array)})
    write_atomic(out, document_text({"runs": runs}, RunnerOutput), what="--out")
    return 0


def _parser():
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(prog="python -m meshlab.pipelines.runner_cli", description=main.__doc__)
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--tiny", type=Path, metavar="DIR", help="the tiny pipeline in DIR (built there if absent)")
    source.add_argument("--pipeline", type=Path, metavar="DIR", help="a pipeline saved with save_pretrained")
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    parser.add_argument("--prompt", default="a red cube on a blue table")
    parser.add_argument("--negative-prompt", default="blurry, low quality")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--height", type=int, default=64)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--cfg", type=float, default=4.0, help="true CFG scale (CFG off at 1 or below)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--runs", type=int, default=1, help="runs in this process (later ones are warm)")
    parser.add_argument("--shard", metavar="MODULE:FUNC", help="shard(transformer, vae) -> mesh; enables SPMD")
    parser.add_argument("--no-warm-rope", action="store_true", help="let the second step recompile (stock)")
    parser.add_argument("--reference", action="store_true", help="stock pipeline on the CPU, no XLA")
    return parser


def _load(args):
    from meshlab.pipelines.tiny import build_tiny_pipeline, load_pipeline

    if args.pipeline is not None:
        return load_pipeline(args.pipeline)
    if not (args.tiny / "model_index.json").exists():
        build_tiny_pipeline(args.tiny)
    return load_pipeline(args.tiny)


def _load_callable(spec: str) -> Shard:
    """``package.module:function`` or ``path/to/file.py:function``."""
    import importlib
    import importlib.util

    target, _, name = spec.rpartition(":")
    if not target or not name:
        raise BackendError(f"bad --shard {spec!r}", "write MODULE:FUNCTION or FILE.py:FUNCTION")
    if target.endswith(".py"):
        module_spec = importlib.util.spec_from_file_location("_meshlab_shard", target)
        module = importlib.util.module_from_spec(module_spec)
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(target)
    if not callable(getattr(module, name, None)):
        raise BackendError(f"--shard {spec!r}: {target} has no function {name!r}", "name a shard(transformer, vae)")
    return getattr(module, name)


if __name__ == "__main__":
    raise SystemExit(main())
