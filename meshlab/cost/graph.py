"""The dataflow the cost model walks: every Linear of the card with its role, and the attentions.

Roles come from the dataflow traced from the real forward and recorded in the card (``ModelCard.dataflow``,
see meshlab.models.importer.dataflow_trace), never from module names or registration order. They say what consumes a
Linear's output, which decides the collectives its sharding implies:

- ``qkv``: feeds attention, which wants every q/k/v split the same way over heads.
- ``out``: reads an attention's output (its ``source``); its output joins the residual. Flux's single blocks
  also concatenate an MLP branch into it (a ``hidden`` Linear, kept in ``also``; FLUX.2's, the fused q/k/v
  projection's MLP tail: that ``qkv`` Linear is kept in ``also``).
- ``chunks``: a conditioning Linear (modulation, adaLN) whose output meets the output of LayerNorms of one
  stream (``modulates``) as shift and scale pieces ``chunk_width`` wide: ``norms`` says how many LayerNorms
  (2 in a Qwen-Image or Flux dual block, 1 in a Flux single block and the output norm).
- ``hidden``: read by exactly one other Linear (after an elementwise activation), and by nothing else: MLP-in,
  the timestep embedder's first Linear, Flux's ``proj_mlp``; its output may stay split on its features.
- ``whole``: its output joins the residual stream or feeds several consumers.

Linears come in the order the traced forward calls them, block by block.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from itertools import groupby

from meshlab.models.card import Attention, Flow, Join, ModelCard, concrete_path, module_pattern
from meshlab.core.errors import InputError
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
    norms: int = 0  # ``chunks`` only: the LayerNorms it modulates
    chunk_width: int = 0  # ``chunks`` only: features of each shift / scale / gate piece
    also: tuple[str, ...] = ()  # further sources concatenated into its input (Flux single blocks' proj_mlp)
    #: Where in its block it sits, shared by its twin in the other stream (attn.to_add_out ~ attn.to_out.0): the
    #: short name of the first Linear of the block with its role and rank among its stream's Linears of that role
    phase: str = ""

    @property
    def out_features(self) -> int:
        return self.weight.shape[0]

    @property
    def in_features(self) -> int:
        return self.weight.shape[1]

    @property
    def is_dot(self) -> bool:
        """A Linear, which XLA lowers to a dot; a pointwise convolution stays a convolution in torch_xla's program,
        which XLA:TPU's collective matmuls (windowed einsum) do not rewrite (measured: SANA under 2d on v6e-8 gathers
        the input of its 1x1 conv_inverted whole)."""
        return self.weight.parameter.kind == "linear"

    @property
    def layer_norms(self) -> int:
        """``chunks`` only: the LayerNorms its chunks modulate (see the module's docstring)."""
        return self.norms

    @property
    def short(self) -> str:
        """The module path inside its block, e.g. ``attn.to_q``."""
        parts = self.module.split(".")
        return ".".join(parts[2:]) if self.block is not None and len(parts) > 2 else self.module


@dataclass(frozen=True)
class Graph:
    linears: tuple[LinearOp, ...]  # Linears, and pointwise convolutions the card traced as Linears
    attentions: tuple[Attention, ...]
    others: tuple[PlannedParameter, ...]  # parameters that are not Linear weights or biases (norms, convs, ...)
    hidden_size: int
    #: Blocks identical to a kept block (same parameter names past the index, shapes, specs and streams) are
    #: left out; ``repeats[b]`` says how many blocks kept block ``b`` stands for.
    repeats: dict[int, int] = field(default_factory=dict)
    joins: tuple[Join, ...] = ()  # stream concatenations and splits outside attention's q/k/v (ModelCard.joins)
    card: ModelCard | None = field(default=None, repr=False, compare=False)
    #: kept block -> the highest block it stands for (itself where absent)
    last: dict[int, int] = field(default_factory=dict)

    def count(self, block: int | None) -> int:
        return 1 if block is None else self.repeats.get(block, 1)

    @property
    def convs(self) -> tuple[PlannedParameter, ...]:
        """Weights of the convolutions inside blocks that are not Linears (SANA's depthwise 3x3): each output
        position multiplies the whole kernel, 2 x its elements FLOPs per token of its stream."""
        return tuple(p for p in self.others if p.parameter.kind == "conv" and p.parameter.rank >= 3
                     and not p.parameter.is_bias and p.parameter.block is not None
                     and p.parameter.stream in ("image", "text", "joint"))



def _representatives(plan: Plan) -> tuple[dict[int, int], dict[int, int]]:
    """For each kept block, how many blocks (itself included) share its signature, and the highest of them."""
    signatures: dict[int, list] = defaultdict(list)
    for p in plan.parameters:
        block = p.parameter.block
        if block is not None:
            parts = p.name.split(".", 2)  # "<list>.<index>.<rest>": the index is what differs between blocks
            local = (parts[0], parts[2]) if len(parts) == 3 and parts[1].isdigit() else (p.name,)
            signatures[block].append((local, p.shape, p.spec.entries, p.parameter.stream, p.parameter.kind))
    first: dict[tuple, int] = {}
    repeats: dict[int, int] = {}
    last: dict[int, int] = {}
    for block in sorted(signatures):
        kept = first.setdefault(tuple(signatures[block]), block)
        repeats[kept] = repeats.get(kept, 0) + 1
        last[kept] = block
    return repeats, last


def graph_of(plan: Plan) -> Graph:
    card = plan.card
    if not card.dataflow:
        raise InputError(f"model card {card.name!r} records no dataflow (which Linear feeds which)",
                         "regenerate it with `meshlab models import`")
    repeats, last = _representatives(plan)
    weights: dict[str, PlannedParameter] = {}
    biases: dict[str, PlannedParameter] = {}
    others = []
    flows = {f.module: f for f in card.dataflow}
    products = card.linear_modules
    for p in plan.parameters:
        if p.parameter.block is not None and p.parameter.block not in repeats:
            continue
        if p.parameter.module in products:
            (biases if p.parameter.is_bias else weights)[p.parameter.module] = p
        else:
            others.append(p)
    roles = _roles(card.dataflow)
    fused = {m for a in card.attention if a.fused_width for m in a.qkv}  # one Linear makes q, k, v and more
    linears = []
    for module in _forward_order(weights, card):
        weight = weights[module]
        flow = flows.get(module_pattern(module, card.block_lists))
        role = roles.get(flow.module, "whole") if flow else "whole"
        linears.append(_linear_op(module, weight, biases.get(module), role, flow, roles, fused))
    kept_attention = tuple(a for a in card.attention if a.qkv and a.qkv[0] in weights)
    linears = _with_phases(linears)
    return Graph(tuple(linears), kept_attention, tuple(others), card.architecture.hidden_size, repeats, card.joins,
                 card, last)


def _with_phases(linears: list[LinearOp]) -> list[LinearOp]:
    """Each Linear's phase (see ``LinearOp.phase``), from roles and forward order, never from module names."""
    from dataclasses import replace

    rank: dict[tuple, int] = defaultdict(int)
    first: dict[tuple, str] = {}
    out = []
    for op in linears:
        if op.block is None:
            out.append(replace(op, phase=op.module))
            continue
        stream = op.modulates or op.stream  # modulation Linears read the conditioning vector: by the stream they modulate
        key = (op.block, op.role, rank[(op.block, stream, op.role)])
        rank[(op.block, stream, op.role)] += 1
        phase = "attention" if op.role == "qkv" else first.setdefault(key, op.short)
        out.append(replace(op, phase=phase))
    return out


def _roles(dataflow: tuple[Flow, ...]) -> dict[str, str]:
    """Role of every traced Linear (by pattern), from what reads its output (see the module's docstring)."""
    readers: dict[str, int] = defaultdict(int)
    for flow in dataflow:
        for source in flow.sources("linear"):
            readers[source] += 1
    roles = {}
    for flow in dataflow:
        if flow.attention:
            roles[flow.module] = "qkv"
        elif flow.sources("attention"):
            roles[flow.module] = "out"
        elif flow.modulates:
            roles[flow.module] = "chunks"
        elif readers[flow.module] == 1 and not flow.residual:
            roles[flow.module] = "hidden"
        else:
            roles[flow.module] = "whole"
    return roles


def _linear_op(module: str, weight: PlannedParameter, bias: PlannedParameter | None, role: str, flow: Flow | None,
               roles: dict[str, str], fused: set[str] = frozenset()) -> LinearOp:
    attention = flow.sources("attention") if flow else ()
    hidden = tuple(concrete_path(s, module) for s in (flow.sources("linear") if flow else ()) if roles.get(s) == "hidden")
    source = concrete_path(attention[0], module) if attention else (hidden[0] if hidden else None)
    # an out Linear that also reads a fused q/k/v projection (`fused`) reads its MLP branch (FLUX.2's single blocks:
    # to_qkv_mlp_proj's gated tail, concatenated after the attention's output)
    branches = tuple(path for path in (concrete_path(s, module) for s in (flow.sources("linear") if flow else ())
                                       if roles.get(s) == "qkv") if attention and path in fused)
    also = hidden + branches if attention else hidden[1:]
    modulations = flow.modulates if flow and role == "chunks" else ()
    return LinearOp(module, weight, bias, weight.parameter.stream, weight.parameter.block, role, source,
                    modulates=modulations[0].stream if modulations else None,
                    norms=len({m.norm for m in modulations}),
                    chunk_width=min((m.width for m in modulations), default=0), also=also)


def _forward_order(weights: dict[str, PlannedParameter], card: ModelCard) -> list[str]:
    """The kept Linears in the traced forward's order: each run of one block list's Linears, block by block."""
    lists = card.block_lists
    by_pattern: dict[str, list[str]] = defaultdict(list)
    for module in weights:
        by_pattern[module_pattern(module, lists)].append(module)
    order: list[str] = []
    for head, run in groupby(card.dataflow, key=lambda f: f.module.partition(".*")[0] if ".*" in f.module else None):
        per_block: dict[int, list[str]] = defaultdict(list)
        for flow in run:
            for module in by_pattern.pop(flow.module, []):
                per_block[weights[module].parameter.block if head else -1].append(module)
        for block in sorted(per_block):
            order.extend(per_block[block])
    order.extend(m for modules in by_pattern.values() for m in modules)  # never called by the traced forward
    return order
