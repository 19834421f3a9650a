"""Eager PyTorch's launch floor on one CUDA GPU: kernels per transformer block, and a block's time against its
tokens (issue 26, part 3).

For each card, the transformer at 1 and 2 blocks per list (real width, random bf16 weights, meshlab's forward
inputs), run eagerly: the CUDA kernels of one forward (torch.profiler) and the wall time of a forward at several
image sizes; the difference between 2 and 1 blocks is one block of each list. Where a block's time stops falling
with fewer tokens, the host's launches bound it: kernels x the per-launch cost (benchmarks/cuda_launch_cost.py).
JSON on stdout.

    PYTHONPATH=. python3 benchmarks/gpu_eager_blocks.py > eager.json
"""

from __future__ import annotations

import json
import statistics
import time

CARDS = ("qwen-image", "flux-dev")
SIDES = (128, 256, 512, 1024)  # image height = width in pixels


def wall(fn, reps: int = 10) -> float:
    import torch

    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    seconds = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def kernels(fn) -> int:
    """CUDA kernels one call launches (the profiler's device-side kernel events)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def main() -> None:
    import torch

    from meshlab.backend.models import build_model, example_inputs, forward, geometry
    from meshlab.cards.card import load_card

    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": []}
    for name in CARDS:
        card = load_card(name)
        models = {n: build_model(card, n, "bfloat16", 0).cuda() for n in (1, 2)}
        for side in SIDES:
            geo = geometry(card, side, side, 32, 1)
            inputs = {k: v.cuda() if isinstance(v, torch.Tensor) else v
                      for k, v in example_inputs(card, geo, "bfloat16", 0).items()}
            row = {"model": name, "side": side, "image_tokens": geo.image_tokens, "text_tokens": 32}
            with torch.no_grad():
                for n, model in models.items():
                    row[f"wall_s_{n}"] = wall(lambda: forward(model, inputs))
                    row[f"kernels_{n}"] = kernels(lambda: forward(model, inputs))
            row["block_s"] = row["wall_s_2"] - row["wall_s_1"]
            row["block_kernels"] = row["kernels_2"] - row["kernels_1"]
            results["cases"].append(row)
        del models
        torch.cuda.empty_cache()
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
