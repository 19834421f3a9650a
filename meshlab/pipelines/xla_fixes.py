"""What a Qwen-Image pipeline needs to run well under PyTorch/XLA: one small function per fix.

Each fix keeps the pipeline's numbers (checked in ``tests/pipelines/test_tiny_pipeline.py``) and removes one cause of
extra graphs, host syncs or CPU fallbacks:

- ``use_real_rope``: RoPE in real arithmetic instead of complex64. Complex ops are a known weak spot of
  PyTorch/XLA; XLA's CPU backend lowers diffusers' complex path without fallbacks, but every step graph then
  carries c64 values, and that path is untried on a TPU. With the fix the step graph has none.
- ``use_nearest_upsampling``: the VAE's ``nearest-exact`` 2x upsampling has no XLA lowering
  (``aten::_upsample_nearest_exact2d`` falls back to the CPU and splits the decode into several graphs); at an
  integer scale ``nearest`` picks the same source pixels and lowers.
- ``move_inputs_to``: a forward pre-hook that moves CPU tensors (per-step timestep, text masks) to the device, so
  the scheduler and the masks stay on the CPU: the scheduler indexes its timesteps and sigmas by step number,
  which on the device bakes the step into the graph (measured: one compile per step), and ``mask.all()`` on the
  device syncs the host.
- ``warm_rope_cache``: diffusers caches RoPE tables per device on the first forward; as lazy tensors they are
  ops in the first step's graph and device data in the second, so the second step compiles the whole transformer
  again. Materialising the cache before the loop makes both steps one graph.
- ``pad_prompt_pair``: cond and uncond prompt embeddings padded to one length (one shape for both forwards).
- ``choose_attention_backend``: the attention dispatcher's backend for a device kind.

And the checks that show whether they worked: ``compile_count`` (graphs compiled so far), ``fallback_counters``
(``aten::*`` counters: ops XLA could not lower and ran on the CPU), ``has_complex_values`` (complex types in a
pending graph), ``block`` (wait for the device, for timing).

Needs the ``xla`` extra; meshlab's core never imports this module. torch_xla itself is imported only where used.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from meshlab.parallelisms import xla
from meshlab.core.errors import BackendError, InputError

#: Attention dispatcher backend per device kind. ``_native_xla`` is PyTorch/XLA's flash attention (Pallas, TPU
#: only) and takes no mask; ``native`` is ``torch.nn.functional.scaled_dot_product_attention``, which XLA lowers
#: on any backend and which takes the text padding mask.
ATTENTION_BACKENDS: dict[str, str] = {"tpu": "_native_xla", "cpu": "native", "cuda": "native"}

#: Attention backends that accept ``attn_mask``; the runner keeps prompt masks only for these.
MASKED_BACKENDS = frozenset({"native"})


def choose_attention_backend(device_kind: str) -> str:
    """The attention dispatcher backend for `device_kind` (``"tpu"``, ``"cpu"`` or ``"cuda"``)."""
    try:
        return ATTENTION_BACKENDS[device_kind.lower()]
    except KeyError:
        valid = ", ".join(sorted(ATTENTION_BACKENDS))
        raise InputError(f"unknown device kind {device_kind!r}", f"use one of: {valid}") from None


def use_real_rope(transformer) -> None:
    """Make a Qwen-Image transformer apply RoPE in real arithmetic (float32 cos/sin), on every device.

    diffusers 0.42.1 has no device switch here: ``QwenDoubleStreamAttnProcessor2_0`` always calls
    ``apply_rotary_emb_qwen(..., use_real=False)`` and ``QwenEmbedRope`` builds its tables with ``torch.polar``
    (complex64), so XLA sees complex slicing, concatenation and multiplication every step. This stores the
    tables as ``view_as_real`` pairs (same memory layout: cos and sin interleaved) and routes the processor's
    call to ``_rotate_real`` when the table it gets is real. Transformers left alone keep complex tables and the
    original code path, so the patch is safe process-wide. Call it before the transformer's first forward:
    diffusers caches the tables per device.
    """
    from diffusers.models.transformers import transformer_qwenimage as qwen

    rope = transformer.pos_embed
    if not isinstance(rope, (qwen.QwenEmbedRope, qwen.QwenEmbedLayer3DRope)):
        raise BackendError(
            f"use_real_rope expects a QwenEmbedRope, found {type(rope).__name__}",
            "apply it to a diffusers QwenImageTransformer2DModel",
        )
    if rope.pos_freqs.is_complex():
        rope.pos_freqs = _as_real_pairs(rope.pos_freqs)
        rope.neg_freqs = _as_real_pairs(rope.neg_freqs)
    if not getattr(qwen.apply_rotary_emb_qwen, "_meshlab_real", False):
        qwen.apply_rotary_emb_qwen = _real_aware(qwen.apply_rotary_emb_qwen)


def _as_real_pairs(table):
    """[positions, dim/2] complex -> [positions, dim/2, 2] float32 (cos, sin)."""
    import torch

    return torch.view_as_real(table).contiguous()


def _real_aware(original):
    """Wrap diffusers' ``apply_rotary_emb_qwen``: real tables go to ``_rotate_real``, the rest to `original`."""

    @functools.wraps(original)
    def apply_rotary_emb_qwen(x, freqs_cis, use_real=True, use_real_unbind_dim=-1):
        if use_real or freqs_cis.is_complex():
            return original(x, freqs_cis, use_real, use_real_unbind_dim)
        return _rotate_real(x, freqs_cis)

    apply_rotary_emb_qwen._meshlab_real = True
    return apply_rotary_emb_qwen


def _rotate_real(x, freqs):
    """Rotate `x` ([batch, seq, heads, dim], pairs interleaved) by `freqs` ([seq, dim] or [seq, dim/2, 2]).

    The complex product (a + ib)(c + is) = (ac - bs) + i(as + bc), written out in float32 as the complex path
    computes it, so results agree to rounding.
    """
    import torch

    cos, sin = freqs.reshape(freqs.shape[0], 1, -1, 2).unbind(-1)  # [seq, 1, dim/2] each
    real, imag = x.float().reshape(*x.shape[:-1], -1, 2).unbind(-1)  # [batch, seq, heads, dim/2] each
    rotated = torch.stack([real * cos - imag * sin, real * sin + imag * cos], dim=-1)
    return rotated.flatten(3).type_as(x)


def use_nearest_upsampling(vae) -> int:
    """Switch the VAE's ``nearest-exact`` upsampling to ``nearest``; returns how many layers changed.

    At an integer scale s both modes read source pixel floor(i / s) (nearest-exact reads floor((i + 0.5) / s),
    the same integer), so outputs are identical; only ``nearest`` has an XLA lowering. Any non-integer scale is
    an error rather than a silent change of results.
    """
    import torch

    changed = 0
    for name, module in vae.named_modules():
        if isinstance(module, torch.nn.Upsample) and module.mode == "nearest-exact":
            _require_integer_scale(name, module.scale_factor)
            module.mode = "nearest"
            changed += 1
    return changed


def _require_integer_scale(name: str, scale) -> None:
    scales = scale if isinstance(scale, Sequence) else (scale,)
    if scale is None or any(float(s) != int(s) for s in scales):
        raise BackendError(
            f"VAE upsampling layer {name!r} has scale {scale}: nearest differs from nearest-exact there",
            "only integer scales can be switched to nearest",
        )


def move_inputs_to(module, device):
    """Register a forward pre-hook moving every tensor argument of `module` to `device`; returns its handle.

    Lets the caller keep per-step scalars and masks on the CPU (no host sync, no step number baked into the
    graph); each call's copy becomes a device-data input of the same graph.
    """
    import torch

    def to_device(value):
        if isinstance(value, torch.Tensor) and value.device != device:
            return value.to(device)
        return value

    def hook(_module, args, kwargs):
        return tuple(to_device(a) for a in args), {k: to_device(v) for k, v in kwargs.items()}

    return module.register_forward_pre_hook(hook, with_kwargs=True)


def warm_rope_cache(transformer, img_shapes, text_lengths, device) -> None:
    """Fill diffusers' per-device RoPE caches for these shapes and materialise them on `device` (one sync).

    `img_shapes` is what the transformer gets as ``img_shapes``; `text_lengths` the prompt lengths it will see.
    Call it after ``use_real_rope`` (the cache keeps whichever tables exist when it is filled).
    """
    import torch_xla

    for length in sorted(set(text_lengths)):
        transformer.pos_embed(img_shapes, max_txt_seq_len=length, device=device)
    torch_xla.sync()


def pad_prompt_pair(embeds, mask, negative_embeds, negative_mask):
    """Pad cond and uncond prompt embeddings (and masks) with zeros to one sequence length.

    ``encode_prompt`` returns ``mask=None`` when every token is real; an explicit all-ones mask replaces it so
    both forwards take the same arguments. Padded tokens are masked out of attention and sit after the real
    ones, so RoPE positions of real tokens do not move and the result does not change. Run on the CPU.
    Returns ``(embeds, mask, negative_embeds, negative_mask)``.
    """
    length = max(embeds.shape[1], negative_embeds.shape[1])
    return (*_pad_to(embeds, mask, length), *_pad_to(negative_embeds, negative_mask, length))


def _pad_to(embeds, mask, length: int):
    import torch

    batch, seq, width = embeds.shape
    if mask is None:
        mask = torch.ones(batch, seq, dtype=torch.long, device=embeds.device)
    pad = length - seq
    padded = torch.cat([embeds, embeds.new_zeros(batch, pad, width)], dim=1)
    return padded, torch.cat([mask, mask.new_zeros(batch, pad)], dim=1)


def drop_full_masks(*masks):
    """For attention backends without mask support: all-ones masks become None, any padding is an error."""
    for mask in masks:
        if mask is not None and not bool(mask.all()):
            raise BackendError(
                "this attention backend takes no mask but the prompts need padding",
                "use one prompt length (no negative prompt, or one of equal length) or the 'native' backend",
            )
    return tuple(None for _ in masks)


# ---- checks ----------------------------------------------------------------------------------------------


def fallback_counters() -> dict[str, int]:
    """``aten::*`` counters of ``torch_xla.debug.metrics``: each names an op that ran on the CPU instead of XLA."""
    import torch_xla.debug.metrics as met

    return {name: met.counter_value(name) for name in met.counter_names() if name.startswith("aten::")}


def counter_delta(before: dict[str, int], after: dict[str, int]) -> tuple[tuple[str, int], ...]:
    """Counters that moved between two ``fallback_counters()`` readings, as sorted (name, increase) pairs."""
    return tuple(sorted((k, v - before.get(k, 0)) for k, v in after.items() if v != before.get(k, 0)))


def has_complex_values(tensor) -> bool:
    """Whether the pending (not yet synced) graph behind `tensor` has complex values (HLO types c64, c128)."""
    import re

    return re.search(r"\bc(64|128)\[", xla.pending_hlo([tensor])) is not None
