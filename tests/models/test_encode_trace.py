"""What an encode holds (meshlab.models.importer.encode_trace): the cards' fit against traces at other lengths, the
tracker against torch.profiler on real CPU encodes, and the memory model's encode phase."""

from __future__ import annotations

import importlib.util

import pytest

from meshlab.models.card import load_card
from meshlab.plan.planned import plan_file

from tests.conftest import REPO

needs_transformers = pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                        reason="needs transformers (the xla extra)")

#: one card of each shipped encoder (the T5 XXL of Flux, SD3.5, LTX-Video and CogVideoX is one encoder)
ENCODERS = [("qwen-image", "text_encoder"), ("flux-dev", "text_encoder"), ("flux-dev", "text_encoder_2"),
            ("sd3.5-large", "text_encoder_2"), ("flux2-dev", "text_encoder"), ("wan-2.1-t2v-14b", "text_encoder"),
            ("hunyuan-video", "text_encoder"), ("sana-1600m", "text_encoder"),
            ("wan-2.1-i2v-14b", "image_encoder")]


def _encoder_on_meta(card, name):
    import torch

    from meshlab.models.importer.card_import import _build, _resolve, _spec

    spec = _spec(card.source["components"][name])
    with torch.device("meta"):
        return _build(spec, _resolve(spec.library, spec.class_name)).to(torch.bfloat16).eval(), spec


@needs_transformers
@pytest.mark.parametrize("model, name", ENCODERS)
def test_the_cards_encode_working_set_holds_between_the_lengths_it_was_traced_at(model, name):
    """The card keeps traced peaks at 16 to 4,096 tokens, doubling; between them it reads the quadratic through the
    three around. A trace of the encoder called as its pipeline calls it at 24, 96, 384, 768 and 3,000 tokens agrees
    within 5% or 2 MiB, and at 6,000 (past the last) within 5%. CLIP, which its pipelines tokenize to 77 tokens
    whatever the prompt, and an image encoder (one image) each keep their one trace."""
    from meshlab.models.importer.encode_trace import _peak, _text_inputs, encode_working_bytes

    card = load_card(model)
    component = card.component(name)
    encoder, spec = _encoder_on_meta(card, name)
    if len(component.encode_working_bytes) == 1:
        assert component.encode_working_bytes == encode_working_bytes(encoder, spec.encode_kwargs, spec.prompt_tokens)
        assert component.encode_working_set(512, 2) == component.encode_working_set(20, 2) > 2**20
        return
    assert [n for n, _ in component.encode_working_bytes] == [16, 32, 64, 128, 256, 512, 1024, 2048, 4096]
    for tokens in (24, 96, 384, 768, 3000, 6000):
        traced = _peak(encoder, _text_inputs(encoder, tokens), spec.encode_kwargs)
        slack = 0 if tokens > 4096 else 2**21
        assert component.encode_working_set(tokens, 2) == pytest.approx(traced, rel=0.05, abs=slack), tokens


@needs_transformers
def test_qwen_images_encode_keeps_every_hidden_state_and_the_logits():
    """QwenImagePipeline asks for every hidden state; Qwen2.5-VL's LM head computes logits it does not read. At the
    peak, 546 tokens (512 and the template's 34) hold the 29 hidden states of 3584 and the 152,064 logits, in
    bfloat16 (and a layer's temporaries besides): 296 MiB, of which those two are 266."""
    component = load_card("qwen-image").component("text_encoder")
    kept = 546 * (29 * 3584 + 152064) * 2
    held = component.encode_working_set(546, 2)
    assert kept < held < 1.15 * kept
    assert component.encode_working_set(546, 4) == 2 * held  # float32: twice the bytes
    assert component.fixed_tokens == 0 and component.encode_tokens(546) == 546


def test_clip_encodes_every_prompt_at_its_77_tokens():
    """FluxPipeline tokenizes CLIP's prompt with padding="max_length" to 77: a longer prompt is cut, a shorter one
    padded; T5's is the prompt's own."""
    clip = load_card("flux-dev").component("text_encoder")
    assert clip.fixed_tokens == 77 and clip.encode_tokens(512) == clip.encode_tokens(20) == 77
    assert clip.encode_working_set(512, 2) == clip.encode_working_set(20, 2) == clip.encode_working_bytes[0][1]
    t5 = load_card("flux-dev").component("text_encoder_2")
    assert t5.fixed_tokens == 0 and t5.encode_tokens(512) == 512


@pytest.mark.parametrize("points, problem", [([[16, 1], [32, 2]], "one or at least three"),
                                             ([[32, 1], [16, 2], [64, 3]], "increasing tokens"),
                                             ([[16, -1]], "greater than or equal to 0")])
def test_a_card_refuses_encode_points_it_cannot_read(points, problem):
    from pydantic import ValidationError

    from meshlab.models.card_file import ComponentEntry

    with pytest.raises(ValidationError, match=problem):
        ComponentEntry.model_validate({"name": "text_encoder", "class_name": "T5EncoderModel", "parameters": 1,
                                       "dtype": "bfloat16", "encode_working_bytes": points})


def _tiny(kind: str):
    """A real encoder of a shipped class, small enough to run on the CPU, in bfloat16."""
    import torch
    import transformers

    torch.manual_seed(0)
    if kind == "t5":
        config = transformers.T5Config(d_model=256, d_ff=640, d_kv=32, num_heads=8, num_layers=3, vocab_size=512,
                                       feed_forward_proj="gated-gelu")
        return transformers.T5EncoderModel(config).to(torch.bfloat16).eval(), {}
    config = transformers.Qwen2Config(hidden_size=256, intermediate_size=1024, num_hidden_layers=3,
                                      num_attention_heads=8, num_key_value_heads=2, vocab_size=4096)
    return transformers.Qwen2ForCausalLM(config).to(torch.bfloat16).eval(), {"output_hidden_states": True}


@needs_transformers
@pytest.mark.parametrize("kind", ["t5", "qwen2"])
def test_the_tracker_on_meta_measures_what_a_real_cpu_encode_holds(kind):
    """meshlab's trace on ``meta`` (fused attention, the value checks answered) against torch.profiler's memory timeline
    of the same encoder, built for real on the CPU and encoding 200 tokens: within 5%. T5 computes its own attention
    scores; the causal LM keeps every hidden state and its logits, and attends through torch's fused attention,
    which holds no scores on the CPU either."""
    import torch

    from meshlab.models.importer.encode_trace import _peak, _text_inputs
    from tests.profiled_memory import profiled_call

    encoder, kwargs = _tiny(kind)
    ids = torch.randint(0, 512, (1, 200))
    measured, _ = profiled_call(lambda: encoder(input_ids=ids, **kwargs))
    with torch.device("meta"):
        on_meta = type(encoder)(encoder.config).to(torch.bfloat16).eval()
    traced = _peak(on_meta, _text_inputs(on_meta, 200), kwargs)
    assert traced == pytest.approx(measured, rel=0.05)


def test_an_encoder_on_the_chips_holds_its_encode_in_the_encode_phase():
    """flux-usp-h100.yaml keeps CLIP and T5 XXL on every GPU: the encode phase holds T5's encode of the 512-token
    prompt (CLIP's, at 77 tokens, is smaller); on the host nothing of it is on the chips (a sharded encoder's
    gathered layer on top: tests/plan/test_pipeline_placement.py)."""
    planned = plan_file(REPO / "strategies" / "flux-usp-h100.yaml")
    card = planned.plan.card
    t5 = card.component("text_encoder_2")
    chip = planned.memory.most_loaded
    assert chip.text_encode == t5.encode_working_set(512, 2) > card.component("text_encoder").encode_working_set(512, 2)
    assert 60 * 2**20 < chip.text_encode < 200 * 2**20
    on_host = plan_file(REPO / "strategies" / "2d.yaml").memory.most_loaded
    assert on_host.text_encode == 0
