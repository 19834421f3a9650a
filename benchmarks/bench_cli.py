"""Whole-process wall time of meshlab commands: repeated runs, median and spread.

    python benchmarks/bench_cli.py                      # meshlab try strategies/2d.yaml, 15 runs
    python benchmarks/bench_cli.py --runs 5 -- sweep --model qwen-image --hardware v6e-8

Reports figures for issue notes; nothing here asserts a time (machines are shared and noisy).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def meshlab_executable() -> str:
    beside = Path(sys.executable).with_name("meshlab")
    return str(beside) if beside.exists() else (shutil.which("meshlab") or "meshlab")


def time_runs(command: list[str], runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        result = subprocess.run(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        times.append(time.perf_counter() - start)
        if result.returncode not in (0,):
            sys.exit(f"{' '.join(command)} exited {result.returncode}: {result.stderr.decode()[-500:]}")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("args", nargs="*", default=["try", "strategies/2d.yaml"])
    options = parser.parse_args()
    command = [meshlab_executable(), *options.args]
    time_runs(command, 1)  # warm the file cache and .pyc files
    times = time_runs(command, options.runs)
    print(f"{' '.join(['meshlab', *options.args])}: median {statistics.median(times):.3f} s, "
          f"min {min(times):.3f} s, max {max(times):.3f} s over {options.runs} runs")


if __name__ == "__main__":
    main()
