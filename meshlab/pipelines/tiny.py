"""A tiny Qwen-Image pipeline, built offline from fixed seeds, for tests and smoke runs of the XLA path.

Every component is a real diffusers / transformers class at toy width, so the pipeline exercises the same code as
``Qwen/Qwen-Image`` (joint attention, 3-axis RoPE, causal 3-D VAE, Qwen2.5-VL text encoder) in well under a second
per step. Nothing is downloaded: the tokenizer is a byte-level BPE trained here on the pipeline's own prompt
template (see ``/work/shared/reference/tiny-pipeline.md`` for why each size is what it is).

Needs the ``xla`` extra (torch, diffusers, transformers, tokenizers); meshlab's core never imports this module.

    >>> path = build_tiny_pipeline(Path("/tmp/tiny-qwen"))   # doctest: +SKIP
    >>> pipe = load_pipeline(path)                           # doctest: +SKIP
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

#: The tiny transformer's constructor arguments (``QwenImageTransformer2DModel(**TINY_TRANSFORMER_CONFIG)``);
#: also what a model card for the tiny pipeline is built from. ``in_channels`` is 4 x the VAE's ``z_dim``
#: (latents are packed 2x2), ``out_channels`` equals it, ``axes_dims_rope`` sums to ``attention_head_dim`` and
#: ``joint_attention_dim`` equals the text encoder's hidden size.
TINY_TRANSFORMER_CONFIG: dict[str, Any] = {
    "patch_size": 2,
    "in_channels": 16,
    "out_channels": 4,
    "num_layers": 2,
    "attention_head_dim": 16,
    "num_attention_heads": 4,
    "joint_attention_dim": 16,
    "axes_dims_rope": (8, 4, 4),
}

#: The tiny VAE's constructor arguments: 8x spatial downsampling, so image sides are multiples of 16.
TINY_VAE_CONFIG: dict[str, Any] = {
    "base_dim": 16,
    "z_dim": 4,
    "dim_mult": [1, 2, 4, 4],
    "num_res_blocks": 1,
    "temperal_downsample": [False, True, True],
    "latents_mean": [0.0] * 4,
    "latents_std": [1.0] * 4,
}

#: The text part of the tiny Qwen2.5-VL (its ``vocab_size`` is set from the trained tokenizer).
TINY_TEXT_CONFIG: dict[str, Any] = {
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
    "rope_parameters": {"rope_type": "default", "rope_theta": 1_000_000.0, "mrope_section": [1, 1, 2]},
}

#: The vision part: never run (no images go in), but Qwen2_5_VLForConditionalGeneration always has one.
TINY_VISION_CONFIG: dict[str, Any] = {
    "depth": 2,
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_heads": 2,
    "out_hidden_size": 16,
    "fullatt_block_indexes": [1],
}

#: ``FlowMatchEulerDiscreteScheduler`` settings as published in ``Qwen/Qwen-Image/scheduler``.
QWEN_IMAGE_SCHEDULER_CONFIG: dict[str, Any] = {
    "num_train_timesteps": 1000,
    "shift": 1.0,
    "use_dynamic_shifting": True,
    "base_shift": 0.5,
    "max_shift": 0.9,
    "base_image_seq_len": 256,
    "max_image_seq_len": 8192,
    "shift_terminal": 0.02,
    "time_shift_type": "exponential",
    "invert_sigmas": False,
    "stochastic_sampling": False,
    "use_karras_sigmas": False,
    "use_exponential_sigmas": False,
    "use_beta_sigmas": False,
}

#: Prompts the tokenizer is trained on (inside the pipeline's template). Any prompt works afterwards: unseen
#: words fall back to byte tokens.
_TOKENIZER_CORPUS = (
    "a red cube on a blue table",
    "a photo of a mountain lake at sunrise",
    "a cat sitting on a window sill",
    "blurry, low quality, distorted",
)
_SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_VOCAB_LIMIT = 1000
_SEED = 0


def build_tiny_pipeline(directory: Path) -> Path:
    """Build the tiny pipeline from fixed seeds, ``save_pretrained`` it into `directory`, and return `directory`.

    Offline and deterministic: two builds give identical weights and tokenizer files.
    """
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImagePipeline

    directory = Path(directory)
    tokenizer = _train_tokenizer()
    pipe = QwenImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**QWEN_IMAGE_SCHEDULER_CONFIG),
        vae=_seeded(_build_vae, _SEED),
        text_encoder=_seeded(lambda: _build_text_encoder(tokenizer), _SEED + 1),
        tokenizer=tokenizer,
        transformer=_seeded(_build_transformer, _SEED + 2),
    )
    pipe.save_pretrained(directory)
    return directory


def load_pipeline(path: Path, dtype: str | None = None):
    """Load a saved pipeline (tiny or real) from `path`, offline, on the CPU, in `dtype` (e.g. ``bfloat16``, the
    workload's: a real Qwen-Image transformer takes 38 GiB in bf16 and 82 in float32), or as saved when None."""
    import torch
    from diffusers import QwenImagePipeline

    kwargs = {"torch_dtype": getattr(torch, dtype)} if dtype else {}
    return QwenImagePipeline.from_pretrained(Path(path), local_files_only=True, **kwargs)


def _seeded(build, seed: int):
    """Run `build` under a fixed torch seed without touching the caller's random state."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build().eval()


def _build_transformer():
    from diffusers import QwenImageTransformer2DModel

    return QwenImageTransformer2DModel(**TINY_TRANSFORMER_CONFIG)


def _build_vae():
    from diffusers import AutoencoderKLQwenImage

    return AutoencoderKLQwenImage(**TINY_VAE_CONFIG)


def _build_text_encoder(tokenizer):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    token_ids = {
        "vocab_size": len(tokenizer),
        "bos_token_id": tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        "eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>"),
    }
    config = Qwen2_5_VLConfig(
        text_config={**TINY_TEXT_CONFIG, **token_ids},
        vision_config=dict(TINY_VISION_CONFIG),
    )
    return Qwen2_5_VLForConditionalGeneration(config)


def _train_tokenizer():
    """A byte-level BPE with Qwen2's normalizer, pre-tokenizer and decoder, trained on the prompt template.

    The template's system part must encode to exactly ``prompt_template_encode_start_idx`` (34) tokens, as with
    the real tokenizer: the pipeline drops that many, and fails with a reshape error on fewer.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    template, drop = _prompt_template()
    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=_VOCAB_LIMIT,
        special_tokens=list(_SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator([template.format(prompt) for prompt in _TOKENIZER_CORPUS], trainer)
    model = json.loads(bpe.to_str())["model"]
    tokenizer = Qwen2Tokenizer(
        vocab=model["vocab"],
        merges=[tuple(merge) for merge in model["merges"]],
        extra_special_tokens=list(_SPECIAL_TOKENS[1:]),
    )
    got = len(tokenizer(template.split("{}")[0])["input_ids"])
    if got != drop:
        raise RuntimeError(
            f"the tiny tokenizer encodes the prompt template's system part to {got} tokens but the pipeline drops "
            f"{drop}; its pre-tokenizer must match Qwen2's"
        )
    return tokenizer


def _prompt_template() -> tuple[str, int]:
    """The pipeline's prompt template and how many of its leading tokens it drops (both set in its __init__)."""
    from diffusers import QwenImagePipeline

    bare = QwenImagePipeline(scheduler=None, vae=None, text_encoder=None, tokenizer=None, transformer=None)
    return bare.prompt_template_encode, bare.prompt_template_encode_start_idx
