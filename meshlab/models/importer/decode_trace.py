"""What a VAE decode costs, from the real decoder's ops (needs torch): the card's decode figures.

Decodes of the VAE (float32, one sample; for a video VAE, decodes of 2 and 3 latent frames whose difference is one
latent frame in the steady state, see `trace_decode`), run on ``meta`` by the importer: every figure below follows
from the ops and their shapes, not their values, so the decoder's real module runs without computing anything
(HunyuanVideo's decodes took 70 s of convolutions on two CPU cores, 1 s on ``meta``). Each attention runs as one
fused op (`fused_attention`: torch's memory-efficient kernel's, as a GPU runs it), whose FLOPs torch counts; on the
CPU torch's fused kernel has no FLOP formula and went uncounted (4,267 FLOPs per pixel of HunyuanVideo's 24.8
million), and on ``meta`` torch's own choice is its math path (scores, softmax and copies a GPU does not run).

- **FLOPs**: torch's ``FlopCounterMode`` (convolutions, matmuls, attention) over a decode from an 8x8 latent
  (for a video VAE, see `trace_decode`).
- **HBM bytes**: the same decode under meshlab.models.importer.elementwise_trace's recorder. Every op that is not a
  convolution, matmul or attention (norms, activations, residual adds, pads, the causal caches' concatenations,
  upsampling) moves its tensors: eager (as diffusers runs a VAE on a GPU: each op reads and writes its own) and
  fused (as XLA compiles it: each gap between heavy ops moves what crosses its edges once); views and weights
  move nothing. Also the ops the host dispatches, eager's floor.
- **Working set**: the peak of the tensors the decode allocates, over two decodes (8x8 and 16x16 latents), tracked
  op by op (`live_tensors`: every storage an op returns counts from its creation until it is freed). Parameters and
  buffers are left out, and so is memory an op allocates and frees inside itself (a kernel's own scratch or
  workspace), and so is the decoded output,
  which the memory model adds at the pipeline's size. The bytes per output pixel are the slope between the two
  sizes, so what does not grow with the image (constants) is not multiplied by it.
- **A VAE that decodes in temporal tiles** (HunyuanVideo's: ``use_framewise_decoding``, tiles of
  ``tile_sample_min_num_frames`` frames every ``tile_sample_stride_num_frames``) is measured as it decodes a video:
  FLOPs, bytes and ops of one more tile (its overlap included) per output frame it adds, and the working set of a
  decode of one whole tile.

Every per-pixel figure is at 2 bytes an element (bfloat16): the pipeline decodes in the transformer's dtype.
The mid-block's attention grows with the square of the latent pixels; at 16x16 it is small (and the fused
attention holds no scores, as XLA's may), and ``tests/cost/test_pipeline_time.py`` holds the working set against
real decodes of other sizes on the CPU, measured by torch.profiler's memory timeline.

Why the tracker is written here: torch.profiler's memory timeline, which an earlier version read, has no public API
for its peak, and it leaves tensors uncategorised downstream of a tensor it cannot place (HunyuanVideo's VAE builds
its causal attention mask from ``arange`` inside the decode: everything after the mid-block's attention went
uncounted, 162 bytes per pixel for about 21,400). No library reports the peak of live tensors over a call on the
CPU; a ``TorchDispatchMode`` sees every op's outputs, and a finalizer on each storage says when it dies.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
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
    dispatches: int  # ops the host dispatches in one decode of one latent frame (a whole-video decoder: of a decode)
    working_latent_frames: int = 0  # video: the latent frames of the decode the working set was measured at
    working_growth_per_latent_frame: float = 0.0  # video: what the working set grows by per latent frame more
    #: video: copies of the decoded video held at its end: 2 where the decode concatenates pieces (frames, batches,
    #: tiles) into it, 1 where one decoder call makes the whole video (LTX-Video's, unless told to decode framewise)
    output_copies: int = 0


def trace_decode(vae: Any, latent_shape: Any, video: bool = False) -> Decode:
    """The figures of `vae` (an eval-mode diffusers VAE, on ``meta`` as the importer builds it: on the CPU torch's
    attention kernel is not counted); `latent_shape(side, frames)` is the shape of one sample's latent with `side` x
    `side` latent pixels and `frames` latent frames.

    An image model's VAE decodes one latent frame. A video VAE decodes the first latent frame alone and each
    later one into ``temporal_scale_factor`` frames, carrying causal caches: its FLOPs, bytes and ops are those
    of one such later latent frame (the difference between decodes of 3 and 2 latent frames) per pixel of the
    frames it makes, and its working set is that of a decode in that steady state (3 latent frames) less the
    decoded video it has accumulated, per pixel of one frame; a VAE that decodes in batches of latent frames or in
    temporal tiles is measured over one more batch or tile (see `_frames`), its dispatches per latent frame, and a
    whole-video decoder's dispatches are one decode's. A video VAE's working set also records its growth per latent
    frame past the measured decode, and the decoded video's copies it holds at once.
    """
    with fused_attention():
        return _trace_decode(vae, latent_shape, video)


def _trace_decode(vae: Any, latent_shape: Any, video: bool) -> Decode:
    import torch

    small, large = DECODE_LATENTS
    frames, working_frames, period = _frames(vae, video)
    before, after = (_traced(vae, torch.randn(latent_shape(small, n))) if n else (0.0, 0.0, 0.0, 0, 0)
                     for n in frames)
    flops, eager, fused, ops, pixels = (b - a for a, b in zip(before, after))
    (low, low_pixels), (high, high_pixels) = (live_peak(vae, torch.randn(latent_shape(side, working_frames)))
                                              for side in (small, large))
    working = (high - low) / (high_pixels - low_pixels) * CARD_ITEMSIZE / 4  # traced in float32
    per_latent_frame = max(1, frames[1] - frames[0])
    whole = video and getattr(vae, "use_framewise_decoding", None) is False  # one decoder call over every frame
    # a whole-video decoder dispatches the same ops whatever its frames: one decode's, once per decode
    dispatches = after[3] if whole else round(ops / per_latent_frame)
    decode = Decode(flops / pixels, eager / pixels, fused / pixels, working, dispatches)
    if not video:
        return decode
    longer, _ = live_peak(vae, torch.randn(latent_shape(small, working_frames + period)))
    growth = max(0.0, (longer - low) / low_pixels / period * CARD_ITEMSIZE / 4)
    return replace(decode, working_latent_frames=working_frames, working_growth_per_latent_frame=growth,
                   output_copies=1 if whole else 2)


def _frames(vae: Any, video: bool) -> tuple[tuple[int, int], int, int]:
    """The latent frames of the two decodes whose difference is traced, of the decode whose working set is
    measured, and the period (in latent frames) over which the working set's growth is measured.

    - An image: 0 and 1; 1.
    - A video VAE: 2 and 3; 3, every 1 (Wan's decodes a latent frame at a time with its caches: 3 is past the
      first).
    - A VAE that decodes its latent frames in batches of `b` with caches, the first batch taking the remainder
      (CogVideoX's: 2): `b` + 1 and 2`b` + 1, which differ by one batch after the first (the batches of the two
      are 3, and 3 and 2); 2`b` + 1, every `b`.
    - A VAE that decodes in temporal tiles of `t` + 1 latent frames every `s` (HunyuanVideo's: 5 every 3): `s` + 2
      and 2`s` + 2, which differ by one whole tile (the tiles of the two are 5 and 2, and 5, 5 and 2); `t` + 1, one
      whole tile, every `s`.
    """
    if not video:
        return (0, 1), 1, 1
    config = vae.config
    if getattr(vae, "use_framewise_decoding", False) and hasattr(vae, "tile_sample_stride_num_frames"):
        ratio = config.temporal_compression_ratio
        tile, stride = vae.tile_sample_min_num_frames // ratio, vae.tile_sample_stride_num_frames // ratio
        return (stride + 2, 2 * stride + 2), tile + 1, stride
    batch = getattr(vae, "num_latent_frames_batch_size", 1)
    if batch > 1 and not hasattr(vae, "use_framewise_decoding"):  # LTX-Video's is for its framewise tiles only
        return (batch + 1, 2 * batch + 1), 2 * batch + 1, batch
    return (2, 3), 3, 1


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


def live_peak(vae: Any, latent: Any) -> tuple[int, int]:
    """Peak bytes of the tensors one real decode holds (the latent and what its ops make; parameters, buffers and
    ops' internal scratch aside) less its output, and the output's pixels of one frame."""
    import torch

    with torch.no_grad(), live_tensors(exclude=(*vae.parameters(), *vae.buffers(), latent)) as live:
        image = vae.decode(latent).sample
    held = latent.untyped_storage().nbytes()  # the input is live throughout (its slices are views of it)
    return held + live.peak - image.numel() * image.element_size(), image.shape[-1] * image.shape[-2]


def fused_attention() -> Any:
    """A ``TorchFunctionMode`` that runs ``F.scaled_dot_product_attention`` on ``meta`` as torch's memory-efficient
    attention op (``aten._scaled_dot_product_efficient_attention``): one fused op, without the scores, that torch's
    FLOP counter counts, where ``meta`` would take the math path. A mask becomes the additive bias the op takes,
    broadcast to [batch, heads, queries, keys]; grouped heads (``enable_gqa``, as transformers' text encoders
    attend) have their keys and values repeated to the query's heads first (a copy a fused GQA kernel does not make:
    one layer's keys and values, freed with the call). Off ``meta`` (the op has no CPU kernel) and on 3-D inputs the
    call runs as made."""
    import torch
    from torch.overrides import TorchFunctionMode

    sdpa = torch.nn.functional.scaled_dot_product_attention

    class FusedAttention(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = dict(kwargs or {})
            if func is not sdpa:
                return func(*args, **kwargs)
            names = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")
            call = {**dict(zip(names, args)), **kwargs}
            q, k, v, mask = call["query"], call["key"], call["value"], call.get("attn_mask")
            if q.device.type != "meta" or q.dim() != 4:  # the op's own limits: as called
                return func(*args, **kwargs)
            if call.get("enable_gqa") and k.shape[1] != q.shape[1]:  # grouped heads: the op takes the query's
                k, v = (t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))
            if mask is not None:
                if mask.dtype == torch.bool:
                    mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill(~mask, float("-inf"))
                mask = mask.expand(*q.shape[:-2], q.shape[-2], k.shape[-2])
            return torch.ops.aten._scaled_dot_product_efficient_attention(
                q, k, v, mask, False, call.get("dropout_p", 0.0), call.get("is_causal", False),
                scale=call.get("scale"))[0]

    return FusedAttention()


def live_tensors(exclude=()) -> Any:
    """A ``TorchDispatchMode`` (torch's documented hook on every op; built on use, so importing this module needs no
    torch) whose ``peak`` is the most bytes the storages ops returned held at once while it was entered: each storage
    counts once, from the op that returns it until it is freed (a finalizer on the storage's Python object, which
    torch keeps for the storage's life, and whose identity keys it: a ``meta`` storage has no address); views and
    in-place results add nothing, and `exclude`'s storages never count."""
    import weakref

    from torch.utils._python_dispatch import TorchDispatchMode

    def tensors(value: Any):
        if isinstance(value, (tuple, list)):
            for item in value:
                yield from tensors(item)
        elif hasattr(value, "untyped_storage"):
            yield value

    class LiveTensors(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.excluded = {id(t.untyped_storage()) for t in exclude}
            self.live: dict[int, int] = {}
            self.current = self.peak = 0

        def _free(self, key: int, nbytes: int) -> None:
            if self.live.get(key) == nbytes:
                del self.live[key]
                self.current -= nbytes

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for tensor in tensors(out):
                storage = tensor.untyped_storage()
                key, nbytes = id(storage), storage.nbytes()
                if nbytes == 0 or key in self.excluded or key in self.live:
                    continue
                self.live[key] = nbytes
                self.current += nbytes
                weakref.finalize(storage, self._free, key, nbytes)
            self.peak = max(self.peak, self.current)
            return out

    return LiveTensors()
