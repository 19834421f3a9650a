"""meshlab's denoise working set against what XLA:TPU's program holds at once, size by size: where the memory model's
activations are held to the TPU compiler's (issue 25, part 3: the activations within 25% of XLA:TPU's temporaries).

    python benchmarks/tpu_working_set.py --out benchmarks/results/tpu_working_set.json
    python benchmarks/tpu_working_set.py --strategy strategies/pairs.yaml --sizes 256,1024
    python benchmarks/tpu_working_set.py --sizes 960x496,960x500
    python benchmarks/tpu_working_set.py --repredict benchmarks/results/tpu_working_set.json

`--repredict RECORD` compiles nothing: it recomputes meshlab's side of every point of a record with the code as it
is and, where the prediction moved, its ratio and whether it agrees; XLA:TPU's side is kept (its compiles are
deterministic for one libtpu). The record and its .txt beside it are rewritten (the point's line marked
"(recomputed)", a line under the command that compiled it saying so), and the points that moved are printed.

Each point (SIDE, or SIDExTEXT for its text tokens) of each strategy is one `meshlab check S.yaml --backend tpu
--front-end torch-xla --layers 3 --height H --width H [--text-tokens T] --json --dump-dir D` (torch_xla's program,
3 blocks, the workload's text tokens unless the point says, compiled ahead of time for the strategy's TPU topology).
Printed per size: meshlab's working set (`activations_as_compiled`), the temporaries XLA:TPU's program holds at once
in HBM and on chip (VMEM; v4: CMEM) together less the weights it prefetches there (`working_set_live_peak`, what the
check holds the prediction to), those in HBM alone, and the float32 buffers of attention scores (f32[heads, tokens,
tokens]) its buffer assignment holds: how many a block, in which memory space, and whether two of them are live at once
(torch's math attention's scores and probabilities: meshlab prices two, one where a row has at most the chip's
fused_softmax_keys keys or more than its recomputed_softmax_keys, and a masked attention's mask broadcast besides
past its mask_broadcast_keys), and the largest kinds of value XLA:TPU holds at its working set's peak (the check's
``at_peak``). Nothing here asserts; the figures are for the note and docs/checks.md.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

from meshlab.check.hlo import PeakHolding

REPO = Path(__file__).resolve().parents[1]
MIB = 2**20
_VALUE = re.compile(r"value: <\d+ (\S+) @(\d+)> \(size=(\d+),offset=\d+\): f32\[(\d+),(\d+),(\d+)\]")
_LIVE_RANGE = re.compile(r"^\s+(\S+):(\d+)-(\d+)$", re.M)


def score_buffers(dump: Path, tokens: int) -> dict:
    """The float32 [heads, queries, tokens] values of the program's buffer assignment (the largest module XLA
    dumped; more than one head, so not a stream's float32 [1, tokens, width] where a chip's width equals the keys;
    queries: the tokens, or a chip's share of them under a sequence split; tokens: a joint attention's, or the
    image's for a self-attention of the image alone, as Wan's): how many, their memory spaces (0 is HBM, 1 VMEM, 3
    v4's CMEM), their MiB, and how many pairs are live at once."""
    assignments = list(dump.glob("*.after_optimizations-buffer-assignment.txt"))
    if not assignments:
        return {}
    assignment = max(assignments, key=lambda p: p.stat().st_size)
    live_range = assignment.with_name(assignment.name.replace("-buffer-assignment", "-live-range")).read_text()
    ranges = {name: (int(a), int(b)) for name, a, b in _LIVE_RANGE.findall(live_range)}
    found = [(name, int(color), int(size)) for name, color, size, heads, rows, cols in
             _VALUE.findall(assignment.read_text()) if int(cols) == tokens and tokens % int(rows) == 0
             and int(rows) > 1 and int(heads) > 1]
    spans = [ranges.get(name if "{" in name else name + "{}") for name, _, _ in found]
    together = sum(1 for i, a in enumerate(spans) for b in spans[i + 1:]
                   if a and b and a[0] <= b[1] and b[0] <= a[1])
    return {"count": len(found), "memory_spaces": sorted({c for _, c, _ in found}),
            "mib_each": round(found[0][2] / MIB, 1) if found else 0.0, "pairs_live_at_once": together}


def point(strategy: Path, side: int, text_tokens: int | None) -> dict:
    """One compile of `strategy` at `side` x `side` (and `text_tokens`), and what its program holds at once."""
    with tempfile.TemporaryDirectory(prefix="meshlab-working-set-") as folder:
        dump = Path(folder)
        command = ["meshlab", "check", str(strategy.relative_to(REPO)), "--backend", "tpu", "--front-end", "torch-xla",
                   "--layers", "3", "--height", str(side), "--width", str(side),
                   *(["--text-tokens", str(text_tokens)] if text_tokens else []), "--json", "--dump-dir", str(dump)]
        done = subprocess.run([sys.executable, "-m", *command[:1], *command[1:]], capture_output=True, text=True,
                              cwd=REPO)
        if not done.stdout.startswith("{"):
            return {"strategy": str(strategy.relative_to(REPO)), "side": side,
                    "error": done.stderr.strip().splitlines()[-1:]}
        doc = json.loads(done.stdout)
        tokens = doc["forward"]["image_tokens"] + doc["forward"]["text_tokens"]
        scores = score_buffers(dump / "xla-dump", tokens)
        if not scores.get("count"):  # a self-attention of the image alone (Wan's)
            scores = score_buffers(dump / "xla-dump", doc["forward"]["image_tokens"])
    xla = doc["xla_memory_per_device"] or {}
    predicted, held = doc["meshlab_memory_per_device"]["activations_as_compiled"], xla.get("working_set_live_peak")
    return {"strategy": str(strategy.relative_to(REPO)), "system": doc["device"]["type"], "side": side,
            "tokens": tokens, "command": " ".join(command[:-2]), "predicted_mib": round(predicted / MIB, 1),
            "xla_working_set_mib": round(held / MIB, 1) if held is not None else None,
            "xla_hbm_temporaries_mib": round(xla["temporaries_live_peak"] / MIB, 1)
            if xla.get("temporaries_live_peak") is not None else None,
            "vmem_mib": round(xla["vmem"] / MIB, 1) if xla.get("vmem") else None,
            "cmem_mib": round(xla["cmem"] / MIB, 1) if xla.get("cmem") else None,
            "ratio": round(predicted / held, 2) if held else None,
            "agrees": not [d for d in doc["differences"] if d.startswith("temporaries")],
            "score_buffers": scores, "at_peak": xla.get("at_peak", [])[:4]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strategy", type=Path, action="append", help="a strategy (again for more; default: "
                        "strategies/2d.yaml)")
    parser.add_argument("--sizes", default="256,512,576,640,704,768,896,928,960,1024,1088",
                        help="image sides, comma-separated, each SIDE or SIDExTEXT (its text tokens)")
    parser.add_argument("--out", type=Path, help="write the points here (JSON)")
    parser.add_argument("--repredict", type=Path, nargs="+", help="recompute meshlab's side of these records")
    args = parser.parse_args()
    if args.repredict:
        for record in args.repredict:
            repredict(record)
        return
    points = []
    for strategy in args.strategy or [REPO / "strategies" / "2d.yaml"]:
        for size in args.sizes.split(","):
            side, _, text = size.partition("x")
            points.append(point(strategy.resolve(), int(side), int(text) if text else None))
            report(points[-1])
    if args.out:
        args.out.write_text(json.dumps({"libtpu": version("libtpu"), "points": points}, indent=1) + "\n")


def predicted_bytes(strategy: str, side: int, text_tokens: int | None) -> int:
    """meshlab's working set of the program a point compiled (`activations_as_compiled`), without compiling."""
    from meshlab.check.against_tpu import compiled_memory, tpu_options
    from meshlab.check.setup import CheckOptions, check_setup

    given = {"layers", "height", "width"} | ({"text_tokens"} if text_tokens else set())
    path = REPO / strategy
    setup = check_setup(path, tpu_options(path, CheckOptions(layers=3, height=side, width=side,
                                                             text_tokens=text_tokens), given))
    return compiled_memory(setup, "torch-xla").most_loaded.denoise


def repredict(record: Path) -> None:
    """meshlab's side of every point of `record` again, from the code; XLA:TPU's kept (see the module). A point whose
    prediction moved gets its ratio (from the MiB the record kept of XLA:TPU's side) and verdict again, in the JSON
    and in its line of the .txt beside it, which says it was recomputed."""
    from meshlab.check.against_tpu import TEMPS_TOLERANCE

    data = json.loads(record.read_text())
    text_file = record.with_suffix(".txt")
    lines = text_file.read_text().splitlines() if text_file.exists() else []
    moved = 0
    for p in data["points"]:
        if "error" in p:
            continue
        words = p["command"].split()
        text = int(words[words.index("--text-tokens") + 1]) if "--text-tokens" in words else None
        predicted = round(predicted_bytes(p["strategy"], p["side"], text) / MIB, 1)
        if predicted == p["predicted_mib"]:
            continue
        moved += 1
        held = p["xla_working_set_mib"] if p["xla_working_set_mib"] is not None else p["xla_hbm_temporaries_mib"]
        old = (f"meshlab {p['predicted_mib']} MiB", f"ratio {p['ratio']}, {'agrees' if p['agrees'] else 'differs'}")
        p["predicted_mib"] = predicted
        if held:
            p["ratio"] = round(predicted / held, 2)
            p["agrees"] = abs(held - predicted) <= TEMPS_TOLERANCE * held
        new = (f"meshlab {predicted} MiB", f"ratio {p['ratio']}, {'agrees' if p['agrees'] else 'differs'}")
        head = f"{p['strategy']} on {p['system']}, {p['side']}² ({p['tokens']} tokens a sample): {old[0]}"
        at = next((i for i, line in enumerate(lines) if line.startswith(head) and old[1] in line), None)
        if at is not None:
            lines[at] = lines[at].replace(old[0], new[0], 1).replace(old[1], new[1], 1)
            lines[at] += "" if lines[at].endswith(" (recomputed)") else " (recomputed)"
        print(f"{record.name}: {p['strategy']} {p['side']}² (text {text}): {old[0]}, {old[1]} -> {new[0]}, {new[1]}"
              + ("" if at is not None else " (no line in the .txt)"), flush=True)
    if not moved:
        return
    record.write_text(json.dumps(data, indent=1) + "\n")
    if not lines:
        return
    if not any(line.startswith("# meshlab's side of the points marked (recomputed)") for line in lines):
        where = record.relative_to(REPO) if record.is_relative_to(REPO) else record
        lines.insert(1, f"# meshlab's side of the points marked (recomputed) is the code's at a later commit, without "
                        f"compiling: python benchmarks/tpu_working_set.py --repredict {where}")
    text_file.write_text("\n".join(lines) + "\n")


def report(p: dict) -> None:
    if "error" in p:
        print(f"{p['strategy']} {p['side']}²: {p['error']}", flush=True)
        return
    s = p["score_buffers"]
    print(f"{p['strategy']} on {p['system']}, {p['side']}² ({p['tokens']} tokens a sample): meshlab "
          f"{p['predicted_mib']} MiB, XLA:TPU {p['xla_working_set_mib']} MiB in HBM and on chip "
          f"({p['xla_hbm_temporaries_mib']} in HBM), ratio "
          f"{p['ratio']}, {'agrees' if p['agrees'] else 'differs'}; float32 score buffers: {s.get('count')} "
          f"({s.get('mib_each')} MiB each, memory spaces {s.get('memory_spaces')}, "
          f"{s.get('pairs_live_at_once')} pairs live at once)", flush=True)
    for held in (PeakHolding(**h) for h in p.get("at_peak", [])[:3]):
        print(f"  held at XLA:TPU's peak: {held.label}: {held.bytes / MIB:.1f} MiB", flush=True)


if __name__ == "__main__":
    main()
