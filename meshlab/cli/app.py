"""meshlab's command line: wiring only. Each command parses, calls the library, renders."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Optional

import typer

from meshlab.cli.output import WatchedStdout, console, output_failed, print_json, print_schema, reports_errors

app = typer.Typer(
    name="meshlab",
    help="Design, check and compare SPMD sharding plans for diffusion transformers.",
    no_args_is_help=True,
    add_completion=True,  # --install-completion / --show-completion for bash, zsh, fish, PowerShell
    pretty_exceptions_enable=False,
)

JSON_OPTION = typer.Option(False, "--json", help="print one JSON document instead of tables")


@app.command("try")
@reports_errors
def try_(
    strategy: Optional[Path] = typer.Argument(None, help="strategy YAML file (or ask with --model and --hardware)"),
    as_json: bool = JSON_OPTION,
    model: Optional[str] = typer.Option(None, "--model", help="a quick question instead of a file: the model card"),
    hardware: Optional[str] = typer.Option(None, "--hardware", help="with --model: the system (h100:1 is one GPU)"),
    mesh: Optional[str] = typer.Option(None, "--mesh", help="with --model: axes from cfg, data, seq, model, e.g. "
                                       "data=2,model=4 (default: data over every chip)"),
    rules: Optional[str] = typer.Option(None, "--rules", help="with --model: data, model, 2d, pairs, fsdp, ulysses, "
                                        "ring, or a sequence and a weight family joined by + (default: from --mesh)"),
    height: Optional[int] = typer.Option(None, "--height", help="with --model (default: the model's pipeline's)"),
    width: Optional[int] = typer.Option(None, "--width"),
    frames: Optional[int] = typer.Option(None, "--frames"),
    steps: Optional[int] = typer.Option(None, "--steps"),
    text_tokens: Optional[int] = typer.Option(None, "--text-tokens"),
    cfg: Optional[bool] = typer.Option(None, "--cfg/--no-cfg"),
    text_encoder: Optional[str] = typer.Option(None, "--text-encoder", help="with --model: device, host, or auto "
                                               "(the default: on a GPU the device where the plan still fits with "
                                               "it, on a TPU the host)"),
    save: Optional[Path] = typer.Option(None, "--save", help="with --model: write the strategy file it plans"),
    strict: bool = typer.Option(False, "--strict", help="a rule that matches no parameter is an error, not a "
                                "warning"),
) -> None:
    """Plan a strategy: partition specs, per-chip memory, and whether it fits. Exit 0 fits or not; 2 bad input.

    A file, or a quick question: `meshlab try --model flux-dev --hardware h100 --mesh data=8`."""
    quick = {"--model": model, "--hardware": hardware, "--mesh": mesh, "--rules": rules, "--height": height,
             "--width": width, "--frames": frames, "--steps": steps, "--text-tokens": text_tokens, "--cfg": cfg,
             "--text-encoder": text_encoder, "--save": save}
    given = [flag for flag, value in quick.items() if value is not None]
    if strategy is not None and given:
        from meshlab.core.errors import InputError

        raise InputError(f"{given[0]} asks a quick question, and a strategy file was given too",
                         "give a strategy file, or --model and --hardware with their flags")
    placement = None
    if strategy is None:
        from meshlab.search.quick import plan_quick, save_quick

        answer = plan_quick(model, hardware, mesh, rules, dict(height=height, width=width, frames=frames, steps=steps,
                                                              text_tokens=text_tokens, cfg=cfg), text_encoder)
        planned, placement = (save_quick(answer, save) if save is not None else answer.planned), answer.placement
    else:
        from meshlab.plan.planned import plan_file

        planned = plan_file(strategy)
    from meshlab.cli.output import warn_unmatched_rules

    warn_unmatched_rules(planned, strict)
    if as_json:
        from meshlab.search.documents import TryDocument
        from meshlab.search.try_document import try_document

        print_json(try_document(planned) | ({"text_encoder": placement} if placement else {}), TryDocument)
    else:
        from meshlab.cli.render_try import render_try

        render_try(planned, console())
        if placement:
            console().print(f"[dim]text encoder: {placement}[/dim]")
        if strategy is None and not planned.memory.fits:
            console().print("[yellow]hint:[/yellow] this plan does not fit; "
                            f"`meshlab sweep --model {model} --hardware {hardware}` finds the best that does, or "
                            "name one with --rules (2d, pairs, fsdp, ulysses+pairs, ...) and --mesh")


@app.command("schema")
@reports_errors
def schema(name: str = typer.Argument("strategy", help="which file: strategy, experiment, hardware-overrides, "
                                       "hardware-entry, card, run-record, profile, cache-manifest, "
                                       "worker-request, worker-result")) -> None:
    """Print the JSON Schema of a file meshlab reads or writes (a strategy by default), from the pydantic model
    it is read through, for editors and other tools.

    With yaml-language-server: `meshlab schema > strategy.schema.json`, then put
    `# yaml-language-server: $schema=strategy.schema.json` at the top of a strategy file."""
    from meshlab.cli.schemas import SCHEMAS, json_schema
    from meshlab.core.errors import InputError

    if name not in SCHEMAS:
        raise InputError(f"no schema named {name!r}", f"use one of: {', '.join(SCHEMAS)}")
    print_schema(json_schema(name))


@app.command("hardware")
@reports_errors
def hardware(as_json: bool = JSON_OPTION) -> None:
    """List the hardware catalog, with the source of every figure."""
    from meshlab.cli.render_catalog import render_hardware
    from meshlab.core.hardware_rows import HardwareList, describe_rows

    if as_json:
        print_json(describe_rows(with_sources=True), HardwareList)
    else:
        render_hardware(describe_rows(), console())


from meshlab.cli import commands_check, commands_cost, commands_run  # noqa: E402
from meshlab.cli.commands_models import models  # noqa: E402

app.add_typer(models, name="models")
commands_check.register(app)
commands_cost.register(app)
commands_run.register(app)


def main() -> None:
    import signal

    # SIGTERM (`timeout`, a scheduler) unwinds like an interrupt: workers are stopped, scratch folders removed
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    sys.stdout = WatchedStdout(sys.stdout)
    try:
        code = app(standalone_mode=False)  # click's errors come back here, to be one line like meshlab's own
        sys.stdout.flush()  # a full disk shows here, not in Python's shutdown
    except OSError as error:  # stdout on a full disk or a closed pipe, in a command or in help text
        code = output_failed(error)
        if code is None:
            raise
    except Exception as error:  # noqa: BLE001 - only click's own exceptions are handled; the rest re-raised
        code = click_error(error)
    sys.exit(code if isinstance(code, int) else 0)


def click_error(error: Exception) -> int:
    """A command-line error click raised (typer vendors click in some versions, so it is matched by class name):
    one line and its exit code; `meshlab` alone still prints the help. Anything else is raised again."""
    kinds = {cls.__name__ for cls in type(error).__mro__}
    if "NoArgsIsHelpError" in kinds:
        error.show()
        return error.exit_code
    if "Abort" in kinds:
        sys.stderr.write("meshlab: interrupted\n")
        return 130
    if "ClickException" not in kinds:
        raise error
    context = getattr(error, "ctx", None)
    where = f"see `{context.command_path} --help`" if context is not None else "see `meshlab --help`"
    sys.stderr.write(f"meshlab: error: command line: {error.format_message().rstrip('.')}; {where}\n")
    return error.exit_code
