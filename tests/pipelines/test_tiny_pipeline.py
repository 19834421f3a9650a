"""The tiny Qwen-Image pipeline, the XLA fixes, and the runner on 8 virtual CPU devices.

The CPU tests check each fix against the code it replaces; the XLA test runs ``python -m
meshlab.pipelines.runner_cli`` in a fresh process (SPMD must be on before any XLA tensor exists) with the transformer
and VAE sharded on a 2x4 mesh, and compares its image with the stock pipeline on the CPU.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch_xla")
pytest.importorskip("diffusers")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch_xla  # noqa: E402

from meshlab.core.errors import BackendError, InputError  # noqa: E402
from meshlab.pipelines import xla_fixes  # noqa: E402
from meshlab.pipelines.runner import run_reference  # noqa: E402
from meshlab.pipelines.tiny import TINY_TRANSFORMER_CONFIG, build_tiny_pipeline, load_pipeline  # noqa: E402

pytestmark = pytest.mark.xla

PROMPT, NEGATIVE = "a red cube on a blue table", "blurry, low quality"
STEPS, SIZE, CFG, SEED = 3, 64, 4.0, 0  # 3: one step after the two warm-up steps
#: Sharded XLA vs stock CPU pipeline, float pixels in [0, 1]; measured 8e-7.
TOLERANCE = 1e-4


def shard_largest_dim(transformer, vae):
    """Shard every weight of rank >= 2 along its largest dim over both axes of a (2, 4) mesh (runs in the child)."""
    import torch_xla.distributed.spmd as xs
    import torch_xla.runtime as xr

    mesh = xs.Mesh(np.arange(xr.global_runtime_device_count()), (2, 4), ("data", "model"))
    for module in (transformer, vae):
        for param in module.parameters():
            if param.dim() >= 2:
                spec = [None] * param.dim()
                spec[max(range(param.dim()), key=lambda d: param.shape[d])] = ("data", "model")
                xs.mark_sharding(param, mesh, tuple(spec))
    return mesh


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory) -> Path:
    return build_tiny_pipeline(tmp_path_factory.mktemp("tiny-qwen-image"))


@pytest.fixture(scope="session")
def pipe(tiny_dir):
    return load_pipeline(tiny_dir)


@pytest.fixture(scope="session")
def xla_runs(tiny_dir, tmp_path_factory) -> list[dict]:
    """Two runs (cold, warm) of the runner in a child process on 8 virtual CPU devices, sharded."""
    out = tmp_path_factory.mktemp("xla-run") / "run.json"
    env = os.environ | {
        "PJRT_DEVICE": "CPU",
        "CPU_NUM_DEVICES": "8",
        # LLVM at -O0 compiles the CPU graphs about 3x faster; results agree with -O2 to float rounding.
        "XLA_FLAGS": "--xla_backend_optimization_level=0",
    }
    command = [
        sys.executable, "-m", "meshlab.pipelines.runner_cli", "--tiny", str(tiny_dir), "--out", str(out),
        "--prompt", PROMPT, "--negative-prompt", NEGATIVE, "--steps", str(STEPS), "--height", str(SIZE),
        "--width", str(SIZE), "--cfg", str(CFG), "--seed", str(SEED), "--runs", "2",
        "--shard", f"{__file__}:shard_largest_dim",
    ]  # fmt: skip
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(out.read_text())["runs"]


# ---- the tiny pipeline ----------------------------------------------------------------------------------


def test_build_is_deterministic_and_reloads(tiny_dir, tmp_path):
    again = build_tiny_pipeline(tmp_path / "again")
    files = sorted(p.relative_to(tiny_dir) for p in tiny_dir.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
    assert all((tiny_dir / f).read_bytes() == (again / f).read_bytes() for f in files)


def test_transformer_config_constant_matches_saved_model(pipe):
    config = pipe.transformer.config
    assert {k: tuple(v) if isinstance(v, list) else v for k, v in config.items() if k in TINY_TRANSFORMER_CONFIG} == (
        TINY_TRANSFORMER_CONFIG
    )


def test_tokenizer_drops_exactly_the_template(pipe):
    prefix = pipe.prompt_template_encode.split("{}")[0]
    assert len(pipe.tokenizer(prefix)["input_ids"]) == pipe.prompt_template_encode_start_idx == 34
    embeds, _ = pipe.encode_prompt("x", device="cpu")  # a one-token prompt still encodes
    assert embeds.shape[1] >= 1


# ---- the fixes, each against the code it replaces (CPU) -------------------------------------------------


def _forward(transformer, embeds, mask, seq=16):
    torch.manual_seed(1)
    batch = embeds.shape[0]
    with torch.no_grad():
        return transformer(
            hidden_states=torch.randn(batch, seq, 16),
            encoder_hidden_states=embeds,
            encoder_hidden_states_mask=mask,
            timestep=torch.full((batch,), 0.5),
            img_shapes=[[(1, 4, 4)]] * batch,
            return_dict=False,
        )[0]


def test_real_rope_matches_complex_rope(pipe):
    embeds, mask = torch.randn(2, 7, 16), torch.ones(2, 7, dtype=torch.long)
    mask[1, 5:] = 0
    complex_out = _forward(pipe.transformer, embeds, mask)
    real = copy.deepcopy(pipe.transformer)
    xla_fixes.use_real_rope(real)
    assert not real.pos_embed.pos_freqs.is_complex()
    assert torch.allclose(_forward(real, embeds, mask), complex_out, atol=1e-6, rtol=0)
    assert torch.equal(_forward(pipe.transformer, embeds, mask), complex_out)  # untouched model: original path


def test_nearest_upsampling_matches_nearest_exact(pipe):
    vae = copy.deepcopy(pipe.vae)
    assert xla_fixes.use_nearest_upsampling(vae) == 3
    latents = torch.randn(1, 4, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(vae.decode(latents).sample, pipe.vae.decode(latents).sample)


def test_nearest_upsampling_refuses_fractional_scales():
    with pytest.raises(BackendError, match="scale"):
        xla_fixes.use_nearest_upsampling(torch.nn.Upsample(scale_factor=1.5, mode="nearest-exact"))


def test_padding_cond_and_uncond_keeps_the_prediction(pipe):
    embeds, negative = torch.randn(1, 9, 16), torch.randn(1, 4, 16)
    padded, mask, padded_negative, negative_mask = xla_fixes.pad_prompt_pair(embeds, None, negative, None)
    assert padded.shape == padded_negative.shape == (1, 9, 16)
    assert negative_mask.tolist() == [[1] * 4 + [0] * 5] and bool(mask.all())
    assert torch.allclose(_forward(pipe.transformer, padded_negative, negative_mask),
                          _forward(pipe.transformer, negative, None), atol=1e-6, rtol=0)  # fmt: skip


def test_attention_backend_per_device_kind():
    assert xla_fixes.choose_attention_backend("TPU") == "_native_xla"
    assert xla_fixes.choose_attention_backend("cpu") == "native"
    with pytest.raises(InputError, match="cpu, cuda, tpu"):
        xla_fixes.choose_attention_backend("ipu")


def test_maskless_backend_takes_full_masks_only():
    assert xla_fixes.drop_full_masks(torch.ones(1, 3), None) == (None, None)
    with pytest.raises(BackendError, match="padding"):
        xla_fixes.drop_full_masks(torch.tensor([[1, 1, 0]]))


# ---- the runner on 8 virtual devices ----------------------------------------------------------------------


@pytest.mark.slow
def test_sharded_xla_run_matches_stock_cpu_pipeline(xla_runs, pipe, record_property):
    cold, warm = xla_runs
    image = Path(cold["image"])
    from PIL import Image

    assert Image.open(image).size == (SIZE, SIZE)
    assert cold["mesh_shape"] == [2, 4] and cold["mesh_axes"] == ["data", "model"]
    reference, _ = run_reference(pipe, PROMPT, NEGATIVE, STEPS, SIZE, SIZE, CFG, SEED)
    assert not torch_xla._XLAC._xla_runtime_is_initialized()  # this process could still switch SPMD on
    error = float(np.abs(np.load(cold["pixels"]) - reference).max())
    record_property("max_abs_error", error)
    print(f"sharded XLA vs stock CPU pipeline: max abs error {error:.3g}")
    assert error < TOLERANCE
    assert np.array_equal(np.load(cold["pixels"]), np.load(warm["pixels"]))


@pytest.mark.slow
def test_xla_run_compiles_once_and_never_falls_back(xla_runs):
    cold, warm = xla_runs
    for run in (cold, warm):
        assert run["counters"]["run_fallbacks"] == {}, run["counters"]
        assert not run["counters"]["complex_in_step"]
        assert run["warnings"] == []
    # RoPE cache, one denoising step, VAE decode; the second step reuses the first one's graph.
    assert cold["counters"]["compiles_rope_warmup"] == 1
    assert cold["counters"]["compiles_per_step"] == [1, 0, 0]
    assert cold["counters"]["compiles_decode"] == 1
    assert warm["counters"]["compiles_total"] == 0
    assert cold["counters"]["compile_s"] > 0 and warm["counters"]["compile_s"] == 0


@pytest.mark.slow
def test_steady_loop_moves_nothing_between_host_and_device(xla_runs):
    """The schedule lives on the device and masks go there once: after warm-up no step copies anything."""
    cold, warm = xla_runs
    for run in (cold, warm):
        transfers = run["counters"]["host_transfers"]
        assert transfers["steady_per_step"] == 0 and transfers["causes"] == {}, transfers
        assert transfers["syncs_per_step"] == 1  # the one sync that ends each step
    assert cold["counters"]["host_transfers"]["first_step"] > 0  # the latents, embeddings and schedule go over once
