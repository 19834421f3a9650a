"""The video DiTs GPU users run (issue 26, part 5): Wan 2.1 image-to-video, LTX-Video, CogVideoX-5b and
HunyuanVideo, read from the shipped cards (pure, no torch), their FLOPs against torch's own count of a real forward
(diffusers' class on ``meta``, FlopCounterMode), and their pipelines end to end through the CLI."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from meshlab.cli.app import app
from meshlab.core.errors import InputError
from meshlab.cost.flops import attention_flops, linear_flops
from meshlab.models.card import load_card
from meshlab.models.defaults import pipeline_defaults
from meshlab.plan.tokens import TokenCounts, token_counts
from meshlab.strategy.schema import Workload

from tests.cost.helpers import forward_flops

runner = CliRunner()

NEW = ("wan-2.1-i2v-14b", "ltx-video", "cogvideox-5b", "hunyuan-video")


@pytest.mark.parametrize("name, tokens", [
    # 480 x 832 x 81: 21 latent frames of 30 x 52 tokens, and the image's 257 CLIP tokens
    ("wan-2.1-i2v-14b", TokenCounts(21 * 30 * 52, 512, 257)),
    # 512 x 704 x 161: the VAE's 32x and 8x: 21 latent frames of 16 x 22, patch 1
    ("ltx-video", TokenCounts(21 * 16 * 22, 128)),
    # 480 x 720 x 49: 13 latent frames of 30 x 45 tokens (8x VAE, 2x2 patch), T5's 226 tokens
    ("cogvideox-5b", TokenCounts(13 * 30 * 45, 226)),
    # 720 x 1280 x 129: 33 latent frames of 45 x 80 tokens
    ("hunyuan-video", TokenCounts(33 * 45 * 80, 256)),
])
def test_the_pipelines_default_video_packs_into_the_tokens_its_pipeline_makes(name, tokens):
    defaults = pipeline_defaults(name)
    workload = Workload(**defaults.workload_fields())
    assert token_counts(workload, load_card(name).architecture) == tokens


def test_wan_i2v_reads_the_conditioning_images_clip_tokens_beside_the_text():
    """Wan I2V's cross-attention projects the image's 257 CLIP tokens with its own k and v (add_k_proj,
    add_v_proj) and attends to them beside the text: the reference stream, whatever the workload."""
    card = load_card("wan-2.1-i2v-14b")
    arch = card.architecture
    assert (arch.in_channels, arch.reference_tokens) == (36 * 4, 257)  # 16 noise + 4 mask + 16 image latents, 2x2
    cross = next(a for a in card.attention if a.module == "blocks.0.attn2")
    assert cross.streams == ("image",) and cross.keys == ("text", "reference")
    params = {p.name: p for p in card.parameters}
    assert params["blocks.0.attn2.add_k_proj.weight"].stream == "reference"
    assert params["blocks.0.attn2.to_k.weight"].stream == "text"
    assert params["condition_embedder.image_embedder.ff.net.0.proj.weight"].stream == "reference"
    assert [c.name for c in card.encoders] == ["text_encoder", "image_encoder"]
    assert card.component("image_encoder").class_name == "CLIPVisionModel"


def test_wan_i2v_flops_count_the_image_context_by_hand():
    """One Wan I2V forward: the T2V block, plus the image context's k and v at 257 tokens and the cross-attention
    against 512 + 257 keys."""
    i2v, t2v = load_card("wan-2.1-i2v-14b"), load_card("wan-2.1-t2v-14b")
    image, text, reference, d, layers = 32_760, 512, 257, 5120, 40
    tokens = TokenCounts(image, text, reference)
    extra_per_block = linear_flops(d, d, reference) * 2 + 4.0 * image * reference * d
    embedder = linear_flops(1280, 1280, reference) + linear_flops(1280, d, reference)  # the image embedder's MLP
    got = forward_flops(i2v, tokens) - forward_flops(t2v, TokenCounts(image, text))  # the wider patch conv: uncounted
    assert got == pytest.approx(layers * extra_per_block + embedder, rel=1e-9)
    cross = next(a for a in i2v.attention if a.module == "blocks.0.attn2")
    assert attention_flops(cross, image, text + reference) == 4.0 * image * (text + reference) * d


def test_a_ulysses_split_the_tokens_do_not_divide_is_refused_with_the_degree_that_does():
    result = runner.invoke(app, ["try", "--model", "cogvideox-5b", "--hardware", "h100:8", "--mesh", "cfg=2,seq=4",
                                 "--rules", "ulysses"])
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "split 17550 image tokens and 226 text tokens 4 ways" in result.output
    assert "a sequence degree (ring x Ulysses) of 2" in result.output


def test_wan_i2v_takes_its_512_text_tokens_and_nothing_else(tmp_path):
    from meshlab.models.families import geometry

    card = load_card("wan-2.1-i2v-14b")
    assert card.architecture.text_tokens == 512
    assert geometry(card, 480, 832, 512, 1, frames=81).reference == 257
    with pytest.raises(InputError, match="exactly 512 text tokens") as raised:
        geometry(card, 480, 832, 226, 1, frames=81)
    assert raised.value.fix == "set workload.text_tokens: 512"
    asked = runner.invoke(app, ["try", "--model", "wan-2.1-i2v-14b", "--hardware", "h100:8", "--text-tokens", "226"])
    assert asked.exit_code == 2 and "exactly 512 text tokens" in asked.output and "Traceback" not in asked.output
    assert len(asked.output.strip().splitlines()) == 1
    saved = tmp_path / "i2v.yaml"
    assert runner.invoke(app, ["try", "--model", "wan-2.1-i2v-14b", "--hardware", "h100:8", "--save",
                               str(saved)]).exit_code == 0
    text = saved.read_text().replace("text_tokens: 512", "text_tokens: 226")
    saved.write_text(text)
    refused = runner.invoke(app, ["try", str(saved)])
    line = next(n for n, t in enumerate(text.splitlines(), 1) if "text_tokens: 226" in t)
    assert refused.exit_code == 2 and f"{saved}:{line}" in refused.output and "set workload.text_tokens: 512" in \
        refused.output


def test_wan_i2v_image_context_is_not_a_modulation_and_stays_whole():
    """The image context and the text are joined along the tokens and cut apart in the cross-attention: the text
    embedder's output is no modulation of the image embedder's norm (a concatenation is no elementwise op), each
    projection reads its own part, and no linear.output rule splits the reference stream's 257 tokens."""
    from meshlab.cost.graph import _roles
    from meshlab.plan.activations import activation_points
    from meshlab.strategy.schema import ActivationRule

    card = load_card("wan-2.1-i2v-14b")
    flows = {f.module: f for f in card.dataflow}
    assert _roles(card.dataflow)["condition_embedder.text_embedder.linear_2"] == "whole"
    assert not flows["condition_embedder.text_embedder.linear_2"].modulates
    assert flows["blocks.*.attn2.to_k"].reads == ("linear:condition_embedder.text_embedder.linear_2",)
    assert flows["blocks.*.attn2.add_k_proj"].reads == ("norm:condition_embedder.image_embedder.norm2|reference",)
    rule = ActivationRule.model_validate({"point": "linear.output", "spec": ["data", "seq", None]})
    marked = {p.module for p in activation_points(card, [rule])}
    assert "blocks.0.attn2.to_k" in marked and not any("add_k_proj" in m or "add_v_proj" in m for m in marked)


def test_cogvideox_joins_text_and_video_in_one_attention_and_mlp():
    card = load_card("cogvideox-5b")
    assert {(a.streams, a.keys) for a in card.attention} == {(("text", "image"), ())}
    params = {p.name: p for p in card.parameters}
    assert params["transformer_blocks.0.ff.net.0.proj.weight"].stream == "joint"
    assert params["transformer_blocks.0.attn1.to_q.weight"].stream == "joint"
    assert (card.architecture.hidden_size, card.architecture.num_layers) == (3072, 42)


def test_ltx_video_packs_its_latent_and_cross_attends_to_the_text():
    card = load_card("ltx-video")
    arch = card.architecture
    assert (arch.vae_scale_factor, arch.temporal_scale_factor, arch.patch_size, arch.in_channels) == (32, 8, 1, 128)
    self_attention, cross = card.attention[0], card.attention[1]
    assert (self_attention.streams, self_attention.keys) == (("image",), ())
    assert (cross.streams, cross.keys) == (("image",), ("text",))
    # its blocks' RMSNorms (diffusers' RMSNorm, a mean of squares by hand) are traced as norms that the timestep
    # projection outside the blocks modulates, with the per-block scale_shift_table (as Wan's LayerNorms are)
    flows = {f.module: f for f in card.dataflow}
    assert [(m.norm, m.stream, m.width, m.rms) for m in flows["time_embed.linear"].modulates] == [
        ("transformer_blocks.*.norm1", "image", 2048, True), ("transformer_blocks.*.norm2", "image", 2048, True)]
    assert flows["transformer_blocks.*.ff.net.0.proj"].sources("norm") == ("transformer_blocks.*.norm2|image",)


def test_the_video_vaes_record_how_their_decodes_hold_frames():
    """What each VAE holds while decoding, measured (meshlab.models.importer.decode_trace): Wan's decodes a latent
    frame at a time with its caches (no growth past the latent itself), CogVideoX's two at a time, HunyuanVideo's
    in temporal tiles of 5 latent frames, and LTX-Video's decoder holds every frame at once (it grows)."""
    vaes = {name: load_card(name).component("vae") for name in ("wan-2.1-t2v-14b", "cogvideox-5b", "hunyuan-video",
                                                                 "ltx-video")}
    assert {n: v.working_latent_frames for n, v in vaes.items()} == {
        "wan-2.1-t2v-14b": 3, "cogvideox-5b": 5, "hunyuan-video": 5, "ltx-video": 3}
    ltx = vaes["ltx-video"]
    assert ltx.working_bytes_per_pixel_per_latent_frame > 0.3 * ltx.working_bytes_per_pixel
    wan = vaes["wan-2.1-t2v-14b"]
    assert wan.working_bytes_per_pixel_per_latent_frame < 1e-3 * wan.working_bytes_per_pixel
    assert vaes["cogvideox-5b"].tile == (240, 360) and vaes["cogvideox-5b"].tile_stride == (200, 288)
    # the decoded video: concatenated from pieces (held twice at the end), or made by one decoder call (once)
    assert {n: v.output_copies for n, v in vaes.items()} == {
        "wan-2.1-t2v-14b": 2, "cogvideox-5b": 2, "hunyuan-video": 2, "ltx-video": 1}


@pytest.mark.parametrize("name", NEW)
def test_try_plans_each_new_model_on_eight_gpus(name):
    """Ulysses on 8 H100s at each pipeline's default video. CogVideoX-5b's 13 x 30 x 45 = 17,550 tokens split 2 ways
    evenly, not 4 (the tools shard the sequence evenly): Ulysses 2 beside a data axis of 2 there."""
    cfg = pipeline_defaults(name).cfg
    mesh = ("cfg=2,data=2,seq=2" if name == "cogvideox-5b" else "cfg=2,seq=4") if cfg else "seq=8"
    result = runner.invoke(app, ["try", "--model", name, "--hardware", "h100:8", "--mesh", mesh, "--rules", "ulysses",
                                 "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert document["fits"] is True
    breakdown = document["per_chip"][0]["breakdown"]
    assert breakdown["vae_decode"] > 0 and breakdown["text_encoder"] > 0
    assert document["tokens"].get("reference", 0) == load_card(name).architecture.reference_tokens


# --- against torch's count of a real forward (needs diffusers) ---------------------------------------------


@pytest.mark.xla
@pytest.mark.parametrize("name", NEW + ("wan-2.1-t2v-14b",))
def test_flops_match_torchs_count_of_a_forward_at_full_width(name):
    """The card's FLOPs (every Linear at its stream's tokens, every attention) against torch's FlopCounterMode over
    one forward of diffusers' class at the card's config, two blocks of each list, on ``meta`` (shapes only) at a
    480 x 832-like video: within 2% (uncounted: the patch embedding's convolution, well under 0.1%)."""
    pytest.importorskip("diffusers")
    import diffusers
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from meshlab.models.families import Geometry, family
    from meshlab.models.importer.forward_inputs import forward_inputs
    from meshlab.models.truncate import truncate_card

    card = load_card(name)
    tracer, config = family(card.class_name), card.source["config"]
    geometry = Geometry(1, (30, 52), tracer.text_tokens(config) or 226, 21 if tracer.video else 1,
                        card.architecture.reference_tokens)
    cls = getattr(diffusers, card.class_name)
    with torch.device("meta"):
        model = cls.from_config({**config, **{key: 2 for _, key in tracer.blocks}}).eval()
        inputs = forward_inputs(cls, config, geometry, torch.bfloat16, None)
        torch.nn.Module.to(model, torch.bfloat16)
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(**inputs)
    ours = forward_flops(truncate_card(card, 2),
                         TokenCounts(geometry.image_tokens, geometry.text_tokens, geometry.reference))
    assert ours == pytest.approx(counter.get_total_flops(), rel=0.02)


@pytest.mark.xla
def test_a_cogvideox_2b_config_imports_tracing_its_226_text_tokens():
    """CogVideoX-2b has no rotary embeddings: its positional embedding spans max_text_seq_length text tokens plus the
    video's, so the traced forward takes 226 text tokens (a shorter text broke the forward)."""
    pytest.importorskip("diffusers")
    from meshlab.models.families import geometry
    from meshlab.models.importer.card_import import import_card
    from meshlab.models.presets import PRESETS

    config = {**PRESETS["cogvideox-5b"].config, "num_attention_heads": 30, "num_layers": 2,
              "use_rotary_positional_embeddings": False}
    card = import_card("CogVideoXTransformer3DModel", config, "cogvideox-2b-narrow")
    assert card.source["trace"]["text_tokens"] == 226 and card.architecture.text_tokens == 226
    assert {(a.streams, a.keys) for a in card.attention} == {(("text", "image"), ())}
    with pytest.raises(InputError, match="exactly 226 text tokens"):
        geometry(card, 480, 720, 128, 1, frames=49)


def test_a_whole_video_decoder_dispatches_once_per_decode_and_the_others_once_per_latent_frame():
    """LTX-Video's one decoder call makes every frame (its op count does not grow with them); Wan's, CogVideoX's
    and HunyuanVideo's decoders run per latent frame (or batch, or tile), so the eager floor grows with the video."""
    from meshlab.core.hardware import load_hardware
    from meshlab.cost.pipeline_time import dispatch_seconds, vae_decode_seconds

    ltx, wan = load_card("ltx-video").component("vae"), load_card("wan-2.1-t2v-14b").component("vae")
    assert ltx.decoder_runs(21) == 1 and ltx.decode_dispatches > 100
    assert wan.decoder_runs(21) == 21
    h100 = load_hardware("h100")
    tiny = 8 * 8  # pixels: the floor, not the kernels, decides
    assert vae_decode_seconds(ltx, h100, "device", tiny, ltx.decoder_runs(21)) == pytest.approx(
        ltx.decode_dispatches * dispatch_seconds(h100))


def test_the_image_context_and_the_text_mask_split_with_the_batch():
    from meshlab.core.mesh import AbstractMesh
    from meshlab.plan.inputs import input_spec
    from meshlab.strategy.schema import Activations

    mesh = AbstractMesh((("data", 2), ("model", 4)))
    activations = Activations.model_validate({"batch": "data"})
    for name, shape in (("encoder_hidden_states_image", (2, 257, 1280)), ("encoder_attention_mask", (2, 128))):
        assert input_spec(name, shape, activations, mesh).entries[0] == ("data",)
    assert input_spec("image_rotary_emb", (2, 64), activations, mesh).entries[0] is None  # per token, not batched


@pytest.mark.xla
def test_a_first_last_frame_wan_config_traces_two_images_as_one_reference_sequence():
    """Wan FLF2V (pos_embed_seq_len 514): the pipeline hands two images' 257 CLIP tokens each, and the image embedder
    views them as one 514-token sequence per sample: the reference stream."""
    pytest.importorskip("diffusers")
    from meshlab.models.importer.card_import import import_card
    from meshlab.models.presets import PRESETS

    config = {**PRESETS["wan-2.1-i2v-14b"].config, "num_attention_heads": 2, "attention_head_dim": 64,
              "ffn_dim": 256, "num_layers": 2, "text_dim": 64, "image_dim": 96, "added_kv_proj_dim": 128,
              "pos_embed_seq_len": 514}
    card = import_card("WanTransformer3DModel", config, "tiny-flf2v")
    assert card.architecture.reference_tokens == 514
    params = {p.name: p for p in card.parameters}
    assert params["blocks.0.attn2.add_k_proj.weight"].stream == "reference"


def test_the_decode_trace_runs_an_attention_as_one_counted_op_on_meta_and_others_as_called():
    """meshlab.models.importer.decode_trace.fused_attention: on meta, F.scaled_dot_product_attention (a boolean
    mask and a 3-D mask included) is one memory-efficient attention op whose FLOPs torch counts, grouped heads too
    (keys and values repeated to the query's heads: 8 query heads over 2 key heads count 8 heads' FLOPs); 3-D inputs
    and the CPU run as called."""
    torch = pytest.importorskip("torch")
    from torch.nn.functional import scaled_dot_product_attention as sdpa
    from torch.utils.flop_counter import FlopCounterMode

    from meshlab.models.importer.decode_trace import fused_attention

    def run(device, *shape, **kwargs):
        q = torch.randn(*shape, device=device)
        with fused_attention(), FlopCounterMode(display=False) as counter:
            out = sdpa(q, q, q, **kwargs)
        return out.shape, {str(op) for op in counter.get_flop_counts().get("Global", {})}, counter.get_total_flops()

    full = 4 * 1 * 2 * 64 * 64 * 16  # q k^T and the weighted sum: 2 x 2 x batch x heads x L x S x d
    shape, ops, flops = run("meta", 1, 2, 64, 16)
    assert shape == (1, 2, 64, 16) and ops == {"aten._scaled_dot_product_efficient_attention"} and flops == full
    for mask in (torch.ones(64, 64, dtype=torch.bool, device="meta"), torch.zeros(1, 64, 64, device="meta")):
        assert run("meta", 1, 2, 64, 16, attn_mask=mask)[1:] == ({"aten._scaled_dot_product_efficient_attention"},
                                                                 full)
    assert "aten._scaled_dot_product_efficient_attention" not in run("meta", 2, 64, 16)[1]  # 3-D: as called
    q, kv = torch.randn(1, 8, 64, 16, device="meta"), torch.randn(1, 2, 64, 16, device="meta")
    with fused_attention(), FlopCounterMode(display=False) as counter:
        out = sdpa(q, kv, kv, enable_gqa=True)
    assert out.shape == (1, 8, 64, 16) and counter.get_total_flops() == 4 * full
    assert set(map(str, counter.get_flop_counts()["Global"])) == {"aten._scaled_dot_product_efficient_attention"}
    assert run("cpu", 1, 2, 64, 16)[0] == (1, 2, 64, 16)  # the CPU: torch's own kernel (no efficient op there)
