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
def test_the_cards_encode_working_set_holds_at_lengths_it_was_not_fitted_at(model, name):
    """The card's quadratic, fitted through traces at 128, 256 and 512 tokens (CLIP: 19, 38 and 77), against a trace
    of the encoder called as its pipeline calls it at 96 and 384 tokens (CLIP: 50), within 5% or 2 MiB (UMT5 at 96:
    12.1 MiB against 11.0, where the op that holds its peak changes); an image encoder's figure is one image's, the
    same trace."""
    from meshlab.models.importer.encode_trace import _peak, _text_inputs, encode_working_bytes

    card = load_card(model)
    component = card.component(name)
    encoder, spec = _encoder_on_meta(card, name)
    assert component.encode_working_bytes[0] + component.encode_working_bytes[1] > 0
    if name == "image_encoder":
        assert component.encode_working_bytes == encode_working_bytes(encoder, spec.encode_kwargs)
        assert component.encode_working_set(512, 2) == component.encode_working_set(77, 2) > 2**20
        return
    lengths = (50,) if component.max_tokens == 77 else (96, 384)
    for tokens in lengths:
        traced = _peak(encoder, _text_inputs(encoder, tokens), spec.encode_kwargs)
        assert component.encode_working_set(tokens, 2) == pytest.approx(traced, rel=0.05, abs=2**21), tokens


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
    assert component.max_tokens == 128000 and component.encode_tokens(546) == 546


def test_clip_encodes_at_most_its_77_positions():
    clip = load_card("flux-dev").component("text_encoder")
    assert clip.max_tokens == 77 and clip.encode_tokens(512) == 77
    assert clip.encode_working_set(512, 2) == clip.encode_working_set(77, 2)
    t5 = load_card("flux-dev").component("text_encoder_2")
    assert t5.max_tokens == 0 and t5.encode_tokens(512) == 512


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
    prompt (CLIP's, at 77 tokens, is smaller); on the host nothing of it is on the chips; sharded, the gathered layer
    comes on top."""
    planned = plan_file(REPO / "strategies" / "flux-usp-h100.yaml")
    card = planned.plan.card
    t5 = card.component("text_encoder_2")
    chip = planned.memory.most_loaded
    assert chip.text_encode == t5.encode_working_set(512, 2) > card.component("text_encoder").encode_working_set(512, 2)
    assert 60 * 2**20 < chip.text_encode < 200 * 2**20
    on_host = plan_file(REPO / "strategies" / "2d.yaml").memory.most_loaded
    assert on_host.text_encode == 0
