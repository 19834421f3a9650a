"""XLA:TPU's own compile of built-in plans at full depth, against meshlab's prediction (issue 25, targets).

    python benchmarks/tpu_aot.py                                   # 2d, pairs, fsdp, hybrid on v6e-8
    python benchmarks/tpu_aot.py --strategies data --front-end both --out benchmarks/results/tpu_aot.json
    python benchmarks/tpu_aot.py --strategies 2d --scan                   # every block list as one scanned loop

Each strategy is one `meshlab check S.yaml --backend tpu --json` (its own worker process: the whole model at the
workload's size, compiled ahead of time for the strategy's TPU topology on this host). Printed per strategy: the
compile seconds and host peak memory, per chip the weights and temporaries by meshlab and by XLA:TPU, the fit by
both, and a middle block's collectives by kind (count and bytes) by both. Figures for the issue note; nothing here
asserts a time.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from meshlab.check.hlo import PeakHolding

REPO = Path(__file__).resolve().parents[1]
KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def check(strategy: str, front_end: str, scan: bool = False) -> dict:
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "meshlab", "check", str(REPO / "strategies" / f"{strategy}.yaml"),
                           "--backend", "tpu", "--front-end", front_end, *(["--scan"] if scan else []), "--json"],
                          capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - start
    name = strategy + (" (scanned)" if scan else "")
    if not done.stdout.startswith("{"):
        return {"strategy": name, "error": done.stderr.strip().splitlines()[-1:], "wall_s": wall}
    doc = json.loads(done.stdout)
    rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    return {"strategy": name, "wall_s": wall, "host_peak_rss_bytes_so_far": rss, "document": doc}


def summary(result: dict) -> str:
    if "error" in result:
        return f"{result['strategy']}: failed: {result['error']}"
    d = result["document"]
    gib = 2**30
    lines = [f"{result['strategy']} on {d['device']['type']} ({d['front_end']}): compile {d['compile_seconds'] or 0:.0f} s,"
             f" whole check {result['wall_s']:.0f} s; agrees: {d['agrees']}"]
    w, m = d["weights_per_device"], d["xla_memory_per_device"]
    if m:
        lines.append(f"  weights per chip: meshlab {w['predicted_as_arguments'] / gib:.3f} GiB, XLA:TPU "
                     f"{w['xla'] / gib:.3f} GiB ({100 * (w['xla'] / w['predicted_as_arguments'] - 1):+.2f}%)")
        live, held = m.get("temporaries_live_peak"), m.get("working_set_live_peak")
        lines.append(f"  temporaries: meshlab {d['meshlab_memory_per_device']['activations_as_compiled'] / gib:.3f} "
                     f"GiB (the denoise working set, attention as the front end compiles it), XLA:TPU "
                     + (f"{held / gib:.3f} GiB live at once in HBM and on chip, " if held is not None else "")
                     + (f"{live / gib:.3f} GiB live at once in HBM, " if live is not None else "")
                     + f"{m['temporaries'] / gib:.3f} GiB temp buffer")
        for held in (PeakHolding(**h) for h in (m.get("at_peak") or [])[:5]):
            lines.append(f"    held at that peak: {held.label}: {held.bytes / gib:.3f} GiB")
    lines.append(f"  fits: meshlab {d['fits']['predicted']}, XLA:TPU {d['fits']['xla']} "
                 f"({(d['fits']['xla_required_bytes'] or 0) / gib:.2f} GiB of {d['fits']['usable_hbm_bytes'] / gib:.2f})")
    for block in d["middle_blocks"]:
        got, want = d["collectives_per_block"].get(block, {}), d["predicted_collectives_per_block"].get(block, {})
        got_b = d["collective_bytes_per_block"].get(block, {})
        want_b = d["predicted_collective_bytes_per_block"].get(block, {})
        asynchronous = d["async_collectives_per_block"].get(block, {})
        for kind in KINDS:
            if got.get(kind) or want.get(kind):
                lines.append(f"  {block} {kind}: meshlab {want.get(kind, 0)} ({want_b.get(kind, 0) / 2**20:.2f} MiB),"
                             f" XLA:TPU {got.get(kind, 0)} ({got_b.get(kind, 0) / 2**20:.2f} MiB, "
                             f"{asynchronous.get(kind, 0)} async)")
    for front in d["front_ends"][1:]:
        lines.append(f"  also {front['front_end']}: " + (front.get("error") or
                     f"compile {front['compile_seconds']:.0f} s, temporaries {front['memory']['temporaries'] / gib:.3f} "
                     f"GiB, block {front['block_collectives']}"))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strategies", default="2d,pairs,fsdp,hybrid")
    parser.add_argument("--front-end", default="auto")
    parser.add_argument("--out", type=Path, help="also write every document as JSON here")
    parser.add_argument("--scan", action="store_true", help="compile each block list as one scanned loop (--scan)")
    args = parser.parse_args()
    results = []
    for name in args.strategies.split(","):
        results.append(check(name.strip(), args.front_end, args.scan))
        print(summary(results[-1]), flush=True)
    if args.out:
        args.out.write_text(json.dumps({"command": " ".join(sys.argv), "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
