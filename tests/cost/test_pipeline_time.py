"""Seconds per image end to end, term by term (meshlab.cost.pipeline_time): what each term rests on."""

from __future__ import annotations

import dataclasses
import importlib.util
import json

import pytest
from typer.testing import CliRunner

from meshlab.models.card import load_card
from meshlab.cli.app import app
from meshlab.cost.pipeline_time import TERMS
from meshlab.cost.predict import predict
from meshlab.plan.planned import plan_file

from tests.conftest import REPO
from tests.profiled_memory import profiled_call


def predicted(path=REPO / "strategies" / "2d.yaml", **placement):
    planned = plan_file(path)
    strategy = planned.strategy
    if placement:
        strategy = strategy.model_copy(update={"placement": strategy.placement.model_copy(update=placement)})
    return planned, predict(planned.plan, strategy, planned.hardware)


def test_the_terms_add_up_to_seconds_per_image_and_keep_the_denoise_figure():
    _, p = predicted()
    t = p.terms
    assert p.seconds_per_image == pytest.approx(sum(getattr(t, name) for name in TERMS))
    assert t.denoise_s + t.overhead_s == pytest.approx(p.denoise_seconds_per_image)
    assert (p.layout.images, p.layout.steps) == (2, 50)
    assert t.overhead_s == 50 * 1e-3 / 2  # v6e's 1 ms per step (hardware.yaml), 50 steps, 2 images a call
    # host transfers: 2 prompts' embeddings in (512 tokens x 3584 wide x 2 bytes) and one image's float32
    # pixels out (3 x 1024 x 1024 x 4 bytes), at v6e's 3.2e10 B/s host link, shared by the call's 2 images
    assert t.transfer_s == pytest.approx((2 * 512 * 3584 * 2 + 3 * 2**20 * 4) / 3.2e10 / 2, rel=1e-9)
    assert t.unknown == ()


def test_the_denoise_term_is_the_steps_less_their_host_overhead_shared_by_the_images():
    from meshlab.cost.pipeline_time import pipeline_terms

    planned = plan_file(REPO / "strategies" / "2d.yaml")
    terms = pipeline_terms(planned.card, planned.strategy, planned.hardware, steps=10, step_s=0.3,
                           step_overhead_s=0.1, images=4, batch_split=2)
    # 10 steps of 0.3 s, of which 0.1 s is host overhead, shared by 4 images: 10 x 0.2 / 4 and 10 x 0.1 / 4
    assert (terms.denoise_s, terms.overhead_s) == (pytest.approx(0.5), pytest.approx(0.25))


def test_text_encode_is_the_encoders_flops_at_the_hosts_or_the_chips_rate():
    planned, host = predicted(text_encoder="cpu")
    _, device = predicted(text_encoder="device")
    w = planned.strategy.workload
    (encoder,) = [c for c in planned.card.components if c.name.startswith("text_encoder")]
    # Qwen-Image's pipeline encodes its 34-token template before each prompt, and Qwen2.5-VL's forward its LM head
    assert encoder.prefix_tokens == 34 and encoder.head_flops_per_token == 2 * 3584 * 152064
    assert (w.text_tokens, w.cfg, w.batch) == (512, True, 2)
    # per token: the card's 13,050,576,896 FLOPs of the encoder (2 x its 6.53e9 non-embedding parameters, Qwen2.5
    # report) and 2 x 3584 x 152064 of the head; (512 + 34) tokens; 2 prompts (cfg) for the call's 2 images
    flops = (13_050_576_896 + 2 * 3584 * 152064) * (512 + 34) * 2
    assert flops == 15_441_504_239_616
    assert host.terms.text_encode_s == pytest.approx(flops / 1e12 / 2)  # the host at 1e12 FLOP/s (hardware.yaml)
    assert device.terms.text_encode_s == pytest.approx(flops / (918e12 * 0.8) / 2)  # v6e's peak x 0.8


def test_vae_decode_scales_with_pixels_and_is_split_by_the_batch_axis():
    planned, p = predicted()  # 2d: batch 2 over data 2, so each chip decodes one image
    vae = next(c for c in planned.card.components if c.name == "vae")
    assert (vae.decode_flops_per_pixel, vae.decode_fused_bytes_per_pixel) == (10_749_704, 15_164.40625)  # measured
    # on a TPU, XLA fuses the decode's elementwise gaps: a 1024 x 1024 image's FLOPs at v6e's 918e12 x 0.8, plus
    # its fused bytes at 1.6e12 x 0.85 B/s
    one_image = 10_749_704 * 2**20 / 734.4e12 + 15_164.40625 * 2**20 / 1.36e12
    assert one_image == pytest.approx(0.0270404, rel=1e-5)
    assert p.terms.vae_decode_s == pytest.approx(one_image / 2)
    _, model = predicted(REPO / "strategies" / "model.yaml")  # batch 1, no batch split: one image per chip
    assert model.terms.vae_decode_s == pytest.approx(one_image)
    _, host = predicted(vae="cpu")  # on the host: its FLOP rate alone (no host bandwidth is catalogued)
    assert host.terms.vae_decode_s == pytest.approx(10_749_704 * 2**20 / 1e12 / 2)


def test_vae_decode_on_a_gpu_moves_every_ops_tensors_and_pays_at_least_its_dispatches():
    """diffusers runs the VAE eager on a GPU: each op reads and writes its own tensors, and the host dispatches
    each op (per latent frame of a video)."""
    from meshlab.cost.pipeline_time import vae_decode_seconds
    from meshlab.core.hardware import load_hardware

    h200 = load_hardware("h200")
    vae = load_card("qwen-image").component("vae")
    assert vae.decode_bytes_per_pixel > vae.decode_fused_bytes_per_pixel > 0
    # 1024 x 1024: the FLOPs at the effective peak (692.3e12) plus every op's own bytes (46,694.7 a pixel, eager)
    # at the effective HBM bandwidth (4.08e12 B/s)
    assert vae_decode_seconds(vae, h200, "device", 2**20, 1) == pytest.approx(
        10_749_704 * 2**20 / 692.3e12 + 48_962_928_640 / 4.08e12, rel=1e-4)
    tiny = 64 * 64  # a small image is launch-bound: its 329 dispatched ops at 20.4 us each outlast its kernels
    assert vae.decode_dispatches == 329
    assert vae_decode_seconds(vae, h200, "device", tiny, 1) == pytest.approx(329 * 20.4e-6)
    wan = load_card("wan-2.1-t2v-14b")
    assert wan.architecture.latent_frames(81) == 21
    wan_vae = wan.component("vae")
    assert wan_vae.decode_dispatches == 379  # per latent frame
    assert vae_decode_seconds(wan_vae, h200, "device", 81 * tiny, 21) == pytest.approx(21 * 379 * 20.4e-6)


def test_a_card_without_the_figures_names_the_terms_it_cannot_price(tmp_path):
    card = load_card("qwen-image")
    # 2d runs on a TPU, which prices the decode's fused bytes: the figure it would use is the one missing
    bare = dataclasses.replace(card, components=tuple(dataclasses.replace(c, decode_fused_bytes_per_pixel=0.0,
                                                                           flops_per_token=0.0)
                                                      for c in card.components))
    from meshlab.cost.pipeline_time import pipeline_terms

    planned = plan_file(REPO / "strategies" / "2d.yaml")
    terms = pipeline_terms(bare, planned.strategy, planned.hardware, 50, 0.2, 0.001, 2, 2)
    assert terms.unknown == ("text_encode_s", "vae_decode_s")
    assert terms.text_encode_s == terms.vae_decode_s == 0.0


def test_compare_json_carries_every_term():
    result = CliRunner().invoke(app, ["compare", str(REPO / "strategies" / "2d.yaml"), "--json"])
    entry = json.loads(result.stdout)["entries"][0]["predicted"]
    assert set(entry["terms"]) == {*TERMS, "unknown"}
    assert entry["seconds_per_image"] == pytest.approx(sum(entry["terms"][k] for k in TERMS))
    assert entry["denoise_seconds_per_image"] < entry["seconds_per_image"]


def test_explain_shows_each_term():
    result = CliRunner().invoke(app, ["explain", str(REPO / "strategies" / "2d.yaml")])
    for row in ("text encode", "denoise", "VAE decode", "host transfers", "host overhead", "end to end"):
        assert row in result.stdout


def test_qwen_text_encoder_per_token_flops_match_the_published_non_embedding_parameters():
    """Qwen2.5 technical report (arXiv:2412.15115, table 1): Qwen2.5-7B has 6.53B non-embedding parameters."""
    encoder = next(c for c in load_card("qwen-image").components if c.name == "text_encoder")
    assert encoder.flops_per_token / 2 == pytest.approx(6.53e9, rel=0.01)


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("diffusers") is None, reason="needs diffusers")
def test_decode_flops_per_pixel_extrapolates_to_a_larger_decode():
    """The card's figure comes from an 8x8-latent decode; a 32x32-latent decode of the same VAE counts within 5%
    per pixel (what grows faster than the pixels is the mid-block's attention, small at this size)."""
    import diffusers
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    card = load_card("qwen-image")
    spec = card.source["components"]["vae"]
    vae = getattr(diffusers, spec["class"]).from_config(spec["config"]).eval()
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        image = vae.decode(torch.randn(1, spec["config"]["z_dim"], 1, 32, 32)).sample
    per_pixel = counter.get_total_flops() / (image.shape[-1] * image.shape[-2])
    vae_card = next(c for c in card.components if c.name == "vae")
    assert per_pixel == pytest.approx(vae_card.decode_flops_per_pixel, rel=0.05)


def profiled_peak(vae, latent) -> tuple[int, int]:
    """An independent measure of a decode's working set (the cards use meshlab's own op-by-op tracker): torch.profiler's
    memory timeline (tests.profiled_memory); the peak less the output, and the output's pixels of one frame."""
    peak, image = profiled_call(lambda: vae.decode(latent).sample)
    return peak - image.numel() * image.element_size(), image.shape[-1] * image.shape[-2]


@pytest.mark.slow
@pytest.mark.memory  # more than 5 GiB of host memory at once: one at a time (tests/conftest.py)
@pytest.mark.skipif(importlib.util.find_spec("diffusers") is None, reason="needs diffusers")
@pytest.mark.parametrize("model, side, latent_frames", [("qwen-image", 32, 1), ("flux-dev", 32, 1),
                                                        ("wan-2.1-t2v-14b", 16, 4), ("hunyuan-video", 10, 8),
                                                        ("ltx-video", 10, 6), ("cogvideox-5b", 10, 7)])
def test_the_decode_working_set_predicts_a_larger_measured_decode(model, side, latent_frames):
    """The card's working set comes from decodes at 8x8 and 16x16 latents (one latent frame, or a video VAE's
    steady state, and how it grows per latent frame); a real decode of another size, measured by torch.profiler's
    memory timeline on the CPU, holds what meshlab.plan.memory predicts for it within 2% (Wan: 13 frames, past the 9
    the card was measured at; LTX-Video, whose decoder holds every frame: 41 frames, past its 17; HunyuanVideo:
    8 latent frames, temporal tiles of 5, 5 and 2; CogVideoX: 7 latent frames, batches of 3, 2 and 2)."""
    import diffusers
    import torch

    from meshlab.models.importer.card_import import _latent_shape
    from meshlab.plan.memory import frame_growth, vae_decode_bytes

    card = load_card(model)
    spec = card.source["components"]["vae"]
    torch.manual_seed(0)
    vae = getattr(diffusers, spec["class"]).from_config(spec["config"]).eval()
    frames = (latent_frames - 1) * card.architecture.temporal_scale_factor + 1 if card.architecture.is_video else 1
    peak, pixels = profiled_peak(vae, torch.randn(_latent_shape(vae.config, side, latent_frames)))
    measured_bf16 = (peak + 3 * frames * pixels * 4) / 2  # the decode ran in float32; its output added back
    scale = card.architecture.vae_scale_factor
    vae_card = card.component("vae")
    predicted = vae_decode_bytes(vae_card.working_bytes_per_pixel, card.architecture, scale * side, scale * side,
                                 frames, 2, None, frame_growth(vae_card, card.architecture, frames),
                                 vae_card.output_copies)
    assert predicted == pytest.approx(measured_bf16, rel=0.02)
