"""`meshlab check` and `meshlab export`: wiring only; the work is in meshlab.check.against_xla and
meshlab.export.snippets."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from meshlab.cli.output import console, print_json, reports_errors
from meshlab.core.errors import InputError, MeshlabError

EXPORT_FORMATS = ("torch-xla", "dtensor", "json", "diffusers", "xdit")
CHECK_BACKENDS = ("xla", "dtensor", "tpu")


def register(app: typer.Typer) -> None:
    app.command("check")(check)
    app.command("export")(export)


@reports_errors
def check(
    strategy: Path = typer.Argument(..., help="strategy YAML file"),
    layers: Optional[int] = typer.Option(None, "--layers", min=1, help="blocks of each kind to build (real "
                                         "widths; default 2, and the whole model with --backend tpu); from 2 on, a "
                                         "middle block's collectives are held to the prediction"),
    height: Optional[int] = typer.Option(None, "--height", help="image height in pixels for the check's forward "
                                         "(default 128; --backend tpu: the workload's)"),
    width: Optional[int] = typer.Option(None, "--width", help="image width in pixels for the check's forward "
                                        "(default 128; --backend tpu: the workload's)"),
    text_tokens: Optional[int] = typer.Option(None, "--text-tokens", min=1, help="text tokens for the check's "
                                              "forward (default 32; --backend tpu: the workload's)"),
    frames: Optional[int] = typer.Option(None, "--frames", min=1, help="video frames for the check's forward "
                                         "(video models; default: two latent frames, 5 for Wan)"),
    batch: Optional[int] = typer.Option(None, "--batch", min=1, help="with --backend tpu: images per call of the "
                                        "compiled forward (default: the workload's)"),
    seed: int = typer.Option(0, "--seed", help="seed of the random weights and inputs"),
    dump_dir: Optional[Path] = typer.Option(None, "--dump-dir", help="keep XLA's dump here (default: a temp folder)"),
    scan: Optional[bool] = typer.Option(None, "--scan/--no-scan", help="run block lists through torch_xla's scan "
                                        "(default: the strategy's compile.scan_blocks)"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON document instead of tables"),
    backend: str = typer.Option("xla", "--backend", help="xla: PyTorch/XLA SPMD against XLA's partitioner on "
                                "virtual CPU devices; dtensor: torch.distributed DTensor on one gloo process per "
                                "device; tpu: XLA:TPU's own compile for the strategy's TPU system, ahead of time"),
    front_end: str = typer.Option("auto", "--front-end", help="with --backend tpu: torch-xla (the program "
                                  "PyTorch/XLA runs), torchax, both, or auto (torch-xla, else torchax)"),
) -> None:
    """Apply a plan with PyTorch/XLA SPMD (or DTensor, or XLA:TPU ahead of time) and hold it against what the
    backend did. Exit 0 agrees, 1 disagrees, 2 bad input, 3 the backend is missing or failed."""
    from meshlab.check.against_xla import CheckOptions, run_check
    from meshlab.cli.render_check import Progress, check_document, render_check

    if backend not in CHECK_BACKENDS:
        raise InputError(f"unknown backend {backend!r}", f"use --backend {' or '.join(CHECK_BACKENDS)}")
    given = {name for name, value in (("layers", layers), ("height", height), ("width", width),
                                      ("text_tokens", text_tokens), ("frames", frames), ("batch", batch))
             if value is not None}
    if batch is not None and backend != "tpu":
        raise InputError(f"--batch {batch} sets the images XLA:TPU compiles, and --backend is {backend}, whose check "
                         "runs one sample per chip", "add --backend tpu, or drop --batch")
    if front_end != "auto" and backend != "tpu":
        raise InputError(f"--front-end {front_end} chooses what XLA:TPU compiles, and --backend is {backend}",
                         "add --backend tpu, or drop --front-end")

    def given_or(value, default):
        return default if value is None else value

    options = CheckOptions(layers=given_or(layers, 2), height=given_or(height, 128), width=given_or(width, 128),
                           text_tokens=text_tokens, frames=frames, seed=seed, dump_dir=dump_dir,
                           scan=scan, batch=batch)
    if backend == "tpu":
        from meshlab.check.against_tpu import run_tpu_check, tpu_check_document, tpu_options
        from meshlab.cli.render_check import render_tpu_check

        with Progress() as progress:
            report = run_tpu_check(strategy, tpu_options(strategy, options, given), front_end, progress.update)
        from meshlab.check.documents import TpuCheckDocument

        print_json(tpu_check_document(report), TpuCheckDocument) if as_json else render_tpu_check(report, console())
        if not report.agrees:
            raise typer.Exit(1)
        return
    if backend == "dtensor":
        from meshlab.check.against_dtensor import dtensor_check_document, run_dtensor_check
        from meshlab.cli.render_check import render_dtensor_check

        with Progress() as progress:
            report = run_dtensor_check(strategy, options, progress.update)
        from meshlab.check.documents import DTensorCheckDocument

        if as_json:
            print_json(dtensor_check_document(report), DTensorCheckDocument)
        else:
            render_dtensor_check(report, console())
        if not report.agrees:
            raise typer.Exit(1)
        return
    with Progress() as progress:
        report = run_check(strategy, options, progress.update)
    from meshlab.check.documents import CheckDocument

    print_json(check_document(report), CheckDocument) if as_json else render_check(report, console())
    if not report.agrees:
        raise typer.Exit(1)


def _note_left_out(left_out: list[str]) -> None:
    """One line on stderr naming what an exported snippet does not apply (its header says how to apply it all)."""
    if left_out:
        import sys

        sys.stderr.write(f"meshlab: note: the snippet applies the parameters' specs only, not {'; '.join(left_out)}"
                         " (its header says how to apply the whole plan)\n")


@reports_errors
def export(
    strategy: Path = typer.Argument(..., help="strategy YAML file"),
    fmt: str = typer.Option("torch-xla", "--format", help="torch-xla: a PyTorch/XLA snippet; dtensor: a "
                            "torch.distributed DeviceMesh/DTensor snippet; json: the spec map; diffusers: the "
                            "enable_parallelism call; xdit: xDiT's runner command line"),
) -> None:
    """Print a plan as a standalone PyTorch/XLA or DTensor snippet, the parameter-to-spec map in JSON, or the
    GPU tools' form of it (diffusers' enable_parallelism, xDiT's flags); a plan with no such form is refused."""
    if fmt not in EXPORT_FORMATS:
        raise InputError(f"unknown export format {fmt!r}", f"use one of {', '.join(EXPORT_FORMATS)}")
    from meshlab.export.snippets import (
        SpecMapDocument, dtensor_snippet, left_out_of_snippet, spec_map_document, torch_xla_snippet,
    )
    from meshlab.plan.planned import plan_file

    planned = plan_file(strategy)
    if fmt == "json":
        print_json(spec_map_document(planned.plan), SpecMapDocument)
    elif fmt in ("diffusers", "xdit"):
        from meshlab.export.gpu import gpu_form

        try:
            text = gpu_form(fmt, planned.plan, planned.strategy, planned.hardware)
        except MeshlabError as exc:
            raise planned.loaded.place(exc) from None
        typer.echo(text, nl=False)
    elif fmt == "dtensor":
        try:
            text = dtensor_snippet(planned.plan, planned.strategy.rules, planned.strategy.activations, str(strategy))
        except MeshlabError as exc:
            raise planned.loaded.place(exc) from None
        typer.echo(text, nl=False)
        _note_left_out(left_out_of_snippet(planned.strategy.activations))
    else:
        s = planned.strategy
        left_out = left_out_of_snippet(s.activations, s.rewrites, s.compile.scan_blocks)
        typer.echo(torch_xla_snippet(planned.plan, s.rules, s.activations, s.dcn, tuple(s.compile.libtpu_flags),
                                     left_out, str(strategy)), nl=False)
        _note_left_out(left_out)
