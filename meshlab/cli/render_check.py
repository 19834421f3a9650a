"""Rich rendering of `meshlab check`, and its progress display on stderr."""

from __future__ import annotations

import time
from collections import Counter, defaultdict

from rich.table import Table

from meshlab.check.hlo import COLLECTIVE_KINDS
from meshlab.check.verdict import OUTSIDE, CheckReport, check_document, is_last_block
from meshlab.cli.render_cost import schedule_table
from meshlab.plan.axes import ring_axes

__all__ = ["Progress", "check_document", "render_check", "render_dtensor_check"]

KIND_ORDER = COLLECTIVE_KINDS


class Progress:
    """A spinner on stderr naming the slow step under way, with the seconds spent on it."""

    def __init__(self, command: str = "check"):
        from rich.console import Console

        self.command = command
        self.console = Console(stderr=True, highlight=False)
        self.status = None
        self.started = time.perf_counter()

    def __enter__(self) -> "Progress":
        if self.console.is_terminal:
            self.status = self.console.status("planning")
            self.status.start()
        return self

    def update(self, message: str) -> None:
        elapsed = time.perf_counter() - self.started
        if self.status is not None:
            self.status.update(f"{message} [dim]({elapsed:.0f} s)[/dim]")
        else:
            self.console.print(f"[dim]meshlab {self.command}: {message} ({elapsed:.0f} s)[/dim]")

    def __exit__(self, *exc) -> None:
        if self.status is not None:
            self.status.stop()


def _largest_held(c, most: int = 3, share: float = 0.05) -> tuple:
    """The kinds of value XLA:TPU's program holds at its working set's peak (Compiled.working_set_at_peak) that the
    table names: the `most` largest, each at least `share` of the peak (the JSON has more)."""
    if c.working_set_live_peak is None:
        return ()
    return tuple(h for h in c.working_set_at_peak[:most] if h.bytes >= share * c.working_set_live_peak)


def mib(n: float) -> str:
    """Bytes in the unit that keeps three figures: 512 B, 3.0 KiB, 181.5 MiB, 9.52 GiB."""
    if n < 1024:
        return f"{n:.0f} B"
    if n < 2**20:
        return f"{n / 1024:.1f} KiB"
    if n < 2**30:
        return f"{n / 2**20:,.1f} MiB"
    return f"{n / 2**30:,.2f} GiB"


def kinds(counter: Counter) -> str:
    return ", ".join(f"{counter[k]} {k}" for k in KIND_ORDER if counter.get(k)) or "none"


def _header(setup, where: str) -> str:
    depth = ", ".join(f"{n} of {setup.full_blocks[k]} {k}" for k, n in setup.checked_blocks.items())
    geo = setup.geometry
    return (f"{setup.card.name} ({depth}) on {where}, mesh {setup.plan.mesh.describe()}; forward of batch "
            f"{geo.batch}, {geo.image_tokens} image + {geo.text_tokens} text tokens, {setup.strategy.workload.dtype}")


def render_check(report: CheckReport, console) -> None:
    setup = report.setup
    console.print(f"[bold]{setup.strategy.name}[/bold]: "
                  + _header(setup, f"{report.device_count} {report.device_type} devices"))
    console.print(_parameters_line(report))
    if report.mismatches:
        console.print(_mismatch_table(report))
    console.print(_plan_vs_xla(report))
    console.print(_collective_table(report))
    console.print(_output_line(report))
    if report.xla_dot_flops:
        console.print(_flops_line(report))
    console.print(_timings_line(report))
    console.print(_collectives_line(report))
    if (tool := setup.strategy.activations.sequence_parallel) != "partitioner" and any(
            setup.plan.mesh.size(a) > 1 for a in setup.strategy.activations.sequence_axes):
        ring = (" XLA's partitioner has no ring: it gathers k and v over the ring axes and runs one attention."
                if any(setup.plan.mesh.size(a) > 1 for a in ring_axes(setup.strategy.activations)) else "")
        console.print(f"Sequence split: the strategy is priced as {tool} runs it (meshlab explain); what was held here "
                      f"is XLA's partitioner's program, which also re-splits the streams to join them.{ring}")
    console.print("[green]the plan and XLA agree[/green]" if report.agrees else "[red]the plan and XLA disagree[/red]")


def _parameters_line(report: CheckReport) -> str:
    total, bad = len(report.parameters), len(report.mismatches)
    colour = "green" if not bad else "red"
    return (f"Parameters: [{colour}]{total - bad} of {total}[/{colour}] agree with the plan (sharding read back "
            "from torch_xla; padded shard shape and each device's slice of real data)")


def _mismatch_table(report: CheckReport) -> Table:
    table = Table(title="Mismatches", title_justify="left")
    for column in ("parameter", "planned spec", "XLA sharding", "planned shard", "XLA shard", "misplaced on"):
        table.add_column(column)
    for p in report.mismatches[:40]:
        table.add_row(p.name, f"{p.predicted_spec}\n{p.predicted_sharding}", p.xla_sharding or p.problem, str(list(p.predicted_shard_shape)),
                      str(list(p.xla_shard_shape)), ", ".join(map(str, p.misplaced)) or "-")
    return table


def _plan_vs_xla(report: CheckReport) -> Table:
    setup, caveats = report.setup, report.caveats()
    table = Table(title="Plan vs XLA, per device", title_justify="left")
    for column in ("", "meshlab", "XLA", "held to the plan?", "note"):
        table.add_column(column, justify="right" if column in ("meshlab", "XLA") else "left")
    predicted, xla = report.weights()
    full_predicted, full_xla = report.full_depth_weights()
    weights_held = "[green]agrees[/green]" if not report.mismatches else "[red]differs[/red]"
    table.add_row("weights, checked depth", mib(predicted), mib(xla), weights_held,
                  "XLA: shards read back from torch_xla")
    table.add_row("weights, full depth", mib(full_predicted), mib(full_xla), "not held",
                  "XLA: checked blocks extrapolated")
    differing = {d.split(":")[0] for d in report.collective_differences()}
    for block, counter in report.per_block().items():
        if block != OUTSIDE:
            predicted_kinds = report.predicted_per_block.get(block)
            last = is_last_block(block, setup)
            if last:
                held = "[dim]expected to differ[/dim]"
                note = "a list's last block: XLA drops what nothing reads after it (not held)"
            elif block.split(".")[0] in report.scanned:
                held, note = "not held", "a scanned list's loop body"
            else:
                held = "[red]differs[/red]" if block in differing else "[green]agrees[/green]"
                note = "all-reduce, all-gather, all-to-all within 10%; permutes a listed difference"
            reduce_note = caveats.get("reduce_scatter", "")
            table.add_row(f"collectives in {block}" + (" (last)" if last else ""),
                          kinds(predicted_kinds) if predicted_kinds is not None else "-", kinds(counter), held,
                          "; ".join(n for n in (note, reduce_note) if n))
    table.add_row("collectives outside blocks", "-", kinds(report.per_block()[OUTSIDE]), "not held", "")
    table.add_row("collectives, full depth", kinds(report.predicted_full_depth) if report.predicted_full_depth else "-",
                  kinds(report.full_depth_collectives()), "not held", _extrapolation_note(report))
    _memory_rows(table, report, caveats)
    return table


def _extrapolation_note(report: CheckReport) -> str:
    single = [name for name, n in report.setup.checked_blocks.items() if n == 1]
    if not single:
        return "first checked block for each middle block, plus the last"
    return ("the only checked block of " + ", ".join(single) + " is a last block, which can differ from a middle "
            "one (Qwen-Image drops its unused text tail); --layers 2 adds a middle block")


def _memory_rows(table: Table, report: CheckReport, caveats: dict) -> None:
    memory, chip = report.xla_memory, report.setup.memory.most_loaded
    if memory is None:
        table.add_row("memory", "-", "no buffer assignment in the dump", "", "")
        return
    expected = "[dim]expected to differ[/dim]" if caveats.get("temporaries") else "not held"
    table.add_row("program arguments", "-", mib(memory.parameters), "not held",
                  "XLA: the weights the forward reads, its inputs, cached RoPE tables")
    table.add_row("activations / temporaries", mib(chip.activations), mib(memory.temporaries), expected,
                  caveats.get("temporaries", "") or "`check --backend tpu` holds them to XLA:TPU's")
    table.add_row("outputs", "-", mib(memory.outputs), "not held", "")
    table.add_row("total", mib(chip.resident + chip.denoise), mib(memory.total), expected,
                  "meshlab: weights, buffers and the denoise working set")


def _collective_table(report: CheckReport) -> Table:
    caveats = report.caveats()
    title = "Collectives of the checked forward (one device)"
    if "collective_bytes" in caveats:
        title += f"; {caveats['collective_bytes']}"
    table = Table(title=title, title_justify="left")
    for column in ("where", "kind", "mesh axes", "count", "bytes each", "caused by"):
        table.add_column(column, justify="right" if column in ("count", "bytes each") else "left")
    groups: dict[tuple, list] = defaultdict(list)
    for c in report.collectives:
        where = f"{c.group[0]}.{c.group[1]}" if c.group else OUTSIDE
        groups[(where, c.hlo.kind, c.mesh_axes)].append(c)
    for (where, kind, axes), members in sorted(groups.items(), key=lambda kv: (kv[0][0], KIND_ORDER.index(kv[0][1]))):
        sizes = sorted({c.hlo.bytes_per_device for c in members})
        size = mib(sizes[0]) if len(sizes) == 1 else f"{mib(sizes[0])} .. {mib(sizes[-1])}"
        table.add_row(where, kind, "+".join(axes) or "-", str(len(members)), size, _layers(members, where))
    return table


def _layers(members: list, where: str) -> str:
    prefix = where + "." if where != OUTSIDE else ""
    named = Counter("(the block's own ops)" if c.hlo.layer == where else (c.hlo.layer or "?").removeprefix(prefix)
                    for c in members)
    shown = ", ".join(f"{layer} x{n}" if n > 1 else layer for layer, n in named.most_common(3))
    return shown + (f", +{len(named) - 3} more" if len(named) > 3 else "")


def _flops_line(report: CheckReport) -> str:
    ratio = report.predicted_flops / report.xla_dot_flops
    return (f"FLOPs of one forward on one device: meshlab {report.predicted_flops:,.0f}, the dots of XLA's partitioned "
            f"program {report.xla_dot_flops:,.0f} (predicted/XLA {ratio:.4f})")


def _output_line(report: CheckReport) -> str:
    verdict = "[green]within[/green]" if report.output_agrees else "[red]beyond[/red]"
    return (f"Output: max |sharded - unsharded CPU float32| = {report.max_abs_error:.4g} (largest |value| "
            f"{report.reference_max_abs:.3g}), {verdict} the {report.setup.strategy.workload.dtype} tolerance "
            f"{report.tolerance:.3g}")


def _collectives_line(report: CheckReport) -> str:
    if not report.middle_blocks_checked:
        if report.scanned:
            return (f"Collectives: {', '.join(report.scanned)} ran as one scanned loop body, whose collectives are "
                    "not attributed to blocks; check without --scan to hold a middle block to the prediction")
        return ("Collectives: no middle block checked (each list's only block is its last); --layers 2 holds a "
                "middle block to the prediction")
    differences = report.collective_differences()
    if not differences:
        return ("Collectives: [green]middle blocks agree[/green] with the prediction (all-reduce, all-gather, "
                "all-to-all within 10%; collective-permutes are a listed difference, see `meshlab explain`)")
    return "Collectives: [red]" + "; ".join(differences) + "[/red]"


def _timings_line(report: CheckReport) -> str:
    t = report.timings
    parts = [f"build {t.get('build', 0):.1f} s", f"reference {t.get('reference', 0):.1f} s",
             f"apply {t.get('apply', 0):.1f} s"]
    what = {1: "first forward (it also computes the RoPE tables diffusers caches)",
            2: "second forward (the program every later step runs)"}
    for i, forward in enumerate(report.forwards, 1):
        compile_s = forward.get("compile_seconds")
        compiled = f", {compile_s:.1f} s of it compiling" if compile_s else ""
        graphs = f"{forward['compiles']} new graph{'s' * (forward['compiles'] != 1)} compiled, once each"
        parts.append(f"{what.get(i, f'forward {i}')} {forward['seconds']:.1f} s ({graphs}{compiled})")
    note = "; virtual CPU devices share the host's cores, so these say only that it runs" if report.on_cpu else ""
    full = report.full_depth_compile_seconds()
    if full is not None:
        how = "scanned" if report.scanned else "unrolled"
        parts.append(f"compile at full depth up to ~{full:.0f} s ({how}; this host's CPU compile scaled by "
                     "blocks, an upper bound; a TPU compiles differently)")
    return f"[dim]Time: {', '.join(parts)}{note}[/dim]"


def render_dtensor_check(report, console) -> None:
    """`meshlab check --backend dtensor` (a meshlab.check.against_dtensor.DTensorCheckReport)."""
    setup = report.setup
    console.print(f"[bold]{setup.strategy.name}[/bold] with DTensor: " + _header(setup, f"{report.world} gloo processes"))
    agreeing = len(report.parameters) - len(report.mismatches)
    console.print(f"Parameters: {agreeing} of {len(report.parameters)} agree on every rank (placements, local shard "
                  "shape, and the slice of the whole weight each rank holds)")
    if report.mismatches:
        table = Table("parameter", "planned", "DTensor", "predicted shard", "held", "ranks off", title="Mismatches")
        for p in report.mismatches[:20]:
            r = p.disagreeing_ranks[0]
            table.add_row(p.name, p.predicted_placements, p.placements[r], str(p.predicted_shard_shapes[r]),
                          str(p.shard_shapes[r]), ", ".join(map(str, p.disagreeing_ranks)))
        console.print(table)
    predicted, held = report.predicted_weight_bytes, report.local_weight_bytes
    console.print(f"Weights per rank: predicted {mib(max(predicted))} on the busiest, {mib(min(predicted))} on the "
                  f"lightest; DTensor holds {mib(max(held))} and {mib(min(held))}")
    table = Table("block", "predicted (XLA partitioner)", "issued by DTensor", title="Collectives of one forward")
    for block, counter in report.predicted_per_block().items():
        table.add_row(block, kinds(counter), kinds(Counter(report.collectives_per_block.get(block, {}))))
    table.add_row("whole forward", "", kinds(Counter(report.collectives)))
    console.print(table)
    verdict = "[green]within[/green]" if report.output_agrees else "[red]beyond[/red]"
    console.print(f"Output: max |sharded - unsharded CPU float32| = {report.max_abs_error:.4g} (largest |value| "
                  f"{report.reference_max_abs:.3g}), {verdict} the {setup.strategy.workload.dtype} tolerance "
                  f"{report.tolerance:.3g}")
    t = report.timings
    console.print(f"[dim]Time: reference {t.get('reference', 0):.1f} s, build and apply "
                  f"{t.get('build_and_apply', 0):.1f} s, forward {t.get('forward', 0):.1f} s (rank 0; "
                  f"{report.world} processes share this host's cores)[/dim]")
    console.print("[green]the plan and DTensor agree[/green]" if report.agrees
                  else "[red]the plan and DTensor disagree[/red]")


def _render_as_planned(report, console) -> None:
    """Where the plan's own attention (a flash kernel) and the primary program's (torch_xla's, which materialises
    the scores) give different verdicts: the plan's, and XLA:TPU's for the program with its attention where the
    other front end compiled one (--front-end both), else how to compile it."""
    if report.fits_as_planned == report.fits_predicted and report.fits_xla_as_planned in (None,
                                                                                         report.fits_as_planned):
        return
    planned = report.setup.memory.most_loaded
    said = (f"[yellow]as planned[/yellow], with its flash attention, meshlab says it "
            f"{'fits' if report.fits_as_planned else 'does not fit'} "
            f"({mib(planned.resident + planned.denoise)} a chip)")
    other = report.as_planned_program
    failed = any(not c.ok and c.front_end == "torchax" for c in report.compiled)
    if other is None:
        console.print(f"{said}; the program compiled here has {report.primary.front_end}'s stock attention, which "
                      "materialises the scores" + ("; torchax's, with the plan's, could not be compiled (above)"
                                                   if failed else ": compile the plan's own with --front-end torchax"))
    elif other.out_of_memory:
        asked = f", asking {mib(other.required_bytes)}" if other.required_bytes else ""
        console.print(f"{said}; {other.front_end}'s program, which has it, XLA:TPU refused{asked}")
    else:
        console.print(f"{said}; {other.front_end}'s program, which has it, XLA:TPU says it "
                      f"{'fits' if report.fits_xla_as_planned else 'does not fit'} ({mib(other.total_bytes)})")


def render_tpu_check(report, console) -> None:
    """`meshlab check --backend tpu`: XLA:TPU's compile of the plan beside meshlab's prediction."""
    from meshlab.check.against_tpu import _bytes, _predicted_flops, predicted_hbm_bytes

    setup, c = report.setup, report.primary
    topology = report.topology
    where = f"TPU {topology['name']}" + (f" x{topology['slices']} slices" if topology["slices"] > 1 else "")
    console.print(f"[bold]{setup.strategy.name}[/bold]: " + _header(setup, f"{where} ({topology['chips']} chips), "
                                                                         "compiled ahead of time by XLA:TPU"))
    for other in report.compiled:
        if not other.ok:
            console.print(f"[yellow]{other.front_end}:[/yellow] {other.error}")
    kernels = f"; its attention a flash kernel ({c.kernels} Pallas calls)" if c.kernels else ""
    console.print(f"front end: {c.front_end}; XLA:TPU compiled it in {c.compile_seconds:.1f} s "
                  f"(traced in {c.trace_seconds:.1f} s){kernels}")
    memory = report.memory_as_compiled.most_loaded  # the program compiled: its attention, not a flash kernel's
    table = Table(title="Per chip: meshlab's plan against XLA:TPU's compile", title_justify="left")
    for column in ("", "meshlab (predicted)", "XLA:TPU"):
        table.add_column(column, justify="left" if not column else "right")
    if c.out_of_memory:
        table.add_row("fits", _yes(report.fits_predicted), "[red]no[/red]")
        table.add_row("needs", mib(memory.resident + memory.denoise),
                      mib(c.required_bytes) if c.required_bytes else "?")
        console.print(table)
        console.print(f"XLA:TPU refused: {c.out_of_memory}")
        _render_as_planned(report, console)
    else:
        table.add_row("weights (as arguments)", mib(report.predicted_argument_weights), mib(c.weights))
        read = c.working_set_live_peak is not None or c.temporaries_live_peak is not None
        where = f"HBM and {c.on_chip_label}" if c.working_set_live_peak is not None else "in HBM (on chip not read)"
        table.add_row(f"denoise working set / temporaries live at once, {where}" + (
            " (attention scores materialised)" if c.front_end == "torch-xla" else " (flash attention)"),
            mib(report.predicted_temporaries(c.front_end)), mib(c.live_temporaries) if read else "?")
        named = _largest_held(c)
        for held in named:
            table.add_row(f"  of them at that peak: {held.label}", "", mib(held.bytes))
        if named:
            table.add_row("  of them at that peak, the rest (the JSON's at_peak has more)", "",
                          mib(c.working_set_live_peak - sum(h.bytes for h in named)))
        if c.working_set_live_peak is not None and c.temporaries_live_peak is not None:
            table.add_row("  in HBM alone at once (its own peak)", "", mib(c.temporaries_live_peak))
        table.add_row("temp buffer (those values packed at offsets)", "", mib(c.memory["temp"]))
        for space in c.on_chip_spaces:
            table.add_row(f"{space.upper()}, beside HBM (the weights prefetched there, and temporaries)", "",
                          mib(c.memory_spaces[space]))
        if c.front_end == "torchax":  # its program holds the buffers as constants, not arguments
            table.add_row("inputs and other arguments (torchax folds the buffers into the program)", "",
                          mib(sum(c.other_arguments.values())))
        else:
            table.add_row("inputs, buffers and other arguments (meshlab: the transformer's buffers alone)",
                          mib(memory.buffers), mib(sum(c.other_arguments.values())))
        table.add_row("outputs, generated code", "", f"{mib(c.memory['output'])}, {mib(c.memory['generated_code'])}")
        table.add_row("total", mib(memory.resident + memory.denoise), mib(c.total_bytes))
        table.add_row("fits", _yes(report.fits_predicted), _yes(report.fits_xla))
        flops = _predicted_flops(setup, c.front_end)
        table.add_row("FLOPs of one forward", f"{flops / 1e12:.3f} TFLOP",
                      f"{c.flops / 1e12:.3f} TFLOP" if c.flops is not None else "?")
        hbm = predicted_hbm_bytes(report.predicted_call)
        table.add_row("bytes of one forward (meshlab: HBM; XLA:TPU: bytes accessed, each op's and fusion's)",
                      f"{hbm / 1e9:.2f} GB" if hbm else "?",
                      f"{c.bytes_accessed / 1e9:.2f} GB" if c.bytes_accessed is not None else "?")
        console.print(table)
        _render_as_planned(report, console)
        _render_front_ends(report, console)
        held = report.middle_blocks()
        blocks = held
        if report.whole_call_held:
            console.print("[yellow]XLA:TPU's multi-slice program keeps no op names[/yellow]: its collectives are "
                          "not placed in blocks, so the whole call's are held to the prediction: "
                          + kinds(Counter(x.hlo.kind for x in c.collectives)) + " against "
                          + kinds(report.predicted_totals["count"]))
        elif not blocks:
            shown = "block its loop body stands for" if setup.scan else "first block"
            console.print(f"[yellow]no middle block held to the prediction[/yellow]: {_why_no_middle_block(report)}; "
                          f"shown: each list's {shown}")
            blocks = [f"{name}.{n // 2 if setup.scan else 0}" for name, n in setup.checked_blocks.items()]
        counts, sizes, asynchronous = c.per_block(setup), c.per_block(setup, _bytes), c.asynchronous(setup)
        collectives = Table(title="Collectives of a middle block, by kind, as the TPU program issues them: count "
                                  "(bytes per chip)" + ("; scanned: the loop body's, one iteration" if setup.scan
                                                        and held else ""), title_justify="left")
        for column in ("block", "kind", "meshlab (predicted)", "XLA:TPU", "of them async"):
            collectives.add_column(column, justify="left" if column in ("block", "kind") else "right")
        for block in blocks:
            found = set(counts.get(block, Counter())) | set(report.predicted_per_block.get(block, Counter()))
            for kind in [k for k in KIND_ORDER if k in found]:
                p = report.predicted_per_block.get(block, Counter()).get(kind, 0)
                pb = report.predicted_bytes_per_block.get(block, Counter()).get(kind, 0)
                x, xb = counts.get(block, Counter()).get(kind, 0), sizes.get(block, Counter()).get(kind, 0)
                collectives.add_row(block, kind, f"{p} ({mib(pb)})", f"{x} ({mib(xb)})",
                                    str(asynchronous.get(block, Counter()).get(kind, 0)))
        console.print(collectives)
        outside = counts.get(OUTSIDE, Counter())
        if outside:
            console.print(f"outside the blocks (or not attributed to one): {kinds(outside)}")
        if c.schedule is not None:
            console.print(_schedule_table(c.schedule, report.predicted_call))
    for line in report.differences():
        console.print(f"  [red]differs:[/red] {line}")
    console.print("[green]the plan and XLA:TPU agree[/green]" if report.agrees
                  else "[red]the plan and XLA:TPU disagree[/red] (XLA:TPU is the truth for TPU hardware)")


def _why_no_middle_block(report) -> str:
    """Why a TPU check held no middle block's collectives to the prediction."""
    setup = report.setup
    if setup.scan and len(setup.checked_blocks) > 1:
        return "the scanned lists' loop bodies are not told apart (their ops keep no module names)"
    if setup.scan and not report.attributed:
        return "no collective of the program was placed in the scanned loop body"
    return "compile at least 3 blocks of a list (--layers 3, or the whole model)"


def _render_front_ends(report, console) -> None:
    """With --front-end both, where both compiled: each front end's program side by side, and what differs."""
    from meshlab.check.against_tpu import _bytes

    compiled = [c for c in report.compiled if c.ok and not c.out_of_memory]
    if len(compiled) < 2:
        return
    setup = report.setup
    table = Table(title="The front ends' programs, as XLA:TPU compiled each (a middle block's collectives: count "
                        "(bytes per chip))", title_justify="left")
    table.add_column("")
    for c in compiled:
        table.add_column(c.front_end, justify="right")
    table.add_column("differ")
    rows = [("compile seconds", [f"{c.compile_seconds:.1f}" for c in compiled], False),
            ("weights", [mib(c.weights) for c in compiled], len({c.weights for c in compiled}) > 1),
            ("temporaries live at once", [mib(c.temporaries_live_peak) if c.temporaries_live_peak is not None
                                          else "?" for c in compiled],
             len({c.temporaries_live_peak for c in compiled}) > 1),
            ("FLOPs (TFLOP)", [f"{c.flops / 1e12:.3f}" if c.flops is not None else "?" for c in compiled],
             len({c.flops for c in compiled}) > 1)]
    blocks = report.middle_blocks() if all(c.program_read for c in compiled) else []
    for block in blocks:
        counts = [c.per_block(setup).get(block, Counter()) for c in compiled]
        sizes = [c.per_block(setup, _bytes).get(block, Counter()) for c in compiled]
        for kind in [k for k in KIND_ORDER if any(k in n for n in counts)]:
            cells = [f"{n.get(kind, 0)} ({mib(b.get(kind, 0))})" for n, b in zip(counts, sizes)]
            rows.append((f"{block} {kind}", cells, len(set(cells)) > 1))
    for label, cells, differ in rows:
        table.add_row(label, *cells, "[yellow]yes[/yellow]" if differ else "")
    console.print(table)


def _yes(value) -> str:
    return "?" if value is None else ("yes" if value else "[red]no[/red]")


def _schedule_table(schedule, predicted: dict) -> Table:
    table = Table(title="One call of the compiled program: XLA:TPU's scheduler estimate (its cost model, not a "
                        "measurement) against meshlab's prediction", title_justify="left")
    return schedule_table(table, predicted, schedule.to_json(), lambda s: f"{s * 1e3:.2f} ms")
