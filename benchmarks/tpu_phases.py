"""What XLA:TPU's program holds at once, module by module: the working set's peak while each module's ops run.

    meshlab check S.yaml --backend tpu --front-end torch-xla --layers 3 --dump-dir D
    python benchmarks/tpu_phases.py D [--top 12]

`meshlab check --backend tpu` reports the program's one peak and what it holds then (`at_peak`); a prediction is a
largest of phases (a block's attention, its MLP), and where the peak is one phase's, the others are read here:
meshlab.check.hlo.working_set_by_module over the files the check's --dump-dir keeps (the optimized program, its
buffer assignment, live ranges and memory-usage report). Reports figures for notes and docs; asserts nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from meshlab.check import hlo
from meshlab.workers.check_tpu import BUFFER_ASSIGNMENT, files_beside


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("dump_dir", type=Path, help="a `meshlab check --backend tpu --dump-dir` folder")
    parser.add_argument("--top", type=int, default=12, help="modules to print, the largest first")
    options = parser.parse_args()
    assignments = sorted((options.dump_dir / "xla-dump").glob(f"*{BUFFER_ASSIGNMENT}"), key=lambda p: p.stat().st_size)
    if not assignments:
        raise SystemExit(f"{options.dump_dir}: no XLA buffer assignment under xla-dump/ (run the check with "
                         "--dump-dir)")
    assignment = assignments[-1]  # the program's: the largest module the compile wrote
    beside = files_beside(assignment)
    on_chip = hlo.on_chip_colors(beside["-memory-usage-report"].read_text())
    phases = hlo.working_set_by_module(assignment.read_text(), beside["-live-range"].read_text(), on_chip,
                                       beside[""].read_text())
    for module, peak in list(phases.items())[:options.top]:
        print(f"{module}: {peak.bytes:,} B at once")
        for held in peak.holdings:
            print(f"    {held.bytes:>12,} B  {held.label}")


if __name__ == "__main__":
    main()
