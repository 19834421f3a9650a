"""`meshlab run --checkpoint random` (the card's pipeline at real width, random weights) and `--backend torch`
(plain PyTorch on one device, no torch_xla), and how `--backend auto` picks."""

import importlib.util

import pytest
from typer.testing import CliRunner

from meshlab.cli.app import app
from meshlab.experiments.records import read_records
from meshlab.experiments.run import resolve_backend

from tests.conftest import REPO

ONE_DEVICE = """\
name: one-h200
model: qwen-image
hardware: h200:1
mesh: {model: 1}
workload: {height: 256, width: 256, batch: 1, steps: 2}
"""


def invoke(args, tmp_path):
    out, results = tmp_path / "out", tmp_path / "results"
    result = CliRunner().invoke(app, ["run", *args, "--out", str(out), "--results", str(results)])
    return result, out, results


@pytest.mark.parametrize("devices, nvidia, visible, expected", [
    (1, True, None, "torch"), (8, True, None, "dtensor"), (8, False, None, "xla"), (1, True, "", "xla"),
])
def test_auto_picks_plain_pytorch_or_dtensor_on_a_cuda_host(monkeypatch, devices, nvidia, visible, expected):
    monkeypatch.setattr("os.path.exists", lambda path: nvidia and path == "/dev/nvidiactl")
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert resolve_backend("auto", devices) == expected
    assert resolve_backend("dtensor", devices) == "dtensor"


@pytest.mark.parametrize("args, message", [
    (["strategies/2d.yaml", "--checkpoint", "tiny", "--layers", "2"], "--layers cuts the blocks"),
    (["strategies/2d.yaml", "--checkpoint", "tiny", "--backend", "torch"], "plain PyTorch runs on one device"),
    (["strategies/2d.yaml", "--checkpoint", "tiny", "--backend", "tpu"], "unknown backend 'tpu'"),
])
def test_bad_run_options_are_one_line_and_exit_2(tmp_path, args, message):
    result, _, _ = invoke([str(REPO / args[0]), *args[1:]], tmp_path)
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "Traceback" not in result.stderr


def test_random_needs_a_qwen_image_card(tmp_path):
    strategy = tmp_path / "flux.yaml"
    strategy.write_text(ONE_DEVICE.replace("model: qwen-image", "model: flux-dev"))
    result, _, results = invoke([str(strategy), "--checkpoint", "random", "--layers", "1", "--backend", "torch"],
                                tmp_path)
    assert result.exit_code == 2 and "builds a Qwen-Image pipeline" in result.stderr
    [record] = [r.model_dump() for r in read_records([results / "one-h200.jsonl"]).records]
    assert record["status"] == "refused"


@pytest.mark.slow
@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("torch", "diffusers", "transformers")),
                    reason="needs torch, diffusers and transformers")
def test_a_random_full_width_block_runs_with_plain_pytorch_and_is_recorded(tmp_path):
    strategy = tmp_path / "one.yaml"
    strategy.write_text(ONE_DEVICE + "compile: {elementwise: fused}\n")  # said: a GPU file is otherwise eager
    result, out, results = invoke([str(strategy), "--checkpoint", "random", "--layers", "1", "--backend", "torch"],
                                  tmp_path)
    assert result.exit_code == 0, result.output
    [record] = [r.model_dump() for r in read_records([results / "one-h200.jsonl"]).records]
    assert record["status"] == "ok" and record["backend"] == "torch" and record["checkpoint"] == "random"
    assert record["layers"] == {"transformer_blocks": 1}
    assert record["ran"]["layers"] == 1 and record["ran"]["dtype"] == "bfloat16"
    assert len(record["timings"]["step_s"]) == 2 and record["timings"]["vae_decode_s"] > 0
    # the prediction is for the model that ran: one block, not sixty
    assert record["prediction"]["step_s"] < 0.1 and record["prediction"]["hardware"] == "h200:1"
    # plain PyTorch runs the elementwise ops eagerly, so the prediction prices them so (the strategy said fused)
    assert record["prediction"]["elementwise"] == "eager" and "elementwise: eager" in result.output
    assert len(list(out.glob("*.png"))) == 1


def test_the_random_card_as_built_scales_the_text_encoder_by_the_layers_kept():
    from meshlab.models.card import load_card
    from meshlab.models.truncate import card_as_built

    card = load_card("qwen-image")
    built = card_as_built(card, 2)
    full = {c.name: c for c in card.components}
    for c in built.components:
        expected = full[c.name].flops_per_token * (2 / 28 if c.name == "text_encoder" else 1)
        assert c.flops_per_token == pytest.approx(expected)
