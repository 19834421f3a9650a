"""The models of `meshlab try --json`, `compare --json` and `sweep --json` (see meshlab.core.document): what each
document holds, read back before it is printed and exported by `meshlab schema`. The functions that build them are
`try_document`, `compare.comparison_document` and `sweep.sweep_document`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from meshlab.core.document import Document
from meshlab.cost.document import AssumptionDocument, PredictionDocument
from meshlab.strategy.schema import Workload

Mesh = dict[str, int]


class StrategyNamed(Document):
    name: str
    file: str
    description: str


class ModelNamed(Document):
    name: str
    class_: str = Field(alias="class", description="the diffusers class of the transformer")
    source: str | None = Field(description="the diffusers version the card was imported from")


class HardwareNamed(Document):
    name: str
    chips: int
    usable_hbm_bytes: int
    overridden: list[str] = Field(description="the catalog figures the strategy overrides")


class Tokens(Document):
    image: int
    text: int
    reference: int = Field(0, description="a conditioning image's tokens (Wan 2.1 image-to-video's CLIP tokens)")


class RuleSummary(Document):
    """One sharding rule: what it matched, the specs it gave, and the bytes per chip of what it covers."""

    index: int
    pattern: str
    shard: str
    axis: list[str]
    matched: int
    specs: dict[str, int] = Field(description="spec -> parameters given it")
    bytes_per_device: int


class ParameterRow(Document):
    name: str
    shape: list[int]
    spec: list[str | list[str] | None] = Field(description="per dim: the mesh axis (or axes) it splits over, or null")
    shard_shape: list[int]
    bytes_per_device: int
    rule: int | None = Field(description="the index of the rule that placed it; null: none matched (replicated)")


class Coverage(Document):
    unmatched_rules: list[str]
    unmatched_parameters: int
    unmatched_bytes_per_chip: int
    unmatched_examples: list[str]
    padding_bytes_per_chip: int
    tile_padding_bytes_per_chip: int = Field(0, description="bytes a TPU's tiled layouts add to the weight shards")


class ChipBreakdown(Document):
    weights_sharded: int
    weights_replicated: int
    padding: int
    activations: int
    vae_weights: int
    vae_decode: int
    text_encoder: int
    text_encode: int = Field(description="the encode phase's working set: what the largest encode on the chips holds "
                             "at once (one prompt, as its card traced it), with a sharded encoder's gathered layer")
    reserve: int
    scan_stacked_weights: int = Field(description="compile.scan_blocks: the block weights stacked for the scan, "
                                      "live while denoising (0 unrolled)")
    tile_padding: int = Field(0, description="bytes a TPU's tiled layouts add to the weight shards (0 on a GPU)")
    gathered_weights: int = Field(0, description="FSDP: the heaviest block's weights gathered over the axes that "
                                  "split activations, priced as held beside the activations, twice where the chip "
                                  "runs the gathers async (denoise; 0 without FSDP)")
    buffers: int = Field(0, description="the transformer's floating buffers (SD3.5's positional table), whole on "
                         "every chip; counted in other_bytes")


class ChipMemoryRow(Document):
    """One chip's memory at its peak phase (bytes, predicted)."""

    chip: int
    weights_bytes: int
    activation_bytes: int
    other_bytes: int
    total_bytes: int
    hbm_bytes: int
    headroom_bytes: int
    breakdown: ChipBreakdown
    peak_phase: Literal["encode", "denoise", "decode"] = Field(description="the phase whose working set sets the peak")


class PredictedSummary(Document):
    """Time and cost per image, predicted (`meshlab compare --json` has every term)."""

    label: Literal["predicted"]
    latency_s: float
    seconds_per_image: float
    step_s: float
    steps: int
    images_per_call: int
    images_per_second: float
    usd_per_chip_hour: float | None
    usd_per_hour: float | None
    usd_per_image: float | None


class TryDocument(Document):
    """`meshlab try --json`: the plan, every parameter's placement, and memory per chip."""

    strategy: StrategyNamed
    model: ModelNamed
    hardware: HardwareNamed
    mesh: Mesh
    workload: Workload
    tokens: Tokens
    total_params: int
    rules: list[RuleSummary]
    parameters: list[ParameterRow]
    coverage: Coverage
    per_chip: list[ChipMemoryRow]
    most_loaded_chip: int
    chips_identical: bool
    fits: bool
    warnings: list[str]
    taken: list[str] = Field([], description="what planning took where the file left it out: its pipeline's "
                             "workload defaults and VAE dtype, its system's compile mode (try prints these lines "
                             "too)")
    activation_method: str
    predicted: PredictedSummary
    text_encoder: str | None = Field(None, description="try --model ...: where the text encoder went, and why")


class WorkFields(Document):
    """The workload fields that set the work of an image (meshlab.search.compare.WORK_FIELDS): plans are ranked
    among those that share these and the model."""

    height: int
    width: int
    frames: int
    steps: int
    cfg: bool
    text_tokens: int


class EntryWorkload(WorkFields):
    """What one call asks of the model: the batch, and the work of each image."""

    batch: int


class BestOfWorkload(WorkFields):
    """One model and workload, and its best plan (the fastest that fits)."""

    model: str
    best: str


class CompareEntry(Document):
    """One strategy, ranked among the plans of its model and workload."""

    rank: int = Field(description="1-based, among the plans of the same model and workload: fitting plans first, "
                      "each group by predicted seconds per image")
    best: bool = Field(description="the best of the plans of its model and workload")
    name: str
    file: str
    model: str
    hardware: str
    mesh: Mesh
    workload: EntryWorkload
    weights_bytes_per_chip: int
    peak_bytes_per_chip: int
    usable_hbm_bytes: int
    padding_bytes_per_chip: int
    tile_padding_bytes_per_chip: int = Field(0, description="bytes a TPU's tiled layouts add to the weight shards")
    fits: bool
    why_not_best: str
    predicted: PredictionDocument


class ComparisonDocument(Document):
    """`meshlab compare --json`: the strategies ranked, each with every predicted term."""

    label: Literal["predicted"]
    best: str | None = Field(description="the best plan, where every plan is for one model and one workload")
    best_per_model: dict[str, str] = Field(description="model -> its best plan, for each model whose plans share one "
                                           "workload")
    best_per_workload: list[BestOfWorkload] = Field(description="each model and workload (height, width, frames, "
                                                    "steps, cfg, text_tokens) with its best plan: plans are ranked "
                                                    "within these groups")
    notes: list[str]
    entries: list[CompareEntry]
    assumptions: dict[str, list[AssumptionDocument]] = Field(description="hardware -> the figures its times rest on")


class Goals(Document):
    max_seconds_per_image: float | None
    max_usd_per_image: float | None
    seconds: Literal["latency", "throughput"] = Field(
        "latency", description="what max_seconds_per_image holds: one request's wait (latency), or each image's "
        "share of a call (the throughput objective)")


class Binding(Document):
    """The term a plan's time is bound by, its share, and what would move it."""

    term: str
    seconds_per_image: float | None = Field(description="null for HBM capacity (nothing fits)")
    share: float | None
    move: str


class Closest(Document):
    name: str
    misses: str
    binding: Binding


class Candidate(Document):
    """One plan the sweep tried: dropped (and why), or planned, fitted and priced."""

    name: str
    family: str
    hardware: str | None
    mesh: Mesh
    dcn: Mesh | None = None
    batch: int
    fits: bool
    dropped: str
    peak_bytes_per_chip: int | None = None
    headroom_bytes_per_chip: int | None = None
    predicted: PredictionDocument | None = None
    latency_s: float | None = None
    text_encoder: Literal["device", "host"] | None = None
    vae_decode: str | None = None
    meets_goals: bool | None = None
    usd_per_image_over_images: float | None = None


class SystemBest(Document):
    """One system's best plan by the objective (within 2% of the first: the cheaper) and what binds it."""

    hardware: str
    chips: int
    usd_per_chip_hour: float | None
    best: str | None
    latency_s: float | None
    seconds_per_image: float | None
    usd_per_image: float | None
    usd_per_image_over_images: float | None = None
    time_to_first_image_s: float | None
    compile: Literal["measured", "modelled"] | None  # a TPU plan's XLA:TPU compile measured or not (None: a GPU)
    fitting: int
    dropped: int
    binding: Binding


class SweepDocument(Document):
    """`meshlab sweep --json`: every candidate, the fronts, and the best plan by each objective."""

    label: Literal["predicted"]
    hardware: str | list[str]
    devices: int | dict[str, int]
    default_systems: list[str]
    goals: Goals
    usd_per_image_over: int | None
    candidates: list[Candidate]
    pareto_front: list[str]
    cost_front: list[str]
    objective: str
    best: str | None
    lowest_latency: str | None
    highest_throughput: str | None
    cheapest: str | None
    closest: Closest | None
    systems: list[SystemBest]
    sweep_seconds: float | None
    assumptions: list[AssumptionDocument] | dict[str, list[AssumptionDocument]]
    workload: Workload
    workload_basis: str
    written: str | None  # the file the best plan was written to (--out), None where none was or it went to stdout

