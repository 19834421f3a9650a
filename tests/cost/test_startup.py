"""Time to first image: the checkpoint read, the copy to the chips, the compile and the first call."""

from meshlab.cost.predict import predict
from meshlab.hardware import load_hardware
from meshlab.planning import plan_file
from tests.conftest import REPO

QWEN_PARAMS = 20_430_401_088  # the transformer (README, `meshlab try`)


def test_a_tpu_plan_reads_the_checkpoint_compiles_every_block_then_runs_a_call():
    planned = plan_file(REPO / "strategies" / "2d.yaml")
    p = predict(planned.plan, planned.strategy, planned.hardware)
    s, hw = p.startup, planned.hardware
    components = sum(c.parameters for c in planned.card.components)  # text encoder and VAE, loaded beside it
    assert s.checkpoint_bytes == 2 * (QWEN_PARAMS + components)  # bf16
    assert s.read_s == s.checkpoint_bytes / 1e9  # the catalog's assumed 1 GB/s
    chip = planned.memory.most_loaded
    assert s.transfer_s == (chip.weights + chip.vae_weights + chip.text_encoder) / hw.host_link_bandwidth
    assert s.compiled_blocks == 60 and abs(s.compile_s - (32.0 + 1.03 * 60)) < 1e-9  # tpu-aot.md's fit
    assert p.time_to_first_image == s.total + p.seconds_per_image * p.layout.images
    assert abs(p.usd_to_first_image - 2.70 * 8 * p.time_to_first_image / 3600) < 1e-12
    over_ten = 2.70 * 8 * (s.total + 10 * p.seconds_per_image) / 3600 / 10
    assert abs(p.usd_per_image_over(10) - over_ten) < 1e-12 and p.usd_per_image_over(10) > p.usd_per_image


def test_a_scanned_list_compiles_one_body_and_eager_gpus_compile_nothing(tmp_path):
    text = (REPO / "strategies" / "2d.yaml").read_text()
    scanned = tmp_path / "scan.yaml"
    scanned.write_text(text + "\ncompile: {scan_blocks: true}\n" if "compile:" not in text else text)
    planned = plan_file(scanned)
    assert predict(planned.plan, planned.strategy, planned.hardware).startup.compiled_blocks == 1
    gpu = tmp_path / "gpu.yaml"
    gpu.write_text(text.replace("hardware: v6e-8", "hardware: h100"))
    planned = plan_file(gpu)
    p = predict(planned.plan, planned.strategy, planned.hardware)
    assert load_hardware("h100").compile_seconds_base == 0 and p.startup.compile_s == 0
