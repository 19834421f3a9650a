"""When XLA:TPU combines a block's reduce-scatters into one op, by chip and group size (issue 25, part 3).

    python benchmarks/tpu_scatter_combine.py --out benchmarks/results/tpu_scatter_combine.json

Under 2d's rules a block's MLP sums (the image stream's and the text stream's) are reduce-scattered over the model
axis; XLA:TPU's all-reduce combiner, run again after it fuses each all-reduce and its slice into an
all-reduce-scatter fusion, merges the two into one op on v6e and v5e while they are small, and on v4 and v5p at no
size compiled (the pass runs there and changes nothing; the flagfile XLA dumps beside a v5p-8 and a v6e-4 program,
`meshlab check S --backend tpu --dump-dir D`, lists the same combiner thresholds, 125,829,120 B:
benchmarks/results/tpu_combiner_flags.txt). The 4-chip cases on v6e and v5e turn the collective matmuls off
(2d-no-collective-matmul*.yaml's libtpu flags), else those chips run the MLP sums as collective matmuls. Each case
here compiles 3 blocks ahead of time (`meshlab check S --backend tpu --front-end torch-xla --layers 3 --height H
--width H --text-tokens T --json`) and reads a middle block's reduce-scatters: their count and the bytes they move
together (the all-reduce's input, both streams). The sizes bracket the boundary: for each chip and group size the
largest total seen combined and the smallest seen apart. The catalog's ``reduce_scatter_combine_bytes`` is the
largest combined total per group size; tests/cost/test_tpu_issued.py holds meshlab's count to every case here. Each
compile takes about 20 s on two cores. Nothing here asserts a time.
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
DATA = "tests/cost/data/strategies"
#: (strategy, height = width, text tokens): sizes that bracket each chip's boundary; the group is the model axis
CASES = (
    (f"{DATA}/2d-v6e-4.yaml", 256, 32),
    (f"{DATA}/2d-v6e-4.yaml", 640, 64),
    (f"{DATA}/2d-v6e-4.yaml", 640, 72),
    (f"{DATA}/2d-v6e-4.yaml", 640, 80),
    (f"{DATA}/2d-v6e-4.yaml", 704, 64),
    (f"{DATA}/2d-v6e-4.yaml", 1024, 128),
    (f"{DATA}/2d-no-collective-matmul.yaml", 256, 32),
    (f"{DATA}/2d-no-collective-matmul.yaml", 768, 128),
    (f"{DATA}/2d-no-collective-matmul.yaml", 768, 256),
    (f"{DATA}/2d-no-collective-matmul.yaml", 832, 64),
    (f"{DATA}/2d-no-collective-matmul-v5e-8.yaml", 256, 32),
    (f"{DATA}/2d-no-collective-matmul-v5e-8.yaml", 512, 64),
    (f"{DATA}/2d-no-collective-matmul-v5e-8.yaml", 576, 64),
    (f"{DATA}/2d-no-collective-matmul-v5e-8.yaml", 640, 64),
    (f"{DATA}/2d-v5p-8.yaml", 64, 16),
    (f"{DATA}/2d-v5p-8.yaml", 256, 32),
    (f"{DATA}/2d-v5p-8.yaml", 512, 64),
    (f"{DATA}/2d-v4-8.yaml", 64, 16),
    (f"{DATA}/2d-v4-8.yaml", 256, 32),
)
BLOCK = "transformer_blocks.1"


def compiled(strategy: str, side: int, text_tokens: int, cache: Path) -> dict:
    env = {**os.environ, "MESHLAB_COMPILE_TIMES": str(cache)}  # the user's kept compiles stay as they were
    done = subprocess.run([sys.executable, "-m", "meshlab", "check", strategy, "--backend", "tpu", "--front-end",
                           "torch-xla", "--layers", "3", "--height", str(side), "--width", str(side),
                           "--text-tokens", str(text_tokens), "--json"], capture_output=True, text=True, cwd=REPO,
                          env=env)
    if not done.stdout.startswith("{"):
        sys.exit(f"{strategy}: {done.stderr.strip().splitlines()[-1:]}")
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write the cases as JSON here")
    args = parser.parse_args()
    cases = []
    with tempfile.TemporaryDirectory(prefix="meshlab-scatter-combine-") as folder:
        for strategy, side, text_tokens in CASES:
            ways = yaml.safe_load((REPO / strategy).read_text())["mesh"]["model"]
            document = compiled(strategy, side, text_tokens, Path(folder) / "compile_times.json")
            count = document["collectives_per_block"][BLOCK].get("reduce-scatter", 0)
            moved = document["collective_bytes_per_block"][BLOCK].get("reduce-scatter", 0)
            case = {"strategy": strategy, "hardware": document["device"]["type"], "ways": ways, "height": side,
                    "width": side, "text_tokens": text_tokens, "reduce_scatters": count, "bytes": moved}
            cases.append(case)
            print(f"{case['hardware']}, {ways} ways, {side}x{side}, {text_tokens} text tokens: {count} "
                  f"reduce-scatter(s) moving {moved:,} B together", flush=True)
    import libtpu  # the [tpu] extra: the compiler these cases describe
    record = {"command": "python benchmarks/tpu_scatter_combine.py" + (f" --out {args.out}" if args.out else ""),
              "libtpu": getattr(libtpu, "__version__", None), "block": BLOCK, "cases": cases}
    if args.out:
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
