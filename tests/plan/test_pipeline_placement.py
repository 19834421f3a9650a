"""The whole pipeline per chip: where the text encoders and the VAE live, how the VAE decodes (full, tiled,
parallel), and the peak as the largest of the encode, denoise and decode phases."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from meshlab.models.card import DTYPE_BYTES, load_card
from meshlab.cli.app import app
from meshlab.cost.predict import predict
from meshlab.plan.memory import DecodeShare, decode_share, vae_decode_bytes
from meshlab.plan.planned import plan_file

from tests.conftest import REPO

runner = CliRunner()

WAN_8_H100 = """\
    name: wan-8
    model: wan-2.1-t2v-14b
    hardware: h100
    mesh: {{seq: 8}}
    rules: [{{match: "*", shard: replicate}}]
    activations: {{sequence: seq, sequence_parallel: xdit}}
    placement: {placement}
    workload: {{height: 720, width: 1280, frames: 81, batch: 1}}
    """


def test_diffusers_tiles_qwen_images_vae_in_256_pixel_tiles_every_192():
    """AutoencoderKLQwenImage's tiled decode: tiles of 256 starting every 192 pixels, the edge ones cut at the
    image (1024 = starts 0, 192, ..., 960: five whole tiles and one of 64 on each side)."""
    vae = load_card("qwen-image").component("vae")
    assert (vae.tile, vae.tile_stride) == ((256, 256), (192, 192))
    share = decode_share(vae, "tiled", 1024, 1024, 8)
    side = 5 * 256 + 64
    assert share == DecodeShare(256 * 256, side * side, 36)
    assert decode_share(vae, "tiled", 256, 256, 8) == DecodeShare(256 * 256, 256 * 256, 1)  # fits one tile
    assert decode_share(vae, "full", 1024, 1024, 8) == DecodeShare(1024 * 1024, 1024 * 1024, 1)
    assert decode_share(vae, "parallel", 1024, 1024, 8) == DecodeShare(128 * 1024, 128 * 1024, 1)


def test_flux_vae_tiles_only_past_its_1024_pixel_tile():
    vae = load_card("flux-dev").component("vae")
    assert (vae.tile, vae.tile_stride) == ((1024, 1024), (768, 768))  # sample_size 1024, overlap 0.25
    assert decode_share(vae, "tiled", 1024, 1024, 1).pieces == 1
    assert decode_share(vae, "tiled", 2048, 2048, 1).pieces == 9


def test_a_tiled_decode_holds_one_tiles_working_set_and_the_tiles_it_blends():
    card = load_card("wan-2.1-t2v-14b")
    vae = card.component("vae")
    share = decode_share(vae, "tiled", 720, 1280, 1)
    got = vae_decode_bytes(vae.working_bytes_per_pixel, card.architecture, 720, 1280, 81, 2, share)
    tile, image = vae.tile[0] * vae.tile[1], 3 * 81 * 2  # bytes of the decoded video per pixel
    # every decoded tile kept, beside the larger of the last tile's working set and the blend's two image copies
    assert got == image * share.computed_pixels + max(int(vae.working_bytes_per_pixel * tile),
                                                      image * 2 * 720 * 1280)
    full = vae_decode_bytes(vae.working_bytes_per_pixel, card.architecture, 720, 1280, 81, 2)
    assert got < full / 3


def test_placement_changes_what_each_chip_holds_and_the_peak_phase(write_strategy):
    full = plan_file(write_strategy(WAN_8_H100.format(placement="{text_encoder: device}"))).memory.most_loaded
    sharded = plan_file(write_strategy(WAN_8_H100.format(
        placement="{text_encoder: sharded, vae_decode: parallel}"))).memory.most_loaded
    card = load_card("wan-2.1-t2v-14b")
    encoder, itemsize = card.component("text_encoder"), DTYPE_BYTES["bfloat16"]
    working = encoder.encode_working_set(512, itemsize)  # one 512-token prompt's encode, as the card traced it
    assert full.text_encoder == encoder.parameters * itemsize and full.text_encode == working > 0
    # a shard of its layers each, and FSDP's root unit (the token embedding) whole on every chip
    layers = encoder.parameters - encoder.root_parameters
    assert encoder.root_parameters > 256384 * 4096  # UMT5's embedding is in it
    assert sharded.text_encoder == (-(-layers // 8) + encoder.root_parameters) * itemsize
    assert sharded.text_encode == encoder.largest_layer_parameters * itemsize + working  # a layer gathered besides
    assert full.peak_phase == "decode" and full.vae_decode > 4 * sharded.vae_decode  # rows of 720 split 8 ways
    assert sharded.total < full.total


def test_a_sharded_encoder_pays_its_weight_gathers_and_a_parallel_decode_splits_its_time(write_strategy):
    def terms(placement):
        planned = plan_file(write_strategy(WAN_8_H100.format(placement=placement)))
        return planned, predict(planned.plan, planned.strategy, planned.hardware).terms

    planned, device = terms("{text_encoder: device}")
    _, sharded = terms("{text_encoder: sharded, vae_decode: parallel}")
    hw = planned.hardware
    encoder = planned.card.component("text_encoder")
    layers = encoder.parameters - encoder.root_parameters  # the root unit stays gathered between encodes
    gathers = 2 * layers * 2 * 7 / 8 / hw.ici_link_bandwidth  # cfg: two encodes
    assert sharded.text_encode_s == pytest.approx(device.text_encode_s + gathers)
    assert sharded.vae_decode_s < device.vae_decode_s / 4


def test_parallel_vae_on_a_tpu_is_refused_at_its_line(write_strategy):
    path = write_strategy("""\
        name: t
        model: qwen-image
        hardware: v6e-8
        mesh: {data: 8}
        placement: {vae_decode: parallel}
        """)
    result = runner.invoke(app, ["try", str(path)])
    assert result.exit_code == 2
    line = result.stderr.strip().splitlines()
    assert len(line) == 1 and f"{path}:5:" in line[0] and "use full or tiled" in line[0], line


def test_a_sharded_encoder_on_one_chip_is_a_whole_one(write_strategy):
    one = WAN_8_H100.replace("{{seq: 8}}", "{{seq: 1}}").replace("sequence: seq, ", "")
    sharded = plan_file(write_strategy(one.format(placement="{text_encoder: sharded}"))).memory.most_loaded
    device = plan_file(write_strategy(one.format(placement="{text_encoder: device}"))).memory.most_loaded
    assert (sharded.text_encoder, sharded.text_encode) == (device.text_encoder, device.text_encode)
    assert device.text_encode > 0  # the encode's own working set, no layer gathered


def test_a_parallel_decode_on_the_host_is_refused(write_strategy):
    path = write_strategy(WAN_8_H100.format(placement="{vae: cpu, vae_decode: parallel}"))
    result = runner.invoke(app, ["try", str(path)])
    assert result.exit_code == 2 and "the VAE runs on the host" in result.stderr, result.stderr


@pytest.mark.parametrize("command", [["run", "--checkpoint", "random"], ["profile", "-o", "out.json"]])
def test_run_and_profile_refuse_what_their_pipelines_do_not_do(write_strategy, tmp_path, command):
    """meshlab's pipelines decode whole and keep the text encoder whole: a tiled decode is refused at its line
    before anything is built."""
    path = write_strategy("""\
        name: t
        model: qwen-image
        hardware: v6e-8
        mesh: {data: 8}
        placement: {vae_decode: tiled}
        """)
    args = [command[0], str(path), *command[1:]]
    if command[0] == "profile":
        args[-1] = str(tmp_path / "out.json")
    result = runner.invoke(app, args)
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and f"{path}:5:" in lines[0], result.stderr
    assert "placement.vae_decode: full" in lines[0] and not (tmp_path / "out.json").exists()


def test_weights_held_in_float32_and_a_float32_vae_double_what_they_hold_and_nothing_else():
    """Wan's official code holds its DiT in float32 between uses (FSDP shards kept at full precision, computed in
    bfloat16) and runs its VAE in float32: `workload.weights_dtype` doubles the weights per chip, `placement.vae_dtype`
    the VAE's weights and its decode's working set; activations, the text encoder and the time stay as they were."""
    import yaml

    from meshlab.core.hardware import load_hardware
    from meshlab.plan.memory import memory_report
    from meshlab.plan.planner import make_plan
    from meshlab.strategy.schema import Strategy

    base = yaml.safe_load(WAN_8_H100.format(placement="{text_encoder: sharded}"))
    base["rules"] = [{"match": "blocks.*", "min_rank": 2, "shard": "largest", "axis": "seq"},
                     {"match": "*", "shard": "replicate"}]
    plain = Strategy.model_validate(base)
    held = Strategy.model_validate({**base, "workload": {**base["workload"], "weights_dtype": "float32"},
                                    "placement": {**base["placement"], "vae_dtype": "float32"}})
    card = load_card("wan-2.1-t2v-14b")
    a, b = (memory_report(make_plan(s, card, 8), s, 80 * 2**30, 0).most_loaded for s in (plain, held))
    assert a.weights_sharded > 0 and a.weights_replicated > 0
    assert (b.weights_sharded, b.weights_replicated) == (2 * a.weights_sharded, 2 * a.weights_replicated)
    assert (b.vae_weights, b.vae_decode) == (2 * a.vae_weights, 2 * a.vae_decode)
    assert (b.activations, b.text_encoder) == (a.activations, a.text_encoder)
    h100 = load_hardware("h100").using(8)
    assert predict(make_plan(plain, card, 8), plain, h100).step.total == predict(make_plan(held, card, 8), held,
                                                                                 h100).step.total


def test_a_check_holds_the_weights_as_the_checked_program_does_whatever_a_script_stores(tmp_path):
    """`check` compiles at workload.dtype: the memory-only weights_dtype and vae_dtype (a PyTorch script's storage)
    do not reach what it compares with XLA, and do not change the compile-time key."""
    import yaml

    from meshlab.check.setup import CheckOptions, check_setup
    from meshlab.plan.compile_times import compile_key

    doc = yaml.safe_load((REPO / "strategies" / "2d.yaml").read_text())
    plain, stored = tmp_path / "plain.yaml", tmp_path / "stored.yaml"
    plain.write_text(yaml.safe_dump(doc))
    doc["workload"]["weights_dtype"] = "float32"
    doc["placement"]["vae_dtype"] = "float32"
    stored.write_text(yaml.safe_dump(doc))
    options = CheckOptions(layers=2, height=256, width=256, text_tokens=32)
    a, b = check_setup(plain, options), check_setup(stored, options)
    assert a.memory.most_loaded.weights == b.memory.most_loaded.weights
    assert a.memory.most_loaded.vae_decode == b.memory.most_loaded.vae_decode
    held, computed = plan_file(stored).memory.most_loaded, plan_file(plain).memory.most_loaded
    # the shards take twice the bytes; a TPU's tiles pad them by float32's tiles (a 1-D tile of 128, not 256)
    assert held.weights - held.tile_padding == 2 * (computed.weights - computed.tile_padding)
    assert 0 < held.tile_padding < computed.tile_padding
    assert compile_key(plan_file(plain).strategy, a.card, "v6e-8") == compile_key(plan_file(stored).strategy, b.card,
                                                                                 "v6e-8")


WAN_I2V_4_H100 = WAN_8_H100.replace("wan-8", "wan-i2v-4").replace("t2v", "i2v").replace("{{seq: 8}}", "{{seq: 4}}")


def test_each_encoder_has_its_own_place_where_placement_names_it(write_strategy):
    """Wan's I2V script shards T5 (--t5_fsdp) and builds its CLIP image encoder whole on every GPU: `encoders`
    places one encoder otherwise than `text_encoder` places the rest, in memory and in time."""
    def planned(placement):
        return plan_file(write_strategy(WAN_I2V_4_H100.format(placement=placement)))

    apart = planned("{text_encoder: sharded, encoders: {image_encoder: device}}")
    together = planned("{text_encoder: sharded}")
    card = apart.card
    t5, clip = card.component("text_encoder"), card.component("image_encoder")
    itemsize = DTYPE_BYTES["bfloat16"]
    t5_shard = -(-(t5.parameters - t5.root_parameters) // 4) + t5.root_parameters
    clip_shard = -(-(clip.parameters - clip.root_parameters) // 4) + clip.root_parameters
    assert apart.memory.most_loaded.text_encoder == (t5_shard + clip.parameters) * itemsize
    assert together.memory.most_loaded.text_encoder == (t5_shard + clip_shard) * itemsize
    # only T5 gathers a layer; the phase holds its encode of the 512-token prompt beside it (CLIP's of the image,
    # encoded apart, is smaller)
    t5_encode = t5.largest_layer_parameters * itemsize + t5.encode_working_set(512, itemsize)
    assert apart.memory.most_loaded.text_encode == t5_encode > clip.encode_working_set(512, itemsize) > 0
    # the whole CLIP gathers nothing: the encode is faster by its gather over the link, and nothing else
    a, b = (predict(p.plan, p.strategy, p.hardware).terms for p in (apart, together))
    gather = (clip.parameters - clip.root_parameters) * itemsize * 3 / 4 / apart.hardware.ici_link_bandwidth
    assert b.text_encode_s - a.text_encode_s == pytest.approx(gather)
    on_host = planned("{text_encoder: cpu, encoders: {image_encoder: device}}")
    assert on_host.memory.most_loaded.text_encoder == clip.parameters * itemsize
    # the host's share of the encode is T5's alone (what `try` calls the text encoder on the host)
    terms = predict(on_host.plan, on_host.strategy, on_host.hardware).terms
    t5_s = (t5.flops_per_token + t5.head_flops_per_token) * (512 + t5.prefix_tokens) * 2 / on_host.hardware.host_flops
    assert terms.text_encode_host_s == pytest.approx(t5_s) and terms.text_encode_s > terms.text_encode_host_s


def test_an_encoder_the_card_does_not_have_is_one_line_at_its_name(write_strategy):
    path = write_strategy(WAN_I2V_4_H100.format(placement="{text_encoder: cpu, encoders: {text_encoder_2: device}}"))
    result = runner.invoke(app, ["try", str(path)])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1 and f"{path}:7:" in lines[0], result.stderr
    assert "'text_encoder_2'" in lines[0] and "name one of text_encoder, image_encoder" in lines[0]


def test_a_sharded_encoder_named_alone_is_refused_where_a_tool_keeps_encoders_whole(write_strategy):
    path = write_strategy("""\
        name: t
        model: flux-dev
        hardware: h100
        mesh: {data: 4}
        activations: {batch: data}
        placement:
          text_encoder: device
          encoders: {text_encoder_2: sharded}
        """)
    export = runner.invoke(app, ["export", str(path), "--format", "xdit"])
    lines = export.stderr.strip().splitlines()
    assert export.exit_code == 2 and len(lines) == 1 and f"{path}:8:" in lines[0], export.stderr
    assert "placement.encoders.text_encoder_2: sharded" in lines[0]
    run = runner.invoke(app, ["run", str(path), "--checkpoint", "random"])
    lines = run.stderr.strip().splitlines()
    assert run.exit_code == 2 and len(lines) == 1 and f"{path}:8:" in lines[0], run.stderr
    assert "set placement.encoders.text_encoder_2: cpu or device" in lines[0]
