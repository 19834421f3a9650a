"""The importer and the cards it ships.

Pure tests read the shipped JSON (no torch, milliseconds). Tests marked ``xla`` build the real diffusers
classes: the fresh imports of the shipped presets take most of the time (about a minute on two cores).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from meshlab.models.card import BUILTIN_DIR, card_from_json, card_to_json, load_card
from meshlab.core.errors import InputError

#: every card meshlab ships (a card added to the folder is held to a fresh import without a line here)
SHIPPED = tuple(sorted(p.stem for p in BUILTIN_DIR.glob("*.json")))
assert len(SHIPPED) >= 11, SHIPPED  # the folder was read: Qwen-Image, Flux, FLUX.2, SD3.5, SANA and the video cards


def params_by_name(card) -> dict:
    return {p.name: p for p in card.parameters}


# --- the shipped cards (pure) ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_card_is_small_and_names_its_source(name):
    path = BUILTIN_DIR / f"{name}.json"
    assert path.stat().st_size < 1_000_000
    card = load_card(name)
    assert card.source["preset"] == name
    assert card.source["class"] == card.class_name
    assert {p.stream for p in card.parameters} <= {"image", "text", "joint", "conditioning", "reference"}  # all traced


def test_qwen_image_counts_match_checked_facts():
    card = load_card("qwen-image")
    assert sum(p.numel for p in card.parameters if p.block == 0) == 339_831_296
    assert card.architecture.num_layers == 60
    assert card.component("vae").parameters == 126_892_531
    assert card.component("text_encoder").parameters == 8_292_166_656
    assert card.component("vae").working_bytes_per_pixel > 0


def test_the_shipped_cards_record_their_buffers_as_a_pipeline_holds_them():
    """SD3.5 Large's positional table is in the checkpoint, so from_pretrained loads it in the pipeline's dtype
    (171 MiB in bfloat16, whole on every chip); Wan's rotary tables are made by the class and stay float32; the
    other shipped classes register no floating buffer (recorded as none). A card without the field reads as one whose
    buffers are not known."""
    sd35 = load_card("sd3.5-large")
    assert [(b.name, b.shape, b.dtype, b.persistent) for b in sd35.buffers] == [
        ("pos_embed.pos_embed", (1, 36864, 2432), "bfloat16", True)]
    assert sd35.buffer_bytes("bfloat16") == 179_306_496 and sd35.buffer_bytes("float32") == 2 * 179_306_496
    wan = load_card("wan-2.1-t2v-14b")
    assert {(b.name, b.persistent) for b in wan.buffers} == {("rope.freqs_cos", False), ("rope.freqs_sin", False)}
    assert wan.buffer_bytes("bfloat16") == wan.buffer_bytes("float32") == 2 * 1024 * 128 * 4
    assert not load_card("qwen-image").buffers and not load_card("flux-dev").buffers
    data = card_to_json(sd35)
    assert card_from_json(data) == sd35
    del data["buffers"]  # a card imported before buffers were recorded: not known (the planner warns), counted 0
    old = card_from_json(data)
    assert old.buffers is None and old.buffer_bytes("bfloat16") == 0
    assert card_to_json(old) == data and card_to_json(load_card("qwen-image"))["buffers"] == []


@pytest.mark.parametrize("module, stream", [
    ("transformer_blocks.0.img_mod.1", "conditioning"),
    ("transformer_blocks.7.txt_mod.1", "conditioning"),
    ("transformer_blocks.0.attn.to_q", "image"),
    ("transformer_blocks.59.attn.add_q_proj", "text"),
    ("transformer_blocks.0.img_mlp.net.0.proj", "image"),
    ("transformer_blocks.0.txt_mlp.net.2", "text"),
    ("transformer_blocks.3.attn.norm_added_k", "text"),
    ("time_text_embed.timestep_embedder.linear_1", "conditioning"),
    ("norm_out.linear", "conditioning"),
    ("txt_in", "text"),
    ("proj_out", "image"),
])
def test_qwen_image_streams(module, stream):
    params = params_by_name(load_card("qwen-image"))
    assert params[f"{module}.weight"].stream == stream


def test_qwen_image_attention_joins_text_and_image():
    card = load_card("qwen-image")
    assert len(card.attention) == 60
    attn = card.attention[0]
    assert (attn.module, attn.heads, attn.head_dim) == ("transformer_blocks.0.attn", 24, 128)
    assert attn.streams == ("text", "image")
    assert attn.out == ("transformer_blocks.0.attn.to_out.0", "transformer_blocks.0.attn.to_add_out")
    assert len(attn.qkv) == 6


def test_the_attentions_a_forward_masks_are_marked_in_the_shipped_cards():
    """The traced forward passes a text mask to Qwen-Image's joint attention (its encoder_hidden_states_mask), to
    HunyuanVideo's (its encoder_attention_mask, the token refiner's too) and to LTX-Video's and SANA's
    cross-attention; FLUX.1's, SD3.5's, Wan's and CogVideoX's attention is called without one."""
    masked = {name: sum(a.masked for a in load_card(name).attention) for name in SHIPPED}
    assert masked["qwen-image"] == len(load_card("qwen-image").attention) == 60
    assert masked["hunyuan-video"] == 62 and masked["ltx-video"] == 28 and masked["sana-1600m"] == 20
    assert not any(masked[name] for name in ("flux-dev", "flux2-dev", "sd3.5-large", "wan-2.1-t2v-14b",
                                             "wan-2.1-i2v-14b", "wan-2.1-t2v-1.3b", "cogvideox-5b"))
    ltx = {a.module.split(".")[-1] for a in load_card("ltx-video").attention if a.masked}
    assert ltx == {"attn2"}  # its cross-attention


def test_flux_dev_streams_and_block_numbering():
    card = load_card("flux-dev")
    params = params_by_name(card)
    assert card.architecture.num_layers == 19 + 38
    assert params["single_transformer_blocks.0.proj_mlp.weight"].stream == "joint"
    assert params["single_transformer_blocks.0.proj_mlp.weight"].block == 19  # numbered after the dual blocks
    assert params["single_transformer_blocks.37.norm.linear.weight"].stream == "conditioning"
    assert params["transformer_blocks.0.norm1_context.linear.weight"].stream == "conditioning"
    assert params["transformer_blocks.0.ff_context.net.0.proj.weight"].stream == "text"
    assert params["time_text_embed.guidance_embedder.linear_1.weight"].stream == "conditioning"
    assert [c.name for c in card.components] == ["vae", "text_encoder", "text_encoder_2"]


def test_unknown_preset_is_an_input_error_listing_the_presets():
    from meshlab.models.importer.card_import import import_preset

    with pytest.raises(InputError, match="qwen-image"):
        import_preset("sdxl")


def test_importer_module_does_not_import_torch():
    code = "import sys, meshlab.models.importer.card_import, meshlab.models.presets; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


# --- importing (needs torch and diffusers) ------------------------------------------------------------------


@pytest.mark.xla
@pytest.mark.slow
@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_card_equals_a_fresh_import(name):
    pytest.importorskip("diffusers")
    from meshlab.models.importer.card_import import import_preset

    shipped = json.loads((BUILTIN_DIR / f"{name}.json").read_text(encoding="utf-8"))
    assert card_to_json(import_preset(name)) == shipped, "regenerate with: python -m meshlab.models.importer.card_import --all"


@pytest.mark.xla
def test_the_checks_build_the_buffers_a_card_records_as_from_pretrained_loads_them():
    """build_model (the CPU and DTensor checks, run's random pipeline) holds a persistent buffer in the workload's
    dtype, as from_pretrained converts what the checkpoint holds and the card records it, and a buffer the class
    makes in the dtype it made it: SD3.5's positional table in bfloat16, Wan's rotary tables in float32. The random
    weights stay in the workload's dtype, Wan's kept float32 ones too (the planner prices them so)."""
    pytest.importorskip("diffusers")
    import torch

    from meshlab.models.importer.build import build_model
    from meshlab.models.importer.card_import import import_card

    sd3 = {"sample_size": 32, "patch_size": 1, "in_channels": 4, "num_layers": 1, "attention_head_dim": 8,
           "num_attention_heads": 4, "caption_projection_dim": 32, "joint_attention_dim": 32,
           "pooled_projection_dim": 64, "out_channels": 4, "pos_embed_max_size": 96}
    wan = {"patch_size": [1, 2, 2], "num_attention_heads": 2, "attention_head_dim": 16, "in_channels": 4,
           "out_channels": 4, "text_dim": 32, "freq_dim": 16, "ffn_dim": 64, "num_layers": 1,
           "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads", "eps": 1e-06, "rope_max_seq_len": 32}
    for class_name, config, expected in (("SD3Transformer2DModel", sd3, {"pos_embed.pos_embed": torch.bfloat16}),
                                         ("WanTransformer3DModel", wan, {"rope.freqs_cos": torch.float32,
                                                                         "rope.freqs_sin": torch.float32})):
        card = import_card(class_name, config, "small")
        assert {b.name: b.dtype for b in card.buffers} == {k: str(v)[6:] for k, v in expected.items()}
        model = build_model(card, 1, "bfloat16", 0)
        assert {name: b.dtype for name, b in model.named_buffers()} == expected
        assert {p.dtype for p in model.parameters()} == {torch.bfloat16}


SMALL_QWEN = {  # diffusers' own test configuration
    "_class_name": "QwenImageTransformer2DModel", "patch_size": 2, "in_channels": 16, "out_channels": 4,
    "num_layers": 2, "attention_head_dim": 16, "num_attention_heads": 4, "joint_attention_dim": 16,
    "axes_dims_rope": [8, 4, 4],
}
SMALL_VAE = {"library": "diffusers", "class": "AutoencoderKL",
             "config": {"latent_channels": 4, "block_out_channels": [32, 64], "norm_num_groups": 32,
                        "down_block_types": ["DownEncoderBlock2D"] * 2, "up_block_types": ["UpDecoderBlock2D"] * 2}}


def test_wan_s_cards_hold_the_dtypes_from_pretrained_loads():
    """WanTransformer3DModel keeps its time embedder, norm2 and every scale_shift_table in float32
    (`_keep_in_fp32_modules`, matched on a parameter name's parts as diffusers loads them; the tables were recorded
    in bfloat16), and its blocks add the table to the conditioning in float32; Flux keeps nothing."""
    wan = load_card("wan-2.1-t2v-14b")
    kept = {p.name for p in wan.parameters if p.dtype == "float32"}
    assert {"blocks.0.scale_shift_table", "scale_shift_table", "blocks.0.norm2.weight",
            "condition_embedder.time_embedder.linear_1.weight"} <= kept
    assert all(p.dtype == "bfloat16" for p in wan.parameters if p.name not in kept)
    assert not {"blocks.0.attn1.to_q.weight", "condition_embedder.time_proj.weight"} & kept
    flow = {f.module: f for f in wan.dataflow}["condition_embedder.time_proj"]
    assert [m.dtype for m in flow.modulates] == ["float32", "float32"]
    flux = load_card("flux-dev")
    assert {p.dtype for p in flux.parameters} == {"bfloat16"}
    assert all(not m.dtype for f in flux.dataflow for m in f.modulates)


@pytest.mark.xla
def test_import_from_a_local_config_file(tmp_path):
    pytest.importorskip("diffusers")
    from meshlab.models.importer.card_import import import_from_config_file, write_card

    folder = tmp_path / "tiny-qwen"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(SMALL_QWEN), encoding="utf-8")
    card = import_from_config_file(folder / "config.json", components={"vae": SMALL_VAE})
    assert (card.name, card.class_name, card.source["preset"]) == ("tiny-qwen", "QwenImageTransformer2DModel", None)
    assert card.source["config"]["num_layers"] == 2 and "_class_name" not in card.source["config"]
    params = params_by_name(card)
    for block in (0, 1):
        assert params[f"transformer_blocks.{block}.img_mod.1.weight"].stream == "conditioning"
        assert params[f"transformer_blocks.{block}.attn.to_k.weight"].stream == "image"
        assert params[f"transformer_blocks.{block}.attn.add_v_proj.weight"].stream == "text"
        assert params[f"transformer_blocks.{block}.attn.norm_q.weight"].kind == "norm"
    assert card.architecture.hidden_size == 64 and card.architecture.mlp_ratio == 4.0
    assert card.architecture.vae_scale_factor == 2
    assert card.component("vae").working_bytes_per_pixel > 0

    path = write_card(card, tmp_path / "tiny.json")
    assert card_to_json(load_card(str(path))) == card_to_json(card)
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


@pytest.mark.xla
def test_small_flux_traces_single_blocks_as_joint():
    pytest.importorskip("diffusers")
    from meshlab.models.importer.card_import import import_card

    config = {"patch_size": 1, "in_channels": 4, "num_layers": 1, "num_single_layers": 2, "attention_head_dim": 16,
              "num_attention_heads": 2, "joint_attention_dim": 32, "pooled_projection_dim": 32,
              "guidance_embeds": True, "axes_dims_rope": [4, 4, 8]}
    card = import_card("FluxTransformer2DModel", config, "tiny-flux")
    params = params_by_name(card)
    assert params["single_transformer_blocks.1.proj_out.weight"].stream == "joint"
    assert params["single_transformer_blocks.1.proj_out.weight"].block == 2
    assert params["single_transformer_blocks.1.norm.linear.weight"].stream == "conditioning"
    assert params["transformer_blocks.0.attn.to_out.0.weight"].stream == "image"
    single = card.attention[-1]
    assert single.streams == ("text", "image") and single.out == ()  # the block's proj_out mixes attention and MLP


@pytest.mark.xla
def test_unsupported_class_is_an_input_error():
    pytest.importorskip("diffusers")
    from meshlab.models.importer.card_import import import_card

    with pytest.raises(InputError, match="FluxTransformer2DModel") as raised:
        import_card("PixArtTransformer2DModel", {}, "pixart")
    assert "no row for it" in str(raised.value)


@pytest.mark.xla
def test_small_hunyuan_video_imports_as_a_video_model_with_a_text_refiner():
    """HunyuanVideo: Flux's dual- and single-stream blocks over video latents patchified inside the model, and a
    token refiner (self-attention over the text alone) before the blocks. Its mask is HunyuanVideo's own
    encoder_attention_mask argument."""
    pytest.importorskip("diffusers")
    from meshlab.models.families import geometry
    from meshlab.models.importer.card_import import import_card

    config = {"in_channels": 4, "out_channels": 4, "num_attention_heads": 2, "attention_head_dim": 16,
              "num_layers": 1, "num_single_layers": 2, "num_refiner_layers": 1, "patch_size": 2, "patch_size_t": 1,
              "text_embed_dim": 32, "pooled_projection_dim": 16, "rope_axes_dim": [4, 6, 6], "guidance_embeds": True}
    card = import_card("HunyuanVideoTransformer3DModel", config, "tiny-hunyuan")
    arch = card.architecture
    assert (arch.in_channels, arch.patch_size, arch.temporal_patch, arch.num_layers) == (16, 2, 1, 3)
    assert (arch.vae_scale_factor, arch.temporal_scale_factor, arch.text_dim) == (8, 4, 32)  # no VAE: the pipeline's
    refiner, dual, single = card.attention[0], card.attention[1], card.attention[-1]
    assert refiner.module == "context_embedder.token_refiner.refiner_blocks.0.attn" and refiner.streams == ("text",)
    assert dual.module == "transformer_blocks.0.attn" and dual.streams == ("text", "image")
    assert single.module == "single_transformer_blocks.1.attn" and single.streams == ("text", "image")
    params = params_by_name(card)
    assert params["context_embedder.token_refiner.refiner_blocks.0.attn.to_q.weight"].stream == "text"
    assert params["context_embedder.token_refiner.refiner_blocks.0.attn.to_q.weight"].block is None
    assert params["single_transformer_blocks.1.proj_out.weight"].block == 2
    assert {j.kind for j in card.joins} == {"concat", "split"}
    # 720 x 1280 x 129 frames: 33 latent frames of 45 x 80 tokens, the 118,800 tokens of the example
    assert geometry(card, 720, 1280, 256, 1, frames=129).image_tokens == 33 * 45 * 80 == 118_800


def test_hunyuan_videos_vae_is_read_as_a_video_vae():
    from meshlab.models.importer.card_import import _latent_shape, _vae_scale_factor

    config = {"latent_channels": 16, "spatial_compression_ratio": 8, "temporal_compression_ratio": 4,
              "block_out_channels": [128, 256, 512, 512]}
    assert _vae_scale_factor(config) == (8, 4)  # as HunyuanVideoPipeline reads its VAE
    assert _latent_shape(config, 8, frames=3) == (1, 16, 3, 8, 8)
    assert _vae_scale_factor({"block_out_channels": [128, 256, 512, 512]}) == (8, 1)  # an image VAE


@pytest.mark.xla
@pytest.mark.slow
def test_the_narrow_flux2_card_of_the_agreement_matrix_equals_a_fresh_import():
    """tests/cost/data/cards/flux2-dev-narrow.json: FLUX.2-dev's preset at 16 heads (2048 wide), the width at which
    8 CPU replicas of its blocks fit this project's 24 GiB test host."""
    pytest.importorskip("diffusers")
    from meshlab.models.importer.card_import import import_card
    from meshlab.models.presets import PRESETS

    from tests.conftest import REPO

    preset = PRESETS["flux2-dev"]
    fresh = import_card(preset.class_name, {**preset.config, "num_attention_heads": 16}, "flux2-dev-narrow")
    shipped = json.loads((REPO / "tests" / "cost" / "data" / "cards" / "flux2-dev-narrow.json").read_text())
    assert card_to_json(fresh) == shipped


# --- the traced dataflow (pure, on the shipped cards) ------------------------------------------------------


def flows_of(name: str) -> dict:
    return {f.module: f for f in load_card(name).dataflow}


def test_qwen_image_dataflow_says_which_op_feeds_which():
    flows = flows_of("qwen-image")
    b = "transformer_blocks.*"
    assert flows[f"{b}.attn.to_q"].reads == (f"linear:{b}.img_mod.1", f"norm:{b}.img_norm1|image")
    assert flows[f"{b}.attn.to_q"].attention == f"{b}.attn"
    assert flows[f"{b}.attn.to_add_out"].reads == (f"attention:{b}.attn",)
    assert flows[f"{b}.img_mlp.net.2"].reads == (f"linear:{b}.img_mlp.net.0.proj",)
    assert [(m.norm, m.stream, m.width) for m in flows[f"{b}.txt_mod.1"].modulates] == [
        (f"{b}.txt_norm1", "text", 3072), (f"{b}.txt_norm2", "text", 3072)]
    assert [(m.norm, m.stream) for m in flows["norm_out.linear"].modulates] == [("norm_out.norm", "image")]
    assert flows[f"{b}.txt_mlp.net.2"].residual  # traced over two blocks: block 0's text stream feeds block 1


def test_flux_single_blocks_read_the_norm_not_proj_out():
    """Flux registers proj_out before attn in its single blocks; the trace, not the order, says who reads what."""
    flows = flows_of("flux-dev")
    s = "single_transformer_blocks.*"
    assert flows[f"{s}.attn.to_q"].reads == (f"linear:{s}.norm.linear", f"norm:{s}.norm.norm|joint")
    assert flows[f"{s}.proj_out"].reads == (f"attention:{s}.attn", f"linear:{s}.proj_mlp")
    assert [(m.stream, m.width) for m in flows[f"{s}.norm.linear"].modulates] == [("joint", 3072)]


def try_old_card(tmp_path, card: dict) -> list[str]:
    """`meshlab try` on a strategy naming `card` written as old.json: asserts exit 2; the lines it printed."""
    from typer.testing import CliRunner

    from meshlab.cli.app import app

    (tmp_path / "old.json").write_text(json.dumps(card))
    strategy = tmp_path / "s.yaml"
    strategy.write_text("name: t\nmodel: old.json\nhardware: v6e-8\nmesh: {model: 8}\n")
    result = CliRunner().invoke(app, ["try", str(strategy)])
    assert result.exit_code == 2
    return result.stderr.strip().splitlines()


def test_a_card_of_the_older_schema_is_refused_with_the_command_that_regenerates_it(tmp_path):
    old = json.loads((BUILTIN_DIR / "flux-dev.json").read_text())
    old["schema_version"] = 1
    del old["dataflow"]
    lines = try_old_card(tmp_path, old)
    assert len(lines) == 1 and "old.json" in lines[0] and "schema 1" in lines[0], lines
    assert "meshlab models import flux-dev -o" in lines[0]


def test_a_card_of_schema_2_is_refused_saying_what_it_lacks(tmp_path):
    """Schema 2 cards (before video models and cross-attention keys) are one line naming the file and the fix."""
    old = json.loads((BUILTIN_DIR / "qwen-image.json").read_text())
    old["schema_version"] = 2
    for key in ("temporal_scale_factor", "temporal_patch"):
        del old["architecture"][key]
    lines = try_old_card(tmp_path, old)
    assert len(lines) == 1 and "old.json" in lines[0] and "schema 2" in lines[0], lines
    assert "video compression" in lines[0] and "meshlab models import qwen-image -o" in lines[0]


def test_a_card_of_schema_3_is_refused_saying_it_lacks_the_traced_rotary_and_norms(tmp_path):
    """Schema 3 cards name no rotated projections or q/k norms: read as they are, Wan would lose collectives."""
    old = json.loads((BUILTIN_DIR / "wan-2.1-t2v-14b.json").read_text())
    old["schema_version"] = 3
    for flow in old["dataflow"]:
        flow.pop("rotary", None), flow.pop("qk_norm", None)
    lines = try_old_card(tmp_path, old)
    assert len(lines) == 1 and "old.json" in lines[0] and "schema 3" in lines[0], lines
    assert "rotary" in lines[0] and "meshlab models import wan-2.1-t2v-14b -o" in lines[0]


def test_a_card_of_schema_4_is_refused_saying_it_lacks_the_joined_rotary_and_join_edges(tmp_path):
    """Schema 4 cards say nothing of rotations after a join or of joins at a block's edge: read as they are, Flux
    under a sequence split would lose the all-to-alls XLA:TPU issues twice and keep joins it folds."""
    old = json.loads((BUILTIN_DIR / "flux-dev.json").read_text())
    old["schema_version"] = 4
    for flow in old["dataflow"]:
        flow.pop("rotary_joint", None), flow.pop("rotary_part", None)
    for join in old["joins"]:
        join.pop("edge", None)
    lines = try_old_card(tmp_path, old)
    assert len(lines) == 1 and "old.json" in lines[0] and "schema 4" in lines[0], lines
    assert "joined streams" in lines[0] and "meshlab models import flux-dev -o" in lines[0]


def test_flux_single_blocks_join_and_split_the_streams_outside_attention():
    """Flux's single blocks concatenate text and image tokens at their start and cut them apart at their end (the
    join's parts are the block's arguments, the cut's parts what it returns); HunyuanVideo's first cut is its norm's
    output, inside the block; Qwen-Image joins them only inside attention (q/k/v), which the attention's own rules
    price."""
    from meshlab.models.card import Join

    assert load_card("flux-dev").joins == (Join("single_transformer_blocks.*", "concat", 3072, "start"),
                                            Join("single_transformer_blocks.*", "split", 3072, "end"))
    assert load_card("hunyuan-video").joins == (Join("single_transformer_blocks.*", "concat", 3072, "start"),
                                                 Join("single_transformer_blocks.*", "split", 3072))
    assert load_card("qwen-image").joins == ()


def test_the_trace_says_which_attentions_rotate_the_joined_streams():
    """Flux.1 and FLUX.2 join both streams' q and k, then rotate them; Qwen-Image and HunyuanVideo rotate each
    stream's before joining, and a single block's one projection of the joint sequence is no join."""
    def joint(name: str) -> set[str]:
        return {m for m, f in flows_of(name).items() if f.rotary_joint}

    b = "transformer_blocks.*.attn"
    both = {f"{b}.to_q", f"{b}.to_k", f"{b}.add_q_proj", f"{b}.add_k_proj"}
    assert joint("flux-dev") == joint("flux2-dev") == both
    assert flows_of("flux-dev")["single_transformer_blocks.*.attn.to_q"].rotary == "whole"
    assert joint("qwen-image") == joint("hunyuan-video") == set()
    assert flows_of("qwen-image")[f"{b}.to_q"].rotary == "whole"


def test_the_trace_says_which_attentions_rotate_part_of_a_joint_sequence_and_join_it_again():
    """HunyuanVideo's single blocks rotate the image tokens of their joint q and k and concatenate the text's back;
    CogVideoX writes its rotated image tokens back in place (no join); Wan rotates every token, as pairs."""
    def part(name: str) -> set[str]:
        return {m for m, f in flows_of(name).items() if f.rotary_part}

    s = "single_transformer_blocks.*.attn"
    assert part("hunyuan-video") == {f"{s}.to_q", f"{s}.to_k"}
    assert flows_of("cogvideox-5b")["transformer_blocks.*.attn1.to_q"].rotary == "whole"
    assert part("cogvideox-5b") == part("wan-2.1-t2v-14b") == part("flux-dev") == set()


def test_elementwise_trace_round_trips_and_a_bad_entry_is_a_one_line_error():
    from meshlab.models.card import card_from_json

    data = card_to_json(load_card("qwen-image"))
    assert card_from_json(data).elementwise == load_card("qwen-image").elementwise
    assert {e.execution for e in card_from_json(data).elementwise} == {"fused", "eager"}
    assert all(("execution" in e) == (e.get("execution") == "eager") for e in data["elementwise"])  # fused: implied
    data["elementwise"][0]["stream"] = "pixels"
    with pytest.raises(InputError, match="elementwise.0.stream: Input should be 'image', 'text', 'joint' or 'reference'"):
        card_from_json(data, "bad.json")
    data["elementwise"][0] |= {"stream": "image", "execution": "lazy"}
    with pytest.raises(InputError, match="elementwise.0.execution: Input should be 'fused' or 'eager'") as caught:
        card_from_json(data, "bad.json")
    assert caught.value.location.file == "bad.json" and "\n" not in caught.value.one_line()
    data["elementwise"][0] |= {"execution": "eager", "side": "in", "linear": ""}
    with pytest.raises(InputError, match="a Linear is named on the 'in' and 'out' sides and only there"):
        card_from_json(data, "bad.json")


@pytest.mark.parametrize("dispatches, problem", [
    ({"transformer_block": 96}, "not a block list of the card"),
    ({"transformer_blocks": -1}, "dispatches.transformer_blocks: Input should be greater than or equal to 0"),
    ({"transformer_blocks": 9.5}, "dispatches.transformer_blocks: Input should be a valid integer"),
])
def test_dispatches_round_trip_and_a_bad_count_is_a_one_line_error(dispatches, problem):
    from meshlab.models.card import card_from_json

    data = card_to_json(load_card("qwen-image"))
    assert card_from_json(data).dispatches == load_card("qwen-image").dispatches == data["dispatches"]
    assert set(data["dispatches"]) == {"transformer_blocks", "outside"}
    data["dispatches"] = dispatches
    with pytest.raises(InputError, match=problem):
        card_from_json(data, "bad.json")
    del data["dispatches"]
    assert card_from_json(data).dispatches == {}  # a card imported before they were counted: no launch floor


def test_a_card_meshlab_could_not_read_back_is_never_written(tmp_path):
    import dataclasses

    from meshlab.models.importer.card_import import write_card

    broken = dataclasses.replace(load_card("qwen-image"), dispatches={"nope": 3})
    with pytest.raises(InputError, match="dispatches names \\['nope'\\], not a block list of the card") as caught:
        write_card(broken, tmp_path / "broken.json")
    assert caught.value.location.file == str(tmp_path / "broken.json") and list(tmp_path.iterdir()) == []
