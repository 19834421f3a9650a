"""Rich rendering of `meshlab compare`, `meshlab sweep` and `meshlab explain`, and the compare plot."""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from rich.table import Table

from meshlab.cli.output import gib
from meshlab.strategy.schema import output_noun, with_article
from meshlab.cost.collectives import libtpu_flags_line
from meshlab.cost.compiled_call import schedule_rows
from meshlab.cost.ring import MERGE_HBM_FRACTION
from meshlab.cost.timing import async_class
from meshlab.plan.memory import gathers_mode

PREDICTED = "[dim](predicted)[/dim]"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def _bytes(n: float) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def usd(amount: float | None) -> str:
    """Dollars to the cent, or to four digits below a cent ("-": no price)."""
    if amount is None:
        return "-"
    return f"${amount:.2f}" if amount >= 1 else f"${amount:.4f}"


def mesh_label(mesh, between: str = "x") -> str:
    """A mesh with its axes named, as the sweep writes it: data2xmodel4."""
    return between.join(f"{name}{size}" for name, size in mesh.axes)


def _what_and_where(entries) -> dict:
    """Each entry's (model, "on" its system, what of its workload differs from its model's other plans, or ""), to
    show under its name; {} when every entry shares one model, workload and system."""
    from meshlab.search.compare import differing_work, work_of

    if len({work_of(e.planned) for e in entries}) == 1 and len({e.planned.hardware.name for e in entries}) == 1:
        return {}  # the model is part of the work
    parts = {}
    for e in entries:
        workload, model = e.planned.strategy.workload, e.planned.card.name
        differing = differing_work([x.planned for x in entries if x.planned.card.name == model])
        work = ", ".join(f"{f.replace('_', ' ')} {getattr(workload, f)}" for f in differing)
        parts[id(e)] = (model, f"on {e.planned.hardware.name}", work)
    return parts


def render_comparison(comparison, console, plot: Path | None = None) -> None:
    entries = comparison.entries
    under = {key: f"{model} {system}" + (f"; {work}" if work else "")
             for key, (model, system, work) in _what_and_where(entries).items()}
    what = output_noun([e.planned.strategy.workload for e in entries])
    table = Table(title=f"Strategies ranked by seconds per {what} {PREDICTED} within each model and workload"
                        + ("; under each name: its model, system, and workload where it differs" if under else ""),
                  title_justify="left")
    columns = ("strategy", "mesh", "weights\nGiB", "peak\nGiB", "usable\nGiB", "fits", "compute\nms/step",
               "HBM\nms/step", "coll.\nms/step", "step\nms", "latency\ns", f"s/{what}", f"$/{what}", "MFU",
               "coll.\nGiB/step")
    longest = max([len(e.planned.strategy.name) + 5 for e in entries] + [len(line) for line in under.values()],
                  default=8)
    for c in columns:
        table.add_column(c, justify="left" if c in ("strategy", "mesh", "fits") else "right",
                         min_width=min(longest, 40) if c == "strategy" else None)
    for e in entries:
        p, chip = e.prediction, e.planned.memory.most_loaded
        name = e.planned.strategy.name + (" [bold green]best[/bold green]" if comparison.is_best(e) else "")
        if under:
            name += f"\n[dim]{under[id(e)]}[/dim]"
        table.add_row(
            name, mesh_label(e.planned.plan.mesh, " x "),
            f"{chip.weights / 2**30:.2f}", f"{chip.total / 2**30:.2f}", f"{chip.hbm / 2**30:.2f}",
            "yes" if e.fits else "[red]no[/red]",
            f"{p.step.compute * 1e3:.1f}", f"{p.step.hbm * 1e3:.1f}", f"{p.step.collective * 1e3:.1f}",
            f"{p.step.total * 1e3:.1f}", f"{p.first_call_s:.2f}", f"{p.seconds_per_image:.2f}",
            usd(p.usd_per_image) if e.fits else "[red]-[/red]", f"{100 * p.mfu:.0f}%",
            f"{p.step.collective_bytes / 2**30:.2f}",
        )
    console.print(table)
    firsts = [f"{e.planned.strategy.name} {e.prediction.time_to_first_image:.0f} s"
              + (" (compile measured)" if e.prediction.startup and e.prediction.startup.compile_measured else "")
              for e in comparison.entries]
    console.print(f"Time to first {what} (load, compile, first call; a compile is modelled unless `meshlab check "
                  "--backend tpu` measured this plan's): " + ", ".join(firsts))
    for e in comparison.entries:
        if e.why:
            console.print(f"  [bold]{e.planned.strategy.name}[/bold] loses: {e.why}")
    for note in comparison.notes:
        console.print(f"[yellow]note:[/yellow] {note}")
    if len({e.planned.hardware.name for e in entries}) > 1:  # plans on other systems rest on other figures
        _print_bases(console, [(e.planned.hardware.name, e.prediction) for e in entries])
    for e in comparison.entries:
        if (warning := extrapolation_warning(e.prediction)) is not None:
            console.print(f"[yellow]warning:[/yellow] {e.planned.strategy.name}: {warning}")
    console.print("[dim]Every time above is predicted by meshlab's cost model; latency is one request's wait for a "
                  f"whole pipeline call, s/{what} that call's time shared among its {what}s (throughput), end to end "
                  "(text encode, "
                  "denoise, VAE decode, host transfers, overhead; `meshlab explain FILE` shows each term); compute/step "
                  "is FLOPs at the efficiency-scaled peak, HBM/step bytes at the scaled bandwidth, step = per-op max + "
                  "collectives + any wait on eager launches + host overhead; a plan that does not fit has no price "
                  "(its JSON keeps the figure, beside fits: false); padding per chip: `meshlab try FILE` or --json. "
                  "`meshlab explain FILE` lists the assumptions.[/dim]")
    if plot is not None:
        console.print(f"plot written to {plot}")


@contextmanager
def progress_bar(enabled: bool):
    """Yield an ``advance(done, total)`` callback drawing a progress bar on stderr (or doing nothing)."""
    if not enabled:
        yield None
        return
    from rich.console import Console
    from rich.progress import Progress

    with Progress(console=Console(stderr=True), transient=True) as progress:
        task = progress.add_task("planning candidates", total=None)

        def advance(done: int, total: int) -> None:
            progress.update(task, completed=done, total=total)

        yield advance


def render_sweep(result, console, out: str | None, seconds: float, default_systems: tuple[str, ...] = (),
                 unwritten: str | None = None) -> None:
    systems = [summary.hardware for summary in result.systems]
    what = _noun(result)
    if default_systems:
        console.print(f"systems: meshlab's default set ({', '.join(default_systems)}); --hardware A,B,... to choose")
    if len(systems) == 1:
        _render_front(result, systems[0], console)
    else:
        _render_cost_front(result, console)
    _render_systems(result, console)
    dropped = [c for c in result.candidates if c.dropped]
    fitting = len(result.candidates) - len(dropped)
    console.print(f"{len(result.candidates)} candidates: {fitting} fit, {len(dropped)} dropped"
                  + ("".join(f"\n  dropped {c.strategy.name}: {c.dropped}" for c in dropped) if len(systems) == 1
                     else " (`--json` lists why)"))
    limits = result.limits
    if limits.given:
        goals = [(f"at most {limits.max_seconds_per_image:g} s per {what} at throughput" if limits.throughput else
                  f"{with_article(what)} in at most {limits.max_seconds_per_image:g} s") for _ in [1]
                 if limits.max_seconds_per_image]
        goals += [f"at most ${limits.max_usd_per_image:g} {with_article(what)}" for _ in [1]
                  if limits.max_usd_per_image is not None]
        console.print(f"goals: {' and '.join(goals)}")
    if result.best is None:
        c = result.closest
        console.print("[bold red]no plan meets the goals[/bold red]" + (
            f"; the closest is {c.strategy.name} ({limits.problem(c)}), limited by "
            f"{binding_of(c).describe()}" if c is not None else "; no plan fits any system")
            + (f"; nothing written to {unwritten}" + (" (what it holds is from before)" if Path(unwritten).exists()
                                                       else "") if unwritten else ""))
    else:
        b = result.best
        console.print(f"best by {result.objective}: [bold]{b.strategy.name}[/bold], {_times(b)} predicted"
                      + (f"; written to {out}" if out else ""))
        for label, other in (("lowest latency", result.lowest_latency), ("highest throughput",
                                                                        result.highest_throughput),
                             ("cheapest", result.cheapest)):
            if other is not None and other is not b:
                console.print(f"{label}: [bold]{other.strategy.name}[/bold], {_times(other)}")
    if result.images is not None:
        costly = [c for c in (result.best, result.cheapest) if c is not None and c.prediction.startup.total
                  > c.prediction.session_seconds(result.images) - c.prediction.startup.total]
        for c in [c for i, c in enumerate(costly) if all(c is not o for o in costly[:i])]:
            making = c.prediction.session_seconds(result.images) - c.prediction.startup.total
            doing = "loading and compiling" if c.prediction.startup.compile_s else "loading"  # eager: no compile
            console.print(f"[yellow]note:[/yellow] {c.strategy.name}: {doing} "
                          f"({c.prediction.startup.total:.0f} s) take{'s' if doing == 'loading' else ''} longer than "
                          f"making the {result.images} {what}{'s' if result.images > 1 else ''} "
                          f"({making:.0f} s)")
    basis = (f"over {result.images} {what}s with the load and compile before them" if result.images is not None
             else "at throughput")
    measured = any(s.best is not None and s.best.prediction.startup is not None
                   and s.best.prediction.startup.compile_measured for s in result.systems)
    compiles = ("; * its XLA:TPU compile measured by `meshlab check --backend tpu`, the others' modelled" if measured
                else "; a TPU plan's compile modelled unless `meshlab check --backend tpu` measured it"
                if any(s.hardware.kind == "tpu" for s in result.systems) else "")
    console.print(f"[dim]sweep took {seconds:.2f} s. latency: one request's wait, a whole pipeline call; s/{what}: "
                  f"the call's time shared among its {what}s (throughput); $/{what}: the chips' list price, {basis}; "
                  f"first {what}: load, compile and the first call (`meshlab explain` shows each{compiles})[/dim]")


def _times(c) -> str:
    what = output_noun([c.strategy.workload])
    return (f"{c.latency:.2f} s latency, {c.seconds:.2f} s/{what} at throughput ({c.prediction.layout.images} per "
            f"call), {usd(c.usd)}/{what}")


def _noun(result) -> str:
    """What the sweep's plans make: its one model's images or videos."""
    return output_noun([c.strategy.workload for c in result.candidates])


def _usd_column(result) -> str:
    what = _noun(result)
    return f"$/{what}" if result.images is None else f"$/{what}\nover {result.images}"


def binding_of(candidate):
    from meshlab.search.sweep import binding

    return binding(candidate, [], candidate.hardware)


def _render_front(result, hardware, console) -> None:
    table = Table(title=f"Pareto front on {hardware.name} ({hardware.chips} devices): {result.objective} against "
                        f"headroom {PREDICTED}", title_justify="left")
    for c in ("candidate", "family", "mesh", "batch", "latency\ns", f"s/{_noun(result)}", _usd_column(result), "step",
              "MFU",
              "peak/chip", "headroom"):
        table.add_column(c, justify="left" if c in ("candidate", "family", "mesh") else "right")
    for c in result.front:
        p = c.prediction
        name = c.strategy.name + (" [bold green](best)[/bold green]" if c is result.best else "")
        table.add_row(name, c.family, "x".join(f"{k}{v}" for k, v in c.strategy.mesh.items()),
                      str(c.strategy.workload.batch), f"{c.latency:.2f}", f"{p.seconds_per_image:.2f}", usd(c.usd),
                      _ms(p.step.total), f"{100 * p.mfu:.0f}%", gib(c.memory.most_loaded.total), gib(c.headroom))
    console.print(table)


def _render_cost_front(result, console) -> None:
    what = _noun(result)
    table = Table(title=f"Latency against dollars per {what}: the plans no other beats on both {PREDICTED}",
                  title_justify="left")
    for c in ("candidate", "system", "mesh", "batch", "latency\ns", f"s/{what}", _usd_column(result), "peak/chip"):
        table.add_column(c, justify="left" if c in ("candidate", "system", "mesh") else "right")
    for c in result.cost_front:
        tags = [t for t, who in (("best", result.best), ("cheapest", result.cheapest)) if c is who]
        name = c.strategy.name + (f" [bold green]({', '.join(tags)})[/bold green]" if tags else "")
        table.add_row(name, c.hardware.name, "x".join(f"{k}{v}" for k, v in c.strategy.mesh.items()),
                      str(c.strategy.workload.batch), f"{c.latency:.2f}", f"{c.seconds:.2f}", usd(c.usd),
                      gib(c.memory.most_loaded.total))
    console.print(table)


def _render_systems(result, console) -> None:
    table = Table(title=f"Each system's best plan by {result.objective}, and what limits it {PREDICTED}",
                  title_justify="left")
    what = _noun(result)
    numbers = ("chips", "$/chip-h", "latency\ns", f"s/{what}", _usd_column(result), f"first\n{what}", "fit")
    for c in ("system", "chips", "$/chip-h", "plan", "latency\ns", f"s/{what}", _usd_column(result), f"first\n{what}",
              "fit", "limited by"):
        table.add_column(c, justify="right" if c in numbers else "left")
    for s in result.systems:
        hw, b = s.hardware, s.best
        table.add_row(hw.name, str(hw.chips), usd(hw.usd_per_chip_hour), b.strategy.name if b else "-",
                      f"{b.latency:.2f}" if b else "-", f"{b.seconds:.2f}" if b else "-", usd(b.usd) if b else "-",
                      _first_cell(b.prediction) if b else "-", f"{s.fitting}/{s.fitting + s.dropped}",
                      s.binding.describe())
    console.print(table)
    _print_bases(console, [(s.hardware.name, s.best.prediction) for s in result.systems if s.best is not None])


def _first_cell(p) -> str:
    """A time to first image, marked * where it takes a measured XLA:TPU compile (the footer says so)."""
    return f"{p.time_to_first_image:.0f} s" + ("*" if p.startup is not None and p.startup.compile_measured else "")


def _print_bases(console, priced: list) -> None:
    """What each system's times rest on (measured, published, assumed), for (system, prediction) pairs; nothing
    when there are none."""
    bases = {}
    for name, prediction in priced:
        names = bases.setdefault(_basis(prediction), [])
        if name not in names:
            names.append(name)
    if bases:
        console.print("[dim]times priced from: " + "; ".join(f"{', '.join(names)}: {basis}" for basis, names in
                                                            bases.items())
                      + " (systems priced from assumed efficiencies compare less surely)[/dim]")


def _basis(p) -> str:
    """What a prediction's op times rest on, in a few words."""
    if p.pricing is None:
        return "a measured profile"
    c = p.pricing
    parts = ["GEMMs measured" if c.linears_measured else "", "attention published" if c.attention_published else ""]
    found = [x for x in parts if x]
    return ", ".join(found) + ("; rest assumed" if found else "assumed efficiencies")


def _compute_how(hw) -> str:
    rest = f"at {_rate(hw.bf16_flops)} x {hw.compute_efficiency}"
    rated = [{"linear": "Linears at the measured GEMM rate for their shape",
              "attention": f"attention at {hw.attention_kernel}'s published rate"
                           + (" as full as its tiles keep the SMs" if hw.sm_count else "")}[kind]
             for kind in hw.rated_ops]
    return f"{'; '.join(rated)}; the rest {rest}" if rated else rest


def _cost_row(p, hw, what: str) -> tuple[str, str, str]:
    if p.usd_per_image is None:
        return (f"cost per {what}", "-",
                f"no price for {hw.name} (give hardware: {{name: ..., usd_per_chip_hour: ...}})")
    whose = "your override" if "usd_per_chip_hour" in hw.overridden else hw.sources["usd_per_chip_hour"].split(":")[0]
    return (f"cost per {what}", usd(p.usd_per_image),
            f"${hw.usd_per_chip_hour:.2f} per chip-hour ({whose}) x {p.chips} chip(s) x {p.seconds_per_image:.2f} s "
            f"per {what} / 3600; `meshlab hardware --json` has the price's source")


def _first_image_row(p, hw, what: str) -> tuple[str, str, str]:
    s = p.startup
    stacked = (f" + {hw.compile_seconds_per_scanned_block:g} s x {s.stacked_blocks} blocks stacked"
               if s.stacked_blocks else "")
    bodies = ("scanned block body" if s.compiled_blocks == 1 else "scanned block bodies") if s.stacked_blocks else \
        "blocks"
    compiled = (f"compile {s.compile_s:.0f} s ({hw.compile_measured.describe()})" if s.compile_measured else
                f"compile {s.compile_s:.0f} s (modelled: {hw.compile_seconds_base:g} s + "
                f"{hw.compile_seconds_per_block:g} s x {s.compiled_blocks} {bodies}{stacked}; "
                "`meshlab check --backend tpu` measures this plan's)" if s.compile_s else
                "no compile (eager)")
    price = f"; {usd(p.usd_to_first_image)} for the wait" if p.usd_to_first_image is not None else ""
    return (f"time to first {what}", f"{p.time_to_first_image:.0f} s",
            f"read {s.checkpoint_bytes / 1e9:.1f} GB at {hw.checkpoint_read_bandwidth / 1e9:g} GB/s {s.read_s:.0f} s + "
            f"to the chips {s.transfer_s:.1f} s + {compiled} + first call {p.first_call_s:.1f} s{price} "
            "(`meshlab hardware --json` has each figure's source)")


def render_explain(planned, prediction, console, schedule: dict | None = None) -> None:
    p, step = prediction, prediction.step
    hw = planned.hardware.at_dtype(planned.strategy.workload.dtype)  # what the prediction priced from
    layout, what = p.layout, output_noun([planned.strategy.workload])
    console.print(f"[bold]{planned.strategy.name}[/bold] on {hw.name}, mesh {planned.plan.mesh.describe()}: "
                  f"{layout.batch} sample(s) per chip per call, {layout.calls} call(s) per step, "
                  f"{layout.local.describe()} per sample per chip")
    for line in planned.loaded.taken:  # what the file left out and planning took (plain text, no markup)
        console.print(line, markup=False)
    if hw.kind == "tpu" and planned.strategy.compile.libtpu_flags:
        console.print(libtpu_flags_line(planned.strategy.compile.libtpu_flags, hw.async_all_to_all_hidden,
                                        hw.async_weight_gather_hidden, gathers_mode(planned.strategy, hw)),
                      markup=False)
    table = Table(title=f"One step on one chip {PREDICTED}", title_justify="left")
    table.add_column("term")
    table.add_column("value", justify="right")
    table.add_column("how")
    rows = [
        ("FLOPs", f"{step.flops / 1e12:.2f} TFLOP", f"Linears per stream + attention, {step.calls} call(s)"),
        ("compute", _ms(step.compute), _compute_how(hw)),
        ("HBM bytes", _bytes(step.hbm_bytes), "weight shards once per call + Linear/attention inputs and outputs "
         "+ elementwise passes"),
        ("HBM", _ms(step.hbm), f"at {hw.hbm_bandwidth / 1e12:.2f} TB/s x {hw.hbm_efficiency}"
         if hw.hbm_bandwidth >= 1e11 else f"at {hw.hbm_bandwidth / 1e9:.1f} GB/s x {hw.hbm_efficiency}"),
        ("compute or HBM", _ms(step.local), "per op, the longer of the two, summed") if p.measured is None else
        (f"call x {step.calls} (measured)", _ms(step.local), _measured_how(p.measured)),
        *([_elementwise_row(p)] if p.measured is None else []),
        *_ring_rows(p),
        ("collectives", _ms(step.collective), f"{_bytes(step.collective_bytes)} per chip, "
         + ((_hidden(step) if not (p.measured is not None and p.measured.collectives_included) else "")
            or "no overlap")
         + (" (a ring's transfers: what its passes do not hide)" if step.rings else "")
         + (" (measured inside the timed call)" if p.measured is not None and p.measured.collectives_included
            else "")),
        *([("  of which DCN", _ms(step.dcn), f"crossing {hw.slices} slices ({_dcn_axes(planned)}) at "
            f"{hw.dcn_bandwidth_per_chip / 1e9:.2f} GB/s per chip ({hw.dcn_bandwidth_per_host / 1e9:.0f} GB/s per "
            f"host)")] if hw.slices > 1 else []),
        *([("waiting on launches", _ms(step.launch_wait), f"eager: the host dispatches {step.dispatches} ops "
            f"one by one at {hw.eager_dispatch_s * 1e6:.1f} us each ({_ms(step.launch_floor)}), longer than the "
            "chip's own work above")] if step.launch_wait else []),
        ("host overhead", _ms(step.overhead), "per step" + (" (measured: an empty program's trace and run)"
                                                            if hw.profile is not None else "")),
        ("[bold]step[/bold]", f"[bold]{_ms(step.total)}[/bold]", ""),
        ("roofline", _ms(step.roofline), "100% of peak FLOPs or HBM bandwidth, no collectives"),
        (f"denoise per {what}", f"{p.denoise_seconds_per_image:.2f} s",
         f"{layout.steps} steps / {layout.images} {what}(s) per call; roofline {p.roofline_seconds_per_image:.2f}"),
        ("MFU", f"{100 * p.mfu:.1f}%", f"useful FLOPs over all chips' peak; roofline MFU {100 * p.roofline_mfu:.1f}%"),
        _cost_row(p, hw, what),
        _first_image_row(p, hw, what),
    ]
    for row in rows:
        table.add_row(*row)
    console.print(table)
    console.print(_terms_table(planned, p))
    if p.measured is not None:
        console.print(_priced_table(hw.profile, p.measured))
        if (warning := extrapolation_warning(p)) is not None:
            console.print(f"[yellow]warning:[/yellow] {warning}")
    elif p.pricing is not None and (p.pricing.linears_measured or p.pricing.attention_published):
        console.print(_catalog_pricing_line(p.pricing, hw))
    if schedule:
        console.print(_xla_schedule_table(schedule))
    console.print(_collective_table(p, planned))
    console.print("[bold]Assumptions[/bold]")
    from meshlab.cost.document import assumptions_document

    for a in assumptions_document(hw, model_class=planned.card.class_name):
        value = "" if a["value"] is None else f" = {a['value']}"
        console.print(f"  {a['name']}{value}: [dim]{a['source']}[/dim]")


def _ring_rows(p) -> list[tuple[str, str, str]]:
    """The ring term (meshlab.cost.ring): the step's, then each kind of ringed attention's passes, merges and
    transfers."""
    rings = p.step.rings
    if not rings:
        return []
    calls = p.step.calls
    total = calls * sum(x.count * x.compute_seconds for x in rings)
    whole = calls * sum(x.count * x.whole_seconds for x in rings)
    rows = [("  ring attention", _ms(total), f"{sum(x.count for x in rings)} attentions x {calls} call(s) as a ring "
             f"of {rings[0].degree} ({rings[0].implementation}): passes, merges and casts (the transfers the passes "
             f"do not hide are in the collectives); each as one kernel over every key: {_ms(whole)}")]
    kinds: dict[tuple, list] = {}
    for x in rings:
        kinds.setdefault((x.pass_seconds, x.merge_seconds, x.transfer_seconds), []).append(x)
    for group in kinds.values():
        r, n = group[0], group[0].degree
        moved = (f"each next block of k and v ({_bytes(r.block_bytes)}) sent to the next chip during a pass: "
                 f"{r.transfer_seconds * 1e6:.0f} us a block, {r.exposed_transfer * 1e6:.0f} us not hidden (xDiT)"
                 if r.implementation == "p2p-passes" else
                 f"k and v all-gathered once ({_bytes(n * r.block_bytes)}) behind the first pass: "
                 f"{r.transfer_seconds * 1e6:.0f} us, {r.exposed_transfer * 1e6:.0f} us not hidden (diffusers)")
        where = " + ".join(dict.fromkeys(f"{x.module.split('.', 1)[0]} {x.module.rsplit('.', 1)[-1]}" for x in group))
        rows.append((f"    {where} x {sum(x.count for x in group)}", f"{r.seconds * 1e6:.0f} us",
                     f"{n} passes of {r.pass_seconds * 1e6:.0f} us (its queries against 1/{n} of the keys, at the "
                     f"kernel's rate there, as full as its tiles keep the SMs) + {n - 1} merge{'s' if n > 2 else ''} "
                     f"of {r.merge_seconds * 1e6:.0f} us + {n + 1} float32 casts of {r.cast_seconds * 1e6:.0f} us "
                     f"(at {MERGE_HBM_FRACTION:.3g} of HBM bandwidth, as eager merges ran on an H200); {moved}; one "
                     f"kernel over every key: {r.whole_seconds * 1e6:.0f} us"))
    return rows


def _catalog_pricing_line(c, hw) -> str:
    parts = []
    if c.linears_measured:
        grid = hw.matmul_rates
        span = f"{min(grid.m[0], grid.n[0], grid.k[0])}..{max(grid.m[-1], grid.n[-1], grid.k[-1])} a dim"
        outside = [f"{c.linears_below:.1f}x below them (their trend continued)"] if c.linears_below > 1.0 else []
        outside += [f"{c.linears_above:.1f}x above them (the largest shape's rate held)"] if c.linears_above > 1.0 \
            else []
        where = f", the farthest {' and '.join(outside)}" if outside else ", all within them"
        parts.append(f"{c.linears_measured} Linears at measured GEMM rates ({span}){where}")
    if c.attention_published:
        parts.append(f"{c.attention_published} attentions at {hw.attention_kernel}'s published rates"
                     + (" as full as their tiles keep the SMs" if hw.sm_count else ""))
    return f"Priced from the catalog: {'; '.join(parts)}; {c.assumed} other ops at the assumed efficiencies"


def _elementwise_row(p) -> tuple[str, str, str]:
    eager = p.layout.elementwise == "eager"
    if not any(w.kind == "elementwise" for w in p.work):
        return ("  of which elementwise", "-", f"not priced: the card records no {'eager ' if eager else ''}"
                "elementwise trace (regenerate it with `meshlab models import`)")
    how = "every op its own kernel (compile: {elementwise: eager})" if eager else \
        "one fused pass per gap between matmuls"
    return ("  of which elementwise", _ms(p.step.elementwise),
            f"{_bytes(p.step.elementwise_bytes)}: {how}, bytes per token traced into the card")


#: A profile's figure priced this many times beyond its measured sizes (or more) is flagged where it is shown.
EXTRAPOLATION_WARNING = 1.5


def extrapolation_warning(prediction) -> str | None:
    """A labelled warning when the profile priced part of the step far beyond the sizes it measured."""
    m = prediction.measured
    if m is None or m.stretch < EXTRAPOLATION_WARNING:
        return None
    return (f"priced {m.stretch:.1f}x beyond the sizes the profile measured (the nearest points are that far); "
            "profile this plan at its workload for a measured figure")


def _rate(flops: float) -> str:
    return f"{flops / 1e12:.0f} TFLOP/s" if flops >= 1e12 else f"{flops / 1e9:.1f} GFLOP/s"


def _measured_how(measured) -> str:
    if measured.basis == "blocks":
        return "; ".join(measured.measured)
    return f"{len(measured.measured)} ops from measured points, {len(measured.assumed)} at assumed efficiencies"


def _priced_table(profile, measured) -> Table:
    """What the step rests on from the profile: measured, interpolated, fitted, or assumed."""
    table = Table(title=f"Priced from {profile.path} ({profile.device.get('name')}, measured)", title_justify="left")
    for column in ("basis", "measured", "assumed", "extrapolated", "note"):
        table.add_column(column)
    stretch = f"{measured.stretch:.1f}x beyond the measured sizes" if measured.stretch > 1.0 else "no"
    if not measured.collectives_included and measured.collectives_measured + measured.collectives_assumed:
        measured = replace(measured, measured=measured.measured + (f"{measured.collectives_measured} collectives",),
                           assumed=measured.assumed + ((f"{measured.collectives_assumed} collectives (topology "
                                                        "model)",) if measured.collectives_assumed else ()))
    table.add_row(measured.basis, ", ".join(measured.measured[:6]) + (" ..." if len(measured.measured) > 6 else ""),
                  ", ".join(measured.assumed[:6]) + (" ..." if len(measured.assumed) > 6 else "") or "nothing",
                  stretch, measured.note)
    return table


def _encode_where(placement, card, hw) -> str:
    """Where the encoders encode, at what rate ("on the host at ..."): one place for all, or each encoder's where
    they differ ("with text_encoder on the host at ...; image_encoder on the chip at ...")."""
    host_how = "measured" if hw.sources.get("host_flops", "").startswith("measured") else "assumed"

    def at(place: str) -> str:
        text = (f"the host at {_rate(hw.host_flops)} ({host_how})" if place == "cpu"
                else f"the chip at {_rate(hw.bf16_flops)} x {hw.compute_efficiency}")
        if place == "sharded" and hw.chips > 1:
            text += (f", plus each encode's all-gather of its layers over {hw.chips} chips at "
                     f"{hw.ici_link_bandwidth / 1e9:.0f} GB/s")
        return text

    places = placement.places(c.name for c in card.encoders)
    if len(set(places.values())) <= 1:
        return "on " + at(next(iter(places.values()), placement.text_encoder))
    return "with " + "; ".join(f"{name} on {at(place)}" for name, place in places.items())  # placement.encoders


def _terms_table(planned, p) -> Table:
    """Seconds per image end to end, term by term (meshlab.cost.pipeline_time)."""
    workload, card = planned.strategy.workload, planned.card
    hw = planned.hardware.at_dtype(workload.dtype)
    what = output_noun([planned.strategy.workload])
    table = Table(title=f"One {what}'s share of a pipeline call, end to end ({p.layout.images} {what}(s) per call) "
                        f"{PREDICTED}", title_justify="left")
    for column, justify in (("term", "left"), ("seconds", "right"), ("how", "left")):
        table.add_column(column, justify=justify)
    terms = p.terms
    encoders = card.text_encoders
    per_token = sum(c.flops_per_token + c.head_flops_per_token for c in encoders)
    prefix = max((c.prefix_tokens for c in encoders), default=0)
    images = card.image_encoders
    fixed = [c for c in encoders if c.fixed_tokens and c.fixed_tokens != workload.text_tokens + c.prefix_tokens]
    capped_how = "".join(f" ({c.name} at its {c.fixed_tokens})" for c in fixed)
    image_how = "".join(f", plus the {c.name} at {c.flops_per_token / 1e9:.1f} GFLOP per token x "
                        f"{card.architecture.reference_tokens} image tokens" for c in images)
    where = _encode_where(planned.strategy.placement, card, hw)
    measured_decode = hw.profile is not None and hw.profile.of("vae_decode") \
        and planned.strategy.placement.vae_decode == "full"
    vae = next((c for c in card.components if c.name == "vae"), None)
    rows = [
        ("text encode", "text_encode_s", f"{per_token / 1e9:.1f} GFLOP per token x {workload.text_tokens}"
         f"{f' + {prefix} template' if prefix else ''} tokens{capped_how} x "
         f"{2 if workload.cfg else 1} prompt(s){image_how} {where}"
         f"{'; the VAE encode of the conditioning frames is not priced' if images else ''}"),
        ("denoise", "denoise_s", f"{p.layout.steps} steps at {_ms(p.step.total - p.step.overhead)}"),
        ("VAE decode", "vae_decode_s", _decode_how(vae, hw, planned.strategy.placement.vae, measured_decode)),
        ("host transfers", "transfer_s", f"prompt embeddings in, float32 pixels out at "
         f"{hw.host_link_bandwidth / 1e9:.0f} GB/s"),
        ("host overhead", "overhead_s", f"{_ms(p.step.overhead)} per step"),
    ]
    for name, key, how in rows:
        unknown = key in terms.unknown
        table.add_row(name, "unknown" if unknown else f"{getattr(terms, key):.3f}",
                      "the card lacks this figure: regenerate it" if unknown else how)
    table.add_row(f"[bold]seconds per {what}[/bold]", f"[bold]{p.seconds_per_image:.2f}[/bold]",
                  "at throughput: the call's time shared among its " + what + "s")
    table.add_row(f"latency: one {what}", f"{p.first_call_s:.2f}", f"a whole call: a request waits for all "
                  f"{p.layout.images} {what}(s) of it")
    return table


def _decode_how(vae, hw, where: str, measured: bool) -> str:
    """What priced the VAE decode (meshlab.cost.pipeline_time.vae_decode_seconds)."""
    if vae is None:
        return "no VAE in the card"
    flops = f"{vae.decode_flops_per_pixel / 1e6:.1f} MFLOP per output pixel"
    if measured:
        return f"{flops}, timed by the profile (at its resolution, else at its rate)"
    if where == "cpu":
        return f"{flops} on the host at {_rate(hw.host_flops)}"
    from meshlab.cost.pipeline_time import decode_bytes_per_pixel, dispatch_seconds

    per = "decode (one decoder call makes the whole video)" if vae.output_copies == 1 else "latent frame"
    floor = (f"; at least {vae.decode_dispatches} ops' dispatches per {per} (and tile)" if dispatch_seconds(hw) else "")
    return (f"{flops} at the chip's effective peak + {decode_bytes_per_pixel(vae, hw) / 1e3:.1f} kB per pixel moved "
            f"by its other ops ({'fused by XLA' if hw.kind == 'tpu' else 'eager, each op its own kernel'}) at its "
            f"effective HBM bandwidth{floor} (traced decode)")


def _dcn_axes(planned) -> str:
    return ", ".join(f"{axis} over {k}" for axis, k in planned.strategy.dcn.items() if k > 1)


def _collective_table(p, planned) -> Table:
    """Every kept block's collectives (one per block list, more where a list's blocks differ, as SD3.5's last one),
    each standing for the identical blocks it represents, and those outside the blocks."""
    from meshlab.cost.graph import graph_of

    issued = [t.collective for t in p.step.collectives]
    blocks = sorted({c.block for c in issued if c.block is not None})
    paths = {q.parameter.block: ".".join(q.name.split(".")[:2]) for q in planned.plan.parameters
             if q.parameter.block in blocks}
    graph = graph_of(planned.plan)  # what a kept block stands for: a collective issued once counts 1
    stands = ", ".join(f"block {b} ({paths.get(b, '?')}, "
                       + (f"stands for {graph.count(b)} identical blocks)" if graph.count(b) > 1 else "on its own)")
                       for b in blocks)
    outside = any(c.block is None for c in issued)
    where = (f"{stands}{' and outside the blocks' if outside else ''}" if blocks
             else "none in the blocks" if not p.collectives else "outside the blocks only")
    table = Table(title=f"Collectives of one call: {where} {PREDICTED}; alike ones on one row (ops: how many, "
                        "bytes and exposed: each)", title_justify="left")
    for c in ("where", "ops", "kind", "axes", "route", "bytes", "exposed", "why"):
        table.add_column(c, justify="right" if c in ("ops", "bytes", "exposed") else "left")
    rows: dict[tuple, int] = {}
    for t in p.step.collectives:
        c = t.collective
        where = "per step" if c.per_step else ("outside" if c.block is None else f"block {c.block}")
        row = (where, c.kind + (f" x{c.operands}" if c.operands > 1 else ""), "+".join(c.axes), t.route.shape,
               _bytes(c.bytes), f"{t.seconds * 1e6:.0f} us", c.why + (
                   "" if not t.hidden else f" (and {t.hidden * 1e6:.0f} us hidden by its slice of the matmul)"
                   if t.hidden_by == "matmul" else f" (and {t.hidden * 1e6:.0f} us hidden: async, as XLA:TPU's "
                   f"schedule hides {async_class(c)}s)"))
        rows[row] = rows.get(row, 0) + 1
    for row, ops in rows.items():
        table.add_row(row[0], str(ops), *row[1:])
    if not p.collectives:
        table.add_row("-", "", "none", "", "", "", "", "no weight or activation crosses chips")
    return table


def plot_comparison(comparison, path: Path, inputs: tuple | list = ()) -> None:
    """Two panels: per-chip memory stacked by component against the usable HBM line; time per image (or video)
    stacked."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from meshlab.core.errors import InputError

        raise InputError("--plot needs matplotlib", "pip install 'meshlab[plot]'") from None
    from meshlab.core.files import write_atomic_bytes

    entries = comparison.entries
    under = _what_and_where(entries)
    names = ["\n".join([e.planned.strategy.name, *(p for p in under.get(id(e), ()) if p)]
                       + ([] if e.fits else ["(does not fit)"])) for e in entries]
    fig, (mem_ax, time_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    _stack(mem_ax, names, _memory_parts(entries), "GiB per chip (most loaded)")
    for i, e in enumerate(entries):  # each plan's own chip: systems differ in HBM
        mem_ax.hlines(e.planned.memory.most_loaded.hbm / 2**30, i - 0.4, i + 0.4, color="red", linestyle="--",
                      label="usable HBM (its chip)" if i == 0 else None)
    mem_ax.legend(fontsize=7)
    what = output_noun([e.planned.strategy.workload for e in entries])
    _stack(time_ax, names, _time_parts(entries), f"seconds per {what} (predicted)")
    time_ax.legend(fontsize=7)
    fig.suptitle("meshlab compare: predicted, not measured")
    fig.tight_layout()
    import io

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    write_atomic_bytes(path, buffer.getvalue(), inputs, "--plot")


def _xla_schedule_table(schedule: dict) -> Table:
    """XLA:TPU's scheduler estimate of one call beside meshlab's prediction of the same program."""
    attention = f"{schedule['attention']} attention" + (
        "" if schedule["attention_as_priced_above"] else ", not the attention priced above")
    table = Table(title=f"One call as {schedule['front_end']}'s program ({attention}): XLA:TPU's scheduler estimate "
                        f"(its cost model, not a measurement; kept by `meshlab check --backend tpu` on "
                        f"{schedule['measured_at'][:10]}) against meshlab's prediction of that program",
                  title_justify="left")
    return schedule_table(table, schedule["meshlab"], schedule["xla"], _ms)


def schedule_table(table: Table, ours: dict, theirs: dict, ms) -> Table:
    """`table` with meshlab's call beside XLA:TPU's schedule of it, term by term (meshlab.cost.compiled_call.
    schedule_rows), and XLA:TPU's over meshlab's for each."""
    for column in ("", "meshlab (predicted)", "XLA:TPU schedule", "XLA:TPU / meshlab",
                   "meshlab's work: the rate meshlab's time vs XLA:TPU's implies"):
        table.add_column(column, justify="left" if not column or column.startswith("meshlab's") else "right")
    for term, mine, xla, implied in schedule_rows(ours, theirs):
        ratio = f"{xla / mine:.2f}" if mine and xla else ""
        table.add_row(term, "not priced" if mine is None else ms(mine), ms(xla), ratio, implied)
    return table


def _hidden(step) -> str:
    """What compute hides of the collectives per step: the collective-matmul permutes' time their matmul slices
    hide, and the async collectives' share XLA:TPU's schedule hides; "" where none is."""
    def hidden(by: str) -> float:
        return sum(t.collective.count * t.hidden * (1 if t.collective.per_step else step.calls)
                   for t in step.collectives if t.hidden_by == by)

    matmul, hides = hidden("matmul"), hidden("async")
    kinds = sorted({async_class(t.collective) for t in step.collectives if t.hidden_by == "async"})
    said = ([f"collective matmuls' permutes less the {_ms(matmul)} their matmul slices hide"] if matmul else []) + (
        [f"{' and '.join(kinds)}s less the {_ms(hides)} XLA:TPU's schedule hides of them (async)"] if hides else [])
    return f"exposed: {'; '.join(said)} (not counted); the other collectives no overlap" if said else ""


def _memory_parts(entries) -> dict[str, list[float]]:
    parts: dict[str, list[float]] = {}
    for e in entries:
        c = e.planned.memory.most_loaded
        values = {"weights": c.weights_sharded + c.weights_replicated, "padding": c.padding + c.tile_padding,
                  "transformer buffers": c.buffers, "activations": c.activation_peak,
                  "VAE + text encoder": c.vae_weights + c.text_encoder, "reserve": c.reserve}
        for k, v in values.items():
            parts.setdefault(k, []).append(v / 2**30)
    if not any(parts["transformer buffers"]):  # a part no plan has: no legend entry (most models have no buffers)
        del parts["transformer buffers"]
    return parts


def _time_parts(entries) -> dict[str, list[float]]:
    parts: dict[str, list[float]] = {}
    for e in entries:
        p = e.prediction
        per_image = p.layout.steps / p.layout.images
        values = {"compute / HBM": p.step.local, "collectives": p.step.collective,
                  "waiting on launches": p.step.launch_wait, "host overhead": p.step.overhead}
        for k, v in values.items():
            parts.setdefault(k, []).append(v * per_image)
        outside = p.terms.text_encode_s + p.terms.vae_decode_s + p.terms.transfer_s if p.terms else 0.0
        parts.setdefault("text encode + VAE + transfers", []).append(outside)
    return parts


def _stack(ax, names, parts, label) -> None:
    bottom = [0.0] * len(names)
    for k, values in parts.items():
        ax.bar(names, values, bottom=bottom, label=k)
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel(label)
    ax.tick_params(axis="x", rotation=30, labelsize=8)


def plot_sweep(result, path: Path, inputs: tuple | list = ()) -> None:
    """Every plan that fits, latency against dollars per image (log scales), one colour per system; the plans no
    other beats on both joined as the front; the best and the cheapest marked."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        from meshlab.core.errors import InputError

        raise InputError("--plot needs matplotlib", "pip install 'meshlab[plot]'") from None
    import io

    from meshlab.core.files import write_atomic_bytes

    fig, ax = plt.subplots(figsize=(8, 5))
    priced = [c for c in result.candidates if c.fits and c.usd is not None]
    for summary in result.systems:
        mine = [c for c in priced if c.hardware is summary.hardware]
        if mine:
            ax.scatter([c.latency for c in mine], [c.usd for c in mine], s=14, alpha=0.6, label=summary.hardware.name)
    front = result.cost_front
    if front:
        ax.plot([c.latency for c in front], [c.usd for c in front], color="black", linewidth=1, label="front")
    for label, c, marker in (("best", result.best, "*"), ("cheapest", result.cheapest, "D")):
        if c is not None and c.usd is not None:
            ax.scatter([c.latency], [c.usd], marker=marker, s=120, color="black", zorder=3,
                       label=f"{label}: {c.strategy.name}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("seconds one request waits (a whole pipeline call)")
    what = _noun(result)
    ax.set_ylabel(f"dollars per {what} (list price)" + (f", over {result.images} {what}s" if result.images else ""))
    ax.legend(fontsize=6)
    fig.suptitle("meshlab sweep: predicted, not measured")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    plt.close(fig)
    write_atomic_bytes(path, buffer.getvalue(), inputs, "--plot")
