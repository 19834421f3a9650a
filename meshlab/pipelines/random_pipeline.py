"""``--checkpoint random``: a model card's pipeline at real width with random weights, built offline from its configs.

What it is for: timing the real architecture on any host without a download. The transformer comes from the
card's diffusers config (``--layers`` keeps that many blocks of each list), the VAE from its component config at
full size, the text encoder from its config with ``--layers`` decoder layers and one vision block (the pipeline
never runs the vision tower), and the tokenizer is the tiny pipeline's byte-level BPE (its ids fit any vocabulary;
it encodes the prompt template's system part to the 34 tokens the pipeline drops). Weights are drawn from a seeded
pool straight into the dtype (meshlab.models.importer.build.randomize): no initialisation pass. The pixels mean nothing;
the shapes, FLOPs and bytes are the real model's at that depth.

Only Qwen-Image pipelines run (``QwenImagePipeline``, what ``meshlab run`` drives); another card is refused.
"""

from __future__ import annotations

import contextlib

from meshlab.models.card import ModelCard
from meshlab.models.truncate import refuse_unless_buildable

def build_random_pipeline(card: ModelCard, layers: int, dtype: str, seed: int):
    """A ``QwenImagePipeline`` of `card` with `layers` blocks per transformer list and text-encoder layers."""
    from diffusers import FlowMatchEulerDiscreteScheduler, QwenImagePipeline

    from meshlab.models.importer.build import build_model
    from meshlab.pipelines.tiny import QWEN_IMAGE_SCHEDULER_CONFIG, _train_tokenizer

    refuse_unless_buildable(card)
    components = card.source["components"]
    tokenizer = _train_tokenizer()
    return QwenImagePipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(**QWEN_IMAGE_SCHEDULER_CONFIG),
        vae=_vae(components["vae"], dtype, seed + 1),
        text_encoder=_text_encoder(components["text_encoder"]["config"], tokenizer, layers, dtype, seed + 2),
        tokenizer=tokenizer,
        transformer=build_model(card, layers, dtype, seed),
    )


def _vae(component: dict, dtype: str, seed: int):
    import diffusers
    from diffusers.models.modeling_utils import no_init_weights

    from meshlab.models.importer.build import randomize

    with no_init_weights():
        vae = getattr(diffusers, component["class"]).from_config(component["config"])
    return randomize(vae, dtype, seed)


def _text_encoder(config: dict, tokenizer, layers: int, dtype: str, seed: int):
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    from meshlab.models.importer.build import randomize

    text = {k: v for k, v in config.items() if k != "vision_config"}
    text["num_hidden_layers"] = min(layers, int(text["num_hidden_layers"]))
    text.update(bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
                eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"))
    vision = dict(config.get("vision_config") or {}, depth=1, fullatt_block_indexes=[0])
    with _no_init():
        model = Qwen2_5_VLForConditionalGeneration(Qwen2_5_VLConfig(text_config=text, vision_config=vision))
    return randomize(model, dtype, seed)


@contextlib.contextmanager
def _no_init():
    """transformers' own switch for skipping weight initialisation (moved in transformers 5)."""
    try:
        from transformers.initialization import no_init_weights
    except ImportError:  # transformers 4
        from transformers.modeling_utils import no_init_weights
    with no_init_weights():
        yield
