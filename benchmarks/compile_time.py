"""XLA compile time of full-width Qwen-Image blocks against depth, unrolled and scanned, on this host.

    python benchmarks/compile_time.py                       # pairs.yaml, 1, 2 and 4 blocks, 8 virtual CPU devices
    python benchmarks/compile_time.py --repeat 2 --out benchmarks/results/compile_time.json

Each point is one `meshlab check` (its own worker process) of the strategy at that depth, with and without
``--scan``; the figure is the compile of the checked forward's graph from torch_xla's CompileTime metric, not wall
time. Each point is the least of `--repeat` checks (compile times on two shared cores vary by tens of percent).
Fits compile seconds = a + b x blocks for each mode and extrapolates to the model's full depth. This host's CPU
compile, not a TPU's. Reports figures for issue notes; nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def fit(points: list[tuple[int, float]]) -> tuple[float, float]:
    """Least squares of seconds = a + b x blocks."""
    n = len(points)
    mean_x = sum(x for x, _ in points) / n
    mean_y = sum(y for _, y in points) / n
    spread = sum((x - mean_x) ** 2 for x, _ in points)
    b = sum((x - mean_x) * (y - mean_y) for x, y in points) / spread if spread else 0.0
    return mean_y - b * mean_x, b


def main() -> None:
    sys.path.insert(0, str(REPO))
    from meshlab.check.against_xla import run_check
    from meshlab.check.setup import CheckOptions

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strategy", default=str(REPO / "strategies" / "pairs.yaml"))
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--repeat", type=int, default=1, help="checks per point; the least compile time counts")
    parser.add_argument("--out", type=Path, help="write the points and fits as JSON here")
    args = parser.parse_args()
    points: dict[str, list[tuple[int, float]]] = {"unrolled": [], "scanned": []}
    full_depth = None
    for layers in args.layers:
        for mode in points:
            seconds = []
            for _ in range(args.repeat):
                report = run_check(args.strategy, CheckOptions(layers=layers, scan=mode == "scanned"))
                seconds.append(report.compile_seconds)
            full_depth = sum(report.setup.full_blocks.values())
            points[mode].append((layers, min(seconds)))
            print(f"{layers} block(s) {mode:8s}: compile {min(seconds):6.2f} s (of {', '.join(f'{t:.2f}' for t in seconds)}),"
                  f" output within tolerance: {report.output_agrees}, scanned lists: {list(report.scanned)}", flush=True)
    fits = {mode: fit(p) for mode, p in points.items() if len(p) > 1}
    for mode, (a, b) in fits.items():
        print(f"{mode}: {a:.2f} s + {b:.3f} s per block -> {a + b * full_depth:.1f} s at {full_depth} blocks "
              f"(this host's CPU compile)")
    one, four = (dict(points["scanned"]).get(n) for n in (1, 4))
    if one and four:
        print(f"scanned: 4 blocks compile {four / one:.2f}x 1 block")
    if args.out:
        document = {"command": "python benchmarks/compile_time.py " + " ".join(sys.argv[1:]),
                    "host": {"machine": platform.machine(), "python": platform.python_version()},
                    "strategy": Path(args.strategy).name, "points_seconds": points,
                    "fits": {m: {"a_s": a, "b_s_per_block": b, "full_depth_s": a + b * full_depth}
                             for m, (a, b) in fits.items()}, "full_depth_blocks": full_depth}
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(document, indent=1) + "\n")


if __name__ == "__main__":
    main()
