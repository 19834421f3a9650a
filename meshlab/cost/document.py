"""JSON documents of predictions: plain, ordered, deterministic; every figure under a ``predicted`` key."""

from __future__ import annotations

from collections import Counter

from meshlab.cost.predict import Prediction
from meshlab.cost.timing import Assumptions
from meshlab.core.hardware import Hardware


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
         "route": t.route.shape, "seconds": t.seconds, "dcn_seconds": t.dcn_seconds}
        for t in p.step.collectives
        for c in [t.collective]
    ]


def assumptions_document(hardware: Hardware, assumptions: Assumptions = Assumptions()) -> list[dict]:
    return assumptions.describe(hardware)
