"""Predict published, measured peak memory per GPU with meshlab's memory model; print the ratios.

    python benchmarks/published_memory.py [--json]

Each case names its source and the layout it ran; meshlab plans the same layout on the catalog's GPU (memory per
chip does not depend on which GPU, only whether it fits) and reports its per-chip total without the runtime
reserve, which ``torch.cuda.max_memory_allocated`` (what such tables print) does not count. The sources print
"GB" without saying whether that is 10^9 or 2^30 bytes, so both ratios are given. A check, never a fit.

The cases: diffusers' distributed-inference guide (docs/source/en/training/distributed_inference.md, diffusers
main of 2026), FLUX.1-dev with the whole pipeline on each of 4 GPUs (``DiffusionPipeline.from_pretrained(...,
torch_dtype=bfloat16).to(device)``, then ``enable_parallelism(ContextParallelConfig(...))`` on the transformer), at
1024x1024 (the L20 and 4090 tables say so; the H100 table does not, and 1024x1024 is FluxPipeline's default).
Each table's backends are the four GPUs as one Ulysses group of 4, one ring of 4, or USP 2 x 2 ("unified_balanced").
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from meshlab.models.card import load_card
from meshlab.core.hardware import load_hardware
from meshlab.plan.memory import memory_report
from meshlab.plan.planner import make_plan
from meshlab.strategy.schema import Strategy

GUIDE = "huggingface/diffusers docs/source/en/training/distributed_inference.md"
ULYSSES = {"sequence": "seq", "sequence_parallel": "diffusers",
           "rules": [{"point": "attention.qkv", "spec": [None, None, "seq"]}]}
RING = {"sequence": "seq", "sequence_parallel": "diffusers"}
USP = {"sequence": ["ring", "seq"], "sequence_parallel": "diffusers",
       "rules": [{"point": "attention.qkv", "spec": [None, "ring", "seq"]}]}


@dataclass(frozen=True)
class Case:
    name: str
    source: str
    measured_gb: float
    mesh: dict
    activations: dict


CASES = (
    Case("flux-dev 4xH100 ulysses", f"{GUIDE}: 4 H100 table, ulysses", 33.85, {"seq": 4}, ULYSSES),
    Case("flux-dev 4xH100 ring", f"{GUIDE}: 4 H100 table, ring", 56.02, {"seq": 4}, RING),
    Case("flux-dev 4xH100 unified_balanced", f"{GUIDE}: 4 H100 table, unified_balanced", 33.85,
         {"ring": 2, "seq": 2}, USP),
    Case("flux-dev 4xL20 ulysses 1024", f"{GUIDE}: 4 L20 table, ulysses 1024x1024", 37.11, {"seq": 4}, ULYSSES),
    Case("flux-dev 4xL20 ring 1024", f"{GUIDE}: 4 L20 table, ring 1024x1024", 37.01, {"seq": 4}, RING),
    Case("flux-dev 4x4090 ulysses 1024", f"{GUIDE}: 4 RTX 4090 (48GB) table, ulysses 1024x1024", 33.83,
         {"seq": 4}, ULYSSES),
    Case("flux-dev 4x4090 ring 1024", f"{GUIDE}: 4 RTX 4090 (48GB) table, ring 1024x1024", 33.83, {"seq": 4}, RING),
)


def predict_case(case: Case) -> dict:
    hardware = load_hardware("h100").using(4)
    strategy = Strategy.model_validate({
        "name": case.name, "model": "flux-dev", "hardware": "h100", "mesh": case.mesh,
        "rules": [{"match": "*", "shard": "replicate"}], "activations": case.activations,
        "workload": {"height": 1024, "width": 1024, "steps": 28, "cfg": False, "text_tokens": 512},
        "placement": {"text_encoder": "device", "vae": "device"}, "compile": {"elementwise": "eager"}})
    chip = memory_report(make_plan(strategy, load_card("flux-dev"), hardware.chips), strategy,
                         hardware.usable_hbm_bytes, 0).most_loaded
    return {"case": case.name, "source": case.source, "measured_gb": case.measured_gb,
            "predicted_bytes": chip.total, "peak_phase": chip.peak_phase,
            "ratio_if_gb": chip.total / (case.measured_gb * 1e9),
            "ratio_if_gib": chip.total / (case.measured_gb * 2**30)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    rows = [predict_case(c) for c in CASES]
    if parser.parse_args().json:
        print(json.dumps(rows, indent=1))
        return
    for r in rows:
        print(f"{r['case']:<36} measured {r['measured_gb']:6.2f} GB  predicted {r['predicted_bytes'] / 1e9:6.2f} GB "
              f"({r['predicted_bytes'] / 2**30:6.2f} GiB, peak {r['peak_phase']})  ratio {r['ratio_if_gb']:.2f} "
              f"(if GB) / {r['ratio_if_gib']:.2f} (if GiB)")


if __name__ == "__main__":
    main()
