"""`meshlab run` (a strategy or an experiment) and `meshlab report` (recorded runs): parse, call, render."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from meshlab.cli.output import console, print_json, reports_errors


def register(app: typer.Typer) -> None:
    app.command("run")(run)
    app.command("report")(report)
    app.command("calibrate")(calibrate)
    app.command("profile")(profile)


@reports_errors
def profile(
    strategy: Path = typer.Argument(..., help="strategy YAML: its plan's shapes on this device are measured"),
    out: Path = typer.Option(..., "-o", "--out", help="the profile file to write (FILE.json)"),
    text_tokens: Optional[str] = typer.Option(None, "--text-tokens", help="text lengths to time the call at, e.g. "
                                              "8,32,512 (default: 8, 32 and the strategy's)"),
    backend: str = typer.Option("auto", "--backend", help="xla (torch_xla: CPU or TPU), torch (plain PyTorch: one "
                                "CUDA GPU), auto (torch on a CUDA host, else xla)"),
    hardware: Optional[str] = typer.Option(None, "--hardware", help="the catalog entry of this GPU or TPU "
                                           "(default: from the device's name)"),
    blocks: bool = typer.Option(True, "--blocks/--no-blocks", help="also time the call whole and one block alone"),
    vae: bool = typer.Option(True, "--vae/--no-vae", help="also time the VAE decode at the workload's resolution"),
    as_json: bool = typer.Option(False, "--json", help="print the profile instead of a summary"),
) -> None:
    """Measure this device at a plan's shard shapes (ops, one block, the VAE, the host) and write a profile that a
    strategy can name as its hardware. Exit 0 written; 2 bad input; 3 the worker failed."""
    from meshlab.cli.render_run import ProgressBar, render_profile
    from meshlab.experiments.profiling import ProfileOptions, profile_strategy

    lengths = _int_list(text_tokens, "--text-tokens") if text_tokens else ()
    options = ProfileOptions(out=out, text_tokens=lengths, backend=backend, hardware=hardware, blocks=blocks, vae=vae)
    with ProgressBar("profile") as progress:
        outcome = profile_strategy(strategy, options, progress.update)
    from meshlab.core.profile_file import ProfileFile

    print_json(outcome.document, ProfileFile) if as_json else render_profile(outcome, console())


def _int_list(text: str, option: str) -> tuple[int, ...]:
    from meshlab.core.errors import InputError

    try:
        values = tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        values = ()
    if not values or min(values) < 1:
        raise InputError(f"{option} {text!r} is not a list of positive whole numbers", f"write e.g. {option} 8,32,512")
    return values


@reports_errors
def run(
    target: Path = typer.Argument(..., help="a strategy YAML, or an experiment YAML (lists strategies)"),
    checkpoint: str = typer.Option(None, "--checkpoint", help="local pipeline folder, 'tiny' (offline test model), or "
                                   "'random' (the strategy's card at real width, random weights)"),
    layers: Optional[int] = typer.Option(None, "--layers", min=1, help="with --checkpoint random: blocks per list "
                                         "and text-encoder layers to build (default: all)"),
    prompt: str = typer.Option("a red cube on a blue table", "--prompt"),
    negative_prompt: str = typer.Option("blurry, low quality", "--negative-prompt"),
    steps: int = typer.Option(None, "--steps", help="default: the strategy's workload"),
    height: int = typer.Option(None, "--height"),
    width: int = typer.Option(None, "--width"),
    cfg_scale: float = typer.Option(4.0, "--cfg-scale"),
    seed: int = typer.Option(0, "--seed"),
    out: Path = typer.Option(Path("out"), "--out", help="folder for images"),
    results: Path = typer.Option(Path("experiments/results"), "--results", help="folder for <strategy>.jsonl"),
    cache_dir: Path = typer.Option(None, "--cache-dir", help="persistent XLA compile cache (one folder per plan)"),
    force: bool = typer.Option(False, "--force", help="run a plan predicted not to fit"),
    verify: bool = typer.Option(False, "--verify", help="also run the stock pipeline on the CPU and compare pixels"),
    scan: Optional[bool] = typer.Option(None, "--scan/--no-scan", help="run block lists through torch_xla's scan "
                                        "(default: the strategy's compile.scan_blocks)"),
    backend: str = typer.Option("auto", "--backend", help="xla: PyTorch/XLA SPMD; dtensor: torch.distributed DTensor "
                                "on one gloo process per device (or the ranks torchrun started); torch: plain PyTorch "
                                "on one device; auto: torch or dtensor on a CUDA host, else xla"),
) -> None:
    """Run the pipeline with a plan applied (text encoder on the CPU), time it, record it. Exit 0 ok, 2 bad input
    or refused, 3 failed on the device (oom, error)."""
    from meshlab.cli.render_run import render_outcome
    from meshlab.experiments.definition import is_experiment
    from meshlab.experiments.options import RunOptions
    from meshlab.experiments.run import run_strategy

    options = RunOptions(checkpoint=checkpoint or "tiny", prompt=prompt, negative_prompt=negative_prompt,
                         steps=steps, height=height, width=width, cfg_scale=cfg_scale, seed=seed, out_dir=out,
                         results_dir=results, cache_dir=cache_dir, force=force,
                         verify=verify, scan=scan, backend=backend, layers=layers)
    if is_experiment(target):
        from meshlab.cli.render_run import run_experiment

        run_experiment(target, options, console())
        return
    if checkpoint is None:
        from meshlab.core.errors import InputError

        raise InputError("--checkpoint is required", "give a local pipeline folder, 'tiny' for the offline test model, "
                         "or 'random'")
    with console().status(f"running {target} (compiles on first use)"):
        outcome = run_strategy(target, options)
    render_outcome(outcome, console())


@reports_errors
def report(
    files: list[Path] = typer.Argument(..., help="experiments/records/*.jsonl"),
    as_json: bool = typer.Option(False, "--json"),
    plot: Path = typer.Option(None, "--plot", help="write a PNG: measured against predicted step time"),
) -> None:
    """Recorded runs: measured beside predicted, with the error in % where the hardware matches."""
    from meshlab.cli.render_run import render_report
    from meshlab.experiments.records import read_records
    from meshlab.experiments.measured import ReportDocument, report_document, report_rows

    from meshlab.cli.output import png_path

    png_path(plot)
    rows = report_rows(read_records(files))
    if plot is not None:
        from meshlab.cli.render_run import plot_report

        plot_report(rows, plot, inputs=files)
    print_json(report_document(rows), ReportDocument) if as_json else render_report(rows, console())


@reports_errors
def calibrate(
    files: list[Path] = typer.Argument(..., help="experiments/records/*.jsonl"),
    hardware: str = typer.Option("v6e-8", "--hardware", help="catalog entry to calibrate, or a profile file (a "
                                 "slowdown near 1 then says the profile agrees with the runs)"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Fit the time model's efficiency and host overhead to recorded runs on that hardware; print overrides."""
    from meshlab.experiments.calibrate import CalibrationDocument, calibration_document
    from meshlab.experiments.calibrate import calibrate as fit
    from meshlab.experiments.records import read_records

    result = fit(read_records(files).records, hardware)
    if as_json:
        print_json(calibration_document(result), CalibrationDocument)
        return
    out = console()
    out.print(f"{result.points} runs on {hardware}: measured steps are {result.slowdown:.2f}x the predicted "
              f"compute/HBM time; host overhead {result.overhead_s * 1000:.2f} ms/step; mean error "
              f"{result.error_before_pct:.0f}% -> {result.error_after_pct:.0f}%")
    if hardware.endswith(".json"):
        verdict = "agree" if abs(result.slowdown - 1) <= 0.15 else "disagree"
        out.print(f"The profile and the runs {verdict}: the runs took {result.slowdown:.2f}x what the profile predicts "
                  "(measure the profile again on this device if they disagree)")
        return
    out.print("Put this in a strategy's `hardware:` to use it:")
    import yaml

    out.print(yaml.safe_dump({"hardware": result.overrides()}, sort_keys=False, default_flow_style=None).rstrip(),
              markup=False)
