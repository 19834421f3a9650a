"""Which mesh axes split activations rather than weights. Pure, no torch.

The batch axis and the sequence axis are named in ``activations``. The guidance axis is a mesh axis named ``cfg``
of size 2: it puts the conditional and unconditional branches of classifier-free guidance on different chips
(see meshlab.cost.layout). A weight split over any of these axes is all-gathered before use (FSDP): its split
saves memory, never work.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from meshlab.core.mesh import AbstractMesh
from meshlab.strategy.schema import Activations

GUIDANCE_AXIS = "cfg"


def guidance_axis(mesh: AbstractMesh) -> str | None:
    return GUIDANCE_AXIS if GUIDANCE_AXIS in mesh.names and mesh.size(GUIDANCE_AXIS) == 2 else None


def heads_gathered(flash: bool, batch_per_chip: int, xla: bool, sequence_split: bool, linear: bool = False,
                   kernel_marked: bool = False) -> bool:
    """Whether torch_xla's math attention (no flash kernel) runs every head on every chip (`xla`: the plan runs as
    XLA's program, on TPUs; `sequence_split`: a sequence axis splits the tokens; `kernel_marked`: the plan has an
    ``attention.qkv`` rule, for any of its attentions). torch's matmul folds a
    4-D [batch, heads, tokens, head_dim] product into 3-D by merging batch and heads; where a chip holds more than one
    sample, heads split over a mesh axis inside the merged dim are no tiling XLA's partitioner can keep, so it gathers
    q, k and v over that axis (three all-gathers of all heads per attention) and every chip computes every head.
    Measured (`meshlab check --backend tpu`, v6e-8, 256², torch_xla's program): pairs.yaml at 2 samples a chip
    (tests/cost/data/strategies/cfg2-model4.yaml, and pairs.yaml with workload batch 4) gathers q, k and v heads,
    3.5 MB each, over model; at 1 sample a chip (pairs.yaml as shipped) it gathers none. A flash kernel takes the
    4-D tensors as they are; a `linear` attention's matmuls (SANA's) have no flash kernel and gather alike whatever
    the flash setting.

    Where a sequence axis splits the tokens and the plan has no attention.qkv rule, XLA:TPU gathers the heads the
    same way at each chip's own tokens, then brings the keys and values together as `values_summed` says: read from
    seq2-model4 (Qwen-Image, v6e-8, 256²) and seq4-model2 (tests/cost/data/strategies/), which agree at 1024² too
    (tests/cost/test_tpu_issued.py holds those programs' figures), then held out and agreeing: seq2-model2
    (v6e-4), seq4-model4 and seq8-model2 (v6e-16), flux-seq2-model4's all-gathers and all-reduces, and
    wan-seq2-model4 (Wan 2.1 14B: a self-attention, and a cross-attention whose whole keys are gathered with the
    heads). Not applied to a linear attention under a sequence split, nor to a plan with an attention.qkv rule
    (Ulysses, or a rule for self- or cross-attention alone), which no program measured, nor to eager GPU runs
    (DTensor)."""
    if not (xla and (linear or not flash) and batch_per_chip > 1):
        return False
    return not sequence_split or not (linear or kernel_marked)


def values_summed(heads_split: int, sequence_split: int) -> bool:
    """Where every head is gathered onto every chip (`heads_gathered`) while `sequence_split` chips split the tokens
    and the heads were split `heads_split` ways: whether XLA:TPU leaves the values split and sums the partial
    products of probabilities and values (True), or gathers the values whole (False). The keys are gathered whole
    either way. Where the heads' chips are a multiple of the sequence's, each chip slices the values' tokens it
    holds into heads_split pieces and one permute re-splits them over the heads' axes; each chip multiplies its
    piece of the keys' dim and one float32 all-reduce over the heads' axes sums it (seq 2 x model 2, 2 x 4, 4 x 4,
    Wan's 2 x 4). Otherwise the values are gathered over the sequence axes like the keys (seq 4 x model 2, 8 x 2).
    Measured as `heads_gathered` says; the divisibility is read from two programs and held by three."""
    return heads_split % sequence_split == 0


def kernel_marked(rules) -> bool:
    """Whether an activation rule marks an attention kernel's q, k and v (``attention.qkv``), for any attention."""
    return any(rule.point == "attention.qkv" for rule in rules)


def activation_axes(activations: Activations, mesh: AbstractMesh) -> frozenset[str]:
    """Axes that split activations (by sample, token or guidance branch)."""
    return frozenset(a for a in (activations.batch, *activations.sequence_axes, guidance_axis(mesh)) if a)


def ulysses_axes(activations: Activations) -> tuple[str, ...]:
    """The sequence axes an ``attention.qkv`` rule for self-attention puts on the heads (features) and off the
    tokens: Ulysses'."""
    for rule in activations.rules:
        if rule.point == "attention.qkv" and rule.attention != "cross":
            return kernel_split(rule.spec, activations.sequence_axes)[1]
    return ()


def ring_axes(activations: Activations) -> tuple[str, ...]:
    """The sequence axes that still split the tokens at the attention kernel: those an ``attention.qkv`` rule keeps
    in its tokens entry, or every sequence axis without such a rule (as meshlab.cost.collectives reads it). A
    sequence axis the rule neither keeps on the tokens nor moves onto the heads leaves the kernel whole tokens."""
    for rule in activations.rules:
        if rule.point == "attention.qkv" and rule.attention != "cross":
            return kernel_split(rule.spec, activations.sequence_axes)[0]
    return activations.sequence_axes


def kernel_split(spec, sequence_axes: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Of `sequence_axes`, those an ``attention.qkv`` spec ([batch, tokens, features] entries) keeps on the tokens
    at the kernel (a ring's) and those it moves onto the heads (Ulysses')."""
    tokens, features = (entry_axes(e) for e in spec[1:3])
    return (tuple(a for a in sequence_axes if a in tokens),
            tuple(a for a in sequence_axes if a in features and a not in tokens))


def entry_axes(entry) -> tuple[str, ...]:
    """The mesh axes one entry of a partition spec names (None, an axis, or several)."""
    return (entry,) if isinstance(entry, str) else tuple(entry or ())


def compute_split(axes: Iterable[str] | None, mesh: AbstractMesh, gathered: Iterable[str]) -> int:
    """How many ways a weight dim split over `axes` is split as a chip computes with it: axes in `gathered`
    (those that split activations) are all-gathered first, so they do not count."""
    skip = set(gathered)
    return math.prod(mesh.size(a) for a in axes or () if a not in skip)
