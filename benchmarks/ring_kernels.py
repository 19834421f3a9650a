"""meshlab's ring terms against ring attention's kernels measured on one H200; print the ratios.

    python benchmarks/ring_kernels.py [--json]

The measurement is `experiments/profiles/h200-ring-attention.json` (benchmarks/gpu_ring_attention.py on the device
tool's H200: what one rank of a ring computes, without transfers). For each case (Qwen-Image / Flux at 1024x1024,
4,608 joint tokens, 24 heads; Wan 2.1 14B at 720p x 81 frames, 75,600 tokens, 40 heads; rings of 2, 4 and 8) this
prices, as meshlab.cost.ring does on the catalog's h200:

- one pass: N/n queries against N/n keys, all heads, at the attention kernel's published rate for N/n keys;
- one merge as the benchmark times it (ring-flash-attention's update: the pass's output cast to float32, then the
  sigmoid-weighted update): `CAST_BYTES_PER_ELEMENT` + `MERGE_BYTES_PER_ELEMENT` bytes per output element at the
  effective HBM bandwidth;
- Ulysses' one attention: N queries against N keys on h/n heads.

A check, never a fit: the catalog's rates and efficiencies are used as they are.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from meshlab.cost.flops import Work
from meshlab.cost.ring import CAST_BYTES_PER_ELEMENT, MERGE_BYTES_PER_ELEMENT
from meshlab.cost.timing import op_seconds
from meshlab.core.hardware import load_hardware

MEASURED = Path(__file__).resolve().parents[1] / "experiments" / "profiles" / "h200-ring-attention.json"


def _attention(batch: int, heads: int, queries: int, keys: int, head_dim: int) -> Work:
    return Work("attention", None, 4.0 * batch * heads * queries * keys * head_dim,
                float(batch * (2 * queries + 2 * keys) * heads * head_dim * 2), "attention",
                shape=(batch, heads, queries, keys, head_dim))


def rows() -> list[dict]:
    hw = load_hardware("h200")
    found = []
    for c in json.loads(MEASURED.read_text())["cases"]:
        b, h, n_tokens, d, n = c["batch"], c["heads"], c["tokens"], c["head_dim"], c["degree"]
        block = n_tokens // n
        one_pass = op_seconds(_attention(b, h, block, block, d), hw)
        merge = ((MERGE_BYTES_PER_ELEMENT + CAST_BYTES_PER_ELEMENT) * b * block * h * d
                 / (hw.hbm_bandwidth * hw.hbm_efficiency))
        ulysses = op_seconds(_attention(b, h // n, n_tokens, n_tokens, d), hw)
        found.append({"case": c["case"], "degree": n, "pass_predicted_s": one_pass, "pass_measured_s": c["pass_s"],
                      "merge_predicted_s": merge, "merge_measured_s": c["merge_s"],
                      "ulysses_predicted_s": ulysses, "ulysses_measured_s": c["ulysses_s"]})
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    found = rows()
    if parser.parse_args().json:
        print(json.dumps(found, indent=1))
        return
    print(f"{'case':28} {'n':>2}  {'pass us (pred/meas)':>24}  {'merge us (pred/meas)':>24}  "
          f"{'ulysses us (pred/meas)':>26}")
    for r in found:
        cells = []
        for term in ("pass", "merge", "ulysses"):
            p, m = r[f"{term}_predicted_s"] * 1e6, r[f"{term}_measured_s"] * 1e6
            cells.append(f"{p:8.0f} / {m:8.0f} = {p / m:4.2f}")
        print(f"{r['case']:28} {r['degree']:>2}  " + "  ".join(cells))


if __name__ == "__main__":
    main()
