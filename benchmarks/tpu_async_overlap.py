"""How much of a collective kind's time XLA:TPU's schedule hides once a libtpu flag makes it async (issue 25, part 4).

    python benchmarks/tpu_async_overlap.py                       # hybrid.yaml, all-to-alls, v6e-8, full depth
    python benchmarks/tpu_async_overlap.py --strategy hybrid --flag=--xla_tpu_enable_async_all_to_all=true \\
        --kind all-to-all --out benchmarks/results/tpu_async_overlap.json
    python benchmarks/tpu_async_overlap.py --strategy fsdp --hardware v5e-8 --kind all-gather \\
        --flag=--xla_tpu_enable_async_collective_fusion=true ...   # --flag once per flag (MaxText's set)
    python benchmarks/tpu_async_overlap.py --strategy fsdp --hardware v5p-8 --mesh data=4 --batch 4 ...  # 4 chips

Compiles the built-in strategy twice ahead of time for its TPU system (`meshlab check S.yaml --backend tpu
--front-end torch-xla --json`, full depth, the workload's own size, or another system's with --hardware, --mesh
and --batch, another size with --size): as it is, and with the flag added to its
`compile.libtpu_flags`. From each program's latency-hiding schedule (XLA:TPU's cost model, not a measurement;
meshlab.check.tpu_schedule) it takes the time the kind holds the timeline: synchronous, all of it; async, what the
schedule leaves exposed (the -done ops and the cycles wasted waiting on them). The share hidden is 1 - exposed /
synchronous, the program with more of the kind async against the other (a flag may turn them on, as
--xla_tpu_enable_async_all_to_all on v6e, or off, as --xla_enable_async_all_gather=false on v5e, whose defaults run
FSDP's weight gathers async): the catalog's `async_all_to_all_hidden` or `async_weight_gather_hidden` for the chip.
Prints both programs' counts of the kind a middle block, async or not, and the schedule's totals. Nothing here
asserts a time.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]


def compiled(path: Path, cache: Path) -> dict:
    env = {**os.environ, "MESHLAB_COMPILE_TIMES": str(cache)}  # the user's kept compiles stay as they were
    done = subprocess.run([sys.executable, "-m", "meshlab", "check", str(path), "--backend", "tpu", "--front-end",
                           "torch-xla", "--json"], capture_output=True, text=True, cwd=REPO, env=env)
    if not done.stdout.startswith("{"):
        sys.exit(f"{path.name}: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout)


def exposed_s(schedule: dict, kind: str) -> float:
    """The seconds a collective kind holds the schedule's timeline: its ops' own, and the cycles wasted waiting on
    its async ones (scheduler_statistics names them with underscores)."""
    return schedule["collective_s_by_kind"].get(kind, 0.0) + schedule["wasted_s"].get(kind.replace("-", "_"), 0.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategy", default="hybrid")
    parser.add_argument("--flag", action="append", help="a libtpu flag to add (repeat for several; default: "
                        "--xla_tpu_enable_async_all_to_all=true)")
    parser.add_argument("--kind", default="all-to-all")
    parser.add_argument("--hardware", help="compile for this TPU system instead of the strategy's own")
    parser.add_argument("--mesh", action="append", default=[], metavar="AXIS=N",
                        help="set a mesh axis's size (repeat for several), for a system of another size")
    parser.add_argument("--batch", type=int, help="set the workload's batch (with --mesh, to keep a chip's share)")
    parser.add_argument("--size", type=int, help="set the workload's height and width (pixels)")
    parser.add_argument("--out", type=Path, help="also write both documents' figures as JSON here")
    args = parser.parse_args()
    flags = args.flag or ["--xla_tpu_enable_async_all_to_all=true"]
    data = yaml.safe_load((REPO / "strategies" / f"{args.strategy}.yaml").read_text())
    if args.hardware:
        data["hardware"] = args.hardware
    for setting in args.mesh:
        axis, _, size = setting.partition("=")
        if axis not in data["mesh"]:
            sys.exit(f"--mesh {setting}: {args.strategy}.yaml's mesh has no axis {axis!r} (its axes: "
                     f"{', '.join(data['mesh'])})")
        data["mesh"][axis] = int(size)
    if args.batch:
        data["workload"]["batch"] = args.batch
    if args.size:
        data["workload"]["height"] = data["workload"]["width"] = args.size
    with tempfile.TemporaryDirectory() as scratch:
        source, flagged = Path(scratch) / f"{args.strategy}.yaml", Path(scratch) / f"{args.strategy}-async.yaml"
        source.write_text(yaml.safe_dump(data, sort_keys=False))
        compile_ = data.setdefault("compile", {})
        compile_["libtpu_flags"] = [*compile_.get("libtpu_flags", []), *flags]
        data["name"] = f"{data['name']}-async"
        flagged.write_text(yaml.safe_dump(data, sort_keys=False))
        cache = Path(scratch) / "compile-times.json"
        docs = {"libtpu's defaults": compiled(source, cache), " ".join(flags): compiled(flagged, cache)}
    rows = {}
    for name, doc in docs.items():
        schedule = doc["xla_schedule"]
        block = doc["middle_blocks"][0]
        rows[name] = {"compile_seconds": doc["compile_seconds"],
                      "schedule_total_s": schedule["total_s"] if schedule else None,  # None: no schedule written
                      "kind_s": exposed_s(schedule, args.kind) if schedule else None,
                      "per_block": doc["collectives_per_block"][block].get(args.kind, 0),
                      "async_per_block": doc["async_collectives_per_block"][block].get(args.kind, 0),
                      "schedule": schedule}
        timeline = (f"schedule {schedule['total_s'] * 1e3:.2f} ms a forward, {args.kind} "
                    f"{rows[name]['kind_s'] * 1e3:.3f} ms of it" if schedule else
                    doc["xla_schedule_note"])
        print(f"{args.strategy}.yaml, {name}, {doc['device']['type']}: compile {doc['compile_seconds']:.0f} s; "
              f"{block}: {rows[name]['per_block']} {args.kind} ({rows[name]['async_per_block']} async); {timeline}")
    synchronous, asynchronous = (rows[k]["kind_s"] for k in sorted(docs, key=lambda k: rows[k]["async_per_block"]))
    scheduled = all(doc["xla_schedule"] for doc in docs.values())
    hidden = 1 - asynchronous / synchronous if synchronous and scheduled else None
    print(f"hidden by the schedule: {hidden:.4f} of the {args.kind}s' time" if hidden is not None else
          f"no share: {'no schedule to read it from' if not scheduled else f'no {args.kind} in the schedule'}")
    if args.out:
        args.out.write_text(json.dumps({"command": " ".join(sys.argv), "strategy": args.strategy,
                                        "hardware": data["hardware"], "mesh": data["mesh"], "flags": flags,
                                        "size": [data["workload"]["height"], data["workload"]["width"]],
                                        "kind": args.kind, "programs": rows, "hidden": hidden}, indent=1) + "\n")


if __name__ == "__main__":
    main()
