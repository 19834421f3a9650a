"""The models of `meshlab check --json` for each backend (see meshlab.core.document): XLA's partitioner on CPU
devices (`verdict.check_document`), DTensor on gloo ranks (`against_dtensor.dtensor_check_document`) and XLA:TPU
ahead of time (`against_tpu.tpu_check_document`). The three share their first keys; each holds meshlab's
prediction beside what its backend did."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from meshlab.core.document import Document

#: collective kind (all-reduce, all-gather, ...) -> a count or bytes
ByKind = dict[str, int]
#: block ("transformer_blocks.30", or "outside blocks") -> its collectives by kind
ByBlock = dict[str, ByKind]
Spec = list[str | list[str] | None]


class StrategyRef(Document):
    name: str
    file: str


class CheckedModel(Document):
    name: str
    class_: str = Field(alias="class")
    blocks: dict[str, int] = Field(description="block list -> blocks compiled in the check")
    full_blocks: dict[str, int] = Field(description="block list -> blocks in the whole model")


class CheckOptions(Document):
    layers: int
    height: int
    width: int
    text_tokens: int
    frames: int | None
    seed: int
    scan: bool | None
    batch: int | None = None


class CheckedForward(Document):
    batch: int
    image_tokens: int
    text_tokens: int
    dtype: str


class CheckedDevice(Document):
    type: str
    count: int


class XlaParameter(Document):
    """One parameter as planned and as XLA placed it."""

    name: str
    shape: list[int]
    predicted_spec: Spec
    predicted_sharding: str
    xla_sharding: str
    predicted_shard_shape: list[int]
    xla_shard_shape: list[int]
    misplaced_devices: list[int]
    agrees: bool
    problem: str | None = None


class HloCollective(Document):
    """One collective of the compiled program."""

    kind: str
    shape: list[int] | list[list[int]]
    dtype: str | None
    bytes_per_device: int
    mesh_axes: list[str]
    layer: str | None
    block: str | None = Field(None, description="the block it counts for: its op's module scope's block, or (a "
                              "scanned loop body's op, whose name has no scope) the scanned list's middle block")
    async_: bool = Field(alias="async")


class XlaWeights(Document):
    predicted: int
    xla: int
    full_depth_predicted: int
    full_depth_xla: int


class BufferAssignment(Document):
    """XLA's buffer assignment on the CPU device, by kind (bytes)."""

    parameters: int
    temporaries: int
    outputs: int
    constants: int
    total: int


class MeshlabMemory(Document):
    weights: int
    activations: int
    scan_stacked_weights: int = Field(description="the block weights stacked for a scan (0 unrolled)")
    gathered_weights: int = Field(0, description="FSDP: a block's weights gathered, priced as held beside the "
                                  "activations, two blocks' where the chip gathers them async (0 without)")
    buffers: int = Field(0, description="the transformer's floating buffers (SD3.5's positional table), whole on "
                         "every chip")
    total: int = Field(description="weights, buffers, activations, FSDP's gathered weights and any stacked weights")


class HostTransfers(Document):
    from_device: int
    to_device: int
    syncs: int
    causes: dict[str, int]


class ForwardRun(Document):
    compiles: int
    seconds: float
    compile_seconds: float | None = None
    host_transfers: HostTransfers | None = None


class XlaFlops(Document):
    predicted: float
    xla_dots: float | None
    ratio: float | None
    what: str


class CheckDocument(Document):
    """`meshlab check --json` (XLA's partitioner on CPU devices)."""

    strategy: StrategyRef
    model: CheckedModel
    device: CheckedDevice
    options: CheckOptions
    forward: CheckedForward
    agrees: bool
    mismatches: list[str]
    collective_differences: list[str]
    compile_seconds: float | None
    compile_seconds_full_depth_extrapolated: float | None
    scanned: list[str]
    host_transfers: HostTransfers | None
    parameters: list[XlaParameter]
    weights_per_device: XlaWeights
    collectives: list[HloCollective]
    collectives_per_block: ByBlock
    collectives_full_depth: ByKind
    collective_bytes_per_block: ByBlock
    collective_bytes_full_depth: ByKind
    predicted_collectives_per_block: ByBlock
    predicted_collectives_full_depth: ByKind
    xla_memory_per_device: BufferAssignment | None
    meshlab_memory_per_device: MeshlabMemory
    max_abs_error: float
    reference_max_abs: float
    tolerance: float
    forwards: list[ForwardRun]
    timings_seconds: dict[str, float]
    hlo_module: str | None
    flops_per_device: XlaFlops
    caveats: dict[str, str]


class DTensorDevice(Document):
    type: Literal["cpu"]
    count: int
    process_group: Literal["gloo"]


class RankedParameter(Document):
    """One parameter on every rank: the plan's placements and local shapes against what each rank holds."""

    name: str
    shape: list[int]
    predicted_spec: Spec
    predicted_placements: str
    placements: str
    predicted_shard_shape: list[int]
    shard_shape: list[int]
    predicted_shard_shapes_per_rank: list[list[int]]
    shard_shapes_per_rank: list[list[int]]
    disagreeing_ranks: list[int]
    agrees: bool


class RankWeights(Document):
    predicted: list[int]
    dtensor: list[int]


class DTensorCheckDocument(Document):
    """`meshlab check --backend dtensor --json`."""

    backend: Literal["dtensor"]
    strategy: StrategyRef
    model: CheckedModel
    device: DTensorDevice
    options: CheckOptions
    forward: CheckedForward
    agrees: bool
    mismatches: list[str]
    parameters: list[RankedParameter]
    weights_per_rank: RankWeights
    collectives_issued: ByKind
    collectives_issued_per_block: ByBlock
    predicted_collectives_per_block: ByBlock
    collectives_note: str
    max_abs_error: float
    reference_max_abs: float
    tolerance: float
    timings_seconds: dict[str, float]


class TpuDevice(Document):
    type: str = Field(description="the TPU target, e.g. 'TPU v6e:2x4'")
    count: int
    compiled: str


class TpuFits(Document):
    predicted: bool = Field(description="meshlab's verdict for the program compiled, with its attention (torch_xla's "
                            "materialises the scores): the verdict XLA:TPU's is held to")
    predicted_as_planned: bool = Field(description="meshlab's verdict for the plan as it runs, with its own attention "
                                       "(a flash kernel where the strategy says flash_attention); not held")
    xla: bool | None
    xla_as_planned: bool | None = Field(description="XLA:TPU's verdict for the other front end's program, where it has "
                                        "the plan's attention and the primary's has not (--front-end both: torchax's "
                                        "flash kernel beside torch_xla's stock attention): held to "
                                        "predicted_as_planned; null where the primary program has the plan's attention "
                                        "(torchax alone or as the fallback, or no flash_attention), or the other front "
                                        "end was not compiled or failed (its entry in front_ends says why)")
    xla_required_bytes: int | None
    usable_hbm_bytes: int
    xla_refusal: str


class TpuWeights(Document):
    predicted: int
    predicted_as_arguments: int
    xla: int | None


class PeakHolding(Document):
    """Values of one kind XLA:TPU's program holds at its working set's peak."""

    memory_space: str = Field(description="'hbm', or the on-chip memory: 'vmem' (v4: 'cmem')")
    shape: str = Field(description="the value's array, e.g. 'f32[24,4608,4608]' ('' for a tuple's: pointers)")
    made_by: str = Field(description="the module and op that made it, its block number as '*' "
                         "('transformer_blocks.*.attn: softmax'); 'copy of' what memory-space assignment copied, "
                         "'copy of an argument' for a weight or input; else the instruction's opcode")
    count: int
    bytes: int = Field(description="all `count` of them, as allocated")


class TpuMemory(Document):
    """XLA:TPU's memory analysis per chip (bytes)."""

    arguments: int
    outputs: int
    temporaries: int
    generated_code: int
    aliased: int
    total: int | None
    other_arguments: dict[str, int] = Field(description="arguments that are not weights (inputs, tables, scalars)")
    temporaries_live_peak: int | None = Field(
        None, description="the most temporary bytes live at once; the temp buffer packs them with gaps")
    working_set_live_peak: int | None = Field(
        None, description="the most temporary bytes live at once in HBM and on chip (the TensorCore's VMEM, v4's CMEM) "
        "together, less the weights prefetched there: the forward's working set wherever XLA:TPU placed it, what "
        "meshlab's is held to")
    at_peak: list[PeakHolding] = Field(
        [], description="what XLA:TPU's program holds at that peak: the 8 largest kinds of value live then, each by "
        "memory space, array, the module and op that made it, count and bytes, each byte once (all kinds sum to "
        "working_set_live_peak; the rest are the smaller ones): the figure meshlab's working set is held to, made "
        "checkable")
    vmem: int | None = Field(None, description="bytes the program placed in the TensorCore's VMEM (the weights "
                             "prefetched there, most of it, and temporaries kept there); not part of the HBM total")
    cmem: int | None = Field(None, description="on v4, bytes the program placed in the chip's CMEM (XLA's report names "
                             "it 'hbm', color 3), which v4's memory-space assignment fills as others fill VMEM; not "
                             "part of the HBM total")


class TpuMeshlabMemory(Document):
    weights: int
    activations: int
    activations_as_compiled: int | None = Field(
        description="the denoise working set with the attention the front end compiles (and any scan's stacked "
        "weights): what XLA:TPU's temporaries are held to")
    vae_decode: int
    scan_stacked_weights: int
    gathered_weights: int = Field(0, description="FSDP: a block's weights gathered, priced as held beside the "
                                  "activations, two blocks' where the chip gathers them async (0 without)")
    buffers: int = Field(0, description="the transformer's floating buffers (SD3.5's positional table), whole on "
                         "every chip: XLA:TPU's program takes them as arguments that are not weights")
    total: int = Field(description="weights, buffers, activations, FSDP's gathered weights and any stacked weights: "
                       "the plan's, with its own attention")
    total_as_compiled: int = Field(description="total with the attention the front end compiled "
                                   "(activations_as_compiled): what fits.predicted holds")


class CountsAndBytes(Document):
    count: ByKind
    bytes: ByKind


class TpuFlops(Document):
    predicted: float
    xla: float | None
    what: str


class TpuBytes(Document):
    """meshlab's HBM bytes of one forward beside XLA:TPU's bytes accessed."""

    predicted: float
    xla: float | None
    what: str


class XlaSchedule(Document):
    """XLA:TPU's latency-hiding scheduler's estimate (its cost model, not a measurement)."""

    total_s: float
    compute_s: float
    collective_s: float
    collective_s_by_kind: dict[str, float]
    wasted_s: dict[str, float]
    cycles_per_microsecond: float
    compute_s_by_op: dict[str, float] = Field(
        description="compute_s by what its ops are: matmuls (Linears), attention, elementwise and reductions, "
                    "copies, other ops, idle (meshlab.cost.compiled_call.OP_CLASSES)")
    kernel_s_by_op: dict[str, float] = Field(
        {}, description="of compute_s_by_op, what Pallas kernels hold (a flash attention's custom call): XLA:TPU "
                        "times each by the cost estimate the kernel declares (its FLOPs at the MXU's peak), not by "
                        "a model of its own")
    what: str


class PredictedCall(Document):
    """meshlab's seconds for one transformer call, term by term."""

    total_s: float
    compute_s: float
    collective_s: float
    collective_s_by_kind: dict[str, float]
    compute_s_by_op: dict[str, float] = Field(
        description="compute_s by the class of XLA:TPU's ops that runs each op (meshlab.cost.compiled_call.OP_TERMS)")
    flops_by_op: dict[str, float]
    hbm_bytes_by_op: dict[str, float]
    bound_by_op: dict[str, Literal["FLOPs", "HBM"]] = Field(
        description="which of its FLOPs and HBM bytes sets more of the class's predicted time")
    overlap: str


class FrontEndFailed(Document):
    front_end: str
    error: str


class FrontEndCompiled(Document):
    front_end: str
    compile_seconds: float | None
    memory: TpuMemory | None
    weights: int | None
    flops: float | None
    program_read: bool = Field(description="XLA:TPU's optimized program was read back (false where it refused the "
                               "program, or its proto could not be read)")
    out_of_memory: str = Field("", description="XLA:TPU's refusal to fit this front end's program, where it refused")
    required_bytes: int | None = Field(None, description="the bytes XLA:TPU asked for, where it refused")
    attention_kernels: int | None = Field(
        None, description="Pallas kernels the program calls: a flash attention kernel's calls (torchax's, where the "
                          "strategy says flash_attention; torch_xla's stock attention has none)")
    attention_calls: dict[str, int] = Field(
        {}, description="torchax's attention calls by how they ran: kernel (the strategy's flash kernel) or reference "
                        "(torch's reference math: a call the kernel does not take)")
    block_collectives: ByBlock | None = None
    outside_blocks: ByKind | None = None


class TpuCheckDocument(Document):
    """`meshlab check --backend tpu --json`: the CPU check's keys where they mean the same, XLA:TPU's figures as
    the truth."""

    backend: Literal["tpu"]
    strategy: StrategyRef
    model: CheckedModel
    device: TpuDevice
    options: CheckOptions
    forward: CheckedForward
    front_end: str | None
    libtpu_flags: list[str] = Field(description="the plan's XLA:TPU flags the program was compiled with")
    agrees: bool
    differences: list[str]
    fits: TpuFits
    compile_seconds: float | None
    compile_time_kept: str | None = Field(description="the file this whole plan's compile time went to, which its "
                                          "time to first image takes from then on (null: a cut model or another size)")
    trace_seconds: float | None
    weights_per_device: TpuWeights
    xla_memory_per_device: TpuMemory | None
    meshlab_memory_per_device: TpuMeshlabMemory
    middle_blocks: list[str]
    collectives_attributed_to_blocks: bool
    predicted_collectives_per_call: CountsAndBytes
    collectives_per_block: ByBlock
    async_collectives_per_block: ByBlock
    collective_bytes_per_block: ByBlock
    predicted_collectives_per_block: ByBlock
    predicted_collective_bytes_per_block: ByBlock
    collectives: list[HloCollective]
    flops_per_device: TpuFlops
    bytes_accessed_per_device: float | None
    hbm_bytes_per_device: TpuBytes
    xla_schedule: XlaSchedule | None
    xla_schedule_note: str
    predicted_call: PredictedCall
    front_ends: list[FrontEndFailed | FrontEndCompiled]
    hlo_files: dict[str, str]
