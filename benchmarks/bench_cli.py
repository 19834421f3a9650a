"""Whole-process wall time of meshlab commands: repeated runs, median and spread.

    python benchmarks/bench_cli.py                      # meshlab try strategies/2d.yaml, 15 runs
    python benchmarks/bench_cli.py --runs 5 -- sweep --model qwen-image --hardware v6e-8

Reports figures for issue notes; nothing here asserts a time (machines are shared and noisy). Beside the wall
time it reports the CPU time (user + system) of each run: when the two agree, the command is bound by the CPU
(imports and planning), not by waiting on files. On a shared host both swing by a fifth from one batch of runs
to the next: compare two versions in alternating batches, never against a figure taken another day.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
#: the runs may write .pyc files, as a user's do: with PYTHONDONTWRITEBYTECODE set (some sandboxes set it), every
#: run compiled meshlab's changed modules from source, about 30 ms of `meshlab try` that no installed copy pays
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def meshlab_executable() -> str:
    beside = Path(sys.executable).with_name("meshlab")
    return str(beside) if beside.exists() else (shutil.which("meshlab") or "meshlab")


def time_runs(command: list[str], runs: int) -> tuple[list[float], list[float]]:
    """Wall seconds and CPU seconds (user + system, the process and its children) of each run."""
    walls, cpus = [], []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        result = subprocess.run(command, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=CHILD_ENV)
        walls.append(time.perf_counter() - start)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime)
        if result.returncode not in (0,):
            sys.exit(f"{' '.join(command)} exited {result.returncode}: {result.stderr.decode()[-500:]}")
    return walls, cpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("args", nargs="*", default=["try", "strategies/2d.yaml"])
    options = parser.parse_args()
    command = [meshlab_executable(), *options.args]
    time_runs(command, 1)  # warm the file cache and .pyc files
    walls, cpus = time_runs(command, options.runs)
    print(f"{' '.join(['meshlab', *options.args])}: wall median {statistics.median(walls):.3f} s, "
          f"min {min(walls):.3f} s, max {max(walls):.3f} s; CPU median {statistics.median(cpus):.3f} s, "
          f"min {min(cpus):.3f} s, max {max(cpus):.3f} s; over {options.runs} runs")


if __name__ == "__main__":
    main()
