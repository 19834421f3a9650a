"""Time to first image: the checkpoint read, the copy to the chips, the compile and the first call."""

import json

import pytest

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
    assert s.compiled_blocks == 60 and s.stacked_blocks == 0
    assert s.compile_s == hw.compile_seconds_base + 60 * hw.compile_seconds_per_block and not s.compile_measured
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
    hw = planned.hardware
    assert (p.startup.compiled_blocks, p.startup.stacked_blocks) == (1, 60)  # one body; every block's weights stacked
    assert p.startup.compile_s == pytest.approx(
        hw.compile_seconds_base + hw.compile_seconds_per_block + 60 * hw.compile_seconds_per_scanned_block)
    gpu = tmp_path / "gpu.yaml"
    gpu.write_text(text.replace("hardware: v6e-8", "hardware: h100"))
    planned = plan_file(gpu)
    p = predict(planned.plan, planned.strategy, planned.hardware)
    assert p.time_to_first_image == p.startup.read_s + p.startup.transfer_s + p.first_call_s


def _least_squares(points):
    n = len(points)
    mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return my - slope * mx, slope


def test_the_compile_model_is_the_least_squares_line_of_the_recorded_compiles():
    """The catalog's TPU compile figures are the fit of the compiles benchmarks/tpu_compile_depth.py recorded (2d,
    pairs, fsdp and hybrid on v6e-8 at 2 to 60 blocks, unrolled; then scanned at 8 and 60), each to its rounding,
    and every whole plan's full-depth compile lies within the spread the source states (62 s to 163 s)."""
    from meshlab.core.hardware import load_hardware

    hw = load_hardware("v6e-8")
    unrolled = json.loads((REPO / "benchmarks" / "results" / "tpu_compile_depth.json").read_text())["points"]
    assert {p["strategy"] for p in unrolled} == {"2d", "pairs", "fsdp", "hybrid"}
    base, per_block = _least_squares([(p["layers"], p["compile_s"]) for p in unrolled])
    assert (hw.compile_seconds_base, hw.compile_seconds_per_block) == (round(base, 1), round(per_block, 2))
    full = {p["strategy"]: p["compile_s"] for p in unrolled if p["layers"] == 60}
    assert (round(min(full.values())), round(max(full.values()))) == (62, 163)
    assert "62 s (hybrid) to 163 s (fsdp)" in hw.sources["compile_seconds_base"]
    scanned = json.loads((REPO / "benchmarks" / "results" / "tpu_compile_depth_scan.json").read_text())["points"]
    whole = [(p["layers"], p["compile_s"] - hw.compile_seconds_base - hw.compile_seconds_per_block)
             for p in scanned if p["fits_xla"]]  # a plan whose stacked copy does not fit stops early
    assert len(whole) == 7 and all(p["scanned"] for p in scanned)
    stacked = sum(x * y for x, y in whole) / sum(x * x for x, _ in whole)
    assert hw.compile_seconds_per_scanned_block == round(stacked, 3)
