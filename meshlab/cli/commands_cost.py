"""`meshlab compare`, `meshlab sweep`, `meshlab explain`: wiring only (parse, call the library, render).

``register(app)`` adds the three commands to the main typer app; heavy imports stay inside the commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from meshlab.cli.output import console, png_path, print_json, reports_errors

JSON_OPTION = typer.Option(False, "--json", help="print one JSON document instead of tables")


def register(app: typer.Typer) -> None:
    app.command("compare")(reports_errors(compare))
    app.command("sweep")(reports_errors(sweep))
    app.command("explain")(reports_errors(explain))


def compare(
    strategies: List[str] = typer.Argument(..., help="strategy YAML files or globs (strategies/*.yaml)"),
    as_json: bool = JSON_OPTION,
    plot: Optional[Path] = typer.Option(None, "--plot", help="write a PNG: memory and time per image by component"),
) -> None:
    """Rank strategies by predicted seconds per image; say why each loser loses. Exit 0; 2 bad input."""
    from meshlab.search.compare import compare as run_compare

    png_path(plot)
    comparison = run_compare(strategies)
    from meshlab.cli.output import warn_unmatched_rules

    for entry in comparison.entries:
        warn_unmatched_rules(entry.planned, strict=False)
    if plot is not None:  # never over a strategy, or a card or profile one names
        from meshlab.cli.render_cost import plot_comparison

        plot_comparison(comparison, plot, inputs=[f for e in comparison.entries for f in e.planned.files_read])
    if as_json:
        from meshlab.search.compare import comparison_document
        from meshlab.search.documents import ComparisonDocument

        print_json(comparison_document(comparison), ComparisonDocument)
    else:
        from meshlab.cli.render_cost import render_comparison

        render_comparison(comparison, console(), plot)


def sweep(
    model: str = typer.Option(..., "--model", help="a built-in model card (see `meshlab models`) or a card .json"),
    hardware: Optional[str] = typer.Option(None, "--hardware", help="catalog names, comma-separated (see `meshlab "
                                           "hardware`; h100:1 is one GPU of a node); default: one host of each "
                                           "accelerator, whole nodes and single GPUs"),
    devices: Optional[int] = typer.Option(None, "--devices", min=1, help="sweep over this many devices instead "
                                          "(one open line of chips; one system only)"),
    max_seconds: Optional[float] = typer.Option(None, "--max-seconds-per-image", help="keep only plans that give one "
                                                "request its image in at most this many seconds (a latency goal: "
                                                "the whole pipeline call); with --objective throughput, plans whose "
                                                "seconds per image at throughput are at most this"),
    budget: Optional[float] = typer.Option(None, "--budget-usd-per-image", help="keep only plans at most this many "
                                           "dollars per image at list price"),
    images: Optional[int] = typer.Option(None, "--images", min=1, help="images you plan to make in one session: "
                                         "dollars per image then share the load and compile among them"),
    plot: Optional[Path] = typer.Option(None, "--plot", help="write a PNG: every fitting plan's latency against "
                                        "dollars per image, one colour per system, the front joined"),
    text_encoder: str = typer.Option("auto", "--text-encoder", help="where the text encoder runs: device, host (cpu, "
                                     "as a strategy file names it), or auto (the device where the plan still fits "
                                     "with it, as diffusers places it on a GPU, else the host)"),
    objective: str = typer.Option("latency", "--objective", help="what the best plan minimises: latency (seconds "
                                  "one request waits), throughput (seconds per image with the plan's batch in "
                                  "flight) or cost (dollars per image)"),
    out: str = typer.Option("best.yaml", "--out", help="where to write the best plan's strategy YAML ('-': stdout)"),
    batch_per_replica: int = typer.Option(1, "--batch-per-replica", min=1, help="images per data shard per call"),
    height: Optional[int] = typer.Option(None, "--height", help="image height in pixels (default: the model's "
                                         "pipeline's)"),
    width: Optional[int] = typer.Option(None, "--width", help="image width in pixels (default: the pipeline's)"),
    frames: Optional[int] = typer.Option(None, "--frames", min=1, help="video frames per sample (default: the "
                                         "pipeline's, e.g. 81 for Wan)"),
    steps: Optional[int] = typer.Option(None, "--steps", min=1, help="denoising steps (default: the pipeline's)"),
    text_tokens: Optional[int] = typer.Option(None, "--text-tokens", min=1, help="text tokens per prompt after "
                                              "padding (default: the pipeline's)"),
    cfg: Optional[bool] = typer.Option(None, "--cfg/--no-cfg", help="classifier-free guidance, two branches a step "
                                       "(default: the pipeline's: off for guidance-distilled models)"),
    as_json: bool = JSON_OPTION,
    progress: bool = typer.Option(True, "--progress/--no-progress", help="show a progress bar on stderr"),
) -> None:
    """Try every factorization of each system's devices over each family's mesh axes; rank by seconds and dollars
    per image; write the best plan by the objective that meets the goals (a tie within 2%: the cheaper)."""
    import time

    from meshlab.cli.render_cost import progress_bar, render_sweep
    from meshlab.strategy.schema import Workload
    from meshlab.core.files import output_path, write_atomic
    from meshlab.search.sweep import DEFAULT_SYSTEMS, Limits, strategy_yaml, sweep_document, sweep_systems

    names = _system_names(hardware) if hardware is not None else DEFAULT_SYSTEMS
    if devices is not None and len(names) > 1:
        from meshlab.core.errors import InputError

        raise InputError(f"--devices {devices} re-sizes one system, and {len(names)} are swept",
                         "give one --hardware with --devices, or name sub-node sizes such as h100:4")
    limits = Limits(_goal(max_seconds, "--max-seconds-per-image"), _goal(budget, "--budget-usd-per-image"),
                    throughput=objective == "throughput")
    from meshlab.search.sweep import OBJECTIVES

    if objective not in OBJECTIVES:
        from meshlab.core.errors import InputError

        raise InputError(f"unknown objective {objective!r}", f"use --objective {' or '.join(OBJECTIVES)}")
    from meshlab.search.quick import text_encoder_flag

    text_encoder = text_encoder_flag(text_encoder)
    if text_encoder not in ("auto", "host", "device"):
        from meshlab.core.errors import InputError

        raise InputError(f"--text-encoder {text_encoder!r} is not auto, host or device",
                         "give --text-encoder auto, host or device")
    card, systems = _card_and_systems(model, names, devices)
    from meshlab.plan.planned import default_workload

    workload, basis = default_workload(card.name, card.architecture.text_tokens, height=height, width=width,
                                       frames=frames, steps=steps, text_tokens=text_tokens, cfg=cfg)
    from meshlab.core.errors import InputError, Location, MeshlabError
    from meshlab.models.card import token_frames

    try:  # before the sweep's progress bar: a frame count no candidate can take is one line about the flag
        token_frames(workload.frames, card.architecture)
    except MeshlabError as exc:
        raise InputError(exc.problem, exc.fix, Location("command line: --frames")) from None
    most = Workload.field_metadata("batch")["le"]
    hw = max(systems, key=lambda h: h.chips)
    if batch_per_replica * hw.chips > most:  # a data axis over every device would carry more than a batch can
        from meshlab.core.errors import InputError
        from meshlab.strategy.schema import output_noun

        what = output_noun([workload])
        if hw.chips > most:
            raise InputError(f"{hw.chips} devices are more than a workload's batch of at most {most} {what}s can "
                             f"spread over", f"use --devices {most} or fewer")
        raise InputError(f"--batch-per-replica {batch_per_replica} on {hw.chips} devices makes batches of up to "
                         f"{batch_per_replica * hw.chips} {what}s, over the workload's {most}",
                         f"ask for at most {most // hw.chips} {what}s per replica")
    card_file = [model] if model.endswith(".json") else []
    if out != "-":
        output_path(out, card_file, "--out")  # before the sweep, not after it
    if plot is not None:
        output_path(png_path(plot), card_file, "--plot")
    start = time.perf_counter()
    with progress_bar(enabled=progress and not as_json) as advance:
        result = sweep_systems(card, systems, model, workload, batch_per_replica, progress=advance, limits=limits,
                               images=images, objective=objective, text_encoder=text_encoder)
    elapsed = time.perf_counter() - start
    if out == "-" and as_json:
        from meshlab.core.errors import InputError

        raise InputError("--out - and --json would print YAML and JSON on one stdout",
                         "write the plan to a file (--out best.yaml), or drop --json")
    written = None
    if result.best is not None:
        text = strategy_yaml(result.best, objective=objective)
        if out == "-":
            typer.echo(text, nl=False)
        else:
            write_atomic(out, text, card_file, "--out")
            written = out
    default = DEFAULT_SYSTEMS if hardware is None else ()
    if plot is not None:
        from meshlab.cli.render_cost import plot_sweep

        plot_sweep(result, plot, card_file)
    if as_json:
        from meshlab.search.documents import SweepDocument

        print_json(sweep_document(result, None, elapsed, default) | {"workload": workload.model_dump(exclude_none=True),
                                                                     "workload_basis": basis,
                                                                     "written": None if written is None else
                                                                     str(written)}, SweepDocument)
    elif out != "-":
        console().print(f"workload: {basis}")
        render_sweep(result, console(), written, elapsed, default, unwritten=None if written else out)


def explain(strategy: Path = typer.Argument(..., help="strategy YAML file"), as_json: bool = JSON_OPTION) -> None:
    """Show how a plan's predicted time comes about: work, collectives per layer, and every assumption."""
    from meshlab.cost.predict import predict
    from meshlab.plan.planned import plan_file

    planned = plan_file(strategy)
    from meshlab.cli.output import warn_unmatched_rules

    warn_unmatched_rules(planned, strict=False)
    prediction = predict(planned.plan, planned.strategy, planned.hardware)
    from meshlab.cost.compiled_call import schedule_beside

    schedule = schedule_beside(planned)
    if as_json:
        from meshlab.cost.document import ExplainDocument, explain_document

        print_json(explain_document(planned, prediction, schedule), ExplainDocument)
    else:
        from meshlab.cli.render_cost import render_explain

        render_explain(planned, prediction, console(), schedule)


def _system_names(text: str) -> tuple[str, ...]:
    from meshlab.core.errors import InputError

    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names:
        raise InputError(f"--hardware {text!r} names no system", "give catalog names, e.g. --hardware v6e-8,h100")
    return names


def _goal(value: float | None, option: str) -> float | None:
    import math

    from meshlab.core.errors import InputError

    if value is not None and (not math.isfinite(value) or value <= 0):
        raise InputError(f"{option} {value} is not a goal", f"give {option} a positive number")
    return value


def _card_and_systems(model: str, names: tuple[str, ...], devices: int | None):
    from meshlab.models.card import load_card
    from meshlab.core.errors import InputError
    from meshlab.core.hardware import load_hardware

    card = load_card(model, Path.cwd())
    overrides = {"chips": devices, "topology": [devices], "wraparound": [False]} if devices else None
    systems = {}
    for name in names:
        try:
            node = load_hardware(name.partition(":")[0]) if devices else None  # h100:4's node is h100's
            hw = load_hardware(name, overrides)
        except InputError as exc:
            raise InputError(f"--hardware: {exc.problem}", exc.fix) from None
        if node is not None and node.kind == "gpu" and devices > node.chips:
            # more GPUs than a node holds would be priced as one switch of them all: nodes' network is not modelled
            raise InputError(f"--devices {devices}: {node.name} is a node of {node.chips} GPUs behind one NVLink "
                             "switch, and meshlab does not price several nodes (their network between them)",
                             f"use --devices {node.chips} or fewer")
        systems.setdefault(hw.name, hw)  # h100 and h100:8 are one system
    return card, tuple(systems.values())
