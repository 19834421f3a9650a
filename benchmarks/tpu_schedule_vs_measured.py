"""XLA:TPU's own time estimates of a program, and meshlab's, against a measured TPU run (issue 25, part 4).

    python benchmarks/tpu_schedule_vs_measured.py                  # maxdiffusion's Flux.1-dev on v6e-4
    python benchmarks/tpu_schedule_vs_measured.py --all --out benchmarks/results/tpu_schedule_vs_measured.json

`meshlab check --backend tpu` shows XLA:TPU's latency-hiding scheduler's estimate of one transformer call beside
meshlab's, term by term. Neither is a measurement. This script holds both against the TPU cases of
benchmarks/published_latencies.py (maxdiffusion's Flux benchmarks: JAX, so compiled here through torchax, at full
depth and the case's own size, ahead of time for the case's TPU system). Per case it prints one call:
- measured: the source's seconds over its transformer calls, an upper bound on one call (the figure also covers the
  text encode and the VAE decode);
- meshlab: its prediction of the compiled program (ops and exposed collectives; its attention priced as a flash
  kernel, which torchax's program runs: jax's Pallas TPU flash attention, as maxdiffusion runs its splash kernel),
  and of a call as the case ran it (the same and the step's host overhead: 1 ms on these TPUs);
- XLA:TPU's schedule: the latency-hiding scheduler's total for the program, and its ops by class (its attention is
  the Pallas kernel's own cost estimate, its FLOPs at the MXU's peak, and the ops around it);
- XLA:TPU's per-op estimates: the entry computation's ``estimated_cycles`` summed over its instructions (the
  backend's cost model for each fusion's tiling, in the dump after codegen), a second figure from the same compiler;
- the temporaries per chip: meshlab's activations against XLA:TPU's values live at once and its temp buffer, and
  the attention calls by how they ran (the flash kernel, or torch's reference math).
Each over the measured bound. A figure above 1 is slower than the run was, whatever the encode and decode took.
Nothing here asserts a time; the figures are for the issue note.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))

from published_latencies import CASES, Case, prediction, strategy_document  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
#: the default: one case whose transformer program stands for the table's Flux.1-dev row on the newest TPU
DEFAULT = "Flux.1-dev, v6e-4, data parallel, batch 4, 28 steps, 1024x1024"


def entry_estimated_s(dump: Path, cycles_per_microsecond: float | None) -> float | None:
    """The entry computation's instructions' ``estimated_cycles`` summed, in seconds, at the schedule's clock (None
    where the dump or the schedule has none)."""
    found = sorted(dump.glob("xla-dump/*jit_run*after_codegen.txt"))
    if not found or not cycles_per_microsecond:
        return None
    text = found[0].read_text()
    entry = text[text.index("\nENTRY"):]
    entry = entry[:entry.index("\n}\n")]
    cycles = sum(int(c) for c in re.findall(r'"estimated_cycles":"(\d+)"', entry))
    return cycles / (cycles_per_microsecond * 1e6)


def run(case: Case) -> dict:
    with tempfile.TemporaryDirectory(prefix="meshlab-vs-measured-") as folder:
        path = Path(folder) / "case.yaml"
        path.write_text(yaml.safe_dump(strategy_document(case), sort_keys=False))
        done = subprocess.run([sys.executable, "-m", "meshlab", "check", str(path), "--backend", "tpu",
                               "--front-end", "torchax", "--dump-dir", str(Path(folder) / "dump"), "--json"],
                              capture_output=True, text=True, cwd=REPO)
        if not done.stdout.startswith("{"):
            return {"case": case.name, "error": done.stderr.strip().splitlines()[-1:]}
        doc = json.loads(done.stdout)
        rate = (doc.get("xla_schedule") or {}).get("cycles_per_microsecond")
        per_op = entry_estimated_s(Path(folder) / "dump", rate)
    p, _ = prediction(case)
    calls = p.layout.steps * p.layout.calls
    schedule, ours = doc.get("xla_schedule") or {}, doc["predicted_call"]
    ours_memory, xla_memory = doc["meshlab_memory_per_device"], doc.get("xla_memory_per_device") or {}
    return {"case": case.name, "source": case.source, "measured_s": case.measured_s, "transformer_calls": calls,
            "measured_call_bound_s": case.measured_s / calls,
            "meshlab_compiled_call_s": ours["total_s"], "meshlab_compiled_call_by_op_s": ours["compute_s_by_op"],
            "meshlab_as_run_call_s": p.step.total / p.layout.calls,
            "xla_schedule_call_s": schedule.get("total_s"), "xla_schedule_by_op_s": schedule.get("compute_s_by_op"),
            "xla_per_op_estimates_s": per_op, "compile_seconds": doc.get("compile_seconds"),
            "flops_per_device": doc.get("flops_per_device"),
            "attention_calls": (doc.get("front_ends") or [{}])[0].get("attention_calls"),
            "temporaries": {"meshlab_activations_as_compiled": ours_memory["activations_as_compiled"],
                            "xla_live_peak": xla_memory.get("temporaries_live_peak"),
                            "xla_temp_buffer": xla_memory.get("temporaries")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all", action="store_true", help="every TPU case of published_latencies.py")
    parser.add_argument("--out", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args()
    cases = [c for c in CASES if c.hardware.startswith("v") and (args.all or c.name == DEFAULT)]
    rows = []
    for case in cases:
        row = run(case)
        rows.append(row)
        if "error" in row:
            print(f"{case.name}: {row['error']}")
            continue
        bound = row["measured_call_bound_s"]
        line = lambda what, s: f"  {what}: {s * 1e3:.1f} ms, {s / bound:.2f} of the measured bound" if s else \
            f"  {what}: none"
        print(f"{case.name} ({row['transformer_calls']} transformer calls; {case.source})")
        print(f"  measured: {case.measured_s} s, at most {bound * 1e3:.1f} ms a call")
        print(line("meshlab, the compiled program", row["meshlab_compiled_call_s"]))
        print(line("meshlab, a call as the case ran it (and its step's host overhead)", row["meshlab_as_run_call_s"]))
        print(line("XLA:TPU's schedule", row["xla_schedule_call_s"]))
        print(line("XLA:TPU's per-op estimates, summed", row["xla_per_op_estimates_s"]))
        temps, mib = row["temporaries"], lambda b: f"{b / 2**20:.0f} MiB" if b else "none"
        print(f"  temporaries per chip: meshlab {mib(temps['meshlab_activations_as_compiled'])}, XLA:TPU "
              f"{mib(temps['xla_live_peak'])} live at once ({mib(temps['xla_temp_buffer'])} in its temp buffer); "
              f"attention calls {row['attention_calls']}")
        for term, xla in (row["xla_schedule_by_op_s"] or {}).items():
            if xla < 5e-5:
                continue
            mine = row["meshlab_compiled_call_by_op_s"].get(term)
            print(f"    {term}: schedule {xla * 1e3:.1f} ms" + (f", meshlab {mine * 1e3:.1f} ms" if mine else ""))
    if args.out:
        args.out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
