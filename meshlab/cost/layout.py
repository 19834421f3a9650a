"""How one chip's share of a denoising step is shaped: samples, tokens and transformer calls per chip.

The guidance axis: a mesh axis named ``cfg`` (size 1 or 2) puts the conditional and unconditional branches of
classifier-free guidance on different chips. The pipeline then runs both branches as one call of twice the
batch, split over ``cfg`` (both prompts padded to one length), so each chip makes one transformer call per step
instead of two, and the two noise predictions meet in one small all-gather over ``cfg`` per step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from meshlab.models.card import DTYPE_BYTES, ModelCard
from meshlab.models.truncate import block_lists
from meshlab.plan.axes import guidance_axis, ring_axes, ulysses_axes
from meshlab.plan.plan import Plan
from meshlab.strategy.schema import Strategy
from meshlab.plan.tokens import TokenCounts, local_token_counts, rules_split_text, token_counts



@dataclass(frozen=True)
class Layout:
    tokens: TokenCounts  # per sample, whole
    local: TokenCounts  # per sample on one chip: image (and joined text) tokens split over the sequence axis
    batch: int  # samples on one chip in one transformer call
    calls: int  # transformer calls per step on one chip
    images: int  # images one call of the pipeline makes (workload.batch)
    steps: int
    cfg: bool  # does the workload use classifier-free guidance
    itemsize: int
    batch_axis: str | None
    sequence_axes: tuple[str, ...]  # the axes that split the tokens, major to minor
    guidance_axis: str | None
    rewrites: tuple[str, ...] = ()  # the strategy's model rewrites (see meshlab.strategy.schema.REWRITES)
    activation_rules: tuple = ()  # the strategy's activation rules (ActivationRule), resolved per module when priced
    elementwise: str = "fused"  # how elementwise work runs (meshlab.models.card.ELEMENTWISE_EXECUTIONS)
    #: ops the host dispatches one at a time in a call of eager PyTorch (`eager_dispatches`); 0 where a compiler
    #: runs the call
    dispatches: int = 0
    #: the sequence axes the attention.qkv rule moves onto the heads (Ulysses); the others are ring axes
    ulysses_axes: tuple[str, ...] = ()
    #: the sequence axes (larger than 1) that still split the tokens at the attention kernel: a ring's
    ring_axes: tuple[str, ...] = ()
    ring: str = "gather"  # how attention meets the other chips' keys and values on the ring axes (Activations.ring)
    ulysses_degree: int = 1  # the product of the Ulysses axes' sizes
    ring_degree: int = 1  # chips in one ring: the product of the ring axes' sizes
    #: the self and joint attentions whose keys the ring axes split (a cross-attention runs as one kernel)
    ringed: frozenset[str] = frozenset()
    #: tokens per row of one frame's token grid (the image's width over the VAE's and the patch's scale): what a
    #: convolution over the grid (SANA's depthwise 3x3) reads of the rows a sequence split puts on other chips
    row_tokens: int = 0

    @property
    def sequence_split(self) -> int:
        return -(-self.tokens.image // self.local.image)

    def activation_axes(self) -> tuple[str, ...]:
        """Mesh axes that split activations (by sample, token or guidance branch), not features."""
        return tuple(a for a in (self.batch_axis, *self.sequence_axes, self.guidance_axis) if a)


def layout_of(plan: Plan, strategy: Strategy) -> Layout:
    workload, mesh = strategy.workload, plan.mesh
    tokens = token_counts(workload, plan.card.architecture)
    batch_axis, sequence_axes = strategy.activations.batch, strategy.activations.sequence_axes
    guidance = guidance_axis(mesh)  # make_plan checked it against workload.cfg and the activations
    batch_split = mesh.size(batch_axis) if batch_axis else 1
    image_split = math.prod(mesh.size(a) for a in sequence_axes)
    ulysses = tuple(a for a in ulysses_axes(strategy.activations) if mesh.size(a) > 1)
    ring = tuple(a for a in ring_axes(strategy.activations) if mesh.size(a) > 1)
    calls = 2 if workload.cfg and guidance is None else 1
    local = local_token_counts(tokens, image_split, plan.card,
                               rules_split_text(strategy.activations.rules, sequence_axes))
    ringed = frozenset(a.module for a in plan.card.attention if ring and not a.keys and not a.is_linear and any(
        local.of_stream(s) < tokens.of_stream(s) for s in a.key_streams))  # self or joint: a cross-attention is none
    return Layout(
        tokens=tokens,
        local=local,
        batch=-(-workload.batch // batch_split),
        calls=calls,
        images=workload.batch,
        steps=workload.steps,
        cfg=workload.cfg,
        itemsize=DTYPE_BYTES[workload.dtype],
        batch_axis=batch_axis,
        sequence_axes=sequence_axes,
        guidance_axis=guidance,
        rewrites=tuple(strategy.rewrites),
        activation_rules=tuple(strategy.activations.rules),
        elementwise=strategy.compile.elementwise,
        dispatches=eager_dispatches(plan.card) if strategy.compile.elementwise == "eager" else 0,
        ulysses_axes=ulysses,
        ring_axes=ring,
        ring=strategy.activations.ring,
        ulysses_degree=math.prod(mesh.size(a) for a in ulysses),
        ring_degree=math.prod(mesh.size(a) for a in ring),
        ringed=ringed,
        row_tokens=workload.width // (plan.card.architecture.vae_scale_factor * plan.card.architecture.patch_size),
    )


def eager_dispatches(card: ModelCard) -> int:
    """The ops one forward of the card dispatches from the host in eager PyTorch: each block list's traced count
    times its blocks, and the rest of the forward (meshlab.models.card.ModelCard.dispatches); 0 where the card
    was imported before they were counted."""
    if not card.dispatches:
        return 0
    return card.dispatches.get("outside", 0) + sum(card.dispatches.get(name, 0) * count
                                                   for name, count in block_lists(card).items())


