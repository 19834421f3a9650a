"""The collectives a plan implies, derived per layer from the specs (no XLA involved).

Each activation's feature dim is in a state: split over some mesh axes (or whole), and possibly a partial sum
over some axes (the output of a Linear split on its input dim). The rules, applied in the graph's order, are
what XLA's SPMD partitioner was seen to do with PyTorch/XLA's lowering (a full-width Qwen-Image block under every
built-in strategy, and an out-of-sample matrix: a guidance axis, a sequence axis, three axes, a 4x2 mesh, Flux
under 2d and pairs; tests/cost/test_collectives_vs_xla.py holds them against it):

- A Linear whose input dim is split as its input arrives multiplies locally; its output is split as its
  output dim and is a partial sum over the axes of its input dim (a row-split Linear).
- An input split on axes the weight's input dim is not split on is all-gathered first, once per consuming
  Linear (the CPU partitioner does not share one gather between q, k and v; XLA:TPU does: `issued_on`); a whole
  input the weight splits is sliced, free.
- A partial sum is all-reduced before anything non-linear reads it.
- The conditioning vector (the timestep embedding) stays as its last Linear left it; each modulation Linear
  that wants it otherwise gathers it for itself.
- ``chunks`` (modulation) outputs split on their rows keep their chunks split the same way (when the hidden
  size divides): every chunk piece that is not on the chip that wants it moves in a collective-permute (18432
  rows over 4 are 4608-row shards; each 3072-wide chunk wants 768 rows per chip). The activations they
  modulate, and the residual stream their gates scale, are then split on features too.
- Every LayerNorm (PyTorch/XLA lowers it as a batch norm over the ``[1, batch x tokens, features]`` view)
  all-gathers its input over a split residual's axes, then gathers its rows over every axis that splits them
  (batch, sequence, guidance): the partitioner cannot keep the merged row dim split. Under the
  ``layernorm-rows`` rewrite (a per-row mean and variance) the rows stay split: no rows gather; and a residual
  split on features is not gathered either: the mean and the variance are each summed over the split in one
  all-reduce of one float32 value per row (measured: 2d.yaml). Each ``chunks`` Linear stands for the LayerNorms
  it modulates.
- An activation rule (meshlab.plan.activations) marks the q/k/v an attention kernel reads, or an out-projection's
  input: an axis that moves from the tokens onto the heads, or back, is one all-to-all of the chip's buffer per
  stream and tensor (Ulysses: each stream's q, k and v moves before the concatenation, which is then local); an
  axis the features lose is all-gathered; one they gain from whole is a free slice. When the kernel reads its
  tokens whole, the sequence rules below do not apply.
- A Linear writing the residual stream split as the residual already is leaves the gather to the next
  LayerNorm; ``whole`` consumers all-gather any other split output.
- Attention wants q, k and v split alike over heads: those split differently are all-gathered (the most common
  split wins).
- A sequence axis splits the image tokens, and, where an attention joins text and image, the text tokens too
  (XLA carries the joint split back onto the text stream). q, k and v of each stream are concatenated along the
  split token dim: one all-to-all per stream and one for the joint result, for each of q, k and v; k and v of the
  whole joint sequence are all-gathered; cutting the joint output back into streams moves, in one permute per
  stream whose even split does not line up with the joint one, one joint shard in all.
- A linear attention (SANA's) under a sequence axis gathers no keys: its state, a sum over the tokens, is
  all-reduced (one float32 (head_dim + 1) x head_dim matrix per head); a convolution over the token grid (SANA's
  depthwise 3x3) receives the rows beyond its share from each neighbour (two permutes). Neither is held against XLA:
  its CPU partitioner does not keep SANA's tokens split (known_differences.yaml).
- A gated unit's first Linear (``Flow.gated``: FLUX.2's SwiGLU, SANA's GLUMBConv) split on its output over n chips:
  its pieces lie on different chips, and each piece's share moves to the chips that want it, one permute of out /
  (pieces x n) features per piece (measured: SANA, model 2, on the CPU partitioner and XLA:TPU).
- A Linear that reads a concatenation of two outputs along features (Flux's single blocks: attention and MLP
  branch into ``proj_out``), each split as its weight's input dim: one all-to-all per part and one for the
  result (the weight wants contiguous blocks of the whole); parts split otherwise are gathered.
- Streams joined into one sequence outside attention's q/k/v, and cut back (Flux's single blocks, CogVideoX's
  attention before its projections: the card's ``joins``), cost under a sequence axis what attention's concatenation
  and split-back cost, at the joined tensor's width (a block's join of its own arguments: each at the split it arrives
  with; a join of its norms' outputs under layernorm-rows: at their residuals' split). q and k rotated on the image's
  part of a joint sequence and joined with the rest again (``Flow.rotary_part``) cost one such join each.
- A block.input rule whose spec leaves the features whole gathers a residual split on features at each block's
  start.
- A weight split over an axis that splits activations (batch, sequence, guidance) is all-gathered over it
  before use (FSDP); so is a bias or norm scale split differently from the output it adds to, and a table added
  to the modulation (Wan's scale_shift_table; chunk by chunk where FSDP splits it).
- Wan (measured under 2d, pairs and cfg x Ulysses with FSDP): the modulation comes from one Linear outside the
  blocks and conditions every block's norms, so its split is the residual's in every block; LayerNorms no
  modulation conditions (the cross-attention's norm2) cost what a modulated one does; a q or k norm across all
  heads on a projection output split on features all-reduces one float32 per token; the text embedding, read
  only by the blocks' cross-attention k and v, stays split and each reader gathers it; q and k rotated as two
  interleaved halves of each head move in two half-width all-to-alls each. Which projections a norm across heads
  or rotary halves act on is the card's traced dataflow (``Flow.qk_norm``, ``Flow.rotary``), not their names.

Each collective is counted on its own: XLA's partitioned HLO on the CPU backend keeps the image and text
streams' all-reduces separate; `combine` merges equal (block, point, kind, axes) for backends whose combiner
passes would.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Generator, Iterator
from dataclasses import dataclass, replace
from fractions import Fraction
from functools import lru_cache
from importlib import resources

import yaml

from meshlab.core.hardware import combine_limit
from meshlab.models.card import DTYPE_BYTES, Flow, module_pattern
from meshlab.cost.graph import Graph, LinearOp
from meshlab.cost.layout import Layout
from meshlab.core.mesh import AbstractMesh
from meshlab.core.tpu_tiles import LANES
from meshlab.plan.activations import activation_points
from meshlab.plan.axes import heads_gathered, kernel_marked, kernel_split, values_summed
from meshlab.plan.plan import PlannedParameter
from meshlab.strategy.schema import ASYNC_ALL_GATHER_FLAG, flag_setting, flag_value, weight_gathers_run_async

@lru_cache(maxsize=1)
def _known_difference_entries() -> tuple[dict, ...]:
    text = (resources.files("meshlab") / "data" / "known_differences.yaml").read_text(encoding="utf-8")
    return tuple(yaml.safe_load(text))


#: the programs a known difference is held against (known_differences.yaml's `truth`), as explain names them
TRUTHS = {"xla-tpu": "XLA:TPU's own program (`meshlab check --backend tpu`)",
          "xla-cpu": "XLA's partitioner on CPU devices (`meshlab check`)"}


def known_differences(class_name: str | None = None, general: bool = True, truth: str | None = None
                      ) -> tuple[str, ...]:
    """Where this derivation and XLA's partitioned HLO still differ, each with its measured figures
    (meshlab/data/known_differences.yaml, beside the names of the XLA captures it was read from): every entry, or
    with `class_name` (a card's diffusers class) those measured on that class and, with `general`, those that hold
    for every class; with `truth` ("xla-cpu" or "xla-tpu", `TRUTHS`), those held against that program only."""
    return tuple(entry["difference"] for entry in _known_difference_entries()
                 if (truth is None or entry.get("truth", "xla-cpu") == truth)
                 and (class_name is None or (entry["classes"] == "all" and general)
                      or (entry["classes"] != "all" and class_name in entry["classes"])))


#: the phases in which XLA's partitioner re-splits tokens to join streams into one sequence or cut them back
#: (`_sequence`, `_cut_into_streams`, `joins`): the GPU tools join them on the chip (meshlab.cost.ring.tool_issued)
STREAM_RESPLITS = ("attention:concat", "attention:split", "attention:rotary", "streams:concat", "streams:split")
#: the most a sum's tokens may gain, padded to 128 lanes, as a share of the padded tokens, for XLA:TPU to
#: reduce-scatter it (see `reduce_scatters`; measured between 5.0%, reduce-scattered, and 5.6%, all-reduced)
SCATTER_ROW_PADDING = Fraction(1, 20)
#: the collectives by kind, in the order the check and its tables list them (meshlab.check.hlo reads HLO by them)
COLLECTIVE_KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

Axes = tuple[str, ...]
_CONDITIONING = "<conditioning>"  # the state of the conditioning vector every modulation Linear reads


@dataclass(frozen=True)
class Collective:
    """One collective in one transformer call on one chip."""

    kind: str  # one of COLLECTIVE_KINDS
    axes: Axes  # mesh axes it runs over (major to minor)
    bytes: int  # per chip: the buffer it produces (all-gather: gathered; all-reduce: reduced; permute: sent)
    block: int | None  # repeated block it sits in (None: outside the blocks, or once per step)
    phase: str  # where: e.g. "attn.to_out.0:in"; the combiner merges equal (block, phase, kind, axes)
    why: str
    operands: int = 1  # tensors combined into this one collective
    per_step: bool = False  # once per denoising step rather than once per transformer call
    count: int = 1  # identical blocks it stands for (see `Graph.repeats`): it runs `count` times per call
    #: "modulation": the partial sum of a block's modulation Linear (it reads only the conditioning), or its input's
    #: gather; "norm-rows": a LayerNorm's gather of the rows a batch or sequence axis splits (the CPU partitioner's)
    role: str = ""
    #: "first" or "last": issued in only the first or last of the `count` blocks (XLA:TPU's cross-block combining,
    #: `issued_on`); "": in every one of them
    only: str = ""
    #: axes in `axes` only XLA's join of the streams needs (USP: the ring axes its Ulysses all-to-all also moves); a
    #: GPU tool, which joins the streams on the chip, runs it over the others (meshlab.cost.ring.tool_issued)
    joined: Axes = ()
    #: a collective XLA:TPU may run as a collective matmul (`windowed`): "gather", an operand gathered for a matmul
    #: whose output stays split like the other operand; "scatter", a partial sum whose output stays split like the
    #: residual it joins; "" neither
    window: str = ""
    dot_flops: float = 0.0  # per chip: the FLOPs of the matmul it feeds or drains (window only)
    #: window "scatter" only: the summed tensor's tokens a sample on one chip, and its features (whole)
    rows: int = 0
    features: int = 0
    reads: str = ""  # all-gathers of one tensor share this (XLA:TPU gathers it once for all its readers)
    #: a permute of a collective matmul that sends its shards both ways round the ring at once: two take the time of
    #: one where the route is a ring (meshlab.cost.timing)
    both_ways: bool = False
    #: a LayerNorm's gather of a residual split on features: the bytes of its rows' mean and variance, which XLA:TPU
    #: all-reduces instead (`norm_statistics`)
    stats_bytes: int = 0
    #: a permute of a collective matmul: the FLOPs per chip of the slice of the matmul it runs beside, under which
    #: its transfer hides (meshlab.cost.timing)
    beside_flops: float = 0.0
    #: the gather of a block's modulation table whose conditioning comes split from outside the blocks: (its
    #: chunks, bytes per chip of one chunk's realignment, bytes per chip of the table's own all-to-all in place of
    #: the gather or 0) (`realigned_chunks`)
    realigned: tuple[int, int, int] = ()
    #: an all-to-all of the streams' q or k joining one sequence that the attention then rotates
    #: (``Flow.rotary_joint``), made by Linears with a bias (Flux): XLA:TPU joins it twice (`rotated_joins`)
    rotated_join: bool = False
    #: "start" or "end": the streams' join at a block's start or their cut at its end, in a list whose blocks do
    #: both and whose inputs no rule constrains: XLA:TPU folds one block's cut and the next one's join away, keeping
    #: the join of the list's first kept block ("start") and the cut of its last ("end"); the others are "inner"
    #: (`folded_joins`)
    edge: str = ""


@dataclass(frozen=True)
class _State:
    split: Axes | None = None  # mesh axes splitting the feature dim
    partial: Axes | None = None  # mesh axes over which it is an unreduced partial sum


def derive(graph: Graph, layout: Layout, mesh: AbstractMesh, flash_attention: bool = True, xla: bool = False
           ) -> tuple[Collective, ...]:
    """Every collective of one transformer call on one chip, combined per block and point (`flash_attention`: the
    attention runs a flash kernel, not torch's math attention; `xla`: the plan runs as XLA's program, on TPUs)."""
    marked = kernel_marked(layout.activation_rules)
    gathered = [heads_gathered(flash_attention, layout.batch, xla, layout.sequence_split > 1, linear, marked)
                for linear in (False, True)]
    deriver = _Deriver(layout, mesh, graph, _card_points(graph, layout), *gathered)
    return _over_real_axes((*deriver.activations(graph), *deriver.parameters(graph), *deriver.joins(graph),
                            *deriver.halos(graph), *deriver.block_inputs(graph), *_guidance(graph, layout)), mesh)


def _over_real_axes(collectives: tuple[Collective, ...], mesh: AbstractMesh) -> tuple[Collective, ...]:
    """Each collective over the axes of its own that have more than one device: an axis of size 1 (``model: 1``)
    splits nothing, so a collective over it alone is no op at all (XLA issues none; they were listed, at 0 s)."""
    kept = []
    for c in collectives:
        axes = tuple(a for a in c.axes if mesh.size(a) > 1)
        if axes:
            kept.append(c if axes == c.axes else replace(c, axes=axes, joined=tuple(a for a in c.joined if a in axes)))
    return tuple(kept)


def residual_splits(graph: Graph, layout: Layout, mesh: AbstractMesh) -> dict[str, Axes]:
    """Stream -> the mesh axes its residual stream is split on between blocks, on its features (() whole), for every
    stream whose residual a modulation scales ("joint": the single blocks' of Flux and HunyuanVideo): as the gates
    that scale its updates (`_Deriver.residual`). Planning reads the same from the plan alone
    (meshlab.plan.planned.residual_splits); tests hold the two equal."""
    deriver = _Deriver(layout, mesh, graph)
    streams = {stream for block, stream in deriver.modulation if block is not None} | set(deriver.residual)
    return {stream: tuple(deriver.residual.get(stream) or ()) for stream in sorted(streams)}


def _guidance(graph: Graph, layout: Layout) -> tuple[Collective, ...]:
    """The guidance branches' predictions meet once per step, where a mesh axis splits them."""
    if not layout.guidance_axis:
        return ()
    return (Collective("all-gather", (layout.guidance_axis,), _guidance_bytes(graph, layout), None, "guidance",
                       "the two guidance branches' noise predictions meet once per step", per_step=True),)


def _card_points(graph: Graph, layout: Layout) -> dict:
    """(module, where) -> the ActivationPoint of the strategy's activation rules, for the graph's modules."""
    if not layout.activation_rules or graph.card is None:
        return {}
    return {(p.module, p.where): p for p in activation_points(graph.card, layout.activation_rules)}


#: libtpu flags that turn XLA:TPU's collective matmuls (windowed einsum) off, and the windows each one closes
WINDOWED_EINSUM_FLAGS = {"xla_tpu_enable_windowed_einsum_for_all_gather": "gather",
                         "xla_tpu_enable_windowed_einsum_for_reduce_scatter": "scatter"}


def windows_open(libtpu_flags: tuple[str, ...] | list[str] = ()) -> frozenset[str]:
    """The windows (`Collective.window`) XLA:TPU may run as collective matmuls under a strategy's libtpu flags: both
    by default; `--xla_tpu_enable_windowed_einsum_for_all_gather=false` closes "gather" (a matmul's gathered
    operand, an FSDP weight's too), `..._for_reduce_scatter=false` closes "scatter" (the last flag of a name wins,
    as absl's parser takes it; `--noname` is off too). Measured: 2d.yaml with both off (tests/check/test_tpu_check.py),
    6 all-gathers a middle block where XLA:TPU's defaults issue 4 and 46 permutes (256², v6e-8). Other flags change
    no count here."""
    given: dict[str, bool | None] = {}
    for flag in libtpu_flags:
        name, value = flag_setting(flag)
        if name in WINDOWED_EINSUM_FLAGS:
            given[name] = value
    return frozenset({"gather", "scatter"} - {WINDOWED_EINSUM_FLAGS[n] for n, v in given.items() if v is False})


#: the libtpu flag that makes XLA:TPU run all-to-alls asynchronously (off by default): measured at full depth on
#: v6e-8, hybrid.yaml's 7 Ulysses all-to-alls a middle block run 6 async with it and 0 without, and the same on
#: v5p's and v4's 4 chips (python benchmarks/tpu_async_overlap.py); the catalog's ``async_all_to_all_hidden`` prices
#: what that hides, per chip
ASYNC_ALL_TO_ALL_FLAG = "xla_tpu_enable_async_all_to_all"
#: the phase a weight's gather ends with: a weight split over an axis that splits activations too (FSDP's)
WEIGHTS_PHASE = ":weights"


def async_all_to_alls(libtpu_flags: tuple[str, ...] | list[str] = ()) -> bool:
    """Whether a strategy's libtpu flags make XLA:TPU's all-to-alls async (off by default; the last setting of the
    flag wins, as absl's parser takes it). The other async flags measured on v6e change nothing there:
    --xla_enable_async_all_gather and _all_reduce leave fsdp's gathers and pairs' all-reduces synchronous
    (benchmarks/results/tpu_async_flags.txt)."""
    return flag_value(libtpu_flags, ASYNC_ALL_TO_ALL_FLAG, False)


def libtpu_flags_line(flags: list[str] | tuple[str, ...], async_hidden: float | None = None,
                      weight_gathers_hidden: float | None = None, weight_gathers: str = "") -> str:
    """What a strategy's libtpu flags change in the prediction: the collective matmuls they turn off
    (`windows_open`), the all-to-alls they make async where the chip's share hidden is known (`async_hidden`, the
    catalog's ``async_all_to_all_hidden``), FSDP's weight gathers they make synchronous where the chip runs them
    async by default or async where it does so with the flag (`weight_gathers`, its ``async_weight_gathers``;
    `weight_gathers_hidden`, its ``async_weight_gather_hidden``), and the flags the model does not price."""
    closed = sorted({"gather", "scatter"} - windows_open(flags))
    hides = async_hidden is not None and async_all_to_alls(flags)
    priced = set(WINDOWED_EINSUM_FLAGS) | ({ASYNC_ALL_TO_ALL_FLAG} if async_hidden is not None else set()) | (
        {ASYNC_ALL_GATHER_FLAG} if weight_gathers else set())
    others = [f for f in flags if flag_setting(f)[0] not in priced]
    kinds = {"gather": "a matmul's gathered operand", "scatter": "a matmul's sum wanted split"}
    line = "compile.libtpu_flags: " + ("XLA:TPU runs no collective matmul for " + " or ".join(
        kinds[k] for k in closed) + ", priced as the partitioner issues them" if closed
        else "the collective matmuls stay on")
    if hides:
        line += (f"; the all-to-alls run async, {async_hidden:.0%} of their time hidden under compute, as XLA:TPU's "
                 "schedule hides it for this chip (its cost model, not a measurement: the catalog's "
                 "async_all_to_all_hidden)")
    gathers_async = weight_gathers_run_async(weight_gathers, flags)
    if weight_gathers == "by-default" and not gathers_async:
        line += ("; FSDP's weight gathers run synchronously, none of their time hidden (this chip runs them async "
                 "by default)")
    if weight_gathers == "with-flag" and gathers_async:
        line += ("; FSDP's weight gathers run async, started early (priced as two blocks' gathered weights held), "
                 + (f"{weight_gathers_hidden:.0%} of their time hidden" if weight_gathers_hidden is not None
                    else "their time priced synchronous: what XLA:TPU's schedule hides on this chip is not measured"))
    return line + (f"; not priced: {', '.join(others)}" if others else "")


def issued_on(collectives: tuple[Collective, ...], kind: str, collective_matmul: float | None = None,
              mesh: dict[str, int] | None = None, dcn: dict[str, int] | None = None, scanned: bool = False,
              windows: frozenset[str] = frozenset({"gather", "scatter"}),
              scatter_limits: tuple[tuple[int, int], ...] = ()) -> tuple[Collective, ...]:
    """The collectives the compiler issues on hardware of `kind` (`collective_matmul`: the hardware's
    collective_matmul_flop_per_byte; `mesh`: axis sizes; `dcn`: the axes that cross slices; `scanned`: block lists
    run through scan; `windows`: the collective matmuls the plan's libtpu flags leave on, `windows_open`;
    `scatter_limits`: the hardware's reduce_scatter_combine_bytes). On TPUs,
    XLA:TPU gathers a tensor once for all its readers and a block's
    conditioning once for all blocks (`gathered_once`), runs matmuls worth it as collective matmuls
    (`collective_matmuls`), reduce-scatters a sum wanted split where its shares tile (`reduce_scatters`), and its
    all-reduce combiner merges all-reduces with no data dependency between them into
    one op moving their bytes together:

    - the all-reduces of one block phase (the image and text streams' partial sums of one projection);
    - a block's modulation all-reduce (its input is the conditioning vector, ready before the block starts) into
      the previous block's last all-reduce: so the first block issues it alone, and the last block's last
      all-reduce carries nothing more.

    The same combiner, run again once each reduce-scatter is an all-reduce-scatter fusion, merges the reduce-scatters
    of one block phase alike (flux2-2d.yaml: the image and text MLP sums in one op) while together they move at most
    the chip's limit for their group size (`combine_scatters`): on v6e and v5e while small, on v4 and v5p at no size
    compiled.

    Measured (`meshlab check strategies/pairs.yaml --backend tpu`, v6e-8, torch_xla's program): the partitioner's
    6 all-reduces per block become 2 in a middle block (3 in the first), moving the same bytes. A sequence split a
    GPU tool runs issues what meshlab.cost.ring.tool_issued says."""
    if kind != "tpu":
        return tuple(collectives)
    collectives = rotated_joins(realigned_chunks(norm_statistics(gathered_once(collectives, scanned))))
    if not scanned:  # a loop body cannot fold one iteration's cut into the next one's join (not measured)
        collectives = folded_joins(collectives)
    if collective_matmul is not None and mesh:
        collectives = collective_matmuls(collectives, collective_matmul, mesh, set(dcn or ()), windows)
    if mesh:
        collectives = reduce_scatters(collectives, mesh, set(dcn or ()))
    scatters = combine_scatters([c for c in collectives if c.kind == "reduce-scatter"], mesh or {}, scatter_limits)
    reduces = list(combine([c for c in collectives if c.kind == "all-reduce"]))
    for block in dict.fromkeys(c.block for c in reduces if c.block is not None):
        mine = [c for c in reduces if c.block == block and not c.per_step]
        modulation = next((c for c in mine if c.role == "modulation"), None)
        last = next((c for c in reversed(mine) if c.role != "modulation"), None)
        if modulation is None or last is None or modulation.count < 2:
            continue
        merged = replace(last, count=last.count - 1, bytes=last.bytes + modulation.bytes,
                         operands=last.operands + modulation.operands,
                         why=f"{last.why}; with the next block's modulation all-reduce (XLA:TPU combines them)")
        at = reduces.index(last)
        reduces[at:at + 1] = [merged, replace(last, count=1, only="last")]
        reduces[reduces.index(modulation)] = replace(modulation, count=1, only="first")
    return tuple(c for c in collectives if c.kind not in ("all-reduce", "reduce-scatter")) + scatters + tuple(reduces)


def realigned_chunks(collectives: tuple[Collective, ...]) -> tuple[Collective, ...]:
    """XLA:TPU realigns a block's modulation chunk by chunk where the block adds a split table (Wan's, LTX-Video's
    and SANA's ``scale_shift_table``, [chunks, width] split on width) to a conditioning vector a Linear outside the
    blocks made with its chunks x width rows split over the same n chips: the conditioning lies split g = gcd(chunks,
    n) ways on its chunks and n / g ways on width, and each chunk takes one all-to-all to lie split n ways on width,
    moving a sample's g / n of a chunk per chip, in the dtype the block adds it in (Wan: float32). Where n divides
    the chunks (g = n), the table itself takes one all-to-all of its share where the CPU partitioner gathers it whole.

    Measured (`meshlab check S --backend tpu --front-end torch-xla --layers 3 --height 256 --width 256 --text-tokens
    32`, v6e, libtpu 0.0.52), per block: wan-2d.yaml (model 4) six all-to-alls of 10,240 B; ltx-2d.yaml (model 4)
    six of 2,048 B; sana-2d.yaml (model 2) six of 4,480 B and the table's of 13,440 B in place of its gather; and on
    plans it was not read from, as predicted: ltx-model8.yaml (two samples a chip) six of 2,048 B, wan-model8.yaml
    six of 10,240 B, sana-data2-model2.yaml 67,200 B in seven. The CPU partitioner issues none of them. Each is priced
    over the conditioning's axes, though it runs over g of their chips (a few microseconds either way)."""
    issued: list[Collective] = []
    for c in collectives:
        if not c.realigned:
            issued.append(c)
            continue
        chunks, nbytes, table = c.realigned
        issued.append(replace(c, kind="all-to-all", bytes=table, realigned=(),
                              why=f"{c.why}: XLA:TPU moves each chip's share to lie as the conditioning's chunks lie "
                                  "instead") if table else replace(c, realigned=()))
        issued += [replace(c, kind="all-to-all", bytes=nbytes, phase="modulation:chunks", realigned=(),
                           why=f"the conditioning's chunk {i + 1} of {chunks} realigned to split on width (XLA:TPU)")
                   for i in range(chunks)]
    return tuple(issued)


def rotated_joins(collectives: tuple[Collective, ...]) -> tuple[Collective, ...]:
    """XLA:TPU joins a q or k that the attention rotates after joining the streams (Flux's double blocks:
    ``x * cos + rotate(x) * sin``, where ``rotate`` reads ``x`` as pairs, ``x.reshape(..., -1, 2)``) twice where
    its projections have a bias: once as it is and once as pairs, each with its own all-to-alls.

    Measured (`meshlab check S --backend tpu --front-end torch-xla --layers 3 --height 256 --width 256 --text-tokens
    32 --dump-dir D`, v6e, libtpu 0.0.52), a middle double block:
    - Flux.1 (flux-seq2-model4.yaml; flux-seq2-data2-model2.yaml; the same at 16 heads, 4 a chip, compiled, not kept):
      q's and k's 3 all-to-alls each (the text part, the image part, the joint result) appear twice, the second set
      shaped [..., 64, 2], and v's once: 15 of 294,912 B where the CPU partitioner issues 9.
    - FLUX.2 (flux2-seq2-model4.yaml, compiled to hold the first form of this rule out, which it disproved): 9, each
      tensor joined once. Its q/k projections have no bias.
    Why, read from the pass dumps (``XLA_FLAGS=--xla_dump_hlo_pass_re=.*``): XLA:TPU's tpu-broadcast-rewriter moves
    the pairs reshape onto each stream's part before the concatenation where that part reaches it through a reshape
    (Flux.1: the dot, its bias added, then the heads view), making a second concatenation; FLUX.2's dot makes the
    heads shape itself, and the reshape stays after the one concatenation. Only these two models rotate after
    joining; a bias-free Flux.1 or a biased FLUX.2 is not a diffusers configuration, so the bias is the difference the
    programs show, not one isolated by itself."""
    issued: list[Collective] = []
    for c in collectives:
        if not c.rotated_join:
            issued.append(c)
            continue
        plain = replace(c, rotated_join=False)
        issued += [plain, replace(plain, why=f"{c.why}, again for the rotation's pairs (XLA:TPU joins both forms)")]
    return tuple(issued)


def folded_joins(collectives: tuple[Collective, ...]) -> tuple[Collective, ...]:
    """XLA:TPU simplifies a concatenation of a tensor's adjacent slices to the tensor before it partitions the
    program: where each block of a list cuts the joint sequence into the streams it returns and the next block joins
    them first thing (Flux's single blocks), the streams are joined once, in the list's first block, and cut once, in
    its last (`Collective.edge`). A sharding constraint between them (a block.input rule on the list) keeps them.

    Measured (`meshlab check S --backend tpu --front-end torch-xla --layers 3 --height 256 --width 256 --text-tokens
    32 --dump-dir D`, v6e, libtpu 0.0.52): flux-seq2-model4.yaml and flux-seq2-data2-model2.yaml, the join's 3
    all-to-alls in single block 0 alone, the cut's permute in single block 2 alone (the CPU partitioner issues both
    in every block); the fold is algsimp's, in simplification-1, before the partitioner
    (``XLA_FLAGS=--xla_dump_hlo_pass_re=.*``). HunyuanVideo (hunyuan-seq2-model4.yaml, under the block.input
    rule planning adds): its single blocks join in each block, their inputs behind the rule's constraint, which keeps
    the previous block's cut apart from the join (the dump shows the constraint between them). Its card records
    each block's first cut, its norm's output inside the block, not the one at the end, so this model folds nothing
    there in any case; HunyuanVideo without such a rule is not measured."""
    issued: list[Collective] = []
    for c in collectives:
        if c.edge == "inner":  # a kept block other than the list's first (join) or last (cut)
            continue
        if c.edge:
            c = replace(c, edge="", count=1, only="first" if c.edge == "start" else "last",
                        why=f"{c.why} ({'once, in the first block' if c.edge == 'start' else 'once, in the last block'}"
                            ": XLA:TPU folds each block's cut and the next one's join away)")
        issued.append(c)
    return tuple(issued)


def norm_statistics(collectives: tuple[Collective, ...]) -> tuple[Collective, ...]:
    """XLA:TPU normalizes a residual where it lies. A LayerNorm (torch_xla's batch-norm lowering over batch x tokens
    rows) whose features are split all-reduces its rows' mean and variance, one value each per row in the
    activation's dtype, where the CPU partitioner gathers the features; and it gathers no rows a batch or sequence
    axis splits (each row's statistics are its own; measured under a batch split, assumed alike under a sequence
    split), where the CPU partitioner does. The combiner then carries both
    streams' statistics of one norm in one op. Measured (`meshlab check --backend tpu`, v6e-8, 256²): model.yaml's
    middle block 1 all-reduce of 1,152 B per norm where the CPU partitioner gathers 4 residuals; Flux under 2d
    rules without layernorm-rows, no collective over `data` in a block."""
    return tuple(replace(c, kind="all-reduce", bytes=c.stats_bytes, phase=c.phase.replace(":features", ":statistics"),
                         stats_bytes=0, why=f"{c.why}: XLA:TPU sums its rows' mean and variance over "
                                            f"{'+'.join(c.axes)} instead of gathering them")
                 if c.kind == "all-gather" and c.stats_bytes else c
                 for c in collectives if c.role != "norm-rows")


def gathered_once(collectives: tuple[Collective, ...], scanned: bool = False) -> tuple[Collective, ...]:
    """XLA:TPU's collective CSE: the all-gathers of one tensor in one block (an attention's q, k and v projections
    reading one normed stream) become one, shared by every reader, and so not a collective matmul; a block's
    modulation Linear gathers the conditioning, the same in every block, once for them all (in the first), and so
    does a Linear whose input is made outside the blocks (the text a cross-attention's k and v read).
    Measured (2d.yaml, `meshlab check --backend tpu`, v6e-8): the partitioner's 6 q/k/v input gathers per block
    are 2, one per stream, and a middle block gathers no conditioning; SANA under 2d (sana-2d.yaml, 1024², 2
    blocks): the text its cross-attention's k and v read is gathered outside the blocks, none in a block. Under scan
    (one loop body for the blocks) those gathers stay in the body: that they are hoisted out of the loop is not
    measured."""
    out: list[Collective] = []
    first: dict[tuple, int] = {}
    for c in collectives:
        if c.kind == "all-gather" and c.role in ("modulation", "invariant") and c.block is not None and not scanned:
            what = "the conditioning" if c.role == "modulation" else "made outside the blocks"
            c = replace(c, count=1, only="first", why=f"{c.why} ({what}, gathered once for every block)")
        key = (c.block, c.reads, c.axes, c.bytes, c.per_step)
        if c.kind != "all-gather" or not c.reads or key not in first:
            if c.kind == "all-gather" and c.reads:
                first[key] = len(out)
            out.append(c)
            continue
        shared = out[first[key]]
        out[first[key]] = replace(shared, window="", why=f"{shared.why}; {c.why.split(':')[0]} reads the same gather")
    return tuple(out)


def collective_matmuls(collectives: tuple[Collective, ...], flop_per_byte: float, mesh: dict[str, int],
                       across_slices: set[str] = frozenset(), windows: frozenset[str] = frozenset({"gather", "scatter"})
                       ) -> tuple[Collective, ...]:
    """XLA:TPU's collective matmul (XLA's windowed einsum): a matmul fed by an all-gather, or drained by a sum wanted
    split, over n chips runs as n - 1 async permutes of one chip's shard, each overlapping a slice of the matmul,
    when its FLOPs per chip per byte of that collective reach `flop_per_byte` x 2 / n (the hardware's
    collective_matmul_flop_per_byte, measured by benchmarks/collective_matmul_probe.py). The permutes move
    (n - 1) / n of the collective's bytes, as a ring all-gather does, and go both ways round the ring at once (on a
    ring route they take a ring all-gather's time). Each runs beside one 1/n slice of the matmul (`beside_flops`)
    and is exposed only where it takes longer (meshlab.cost.timing): XLA:TPU's own schedule of 2d.yaml at full
    depth leaves 0.1 ms of its 46 permutes a block exposed in a 259 ms forward. On more than 4 chips XLA:TPU keeps
    them in a loop whose text holds 5 permutes per matmul (9 run, 2 of them wasted): meshlab counts the n - 1 that
    carry data. Measured (2d.yaml at full depth, v6e-8): each
    MLP's first Linear (3072 FLOP per byte on 4 chips) and its second's sum become 3 + 3 permutes per stream, where
    the attention output projection (768) keeps its gather. Over 2 chips XLA:TPU runs none, even at 5 times the
    threshold (benchmarks/collective_matmul_probe.py; 2d-4x2.yaml gathers its MLP input at 6144). Measured on one
    axis inside one slice only: a
    collective over several axes, or over an axis that crosses slices (`across_slices`), stays as the partitioner
    issues it; so does one whose window the plan's libtpu flags close (`windows`, `windows_open`)."""
    out: list[Collective] = []
    for c in collectives:
        n = math.prod(mesh[a] for a in c.axes)
        if (c.window not in windows or n < 3 or len(c.axes) != 1 or c.axes[0] in across_slices
                or c.dot_flops / c.bytes < flop_per_byte * 2 / n):
            out.append(c)
            continue
        how = "gathers" if c.window == "gather" else "sums"
        out += [replace(c, kind="collective-permute", bytes=c.bytes // n, operands=1, window="", both_ways=True,
                        beside_flops=c.dot_flops / n,
                        why=f"{c.why}: XLA:TPU {how} it in a collective matmul, shard {step + 1} of {n - 1} passed "
                            "to a neighbour (both ways round the ring at once) while the matmul runs on the last")
                for step in range(n - 1)]
    return tuple(out)


def reduce_scatters(collectives: tuple[Collective, ...], mesh: dict[str, int], across_slices: set[str] = frozenset()
                    ) -> tuple[Collective, ...]:
    """A sum wanted split that does not run as a collective matmul (`collective_matmuls`) is a reduce-scatter on TPU
    (an all-reduce-scatter fusion), moving the bytes the all-reduce would and half the traffic, where XLA:TPU can lay
    it out so that each chip's share is whole tiles (`_scatters`); elsewhere it stays an all-reduce, sliced where it
    is read. Measured over one axis inside one slice of v6e only: a sum over several axes, or over an axis that
    crosses slices, stays an all-reduce; other TPUs are assumed alike (XLA:TPU's pass, their tiles the same)."""
    out = []
    for c in collectives:
        n = math.prod(mesh[a] for a in c.axes)
        if (c.window == "scatter" and c.kind == "all-reduce" and n > 1 and len(c.axes) == 1
                and c.axes[0] not in across_slices and _scatters(c, n)):
            c = replace(c, kind="reduce-scatter", window="",
                        why=f"{c.why}, and wanted split like the residual: XLA:TPU reduce-scatters it")
        out.append(c)
    return tuple(out)


def _scatters(c: Collective, n: int) -> bool:
    """Whether XLA:TPU reduce-scatters a sum wanted split over n chips: where each chip's features are whole
    128-lane tiles, laid out features-minor; else where its tokens a sample, padded to a multiple of 128 lanes, gain
    at most 5% (`SCATTER_ROW_PADDING`), laid out tokens-minor, the split features major (a [batch, tokens, features]
    sum is laid out tokens-minor, batch-major: measured at one sample a chip only).

    Measured (v6e-8, 256², one sample a chip): FLUX.2 under 2d (flux2-2d.yaml, 512 features a chip) reduce-scatters
    its dual blocks' 32 text rows with the image's and its single blocks' 288 joint rows; SD3.5 under data 4 x
    model 2 (sd35-2d.yaml, 1216 features a chip, each MLP's second Linear at 4864 FLOP per byte, under 4928)
    reduce-scatters the image stream's 256 rows and the text stream's at 128, 384, 1000 and 1216 tokens (padding 0
    to 5.0% of the padded rows), and all-reduces them at 32 to 120, 136, 192, 320, 960, 1204 and 1208 (5.6% and
    more), whatever the bytes (320 tokens sum 1.5 MB, more than the image's 1.2 MB)."""
    if c.features <= 0 or c.rows <= 0:
        return False
    if c.features % (n * LANES) == 0:
        return True
    padding = -c.rows % LANES
    return padding * SCATTER_ROW_PADDING.denominator <= SCATTER_ROW_PADDING.numerator * (c.rows + padding)


def combine_scatters(scatters: list[Collective], mesh: dict[str, int],
                     limits: tuple[tuple[int, int], ...]) -> tuple[Collective, ...]:
    """A block phase's reduce-scatters as XLA:TPU's all-reduce combiner leaves them: in their order, each joins the
    op before it while together they move at most `combine_limit` of the chip's `limits` for their group size,
    else starts an op of its own (with no limits, all in one, as `combine`). Measured (benchmarks/
    tpu_scatter_combine.py, 2d's image and text MLP sums): v6e over 2 chips combines 10,272,768 B and keeps
    10,321,920 B apart; over 4, 14,942,208 and 15,728,640; v5e over 4, 6,684,672 and 8,355,840; v4 and v5p keep
    even 196,608 B apart (the pass runs there with the same combiner thresholds and changes nothing; why is not
    known). The limits follow no one figure of bytes, bytes moved or time priced here: they are kept as measured."""
    if not limits:
        return combine(scatters)
    groups: dict[tuple, list[list[Collective]]] = defaultdict(list)
    for c in scatters:
        ops = groups[_combined_with(c)]
        limit = combine_limit(limits, math.prod(mesh.get(a, 1) for a in c.axes))
        if ops and limit is not None and sum(o.bytes for o in ops[-1]) + c.bytes <= limit:
            ops[-1].append(c)
        else:
            ops.append([c])
    return tuple(op for ops in groups.values() for bucket in ops for op in combine(bucket))


def _combined_with(c: Collective) -> tuple:
    """What XLA's combiner merges a collective with: the others of its block phase, kind and axes (per step or not)."""
    return c.block, c.phase, c.kind, c.axes, c.per_step


def combine(collectives: list[Collective]) -> tuple[Collective, ...]:
    groups: dict[tuple, list[Collective]] = defaultdict(list)
    for c in collectives:
        groups[_combined_with(c)].append(c)
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


#: A step of the walk: it yields the collectives it issues and returns the state its tensor leaves in.
Step = Generator[Collective, None, _State]


class _Deriver:
    """Applies the rules above, in three passes that yield their collectives: the activations' walk through the
    Linears and attentions in graph order (`activations`), the parameters gathered before use (`parameters`), and
    the streams joined outside attention (`joins`). Each step of the walk yields what it issues and returns how its
    output is split; the walk itself keeps only that (`states`) and which norms and joint outputs it has handled."""

    def __init__(self, layout: Layout, mesh: AbstractMesh, graph: Graph, points: dict | None = None,
                 heads_gathered: bool = False, linear_heads_gathered: bool = False):
        self.layout, self.mesh, self.graph = layout, mesh, graph
        self.heads_gathered = heads_gathered  # meshlab.plan.axes.heads_gathered
        self.linear_heads_gathered = linear_heads_gathered  # a linear attention's: no flash kernel runs it
        self.points = points or {}
        self.attentions = {a.module: a for a in graph.attentions}
        self.joined_back: set[str] = set()
        self.by_module = {op.module: op for op in graph.linears}
        self.states: dict[str, _State] = {}
        self.flows = {f.module: f for f in graph.card.dataflow} if graph.card is not None else {}
        #: (block, stream) -> (how its modulation's chunks are split, that Linear's position in the graph), for
        #: every stream a modulation's norms are read on (`_modulated_streams`)
        self.modulation = {(op.block, stream): (self.chunk_split(op), i)
                           for i, op in enumerate(graph.linears) if op.role == "chunks"
                           for stream in self._modulated_streams(op)}
        #: (block, stream) -> the LayerNorms its modulations have conditioned so far in the walk (their numbering)
        self.norms_seen: dict[tuple, int] = defaultdict(int)
        #: kept blocks of each block list, for collectives of a module outside the blocks that act in every block
        self.blocks_of: dict[str, list[int]] = defaultdict(list)
        #: each kept block's module path (``transformer_blocks.0``)
        self.block_modules: dict[int, str] = {}
        for op in graph.linears:
            if op.block is not None and op.block not in self.blocks_of[op.module.split(".", 1)[0]]:
                self.blocks_of[op.module.split(".", 1)[0]].append(op.block)
                self.block_modules[op.block] = ".".join(op.module.split(".")[:2])
        #: kept blocks whose residual is the joint sequence (Flux's and HunyuanVideo's single blocks)
        self.joint_blocks = {op.block for op in graph.linears if op.role == "chunks" and op.modulates == "joint"}
        #: stream -> how its residual stream is split between blocks: as the gates that scale its updates (a
        #: modulation outside the blocks that conditions the blocks' norms, as Wan's time_proj and FLUX.2's
        #: double_stream_modulation_img, counts too; the output norm's modulation, also outside, does not)
        self.residual = {stream: split for (block, stream), (split, at) in self.modulation.items()
                         if split and block is not None}
        for op in graph.linears:
            if op.role == "chunks" and op.block is None and self._block_norms(op) and self.chunk_split(op):
                self.residual.setdefault(op.modulates, self.chunk_split(op))
        self.plain_norms_done: set[tuple] = set()
        #: norms some modulation conditions (the others are "plain", see _plain_norms)
        self.modulated_norms = {m.norm for f in self.flows.values() for m in f.modulates}
        #: Linears outside the blocks whose output only Linears inside the blocks read (see _feeds_blocks_only)
        readers: dict[str, list[str]] = defaultdict(list)
        for f in self.flows.values():
            for source in f.sources("linear"):
                readers[source].append(f.module)
        self.block_only_sources = {
            module for module, flow in self.flows.items() if ".*" not in module and not flow.residual
            and readers.get(module) and all(".*" in reader for reader in readers[module])}

    def size(self, axes: Axes | None) -> int:
        return math.prod(self.mesh.size(a) for a in axes) if axes else 1

    def tensor_bytes(self, stream: str, features: int, split: Axes | None) -> int:
        tokens = self.layout.local.of_stream(stream)
        return self.layout.batch * tokens * -(-features // self.size(split)) * self.layout.itemsize

    def new(self, kind: str, axes: Axes, nbytes: int, op_block, phase: str, why: str, role: str = "",
            joined: Axes = (), **more) -> Collective:
        """One collective in `op_block`, counted over the identical blocks it stands for."""
        return Collective(kind, axes, nbytes, op_block, phase, why, count=self.graph.count(op_block), role=role,
                          joined=joined, **more)

    def dot_flops(self, op: LinearOp) -> float:
        """The FLOPs of `op`'s matmul on one chip, its weight split as it is used."""
        w_out, w_in = self.used_split(op)
        rows = self.tensor_bytes(op.stream, 1, None) // self.layout.itemsize  # this chip's batch x tokens
        return 2.0 * rows * op.in_features * op.out_features / (self.size(w_in) * self.size(w_out))

    def activations(self, graph: Graph) -> Iterator[Collective]:
        """The walk: each Linear in graph order (an attention's q/k/v resolved where its output projection comes),
        then the attentions with no output projection (Flux's single blocks)."""
        done_attention: set[str] = set()
        for position, op in enumerate(graph.linears):
            if op.role == "out" and op.source not in done_attention:
                attention = self.attentions[op.source]
                qkv = [self.by_module[m] for m in attention.qkv if m in self.by_module]
                self.states[op.source] = yield from self.attention(attention, qkv)
                done_attention.add(op.source)
            self.states[op.module] = yield from self.linear(op, self.incoming(op, position))
        for attention in graph.attentions:
            qkv = [self.by_module[m] for m in attention.qkv if m in self.by_module]
            if attention.module not in done_attention and qkv:
                self.states[attention.module] = yield from self.attention(attention, qkv)

    def used_split(self, op: LinearOp) -> tuple[Axes | None, Axes | None]:
        """A Linear weight's (output, input) split as it is used: axes that split activations are gathered
        first (FSDP), so they do not split the computation."""
        gathered = set(self.layout.activation_axes())
        return tuple(_without(e, gathered) for e in op.weight.spec.entries[:2])  # a pointwise conv's kernel dims: 1

    def chunk_split(self, op: LinearOp) -> Axes | None:
        """How a modulation Linear's chunks end up split: as its rows, when every chunk splits evenly."""
        rows = self.used_split(op)[0]
        chunk = op.chunk_width
        return rows if rows and chunk and chunk % self.size(rows) == 0 and op.out_features % chunk == 0 else None

    def incoming(self, op: LinearOp, position: int) -> _State:
        """The state of a Linear's input: its source's output, the conditioning vector, or a modulated stream."""
        if op.source:
            return self.states.get(op.source, _State())
        if op.role == "chunks":
            return self.states.get(_CONDITIONING, _State())
        split, at = self.modulation.get((op.block, op.stream), (None, None))
        if at is None and op.block is not None and "layernorm-rows" in self.layout.rewrites:
            # no modulation of its own in the block (Wan's comes from outside): a row-form norm's output keeps
            # the residual's feature split, and the reading Linear gathers it (measured: Wan under 2d); so does a
            # Linear that reads the residual stream itself (SANA's cross-attention q: measured under 2d; read from
            # its traced producers, so a norm the tracer does not see, as LTX-Video's RMSNorm, looks like none)
            flow = self.flows.get(_pattern(op, self.graph))
            residual = flow is not None and (flow.sources("norm") or any(
                self.flows[s].residual for s in flow.sources("linear") if s in self.flows))
            return _State(self.residual.get(op.stream) if residual else None)
        return _State(split) if at is not None and (op.block is not None or position > at) else _State()

    def linear(self, op: LinearOp, incoming: _State) -> Step:
        w_out, w_in = self.used_split(op)
        phase = f"{_phase_name(op)}:in"
        yield from self._plain_norms(op)
        shared = self._shared_source(op)
        if shared is not None:
            incoming = shared
        point = self.points.get((op.module, "input"))
        attention = self.attentions.get(op.source)
        if point is not None and attention is not None and (attention.module, "kernel") in self.points \
                and len(attention.streams) > 1:
            if attention.module not in self.joined_back:
                self.joined_back.add(attention.module)
                yield from self._joint_back(op, attention, incoming, point)
            incoming = _State(point.spec.entries[2] or None)
        elif point is not None:
            incoming = yield from self._marked(op, op.in_features, incoming, point, phase)
        if op.also:
            incoming = yield from self._concat(op, incoming, w_in, phase)
        if incoming.partial:
            yield self.new("all-reduce", incoming.partial, self.tensor_bytes(op.stream, op.in_features, incoming.split),
                           op.block, phase, f"{op.short}: its input is a partial sum")
        if incoming.split and incoming.split != w_in:
            column = (w_in is None and w_out == incoming.split and op.block is not None  # output split like the weight
                      and op.is_dot)
            yield self.new("all-gather", incoming.split, self.tensor_bytes(op.stream, op.in_features, None), op.block,
                           phase, f"{op.short}: input arrives split on {'+'.join(incoming.split)}, "
                           f"the weight wants it {'split on ' + '+'.join(w_in) if w_in else 'whole'}",
                           role="modulation" if op.role == "chunks" and op.block is not None else
                           "invariant" if op.block is not None and self._invariant(op) else "",
                           window="gather" if column else "", dot_flops=self.dot_flops(op) if column else 0.0,
                           reads=f"{op.stream}:{phase}:{op.source}:"
                                 f"{op.module.rsplit('.', 1)[0] if op.role == 'qkv' else ''}")
        yield from self._fsdp(op.weight, op.block, f"{op.short}.weight", self.dot_flops(op) if op.is_dot else 0.0)
        return (yield from self._consume(op, _State(w_out, w_in)))

    def _concat(self, op: LinearOp, first: _State, w_in: Axes | None, phase: str) -> Step:
        """A Linear whose input concatenates its source's output with `op.also` along features (Flux single
        blocks: attention output, then the MLP branch). Parts split as the weight's input dim wants cannot be
        joined in place (the weight wants contiguous blocks of the whole): XLA moves each part's split onto the
        tokens, concatenates, and moves the result's split back, one all-to-all each (measured: Flux, 2d and pairs).
        A part every chip holds whole is sliced so, and moves with them. Parts split otherwise are gathered."""
        plain = sum(self.by_module[m].out_features for m in op.also if self.by_module[m].role != "qkv")
        widths = [self._branch_width(m, op, plain) for m in op.also]
        parts = [(first, op.in_features - sum(widths), op.source)] + [
            (self.states.get(m, _State()), w, m) for m, w in zip(op.also, widths)]
        # a whole part (an attention that gathered every head: meshlab.plan.axes.heads_gathered) is sliced as the
        # others are split and moved with them (measured, XLA:TPU: flux-seq2-model4's single blocks, 3 all-to-alls)
        if w_in and any(state.split == w_in for state, _, _ in parts) and all(
                state.split == w_in or (state.split is None and not state.partial) for state, _, _ in parts):
            for state, width, module in parts:
                held = "whole, sliced" if state.split is None else "split"
                yield self.new("all-to-all", w_in, self.tensor_bytes(op.stream, width, w_in), op.block,
                               f"{phase}:concat", f"{op.short}: the output of {module.rsplit('.', 1)[-1]}, {held} on "
                               f"{'+'.join(w_in)}, joins a concatenation the weight wants split in contiguous blocks")
            yield self.new("all-to-all", w_in, self.tensor_bytes(op.stream, op.in_features, w_in), op.block,
                           f"{phase}:concat", f"{op.short}: the concatenation moves its split back onto the features")
            return _State(w_in)
        for state, width, module in parts:
            if state.split and state.split != w_in:
                yield self.new("all-gather", state.split, self.tensor_bytes(op.stream, width, None), op.block, phase,
                               f"{op.short}: the output of {module.rsplit('.', 1)[-1]} arrives split on "
                               f"{'+'.join(state.split)}; the concatenation needs it whole")
        return _State()

    def _branch_width(self, module: str, reader: LinearOp, plain: int) -> int:
        """The features a part of `reader`'s concatenated input brings: a Linear's output, or a fused q/k/v
        projection's MLP tail, what the reader reads beyond its attention's output and its `plain` other parts
        (FLUX.2's single blocks: 8192 - 16 heads x 128 = 6144; measured on XLA:TPU, flux2-2d.yaml: its all-to-all
        moves 6144 features a token)."""
        op = self.by_module[module]
        if op.role == "qkv":
            attention = self.attentions[reader.source]
            return reader.in_features - attention.heads * attention.head_dim - plain
        return op.out_features

    def _consume(self, op: LinearOp, out: _State) -> Step:
        phase = f"{_phase_name(op)}:out"
        nbytes = self.tensor_bytes(op.stream, op.out_features, out.split)
        if op.role in ("qkv",):
            return out  # attention resolves it
        if out.partial:
            # a sum whose output joins a residual split alike is wanted split, not whole (a reduce-scatter)
            scatter = (op.block is not None and op.role != "chunks" and self.residual.get(op.stream) == out.partial
                       and op.is_dot)
            yield self.new("all-reduce", out.partial, nbytes, op.block, phase,
                           f"{op.short} is split on its input dim: its output is summed over {'+'.join(out.partial)}",
                           role="modulation" if op.role == "chunks" and op.block is not None else "",
                           window="scatter" if scatter else "", dot_flops=self.dot_flops(op) if scatter else 0.0,
                           rows=self.layout.local.of_stream(op.stream) if scatter else 0,
                           features=op.out_features if scatter else 0)
        if op.role == "chunks":
            return (yield from self._chunks(op, out.split))
        if op.role == "hidden" and out.split:
            yield from self._gated(op, out.split)
        if op.role == "hidden" or not out.split:
            return _State(out.split)
        if op.stream == "conditioning" and op.block is None:
            self.states[_CONDITIONING] = _State(out.split)  # its consumers gather it, each for itself
            return _State(out.split)
        if self._feeds_blocks_only(op):
            return _State(out.split)  # each reading Linear gathers it in its own block (see _shared_source)
        if out.split == self.residual.get(op.stream):
            return _State(out.split)  # joins a residual stream split alike: the next LayerNorm gathers it
        why = f"{op.short} is split on its output dim but its consumer needs it whole"
        yield self.new("all-gather", out.split, self.tensor_bytes(op.stream, op.out_features, None), op.block, phase,
                       why)
        return _State()

    def _chunks(self, op: LinearOp, split: Axes | None) -> Step:
        kept = self.chunk_split(op)
        if split and not kept:
            yield self.new("all-gather", split, self.tensor_bytes(op.stream, op.out_features, None), op.block,
                           f"{_phase_name(op)}:out", f"{op.short}: its {op.chunk_width}-wide chunks do not split "
                           f"evenly over {'+'.join(split)}; every chip needs them whole")
        if kept:
            yield from self._realign(op, kept)
        yield from self._layer_norms(op, kept)
        return _State(kept)

    def _realign(self, op: LinearOp, split: Axes) -> Iterator[Collective]:
        """Each chunk piece that is not on the chip that wants it moves in one collective-permute."""
        parts, chunk = self.size(split), op.chunk_width
        shard, piece = -(-op.out_features // parts), chunk // parts
        moves = sum(1 for c in range(op.out_features // chunk) for j in range(parts)
                    if (c * chunk + j * piece) // shard != j)
        nbytes = self.layout.batch * piece * self.layout.itemsize
        for _ in range(moves):
            yield self.new("collective-permute", split, nbytes, op.block, f"{_phase_name(op)}:chunks",
                           f"{op.short}: {shard}-row shards hold {piece}-row pieces of its {chunk}-wide chunks "
                           f"that other chips want")

    def _block_norms(self, op: LinearOp) -> list[int]:
        """The kept blocks whose norms a modulation Linear outside the blocks conditions (Wan's time_proj)."""
        flow = self.flows.get(op.module)
        if op.block is not None or flow is None:
            return []
        lists = {m.norm.partition(".*")[0] for m in flow.modulates if ".*" in m.norm}
        return [b for name in sorted(lists) for b in self.blocks_of.get(name, [])]

    def _plain_norms(self, op: LinearOp) -> Iterator[Collective]:
        """LayerNorms of a residual stream that no modulation conditions (Wan's cross-attention norm2), read by
        this Linear: the same gathers as a modulated one, once per norm and block."""
        flow = self.flows.get(_pattern(op, self.graph))
        if flow is None or op.block is None:
            return
        for label in flow.sources("norm"):
            norm, _, stream = label.rpartition("|")
            if norm in self.modulated_norms or ".*" not in norm or (op.block, norm) in self.plain_norms_done:
                continue
            self.plain_norms_done.add((op.block, norm))
            yield from self._norm(stream, self.graph.hidden_size, self.residual.get(stream), op.block,
                                  norm.rsplit(".", 1)[-1], norm.rsplit(".", 1)[-1])

    def _feeds_blocks_only(self, op: LinearOp) -> bool:
        """A Linear outside the blocks whose output only Linears inside the blocks read (Wan's text embedding,
        read by every cross-attention's k and v): XLA leaves it split and gathers it for each reader."""
        return op.block is None and op.module in self.block_only_sources

    def _shared_source(self, op: LinearOp) -> _State | None:
        """The state of an input that `_feeds_blocks_only` left split, for a Linear in a block that reads it."""
        flow = self.flows.get(_pattern(op, self.graph))
        if flow is None or op.block is None or op.source:
            return None
        for source in flow.sources("linear"):
            if source in self.states and source in self.block_only_sources:
                return self.states[source]
        return None

    def _layer_norms(self, op: LinearOp, split: Axes | None) -> Iterator[Collective]:
        """The LayerNorms a modulation Linear conditions: a split residual is gathered, then the rows."""
        stream = op.modulates or "image"
        blocks = self._block_norms(op)
        if blocks:  # a modulation outside the blocks conditioning every block's norms (Wan)
            norms = {m.norm.rsplit(".", 1)[-1]: m.rms for m in self.flows[op.module].modulates if ".*" in m.norm}
            for block in blocks:
                for rank, norm in enumerate(sorted(norms), 1):
                    # numbered, so that twins in two streams (FLUX.2's norm1 and norm1_context) combine
                    yield from self._norm(stream, op.chunk_width, self.residual.get(stream), block,
                                          f"modulated norm {rank}", norm, rms=norms[norm])
            return
        first = self.norms_seen[(op.block, stream)]
        self.norms_seen[(op.block, stream)] += op.layer_norms
        for norm in range(first + 1, first + op.layer_norms + 1):
            # a LayerNorm over the residual: as wide as the pieces that modulate it; numbered through the block,
            # so that two modulation Linears of one stream (CogVideoX's norm1 and norm2) name two norms
            for read in self._modulated_streams(op, joint=False):
                residual = self.residual.get(read) if op.block is not None or split else split
                yield from self._norm(read, op.chunk_width, residual, op.block,
                                      f"norm{norm}" if op.block is not None else "norm_out", f"LayerNorm {norm}",
                                      rms=any(m.rms for m in self._flow(op).modulates))

    def _modulated_streams(self, op: LinearOp, joint: bool = True) -> list[str]:
        """The streams a modulation Linear's norms are read on, its own first: CogVideoX normalizes the text and the
        image stream with one modulated LayerNorm, and the Linears that read both of its outputs (the attention's
        q, k and v, the MLP) read their concatenation, the joint stream (`joint`: count it too). Measured (cog-2d.yaml
        on XLA:TPU, v6e-8): both streams' rows are summed in one all-reduce per statistic, and the joint MLP's
        residual stays split like the gates."""
        streams = [op.modulates or "image"]
        flow = self.flows.get(_pattern(op, self.graph))
        norms = {m.norm for m in flow.modulates} if flow is not None else set()
        for reader in self.flows.values():
            read = [s for n, _, s in (label.rpartition("|") for label in reader.sources("norm")) if n in norms]
            streams += [s for s in read if s not in streams]
            if joint and {"image", "text"} <= set(read) and "joint" not in streams:
                streams.append("joint")
        return streams

    def _norm(self, stream: str, width: int, residual: Axes | None, block, phase: str, name: str, rms: bool = False
              ) -> Iterator[Collective]:
        """One LayerNorm of a residual stream in `block`: gathers (or, in row form, row statistics) as above. An RMS
        norm (`rms`: diffusers' RMSNorm, a mean of squares over the last dim, which torch_xla lowers as a reduce, not
        a batch norm) keeps its rows split whatever the rewrites, and sums one float32 value a row over a residual
        split on features (measured: LTX-Video under 2d on XLA:TPU, one all-reduce of 1344 rows per norm)."""
        rows = tuple(a for a in self.layout.activation_axes() if self.size((a,)) > 1)
        whole_rows = self.tensor_bytes(stream, width, None) * self.size(rows)
        if rms:
            if residual:
                stats = self.layout.batch * self.layout.local.of_stream(stream) * 4  # a float32 value per row
                yield self.new("all-reduce", residual, stats, block, f"{phase}:mean-square",
                               f"the {stream} stream's {name} (an RMS norm) sums its mean square over features split "
                               f"on {'+'.join(residual)} (float32, one value per row)")
            return
        if "layernorm-rows" in self.layout.rewrites:  # a per-row reduction: the rows stay split
            if residual:
                stats = self.layout.batch * self.layout.local.of_stream(stream) * 4  # a float32 value per row
                for what in ("mean", "variance"):
                    yield self.new("all-reduce", residual, stats, block, f"{phase}:{what}",
                                   f"the {stream} stream's {name} (row form) sums its {what} over features split on "
                                   f"{'+'.join(residual)} (float32, one value per row)")
            return
        if residual:
            yield self.new("all-gather", residual, self.tensor_bytes(stream, width, None), block, f"{phase}:features",
                           f"the {stream} stream's {name} reads a residual split on {'+'.join(residual)}",
                           stats_bytes=2 * self.tensor_bytes(stream, 1, None))
        if rows:
            yield self.new("all-gather", rows, whole_rows, block, f"{phase}:rows",
                           f"the {stream} stream's {name} is a batch norm over batch x tokens rows, split on "
                           f"{'+'.join(rows)}: XLA gathers them", role="norm-rows")

    def _marked(self, op: LinearOp, features: int, state: _State, point, phase: str, joins: Axes = ()) -> Step:
        """The tensor an activation rule marks, resharded from `state` to the rule's split (see the rules).
        `joins`: the token axes a joint attention's concatenation moves onto the heads too (USP: the ring axes the
        rule keeps on the tokens), which XLA moves in the same all-to-all as the rule's (measured: ring 2 x seq 2 x
        model 2, Qwen-Image: one all-to-all over ring+seq per projection)."""
        if state.partial:
            yield self.new("all-reduce", state.partial, self.tensor_bytes(op.stream, features, state.split), op.block,
                           phase, f"{op.short}: a partial sum meets the {point.point} rule")
        want_tokens, want = point.spec.entries[1] or (), point.spec.entries[2] or ()
        have = state.split or ()
        split = self.layout.local.of_stream(op.stream) < self.layout.tokens.of_stream(op.stream)
        split_tokens = tuple(a for a in self.layout.sequence_axes if self.size((a,)) > 1) if split else ()
        onto_features = tuple(a for a in want if a in split_tokens and a not in want_tokens and a not in have)
        onto_tokens = _onto_tokens(state, point)
        if onto_features:
            moved = tuple(a for a in self.layout.sequence_axes if a in onto_features or a in joins)
            yield self.new("all-to-all", moved, self.tensor_bytes(op.stream, features, state.split), op.block,
                           f"{phase}:{point.point}", f"{op.short}: the {point.point} rule moves the split on "
                           f"{'+'.join(onto_features)} from the tokens onto the heads"
                           + (f", with {'+'.join(joins)} to join the streams" if joins else ""),
                           joined=tuple(a for a in joins if a not in onto_features))
        if onto_tokens:
            yield self.new("all-to-all", onto_tokens, self.tensor_bytes(op.stream, features, want or None), op.block,
                           f"{phase}:{point.point}", f"{op.short}: the {point.point} rule moves the split on "
                           f"{'+'.join(onto_tokens)} from the heads back onto the tokens")
        lost = tuple(a for a in have if a not in want and a not in onto_tokens)
        if lost:
            kept = tuple(a for a in have if a in want) or None
            yield self.new("all-gather", lost, self.tensor_bytes(op.stream, features, kept), op.block,
                           f"{phase}:{point.point}",
                           f"{op.short}: the {point.point} rule wants its features whole on {'+'.join(lost)}")
        return _State(want or None)

    def _joint_back(self, op: LinearOp, attention, state: _State, point) -> Iterator[Collective]:
        """The joint output of a marked attention kernel returns to tokens before it is cut into streams: one
        all-to-all of the joint sequence, then the cut moves the streams whose even split does not line up with
        the joint one (measured: cfg 2 x seq 2 x model 2, Qwen-Image: 1 all-to-all and 2 permutes per block)."""
        want = point.spec.entries[2] or ()
        back = _onto_tokens(state, point)
        if not back:
            return
        width = -(-attention.heads * attention.head_dim // self.size(want or None))
        joint_local = sum(self.layout.local.of_stream(s) for s in attention.streams)
        nbytes = self.layout.batch * joint_local * width * self.layout.itemsize
        yield self.new("all-to-all", back, nbytes, op.block, "attention:out",
                       f"the joint attention output moves its split on {'+'.join(back)} from the heads back onto the "
                       "tokens")
        yield from self._cut_into_streams(attention.streams, back, nbytes, op.block)

    def _cut_into_streams(self, streams: tuple[str, ...], axes: Axes, joint_bytes: int, block
                          ) -> Iterator[Collective]:
        """Cutting a joint attention output, split over `axes` on its tokens, back into streams: the streams whose
        own even split does not line up with the joint one move one joint shard between them, one permute each."""
        misaligned = self._misaligned(streams, self.size(axes))
        for stream in misaligned:
            yield self.new("collective-permute", axes, joint_bytes // len(misaligned), block, "attention:split",
                           f"the {stream} stream's share of the joint output sits on other chips than its own split "
                           "wants")

    def attention(self, attention, qkv: list[LinearOp]) -> Step:
        point = self.points.get((attention.module, "kernel"))
        at_kernel, ulysses = self.kernel_axes(point)
        joint = len({op.stream for op in qkv}) > 1 and not attention.keys
        joins = at_kernel if joint and ulysses else ()  # USP: the join rides the Ulysses all-to-all
        arrived = {}
        for op in qkv:
            state = _State(*self.used_split(op))
            if point is None:
                arrived[op.module] = state
                continue
            moved, arrived[op.module] = _collected(self._marked(op, op.out_features, state, point, "attention:in",
                                                                joins))
            yield from _in_halves(moved) if self._flow(op).rotary == "halves" else moved
        splits = [arrived[op.module].split for op in qkv]
        target = max(splits, key=lambda s: (splits.count(s), s is not None))
        phase = "attention:in"
        for op in qkv:
            state = arrived[op.module]
            if state.partial:
                yield self.new("all-reduce", state.partial, self.tensor_bytes(op.stream, op.out_features, state.split),
                               op.block, phase, f"{op.short} is split on its input dim: q/k/v must be summed")
            if state.split and state.split != target:
                yield self.new("all-gather", state.split, self.tensor_bytes(op.stream, op.out_features, None), op.block,
                               phase, f"{op.short} is split on {'+'.join(state.split)}, attention has it "
                               f"{'on ' + '+'.join(target) if target else 'whole'}")
        yield from self._norms_across_heads(attention, qkv)
        gathered = bool(target) and (self.linear_heads_gathered if attention.is_linear else self.heads_gathered)
        if at_kernel:
            yield from self._sequence(attention, qkv, target, at_kernel, joined=bool(joins), gathered=gathered)
            return _State() if gathered else _State(target)
        if gathered:
            yield from self._heads_gathered(attention, qkv[0], target)
            return _State()  # every chip holds every head's output
        return _State(target)

    def _heads_gathered(self, attention, op: LinearOp, heads: Axes) -> Iterator[Collective]:
        """torch_xla's math attention with more than one sample a chip runs every head on every chip
        (meshlab.plan.axes.heads_gathered): q, k and v, each of the joint sequence, are gathered over the axes that
        split the heads. The output is whole on every chip: an output projection that wants it split on the heads
        slices it, free, and one that wants it whole gathers nothing (measured, XLA:TPU: Wan 2.1 14B under 2d's
        rules over model 8, two samples a chip, no gather before either attention's to_out, where one sample a chip
        under model 4 gathers both). A linear attention's matmuls do the same, its values one row a head wider
        (diffusers' SanaLinearAttnProcessor2_0 pads them with ones for the normalizer; measured: SANA under
        sana-data2-model2.yaml, q, k and the padded v gathered, 573,440, 573,440 and 591,360 B a block)."""
        width = attention.heads * attention.head_dim
        values = attention.heads * (attention.head_dim + 1) if attention.is_linear else width
        queries = sum(self.layout.local.of_stream(s) for s in attention.streams)
        keys = sum(self.layout.local.of_stream(s) for s in attention.key_streams)
        for name, tokens, features in (("q", queries, width), ("k", keys, width), ("v", keys, values)):
            yield self.new("all-gather", heads, self.layout.batch * tokens * features * self.layout.itemsize,
                           op.block, "attention:heads", f"{attention.module.rsplit('.', 1)[-1]}: torch's "
                           f"{'matmuls fold' if attention.is_linear else 'math attention folds'} "
                           f"{self.layout.batch} samples and the heads into one dim, which XLA cannot keep split on "
                           f"{'+'.join(heads)}: {name} is gathered and every chip computes every head")

    def kernel_axes(self, point) -> tuple[Axes, Axes]:
        """For one attention: the sequence axes that still split the tokens at its kernel (a ring's, whose keys and
        values XLA gathers) and those its rule moves onto the heads (Ulysses'), read from the rule that marks its
        kernel. An attention no rule marks keeps every sequence axis on its tokens (measured: Wan 2.1 under
        cfg 2 x Ulysses 4 with the Ulysses rules for self-attention only: the cross-attention gathers the text's k and
        v, which the linear.output rule left split, in two all-gathers per block)."""
        sequence = tuple(a for a in self.layout.sequence_axes if self.size((a,)) > 1)
        if point is None:
            return sequence, ()
        return kernel_split(point.spec.entries, sequence)

    def _norms_across_heads(self, attention, qkv: list[LinearOp]) -> Iterator[Collective]:
        """A q or k norm over all heads at once (Wan's ``rms_norm_across_heads``) reads the projection's output
        before any activation rule moves it: where that output is split on features, each row's sum of squares
        is all-reduced, one float32 value per token (measured: Wan 2.1 under 2d and pairs; none under Ulysses,
        where the projection's output is whole in features)."""
        width = attention.heads * attention.head_dim
        for op in qkv:
            norm = self._flow(op).qk_norm
            split = self.used_split(op)[0]
            if norm is None or norm.width != width or not split or attention.heads == 1:
                continue
            sums = self.layout.batch * self.layout.local.of_stream(op.stream) * 4
            # XLA:TPU's combiner carries one attention's q and k sums in one op, not two attentions' (measured: Wan
            # 2.1 under 2d, v6e-8: self-attention's q and k in one all-reduce, cross-attention's in another)
            yield self.new("all-reduce", split, sums, op.block, f"{attention.module.rsplit('.', 1)[-1]}:qknorm",
                           f"{'.'.join(norm.module.rsplit('.', 2)[-2:])} normalizes across heads split on "
                           f"{'+'.join(split)}: one float32 sum of squares per token")

    def _flow(self, op: LinearOp) -> Flow:
        """The card's traced flow of a Linear (an empty one where the card has none)."""
        return self.flows.get(_pattern(op, self.graph)) or Flow(op.module, ())

    def _sequence(self, attention, qkv: list[LinearOp], target: Axes | None, axes: Axes, joined: bool = False,
                  gathered: bool = False) -> Iterator[Collective]:
        """Sequence axes split the tokens at the kernel: q, k and v of several streams are concatenated along a
        split dim, every query needs every key and value of the joint sequence, and the joint output is cut back
        into streams whose own even splits do not line up with the joint one (measured: seq 2 x model 4,
        Qwen-Image). XLA's partitioner gathers the keys and values: a ring's passes are meshlab.cost.ring's. A
        linear attention (SANA's) gathers no keys: its state, a sum over the tokens, is all-reduced. `gathered`:
        every head on every chip (meshlab.plan.axes.heads_gathered), the keys and values as `_split_keys_gathered`
        says."""
        axis = "+".join(axes)
        block, streams = qkv[0].block, attention.streams
        if attention.is_linear:  # no keys to gather: each chip sums its tokens' share of the state
            heads, d = -(-attention.heads // self.size(target)), attention.head_dim
            yield self.new("all-reduce", axes, self.layout.batch * heads * (d + 1) * d * 4, block, "attention:state",
                           f"the linear attention's state relu(K)^T [V; 1] sums over tokens split on {axis}: one "
                           f"float32 ({d} + 1) x {d} matrix per head")
            return
        width = -(-attention.heads * attention.head_dim // self.size(target))
        # at the kernel the tokens are split over `axes` alone: a Ulysses axis moved its split onto the heads (USP)
        ulysses = self.size(tuple(a for a in self.layout.sequence_axes if a not in axes) or None)
        nbytes = lambda tokens: self.layout.batch * tokens * width * self.layout.itemsize  # noqa: E731
        joint_local = ulysses * sum(self.layout.local.of_stream(s) for s in streams)
        # streams joined in one sequence (a cross-attention's q and k/v come from two streams, joined in none)
        concatenated = len({op.stream for op in qkv}) > 1 and not attention.keys
        # q and k rotated after the join, made by Linears with a bias (`rotated_joins`)
        rotated = self._rotated(attention, qkv, lambda op: self._flow(op).rotary_joint and op.bias is not None)
        if concatenated:
            for what in ("q", "k", "v"):
                twice = what in rotated and not joined
                for stream in streams if not joined else ():  # `joined`: moved with the rule's all-to-all
                    yield self.new("all-to-all", axes, nbytes(ulysses * self.layout.local.of_stream(stream)), block,
                                   "attention:concat", f"{what} of the {stream} stream joins a sequence split on "
                                   f"{axis}: XLA moves the split onto the heads to concatenate", rotated_join=twice)
                yield self.new("all-to-all", axes, nbytes(joint_local), block, "attention:concat",
                               f"the joint {what} moves its split back onto the sequence", rotated_join=twice)
        # q and k rotated on the image's part of a joint sequence made by one Linear, the text's part joined back
        # (HunyuanVideo's single blocks): each cut and joined along the split tokens as the streams are
        cut = self._rotated(attention, qkv, lambda op: self._flow(op).rotary_part)
        for what in cut if not concatenated and len(streams) > 1 else ():
            for stream in streams:
                yield self.new("all-to-all", axes, nbytes(ulysses * self.layout.local.of_stream(stream)), block,
                               "attention:rotary", f"{what} of the {stream} tokens, cut from the joint sequence split "
                               f"on {axis} for the rotary embeddings (image tokens only), moves its split onto the "
                               "heads to join the other part again")
            yield self.new("all-to-all", axes, nbytes(joint_local), block, "attention:rotary",
                           f"the rejoined {what} moves its split back onto the sequence")
        keys = [s for s in attention.key_streams if self.layout.local.of_stream(s) < self.layout.tokens.of_stream(s)]
        if gathered:
            yield from self._split_keys_gathered(attention, qkv[0], target, axes, keys)
        elif keys:  # the split streams' keys (Wan I2V's reference stream is never split)
            joint_whole = sum(self.layout.tokens.of_stream(s) for s in keys)
            for what in ("k", "v"):  # a cross-attention's whole keys (Wan's text) need no gather
                yield self.new("all-gather", axes, nbytes(joint_whole), block, "attention:kv",
                               f"{what}: tokens are split over {axis}; every query needs every key and value")
        if concatenated:
            yield from self._cut_into_streams(streams, axes, nbytes(joint_local), block)

    @staticmethod
    def _rotated(attention, qkv: list[LinearOp], rotated) -> tuple[str, ...]:
        """Which of q and k every Linear that makes it (one a stream: ``attention.qkv`` lists q, k, v of each)
        passes `rotated`; none where one Linear makes q, k and v together."""
        if attention.fused_width or len(attention.qkv) % 3:
            return ()
        made = {op.module: op for op in qkv}
        roles = {what: [made.get(m) for m in attention.qkv[i::3]] for i, what in enumerate(("q", "k"))}
        return tuple(what for what, ops in roles.items() if all(op is not None and rotated(op) for op in ops))

    def _split_keys_gathered(self, attention, op: LinearOp, heads: Axes, axes: Axes, keys: list[str]
                             ) -> Iterator[Collective]:
        """Every head on every chip while `axes` split the tokens (meshlab.plan.axes.heads_gathered): q, k and v
        gathered over the heads' axes at the chip's own tokens, then the keys of the split streams gathered whole,
        and the values gathered whole too or left split with the probabilities-times-values products summed
        (meshlab.plan.axes.values_summed). Measured, XLA:TPU, seq2-model4 at 256² (288 tokens, 144 a chip, 24 heads
        of 128, two samples): q, k and v 1,769,472 B each over model; the keys, sliced to 72 tokens a chip and
        permuted onto model (884,736 B), gathered whole over model (3,538,944 B); the values permuted alike; the
        float32 products of the chip's 144 queries summed over model (3,538,944 B)."""
        yield from self._heads_gathered(attention, op, heads)
        if not keys:  # a cross-attention's whole keys (Wan's text): gathered with the heads
            return
        width = attention.heads * attention.head_dim
        whole = self.layout.batch * sum(self.layout.tokens.of_stream(s) for s in keys) * width * self.layout.itemsize
        queries = sum(self.layout.local.of_stream(s) for s in attention.streams)
        summed = values_summed(self.size(heads), self.size(axes))
        name = attention.module.rsplit(".", 1)[-1]
        if summed:
            for what in ("k", "v"):
                yield self.new("collective-permute", (*axes, *heads), whole // self.size(heads), op.block,
                               "attention:kv", f"{name}: {what}'s tokens, split on {'+'.join(axes)}, sliced and "
                               f"re-split over {'+'.join(heads)}, which the gathered heads left free")
        yield self.new("all-gather", heads if summed else axes, whole, op.block, "attention:kv",
                       f"{name}: k's tokens are split; every query needs every key")
        if summed:
            yield self.new("all-reduce", heads, self.layout.batch * queries * width * 4, op.block, "attention:pv",
                           f"{name}: v stays split over {'+'.join(heads)} on its tokens; each chip's float32 "
                           "products of probabilities and values are summed")
        else:
            yield self.new("all-gather", axes, whole, op.block, "attention:kv",
                           f"{name}: v's tokens are split; every query needs every value")

    def joins(self, graph: Graph) -> Iterator[Collective]:
        """Streams joined into one sequence (or cut back) outside attention's q/k/v, each block that does it (Flux's
        single blocks; CogVideoX's attention joins the two norm outputs it is called with, and its block joins two
        more before the FFN): under a sequence axis the same all-to-alls and permutes as attention's q/k/v
        (measured: Flux, seq 2 x model 4, a single block: 3 all-to-alls and 2 permutes of hidden-wide tokens)."""
        axes = tuple(a for a in self.layout.sequence_axes if self.size((a,)) > 1)
        if not axes:
            return
        axis = "+".join(axes)
        streams, local = ("text", "image"), self.layout.local
        constrained = {module.split(".", 1)[0] for module, where in self.points if where.startswith("argument:")}
        for join in graph.joins:
            head = join.module.partition(".*")[0] if ".*" in join.module else None
            edges = {j.edge for j in graph.joins if j.module == join.module}
            folds = join.edge and edges == {"start", "end"} and head not in constrained
            kept = sorted(self.blocks_of.get(head, [])) if head else [None]
            # the join on the list's first block (kept as itself), the cut on the one that stands for its last
            at = kept[0] if join.edge == "start" else max(kept, key=lambda b: graph.last.get(b, b))
            for block in kept:
                edge = "" if not folds else join.edge if block == at else "inner"
                # a block's join of its own arguments moves each at the split it arrives with (measured, XLA:TPU:
                # HunyuanVideo under seq 2 x model 4, the image whole under its block.input rule, the text and the
                # joint result split on model like their residuals); a join or cut inside a block at the residuals'
                # split where the layernorm-rows rewrite keeps the norms split (measured, XLA:TPU: CogVideoX under
                # seq 2 x model 4, its attention's and its FFN's joins of its norms' outputs, each of the three
                # tensors at 768 of 3,072 features, and the cut of its FFN's output, 50 permutes of 52,131,840 B a
                # block against 46 of 56,881,152 B, where it priced 72.4 MB whole; HunyuanVideo's single blocks'
                # cut of their norm's output, 18 permutes of 91,502,592 B against 18 of 143,302,656 B, 182 MB
                # whole: permutes are not held to XLA:TPU's); any other join, whole
                start = join.edge == "start" and block is not None
                inner = not join.edge and block is not None and "layernorm-rows" in self.layout.rewrites
                split = {s: self._arriving(block, s) if start else self._residual_of(block, s) if inner else None
                         for s in streams}
                split["joint"] = self._residual_of(block, "joint") if start else \
                    split["text"] if inner and split["text"] == split["image"] else None
                nbytes = lambda tokens, s: self.layout.batch * tokens * -(-join.width // self.size(  # noqa: E731
                    split[s])) * self.layout.itemsize
                # which join, where a block has several (CogVideoX's attention's and its FFN's)
                named = f"{join.module.rsplit('.*.', 1)[-1]}: " if ".*." in join.module else ""
                if join.kind == "concat":
                    for stream in streams:
                        yield self.new("all-to-all", axes, nbytes(local.of_stream(stream), stream), block,
                                       "streams:concat", f"{named}the {stream} stream joins a sequence split on "
                                       f"{axis}", edge=edge)
                    yield self.new("all-to-all", axes, nbytes(local.joint, "joint"), block, "streams:concat",
                                   f"{named}the joined sequence moves its split back onto the tokens", edge=edge)
                else:
                    misaligned = self._misaligned(streams, self.size(axes))
                    for stream in misaligned:
                        share = nbytes(local.joint, "joint") // len(misaligned)
                        yield self.new("collective-permute", axes, share, block,
                                       "streams:split", f"the {stream} stream's tokens of the joint sequence sit on "
                                       "other chips than its own split wants", edge=edge)

    def block_inputs(self, graph: Graph) -> Iterator[Collective]:
        """A block.input rule pins its stream's features as its spec says at every block's start (torch_xla's
        sharding constraints have no unconstrained dim): a residual split on features that the spec leaves whole is
        all-gathered over those axes once a block (`_arriving`). Measured (XLA:TPU,
        hunyuan-seq2-model4-whole-input.yaml, the image stream's rule with the features whole): one all-gather of the
        image tokens at full width a block, at the end of each double and single block, where the next one starts;
        and on the CPU partitioner (sana-seq2-model2.yaml): one at the end of the first block. Not under
        hunyuan-seq4-model2.yaml (held out), whose single blocks' residual arrives whole."""
        for block, module in self.block_modules.items():
            for (where_module, where), point in self.points.items():
                if where_module != module or not where.startswith("argument:"):
                    continue
                residual = self._residual_of(block, point.stream)
                arriving = self._arriving(block, point.stream) or ()
                gathered = tuple(a for a in residual or () if a not in arriving)
                if gathered:
                    yield self.new("all-gather", gathered, self.tensor_bytes(point.stream, graph.hidden_size, None),
                                   block, "block:input", f"the block.input rule wants the {point.stream} stream's "
                                   f"features whole at the block's start; its residual is split on "
                                   f"{'+'.join(gathered)}")

    def _residual_of(self, block: int, stream: str) -> Axes | None:
        """How `stream`'s residual is split on features between blocks, or, in a block whose residual is the joint
        sequence (Flux's and HunyuanVideo's single blocks), where `stream` has none of its own, the joint one's."""
        return self.residual.get(stream) or (self.residual.get("joint") if block in self.joint_blocks else None)

    def _arriving(self, block: int, stream: str) -> Axes | None:
        """The feature split `stream` arrives with at the start of `block`: its residual's (`_residual_of`), less
        the axes a block.input rule on it leaves whole (None: whole)."""
        point = next((p for (m, where), p in self.points.items() if m == self.block_modules.get(block)
                      and where.startswith("argument:") and p.stream == stream), None)
        residual = self._residual_of(block, stream)
        if point is None or not residual:
            return residual
        kept = tuple(a for a in residual if a in (point.spec.entries[-1] or ()))
        return kept or None

    def _invariant(self, op: LinearOp) -> bool:
        """Its input is made outside the blocks and read as it is by every block (Wan's and SANA's text, which
        their cross-attentions' k and v read): the same tensor in every block. Measured hoisted on XLA:TPU for SANA,
        Wan and Wan I2V (its image context too) under 2d (benchmarks/tpu_matrix.py); LTX-Video's cross-attention
        follows the same rule, where its other differences hide whether XLA:TPU does."""
        reads = self._flow(op).reads
        return bool(reads) and all(".*" not in label for label in reads)

    def _gated(self, op: LinearOp, split: Axes) -> Iterator[Collective]:
        """A gated unit's first Linear (GLU: FLUX.2's MLP, SANA's GLUMBConv), its output split on features over n
        chips and cut into g pieces that are multiplied: each chip's contiguous shard lies in one piece, but the
        product wants every piece split alike, so each piece's share moves to the chip that wants it, one
        collective-permute per piece of out / (g x n) features (measured: SANA under 2d, model 2: 2 permutes of
        2800 channels, on XLA's CPU partitioner and XLA:TPU alike)."""
        pieces, n = self._flow(op).gated, self.size(split)
        if pieces < 2 or n < 2:
            return
        width = -(-op.out_features // (pieces * n))
        for piece in range(pieces):
            yield self.new("collective-permute", split, self.tensor_bytes(op.stream, width, None), op.block,
                           f"{_phase_name(op)}:gate", f"{op.short}'s output, split on {'+'.join(split)}, is cut into "
                           f"{pieces} pieces that are multiplied: piece {piece + 1}'s share moves to the chips that "
                           "want it split as the others")

    def halos(self, graph: Graph) -> Iterator[Collective]:
        """A convolution over the token grid (SANA's depthwise 3x3, padding keeping every position) reads the
        (kernel - 1) / 2 rows beyond each edge of the chip's share: where a sequence axis splits the image's tokens
        (whole rows of the row-major grid), each chip receives them from its two neighbours, one collective-permute
        each way, at the conv's channels on the chip. Derived, not held against XLA: its CPU partitioner does not
        keep SANA's tokens split (meshlab/data/known_differences.yaml)."""
        axes = tuple(a for a in self.layout.sequence_axes if self.size((a,)) > 1)
        if not axes or not self.layout.row_tokens:
            return
        for conv in graph.convs:
            reach = max(((k - 1) // 2 for k in conv.shape[2:]), default=0)
            if not reach or self.layout.local.of_stream(conv.parameter.stream) >= self.layout.tokens.of_stream(
                    conv.parameter.stream):
                continue
            split = _without(conv.spec.entries[0], set(self.layout.activation_axes()))
            channels = -(-conv.shape[0] // self.size(split))
            nbytes = self.layout.batch * reach * self.layout.row_tokens * channels * self.layout.itemsize
            name = conv.parameter.module.split(".", 2)[-1]
            for side in ("above", "below"):
                yield self.new("collective-permute", axes, nbytes, conv.parameter.block, f"{name}:halo",
                               f"{name} reads {reach} row(s) of tokens {side} the chip's share, split on "
                               f"{'+'.join(axes)}: its neighbour's")

    def _misaligned(self, streams: tuple[str, ...], parts: int) -> list[str]:
        """Streams whose even split over `parts` chips does not lie inside the joint sequence's even split."""
        tokens = self.layout.tokens
        joint_shard = -(-sum(tokens.of_stream(s) for s in streams) // parts)
        found, offset = [], 0
        for stream in streams:
            n = tokens.of_stream(stream)
            piece = -(-n // parts)
            if any(not (j * joint_shard <= offset + j * piece
                        and offset + min(n, (j + 1) * piece) <= (j + 1) * joint_shard)
                   for j in range(parts) if j * piece < n):
                found.append(stream)
            offset += n
        return found

    def _fsdp(self, param: PlannedParameter, block, name: str, flops: float = 0.0) -> Iterator[Collective]:
        activation_axes = set(self.layout.activation_axes())
        axes = tuple(a for a in param.spec.axes if a in activation_axes)
        if axes:
            yield self.new("all-gather", axes, param.bytes_per_device(self.mesh) * self.size(axes), block,
                           name + WEIGHTS_PHASE, f"{name} is split over {'+'.join(axes)}, which also splits "
                           "activations", window="gather" if flops and block is not None else "", dot_flops=flops)

    def parameters(self, graph: Graph) -> Iterator[Collective]:
        """Biases split unlike their weight's output, and split norm scales, are gathered before use."""
        for op in graph.linears:
            if op.bias is None:
                continue
            if op.bias.spec.entries[0] != op.weight.spec.entries[0] and op.bias.spec.axes:
                yield self.new("all-gather", op.bias.spec.axes, op.bias.parameter.bytes, op.block, "parameters",
                               f"{op.short}.bias is split unlike its weight's output")
        for p in graph.others:
            if p.spec.axes and p.parameter.kind == "norm":
                yield self.new("all-gather", p.spec.axes, p.parameter.bytes, p.parameter.block, "parameters",
                               f"{p.name} (a norm scale) is split, but every chip applies it whole")
            elif p.spec.axes and p.parameter.kind == "other" and p.parameter.rank <= 3:
                # a table added to the modulation (Wan's scale_shift_table, [1, chunks, width]): gathered once; split
                # over an axis that splits activations (FSDP), each chunk is gathered where it is used (measured:
                # Wan under 2d, one [6, 5120] gather; under cfg x Ulysses with FSDP over seq, six [1, 1536] gathers)
                fsdp = set(p.spec.axes) <= set(self.layout.activation_axes()) and p.parameter.rank == 3
                pieces = p.shape[1] if fsdp else 1
                realigned = () if fsdp else self._realigned(p, graph)
                for _ in range(pieces):
                    yield self.new("all-gather", p.spec.axes, p.parameter.bytes // pieces, p.parameter.block,
                                   "parameters", f"{p.name} (a table added to the modulation) is split, but every "
                                   "chip adds it whole" + (", one chunk at a time" if fsdp else ""),
                                   realigned=realigned)

    def _realigned(self, table: PlannedParameter, graph: Graph) -> tuple[int, int, int]:
        """How XLA:TPU realigns the conditioning a block adds `table` ([.., chunks, width], split on width) to, where
        it comes from a modulation Linear outside the blocks whose rows split over the same axes
        (`realigned_chunks`): (chunks, bytes per chip of one chunk's all-to-all, bytes per chip of the table's
        all-to-all or 0); () otherwise. Not measured, so not priced: a table split otherwise, or left whole beside
        a split conditioning."""
        block = table.parameter.block
        source = next((op for op in graph.linears if op.role == "chunks" and block in self._block_norms(op)), None)
        split = self.chunk_split(source) if source is not None else None
        if not split or table.spec.entries[-1] is None or set(table.spec.entries[-1]) != set(split) \
                or any(table.spec.entries[:-1]):  # measured only for a table split on its width, as the rows
            return ()
        chunks, n = source.out_features // source.chunk_width, self.size(split)
        group = math.gcd(chunks, n)
        if group == 1 or table.shape[-2:] != (chunks, source.chunk_width):
            return ()
        dtypes = {m.dtype for m in self.flows[source.module].modulates if ".*" in m.norm}
        itemsize = DTYPE_BYTES[next(iter(dtypes))] if len(dtypes) == 1 and "" not in dtypes else self.layout.itemsize
        return (chunks, self.layout.batch * source.chunk_width * group // n * itemsize,
                table.bytes_per_device(self.mesh) if group == n else 0)


def _collected(step: Step) -> tuple[list[Collective], _State]:
    """What a step yields, and the state it returns."""
    made: list[Collective] = []
    while True:
        try:
            made.append(next(step))
        except StopIteration as done:
            return made, done.value


def _in_halves(moved: list[Collective]) -> Iterator[Collective]:
    """`moved` with each all-to-all, which moves a rotated q or k, as two half-width ones (measured: Wan under cfg x
    Ulysses, four of 98,304 B where q and k would be two of 196,608 B)."""
    for c in moved:
        if c.kind == "all-to-all":
            half = replace(c, bytes=c.bytes // 2, why=c.why + " (one of the two rotary halves)")
            yield from (half, half)
        else:
            yield c


def _onto_tokens(state: _State, point) -> Axes:
    """Axes an activation rule moves from the features (heads) of `state` onto the tokens."""
    want_tokens, want = point.spec.entries[1] or (), point.spec.entries[2] or ()
    return tuple(a for a in want_tokens if a in (state.split or ()) and a not in want)


def _without(axes: Axes | None, dropped: set[str]) -> Axes | None:
    kept = tuple(a for a in axes or () if a not in dropped)
    return kept or None


def _pattern(op: LinearOp, graph: Graph) -> str:
    """The module pattern of a Linear (``blocks.*.attn1.to_q``), as the card's dataflow names it."""
    return module_pattern(op.module, graph.card.block_lists) if graph.card is not None else op.module


def _phase_name(op: LinearOp) -> str:
    """Image and text twins share a phase so that their collectives combine (see ``LinearOp.phase``)."""
    return op.phase or op.module
