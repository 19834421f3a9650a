"""Eager PyTorch's launch floor on one CUDA GPU: kernels per transformer block, and a block's time against its
tokens (issue 26, part 3).

For each card, the transformer at 1 and 2 blocks per list (real width, random bf16 weights, meshlab's forward
inputs), run eagerly: the CUDA kernels of one forward (torch.profiler) and the wall time of a forward at several
image sizes; the difference between 2 and 1 blocks is one block of each list. Where a block's time stops falling
with fewer tokens, the host's launches bound it: kernels x the per-launch cost (benchmarks/cuda_launch_cost.py).
JSON on stdout. `--blocks 4,12` times the difference over 8 blocks instead of 1 (less noise; a forward that long
queues kernels as a whole denoising call does), where each forward also gives the seconds per op the card traced
(`traced_ops_N`: every block list's count x N plus the rest of the forward, meshlab.cost.layout.eager_dispatches).

    PYTHONPATH=. python3 benchmarks/gpu_eager_blocks.py > eager.json
    PYTHONPATH=. python3 benchmarks/gpu_eager_blocks.py --blocks 4,12 --sides 128,256,512 > eager-12.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

CARDS = ("qwen-image", "flux-dev")
SIDES = (128, 256, 512, 1024)  # image height = width in pixels


def wall(fn, reps: int = 20) -> tuple[float, float]:
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
    return statistics.median(seconds), min(seconds)


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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", default="1,2", help="two block counts per list, fewer first")
    parser.add_argument("--sides", default=",".join(map(str, SIDES)), help="image sides in pixels")
    parser.add_argument("--cards", default=",".join(CARDS))
    parser.add_argument("--repeat", type=int, default=1, help="time every side this many times (the host's noise)")
    parser.add_argument("--text-mask", action="store_true",
                        help="pass Qwen-Image an all-ones text mask (its pipeline drops one: the masked attention is "
                        "slower to dispatch)")
    args = parser.parse_args()
    low, high = (int(n) for n in args.blocks.split(","))
    import torch

    from meshlab.models.families import geometry
    from meshlab.models.importer.build import build_model, example_inputs, forward
    from meshlab.models.card import load_card
    from meshlab.models.truncate import truncate_card
    from meshlab.cost.layout import eager_dispatches

    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "blocks": [low, high],
               "cases": []}
    for name in args.cards.split(","):
        card = load_card(name)
        models = {n: build_model(card, n, "bfloat16", 0).cuda() for n in (low, high)}
        for side in [int(s) for s in args.sides.split(",")] * args.repeat:
            geo = geometry(card, side, side, 32, 1)
            inputs = {k: v.cuda() if isinstance(v, torch.Tensor) else v
                      for k, v in example_inputs(card, geo, "bfloat16", 0).items()}
            if not args.text_mask and "encoder_hidden_states_mask" in inputs:
                # QwenImagePipeline passes None for a mask of all ones (pipeline_qwenimage.py, encode_prompt)
                inputs["encoder_hidden_states_mask"] = None
            row = {"model": name, "side": side, "image_tokens": geo.image_tokens, "text_tokens": 32,
                   "text_mask": inputs.get("encoder_hidden_states_mask") is not None}
            with torch.no_grad():
                for n, model in models.items():
                    row[f"wall_s_{n}"], row[f"wall_min_s_{n}"] = wall(lambda: forward(model, inputs))
                    row[f"kernels_{n}"] = kernels(lambda: forward(model, inputs))
                    row[f"traced_ops_{n}"] = eager_dispatches(truncate_card(card, n))
            row["block_s"] = (row[f"wall_s_{high}"] - row[f"wall_s_{low}"]) / (high - low)
            row["block_kernels"] = (row[f"kernels_{high}"] - row[f"kernels_{low}"]) / (high - low)
            results["cases"].append(row)
        del models
        torch.cuda.empty_cache()
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
