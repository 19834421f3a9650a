"""The collectives a plan implies, derived per layer from the specs (no XLA involved).

Each activation's feature dim is in a state: split over some mesh axes (or whole), and possibly a partial sum
over some axes (the output of a Linear split on its input dim). The rules, applied in the graph's order:

- A Linear whose input dim is split as its input arrives multiplies locally; its output is split as its
  output dim and is a partial sum over the axes of its input dim (a row-split Linear).
- An input split on axes the weight's input dim is not split on is all-gathered first (a whole input that
  the weight splits is sliced locally, for free).
- A partial sum is all-reduced before anything non-linear reads it.
- ``whole`` consumers (the residual stream, norms) all-gather a split output.
- Attention wants q, k and v split alike over heads: those split differently are all-gathered (the most common
  split wins). With the image tokens split over a sequence axis, k and v of the image stream are all-gathered
  over it.
- ``chunks`` (modulation) outputs are all-gathered; when a shard boundary cuts a chunk (18432 rows over 4 is
  4608, not a multiple of the 3072-wide chunks) XLA also re-aligns the shards with collective-permutes, one
  per chunk that straddles a boundary.
- A weight split over an axis that splits activations (batch, sequence, guidance) is all-gathered over it
  before use (FSDP); so is a bias or norm scale split differently from the output it adds to.

Each collective is counted on its own: XLA's partitioned HLO on the CPU backend keeps the image and text
streams' all-reduces separate (checked on one Qwen-Image layer); `combine` merges equal (block, point, kind,
axes) for backends whose combiner passes would.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, replace

from meshlab.cost.graph import Graph, LinearOp
from meshlab.cost.layout import Layout
from meshlab.mesh import AbstractMesh
from meshlab.plan.plan import PlannedParameter

#: Where this derivation and XLA's partitioned HLO (CPU backend, one Qwen-Image layer at 256x256 with 32 text
#: tokens, benchmarks/xla_one_layer_collectives.py) were seen to differ; XLA is right, the model is not yet.
KNOWN_DIFFERENCES = (
    "XLA all-gathers batch-split activations over the data axis around the joint attention (4 such in a pairs "
    "layer, 3 in a 2d layer); this model assumes the batch split survives",
    "XLA re-aligns cut modulation chunks with more, finer collective-permutes (28 in a 2d layer, 34 in a 1x8 "
    "layer) than one per cut chunk boundary (4 and 12 here); their bytes are small either way",
    "XLA shows no all-reduce for the text stream's row-split out-projection and MLP-out (it re-shards the text "
    "stream instead); this model counts one each",
    "on CPU, XLA's collectives carry f32 (dots are upcast): twice the bytes of the bf16 this model counts",
)

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "collective-permute", "all-to-all")

Axes = tuple[str, ...]


@dataclass(frozen=True)
class Collective:
    """One collective in one transformer call on one chip."""

    kind: str  # one of KINDS
    axes: Axes  # mesh axes it runs over (major to minor)
    bytes: int  # per chip: the buffer it produces (all-gather: gathered; all-reduce: reduced; permute: sent)
    block: int | None  # repeated block it sits in (None: outside the blocks, or once per step)
    phase: str  # where: e.g. "attn.to_out.0:in"; the combiner merges equal (block, phase, kind, axes)
    why: str
    operands: int = 1  # tensors combined into this one collective
    per_step: bool = False  # once per denoising step rather than once per transformer call
    count: int = 1  # identical blocks it stands for (see `Graph.repeats`): it runs `count` times per call


@dataclass(frozen=True)
class _State:
    split: Axes | None = None  # mesh axes splitting the feature dim
    partial: Axes | None = None  # mesh axes over which it is an unreduced partial sum


def derive(graph: Graph, layout: Layout, mesh: AbstractMesh) -> tuple[Collective, ...]:
    """Every collective of one transformer call on one chip, combined per block and point."""
    found: list[Collective] = []
    states: dict[str, _State] = {}
    deriver = _Deriver(layout, mesh, graph, found)
    by_module = {op.module: op for op in graph.linears}
    done_attention: set[str] = set()
    for op in graph.linears:
        if op.role == "out" and op.source not in done_attention:
            attention = next(a for a in graph.attentions if a.module == op.source)
            states[op.source] = deriver.attention(attention, [by_module[m] for m in attention.qkv if m in by_module])
            done_attention.add(op.source)
        incoming = states.get(op.source, _State()) if op.source else _State()
        states[op.module] = deriver.linear(op, incoming)
    for attention in graph.attentions:  # attentions with no output projection (Flux single blocks)
        if attention.module not in done_attention:
            qkv = [by_module[m] for m in attention.qkv if m in by_module]
            if qkv:
                states[attention.module] = deriver.attention(attention, qkv)
    deriver.parameters(graph)
    if layout.guidance_axis:
        found.append(Collective("all-gather", (layout.guidance_axis,), _guidance_bytes(graph, layout), None,
                                "guidance", "the two guidance branches' noise predictions meet once per step",
                                per_step=True))
    return tuple(found)


def combine(collectives: list[Collective]) -> tuple[Collective, ...]:
    groups: dict[tuple, list[Collective]] = defaultdict(list)
    for c in collectives:
        groups[(c.block, c.phase, c.kind, c.axes, c.per_step)].append(c)
    merged = []
    for group in groups.values():
        first = group[0]
        whys = list(dict.fromkeys(c.why for c in group))
        merged.append(replace(first, bytes=sum(c.bytes for c in group), operands=sum(c.operands for c in group),
                              why="; ".join(whys)))
    return tuple(merged)


def _guidance_bytes(graph: Graph, layout: Layout) -> int:
    out = next((op.out_features for op in reversed(graph.linears) if op.stream == "image"), graph.hidden_size)
    return 2 * layout.batch * layout.tokens.image * out * layout.itemsize


class _Deriver:
    """Applies the rules above, appending to `found`."""

    def __init__(self, layout: Layout, mesh: AbstractMesh, graph: Graph, found: list[Collective]):
        self.layout, self.mesh, self.graph, self.found = layout, mesh, graph, found
        self.hidden = graph.hidden_size

    def size(self, axes: Axes | None) -> int:
        return math.prod(self.mesh.size(a) for a in axes) if axes else 1

    def tensor_bytes(self, stream: str, features: int, split: Axes | None) -> int:
        tokens = self.layout.local.of_stream(stream)
        return self.layout.batch * tokens * -(-features // self.size(split)) * self.layout.itemsize

    def emit(self, kind: str, axes: Axes, nbytes: int, op_block, phase: str, why: str) -> None:
        self.found.append(Collective(kind, axes, nbytes, op_block, phase, why, count=self.graph.count(op_block)))

    def linear(self, op: LinearOp, incoming: _State) -> _State:
        w_out, w_in = op.weight.spec.entries
        phase = f"{_phase_name(op)}:in"
        if incoming.partial:
            self.emit("all-reduce", incoming.partial, self.tensor_bytes(op.stream, op.in_features, incoming.split),
                      op.block, phase, f"{op.short}: its input is a partial sum")
        if incoming.split and incoming.split != w_in:
            self.emit("all-gather", incoming.split, self.tensor_bytes(op.stream, op.in_features, None), op.block, phase,
                      f"{op.short}: input arrives split on {'+'.join(incoming.split)}, "
                      f"the weight wants it {'split on ' + '+'.join(w_in) if w_in else 'whole'}")
        self._fsdp(op.weight, op.block, f"{op.short}.weight")
        out = _State(w_out, w_in)
        return self._consume(op, out)

    def _consume(self, op: LinearOp, out: _State) -> _State:
        phase = f"{_phase_name(op)}:out"
        nbytes = self.tensor_bytes(op.stream, op.out_features, out.split)
        if op.role in ("qkv",):
            return out  # attention resolves it
        if out.partial:
            self.emit("all-reduce", out.partial, nbytes, op.block, phase,
                      f"{op.short} is split on its input dim: its output is summed over {'+'.join(out.partial)}")
        if op.role == "hidden" or not out.split:
            return _State(out.split)
        whole = self.tensor_bytes(op.stream, op.out_features, None)
        if op.role == "chunks":
            self._chunks(op, out.split, whole)
        why = f"{op.short} is split on its output dim but its consumer needs it whole"
        self.emit("all-gather", out.split, whole, op.block, phase, why)
        return _State()

    def _chunks(self, op: LinearOp, split: Axes, whole: int) -> None:
        parts = self.size(split)
        chunk = self.hidden
        shard = -(-op.out_features // parts)
        if shard % chunk == 0 or chunk % shard == 0:
            return
        straddling = sum(1 for i in range(1, parts) if (i * shard) % chunk)
        nbytes = whole // max(1, op.out_features // chunk)
        for _ in range(straddling):
            self.emit("collective-permute", split, nbytes, op.block, f"{_phase_name(op)}:chunks",
                      f"{op.short}: {shard}-row shards cut its {chunk}-wide chunks")

    def attention(self, attention, qkv: list[LinearOp]) -> _State:
        arrived = {op.module: _State(*op.weight.spec.entries) for op in qkv}
        splits = [arrived[op.module].split for op in qkv]
        target = max(splits, key=lambda s: (splits.count(s), s is not None))
        phase = "attention:in"
        for op in qkv:
            state = arrived[op.module]
            if state.partial:
                self.emit("all-reduce", state.partial, self.tensor_bytes(op.stream, op.out_features, state.split),
                          op.block, phase, f"{op.short} is split on its input dim: q/k/v must be summed")
            if state.split and state.split != target:
                self.emit("all-gather", state.split, self.tensor_bytes(op.stream, op.out_features, None), op.block,
                          phase, f"{op.short} is split on {'+'.join(state.split)}, attention has it "
                          f"{'on ' + '+'.join(target) if target else 'whole'}")
        self._sequence(attention, qkv, target)
        return _State(target)

    def _sequence(self, attention, qkv: list[LinearOp], target: Axes | None) -> None:
        axis = self.layout.sequence_axis
        if not axis or self.size((axis,)) == 1:
            return
        block = qkv[0].block
        width = attention.heads * attention.head_dim
        image_kv = [op for op in qkv if op.stream in ("image", "joint")][1:3] or qkv[1:3]
        for op in image_kv:
            tokens = self.layout.tokens.image
            nbytes = self.layout.batch * tokens * -(-width // self.size(target)) * self.layout.itemsize
            self.emit("all-gather", (axis,), nbytes, block, "attention:kv",
                      f"{op.short}: image tokens are split over {axis}; every query needs every key and value")

    def _fsdp(self, param: PlannedParameter, block, name: str) -> None:
        activation_axes = set(self.layout.activation_axes())
        axes = tuple(a for a in param.spec.axes if a in activation_axes)
        if axes:
            self.emit("all-gather", axes, param.bytes_per_device(self.mesh) * self.size(axes), block,
                      f"{name}:weights", f"{name} is split over {'+'.join(axes)}, which also splits activations")

    def parameters(self, graph: Graph) -> None:
        """Biases split unlike their weight's output, and split norm scales, are gathered before use."""
        for op in graph.linears:
            if op.bias is None:
                continue
            if op.bias.spec.entries[0] != op.weight.spec.entries[0] and op.bias.spec.axes:
                self.emit("all-gather", op.bias.spec.axes, op.bias.parameter.bytes, op.block, "parameters",
                          f"{op.short}.bias is split unlike its weight's output")
        for p in graph.others:
            if p.spec.axes and p.parameter.kind == "norm":
                self.emit("all-gather", p.spec.axes, p.parameter.bytes, p.parameter.block, "parameters",
                          f"{p.name} (a norm scale) is split, but every chip applies it whole")


def _phase_name(op: LinearOp) -> str:
    """Image and text twins share a phase so that their collectives combine: attn.to_out.0 ~ attn.to_add_out."""
    if op.block is None:
        return op.module
    twins = {"attn.to_add_out": "attn.to_out.0"}
    short = twins.get(op.short, op.short)
    for text, image in (("txt_", "img_"), ("_context", "")):
        short = short.replace(text, image)
    if op.role == "qkv":
        return "attention"
    return short
