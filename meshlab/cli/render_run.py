"""Rendering of `meshlab run` outcomes, experiment progress, and `meshlab report`."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from meshlab.core.errors import InputError, MeshlabError


def render_outcome(outcome, console) -> None:
    record = outcome.record
    t, extra = record.timings, record.model_extra or {}
    console.print(f"[bold green]ok[/bold green]: {record.strategy.name} on {record.hardware.platform} "
                  f"x{record.hardware.devices}; image {outcome.image}; record appended to {outcome.record_path}")
    table = Table(title="Measured", title_justify="left")
    for column in ("text encode", "first step (compile)", "second step", "steady step (median)", "VAE decode",
                   "total", "graphs compiled"):
        table.add_column(column, justify="right")
    table.add_row(*(_seconds(getattr(t, k)) for k in ("text_encode_s", "first_step_s", "second_step_s",
                                                      "steady_step_median_s", "vae_decode_s", "total_s")),
                  str(record.compiles.total))
    console.print(table)
    memory, per_rank = record.memory, (record.memory.model_extra or {}).get("weight_bytes_per_rank")
    if memory.peak_bytes_per_device is not None:
        console.print(f"XLA per-device memory (largest program): {memory.peak_bytes_per_device / 2**20:.1f} MiB")
    elif per_rank:
        console.print(f"DTensor weight shards per rank: {max(per_rank) / 2**20:.2f} MiB on the busiest of "
                      f"{len(per_rank)}")
    if extra.get("max_abs_error_vs_cpu") is not None:
        console.print(f"largest pixel difference from the stock pipeline on the CPU: {extra['max_abs_error_vs_cpu']:.2e}")
    if extra.get("mismatches"):
        console.print(f"[red]{len(extra['mismatches'])} parameters sharded otherwise than planned[/red]")
    prediction = record.prediction
    from meshlab.experiments.comparable import comparison_problem

    problem = comparison_problem(record)
    if problem:  # a tiny checkpoint, another chip or count: a prediction beside it would read as one of it
        console.print(f"[dim]no prediction to hold this run to: {problem}[/dim]")
    else:
        measured = t.steady_step_median_s
        error = f", {100 * (prediction.step_s / measured - 1):+.0f}% against the measured step" if measured else ""
        console.print(f"[dim]predicted for {prediction.hardware} at this run's workload "
                      f"({'?' if prediction.text_tokens is None else prediction.text_tokens} text tokens): "
                      f"{prediction.step_s * 1000:.1f} ms/step{error}[/dim]")
    for warning in outcome.warnings:
        console.print(f"[yellow]warning:[/yellow] {warning}")


def run_experiment(path: Path, options, console) -> None:
    """Run every strategy x workload in order with a progress bar; a failed run is recorded and the rest go on."""
    from rich.progress import Progress

    from meshlab.experiments.definition import experiment_runs
    from meshlab.experiments.run import preflight, run_strategy

    runs = experiment_runs(path, options)
    for strategy, run_options in runs:  # bad input anywhere stops the experiment before its first run
        try:
            preflight(strategy, run_options)
        except MeshlabError as error:
            raise InputError(f"experiment {path}: {error.one_line()}", "fix that strategy or the experiment's "
                             "workloads; nothing was run") from None
    failed = 0
    with Progress(console=console) as progress:
        task = progress.add_task(f"experiment {path.name}", total=len(runs))
        for strategy, run_options in runs:
            progress.update(task, description=f"{strategy.name}")
            try:
                outcome = run_strategy(strategy, run_options)
                progress.console.print(f"ok: {strategy} -> {outcome.image}")
            except MeshlabError as error:
                failed += 1
                progress.console.print(f"[red]failed[/red]: {strategy}: {error.one_line()}")
            progress.advance(task)
    console.print(f"{len(runs) - failed} of {len(runs)} runs ok; records in {options.results_dir}")
    if failed:
        raise typer.Exit(3)


def render_report(rows, console) -> None:
    table = Table(title="Recorded runs (predicted figures are for the strategy's hardware: a catalog entry, or a "
                        "profile measured on the device)",
                  title_justify="left")
    for column in ("time", "strategy", "ran on", "workload", "status", "steady step", "predicted step",
                   "predicted for", "error", "first step", "compiles", "peak/device"):
        table.add_column(column)
    for r in rows:
        error = f"{r.step_error_pct:+.0f}%" if r.step_error_pct is not None else ("n/a" if r.status != "ok" else "n/a†")
        peak = f"{r.peak_bytes / 2**20:.0f} MiB" if r.peak_bytes else "-"
        table.add_row(r.time, r.strategy, r.ran_on, r.workload, r.status + ("*" if r.reason else ""),
                      _seconds(r.steady_step_s), _seconds(r.predicted_step_s), r.predicted_for, error,
                      _seconds(r.first_step_s), str(r.compiles if r.compiles is not None else "-"), peak)
    console.print(table)
    for r in rows:
        if r.reason:
            console.print(f"* {r.source}: {r.reason}")
    for r in rows:
        if r.status == "ok" and r.not_compared:
            console.print(f"† {r.source}: not compared: {r.not_compared}")


def plot_report(rows, path: Path, inputs: tuple | list = ()) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 5))
    for r in rows:
        if r.steady_step_s and r.predicted_step_s:
            marker = "o" if r.comparable else "x"
            ax.scatter(r.predicted_step_s, r.steady_step_s, marker=marker, label=f"{r.strategy} ({r.ran_on})")
    ax.set_xscale("log"), ax.set_yscale("log")
    limits = [min(ax.get_xlim()[0], ax.get_ylim()[0]), max(ax.get_xlim()[1], ax.get_ylim()[1])]
    ax.plot(limits, limits, color="grey", linewidth=0.8)
    ax.set_xlabel("predicted step (s)"), ax.set_ylabel("measured steady step (s)")
    ax.set_title("Measured vs predicted step time", fontsize=11)
    fig.text(0.01, 0.01, "o: ran what was predicted; x: other hardware, model, batch or dtype (not comparable)", fontsize=7)
    ax.legend(fontsize=7)
    fig.tight_layout()
    import io

    from meshlab.core.files import write_atomic_bytes

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    plt.close(fig)
    write_atomic_bytes(path, buffer.getvalue(), inputs, "--plot")


def _seconds(value) -> str:
    return "-" if value is None else (f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s")


def render_profile(outcome, console) -> None:
    """What a profile measured: one row per op class (points, the fitted curve), then the call points."""
    doc = outcome.document
    device = doc["device"]
    console.print(f"[bold green]ok[/bold green]: profiled {device['name']} ({device['platform']} x{device['devices']}"
                  f"{', catalog ' + device['hardware'] if device.get('hardware') else ''}) in {outcome.seconds:.0f} s "
                  f"for {doc['plan']['strategy']!r}; written to {outcome.path}")
    table = Table(title="Measured op classes", title_justify="left")
    for column, justify in (("op", "left"), ("points", "right"), ("fitted rate", "right"), ("latency", "right"),
                            ("sizes measured", "right")):
        table.add_column(column, justify=justify)
    counts: dict[str, int] = {}
    for p in doc["points"]:
        counts[p["op"]] = counts.get(p["op"], 0) + 1
    for op, count in counts.items():
        curve = doc["curves"].get(op)
        unit = {"flops": "FLOP/s", "bytes": "B/s"}.get(curve["basis"], "") if curve else ""
        table.add_row(op, str(count), f"{curve['rate'] / 1e9:.1f} G{unit}" if curve else "",
                      _seconds(curve["latency_s"]) if curve else "",
                      f"{curve['low']:.3g} to {curve['high']:.3g} {curve['basis']}" if curve else "")
    console.print(table)
    calls = [p for p in doc["points"] if p["op"] in ("outer", "block", "stack")]
    if calls:
        table = Table(title="The call under the plan (image tokens, text tokens, calls per program[, blocks])",
                      title_justify="left")
        for column in ("what", "shape", "seconds"):
            table.add_column(column, justify="right" if column == "seconds" else "left")
        for p in calls:
            if p["op"] == "block":
                what = f"{p.get('label')}[0] alone"
            else:
                what = f"{p['shape'][3] if p['op'] == 'stack' else 1} block(s) per list, whole call"
            table.add_row(what, "x".join(map(str, p["shape"])), _seconds(p["seconds"]))
        console.print(table)


class ProgressBar:
    """A bar on stderr for workers that report ``i/n what`` (meshlab profile); plain lines when not a terminal."""

    def __init__(self, command: str):
        from rich.console import Console

        self.command, self.console, self.bar, self.task = command, Console(stderr=True, highlight=False), None, None

    def __enter__(self) -> "ProgressBar":
        if self.console.is_terminal:
            from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

            self.bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                                TimeElapsedColumn(), console=self.console)
            self.bar.start()
        return self

    def update(self, message: str) -> None:
        import re

        found = re.match(r"(\d+)/(\d+) (.*)", message)
        if self.bar is None:
            self.console.print(f"[dim]meshlab {self.command}: {message}[/dim]")
        elif found:
            done, total, what = int(found.group(1)), int(found.group(2)), found.group(3)
            if self.task is None:
                self.task = self.bar.add_task(what, total=total)
            self.bar.update(self.task, completed=done, description=what)

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.stop()
