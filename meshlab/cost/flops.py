"""FLOPs and HBM bytes of one transformer call, for the whole model and for one chip of a plan.

Counted: every Linear as 2 x in x out per token of the stream it serves (image tokens, text tokens, their
sum for joint Linears, once per sample for conditioning Linears), and attention as QK^T plus AV,
2 x 2 x queries x keys x head_dim per head over the joint sequence (a cross-attention: its queries' stream
against its keys' stream). A pointwise convolution the card traced as a Linear counts as one (SANA's GLUMBConv);
a linear attention (SANA's) as its state and its product with the queries, 2 x 2 x tokens x head_dim x
(head_dim + 1) per head, in float32; another convolution inside a block (SANA's depthwise 3x3) as 2 x its weight's
elements per token. Not counted: biases, norms, RoPE, activations and other elementwise work (well under 1% of a
DiT's FLOPs), and convolutions outside the blocks (a patch embedding).

On one chip each Linear does the work of its local shard: ceil(out / split) x ceil(in / split) at the
tokens and samples the chip holds, where a split counts only the axes that do not also split activations: a
weight split over the batch, sequence or guidance axis is all-gathered before use (FSDP), so every chip
multiplies the whole of those dims with its own samples. Attention runs its local heads (as q is split) over the local
queries (image tokens split over the sequence axis) against every key.

HBM bytes per call: every weight shard this chip holds is read once (FSDP-gathered weights at their gathered
size); each Linear reads its input and writes its output; attention reads q, k, v and writes its output, and
without flash attention also writes and reads the scores and probabilities, in float32 (torch's math attention
upcasts a bf16 one). Elementwise work (norms, modulation, RoPE, activations, residual adds, casts) is one row per
block list: each gap between matmuls runs as
one fused pass that reads what it did not make and writes what others read, at the bytes per token the card
traced from the real forward (``ModelCard.elementwise``, meshlab.models.importer.elementwise_trace), at the tokens this
chip holds, each tensor split as the matmul it meets splits its features (a Linear's output or input, attention's
heads), the residual stream whole. A card without that trace prices no elementwise work.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from meshlab.models.card import Attention, concrete_path
from meshlab.models.truncate import block_lists
from meshlab.cost.graph import Graph, LinearOp
from meshlab.cost.layout import Layout
from meshlab.core.mesh import AbstractMesh
from meshlab.plan.activations import activation_points
from meshlab.plan.axes import compute_split, heads_gathered, kernel_marked, kernel_split, values_summed
from meshlab.plan.tokens import TokenCounts


@dataclass(frozen=True)
class Work:
    """One op's work on one chip in one transformer call."""

    name: str
    block: int | None
    flops: float
    hbm_bytes: float
    kind: str  # "linear", "attention", "linear-attention", "conv", "elementwise" or "other"
    count: int = 1  # identical blocks this op stands for (see `Graph.repeats`)
    #: linear: (tokens, in, out) of the local shard GEMM; attention: (batch, heads, queries, keys, head_dim);
    #: linear-attention: (batch, heads, tokens, head_dim)
    shape: tuple[int, ...] = ()
    #: attention: into how many pieces a Ulysses all-to-all splits the heads at the kernel, gathering the queries as
    #: many times (the kernel runs heads / this x queries x this; `kernel_rows`); 1 where no rule moves the tokens
    ulysses: int = 1

    @property
    def kernel_rows(self) -> tuple[int, int, int]:
        """An attention's (batch, heads, queries) as its kernel runs them, after the Ulysses all-to-all: what decides
        how many tiles it has (meshlab.core.hardware.Hardware.attention_occupancy)."""
        batch, heads, queries = self.shape[:3]
        return batch, -(-heads // self.ulysses), queries * self.ulysses


def linear_flops(in_features: int, out_features: int, tokens: int) -> float:
    return 2.0 * in_features * out_features * tokens


def attention_flops(attention: Attention, queries: int, keys: int, heads: int | None = None) -> float:
    """QK^T and AV of a softmax attention; a linear attention (SANA's) makes its state ``relu(K)^T [V; 1]``,
    2 x keys x head_dim x (head_dim + 1) per head, then multiplies it by ``relu(Q)``, as much again per query."""
    heads = attention.heads if heads is None else heads
    d = attention.head_dim
    if attention.is_linear:
        return 2.0 * (queries + keys) * d * (d + 1) * heads
    return 4.0 * queries * keys * d * heads


def conv_flops(weight_elements: int, tokens: int) -> float:
    """A convolution with stride 1 and its padding keeping every position (SANA's depthwise 3x3): each output
    position multiplies the whole kernel by its input, 2 x the weight's elements per token."""
    return 2.0 * weight_elements * tokens


def graph_flops(graph: Graph, tokens: TokenCounts) -> float:
    """FLOPs of one transformer call on one sample, unsharded (the useful work MFU is measured against): every
    2-D Linear weight at its stream's tokens, and every attention, over a graph whose identical blocks are folded."""
    total = sum(graph.count(op.block) * linear_flops(op.in_features, op.out_features, tokens.of_stream(op.stream))
                for op in graph.linears)
    by_module = {op.module: op for op in graph.linears}
    for attention in graph.attentions:
        total += graph.count(by_module[attention.qkv[0]].block) * attention_flops(attention, *_sequence(attention, tokens))
    total += sum(graph.count(p.parameter.block) * conv_flops(p.parameter.numel, tokens.of_stream(p.parameter.stream))
                 for p in graph.convs)
    return total


def _sequence(attention: Attention, tokens: TokenCounts) -> tuple[int, int]:
    """(queries, keys) per sample: the joint sequence twice, or a cross-attention's queries against its keys."""
    return (sum(tokens.of_stream(s) for s in attention.streams),
            sum(tokens.of_stream(s) for s in attention.key_streams))


def chip_work(graph: Graph, layout: Layout, mesh: AbstractMesh, flash_attention: bool, xla: bool = False
              ) -> tuple[Work, ...]:
    """The work of one chip in one transformer call, op by op (Linears, attentions, and the rest's weights); `xla`:
    it runs as XLA's program (TPUs: meshlab.plan.axes.heads_gathered)."""
    work = [replace(_linear(op, layout, mesh), count=graph.count(op.block)) for op in graph.linears]
    by_module = {op.module: op for op in graph.linears}
    moved = _ulysses_at_kernels(graph, layout, mesh)
    for attention in graph.attentions:
        qkv = [by_module[m] for m in attention.qkv if m in by_module]
        if qkv:
            work.append(replace(_attention(attention, qkv, layout, mesh, flash_attention, xla),
                                count=graph.count(qkv[0].block), ulysses=moved.get(attention.module, 1)))
    convs = graph.convs
    work.extend(replace(_conv(p, layout, mesh), count=graph.count(p.parameter.block)) for p in convs)
    weights = sum(p.bytes_per_device(mesh) * graph.count(p.parameter.block) for p in graph.others if p not in convs)
    work.append(Work("norms and other weights", None, 0.0, float(weights), "other"))
    work.extend(elementwise_work(graph, layout, mesh) if graph.card is not None else ())
    return tuple(work)


def _ulysses_at_kernels(graph: Graph, layout: Layout, mesh: AbstractMesh) -> dict[str, int]:
    """Per attention whose kernel an ``attention.qkv`` rule marks: the size of the sequence axes the rule moves from
    its tokens onto its heads (Ulysses', as meshlab.cost.collectives reads the same rule; the planner has checked
    that they divide the heads)."""
    if not layout.activation_rules or graph.card is None or not layout.sequence_axes:
        return {}
    attentions = {a.module for a in graph.attentions}
    found = {}
    for point in activation_points(graph.card, layout.activation_rules):
        if point.where != "kernel" or point.module not in attentions:
            continue
        split = _split(kernel_split(point.spec.entries, layout.sequence_axes)[1], mesh)
        if split > 1:
            found[point.module] = split
    return found


def elementwise_work(graph: Graph, layout: Layout, mesh: AbstractMesh) -> tuple[Work, ...]:
    """One row per block list: the HBM bytes of one block's elementwise work at this chip's tokens, counted once
    for each block of the list, as the layout runs it (`Layout.elementwise`: fused gaps, or eager ops). A tensor
    the card says a Linear makes or reads is split as that Linear's output or input features are; one going into
    or out of attention as its heads are; the rest (the residual stream) is whole on every chip."""
    card = graph.card
    counts = block_lists(card)
    by_module = {op.module: op for op in graph.linears}
    entries = [e for e in card.elementwise if e.execution == layout.elementwise]
    rows = []
    for blocks in dict.fromkeys(e.blocks for e in entries):
        like = next((op for op in graph.linears if op.module.startswith(f"{blocks}.")), None)
        if not counts.get(blocks) or like is None:
            continue
        per_sample = sum(e.bytes_per_token * layout.local.of_stream(e.stream)
                         / _elementwise_split(e, like, by_module, graph, layout, mesh)
                         for e in entries if e.blocks == blocks)
        what = "passes" if layout.elementwise == "fused" else "ops, eager"
        rows.append(Work(f"elementwise {what} ({blocks})", None, 0.0, float(layout.batch * per_sample),
                         "elementwise", count=counts[blocks]))
    return tuple(rows)


def _elementwise_split(e, like: LinearOp, by_module: dict, graph: Graph, layout: Layout, mesh: AbstractMesh) -> int:
    """How many ways the features of an elementwise entry's tensors are split on a chip (see `elementwise_work`)."""
    gathered = layout.activation_axes()
    if e.side in ("in", "out"):
        module = concrete_path(e.linear, like.module)
        op = by_module.get(module)
        if op is None:  # a convolution that is no Linear (SANA's depthwise): its channels split as its weight's
            conv = next((p for p in graph.convs if p.parameter.module == module), None)
            return compute_split(conv.spec.entries[0], mesh, gathered) if conv is not None else 1
        return compute_split(op.weight.spec.entries[0 if e.side == "out" else 1], mesh, gathered)
    if e.side == "attention":
        block = like.module.split(".", 2)[:2]
        for attention in graph.attentions:
            q = by_module.get(attention.qkv[0])
            if q is not None and q.module.split(".", 2)[:2] == block:
                return _head_split(attention, q, layout, mesh)
    return 1


def _head_split(attention: Attention, q: LinearOp, layout: Layout, mesh: AbstractMesh) -> int:
    """Into how many pieces a chip's attention heads are split: as q's output features, when that divides them."""
    split = compute_split(q.weight.spec.entries[0], mesh, layout.activation_axes())
    return split if attention.heads % split == 0 else 1


def _split(axes, mesh: AbstractMesh) -> int:
    return math.prod(mesh.size(a) for a in axes) if axes else 1


def _linear(op: LinearOp, layout: Layout, mesh: AbstractMesh) -> Work:
    out_split, in_split = (compute_split(e, mesh, layout.activation_axes()) for e in op.weight.spec.entries[:2])
    out, inp = -(-op.out_features // out_split), -(-op.in_features // in_split)
    tokens = layout.batch * layout.local.of_stream(op.stream)
    gathered = set(op.weight.spec.axes) & set(layout.activation_axes())
    weight_bytes = op.weight.bytes_per_device(mesh) * _split(tuple(gathered), mesh)
    if op.bias is not None:
        weight_bytes += op.bias.bytes_per_device(mesh)
    activations = tokens * (inp + out) * layout.itemsize
    return Work(op.module, op.block, linear_flops(inp, out, tokens), float(weight_bytes + activations), "linear",
                shape=(tokens, inp, out))


def _conv(weight, layout: Layout, mesh: AbstractMesh) -> Work:
    """A convolution that is not a Linear (SANA's depthwise 3x3) on one chip: its channels split as its weight's
    output dim (each channel is its own group), at the chip's tokens; it reads its input and writes its output
    once, and reads its weight shard."""
    split = compute_split(weight.spec.entries[0], mesh, layout.activation_axes())
    channels = -(-weight.shape[0] // split)
    tokens = layout.batch * layout.local.of_stream(weight.parameter.stream)
    elements = weight.parameter.numel // weight.shape[0] * channels
    nbytes = weight.bytes_per_device(mesh) + 2 * tokens * channels * layout.itemsize
    return Work(weight.parameter.module, weight.parameter.block, conv_flops(elements, tokens), float(nbytes), "conv")


def _linear_attention(attention: Attention, qkv: list[LinearOp], layout: Layout, mesh: AbstractMesh,
                      gathered: bool = False) -> Work:
    """SANA's linear attention on one chip (diffusers' SanaLinearAttnProcessor2_0): q, k and v cast to float32,
    the state ``relu(K)^T [V; 1]`` of its local heads summed over the chip's tokens (a sequence split all-reduces
    it: meshlab.cost.collectives), then ``relu(Q)`` times it, an output of head_dim + 1 rows per head in float32.
    Priced at the chip's float32 rate; bytes: k and v read, q read, the output written, in float32. `gathered`:
    every head on every chip (XLA's matmuls with more than one sample a chip, as the math attention's)."""
    heads = attention.heads // (1 if gathered else _head_split(attention, qkv[0], layout, mesh))
    tokens = sum(layout.local.of_stream(s) for s in attention.streams)
    d = attention.head_dim
    nbytes = layout.batch * tokens * heads * (3 * d + d + 1) * 4
    flops = layout.batch * attention_flops(attention, tokens, tokens, heads)
    return Work(attention.module, qkv[0].block, flops, float(nbytes), "linear-attention",
                shape=(layout.batch, heads, tokens, d))


def _attention(attention: Attention, qkv: list[LinearOp], layout: Layout, mesh: AbstractMesh, flash: bool,
               xla: bool = False) -> Work:
    gathered = heads_gathered(flash, layout.batch, xla, layout.sequence_split > 1, attention.is_linear,
                              kernel_marked(layout.activation_rules))  # every head on every chip
    if attention.is_linear:
        return _linear_attention(attention, qkv, layout, mesh, gathered)
    split = _head_split(attention, qkv[0], layout, mesh)
    heads = attention.heads // (1 if gathered else split)
    queries = sum(layout.local.of_stream(s) for s in attention.streams)
    keys = sum(layout.tokens.of_stream(s) for s in attention.key_streams)
    # every head gathered at a chip's own tokens with the values left split on theirs: each chip multiplies the
    # probabilities by its 1/split of the values (meshlab.plan.axes.values_summed)
    summed = (gathered and split > 1 and values_summed(split, layout.sequence_split)
              and any(layout.local.of_stream(s) < layout.tokens.of_stream(s) for s in attention.key_streams))
    width = heads * attention.head_dim
    io = (2 * queries + 2 * keys) * width  # q and output at the local queries, k and v at every key
    # scores and probabilities, written then read, in float32: torch's math attention (no flash kernel) computes
    # a bf16 or float16 attention in float32 (meshlab.plan.memory._attention_elements)
    scores = 0 if flash else 4 * heads * queries * keys * max(4, layout.itemsize)
    nbytes = layout.batch * (io * layout.itemsize + scores)
    flops = layout.batch * attention_flops(attention, queries, keys, heads)
    if summed:  # QK^T over every key, the products over the chip's piece of them
        flops = (flops + layout.batch * attention_flops(attention, queries, -(-keys // split), heads)) / 2
    return Work(attention.module, qkv[0].block, flops, float(nbytes), "attention",
                shape=(layout.batch, heads, queries, keys, attention.head_dim))
