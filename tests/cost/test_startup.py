"""Time to first image: the checkpoint read, the copy to the chips, the compile and the first call."""

from meshlab.cost.predict import predict
from meshlab.plan.planned import plan_file
from tests.conftest import REPO

#: Qwen-Image's transformer, text encoder and VAE (`meshlab models list`), in bf16
QWEN_CHECKPOINT_BYTES = 2 * (20_430_401_088 + 8_292_166_656 + 126_892_531)


def test_a_tpu_plan_reads_the_checkpoint_compiles_every_block_then_runs_a_call():
    planned = plan_file(REPO / "strategies" / "2d.yaml")
    p = predict(planned.plan, planned.strategy, planned.hardware)
    s, hw = p.startup, planned.hardware
    assert s.checkpoint_bytes == QWEN_CHECKPOINT_BYTES and s.read_s == QWEN_CHECKPOINT_BYTES / 1e9
    chip = planned.memory.most_loaded  # text encoder on the host: only the transformer's shards and the VAE move
    shards = chip.weights - chip.tile_padding  # the shards' bytes: the tiles' padding is the chip's own layout
    assert s.transfer_s == (shards + chip.vae_weights) / hw.host_link_bandwidth and chip.text_encoder == 0
    # shared/reference/tpu-aot.md measured XLA:TPU's compile of this model for v6e:2x4: 94 s at 60 blocks
    assert s.compiled_blocks == 60 and abs(s.compile_s - 94) < 1.0
    assert p.time_to_first_image == s.total + p.first_call_s and p.first_call_s == p.seconds_per_image * 2
    assert abs(p.usd_to_first_image - 2.70 * 8 * p.time_to_first_image / 3600) < 1e-12
    assert abs(p.usd_per_image_over(2) - p.usd_to_first_image / 2) < 1e-12  # one call makes both images
    assert p.usd_per_image_over(3) > p.usd_per_image_over(4)  # a part-empty second call costs the same as a full one
    assert abs(p.usd_per_image_over(10**6) / p.usd_per_image - 1) < 0.001


def test_a_scanned_list_compiles_one_body_and_eager_gpus_compile_nothing(tmp_path):
    text = (REPO / "strategies" / "2d.yaml").read_text()
    assert "compile:" not in text
    scanned = tmp_path / "scan.yaml"
    scanned.write_text(text + "\ncompile: {scan_blocks: true}\n")
    planned = plan_file(scanned)
    p = predict(planned.plan, planned.strategy, planned.hardware)
    assert p.startup.compiled_blocks == 1 and abs(p.startup.compile_s - 33.0) < 1.0  # 32 s + one block body
    gpu = tmp_path / "gpu.yaml"
    gpu.write_text(text.replace("hardware: v6e-8", "hardware: h100"))
    planned = plan_file(gpu)
    p = predict(planned.plan, planned.strategy, planned.hardware)
    assert p.time_to_first_image == p.startup.read_s + p.startup.transfer_s + p.first_call_s
