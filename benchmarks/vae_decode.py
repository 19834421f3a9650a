"""meshlab's VAE decode against measured decodes: time on the H200, working set on this CPU; print the ratios.

    python benchmarks/vae_decode.py [--json] [--no-cpu]

- **Time (H200).** Qwen-Image's VAE decode was timed by `meshlab profile` on the device tool's H200 at 512x512 and
  1024x1024 (experiments/profiles/h200-512.json, h200-1024.json: op ``vae_decode``, bfloat16, eager). meshlab
  prices it from the card (meshlab.cost.pipeline_time.vae_decode_seconds): the convolutions' FLOPs at the chip's
  effective peak, plus the bytes its other ops move (eager) at the effective HBM bandwidth, at least its ops'
  dispatches. The FLOPs-only figure meshlab gave before the memory term is printed beside it.
- **Working set (CPU).** A real decode of each shipped VAE (random weights, float32) at a size the card was not
  measured at (for a video VAE, more latent frames too), its tensors' peak tracked op by op as the cards measure them
  (meshlab.models.importer.decode_trace.live_peak), against meshlab.plan.memory.vae_decode_bytes. The test
  (tests/cost/test_pipeline_time.py) holds the same decodes against torch.profiler's memory timeline instead.

A check, never a fit: the catalog's rates and efficiencies and the cards' figures are used as they are.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from meshlab.models.card import load_card
from meshlab.cost.pipeline_time import vae_decode_seconds
from meshlab.core.hardware import load_hardware
from meshlab.plan.memory import vae_decode_bytes

PROFILES = Path(__file__).resolve().parents[1] / "experiments" / "profiles"


def time_rows() -> list[dict]:
    hw = load_hardware("h200")
    vae = load_card("qwen-image").component("vae")
    rows = []
    for side in (512, 1024):
        profile = json.loads((PROFILES / f"h200-{side}.json").read_text())
        measured = next(p["seconds"] for p in profile["points"] if p["op"] == "vae_decode")
        pixels = side * side
        flops_only = vae.decode_flops_per_pixel * pixels / (hw.bf16_flops * hw.compute_efficiency)
        predicted = vae_decode_seconds(vae, hw, "device", pixels, 1)
        rows.append({"case": f"qwen-image VAE decode {side}x{side}, h200", "measured_s": measured,
                     "predicted_s": predicted, "ratio": predicted / measured,
                     "flops_only_ratio": flops_only / measured})
    return rows


def memory_rows() -> list[dict]:
    import diffusers
    import torch

    from meshlab.models.importer.card_import import _latent_shape
    from meshlab.models.importer.decode_trace import live_peak
    from meshlab.plan.memory import frame_growth

    rows = []
    for model, side, latent_frames in (("qwen-image", 32, 1), ("flux-dev", 32, 1), ("wan-2.1-t2v-14b", 16, 4),
                                       ("hunyuan-video", 12, 8), ("ltx-video", 12, 6), ("cogvideox-5b", 12, 7)):
        card = load_card(model)
        spec = card.source["components"]["vae"]
        config = spec["config"]
        torch.manual_seed(0)
        vae = getattr(diffusers, spec["class"]).from_config(config).eval()
        peak, pixels = live_peak(vae, torch.randn(_latent_shape(vae.config, side, latent_frames)))
        frames = (latent_frames - 1) * card.architecture.temporal_scale_factor + 1 if card.architecture.is_video else 1
        measured = (peak + 3 * frames * pixels * 4) / 2  # float32 decode, its output added back, at bfloat16
        vae_card, scale = card.component("vae"), card.architecture.vae_scale_factor
        predicted = vae_decode_bytes(vae_card.working_bytes_per_pixel, card.architecture, scale * side, scale * side,
                                     frames, 2, None, frame_growth(vae_card, card.architecture, frames),
                                     vae_card.output_copies)
        rows.append({"case": f"{model} VAE working set {scale * side}x{scale * side}x{frames}, cpu",
                     "measured_bytes": measured, "predicted_bytes": predicted, "ratio": predicted / measured})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--no-cpu", action="store_true", help="skip the CPU decodes (time rows only)")
    args = parser.parse_args()
    rows = time_rows() + ([] if args.no_cpu else memory_rows())
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    for r in rows:
        if "measured_s" in r:
            print(f"{r['case']:<48} measured {r['measured_s'] * 1e3:6.1f} ms  predicted {r['predicted_s'] * 1e3:6.1f} ms"
                  f"  ratio {r['ratio']:.2f}  (FLOPs only: {r['flops_only_ratio']:.2f})")
        else:
            print(f"{r['case']:<48} measured {r['measured_bytes'] / 2**20:7.1f} MiB  predicted "
                  f"{r['predicted_bytes'] / 2**20:7.1f} MiB  ratio {r['ratio']:.3f}")


if __name__ == "__main__":
    main()
