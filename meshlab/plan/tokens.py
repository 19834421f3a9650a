"""How a workload becomes token counts for a model: pixels -> latent pixels -> packed patches."""

from __future__ import annotations

from dataclasses import dataclass

from meshlab.models.card import Architecture, ModelCard, token_frames
from meshlab.core.errors import PlanError
from meshlab.strategy.schema import Workload


@dataclass(frozen=True)
class TokenCounts:
    image: int  # image tokens per sample
    text: int  # text tokens per sample
    reference: int = 0  # a conditioning image's tokens per sample (Wan I2V's CLIP tokens), never split

    @property
    def joint(self) -> int:
        return self.image + self.text

    def describe(self) -> str:
        """The tokens as a phrase: image and text, and a reference stream's where there is one."""
        reference = f" + {self.reference} reference image" if self.reference else ""
        return f"{self.image} image + {self.text} text{reference} tokens"

    def of_stream(self, stream: str) -> int:
        """Tokens a Linear of `stream` sees per sample (conditioning Linears act once per sample)."""
        return {"image": self.image, "text": self.text, "joint": self.joint, "conditioning": 1,
                "reference": self.reference}.get(stream, 0)


def token_counts(workload: Workload, arch: Architecture) -> TokenCounts:
    if arch.text_tokens and workload.text_tokens != arch.text_tokens:
        raise PlanError(f"workload.text_tokens is {workload.text_tokens}, but this model's forward takes exactly "
                        f"{arch.text_tokens} text tokens (its pipeline pads every prompt to them)",
                        f"set workload.text_tokens: {arch.text_tokens}", field=("workload", "text_tokens"))
    frames = token_frames(workload.frames, arch)
    step = arch.vae_scale_factor * arch.patch_size
    for side in ("height", "width"):
        value = getattr(workload, side)
        if value % step:
            raise PlanError(
                f"workload.{side} {value} is not a multiple of {step} (VAE {arch.vae_scale_factor}x, patch {arch.patch_size})",
                f"use a multiple of {step}, e.g. {value // step * step or step}",
                field=("workload", side),
            )
    return TokenCounts(frames * (workload.height // step) * (workload.width // step), workload.text_tokens,
                       arch.reference_tokens)


def rules_split_text(rules, sequence_axes: tuple[str, ...]) -> bool:
    """Whether an activation rule puts a sequence axis on the text stream's tokens: a ``block.input`` or
    ``linear.output`` rule for every stream (or the text) with one of those axes in its tokens entry."""
    if not sequence_axes:
        return False
    for rule in rules:
        tokens = rule.spec[1]
        axes = (tokens,) if isinstance(tokens, str) else tuple(tokens or ())
        if rule.point in ("block.input", "linear.output") and rule.stream in (None, "text") and set(sequence_axes) & set(axes):
            return True
    return False


def joins_text(card: ModelCard) -> bool:
    """Does an attention of the card concatenate the text and image tokens into one sequence (Qwen-Image, Flux's
    dual blocks)?"""
    return any({"text", "image"} <= set(a.streams) for a in card.attention)


def local_token_counts(tokens: TokenCounts, sequence_split: int, card: ModelCard,
                       text_split: bool = False) -> TokenCounts:
    """Tokens per sample on one chip when a sequence axis splits the image tokens `sequence_split` ways.

    Where an attention concatenates text and image tokens into one sequence (Qwen-Image, Flux's dual blocks),
    XLA's sharding propagation carries the joint sequence's split back through the text stream onto its
    (replicated) input, so the text tokens are split too: measured on 8 virtual CPU devices, seq 2 x model 4,
    every text tensor of Qwen-Image's block 0 holds 16 of 32 text tokens
    (tests/cost/data/xla_collectives_seq2-model4.json). An activation rule that splits the text stream's tokens
    (``text_split``, see ``rules_split_text``) does it too (Wan's cross-attention k and v under a ``linear.output`` rule
    on every stream).
    """
    if sequence_split == 1:
        return tokens
    joint = joins_text(card)
    text = -(-tokens.text // sequence_split) if joint or text_split else tokens.text
    return TokenCounts(-(-tokens.image // sequence_split), text, tokens.reference)
