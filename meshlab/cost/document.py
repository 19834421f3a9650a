"""JSON documents of predictions: plain, ordered, deterministic; every figure under a ``predicted`` key. Each has
its model (meshlab.core.document) beside the function that builds it."""

from __future__ import annotations

from collections import Counter
from typing import Literal

from pydantic import Field

from meshlab.core.document import Document
from meshlab.core.hardware import Hardware
from meshlab.cost.predict import Prediction
from meshlab.cost.timing import Assumptions
from meshlab.plan.memory import gathers_mode
from meshlab.plan.planned import PlannedStrategy


class PerStepDocument(Document):
    """One denoising step on the busiest chip: its work, what each part takes, and the step it adds up to."""

    transformer_calls: int
    flops_per_chip: float
    hbm_bytes_per_chip: float
    compute_s: float
    hbm_s: float
    compute_or_hbm_s: float
    elementwise_bytes_per_chip: float
    elementwise_s: float | None = Field(description="null: inside a call a profile timed whole")
    collective_s: float
    dcn_s: float
    launch_wait_s: float
    host_dispatches: int
    launch_floor_s: float
    overhead_s: float
    step_s: float
    collective_bytes_per_chip: float
    roofline_s: float


class TermsDocument(Document):
    """One pipeline call's terms beside the denoising loop (seconds), and which of them the card cannot price."""

    text_encode_s: float
    denoise_s: float
    vae_decode_s: float
    transfer_s: float
    overhead_s: float
    unknown: list[str]


class FirstImageDocument(Document):
    """Time to first image: the startup (absent where nothing is priced for it) and the first call."""

    read_s: float | None = None
    transfer_s: float | None = None
    compile_s: float | None = None
    compiled_blocks: int | None = None
    stacked_blocks: int | None = Field(None, description="the blocks of the scanned lists, whose weights the compiled "
                                       "program stacks (0 unrolled)")
    checkpoint_bytes: int | None = None
    compile: Literal["measured", "modelled"] | None = Field(
        None, description="measured: XLA:TPU's compile of this plan and size ahead of time; modelled: the catalog's "
        "compile_seconds_base + compile_seconds_per_block x compiled_blocks + compile_seconds_per_scanned_block x "
        "stacked_blocks")
    startup_s: float | None = None
    first_call_s: float
    total_s: float
    usd: float | None


class CountAndBytes(Document):
    count: int
    bytes: int


class ExtrapolatedGemms(Document):
    below_measured_gemms: float
    above_measured_gemms: float


class CatalogPricedDocument(Document):
    """Priced from the catalog's assumed efficiencies (and measured GEMM or published attention rates)."""

    from_: Literal["catalog"] = Field(alias="from")
    measured: list[str]
    published: list[str]
    assumed: list[str]
    extrapolated: ExtrapolatedGemms


class ProfiledCollectives(Document):
    measured: int
    assumed: int


class ProfilePricedDocument(Document):
    """Priced from a profile's measurements: what was measured, what was assumed, how far it extrapolates."""

    from_: Literal["profile"] = Field(alias="from")
    basis: str
    measured: list[str]
    assumed: list[str]
    collectives: str | ProfiledCollectives
    extrapolated: float
    note: str


class RingAttentionDocument(Document):
    module: str
    count: int
    pass_s: float
    merge_s: float
    cast_s: float
    transfer_s: float
    exposed_transfer_s: float
    block_bytes: int
    attention_s: float
    one_kernel_s: float


class RingDocument(Document):
    """The attentions run as a ring, per transformer call on one chip."""

    implementation: str
    degree: int
    axes: list[str]
    attentions_per_call: int
    per_call_s: float
    as_one_kernel_per_call_s: float
    attentions: list[RingAttentionDocument]


class PredictionDocument(Document):
    """Everything meshlab predicts of one plan on its hardware (every figure predicted, none measured)."""

    label: Literal["predicted"]
    per_step: PerStepDocument
    seconds_per_image: float
    denoise_seconds_per_image: float
    terms: TermsDocument | None
    images_per_second: float
    usd_per_hour: float | None
    usd_per_image: float | None
    time_to_first_image: FirstImageDocument
    roofline_seconds_per_image: float
    mfu: float
    roofline_mfu: float
    model_flops_per_call_per_sample: float
    collectives_per_block: dict[str, int] = Field(description="kind -> count in one block, as issued")
    collectives_per_call: dict[str, CountAndBytes] = Field(description="kind -> count and bytes per chip per call")
    priced: CatalogPricedDocument | ProfilePricedDocument
    ring: RingDocument | None


class CollectiveDocument(Document):
    """One collective of the plan, priced: what it moves, where, and why the partitioner issues it."""

    kind: str
    axes: list[str]
    bytes: int
    block: int | None
    blocks_like_it: int
    phase: str
    operands: int
    per_step: bool
    why: str
    route: str
    seconds: float = Field(description="exposed: what compute does not hide")
    dcn_seconds: float
    hidden_seconds: float = Field(0.0, description="what compute hides: a collective matmul's permute's slice of the "
                                  "matmul, or the share XLA:TPU's schedule hides of an async collective (an "
                                  "all-to-all, an FSDP weight gather)")
    hidden_by: Literal["", "matmul", "async"] = Field("", description="what hides it: matmul (a collective matmul's "
                                                      "slice), async (XLA:TPU's schedule of an async collective), "
                                                      "or nothing")


class AssumptionDocument(Document):
    """One figure the time rests on, with its source."""

    name: str
    value: float | str | None
    source: str


class ExplainDocument(Document):
    """`meshlab explain --json`."""

    strategy: str
    file: str
    predicted: PredictionDocument
    collectives: list[CollectiveDocument]
    assumptions: list[AssumptionDocument]
    xla_schedule: dict | None = Field(
        None, description="XLA:TPU's scheduler estimate of one call (its cost model, not a measurement) beside "
        "meshlab's prediction of the same program, where `meshlab check --backend tpu` kept one for this plan")


def explain_document(planned: PlannedStrategy, p: Prediction, schedule: dict | None = None) -> dict:
    """The JSON of `meshlab explain --json` (`schedule`: meshlab.cost.compiled_call.schedule_beside)."""
    from meshlab.cost.collectives import libtpu_flags_line

    flags = planned.strategy.compile.libtpu_flags
    hw = planned.hardware
    priced = [{"name": "libtpu_flags", "value": None, "source": libtpu_flags_line(
        flags, hw.async_all_to_all_hidden, hw.async_weight_gather_hidden, gathers_mode(planned.strategy, hw))}] if (
        flags and planned.hardware.kind == "tpu") else []
    return {"strategy": planned.strategy.name, "file": str(planned.loaded.path), "predicted": prediction_document(p),
            "collectives": collectives_document(p), "assumptions": assumptions_document(
                planned.hardware, model_class=planned.card.class_name) + priced,
            **({"xla_schedule": schedule} if schedule else {})}


def prediction_document(p: Prediction) -> dict:
    step = p.step
    return {
        "label": "predicted",
        "per_step": {
            "transformer_calls": step.calls,
            "flops_per_chip": step.flops,
            "hbm_bytes_per_chip": step.hbm_bytes,
            "compute_s": step.compute,
            "hbm_s": step.hbm,
            "compute_or_hbm_s": step.local,
            "elementwise_bytes_per_chip": step.elementwise_bytes,
            "elementwise_s": step.elementwise,
            "collective_s": step.collective,
            "dcn_s": step.dcn,
            "launch_wait_s": step.launch_wait,
            "host_dispatches": step.dispatches,
            "launch_floor_s": step.launch_floor,
            "overhead_s": step.overhead,
            "step_s": step.total,
            "collective_bytes_per_chip": step.collective_bytes,
            "roofline_s": step.roofline,
        },
        "seconds_per_image": p.seconds_per_image,
        "denoise_seconds_per_image": p.denoise_seconds_per_image,
        "terms": p.terms.to_json() if p.terms is not None else None,
        "images_per_second": p.images_per_second,
        "usd_per_hour": p.usd_per_hour,
        "usd_per_image": p.usd_per_image,
        "time_to_first_image": {**(p.startup.to_json() if p.startup is not None else {}),
                                "first_call_s": p.first_call_s, "total_s": p.time_to_first_image,
                                "usd": p.usd_to_first_image},
        "roofline_seconds_per_image": p.roofline_seconds_per_image,
        "mfu": p.mfu,
        "roofline_mfu": p.roofline_mfu,
        "model_flops_per_call_per_sample": p.model_flops_per_call,
        "collectives_per_block": dict(sorted(p.block_collectives(issued=True).items())),
        "collectives_per_call": collective_totals(p),
        "priced": priced_document(p),
        "ring": ring_document(p),
    }


def ring_document(p: Prediction) -> dict | None:
    """The attentions run as a ring (meshlab.cost.ring), per transformer call on one chip; None without one."""
    rings = p.step.rings
    if not rings:
        return None
    return {"implementation": rings[0].implementation, "degree": rings[0].degree, "axes": list(p.layout.ring_axes),
            "attentions_per_call": sum(x.count for x in rings),
            "per_call_s": sum(x.count * x.seconds for x in rings),
            "as_one_kernel_per_call_s": sum(x.count * x.whole_seconds for x in rings),
            "attentions": [{"module": x.module, "count": x.count, "pass_s": x.pass_seconds, "merge_s": x.merge_seconds,
                            "cast_s": x.cast_seconds, "transfer_s": x.transfer_seconds,
                            "exposed_transfer_s": x.exposed_transfer, "block_bytes": x.block_bytes,
                            "attention_s": x.seconds, "one_kernel_s": x.whole_seconds} for x in rings]}


def priced_document(p: Prediction) -> dict:
    """What the time rests on: the catalog's assumed efficiencies, or a profile's measurements (and which)."""
    m = p.measured
    if m is None:
        c = p.pricing
        measured = [f"{c.linears_measured} Linears at the measured GEMM rate for their shape"
                    ] if c.linears_measured else []
        published = [f"{c.attention_published} attentions at their kernel's published rate"
                     ] if c.attention_published else []
        rest = "the other ops" if measured or published else "every op"
        return {"from": "catalog", "measured": measured, "published": published,
                "assumed": [f"{rest} ({c.assumed}) at compute_efficiency and hbm_efficiency"],
                "extrapolated": {"below_measured_gemms": c.linears_below, "above_measured_gemms": c.linears_above}}
    return {"from": "profile", "basis": m.basis, "measured": list(m.measured), "assumed": list(m.assumed),
            "collectives": ("inside the timed call" if m.collectives_included else
                            {"measured": m.collectives_measured, "assumed": m.collectives_assumed}),
            "extrapolated": m.stretch, "note": m.note}


def collective_totals(p: Prediction) -> dict[str, dict]:
    """By kind: how many per transformer call (per step for per-step ones), and their bytes per chip, as the
    hardware's compiler issues them (what the step is priced from)."""
    counts: Counter = Counter()
    nbytes: Counter = Counter()
    for c in p.issued_collectives:
        counts[c.kind] += c.count
        nbytes[c.kind] += c.count * c.bytes
    return {kind: {"count": counts[kind], "bytes": nbytes[kind]} for kind in sorted(counts)}


def collectives_document(p: Prediction) -> list[dict]:
    return [
        {"kind": c.kind, "axes": list(c.axes), "bytes": c.bytes, "block": c.block, "blocks_like_it": c.count,
         "phase": c.phase, "operands": c.operands, "per_step": c.per_step, "why": c.why,
         "route": t.route.shape, "seconds": t.seconds, "dcn_seconds": t.dcn_seconds, "hidden_seconds": t.hidden,
         "hidden_by": t.hidden_by}
        for t in p.step.collectives
        for c in [t.collective]
    ]


def assumptions_document(hardware: Hardware, assumptions: Assumptions = Assumptions(),
                         model_class: str | None = None) -> list[dict]:
    return assumptions.describe(hardware, model_class)
