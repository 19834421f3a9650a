"""Where a flash attention kernel runs each attention's samples, heads and queries. Pure, no torch or jax.

A kernel XLA cannot partition (a Pallas TPU kernel: jax's ``flash_attention``, maxdiffusion's splash attention) runs
under ``shard_map``, told the layout of q, k and v ([batch, heads, tokens, head_dim]) on each chip; XLA moves the
tensors into that layout before it and back after. The layout is the plan's, as meshlab prices the attention
(meshlab.cost.flops._attention): the samples over the batch axes (the guidance axis, then ``activations.batch``);
the heads as q's output features, or, where an ``attention.qkv`` rule marks the attention, as that rule's features
entry (a Ulysses axis moves onto the heads there); the queries over the sequence axes still on the tokens at the
kernel (a ring's), every key on every chip (a ring without its passes: XLA gathers k and v, as its partitioner
runs a ring, meshlab.plan.axes.ring_axes). A dim an entry does not divide stays whole (`fitted`), and tokens no
block divides are padded (`kernel_block`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from meshlab.core.mesh import AbstractMesh
from meshlab.plan.axes import activation_axes, entry_axes, ring_axes
from meshlab.plan.inputs import batch_axes

Axes = tuple[str, ...]
#: the query and key blocks jax's TPU flash kernel defaults to (BlockSizes.get_default: 128); a longer block that
#: divides the tokens is taken first, as maxdiffusion's flash block sizes (512) are
KERNEL_BLOCKS = (512, 256, 128)


@dataclass(frozen=True)
class KernelLayout:
    """The mesh axes of one attention's kernel: its samples, its heads and its queries' tokens (keys are whole)."""

    batch: Axes
    heads: Axes
    queries: Axes

    def q_entries(self) -> tuple:
        return (_entry(self.batch), _entry(self.heads), _entry(self.queries), None)

    def kv_entries(self) -> tuple:
        return (_entry(self.batch), _entry(self.heads), None, None)


def kernel_layouts(plan, activations) -> dict[str, KernelLayout]:
    """Each softmax attention of the plan's card by module path (a linear attention runs no such kernel). The planner
    has refused heads an axis does not divide (meshlab.plan.planner)."""
    mesh: AbstractMesh = plan.mesh
    specs = plan.spec_map()
    batch, gathered = batch_axes(activations, mesh), activation_axes(activations, mesh)
    layouts = {}
    for attention in plan.card.attention:
        if attention.is_linear:
            continue
        kind = "cross" if attention.keys else "self"
        rule = next((r for r in activations.rules if r.point == "attention.qkv" and r.attention in (None, kind)),
                    None)
        if rule is not None:
            layout = KernelLayout(entry_axes(rule.spec[0]), entry_axes(rule.spec[2]), entry_axes(rule.spec[1]))
        else:
            q = specs.get(f"{attention.qkv[0]}.weight")
            heads = tuple(a for a in entry_axes(q.entries[0]) if a not in gathered) if q is not None else ()
            queries = ring_axes(activations) if kind == "self" else activations.sequence_axes
            layout = KernelLayout(batch, heads, queries)
        layouts[attention.module] = layout
    return layouts


def fitted(entries: tuple, shape: tuple[int, ...], sizes: dict[str, int]) -> tuple:
    """`entries` with each that does not divide its dim of `shape` left out (that dim whole on every chip)."""
    return tuple(e if e is None or shape[i] % math.prod(sizes[a] for a in entry_axes(e)) == 0 else None
                 for i, e in enumerate(entries))


def kernel_block(tokens: int) -> tuple[int, int]:
    """(block, padded tokens) for `tokens` queries or keys on one chip: the longest of `KERNEL_BLOCKS` that divides
    them; else they are padded to the next multiple of the shortest block (the padding masked off by segment ids,
    as maxdiffusion pads its flash attention's sequences) and blocked as that length allows."""
    padded = -(-tokens // KERNEL_BLOCKS[-1]) * KERNEL_BLOCKS[-1]
    return next(b for b in KERNEL_BLOCKS if padded % b == 0), padded


def _entry(axes: Axes):
    return None if not axes else axes[0] if len(axes) == 1 else axes
