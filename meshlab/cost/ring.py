"""Ring attention priced as a ring: passes over blocks of keys, merges, and the blocks' transfers. Pure, no torch.

A ring of n chips splits the tokens at the attention kernel n ways (`Layout.ring_axes`). Where a GPU tool runs the
sequence split (``activations.sequence_parallel``: diffusers or xdit), each chip's attention is not one kernel over
every key but:

- **n passes**: its local queries against one block of N / n keys each, a flash attention that also returns the
  log-sum-exp. A pass does 1 / n of the FLOPs at the kernel's rate for a key length of N / n, which the catalog
  gives (`Hardware.attention_rate`), times how full its few tiles keep the SMs (`Hardware.attention_occupancy`):
  shorter keys run slower, so a ring's passes cost more than one attention over the whole sequence (measured on one
  H200 with no host work, `experiments/profiles/h200-2026-12-05/ring-attention.json`: 291, 278 and 196 TFLOP/s per
  pass replayed from a CUDA graph at 2, 4 and 8 ranks of a 4,608-token sequence, against 293 for Ulysses' one kernel
  over every key on half the heads, queued back to back; `python benchmarks/ring_kernels.py` holds each against its
  prediction);
- **n - 1 merges** of a pass's output into the running one (diffusers' ``TemplatedRingAttention`` and
  ring-flash-attention's ``_update_out_and_lse``): ``out = prev - sigmoid(lse - prev_lse) * (prev - out)`` in
  float32, and the log-sum-exp alike; each pass's output is cast to float32 first (``convert_to_fp32``) and the
  result cast back once. Priced as the HBM bytes its eager kernels move (`MERGE_BYTES_PER_ELEMENT`,
  `CAST_BYTES_PER_ELEMENT`) at the fraction of the chip's bandwidth such kernels were measured to reach on an H200
  (`MERGE_HBM_FRACTION`), and as `MERGE_OPS` more kernels per merge (one more per cast) the host dispatches where
  the call runs eager;
- **the keys and values of the other chips**, by the implementation:

  - ``gather-passes`` (``sequence_parallel: diffusers``, ``ContextParallelConfig(ring_degree=n)``): one
    all-gather of k and v, concatenated into one buffer, over the ring; the gathered result is an async tensor that
    only the second pass reads (the first runs on the chip's own block), so the gather overlaps the first pass:
    ``max(0, gather - pass)`` is exposed;
  - ``p2p-passes`` (``sequence_parallel: xdit``; yunchang, ring-flash-attention): before each of the first n - 1
    passes the chip sends its current block to the next chip and receives the next one (async send/recv), while
    the pass runs. Each transfer is one k and one v block over the ring's route (a collective-permute in
    meshlab.cost.topology); what the pass does not hide is exposed: ``max(0, transfer - pass)`` per pass.

  Either way the ring owns the transfer: the all-gather XLA's partitioner would make of the keys is not run. Under
  either tool, with or without a ring, neither are the re-splits the partitioner makes to join the streams into one
  sequence and cut them back (the tools join each chip's own text and image shards on the chip), and under USP the
  Ulysses all-to-all runs over the Ulysses axes alone (`tool_issued`).

Only a self or joint attention runs as a ring: a cross-attention (Wan's attn2, over the text) runs its one kernel
as before (diffusers passes it no parallel config, and splits no text for it).

Memory (meshlab.plan.memory): a p2p ring holds its own block of k and v and the incoming one, not every key; a ring of
passes also holds its float32 running output.

Why by hand: no library prices a ring from kernel rates and link bandwidth; the equations above are the whole
model, and every input is a catalog figure with its source.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from meshlab.cost.collectives import STREAM_RESPLITS, Collective
from meshlab.cost.flops import Work
from meshlab.cost.layout import Layout
from meshlab.cost.topology import Route, collective_seconds
from meshlab.core.hardware import Hardware

RINGS = ("gather-passes", "p2p-passes")
#: kernels of one merge, forward, counted in diffusers' TemplatedRingAttention (0.42): lse - prev_lse, sigmoid,
#: prev_out - out, the product, prev_out minus it (out: 5); prev_lse - lse, logsigmoid, prev_lse minus it (3). The
#: log-sum-exp's own cast is none: flash returns it in float32
MERGE_OPS = 8
#: HBM bytes one merge moves per element of a pass's output [batch, queries, heads, head_dim], all float32:
#: prev_out - out (8 read, 4 written), the product (4 read, 4 written), prev_out minus it (8 read, 4 written); the
#: log-sum-exp terms are 1 / head_dim as large and left out
MERGE_BYTES_PER_ELEMENT = 32
#: one cast between bf16 and float32 per element (2 read, 4 written, or back): each pass's output to float32, and
#: the merged output back once
CAST_BYTES_PER_ELEMENT = 6
#: the fraction of the spec HBM bandwidth a merge's and a cast's eager kernels reach, measured on one H200
#: (benchmarks/gpu_ring_attention.py, experiments/profiles/h200-2026-12-05/ring-attention.json): the mean of the five
#: readings in which the host's dispatch does not show. Flux's 4,608 tokens and 24 heads: a ring replayed from a CUDA
#: graph less its passes replayed alike leaves the first cast and the merges, 115.2 us for 311 MB at 2 ranks and
#: 160.5 us for 425 MB at 4 (`CAST_BYTES_PER_ELEMENT` and `MERGE_BYTES_PER_ELEMENT` over the outputs): 0.563 and
#: 0.551 of the H200's 4.8 TB/s. Wan 2.1's 75,600 tokens and 40 heads: one merge with both casts (44 bytes an
#: element, 8.5, 4.3 and 2.1 GB at 2, 4 and 8 ranks) timed alone, 2.8 to 0.75 ms each: 0.630, 0.618 and 0.589. Mean
#: 0.590. Why below a long streaming copy (`hbm_efficiency`'s assumed 0.85) is not measured yet: the next run's
#: merge_graph_s and add_graph_s time the merge and a plain add of the same size. Flux at 8 ranks (1.8 M elements a
#: merge) reads 0.440 the same way: there the kernels' own start and tail show, left out here
MERGE_HBM_FRACTION = 0.590
#: kernels a p2p pass adds: the batched send/recv of k and v, and the wait
P2P_OPS = 2
#: kernels diffusers' gather adds: the cat of k and v into one buffer, and the all-gather
GATHER_OPS = 2
#: the phase of meshlab.cost.collectives in which XLA's partitioner gathers k and v: a ring moves them itself
GATHER_PHASE = "attention:kv"


def tool_issued(collectives: tuple[Collective, ...], layout: Layout) -> tuple[Collective, ...]:
    """What a plan whose sequence split a GPU tool runs (``sequence_parallel: diffusers | xdit``, `layout.ring` in
    RINGS) issues of the partitioner's collectives: not its gather of the keys (a ring moves them), not its
    re-splits to join and cut the streams (the tools join each chip's own shards on the chip), and each Ulysses
    all-to-all over the Ulysses axes alone. A plan the partitioner runs issues them as they are."""
    if layout.ring not in RINGS or not layout.sequence_axes:
        return collectives
    kept = []
    for c in collectives:
        if c.phase == GATHER_PHASE or c.phase in STREAM_RESPLITS:
            continue
        axes = tuple(a for a in c.axes if a not in c.joined)
        if axes:
            kept.append(replace(c, axes=axes, joined=()) if c.joined else c)
    return tuple(kept)


@dataclass(frozen=True)
class RingAttention:
    """One attention of a transformer call run as a ring on one chip, for each of its `count` blocks."""

    module: str
    count: int
    degree: int  # passes: chips in the ring
    implementation: str  # one of RINGS
    pass_seconds: float  # one pass: the local queries against one block of keys, at the kernel's rate there
    merge_seconds: float  # one merge of a pass's output into the running output
    cast_seconds: float  # one cast of a pass's output between bf16 and float32
    transfer_seconds: float  # p2p-passes: one block of k and v to the next chip; gather-passes: the whole gather
    block_bytes: int  # one block of k and v on one chip
    whole_seconds: float  # the same attention as one kernel over every key (what `gather` runs)

    @property
    def exposed_transfer(self) -> float:
        """Transfer time the passes do not hide: each p2p block behind its pass, diffusers' gather behind the
        first pass."""
        if self.implementation == "p2p-passes":
            return (self.degree - 1) * max(0.0, self.transfer_seconds - self.pass_seconds)
        return max(0.0, self.transfer_seconds - self.pass_seconds)

    @property
    def compute_seconds(self) -> float:
        return (self.degree * self.pass_seconds + (self.degree - 1) * self.merge_seconds
                + (self.degree + 1) * self.cast_seconds)

    @property
    def seconds(self) -> float:
        return self.compute_seconds + self.exposed_transfer

    @property
    def transferred_bytes(self) -> int:
        """k and v bytes per attention, as meshlab.cost.collectives counts a collective's: the gathered buffer (n
        blocks) of diffusers' all-gather, the n - 1 blocks sent by p2p."""
        return (self.degree - 1 if self.implementation == "p2p-passes" else self.degree) * self.block_bytes

    @property
    def dispatches(self) -> int:
        """Kernels the ring adds to the one attention call the card traced."""
        moves = (self.degree - 1) * P2P_OPS if self.implementation == "p2p-passes" else GATHER_OPS
        return (self.degree - 1) * (1 + MERGE_OPS) + (self.degree + 1) + moves


def ring_attentions(work: tuple[Work, ...], layout: Layout, route: Route | None, hardware: Hardware,
                    op_seconds) -> tuple[RingAttention, ...]:
    """Each attention of the call whose keys the ring splits (`Layout.ringed`), as the strategy's ring runs it
    (() when it runs none). `op_seconds(work)` prices one op as meshlab.cost.timing does."""
    n = layout.ring_degree
    if layout.ring not in RINGS or n < 2:
        return ()
    bandwidth = hardware.hbm_bandwidth * MERGE_HBM_FRACTION
    found = []
    for w in work:
        if w.kind != "attention" or len(w.shape) != 5 or w.name not in layout.ringed:
            continue
        batch, heads, queries, keys, head_dim = w.shape
        width = heads * head_dim
        scores = w.hbm_bytes - batch * (2 * queries + 2 * keys) * width * layout.itemsize  # without flash
        # the chip's heads and queries at the kernel: a Ulysses split moved from the tokens onto the heads
        batch, heads, queries = w.kernel_rows
        block = -(-keys // n)
        width = heads * head_dim
        one_pass = replace(w, flops=w.flops / n, hbm_bytes=float(batch * (2 * queries + 2 * block) * width
                                                                 * layout.itemsize + scores / n),
                           shape=(batch, heads, queries, block, head_dim), ulysses=1)
        block_bytes = 2 * batch * block * width * layout.itemsize
        elements = batch * queries * width
        if route is None:
            transfer = 0.0
        elif layout.ring == "p2p-passes":
            transfer = collective_seconds("collective-permute", block_bytes, route, hardware.collective_latency_s)
        else:  # one all-gather of the concatenated k and v: n blocks gathered
            transfer = collective_seconds("all-gather", n * block_bytes, route, hardware.collective_latency_s)
        found.append(RingAttention(w.name, w.count, n, layout.ring, op_seconds(one_pass),
                                   MERGE_BYTES_PER_ELEMENT * elements / bandwidth,
                                   CAST_BYTES_PER_ELEMENT * elements / bandwidth, transfer, block_bytes,
                                   op_seconds(w)))
    return tuple(found)
