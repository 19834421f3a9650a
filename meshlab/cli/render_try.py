"""Rich rendering of a planned strategy (`meshlab try`)."""

from __future__ import annotations

from rich.table import Table

from meshlab.cli.output import gib
from meshlab.strategy.schema import output_noun
from meshlab.plan.memory import gathered_blocks_on
from meshlab.plan.planned import PlannedStrategy
from meshlab.search.try_document import coverage, rule_summaries


def render_try(planned: PlannedStrategy, console) -> None:
    strategy, plan, hardware = planned.strategy, planned.plan, planned.hardware
    console.print(f"[bold]{strategy.name}[/bold]: {planned.card.name} ({planned.card.total_params:,} parameters) "
                  f"on {hardware.name}, mesh {plan.mesh.describe()}")
    if strategy.description:
        console.print(f"[dim]{strategy.description.strip()}[/dim]")
    for line in planned.loaded.taken:  # plain text: a spec's [null, seq, null] is no markup tag
        console.print(line, markup=False)
    info = coverage(planned)
    console.print(_plan_table(planned, info))
    console.print(_coverage_line(info))
    console.print(_memory_table(planned))
    console.print(_verdict(planned))
    console.print(predicted_line(planned))
    for warning in plan.warnings:
        console.print(f"[yellow]warning:[/yellow] {warning}")


def _plan_table(planned: PlannedStrategy, info: dict) -> Table:
    table = Table(title="Plan: which rule gave which weights which spec", title_justify="left")
    for column in ("#", "pattern", "shard", "params", "specs given", "per chip"):
        table.add_column(column, justify="right" if column in ("#", "params", "per chip") else "left")
    for row in rule_summaries(planned):
        how = row["shard"] + (f" on {'+'.join(row['axis'])}" if row["axis"] else "")
        specs = ", ".join(f"{spec} x{n}" for spec, n in list(row["specs"].items())[:3]) or "[red]matched nothing[/red]"
        table.add_row(str(row["index"]), row["pattern"], how, str(row["matched"]), specs, gib(row["bytes_per_device"]))
    table.add_row("-", "(no rule)", "replicate", str(info["unmatched_parameters"]), "replicated",
                  gib(info["unmatched_bytes_per_chip"]))
    return table


def _coverage_line(info: dict) -> str:
    parts = []
    if info["unmatched_parameters"]:
        examples = ", ".join(info["unmatched_examples"][:3])
        parts.append(f"{info['unmatched_parameters']} parameters matched no rule and stay replicated "
                     f"({gib(info['unmatched_bytes_per_chip'])} per chip; e.g. {examples})")
    if info["unmatched_rules"]:
        parts.append(f"rules that matched nothing: {', '.join(info['unmatched_rules'])}")
    parts.append(f"padding: {gib(info['padding_bytes_per_chip'])} per chip")
    if info.get("tile_padding_bytes_per_chip", 0) >= 0.005 * 2**30:
        parts.append(f"TPU tile padding: {gib(info['tile_padding_bytes_per_chip'])} per chip")
    return "Coverage: " + "; ".join(parts)


def _memory_table(planned: PlannedStrategy) -> Table:
    memory = planned.memory
    chip = memory.most_loaded
    two = gathered_blocks_on(planned.strategy, planned.hardware) == 2
    note = (f"all {len(memory.chips)} chips identical" if memory.uniform
            else f"chips differ: chip {chip.chip} is the most loaded")
    tokens = memory.tokens
    table = Table(title=f"Per-chip memory ({note}; {tokens.describe()})",
                  title_justify="left")
    table.add_column("component")
    table.add_column(f"chip {chip.chip}", justify="right")
    table.add_column("of usable HBM", justify="right")
    rows = [
        ("weights, sharded", chip.weights_sharded), ("weights, replicated", chip.weights_replicated),
        ("weights, padding", chip.padding),
        *([("weights, TPU tile padding", chip.tile_padding)] if chip.tile_padding >= 0.005 * 2**30 else []),
        *([("transformer buffers (whole on every chip)", chip.buffers)] if chip.buffers >= 0.005 * 2**30 else []),
        ("activations (denoise peak)", chip.activations),
        *([(f"FSDP's gathered block weights (denoise{', two blocks: the gathers run async' if two else ''})",
             chip.gathered_weights)] if chip.gathered_weights else []),
        *([("block weights stacked for the scan (denoise)", chip.scan_stacked)] if chip.scan_stacked else []),
        ("VAE weights", chip.vae_weights), ("VAE decode working set", chip.vae_decode),
        ("text encoder", chip.text_encoder),
        *([("encode working set (the largest encode on the chips)", chip.text_encode)] if chip.text_encode else []),
        ("runtime reserve", chip.reserve),
    ]
    for label, value in rows:
        table.add_row(label, gib(value), f"{100 * value / chip.hbm:.1f}%")
    table.add_section()
    phases = "encode / denoise / decode" if chip.text_encode else "denoise / decode"
    table.add_row(f"[bold]total[/bold] (activations: largest of {phases}: {chip.peak_phase})",
                  f"[bold]{gib(chip.total)}[/bold]",
                  f"{100 * chip.total / chip.hbm:.1f}%")
    table.add_row("usable HBM", gib(chip.hbm), "100.0%")
    return table


def _verdict(planned: PlannedStrategy) -> str:
    chip = planned.memory.most_loaded
    if chip.headroom >= 0:
        return f"[bold green]FITS[/bold green]: {gib(chip.total)} of {gib(chip.hbm)} per chip, {gib(chip.headroom)} headroom"
    return (f"[bold red]DOES NOT FIT[/bold red] by {gib(-chip.headroom)}: {gib(chip.total)} needed per chip, "
            f"{gib(chip.hbm)} usable")


def predicted_line(planned: PlannedStrategy) -> str:
    """One line of predicted time and cost per image (`meshlab explain` shows how each term comes about)."""
    from meshlab.cost.predict import predict

    p = predict(planned.plan, planned.strategy, planned.hardware)
    hw = planned.hardware
    what = output_noun([planned.strategy.workload])
    per_call = p.layout.images
    steps = f"{p.layout.steps} step{'s' * (p.layout.steps > 1)} of {p.step.total * 1e3:.0f} ms, end to end"
    fits = planned.memory.fits
    head = "Predicted (not measured)" if fits else "Predicted were it to fit (not measured; it cannot run as planned)"
    if per_call > 1:
        line = (f"{head}: a call of {per_call} {what}s in {p.first_call_s:.2f} s ({steps}), a request's wait; "
                f"{p.seconds_per_image:.2f} s per {what} at throughput")
    else:
        line = f"{head}: one {what} in {p.first_call_s:.2f} s ({steps})"
    line += _assumed_host_share(planned, p)
    if not fits:
        return line + "; no price: it does not fit"
    if p.usd_per_image is None:
        return line + f"; no price for {hw.name} in the catalog (give hardware.usd_per_chip_hour)"
    return (line + f"; ${p.usd_per_image:.4f} per {what} at ${hw.usd_per_chip_hour:.2f} per chip-hour x "
            f"{hw.chips} chip(s) ({'your override' if 'usd_per_chip_hour' in hw.overridden else 'list price'}); "
            "`meshlab explain` shows how")


#: the share of a call's time an assumed (unmeasured) host rate may price before the headline says so
ASSUMED_SHARE_SHOWN = 0.25


def _assumed_host_share(planned: PlannedStrategy, p) -> str:
    """"; X s of the call is the text encoder on the host at an assumed rate" where that term is a large share of
    the call and the host's rate is the catalog's assumption (not a measurement, not the strategy's own figure), with
    where else it fits beside the plan, if anywhere ("" otherwise)."""
    from meshlab.plan.planned import with_placement
    from meshlab.search.quick import CommandLineDocument

    hw, terms = planned.hardware, p.terms
    names = [c.name for c in planned.card.encoders]
    if terms is None or "cpu" not in planned.strategy.placement.places(names).values() or not p.first_call_s:
        return ""
    encode = terms.text_encode_host_s * p.layout.images  # the encoders on the host (placement.encoders)
    if (hw.sources.get("host_flops", "").startswith("measured") or "host_flops" in hw.overridden
            or encode < ASSUMED_SHARE_SHOWN * p.first_call_s):
        return ""
    quick = isinstance(planned.loaded.document, CommandLineDocument)  # no sharded encoder there: host or device
    move = ""  # where the plan itself does not fit: no room to speak of
    if planned.memory.fits:
        # where it fits beside the plan: the whole encoder on each chip, else split over them (one memory report each)
        where = next((w for w in (("device",) if quick or hw.chips == 1 else ("device", "sharded"))
                      if with_placement(planned, text_encoder=w, encoders={}).memory.fits), None)
        if where is None:
            move = "no room for it on the chips beside the plan"
        elif quick:
            move = "--text-encoder device puts it on the chips"
        else:
            move = (f"`placement.text_encoder: {where}` puts it on the chips"
                    + (", without placement.encoders" if planned.strategy.placement.encoders else "")
                    + (" (split over them: it does not fit whole beside the plan)" if where == "sharded" else ""))
    return (f"; {encode:.2f} s of the call is the text encoder on the host at an assumed "
            f"{hw.host_flops / 1e12:g} TFLOP/s (not measured" + (f"; {move})" if move else ")"))
