"""What a VAE decode costs, from the real decoder run on the CPU (needs torch): the card's decode figures.

Real decodes of the VAE (random weights, float32, one sample; for a video VAE, decodes of 2 and 3 latent frames
whose difference is one latent frame in the steady state, see `trace_decode`):

- **FLOPs**: torch's ``FlopCounterMode`` (convolutions, matmuls, attention) over a decode from an 8x8 latent
  (for a video VAE, see `trace_decode`).
- **HBM bytes**: the same decode under meshlab.models.importer.elementwise_trace's recorder. Every op that is not a
  convolution, matmul or attention (norms, activations, residual adds, pads, the causal caches' concatenations,
  upsampling) moves its tensors: eager (as diffusers runs a VAE on a GPU: each op reads and writes its own) and
  fused (as XLA compiles it: each gap between heavy ops moves what crosses its edges once); views and weights
  move nothing. Also the ops the host dispatches, eager's floor.
- **Working set, measured**: the peak of the tensors the decode allocates, from torch.profiler's memory
  timeline, over two real decodes (8x8 and 16x16 latents). The parameters' category is left out, and so is
  memory the profiler ties to no tensor (the CPU convolutions' own scratch, which a GPU's kernels replace with
  their workspaces), and so is the decoded output, which the memory model adds at the pipeline's size. The
  bytes per output pixel are the slope between the two sizes, so what does not grow with the image (the
  latent, constants) is not multiplied by it.

Every per-pixel figure is at 2 bytes an element (bfloat16): the pipeline decodes in the transformer's dtype.
The mid-block's attention grows with the square of the latent pixels; at 16x16 it is small (and on the CPU
torch's attention does not hold its scores, as XLA's may), and ``tests/cost/test_pipeline_time.py`` holds the
working set against decodes of other sizes. torch.profiler's memory timeline has no API that
returns its peak: ``MemoryProfileTimeline`` is read in `_tensor_peak`, the one place that leans on it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: The latent sides of the decodes: the smaller traces FLOPs and bytes; the two give the working set's slope.
DECODE_LATENTS = (8, 16)
#: bfloat16: the per-pixel figures' element size.
CARD_ITEMSIZE = 2


@dataclass(frozen=True)
class Decode:
    """One sample's decode, per output pixel (of one frame; see `trace_decode` for a video VAE)."""

    flops_per_pixel: float
    eager_bytes_per_pixel: float
    fused_bytes_per_pixel: float
    working_bytes_per_pixel: float
    dispatches: int  # ops the host dispatches in one decode of one latent frame


def trace_decode(vae: Any, latent_shape: Any, video: bool = False) -> Decode:
    """The figures of `vae` (an eval-mode diffusers VAE on the CPU); `latent_shape(side, frames)` is the shape of
    one sample's latent with `side` x `side` latent pixels and `frames` latent frames.

    An image model's VAE decodes one latent frame. A video VAE decodes the first latent frame alone and each
    later one into ``temporal_scale_factor`` frames, carrying causal caches: its FLOPs, bytes and ops are those
    of one such later latent frame (the difference between decodes of 3 and 2 latent frames) per pixel of the
    frames it makes, and its working set is that of a decode in that steady state (3 latent frames) less the
    decoded video it has accumulated, per pixel of one frame.
    """
    import torch

    small, large = DECODE_LATENTS
    frames = (2, 3) if video else (0, 1)  # the difference of two decodes (0: none, for one image)
    before, after = (_traced(vae, torch.randn(latent_shape(small, n))) if n else (0.0, 0.0, 0.0, 0, 0)
                     for n in frames)
    flops, eager, fused, ops, pixels = (b - a for a, b in zip(before, after))
    (low, low_pixels), (high, high_pixels) = (_tensor_peak(vae, torch.randn(latent_shape(side, frames[1])))
                                              for side in (small, large))
    working = (high - low) / (high_pixels - low_pixels) * CARD_ITEMSIZE / 4  # traced in float32
    return Decode(flops / pixels, eager / pixels, fused / pixels, working, ops)


def _traced(vae: Any, latent: Any) -> tuple[float, float, float, int, int]:
    """FLOPs, eager and fused bytes (at `CARD_ITEMSIZE`), ops dispatched and output pixels (all frames) of one
    decode."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from meshlab.models.importer.elementwise_trace import record_call

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        image = vae.decode(latent).sample
    recorder = record_call(vae, lambda: vae.decode(latent))
    eager, fused = recorder.moved_bytes(CARD_ITEMSIZE)
    return counter.get_total_flops(), eager, fused, len(recorder.ops), image[0, 0].numel()


def _tensor_peak(vae: Any, latent: Any) -> tuple[int, int]:
    """Peak bytes of the tensors one real decode allocates (parameters and untied memory aside; see the module's
    docstring) less its output, and the output's pixels of one frame."""
    import torch
    from torch.profiler import ProfilerActivity, profile
    from torch.profiler import _memory_profiler as memory

    with torch.no_grad(), profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                                  with_stack=True) as prof:
        image = vae.decode(latent).sample
    _, sizes = memory.MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline("cpu")
    # column 0 is unused; a category's column is its index + 1
    skip = {memory._CATEGORY_TO_INDEX[memory.Category.PARAMETER] + 1, memory._CATEGORY_TO_INDEX[None] + 1, 0}
    peak = max((sum(v for i, v in enumerate(row) if i not in skip) for row in sizes), default=0)
    return peak - image.numel() * image.element_size(), image.shape[-1] * image.shape[-2]
