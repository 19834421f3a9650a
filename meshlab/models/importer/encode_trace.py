"""What an encoder holds while it encodes, from the real encoder's ops (needs torch): the card's encode working set.

A text encoder is built on ``meta`` in the card's dtype and called as its pipeline calls it, on one prompt, with the
keyword arguments the pipeline passes (the preset's ``encode_kwargs``: QwenImagePipeline's
``output_hidden_states=True`` keeps every layer's hidden states to the end). The peak of the tensors the call holds at
once is tracked op by op (meshlab.models.importer.decode_trace's `live_tensors`): the ids, each layer's temporaries,
the hidden states kept, a KV cache where the call builds one, the logits of an output head the pipeline does not
read; parameters and buffers aside. Each attention is one fused op (`fused_attention`, as a GPU or XLA runs it: no
scores), except where the encoder computes its own (T5: scores, bias and a float32 softmax, which grow with the square
of the prompt). The card keeps the quadratic through the peaks at 128, 256 and 512 tokens (CLIP, whose 77 positions
bound a prompt: 19, 38 and 77); tests/models/test_encode_trace.py holds it against traces at other lengths. An image
encoder (Wan I2V's CLIP) encodes one image at its configured size: its peak, whatever the prompt.

The figures are at the card's dtype's element size (bfloat16, 2 bytes); an encode on ``meta`` computes nothing, so
Qwen2.5-VL's 8B encoder traces in seconds. The mask is left out (one prompt, none padded: transformers skips an
all-ones mask); transformers' checks whether a mask is all ones or a sequence unpacked are answered yes
(`_unpadded_answers`: ``meta`` holds no values to answer them); and a multimodal-RoPE model (Qwen2.5-VL) is given
the positions its ``get_rope_index`` makes for a prompt without images (the same index on its three axes), since that
function reads values.
"""

from __future__ import annotations

from typing import Any, Mapping

#: The longest prompt traced; the fit runs through it, its half and its quarter (an encoder with fewer positions:
#: through its longest prompt, its half and its quarter).
ENCODE_TOKENS = 512


def max_tokens(model: Any) -> int:
    """The most tokens the encoder takes: its position table's size (CLIP's 77; 0 for T5's relative positions and
    for an image encoder)."""
    config = model.config
    if _is_image_encoder(model):
        return 0
    return int(getattr(getattr(config, "text_config", config), "max_position_embeddings", 0) or 0)


def encode_working_bytes(model: Any, kwargs: Mapping[str, Any]) -> tuple[float, float, float]:
    """(c0, c1, c2): the bytes one encode holds at its peak, parameters aside, as c0 + c1 n + c2 n^2 in its prompt's
    tokens n (the quadratic through traces at three lengths: T5's attention scores grow with n^2, and which op
    holds the peak changes with n); an image encoder's one image at its configured size: (peak, 0, 0). `model` is
    on ``meta``, in the card's dtype; `kwargs` what the pipeline passes it."""
    if _is_image_encoder(model):
        side = int(model.config.image_size)
        pixels = _meta_zeros((1, int(model.config.num_channels), side, side), next(model.parameters()).dtype)
        return float(_peak(model, {"pixel_values": pixels}, kwargs)), 0.0, 0.0
    longest = min(ENCODE_TOKENS, max_tokens(model) or ENCODE_TOKENS)
    xs = (longest // 4, longest // 2, longest)
    y1, y2, y3 = (_peak(model, _text_inputs(model, n), kwargs) for n in xs)
    x1, x2, x3 = xs
    c2 = ((y3 - y2) / (x3 - x2) - (y2 - y1) / (x2 - x1)) / (x3 - x1)
    c1 = (y2 - y1) / (x2 - x1) - c2 * (x1 + x2)
    return round(y1 - c1 * x1 - c2 * x1 * x1, 3), round(c1, 3), round(c2, 3)


def _is_image_encoder(model: Any) -> bool:
    config = model.config
    return hasattr(config, "image_size") and hasattr(config, "patch_size") and not hasattr(config, "vocab_size")


def _meta_zeros(shape: tuple[int, ...], dtype: Any) -> Any:
    import torch

    return torch.zeros(shape, dtype=dtype, device="meta")


def _text_inputs(model: Any, tokens: int) -> dict:
    import torch

    inputs = {"input_ids": torch.zeros((1, tokens), dtype=torch.long, device="meta")}
    text = getattr(model.config, "text_config", model.config)
    rope = getattr(text, "rope_scaling", None) or getattr(text, "rope_parameters", None) or {}
    if isinstance(rope, Mapping) and "mrope_section" in rope:  # Qwen2.5-VL: a text prompt's 3-axis positions
        inputs["position_ids"] = torch.arange(tokens, device="meta").view(1, 1, tokens).expand(3, 1, tokens)
    return inputs


def _peak(model: Any, inputs: Mapping[str, Any], kwargs: Mapping[str, Any]) -> int:
    import torch

    from meshlab.models.importer.decode_trace import fused_attention, live_tensors

    held = sum(t.untyped_storage().nbytes() for t in inputs.values())
    with torch.no_grad(), fused_attention(), _unpadded_answers(), \
            live_tensors(exclude=(*model.parameters(), *model.buffers(), *inputs.values())) as live:
        model(**inputs, **kwargs)
    return held + live.peak


def _unpadded_answers() -> Any:
    """A ``TorchDispatchMode`` that answers a yes-or-no question asked of a ``meta`` tensor's value with yes:
    transformers' mask utilities ask whether a mask is all ones or the positions one unpacked sequence
    (`masking_utils.fast_all`, `find_packed_sequence_indices`) before they build a mask, and for one unpadded prompt
    the answer is yes. Any other read of a value on ``meta`` fails as it would without it."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    class UnpaddedAnswers(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default and args[0].device.type == "meta" \
                    and args[0].dtype == torch.bool:
                return True
            return func(*args, **(kwargs or {}))

    return UnpaddedAnswers()
