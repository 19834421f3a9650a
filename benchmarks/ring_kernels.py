"""meshlab's ring terms against ring attention's kernels measured on one H200; print the ratios.

    python benchmarks/ring_kernels.py [--measured FILE] [--json]

The measurement (default `experiments/profiles/h200-2026-12-05/ring-attention.json`; the 2026-12-04 file,
`experiments/profiles/h200-ring-attention.json`, has the one-call timings alone) is benchmarks/gpu_ring_attention.py
on the device tool's H200: what one rank of a ring computes, without transfers. For each case (Qwen-Image / Flux at
1024x1024, 4,608 joint tokens, 24 heads; Wan 2.1 14B at 720p x 81 frames, 75,600 tokens, 40 heads; rings of 2, 4
and 8) this prices, as meshlab.cost.ring does on the catalog's h200:

- one pass: N/n queries against N/n keys, all heads, at the attention kernel's published rate for N/n keys times
  how full its tiles keep the SMs (`Hardware.attention_occupancy`);
- the ring as the benchmark runs it: n passes, the first pass's output cast to float32, and n - 1 merges
  (ring-flash-attention's update: the pass's output cast to float32, then the sigmoid-weighted update), the casts
  and merges at `CAST_BYTES_PER_ELEMENT` and `MERGE_BYTES_PER_ELEMENT` per output element at the bandwidth
  `MERGE_HBM_FRACTION` gives;
- Ulysses' one attention: N queries against N keys on h/n heads.

meshlab prices the host's dispatch of each kernel apart (eager_dispatch_s), so each term is held against the GPU's
own time where the file has it: the pass and the ring replayed from a CUDA graph, Ulysses queued (calls issued back
to back, the host ahead of the GPU); a case without them (Wan's, whose kernels run for milliseconds) against one
call between two events. `MERGE_HBM_FRACTION` was read from this file's rings at 2 and 4 ranks and Wan's merges, so
the ring rows check the rest of the model around it, not the fraction; every other figure is the catalog's as it is.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from meshlab.cost.flops import Work
from meshlab.cost.ring import CAST_BYTES_PER_ELEMENT, MERGE_BYTES_PER_ELEMENT, MERGE_HBM_FRACTION
from meshlab.cost.timing import op_seconds
from meshlab.core.hardware import load_hardware

REPO = Path(__file__).resolve().parents[1]
MEASURED = REPO / "experiments" / "profiles" / "h200-2026-12-05" / "ring-attention.json"
#: per term, the measured fields in the order they are preferred: the GPU's own time first
MEASURED_FIELDS = {"pass": ("pass_graph_s", "pass_queued_s", "pass_s"),
                   "ring": ("ring_graph_s", "ring_queued_s", "ring_s"),
                   "ulysses": ("ulysses_queued_s", "ulysses_s")}


def _attention(batch: int, heads: int, queries: int, keys: int, head_dim: int) -> Work:
    return Work("attention", None, 4.0 * batch * heads * queries * keys * head_dim,
                float(batch * (2 * queries + 2 * keys) * heads * head_dim * 2), "attention",
                shape=(batch, heads, queries, keys, head_dim))


def _measured(case: dict, term: str) -> tuple[float, str]:
    field = next(f for f in MEASURED_FIELDS[term] if case.get(f) is not None)
    return case[field], field


def rows(measured: Path = MEASURED) -> list[dict]:
    hw = load_hardware("h200")
    bandwidth = hw.hbm_bandwidth * MERGE_HBM_FRACTION
    found = []
    for c in json.loads(measured.read_text())["cases"]:
        b, h, n_tokens, d, n = c["batch"], c["heads"], c["tokens"], c["head_dim"], c["degree"]
        block = n_tokens // n
        elements = b * block * h * d
        one_pass = op_seconds(_attention(b, h, block, block, d), hw)
        cast = CAST_BYTES_PER_ELEMENT * elements / bandwidth
        merge = MERGE_BYTES_PER_ELEMENT * elements / bandwidth
        predicted = {"pass": one_pass, "ring": n * one_pass + n * cast + (n - 1) * merge,
                     "ulysses": op_seconds(_attention(b, h // n, n_tokens, n_tokens, d), hw)}
        row = {"case": c["case"], "degree": n}
        for term, seconds in predicted.items():
            row[f"{term}_predicted_s"] = seconds
            row[f"{term}_measured_s"], row[f"{term}_measured_as"] = _measured(c, term)
        found.append(row)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--measured", type=Path, default=MEASURED, help="a gpu_ring_attention.py JSON file")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    found = rows(args.measured)
    if args.json:
        print(json.dumps(found, indent=1))
        return
    shown = args.measured.resolve()
    print(shown.relative_to(REPO) if shown.is_relative_to(REPO) else shown)
    print(f"{'case':28} {'n':>2}  {'pass us (pred/meas)':>24}  {'ring us (pred/meas)':>24}  "
          f"{'ulysses us (pred/meas)':>26}")
    for r in found:
        cells = []
        for term in ("pass", "ring", "ulysses"):
            p, m = r[f"{term}_predicted_s"] * 1e6, r[f"{term}_measured_s"] * 1e6
            cells.append(f"{p:8.0f} / {m:8.0f} = {p / m:4.2f}")
        print(f"{r['case']:28} {r['degree']:>2}  " + "  ".join(cells))
    for term in MEASURED_FIELDS:
        fields = {r[f"{term}_measured_as"]: None for r in found}
        print(f"{term} measured as: {', '.join(fields)}")


if __name__ == "__main__":
    main()
