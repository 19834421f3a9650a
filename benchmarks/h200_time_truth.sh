#!/usr/bin/env bash
# Issue 8, part 6, on one H200 (the device tool's machine; run from the repository root, within 10 minutes):
# profile the H200 at Qwen-Image's one-GPU plan at 512x512 and 1024x1024, then run the full model (60 blocks,
# random weights at real width, CFG, 20 steps) at both sizes with plain PyTorch, each run priced from its profile.
# Profiles and records land in $OUT (the device tool brings them back); commit them under experiments/.
#
# The machine has torch, transformers, typer, rich and pyyaml but not diffusers or pydantic: carry them as wheels in
# wheels/ (git-ignored), downloaded here with
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_17_x86_64 -d wheels \
#       diffusers pydantic pydantic-core annotated-types typing-inspection
set -euo pipefail
OUT=${OUT:-out/h200}
mkdir -p "$OUT/results" "$OUT/images" "$OUT/profiles"
if ! python3 -c "import diffusers, pydantic" 2>/dev/null; then
  python3 -m pip install -q --no-deps --target /tmp/meshlab-deps wheels/*.whl
  export PYTHONPATH="/tmp/meshlab-deps${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee "$OUT/nvidia-smi.csv"
for size in 512 1024; do
  strategy=experiments/strategies/qwen-image-one-h200-profiled-$size.yaml
  python3 -m meshlab profile "$strategy" -o "$OUT/profiles/h200-$size.json" --backend torch --hardware h200
  cp "$OUT/profiles/h200-$size.json" experiments/profiles/  # the strategy names it there
  python3 -m meshlab run "$strategy" --checkpoint random --backend torch --results "$OUT/results" \
      --out "$OUT/images"
  # the same run's prediction from the catalog's assumed efficiencies, for the note
  python3 -m meshlab compare experiments/strategies/qwen-image-one-h200.yaml --json > "$OUT/catalog-1024.json"
done
python3 -m meshlab report "$OUT"/results/*.jsonl | tee "$OUT/report.txt"
