"""How XLA:TPU's compile time grows with depth, plan by plan: the points the catalog's compile-time model is held to
(issue 25, part 5: time to first image where no compile of the plan itself was measured).

    python benchmarks/tpu_compile_depth.py --out benchmarks/results/tpu_compile_depth.json
    python benchmarks/tpu_compile_depth.py --strategies 2d,fsdp --layers 2,8
    python benchmarks/tpu_compile_depth.py --scan --layers 8,60 --out benchmarks/results/tpu_compile_depth_scan.json

Each point is one `meshlab check S.yaml --backend tpu --layers N --json` (its own worker process, the workload's
own size, compiled ahead of time for the strategy's TPU topology on this host, one at a time: a compile's seconds
are this host's and move with its load). Printed per point: the compile seconds, and the size of the
program XLA:TPU compiled (instructions in its optimized HLO, async collective pairs, fusions), read from the program
the check kept. Per strategy: the seconds per block between the shallowest and deepest points. Nothing here asserts
a time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
_INSTRUCTION = re.compile(r"^\s*(ROOT\s+)?%?[\w.\-]+ = ", re.M)


def program_size(hlo: str) -> dict:
    """Instructions of the optimized program, in every computation (fusion bodies included), its fusions, and its
    async collectives (their start ops)."""
    return {"instructions": len(_INSTRUCTION.findall(hlo)),
            "fusions": len(re.findall(r"\bfusion\(", hlo)),
            "async_collective_starts": len(re.findall(r"\b(?:all-gather|all-reduce|collective-permute|all-to-all|"
                                                      r"reduce-scatter)-start\(", hlo))}


def point(strategy: str, layers: int, dump: Path, scan: bool = False) -> dict:
    path = Path(strategy) if strategy.endswith(".yaml") else REPO / "strategies" / f"{strategy}.yaml"
    done = subprocess.run([sys.executable, "-m", "meshlab", "check", str(path), "--backend", "tpu",
                           "--layers", str(layers), *(["--scan"] if scan else []), "--json", "--dump-dir", str(dump)],
                          capture_output=True, text=True, cwd=REPO)
    if not done.stdout.startswith("{"):
        return {"strategy": path.stem, "layers": layers, "error": done.stderr.strip().splitlines()[-1:]}
    doc = json.loads(done.stdout)
    found = {"strategy": path.stem, "layers": layers, "scanned": scan, "system": doc["device"]["type"],
             "front_end": doc["front_end"], "compile_s": doc["compile_seconds"],
             "fits_xla": doc["fits"]["xla"]}
    programs = sorted(dump.glob("*.tpu.hlo.txt"))
    if programs:
        found.update(program_size(programs[0].read_text()))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strategies", default="2d,pairs,fsdp,hybrid")
    parser.add_argument("--layers", default="2,8,16")
    parser.add_argument("--scan", action="store_true", help="compile each block list as one scanned loop (--scan)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    points = []
    for name in args.strategies.split(","):
        for layers in (int(n) for n in args.layers.split(",")):
            with tempfile.TemporaryDirectory() as dump:
                points.append(point(name.strip(), layers, Path(dump), args.scan))
            print(json.dumps(points[-1]), flush=True)
        mine = [p for p in points if p["strategy"] == Path(name.strip()).stem and "compile_s" in p]
        if len(mine) >= 2:
            lo, hi = mine[0], mine[-1]
            print(f"{lo['strategy']}: {(hi['compile_s'] - lo['compile_s']) / (hi['layers'] - lo['layers']):.2f} s per "
                  f"block ({lo['layers']} to {hi['layers']} blocks)", flush=True)
    if args.out:
        args.out.write_text(json.dumps({"command": " ".join(["python", "benchmarks/tpu_compile_depth.py",
                                                              *sys.argv[1:]]),
                                        "host": {"machine": platform.machine(), "cores": os.cpu_count()},
                                        "points": points}, indent=1) + "\n")


if __name__ == "__main__":
    main()
