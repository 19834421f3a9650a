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

Each figure is the median of CUDA-event timings after warm-up, with events around one call: a short call's figure
then also holds the host's dispatch of that call while the GPU waits for it. To tell the GPU's own cost per call
(what a compiled ring, whose host runs ahead, pays) from that dispatch (which meshlab prices apart, as eager PyTorch's
launches), the short sequences' figures (at most ``SHORT`` tokens: Flux's and Qwen-Image's; Wan's passes run for
milliseconds) are also timed two more ways:

- ``pass_queued_s``, ``merge_queued_s``, ``ring_queued_s``, ``ulysses_queued_s``: several calls issued back to back
  between one pair of events, per call: once the host runs ahead of the GPU, the GPU's time per call, its kernels'
  own start and tail included;
- ``pass_graph_s``, ``ring_graph_s``, ``merge_graph_s``: the pass, the whole ring and one merge (as ``merge_s``)
  captured in a CUDA graph and replayed: no host work at all (None where capture fails, the errors in
  ``graph_error``); ``add_graph_s``: a float32 add of a merge's elements alike (``add_bytes`` read and written), the
  bandwidth a plain streaming kernel of that size reaches.

JSON on stdout.

    python3 benchmarks/gpu_ring_attention.py > ring.json
"""

from __future__ import annotations

import json
import statistics

#: (name, batch, heads, tokens, head dim): Qwen-Image and Flux at 1024x1024 (4096 image + 512 text tokens), Wan
#: 2.1 14B at 1280x720 x 81 frames (21 latent frames x 45 x 80 patches = 75,600 tokens, 40 heads).
CASES = (("qwen-image/flux 1024x1024", 1, 24, 4608, 128), ("wan-2.1-14b 720p x 81", 1, 40, 75600, 128))
DEGREES = (2, 4, 8)
#: calls issued back to back between one pair of events (``*_queued_s``)
QUEUED = 20
#: the queued and graph timings are taken for sequences this short (Flux's, Qwen-Image's): Wan's passes run for
#: milliseconds, far past any dispatch
SHORT = 8192


def timed(fn, reps: int = 10, warm: int = 3, calls: int = 1) -> float:
    """Seconds per call, the median of `reps` timings of `calls` calls issued back to back between one pair of
    events (one call: the host's dispatch of it shows where the GPU waits for it)."""
    import torch

    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    seconds = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            fn()
        end.record()
        torch.cuda.synchronize()
        seconds.append(start.elapsed_time(end) / 1e3 / calls)
    return statistics.median(seconds)


def timed_queued(fn, calls: int = QUEUED, reps: int = 5) -> float:
    """Seconds per call with `calls` calls queued between one pair of events (the median of `reps`)."""
    return timed(fn, reps=reps, calls=calls)


def timed_graph(fn, calls: int = QUEUED, reps: int = 5) -> tuple[float | None, str | None]:
    """Seconds per call of `fn` captured `calls` times in one CUDA graph and replayed (no host work between the
    kernels), or (None, the error) where capture fails."""
    import torch

    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # warm-up on a side stream, as torch.cuda.graphs asks before capture
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        graph.replay()
        torch.cuda.synchronize()
    except Exception as exc:  # a kernel that cannot be captured: say which, keep the other figures
        try:
            torch.cuda.synchronize()
        except Exception:
            pass
        return None, f"{type(exc).__name__}: {exc}"[:300]
    seconds = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        seconds.append(start.elapsed_time(end) / 1e3 / calls)
    return statistics.median(seconds), None


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
            if n_tokens <= SHORT:  # short passes: where the host's dispatch can show in a one-call timing
                case["pass_queued_s"] = timed_queued(lambda: flash(q, k, v))
                case["merge_queued_s"] = timed_queued(lambda: merge(o0.float(), l0, o0, l0))
                case["ring_queued_s"] = timed_queued(ring, calls=4)
                case["ulysses_queued_s"] = timed_queued(lambda: flash(uq, uk, uv), calls=4)
                case["pass_graph_s"], pass_error = timed_graph(lambda: flash(q, k, v))
                case["ring_graph_s"], ring_error = timed_graph(ring, calls=2)
                # the merge alone, and a plain float32 add of the same elements (12 bytes each), from a graph:
                # what the merge's kernels reach of the HBM against a streaming kernel of the same size
                case["merge_graph_s"], merge_error = timed_graph(lambda: merge(o0.float(), l0, o0, l0))
                a32, b32 = o0.float(), torch.randn_like(o0, dtype=torch.float32)
                case["add_graph_s"], add_error = timed_graph(lambda: a32 + b32)  # two tensors read, one written
                case["add_bytes"] = 3 * a32.numel() * 4
                case["graph_error"] = "; ".join(e for e in (pass_error, ring_error, merge_error, add_error)
                                                if e) or None
            results["cases"].append(case)
            del q, k, v, blocks, uq, uk, uv
            torch.cuda.empty_cache()
    print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
