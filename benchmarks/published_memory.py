"""Predict published, measured peak memory per GPU with meshlab's memory model; print the ratios.

    python benchmarks/published_memory.py [--json]

Each case names its source and the layout it ran; meshlab plans the same layout on the catalog's GPU (memory per
chip does not depend on which GPU, only whether it fits) and reports its per-chip total without the runtime
reserve, which ``torch.cuda.max_memory_allocated`` (what such tables print) does not count. The sources print
"GB" without saying whether that is 10^9 or 2^30 bytes, so both ratios are given. A check, never a fit.

The FLUX.1-dev cases: diffusers' distributed-inference guide (docs/source/en/training/distributed_inference.md,
diffusers main of 2026), FLUX.1-dev with the whole pipeline on each of 4 GPUs (``DiffusionPipeline.from_pretrained(...,
torch_dtype=bfloat16).to(device)``, then ``enable_parallelism(ContextParallelConfig(...))`` on the transformer), at
1024x1024 (the L20 and 4090 tables say so; the H100 table does not, and 1024x1024 is FluxPipeline's default).
Each table's backends are the four GPUs as one Ulysses group of 4, one ring of 4, or USP 2 x 2 ("unified_balanced").
The Wan 2.1 cases: Wan's own README table of its official multi-GPU runs (FSDP of the DiT and of T5, Ulysses).
"""

from __future__ import annotations

import argparse
import json
import math
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


FLUX_WORKLOAD = {"height": 1024, "width": 1024, "steps": 28, "cfg": False, "text_tokens": 512}


@dataclass(frozen=True)
class Case:
    name: str
    source: str
    measured_gb: float
    mesh: dict
    activations: dict
    model: str = "flux-dev"
    hardware: str = "h100"
    rules: tuple = ({"match": "*", "shard": "replicate"},)
    workload: dict | None = None  # None: FLUX_WORKLOAD
    text_encoder: str = "device"
    vae_dtype: str | None = None  # None: the workload's dtype
    encoders: tuple = ()  # (name, place) of an encoder placed otherwise than text_encoder


#: Wan2.1's own multi-GPU table (README 9737cba, "Computational Efficiency on Different GPUs", assets/comp_effic.png,
#: "Total time (s) / peak GPU memory (GB)"), run as its README's multi-GPU command `torchrun --nproc_per_node=N
#: generate.py ... --dit_fsdp --t5_fsdp --ulysses_size N`: the DiT and T5 sharded over the N GPUs (FSDP), Ulysses N
#: over the self-attention, the VAE on every GPU (rank 0 decodes), 720P x 81 frames. The 1-GPU rows
#: (--offload_model True) are left out. Whether its memory is max_memory_allocated or reserved is not stated. Its
#: code holds the DiT in float32 (wan/text2video.py: `WanModel.from_pretrained(checkpoint_dir)`, no torch_dtype; FSDP
#: MixedPrecision(param_dtype=bfloat16) keeps the shards in float32 and gathers in bfloat16, autocast computes in
#: bfloat16) and the VAE in float32 (wan/modules/vae.py: `WanVAE(..., dtype=torch.float)`); T5 in bfloat16
#: (t5_dtype), sharded. I2V's CLIP image encoder is built whole on every GPU (image2video.py passes it no shard_fn):
#: `placement.encoders: {image_encoder: device}` beside `text_encoder: sharded`.
WAN = "Wan-Video/Wan2.1 README (9737cba), Computational Efficiency on Different GPUs (assets/comp_effic.png)"
WAN_ULYSSES = {"sequence": "seq", "sequence_parallel": "xdit", "rules": [
    {"point": "block.input", "stream": "image", "spec": [None, "seq", None]},
    {"point": "attention.qkv", "attention": "self", "spec": [None, None, "seq"]},
    {"point": "attention.output", "attention": "self", "spec": [None, "seq", None]}]}
WAN_FSDP = ({"match": "blocks.*", "min_rank": 2, "shard": "largest", "axis": "seq"},
            {"match": "*", "shard": "replicate"})


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
    *(Case(f"wan {model} {n}x{gpu} fsdp+ulysses 720p", f"{WAN}, {gpu} row, {model}", measured, {"seq": n},
           WAN_ULYSSES, card, gpu.lower().replace("a100", "a100-80gb"), WAN_FSDP,
           {"height": 720, "width": 1280, "frames": 81, "steps": steps, "cfg": True, "text_tokens": 512,
            "weights_dtype": "float32"}, "sharded", "float32", (("image_encoder", "device"),) if "I2V" in model else ())
      for gpu, model, card, steps, peaks in (
          ("H100", "T2V-14B", "wan-2.1-t2v-14b", 50, (53.9, 37.9, 29.9)),
          ("H100", "I2V-14B", "wan-2.1-i2v-14b", 40, (59.8, 41.9, 32.9)),
          ("A100", "T2V-14B", "wan-2.1-t2v-14b", 50, (52.5, 36.6, 28.6)),
          ("A100", "I2V-14B", "wan-2.1-i2v-14b", 40, (58.5, 40.6, 31.6)))
      for n, measured in zip((2, 4, 8), peaks)),
)


def predict_case(case: Case) -> dict:
    hardware = load_hardware(case.hardware).using(math.prod(case.mesh.values()))
    strategy = Strategy.model_validate({
        "name": case.name, "model": case.model, "hardware": case.hardware, "mesh": case.mesh,
        "rules": list(case.rules), "activations": case.activations, "workload": case.workload or FLUX_WORKLOAD,
        "placement": {"text_encoder": case.text_encoder, "encoders": dict(case.encoders), "vae": "device",
                      "vae_dtype": case.vae_dtype},
        "compile": {"elementwise": "eager"}})
    chip = memory_report(make_plan(strategy, load_card(case.model), hardware.chips), strategy,
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
