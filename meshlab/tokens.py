"""How a workload becomes token counts for a model: pixels -> latent pixels -> packed patches."""

from __future__ import annotations

from dataclasses import dataclass

from meshlab.cards.card import Architecture
from meshlab.errors import PlanError
from meshlab.strategy.schema import Workload


@dataclass(frozen=True)
class TokenCounts:
    image: int  # image tokens per sample
    text: int  # text tokens per sample

    @property
    def joint(self) -> int:
        return self.image + self.text

    def of_stream(self, stream: str) -> int:
        """Tokens a Linear of `stream` sees per sample (conditioning Linears act once per sample)."""
        return {"image": self.image, "text": self.text, "joint": self.joint, "conditioning": 1}.get(stream, 0)


def token_counts(workload: Workload, arch: Architecture) -> TokenCounts:
    step = arch.vae_scale_factor * arch.patch_size
    for side in ("height", "width"):
        value = getattr(workload, side)
        if value % step:
            raise PlanError(
                f"workload.{side} {value} is not a multiple of {step} (VAE {arch.vae_scale_factor}x, patch {arch.patch_size})",
                f"use a multiple of {step}, e.g. {value // step * step or step}",
                field=("workload", side),
            )
    return TokenCounts((workload.height // step) * (workload.width // step), workload.text_tokens)
