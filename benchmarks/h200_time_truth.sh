#!/usr/bin/env bash
# Issue 8, part 6, on one H200 (the device tool's machine; run from the repository root, within 10 minutes):
# profile the H200 at Qwen-Image's one-GPU plan at 512x512 and 1024x1024, then run the full model (60 blocks,
# random weights at real width, CFG, 20 steps) at both sizes with plain PyTorch, each run priced from its profile.
# Profiles and records land in $OUT (the device tool brings them back); commit them under experiments/.
#
# The machine has torch, transformers, typer, rich and pyyaml but not diffusers: carry it as a wheel in wheels/
# (git-ignored), downloaded here with (meshlab no longer needs pydantic)
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --platform manylinux_2_17_x86_64 -d wheels \
#       diffusers
set -euo pipefail
OUT=${OUT:-out/h200}
mkdir -p "$OUT/results" "$OUT/images" "$OUT/profiles"
if ! python3 -c "import diffusers" 2>/dev/null; then
  python3 -m pip install -q --no-deps --target /tmp/meshlab-deps wheels/*.whl
  export PYTHONPATH="/tmp/meshlab-deps${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv | tee "$OUT/nvidia-smi.csv"
# which kernel SDPA runs here (the catalog's default, fa2, is torch 2.9's first choice; later torch may put cuDNN
# first): the priority order after one call at Qwen-Image's head shape (SDPBackend: 1 flash, 3 cudnn)
python3 -c "import torch, torch.nn.functional as F
q = torch.randn(1, 24, 4096, 128, device='cuda', dtype=torch.bfloat16); F.scaled_dot_product_attention(q, q, q)
print('torch', torch.__version__, 'cudnn', torch.backends.cudnn.version(), 'sdp order', torch._C._get_sdp_priority_order())" \
  | tee "$OUT/sdpa.txt"
for size in 512 1024; do
  strategy=experiments/strategies/qwen-image-one-h200-profiled-$size.yaml
  python3 -m meshlab profile "$strategy" -o "$OUT/profiles/h200-$size.json" --backend torch --hardware h200
  cp "$OUT/profiles/h200-$size.json" experiments/profiles/  # the strategy names it there
  python3 -m meshlab run "$strategy" --checkpoint random --backend torch --results "$OUT/results" \
      --out "$OUT/images"
  # the same run's prediction from the catalog (published attention rates, OpenXLA's measured GEMM rates), for the
  # note: with the default kernel (fa2), with cuDNN's, and with a flat compute_efficiency for the Linears
  for variant in fa2:"attention_kernel: fa2" cudnn:"attention_kernel: cudnn" \
                 fa2-flat-gemm:"attention_kernel: fa2, matmul_rates: none"; do
    tag=${variant%%:*}
    sed -e "s#^hardware:.*#hardware: {name: 'h200:1', ${variant#*:}}#" \
        -e "s#^name:.*#name: qwen-image-one-h200-catalog-$size-$tag#" "$strategy" > "$OUT/catalog-$size-$tag.yaml"
    python3 -m meshlab compare "$OUT/catalog-$size-$tag.yaml" --json > "$OUT/catalog-$size-$tag.json"
  done
done
python3 -m meshlab report "$OUT"/results/*.jsonl | tee "$OUT/report.txt"
