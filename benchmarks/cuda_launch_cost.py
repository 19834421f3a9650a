"""Eager PyTorch's host cost per kernel launch on this CUDA device (issue 26, part 3), as JSON on stdout.

For each op, `n` launches on tiny tensors back to back and one synchronize at the end: the GPU finishes each
kernel in a few microseconds, so the wall time per launch is the host's dispatch cost (Python, the dispatcher,
the CUDA launch), the floor an eager run pays per kernel however small its shard. One launch with a synchronize
after it (what meshlab profile's ``dispatch`` point times) is given beside it for comparison.

    python3 benchmarks/cuda_launch_cost.py [--n 2000] > launch.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time


def per_launch(fn, n: int, sync, rounds: int = 5) -> float:
    """Median over `rounds` of the wall seconds per call of `n` calls of `fn` then one `sync`."""
    for _ in range(50):
        fn()
    sync()
    seconds = []
    for _ in range(rounds):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        seconds.append((time.perf_counter() - start) / n)
    return statistics.median(seconds)


def main() -> None:
    import torch
    import torch.nn.functional as F

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device")
    dev, bf16 = "cuda", torch.bfloat16
    x = torch.randn(8, 64, device=dev, dtype=bf16)
    w = torch.randn(64, 64, device=dev, dtype=bf16)
    q = torch.randn(1, 2, 16, 64, device=dev, dtype=bf16)
    norm = torch.nn.LayerNorm(64, device=dev, dtype=bf16)
    ops = {
        "add (elementwise)": lambda: x + 1,
        "mul by tensor (elementwise, 2 inputs)": lambda: x * x,
        "linear (cuBLAS GEMM)": lambda: F.linear(x, w),
        "layer_norm": lambda: norm(x),
        "silu": lambda: F.silu(x),
        "scaled_dot_product_attention": lambda: F.scaled_dot_product_attention(q, q, q),
    }
    sync = torch.cuda.synchronize
    result = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "n": args.n,
              "per_launch_us": {name: round(per_launch(fn, args.n, sync) * 1e6, 2) for name, fn in ops.items()},
              "one_launch_and_sync_us": round(per_launch(lambda: (x + 1, sync()), 200, sync) * 1e6, 2)}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
