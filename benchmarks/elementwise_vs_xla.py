"""Hold the cost model's elementwise passes against the traffic of XLA's own fusions (8 or 1 virtual CPU devices).

    python benchmarks/elementwise_vs_xla.py [--strategies one pairs] [--keep DIR]

For each plan (``one``: Qwen-Image whole on one device; ``pairs``: strategies/pairs.yaml's column/row tensor
parallelism on 2x4), ``meshlab check`` runs the real model at 1 and at 3 blocks in float32 (XLA's CPU compiler moves
bf16 through f32 conversions of every weight, which would drown the activations) and keeps XLA's dump. In the
per-device program it compiled, every instruction of the entry computation that is not a matmul (a dot, a
convolution, a custom call, or a fusion or call around one) is elementwise traffic: its operands' and result's
bytes. Two kinds are set apart: work on a [.., seq, seq] tensor (attention's scores, which meshlab prices inside
attention) and work on a tensor with no token dim (weight layout copies: XLA's CPU compiler transposes weights for
its dots). The difference between 3 and 1 blocks, halved, is one block's.

Beside it, meshlab's prediction for the same plan, shapes and dtype: the elementwise row per block per chip, from
a card traced at float32. XLA's CPU compiler also moves layout copies of activations around its dots, which a
TPU's does not, so the two are not expected to be equal; what the comparison shows is how far apart they are and
whether a plan's split scales both alike. Nothing here is asserted.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from meshlab.check.hlo import array_shapes, definitions  # noqa: E402

HEIGHT = WIDTH = 128  # 64 image tokens
TEXT = 32
BATCH = {"one": 1, "pairs": 2}  # one sample per chip
ONE = """name: one
description: Qwen-Image whole on one device, float32 (benchmarks/elementwise_vs_xla.py)
model: qwen-image
hardware: v6e-1
mesh: {data: 1}
rules:
  - match: "*"
    shard: replicate
workload: {dtype: float32, height: 1024, width: 1024, batch: 1}
"""
_LINE = re.compile(r"\s+(?:ROOT )?%?([\w.\-]+) = (.*?) ([\w\-]+)\((.*?)\)(.*)$")
_SKIP = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all"}


def strategy_files(folder: Path) -> dict[str, Path]:
    one = folder / "one.yaml"
    one.write_text(ONE)
    pairs = folder / "pairs.yaml"
    pairs.write_text((ROOT / "strategies" / "pairs.yaml").read_text().replace("dtype: bfloat16", "dtype: float32"))
    return {"one": one, "pairs": pairs}


def check(strategy: Path, layers: int, dump: Path) -> None:
    command = [sys.executable, "-m", "meshlab", "check", str(strategy), "--layers", str(layers), "--height",
               str(HEIGHT), "--width", str(WIDTH), "--text-tokens", str(TEXT), "--dump-dir", str(dump), "--json"]
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if run.returncode not in (0, 1):  # 1: the check disagrees about something else; the dump is still there
        sys.exit(f"{' '.join(command)} exited {run.returncode}: {run.stderr[-800:]}")


def traffic(path: str, tokens: set[int], seq: int) -> dict[str, float]:
    """Bytes of the entry computation's non-matmul instructions: elementwise, attention-shaped, weight-shaped."""
    text = Path(path).read_text()
    computations, current, entry = {}, None, None
    for line in text.splitlines():
        head = re.match(r"^(ENTRY )?%?([\w.\-]+) .*\{$", line)
        if head:
            current = head.group(2)
            computations[current] = []
            entry = current if head.group(1) else entry
        elif current and line.startswith("  "):
            computations[current].append(line)
    shapes = definitions(text)

    def heavy(rest: str, seen: set) -> bool:
        for called in re.findall(r"(?:calls|to_apply)=%?([\w.\-]+)", rest):
            if called not in seen:
                seen.add(called)
                for line in computations.get(called, []):
                    if re.search(r" (dot|convolution|custom-call)\(", line) or heavy(line, seen):
                        return True
        return False

    out = {"elementwise": 0.0, "attention-shaped": 0.0, "weight-shaped": 0.0}
    for line in computations[entry]:
        m = _LINE.match(line)
        if not m or m.group(3) in _SKIP:
            continue
        shape, op, args, rest = m.group(2), m.group(3), m.group(4), m.group(5)
        if op in ("dot", "convolution", "custom-call") or heavy(rest, set()):
            continue
        arrays = array_shapes(shape) + tuple(a for name in args.split(",")
                                             for a in shapes.get(name.strip().lstrip("%"), ()))
        size, dims = sum(a.bytes for a in arrays), [a.dims for a in arrays]
        if any(d[i:i + 2] == (seq, seq) for d in dims for i in range(len(d) - 1)):
            out["attention-shaped"] += size
        elif any(len(d) >= 2 and not set(d) & tokens and max(d) >= 1024 for d in dims):
            out["weight-shaped"] += size
        else:
            out["elementwise"] += size
    return out


def predicted(strategy: Path, name: str, card) -> float:
    from meshlab.cost.predict import predict
    from meshlab.plan.planner import make_plan
    from meshlab.plan.planned import plan_file, with_workload

    planned = with_workload(plan_file(strategy), height=HEIGHT, width=WIDTH, text_tokens=TEXT, batch=BATCH[name])
    p = predict(make_plan(planned.strategy, card, planned.plan.mesh.device_count), planned.strategy, planned.hardware)
    return sum(w.hbm_bytes for w in p.work if w.kind == "elementwise")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--strategies", nargs="+", default=["one", "pairs"], choices=["one", "pairs"])
    parser.add_argument("--keep", type=Path, help="keep the strategies and XLA's dumps here")
    args = parser.parse_args()
    from meshlab.models.importer.card_import import import_preset

    card = import_preset("qwen-image", dtype="float32")
    image = (HEIGHT // 16) * (WIDTH // 16)
    folder = args.keep or Path(tempfile.mkdtemp(prefix="meshlab-elementwise-"))
    folder.mkdir(parents=True, exist_ok=True)
    files = strategy_files(folder)
    print(f"Qwen-Image, float32, {image} image + {TEXT} text tokens, one sample per chip; per block per chip, MB")
    for name in args.strategies:
        per_depth = {}
        for layers in (1, 3):
            dump = folder / f"{name}-{layers}"
            check(files[name], layers, dump)
            modules = sorted(glob.glob(str(dump / "*SyncTensorsGraph*after_optimizations.txt")))
            per_depth[layers] = traffic(modules[0], {image, TEXT, image + TEXT}, image + TEXT)
        block = {k: (per_depth[3][k] - per_depth[1][k]) / 2 / 1e6 for k in per_depth[1]}
        model = predicted(files[name], name, card) / 1e6
        print(f"  {name:6s} meshlab {model:7.2f}   XLA CPU elementwise {block['elementwise']:7.2f} "
              f"(meshlab/XLA {model / block['elementwise']:.2f}); attention-shaped {block['attention-shaped']:.2f}, "
              f"weight-shaped {block['weight-shaped']:.2f}")
    print(f"dumps: {folder}")


if __name__ == "__main__":
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    main()
