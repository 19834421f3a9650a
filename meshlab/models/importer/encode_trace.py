"""What an encoder holds while it encodes, from the real encoder's ops (needs torch): the card's encode working set.

A text encoder is built on ``meta`` in bfloat16 and called as its pipeline calls it, on one prompt, with the keyword
arguments the pipeline passes (the preset's ``encode_kwargs``: QwenImagePipeline's ``output_hidden_states=True``
keeps every layer's hidden states to the end). The peak of the tensors the call holds at once is tracked op by op
(meshlab.models.importer.decode_trace's `live_tensors`): the ids, each layer's temporaries, the hidden states kept, a
KV cache where the call builds one, the logits of an output head the pipeline does not read; parameters and buffers
aside. Each attention is one fused op (`fused_attention`, as a GPU or XLA runs it: no scores), except where the
encoder computes its own (T5: scores, bias and a float32 softmax, which grow with the square of the prompt). The card
keeps the peak at prompts of 16 to 4,096 tokens, doubling (which op holds it changes with the length), or at the one
length a pipeline tokenizes every prompt to (CLIP's 77); `meshlab.models.card.Component.encode_working_set` reads
between them. An image encoder (Wan I2V's CLIP) encodes one image at its configured size.
tests/models/test_encode_trace.py holds the figures against traces at other lengths, and the tracker against
torch.profiler's memory timeline of real CPU encodes.

The figures are at 2 bytes an element (bfloat16); an encode on ``meta`` computes nothing, so Qwen2.5-VL's 8B encoder
traces in a fraction of a second. The prompt is unpadded and unmasked: pipelines that pad to a fixed length (Wan,
HunyuanVideo, SANA, FLUX.2) pass a mask, from which transformers builds one of the prompt's length squared (0.5 MB
at 512 tokens), not traced here; transformers' checks whether a mask is all ones or a sequence unpacked are
answered yes (`_unpadded_answers`: ``meta`` holds no values to answer them); and a multimodal-RoPE model
(Qwen2.5-VL) is given the positions its ``get_rope_index`` makes for a prompt without images (the same index on its
three axes), since that function reads values.
"""

from __future__ import annotations

from typing import Any, Mapping

#: The prompt lengths traced: the card keeps the peak at each, and memory reads between them.
ENCODE_TOKENS = (16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


def encode_working_bytes(model: Any, kwargs: Mapping[str, Any], fixed_tokens: int = 0) -> tuple[tuple[int, int], ...]:
    """(tokens, bytes) points: the most bytes one encode holds at once, parameters aside, for a prompt of each of
    `ENCODE_TOKENS` tokens, or of `fixed_tokens` alone where the pipeline tokenizes every prompt to that many (CLIP's
    77); an image encoder's one image at its configured size: ((0, peak),). `model` is on ``meta``, in bfloat16;
    `kwargs` what the pipeline passes it."""
    if _is_image_encoder(model):
        side = int(model.config.image_size)
        pixels = _meta_zeros((1, int(model.config.num_channels), side, side), next(model.parameters()).dtype)
        return ((0, _peak(model, {"pixel_values": pixels}, kwargs)),)
    return tuple((n, _peak(model, _text_inputs(model, n), kwargs)) for n in ((fixed_tokens,) if fixed_tokens else
                                                                               ENCODE_TOKENS))


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


#: transformers' mask utilities that ask a yes-or-no question of a tensor's value before they build a mask, each
#: answered yes for one unpadded prompt: the positions are one sequence, not packed ones; the mask is all ones
_UNPADDED_QUESTIONS = frozenset({"find_packed_sequence_indices", "_ignore_causal_mask_sdpa"})


def _unpadded_answers() -> Any:
    """A ``TorchDispatchMode`` that answers yes where one of `_UNPADDED_QUESTIONS` reads a ``meta`` boolean's value
    (``meta`` holds none). Any other read of a value on ``meta`` fails as it would without it."""
    import inspect

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    def asked_by_masking() -> bool:
        frame = inspect.currentframe()
        while frame is not None:
            if frame.f_code.co_name in _UNPADDED_QUESTIONS and "masking_utils" in frame.f_code.co_filename:
                return True
            frame = frame.f_back
        return False

    class UnpaddedAnswers(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten._local_scalar_dense.default and args[0].device.type == "meta" \
                    and args[0].dtype == torch.bool and asked_by_masking():
                return True
            return func(*args, **(kwargs or {}))

    return UnpaddedAnswers()
