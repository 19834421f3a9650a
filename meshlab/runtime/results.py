"""What each torch worker hands back (``meshlab.runtime.protocol``): one pydantic model per payload, the ``ok`` of
its result file, and one for what a gloo rank hands its parent (``meshlab.workers.ranks``).

The worker builds plain data; the parent reads the payload through the worker's model (``call_worker(...,
payload=...)``, ``spawn(..., result=...)``) before it uses a field, so a field one side renames or retypes is one
BackendError naming it, not a KeyError deep in the parent. No torch here: the parent side imports this.
"""

from __future__ import annotations

from typing import Any, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field

from meshlab.core.profile_file import DeviceFile, PointFile


class Payload(BaseModel):
    """A worker's payload, as the parent reads it from the result's JSON: closed, immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="constants")


Seconds = dict[str, float]  # what each phase took, by name


# ---- meshlab check (XLA's partitioner on CPU devices): meshlab.workers.check_xla ----


class ReadSharding(Payload):
    """One parameter as torch_xla placed it."""

    sharding: str = Field(description="torch_xla's sharding string")
    slices: list[list[tuple[int, int]]] = Field(description="per device (by id), [start, stop) of every dim it holds")
    dtype: str


class ForwardTransfers(Payload):
    from_device: int
    to_device: int
    syncs: int
    causes: dict[str, int] = Field(description="torch_xla counter -> transfers it caused")


class CheckForward(Payload):
    """One forward of the check: graphs compiled, seconds, transfers, and the dump files it wrote."""

    compiles: int
    seconds: float
    compile_seconds: float
    host_transfers: ForwardTransfers
    dump_files: list[str]


class XlaCheckJob(Payload):
    """One strategy checked on XLA's CPU devices."""

    device_type: str
    device_count: int
    device_ids: list[int] = Field(description="the device id at each mesh position")
    parameters: dict[str, ReadSharding]
    forwards: list[CheckForward]
    scanned: list[str]
    max_abs_error: float
    reference_max_abs: float
    timings: Seconds


class XlaCheckPayload(Payload):
    results: list[XlaCheckJob]


# ---- meshlab check --backend dtensor: meshlab.workers.check_dtensor, one result per rank ----


class LocalParameterRead(Payload):
    """One parameter as planned and as DTensor holds it on one rank (``readback.LocalParameter.to_json``)."""

    name: str
    shape: list[int]
    predicted_spec: list[Union[str, list[str], None]]
    predicted_placements: str
    placements: str
    predicted_shard_shape: list[int]
    shard_shape: list[int]
    holds_its_slice: bool
    agrees: bool


class DTensorRankCheck(Payload):
    """One rank's view of one checked strategy (rank 0's also holds the output's error)."""

    rank: int
    position: int = Field(description="the rank's position in the plan's row-major device numbering")
    parameters: list[LocalParameterRead]
    local_weight_bytes: int
    collectives: dict[str, int] = Field(description="kind -> count DTensor issued in the forward")
    collectives_per_module: dict[str, dict[str, int]]
    timings: Seconds
    max_abs_error: Optional[float] = None
    reference_max_abs: Optional[float] = None


class DTensorCheckPayload(Payload):
    results: list[list[DTensorRankCheck]] = Field(description="per job, per rank")


# ---- meshlab check --backend tpu: meshlab.workers.check_tpu ----


class FrontEndFailed(Payload):
    front_end: str
    error: str
    problem: str = ""  # the error without its fix (a meshlab error's)
    fix: str = ""  # where the failure is the input's: how to fix it
    #: the input's to fix (exit 2), not the backend's (exit 3): "lowering", a class the front end cannot lower;
    #: "host-memory", a trace too big for this host
    cause: Optional[Literal["lowering", "host-memory"]] = None


class PeakHolding(Payload):
    """Values of one kind XLA:TPU's program holds at its working set's peak (meshlab.check.hlo.PeakHolding)."""

    memory_space: str
    shape: str
    made_by: str
    count: int
    bytes: int


class FrontEndCompiled(Payload):
    """One front end's program, compiled by XLA:TPU ahead of time."""

    front_end: str
    trace_seconds: float
    compile_seconds: Optional[float]
    other_argument_bytes: dict[str, int]
    memory: Optional[dict[str, int]] = Field(description="XLA:TPU's memory analysis per chip")
    flops: Optional[float]
    bytes_accessed: Optional[float]
    hlo_file: Optional[str]
    mesh_device_ids: list[Any] = Field(description="the device id at each mesh position, nested as the mesh")
    schedule_file: Optional[str]
    out_of_memory: str
    required_bytes: Optional[int]
    temporaries_live_peak: Optional[int] = Field(
        None, description="the most temporary bytes live at once (XLA's buffer assignment and live ranges)")
    working_set_live_peak: Optional[int] = Field(
        None, description="the most bytes of temporaries live at once in HBM and on chip (VMEM; v4: CMEM), less the "
                          "on-chip copies of the arguments (the weights XLA:TPU prefetches there)")
    working_set_at_peak: list[PeakHolding] = Field(
        [], description="the 8 largest kinds of value live at that peak (meshlab.check.hlo.working_set_peak)")
    memory_spaces: dict[str, int] = Field(
        {}, description="bytes the buffer assignment placed in each memory space: 'default' (HBM), 'vmem' "
                          "(v4: 'cmem'), 'smem', ...")
    attention_calls: dict[str, int] = Field(
        {}, description="torchax's attention calls by how they ran: 'kernel' (the strategy's flash kernel) or "
                        "'reference' (torch's reference math: a call the kernel does not take)")


class TopologyDevice(Payload):
    id: int
    coords: list[int]


class TpuCheckPayload(Payload):
    results: list[Union[FrontEndFailed, FrontEndCompiled]]
    topology_devices: list[TopologyDevice]


# ---- meshlab profile: meshlab.workers.measure ----


class ProfilePayload(Payload):
    """The device, the versions and the measured points (the profile file's, before the parent adds the plan)."""

    device: DeviceFile
    versions: dict[str, Any]
    points: list[PointFile]


# ---- meshlab run: meshlab.workers.run_xla, run_torch, run_dtensor ----


class RunTimings(Payload):
    text_encode_s: float
    rope_warmup_s: float
    step_s: list[float]
    vae_decode_s: float
    total_s: float
    first_step_s: Optional[float]
    second_step_s: Optional[float]
    steady_step_median_s: Optional[float]


class RunSummary(Payload):
    """A run, everything but the image (``RunResult.summary``, or the stock pipeline's clock)."""

    device: str
    attention_backend: str
    mesh_shape: Optional[list[int]]
    mesh_axes: Optional[list[str]]
    text_tokens: list[int]
    timings: RunTimings
    counters: dict[str, Any] = Field(description="graphs compiled, compile seconds, CPU fallbacks, host transfers")
    warnings: list[str]


class MemoryRead(Payload):
    source: str
    peak_bytes_per_device: Optional[int] = None
    programs: Optional[int] = None
    weight_bytes_per_rank: Optional[list[int]] = None


class CacheRead(Payload):
    """Whether the compile cache was read: hits, misses, programs found but not loadable."""

    dir: str
    hits: int
    misses: int
    deserialize_failures: int
    hit: bool
    note: Optional[str] = None


class RanPayload(Payload):
    """What ran: the model (and its config's digest), batch, dtype, and the backend where it is not xla."""

    model: str
    config_digest: Optional[str]
    batch: int
    dtype: str
    backend: Optional[str] = None
    layers: Optional[int] = None


class RunPayload(Payload):
    """One pipeline run, from any run worker."""

    summary: RunSummary
    image: Optional[str] = None  # another rank than the writer under torchrun has none
    mismatches: list[str]
    memory: Optional[MemoryRead]
    is_writer: bool
    hardware: dict[str, Union[str, int]] = Field(description="what the worker saw: device_type, devices, ...")
    cache: Optional[CacheRead] = None
    scanned: list[str] = []
    ran: RanPayload
    max_abs_error: Optional[float] = None


class DTensorRankRun(Payload):
    """One gloo rank's run, before the parent joins the ranks into one RunPayload."""

    summary: RunSummary
    mismatches: list[str]
    weight_bytes: int
    is_writer: bool
    hardware: dict[str, Union[str, int]]
    ran: RanPayload
    image: Optional[str] = None
    pixels: Optional[str] = None


class BuiltPayload(Payload):
    """The tiny offline pipeline, built."""

    built: str


#: Every payload, for `meshlab schema worker-payload` (a union, like the requests)
WORKER_PAYLOADS = ("XlaCheckPayload", "DTensorCheckPayload", "TpuCheckPayload", "ProfilePayload", "RunPayload",
                   "BuiltPayload")
