"""The dataflow the cost model walks: every Linear of the card with its role, and the attentions.

Roles say what consumes a Linear's output, which decides the collectives its sharding implies:

- ``qkv``: feeds attention, which wants every q/k/v split the same way over heads.
- ``out``: an attention output projection; its input is the attention output, its output joins the residual.
- ``chunks``: a conditioning Linear (modulation, adaLN): its output is cut into hidden-size chunks (shift,
  scale, gate) that modulate the LayerNorms of one stream (``modulates``): each LayerNorm takes a shift and a
  scale, each residual branch a gate, so 6 chunks modulate 2 LayerNorms (attention and MLP), 3 chunks 1 (Flux's
  single blocks), and the 2 of an output norm (scale, shift) 1.
- ``hidden``: followed by an elementwise activation and the next Linear of the same module (MLP-in,
  the timestep embedder's first Linear); its output may stay split on its features.
- ``whole``: its output joins the residual stream or another whole-width consumer.

A ``hidden`` Linear's successor takes its input as the ``hidden`` one left it. The pairing rule: consecutive
Linears of one stream whose module paths differ only in their last two components, and whose second takes at
least as many features as the first gives (Flux's single blocks concatenate the attention output in front).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

from meshlab.cards.card import Attention
from meshlab.plan.plan import Plan, PlannedParameter

ROLES = ("qkv", "out", "chunks", "hidden", "whole")


@dataclass(frozen=True)
class LinearOp:
    module: str
    weight: PlannedParameter
    bias: PlannedParameter | None
    stream: str
    block: int | None
    role: str  # one of ROLES
    source: str | None  # module whose output is this Linear's input: an attention, a ``hidden`` Linear, or None
    modulates: str | None = None  # ``chunks`` only: the stream whose LayerNorms its chunks modulate

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    @property
    def in_features(self) -> int:
        return self.weight.shape[1]

    @property
    def layer_norms(self) -> int:
        """``chunks`` only: the LayerNorms its chunks modulate (see the module's docstring)."""
        return max(1, self.out_features // self.in_features // 3)

    @property
    def short(self) -> str:
        """The module path inside its block, e.g. ``attn.to_q``."""
        parts = self.module.split(".")
        return ".".join(parts[2:]) if self.block is not None and len(parts) > 2 else self.module


@dataclass(frozen=True)
class Graph:
    linears: tuple[LinearOp, ...]
    attentions: tuple[Attention, ...]
    others: tuple[PlannedParameter, ...]  # parameters that are not Linear weights or biases (norms, ...)
    hidden_size: int
    #: Blocks identical to a kept block (same parameter names past the index, shapes, specs and streams) are
    #: left out; ``repeats[b]`` says how many blocks kept block ``b`` stands for.
    repeats: dict[int, int] = field(default_factory=dict)

    def count(self, block: int | None) -> int:
        return 1 if block is None else self.repeats.get(block, 1)



def _representatives(plan: Plan) -> dict[int, int]:
    """For each kept block, how many blocks (itself included) share its signature."""
    signatures: dict[int, list] = defaultdict(list)
    for p in plan.parameters:
        block = p.parameter.block
        if block is not None:
            parts = p.name.split(".", 2)  # "<list>.<index>.<rest>": the index is what differs between blocks
            local = (parts[0], parts[2]) if len(parts) == 3 and parts[1].isdigit() else (p.name,)
            signatures[block].append((local, p.shape, p.spec.entries, p.parameter.stream, p.parameter.kind))
    first: dict[tuple, int] = {}
    repeats: dict[int, int] = {}
    for block in sorted(signatures):
        kept = first.setdefault(tuple(signatures[block]), block)
        repeats[kept] = repeats.get(kept, 0) + 1
    return repeats


def graph_of(plan: Plan) -> Graph:
    repeats = _representatives(plan)
    weights: dict[str, PlannedParameter] = {}
    biases: dict[str, PlannedParameter] = {}
    others = []
    for p in plan.parameters:
        if p.parameter.block is not None and p.parameter.block not in repeats:
            continue
        kind, rank = p.parameter.kind, p.parameter.rank
        if kind == "linear" and rank == 2 and not p.parameter.is_bias:
            weights[p.parameter.module] = p
        elif kind == "linear" and p.parameter.is_bias:
            biases[p.parameter.module] = p
        else:
            others.append(p)
    attention_of = {m: a for a in plan.card.attention for m in a.qkv}
    out_of = {m: a for a in plan.card.attention for m in a.out}
    ordered = list(weights.items())
    linears = []
    hidden_before: dict[str, str] = {}
    for i, (module, weight) in enumerate(ordered):
        role, source = _role(module, weight, ordered[i + 1] if i + 1 < len(ordered) else None, attention_of, out_of)
        if role == "hidden":
            hidden_before[ordered[i + 1][0]] = module
        if module in out_of:
            source = out_of[module].module
        elif module in hidden_before:
            source = hidden_before[module]
        linears.append(LinearOp(module, weight, biases.get(module), weight.parameter.stream, weight.parameter.block,
                                role, source, _modulates(module, weight, weights) if role == "chunks" else None))
    kept_attention = tuple(a for a in plan.card.attention if a.qkv and a.qkv[0] in weights)
    return Graph(tuple(linears), kept_attention, tuple(others), plan.card.architecture.hidden_size, repeats)


def _role(module, weight, following, attention_of, out_of) -> tuple[str, str | None]:
    if module in attention_of:
        return "qkv", None
    if module in out_of:
        return "out", None
    if following is not None and _pairs(module, weight, *following):
        return "hidden", None
    if weight.parameter.stream == "conditioning" and weight.parameter.block is not None:
        return "chunks", None
    if weight.parameter.stream == "conditioning" and weight.shape[0] > weight.shape[1]:
        return "chunks", None  # e.g. norm_out.linear: scale and shift for the final norm
    return "whole", None


def _modulates(module: str, weight: PlannedParameter, weights: dict[str, PlannedParameter]) -> str:
    """The stream a modulation Linear conditions: named (``txt_mod``, ``norm1_context``), else its block's other one.

    Outside the blocks (the output norm) it is the image stream, which the output projection reads."""
    block = weight.parameter.block
    if block is None:
        return "image"
    if any(marker in module.split(".", 2)[-1] for marker in ("txt", "context")):
        return "text"
    streams = {w.parameter.stream for w in weights.values() if w.parameter.block == block}
    return "joint" if "joint" in streams else "image"


def _pairs(module: str, weight: PlannedParameter, next_module: str, next_weight: PlannedParameter) -> bool:
    a, b = module.split("."), next_module.split(".")
    common = 0
    while common < min(len(a), len(b)) and a[common] == b[common]:
        common += 1
    return (
        weight.parameter.stream == next_weight.parameter.stream
        and weight.parameter.block == next_weight.parameter.block
        and len(a) - common <= 2 and len(b) - common <= 2 and common > 0
        and next_weight.shape[1] >= weight.shape[0]
    )
