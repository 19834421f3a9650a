"""Per-chip memory of a plan: weights, activations, the other pipeline parts, and a runtime reserve.

Method (documented in ``ACTIVATION_METHOD``): weights are the padded shards XLA allocates; activations are
the peak working set of the heaviest transformer block at the workload's token counts. The pipeline runs in
phases, encode, denoise, decode, with every weight placed on the device resident throughout: the peak is the
largest phase's working set (what the largest encode on the chips holds, as its card traced it, and a sharded
encoder's gathered layer; the denoise activations; the VAE decode's working set, under ``placement.vae_decode``),
not their sum.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from dataclasses import dataclass

from meshlab.models.card import DTYPE_BYTES, Architecture, Component, block_position
from meshlab.plan.axes import activation_axes, compute_split, heads_gathered, kernel_marked, ring_axes, values_summed
from meshlab.plan.plan import Plan, PlannedParameter
from meshlab.strategy.schema import Strategy, weight_gathers_run_async
from meshlab.plan.tokens import TokenCounts, local_token_counts, rules_split_text, token_counts

ACTIVATION_METHOD = (
    "peak working set of the heaviest block: its input and output residual streams, plus the larger of "
    "(attention: q/k/v and the attention output, and when flash_attention is off the scores and probabilities "
    "with float32 copies of q, k and v, as torch's math attention computes them (none on a TPU: XLA:TPU fuses "
    "the converts into the matmuls; where a TPU's program gathers every head, q, k and v of every head in place "
    "of the chip's projections); a linear attention holds q, k and v, float32 copies of them (none on a TPU) "
    "and its float32 output of head_dim + 1 rows a head; on a TPU whose catalog entry "
    "gives fused_softmax_keys, one float32 score buffer where a row has at most that many keys, unless every head "
    "is gathered under a sequence split, and where it gives recomputed_softmax_keys, one where a row has more, "
    "unless the probabilities meet values left split; where it gives mask_broadcast_keys and holds two, up to "
    "recomputed_softmax_keys, a masked self- or joint attention's mask broadcast to every head and query besides, "
    "where a row has more and no ring splits it (no sequence split, or Ulysses alone)) "
    "and (MLP: the widest Linear's output before and after its activation); each Linear's output is split as "
    "its weight's output dim is split over axes that do not split activations (a weight split over the batch, "
    "sequence or guidance axis is gathered before use), the batch as activations.batch, image tokens as "
    "activations.sequence (and the text tokens with it where attention joins them); with a sequence split, "
    "attention also holds the k and v of the joint sequence's tokens on other chips (a ring that passes blocks "
    "by send/recv, two blocks of them, and a ring of passes its running output in float32); under "
    "compile.scan_blocks the denoise phase also holds the block weights stacked for the scan; a block whose "
    "weights are split over an axis that splits activations (FSDP) is priced holding them gathered beside the "
    "activations"
)


@dataclass(frozen=True)
class ChipMemory:
    chip: int
    weights_sharded: int  # real bytes of this chip's shards of sharded parameters
    weights_replicated: int  # parameters every chip holds whole
    padding: int  # bytes XLA pads onto this chip's shards where a split does not divide a dim
    activations: int  # peak working set while denoising
    vae_weights: int
    vae_decode: int  # VAE decode working set (after denoising)
    text_encoder: int  # the text encoders' resident weights (all of them, or this chip's shard)
    reserve: int  # runtime and compiler scratch kept by the platform
    hbm: int  # usable HBM of one chip
    text_encode: int = 0  # the encode phase's working set: what an encode holds, and a sharded encoder's layer
    scan_stacked: int = 0  # compile.scan_blocks: the block weights stacked for the scan, live while denoising
    tile_padding: int = 0  # bytes a TPU's tiled layouts add to this chip's weights (meshlab.core.tpu_tiles)
    gathered_weights: int = 0  # FSDP: the heaviest block's weights gathered over the axes that split activations
    #                            (two blocks' where the chip gathers them async: memory.gathered_blocks_on)
    #: the transformer's buffers, whole on every chip (meshlab.models.card.Buffer: SD3.5's positional table)
    buffers: int = 0

    @property
    def denoise(self) -> int:
        """The denoise phase's working set: the activations, FSDP's gathered weights (a block's, two where the chip
        gathers them async), and under scan the stacked block weights."""
        return self.activations + self.gathered_weights + self.scan_stacked

    @property
    def peak_phase(self) -> str:
        """The phase whose working set sets the peak: "encode", "denoise" or "decode"."""
        return max((self.denoise, 1, "denoise"), (self.vae_decode, 0, "decode"),
                   (self.text_encode, -1, "encode"))[2]

    @property
    def weights(self) -> int:
        return self.weights_sharded + self.weights_replicated + self.padding + self.tile_padding

    @property
    def activation_peak(self) -> int:
        return max(self.denoise, self.vae_decode, self.text_encode)

    @property
    def resident(self) -> int:
        """What the transformer holds between forwards: its weights and its buffers."""
        return self.weights + self.buffers

    @property
    def other(self) -> int:
        """The transformer's buffers, the other pipeline parts' weights and the runtime reserve."""
        return self.buffers + self.vae_weights + self.text_encoder + self.reserve

    @property
    def total(self) -> int:
        return self.weights + self.activation_peak + self.other

    @property
    def headroom(self) -> int:
        return self.hbm - self.total


@dataclass(frozen=True)
class MemoryReport:
    chips: tuple[ChipMemory, ...]
    tokens: TokenCounts

    @property
    def most_loaded(self) -> ChipMemory:
        return max(self.chips, key=lambda c: (c.total, -c.chip))

    @property
    def uniform(self) -> bool:
        """Every chip holds the same bytes in every component (equal totals can hide a different split)."""
        return len({dataclasses.replace(c, chip=0) for c in self.chips}) == 1

    @property
    def fits(self) -> bool:
        return all(c.headroom >= 0 for c in self.chips)

    def on(self, usable_hbm: int, reserve: int) -> "MemoryReport":
        """The same plan's memory on chips of another size and runtime reserve (nothing else depends on them but
        the blocks a chip holds gathered, `gathered_blocks_on`, and the keys up to which its math attention holds
        one score buffer or more, `ScoreBuffers`, which a caller re-sizing to another system keeps apart:
        meshlab.search.sweep._Shared)."""
        return MemoryReport(tuple(dataclasses.replace(c, hbm=usable_hbm, reserve=reserve) for c in self.chips),
                            self.tokens)


def memory_on(plan: Plan, strategy: Strategy, hardware) -> MemoryReport:
    """`memory_report` on `hardware` (a meshlab.core.hardware.Hardware): its usable HBM, its runtime reserve, its
    tiled layouts where it has them (TPUs), and two blocks' weights gathered where the chip runs FSDP's weight
    gathers async (`gathered_blocks_on`)."""
    return memory_report(plan, strategy, hardware.usable_hbm_bytes, hardware.runtime_reserve_bytes,
                         tiles=hardware.tiled_layouts, gathered_blocks=gathered_blocks_on(strategy, hardware),
                         score_buffers=ScoreBuffers.of(hardware))


def gathered_blocks_on(strategy: Strategy, hardware) -> int:
    """Blocks whose gathered weights a chip is priced holding at once (`gathered_block_bytes`, a stand-in for what
    XLA:TPU's schedule holds): two where it runs FSDP's weight gathers async (the catalog's ``async_weight_gathers``:
    `weight_gathers_async`), whose schedule issues the blocks' gathers early, most of them synchronous; else one.
    XLA:TPU's compile of fsdp.yaml for v5e:2x4 (torch_xla's program, libtpu's defaults) at 256², 3 blocks, holds
    1,663,338,496 B of temporaries at once in HBM and VMEM (1,550,086,144 B in HBM): gathered, every modulation
    weight, 23 of the 24 attention projections and 5 of the 12 MLP weights of the three blocks, 1,491,075,072 B of
    their 2,038,431,744, 2.19 blocks' (every kind at its peak, `hlo.working_set_peak`), against meshlab's
    1,385,496,576 B (two blocks' gathered weights and the activations:
    benchmarks/results/tpu_check_fsdp-v5e_256.json); for v6e:2x4, whose gathers are synchronous, 679,908,448 B,
    every block's modulation weights (tpu_working_set_fsdp.json)."""
    return 2 if weight_gathers_async(strategy, hardware) else 1


def gathers_mode(strategy: Strategy, hardware) -> str:
    """The chip's ``async_weight_gathers`` as it bears on this plan: "" where the plan runs its blocks through scan
    or the chip is not a TPU (its gathers then priced synchronous whatever the flags)."""
    return "" if hardware.kind != "tpu" or strategy.compile.scan_blocks else hardware.async_weight_gathers


def weight_gathers_async(strategy: Strategy, hardware) -> bool:
    """Whether `hardware` runs the plan's FSDP weight gathers in its blocks async, as its catalog entry's
    ``async_weight_gathers`` says: on a chip that does so by default (v5e) unless the plan turns XLA's async
    all-gathers off, on one that does so with the flag (v4) where the plan sets --xla_enable_async_all_gather=true;
    never where the plan runs its blocks through scan (a loop whose next iteration's gathers were not measured)."""
    return weight_gathers_run_async(gathers_mode(strategy, hardware), strategy.compile.libtpu_flags)


def memory_report(plan: Plan, strategy: Strategy, usable_hbm: int, reserve: int, tiles: bool = False,
                  gathered_blocks: int = 1, score_buffers: ScoreBuffers | None = None) -> MemoryReport:
    """`tiles`: the chips lay arrays out in tiles (TPUs, ``Hardware.tiled_layouts``): each weight shard takes the
    bytes its tiled layout allocates, and the plan runs as XLA:TPU's program (meshlab.plan.axes.heads_gathered).
    `gathered_blocks`: the blocks whose weights are held gathered at once (`gathered_blocks_on`).
    `score_buffers`: the keys a row at which the chip's math attention changes how many float32 score buffers it
    holds (`ScoreBuffers`; None: two, whatever the keys)."""
    tokens = token_counts(strategy.workload, plan.card.architecture)
    activations = block_activation_bytes(plan, strategy, tokens, xla=tiles, score_buffers=score_buffers)
    vae_weights, vae_decode, text_encoder, text_encode = _components(plan, strategy)
    sharded, replicated, padded = _weight_groups(plan, weights_scale(strategy))
    tile_padding = weights_tile_padding(plan, strategy) if tiles else 0
    stacked = scan_stacked_bytes(plan) if strategy.compile.scan_blocks else 0
    gathered = gathered_blocks * gathered_block_bytes(plan, strategy)
    buffers = plan.card.buffer_bytes(strategy.workload.weights_dtype or strategy.workload.dtype)
    chips = []
    allocated_padded = sum(allocated * n for _, allocated, n in padded)
    for chip in range(plan.mesh.device_count):
        real_padded = sum(p.real_bytes_on(chip, plan.mesh) * n for p, _, n in padded)
        chips.append(ChipMemory(chip, sharded + real_padded, replicated, allocated_padded - real_padded,
                                activations, vae_weights, vae_decode, text_encoder, reserve, usable_hbm,
                                text_encode, stacked, tile_padding, gathered, buffers))
    return MemoryReport(tuple(chips), tokens)


def gathered_block_bytes(plan: Plan, strategy: Strategy) -> int:
    """Bytes one chip holds of the heaviest block's weights gathered over the axes that split activations (a weight
    split over the batch, sequence or guidance axis is gathered before use: FSDP), in the dtype the block computes
    in, still split over its other axes. A stand-in for what XLA:TPU holds beside the activations under FSDP, which
    its scheduler decides: not a block's gathers held together. XLA:TPU gathers a Linear's weight where it is used
    and frees it after, so at the attention's peak it holds none (wan-14b-v6e-8.yaml at 256², 3 blocks: the two
    score buffers and 0.12 GiB more, 2.27 GiB at once; 2.96 GiB with this term, 2.31 without). What it holds beside
    the activations is another choice of its schedule's: for fsdp.yaml (v6e-8, torch_xla's program) at 256², 3
    blocks, every block's two modulation weights, gathered together since their input (the timestep's embedding) is
    known from the start, 679,477,248 B, a block's gathered weights only because a modulation Linear is a sixth of a
    Qwen-Image block; at full depth and 1024², copies in HBM of the weight shards of the six Linears a block it runs
    as collective matmuls (the image stream's), every block's, 1.58 GiB beside the two score buffers' 3.80 GiB
    (5.51 GiB at once; 4.59 GiB with this term, 3.96 without). What each program holds at its peak: `meshlab check
    --backend tpu`'s ``at_peak`` (benchmarks/results/tpu_working_set_fsdp.json, tpu_aot_fsdp_at_peak.txt). Blocks
    only: a weight outside them gathered over those axes is held for one Linear. 0 where no block weight is split
    over an activation axis of more than one chip."""
    gathered = {a for a in activation_axes(strategy.activations, plan.mesh) if plan.mesh.size(a) > 1}
    if not gathered or not any(a in gathered for p, _ in plan.alike for a in p.spec.axes):
        return 0
    itemsize = DTYPE_BYTES[strategy.workload.dtype]
    per_block: dict[int, int] = defaultdict(int)
    for p in plan.parameters:
        if p.parameter.block is not None and any(a in gathered for a in p.spec.axes):
            per_block[p.parameter.block] += itemsize * math.prod(
                -(-n // compute_split(entry, plan.mesh, gathered)) for n, entry in zip(p.shape, p.spec.entries))
    return max(per_block.values(), default=0)


def weights_tile_padding(plan: Plan, strategy: Strategy) -> int:
    """Bytes per chip that a TPU's tiled layouts add to the weight shards, held as they are held
    (``workload.weights_dtype``): every chip's shards have one shape, so every chip gets the same."""
    itemsize = DTYPE_BYTES[strategy.workload.weights_dtype or strategy.workload.dtype]
    return sum((p.tiled_bytes_per_device(plan.mesh, itemsize) - math.prod(p.shard_shape(plan.mesh)) * itemsize) * n
               for p, n in plan.alike)


def scan_stacked_bytes(plan: Plan) -> int:
    """Bytes per chip of the copy torch_xla's scan makes of every scanned block list's weights: each forward
    stacks a list's per-block parameters along a new leading dim (meshlab.parallelisms.scan), split as each block's
    copy is, and the stack is live while the loop runs. Measured by XLA:TPU's ahead-of-time compile of 2d.yaml at
    full depth (v6e-8, 1024x1024, batch 2, torch_xla's program): temporaries 11.32 GB per chip scanned against
    1.30 GB unrolled, 10.02 GB more, 98% of the 10.20 GB of block weights each chip holds. Every list's stack
    counts: Flux's two lists scanned (tests/cost/data/strategies/flux-2d.yaml, 3 blocks of each, 256²) took 672 MB
    of temporaries, against 723 MB for both stacks and 510 MB for the larger alone."""
    return sum(p.bytes_per_device(plan.mesh) for p in plan.parameters if block_position(p.name) is not None)


def weights_scale(strategy: Strategy) -> float:
    """Bytes a weight is held in between uses over the bytes it is computed in (``workload.weights_dtype``: Wan's
    official code holds float32 weights and computes in bfloat16, 2.0)."""
    held = strategy.workload.weights_dtype
    return DTYPE_BYTES[held] / DTYPE_BYTES[strategy.workload.dtype] if held else 1.0


def _weight_groups(plan: Plan, scale: float = 1.0) -> tuple[int, int, list[tuple[PlannedParameter, int, int]]]:
    """Bytes of evenly sharded and of replicated parameters (the same on every chip), and the padded ones (one of
    each kind, its bytes, how many), as held (`scale`: held over computed bytes, see `weights_scale`)."""
    sharded = replicated = 0
    padded = []
    for p, count in plan.alike:
        allocated = int(p.bytes_per_device(plan.mesh) * scale)
        if p.spec.is_replicated:
            replicated += allocated * count
        elif any(n % k for n, k in zip(p.shape, p.spec.split_counts(plan.mesh))):
            padded.append((p, allocated, count))
        else:
            sharded += allocated * count
    return sharded, replicated, padded


def _components(plan: Plan, strategy: Strategy) -> tuple[int, int, int, int]:
    """VAE weights, the decode's working set, the text encoders' resident weights and the encode phase's working
    set, on one chip."""
    itemsize = DTYPE_BYTES[strategy.workload.dtype]
    workload, placement = strategy.workload, strategy.placement
    vae_itemsize = DTYPE_BYTES[placement.vae_dtype or workload.dtype]
    vae = plan.card.component("vae")
    encoders = plan.card.encoders  # SD3.5 has three text encoders; Wan I2V an image encoder too
    vae_weights = vae_decode = text_bytes = text_encode = 0
    if vae is not None and placement.vae == "device":
        vae_weights = vae.parameters * vae_itemsize
        split = _batch_split(plan, strategy)
        per_chip_batch = -(-workload.batch // split)  # XLA pads an uneven batch
        share = decode_share(vae, placement.vae_decode, workload.height, workload.width,
                             plan.mesh.device_count // split)
        vae_decode = per_chip_batch * vae_decode_bytes(vae.working_bytes_per_pixel, plan.card.architecture,
                                                       workload.height, workload.width, workload.frames,
                                                       vae_itemsize, share, frame_growth(vae, plan.card.architecture,
                                                                            workload.frames), vae.output_copies)
    chips = plan.mesh.device_count
    text_bytes = sum(encoder_resident(c, placement.encoder_place(c.name), chips) for c in encoders) * itemsize
    for c in encoders:  # they encode one after another: the phase holds the largest one's working set
        where = placement.encoder_place(c.name)
        if where != "cpu":  # each chip encodes the whole prompt; a sharded encoder gathers a layer at a time
            gathered = c.largest_layer_parameters * itemsize if where == "sharded" and chips > 1 else 0
            working = c.encode_working_set(workload.text_tokens + c.prefix_tokens, itemsize)
            text_encode = max(text_encode, gathered + working)
    return vae_weights, vae_decode, text_bytes, text_encode


def encoder_resident(encoder: Component, where: str, chips: int) -> int:
    """Parameters of a text encoder that one of `chips` holds between encodes where the placement puts it,
    `where`: none on the host ("cpu"), all of them replicated ("device", or "sharded" on one chip), or, sharded
    (FSDP, as Wan's --t5_fsdp wraps each layer), its share of the layers and the root unit whole (the token
    embedding and whatever sits outside the layer list: FSDP gathers it for the whole forward and keeps it)."""
    if where == "cpu":
        return 0
    if where == "sharded" and chips > 1:
        return -(-(encoder.parameters - encoder.root_parameters) // chips) + encoder.root_parameters
    return encoder.parameters


@dataclass(frozen=True)
class DecodeShare:
    """What one chip decodes of one sample's frames under ``placement.vae_decode``."""

    working_pixels: int  # pixels of a frame whose working set it holds at once: the image, a tile, its rows
    computed_pixels: int  # pixels of a frame it decodes: overlapping tiles decode more than the image
    pieces: int  # decodes it runs per latent frame: one, or a tile each


def decode_share(vae: Component, mode: str, height: int, width: int, chips: int) -> DecodeShare:
    """'full': the whole image; 'tiled': diffusers' tiled decode (only where the image exceeds the VAE's tile):
    tiles of ``vae.tile`` starting every ``vae.tile_stride`` pixels, edge tiles cut at the image, one at a time;
    'parallel': the image's rows split over the `chips` that decode it (xDiT's parallel VAE; the halo rows each
    chip also decodes are left out)."""
    pixels = height * width
    (tile_h, tile_w), (stride_h, stride_w) = vae.tile, vae.tile_stride
    if mode == "tiled" and tile_h and (height > tile_h or width > tile_w):
        rows = [min(tile_h, height - i) for i in range(0, height, stride_h)]
        cols = [min(tile_w, width - j) for j in range(0, width, stride_w)]
        return DecodeShare(max(rows) * max(cols), sum(rows) * sum(cols), len(rows) * len(cols))
    if mode == "parallel" and chips > 1:
        rows = -(-height // chips)
        return DecodeShare(rows * width, rows * width, 1)
    return DecodeShare(pixels, pixels, 1)


def frame_growth(vae: Component, arch: Architecture, frames: int) -> float:
    """What a video VAE's working set per pixel gains past the latent frames it was measured at (LTX-Video's decoder
    holds every frame at once); 0 for an image, or a card without the figure."""
    if not vae.working_latent_frames:
        return 0.0
    more = arch.latent_frames(frames) - vae.working_latent_frames
    return vae.working_bytes_per_pixel_per_latent_frame * max(0, more)


def vae_decode_bytes(working_bytes_per_pixel: float, arch: Architecture, height: int, width: int, frames: int,
                     itemsize: int, share: DecodeShare | None = None, growth: float = 0.0,
                     copies: int = 0) -> int:
    """Peak bytes of one sample's decode: the card's working set per pixel of one frame (measured in bfloat16, 2 bytes
    an element; for a video VAE, a decode in its steady state: a latent frame after the first with its causal
    caches, a batch of latent frames, or a temporal tile, as the VAE decodes) over the pixels held at once (`share`:
    the whole image by default, a tile, or one chip's rows), beside the decoded image or video (3 channels x every
    frame) it hands back: a whole video twice where the VAE concatenates decoded pieces into it (``torch.cat``),
    once where one decoder call makes it (`copies`). Under tiling every decoded tile is kept to blend, and the blend
    (its rows, then their ``torch.cat``) holds two more copies of the image after the last tile's working set is
    freed (Wan's tiled decode clamps into a third, left out). `growth`: bytes per pixel the working set gains over
    the video's latent frames past those it was measured at (see `frame_growth`); `copies`: 0 (not known) counts as
    two for a video."""
    pixels = height * width
    share = share or DecodeShare(pixels, pixels, 1)
    image = 3 * frames * itemsize  # bytes per pixel of the decoded output
    working = int((working_bytes_per_pixel + growth) * share.working_pixels * itemsize / 2)
    if share.pieces > 1:
        return image * share.computed_pixels + max(working, image * 2 * pixels)
    copies = (copies or 2) if arch.is_video and frames > 1 else 1
    return working + image * copies * pixels


def _batch_split(plan: Plan, strategy: Strategy) -> int:
    axis = strategy.activations.batch
    return plan.mesh.size(axis) if axis else 1


def block_activation_bytes(plan: Plan, strategy: Strategy, tokens: TokenCounts, xla: bool = False,
                           score_buffers: ScoreBuffers | None = None) -> int:
    """Peak working set of the heaviest block on one chip (see ACTIVATION_METHOD); `xla`: the plan runs as XLA's
    program (TPUs: meshlab.plan.axes.heads_gathered); `score_buffers`: the keys a row at which the chip's math
    attention changes how many float32 score buffers it holds (`ScoreBuffers`; None: two, whatever the keys)."""
    itemsize = DTYPE_BYTES[strategy.workload.dtype]
    batch = -(-strategy.workload.batch // _batch_split(plan, strategy))
    sequence_axes = strategy.activations.sequence_axes
    split_image = math.prod(plan.mesh.size(a) for a in sequence_axes)
    text_split = rules_split_text(strategy.activations.rules, sequence_axes)
    local = local_token_counts(tokens, split_image, plan.card, text_split)
    ring = ring_axes(strategy.activations)
    shape = _Shape(tokens, local, activation_axes(strategy.activations, plan.mesh), strategy.workload.flash_attention,
                   strategy.activations.ring, math.prod(plan.mesh.size(a) for a in ring), itemsize,
                   *(heads_gathered(strategy.workload.flash_attention, batch, xla, split_image > 1, linear,
                                    kernel_marked(strategy.activations.rules)) for linear in (False, True)),
                   score_buffers or ScoreBuffers(), xla)
    blocks: dict[int, list[PlannedParameter]] = defaultdict(list)
    for p in plan.parameters:
        if p.parameter.block is not None:
            blocks[p.parameter.block].append(p)
    attention_by_module = {a.module: a for a in plan.card.attention}
    in_block = defaultdict(list)  # each block's attention modules, by the block its q projection is in
    for a in plan.card.attention:
        if a.qkv:
            in_block[block_position(a.qkv[0])].append(a)
    kinds = {_block_kind(params, in_block): params for params in blocks.values()}
    peak = max((_block_elements(params, attention_by_module, plan, shape) for params in kinds.values()), default=0)
    return peak * batch * itemsize


def _block_kind(params: list[PlannedParameter], in_block: dict) -> tuple:
    """What `_block_elements` reads of a block, its paths relative to the block (``attn.to_q``): blocks of one kind
    hold the same working set, so one of each is priced (Qwen-Image's 60 blocks are one kind)."""
    position = block_position(params[0].parameter.module)
    if position is None:
        return (id(params),)  # not a numbered block: its own kind
    cut = len(f"{position[0]}.{position[1]}.")
    own = tuple((p.parameter.module[cut:], p.parameter.shape, p.spec, p.parameter.is_bias, p.parameter.stream)
                for p in params)
    attentions = tuple((a.module[cut:], a.heads, a.head_dim, a.streams, tuple(m[cut:] for m in a.qkv),
                        tuple(m[cut:] for m in a.out), a.keys, a.fused_width, a.kind, a.masked)
                       for a in in_block[position])
    return (position[0], own, attentions)


@dataclass(frozen=True)
class ScoreBuffers:
    """The keys a row at which a chip's program of torch's math attention changes how many float32 buffers of a
    block's scores it holds (`_attention_elements`): one up to `fused`, one again, the scores alone, past
    `recomputed`, two between; a masked attention's mask broadcast besides past `mask_broadcast`. The chip's catalog
    figures ``Hardware.fused_softmax_keys``, ``recomputed_softmax_keys`` and ``mask_broadcast_keys``; the defaults
    (none given) hold two whatever the keys."""

    fused: int | float = 0
    recomputed: int | float = math.inf
    mask_broadcast: int | float = math.inf

    @classmethod
    def of(cls, hardware) -> "ScoreBuffers":
        """`hardware`'s figures (a meshlab.core.hardware.Hardware), none given read as the defaults."""
        return cls(hardware.fused_softmax_keys or 0, hardware.recomputed_softmax_keys or math.inf,
                   hardware.mask_broadcast_keys or math.inf)


@dataclass(frozen=True)
class _Shape:
    tokens: TokenCounts  # per sample, whole
    local: TokenCounts  # per sample on one chip (see meshlab.plan.tokens.local_token_counts)
    gathered: frozenset[str]  # axes that split activations: weights split over them are gathered (FSDP)
    flash: bool
    ring: str = "gather"  # Activations.ring (from sequence_parallel)
    ring_degree: int = 1  # chips in one ring (the sequence axes that are not Ulysses')
    itemsize: int = 2  # bytes of one element of the workload's dtype
    heads_gathered: bool = False  # every head on every chip (meshlab.plan.axes.heads_gathered)
    linear_heads_gathered: bool = False  # the same for a linear attention, which no flash kernel runs
    score_buffers: ScoreBuffers = ScoreBuffers()  # math attention: where its float32 score buffers change in number
    #: XLA:TPU's program (`block_activation_bytes`' xla): q, k and v not copied to float32, and where every head is
    #: gathered, not held as the chip's projections beside the gathered ones (`_attention_elements`)
    xla: bool = False


def _block_elements(params, attention_by_module, plan: Plan, shape: _Shape) -> int:
    width = plan.card.architecture.hidden_size
    linears = plan.card.linear_modules
    weights = {p.parameter.module: p for p in params if p.parameter.module in linears and not p.parameter.is_bias}
    residual = 2 * shape.local.joint * width
    attention_phase, attention_modules = 0, set()
    for attention in attention_by_module.values():
        if attention.qkv and attention.qkv[0] in weights:
            attention_phase = max(attention_phase, _attention_elements(attention, weights, plan, shape))
            attention_modules.update(attention.qkv + attention.out)
    mlp_phase = max((2 * _output_elements(w, plan, shape) for m, w in weights.items()
                     if m not in attention_modules and w.parameter.stream != "conditioning"), default=0)
    return residual + max(attention_phase, mlp_phase)


def _output_elements(weight: PlannedParameter, plan: Plan, shape: _Shape) -> int:
    out_features = weight.shape[0]
    return shape.local.of_stream(weight.parameter.stream) * -(-out_features // compute_split(weight.spec.entries[0], plan.mesh, shape.gathered))


def _attention_elements(attention, weights, plan: Plan, shape: _Shape) -> int:
    """q/k/v at the local tokens (on a TPU whose program gathers every head, q, k and v of every head in their
    place), plus k and v of the tokens other chips hold when a sequence axis splits them (every query needs every
    key: the all-gather's output), the output, and scores without flash. A ring that passes blocks (p2p-passes)
    holds its own block and the next one instead of every key; a ring of passes keeps its running output in float32
    (two bf16 elements each) beside the pass's. A linear attention holds q, k and v, its float32 output of
    head_dim + 1 rows a head, and in eager PyTorch float32 copies of q, k and v.

    Without flash the attention is torch's math attention (``_scaled_dot_product_attention_math``), which since
    torch 2.5 computes a bf16 or float16 attention in float32 unless
    ``torch.backends.cuda.allow_fp16_bf16_reduction_math_sdp(True)``: q, k and v are copied to float32, and the
    scores and the probabilities, both held at the softmax, are float32. Eager PyTorch holds those copies; XLA:TPU
    fuses each convert into the matmul that reads it and holds none (`shape.xla`): what its working set holds at
    its peak (`meshlab check --backend tpu`'s at_peak) is the two score buffers and bf16 activations, no float32 q, k
    or v (2d.yaml at 1024², 3 blocks; seq8-model2.yaml there too, every head gathered, where the copies would be 229
    MiB); over the matrix at each workload's size (benchmarks/results/tpu_matrix_workload_temporaries.json)
    pricing them put meshlab at 0.98 to 1.37x of XLA:TPU's working set, without them 0.97 to 1.15x; a linear
    attention's (SANA's) are not held either (below). XLA:TPU's program of 2d.yaml at full depth
    (torch_xla's, 1024², v6e-8) holds two f32[6,4608,4608] buffers at its peak, 972 MiB of its 1.21 GiB of
    temporaries; with at most the chip's ``fused_softmax_keys`` keys a row, unless every head is gathered under a
    sequence split, it holds one (the softmax fused into the scores: 2d at 512² to 960², 1536 to 4096 keys, but for
    640²'s 2112, where it fuses the whole attention and holds none), and with more than its
    ``recomputed_softmax_keys`` one again, the scores alone, which the softmax's sum and the values' matmul each read
    to recompute the probabilities (2d at 1408² with 452 text tokens, 8196 keys; HunyuanVideo at 8480), unless the
    probabilities meet values left split (`values_summed`; `python benchmarks/tpu_working_set.py`). Where it holds
    two up to ``recomputed_softmax_keys`` and a row has more than ``mask_broadcast_keys``, a self- or joint
    attention called with a mask (``Attention.masked``) and split by no ring (no sequence split, or Ulysses alone)
    holds the mask broadcast to every head and query besides."""
    qkv = sum(_output_elements(weights[m], plan, shape) for m in attention.qkv if m in weights)
    split = compute_split(weights[attention.qkv[0]].spec.entries[0], plan.mesh, shape.gathered)
    # heads split over chips are gathered (meshlab.cost.collectives gathers them only then)
    gathered = (shape.linear_heads_gathered if attention.is_linear else shape.heads_gathered) and split > 1
    heads = -(-attention.heads // (1 if gathered else split))
    queries = sum(shape.local.of_stream(s) for s in attention.streams)
    if attention.is_linear:  # a float32 output of head_dim + 1 rows per head; no keys of other chips, no scores
        fp32 = 4 // shape.itemsize  # (the per-head state is head_dim x (head_dim + 1))
        output = fp32 * queries * heads * (attention.head_dim + 1)
        if shape.xla:  # XLA:TPU fuses the converts to float32 and v's padding row into the matmuls (SANA's at 1024²,
            # torch_xla's program, `meshlab check --backend tpu`: one sample a chip, its heads split, it holds q, k
            # and v in bf16 and the f32[1,35,33,1024] output; two, every head gathered, the gathered q, k and padded
            # v, bf16[2,70,1024,32], bf16[2,2240,1024] and bf16[2,70,33,1024], and the f32[140,33,1024] output, not
            # the projections it gathered them from)
            return (queries * heads * (3 * attention.head_dim + 1) if gathered else qkv) + output
        # eager PyTorch (which gathers no head: meshlab.plan.axes.heads_gathered): float32 copies, v's padded with
        # a row a head
        return qkv + fp32 * (qkv + queries * heads) + output
    local_keys = sum(shape.local.of_stream(s) for s in attention.key_streams)
    keys = sum(shape.tokens.of_stream(s) for s in attention.key_streams)
    passes = shape.ring in ("gather-passes", "p2p-passes") and shape.ring_degree > 1
    held = 2 * -(-keys // shape.ring_degree) if passes and shape.ring == "p2p-passes" else keys
    gathered_kv = 2 * max(0, held - local_keys) * heads * attention.head_dim
    output = queries * heads * attention.head_dim * (3 if passes else 1)
    values = keys
    every_key = gathered and local_keys < keys  # every head at every key under a sequence split
    summed = every_key and values_summed(split, shape.ring_degree)
    if every_key:  # counted below (meshlab.plan.axes.values_summed):
        gathered_kv = 0  # the values gathered whole or left split; the products summed in float32
        if summed:
            values, output = -(-keys // split), output * 4 // shape.itemsize
    if shape.flash:
        return qkv + gathered_kv + output
    fp32 = 4 // shape.itemsize  # elements of the workload's dtype in one float32
    copied = fp32 > 1 and not shape.xla  # eager PyTorch's float32 q, k and v; XLA:TPU fuses each convert into its dot
    upcast = fp32 * (queries + held + min(held, values)) * heads * attention.head_dim if copied else 0
    # the probabilities beside the scores, or fused into them up to fused_softmax_keys keys a row, but where every
    # head meets every key under a sequence split (above: the probabilities then meet values split otherwise):
    # CogVideoX over seq 2 x model 4 at 3360 keys holds both with two samples a chip, one with one sample a chip (its
    # heads split), and cog-2d one with two samples a chip (no split: cog-seq2-model4.yaml, cog-2d.yaml at 256²,
    # --batch 1 and 4; a plan whose values are summed: with them gathered below 4096 keys, not measured); a
    # cross-attention's (text keys) fused as a self-attention's, not measured apart. Past
    # recomputed_softmax_keys the scores alone, but where the probabilities meet values left split (summed):
    # HunyuanVideo at 8480 keys, every head gathered, over seq 4 x model 2 (values gathered) holds one, over seq 2 x
    # model 4 (summed) both (hunyuan-seq4-model2.yaml, hunyuan-seq2-model4.yaml at 256²)
    fused = keys <= shape.score_buffers.fused and not every_key
    buffers = 1 if fused or (keys > shape.score_buffers.recomputed and not summed) else 2
    # a masked attention's mask broadcast to every head and query besides, once a forward, live at every block's
    # peak: Qwen-Image's program from 5244 keys to 8192, HunyuanVideo's at 6432. Where no ring splits the tokens at
    # the kernel (ring_degree 1: no sequence split, Ulysses, or a sequence axis the kernel leaves whole): with one
    # sample a chip (2d's rules), two (cfg 2 x model 4, its buffer two samples' scores) and under Ulysses over seq 2 x
    # model 4 (ulysses-largest-seq2-model4.yaml) it holds it; under seq 2 x model 4 gathering the keys (a ring of
    # degree 2, every head gathered) not (seq2-model4.yaml; tpu_working_set_mask.json, 5244 keys), nor at 8480
    # (HunyuanVideo, the values summed: the only two buffers past recomputed_softmax_keys); a ring with its heads
    # split and a cross-attention (its text keys) not measured, not priced. Measured as torch_xla's partitioner runs
    # it; a plan naming diffusers' or xDiT's sequence parallelism on a TPU is priced the same
    if (attention.masked and not attention.keys and shape.ring_degree == 1 and buffers == 2
            and keys > shape.score_buffers.mask_broadcast):
        buffers += 1
    scores = fp32 * buffers * heads * queries * keys
    every_head = (queries + keys + values) * heads * attention.head_dim if gathered else 0  # q, k and v gathered
    # every head gathered on a TPU: the gathers consume the chip's projections, which its program no longer holds at
    # the attention's peak (cfg2-model4.yaml at 256², sana-data2-model2.yaml at 1024²: benchmarks/tpu_phases.py)
    projections = 0 if gathered and shape.xla else qkv
    return projections + gathered_kv + output + upcast + scores + every_head
