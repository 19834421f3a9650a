"""Ring attention's passes on one CUDA GPU, against Ulysses' local attention, at real DiT sequence lengths (issue 26).

A ring of n ranks splits the joint sequence of N tokens n ways. Each rank runs n passes: its N/n queries against
one N/n block of keys and values (flash attention, which also returns the log-sum-exp), then merges the partial
output into its running one (ring-flash-attention's ``_update_out_and_lse``: a sigmoid-weighted update in
float32), while the next block arrives from its neighbour. Ulysses instead runs one attention over the whole
sequence on h/n of the heads. Both do the same FLOPs per rank; what differs is the kernel's rate at the shorter
key length, the merges, and the launches. This times, on one GPU, what one rank computes (not the transfers):

- ``pass_s``: one flash pass, N/n queries x N/n keys, all h heads;
- ``merge_s``: one merge of a partial output [b, N/n, h, d] and its log-sum-exp;
- ``ring_s``: the n passes and n - 1 merges back to back, as a rank runs them;
- ``ulysses_s``: one flash attention, N queries x N keys, h/n heads.

Each figure is the median of CUDA-event timings after warm-up. JSON on stdout.

    python3 benchmarks/gpu_ring_attention.py > ring.json
"""

from __future__ import annotations

import json
import statistics

#: (name, batch, heads, tokens, head dim): Qwen-Image and Flux at 1024x1024 (4096 image + 512 text tokens), Wan
#: 2.1 14B at 1280x720 x 81 frames (21 latent frames x 45 x 80 patches = 75,600 tokens, 40 heads).
CASES = (("qwen-image/flux 1024x1024", 1, 24, 4608, 128), ("wan-2.1-14b 720p x 81", 1, 40, 75600, 128))
DEGREES = (2, 4, 8)


def timed(fn, reps: int = 10, warm: int = 3) -> float:
    import torch

    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    seconds = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        seconds.append(start.elapsed_time(end) / 1e3)
    return statistics.median(seconds)


def flash(q, k, v):
    """(output [b, h, s, d], log-sum-exp [b, h, s]) of FlashAttention-2 through PyTorch's aten op."""
    import torch

    out = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v)
    return out[0], out[1]


def merge(out, lse, block_out, block_lse):
    """ring-flash-attention's update: the running output (float32) and log-sum-exp absorb one block's."""
    import torch.nn.functional as F

    block_out = block_out.float()
    out = out - F.sigmoid(block_lse - lse).unsqueeze(-1) * (out - block_out)
    lse = lse - F.logsigmoid(lse - block_lse)
    return out, lse


def main() -> None:
    import torch

    assert torch.cuda.is_available(), "needs a CUDA GPU"
    bf16 = torch.bfloat16
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "cases": []}
    for name, b, h, n_tokens, d in CASES:
        for n in DEGREES:
            local = n_tokens // n
            q, k, v = (torch.randn(b, h, local, d, device="cuda", dtype=bf16) for _ in range(3))
            blocks = [(torch.randn(b, h, local, d, device="cuda", dtype=bf16),
                       torch.randn(b, h, local, d, device="cuda", dtype=bf16)) for _ in range(n)]
            o0, l0 = flash(q, k, v)

            def ring():
                out, lse = flash(q, *blocks[0])
                out = out.float()
                for kb, vb in blocks[1:]:
                    bo, bl = flash(q, kb, vb)
                    out, lse = merge(out, lse, bo, bl)
                return out

            heads = max(1, h // n)
            uq, uk, uv = (torch.randn(b, heads, n_tokens, d, device="cuda", dtype=bf16) for _ in range(3))
            case = {"case": name, "degree": n, "batch": b, "heads": h, "tokens": n_tokens, "head_dim": d,
                    "pass_s": timed(lambda: flash(q, k, v)),
                    "merge_s": timed(lambda: merge(o0.float(), l0, o0, l0)),
                    "ring_s": timed(ring, reps=5),
                    "ulysses_s": timed(lambda: flash(uq, uk, uv), reps=5),
                    "pass_flops": 4.0 * b * h * local * local * d,
                    "ulysses_flops": 4.0 * b * heads * n_tokens * n_tokens * d,
                    "kv_block_bytes": 2 * b * h * local * d * 2}
            case["pass_tflops"] = case["pass_flops"] / case["pass_s"] / 1e12
            case["ulysses_tflops"] = case["ulysses_flops"] / case["ulysses_s"] / 1e12
            results["cases"].append(case)
            del q, k, v, blocks, uq, uk, uv
            torch.cuda.empty_cache()
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
