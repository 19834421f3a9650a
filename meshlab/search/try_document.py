"""The JSON document of `meshlab try`: plain, ordered, deterministic (same input, same bytes)."""

from __future__ import annotations

from collections import Counter

from meshlab.plan.memory import ACTIVATION_METHOD, ChipMemory, weights_scale
from meshlab.plan.planned import PlannedStrategy


def try_document(planned: PlannedStrategy) -> dict:
    """Parameter, rule and coverage bytes are as held between uses, as the memory table counts them
    (``workload.weights_dtype``)."""
    plan, strategy, card = planned.plan, planned.strategy, planned.card
    memory = planned.memory
    held = weights_scale(strategy)
    return {
        "strategy": {"name": strategy.name, "file": str(planned.loaded.path), "description": strategy.description},
        "model": {"name": card.name, "class": card.class_name, "source": card.source.get("diffusers_version")},
        "hardware": {"name": planned.hardware.name, "chips": planned.hardware.chips,
                     "usable_hbm_bytes": planned.hardware.usable_hbm_bytes,
                     "overridden": list(planned.hardware.overridden)},
        "mesh": plan.mesh.as_dict(),
        "workload": strategy.workload.model_dump(exclude_none=True),
        "tokens": {"image": memory.tokens.image, "text": memory.tokens.text,
                   **({"reference": memory.tokens.reference} if memory.tokens.reference else {})},
        "total_params": card.total_params,
        "rules": rule_summaries(planned),
        "parameters": [
            {"name": p.name, "shape": list(p.shape), "spec": p.spec.to_json(),
             "shard_shape": list(p.shard_shape(plan.mesh)),
             "bytes_per_device": int(p.bytes_per_device(plan.mesh) * held),
             "rule": p.rule}
            for p in plan.parameters
        ],
        "coverage": coverage(planned),
        "per_chip": [chip_document(c) for c in memory.chips],
        "most_loaded_chip": memory.most_loaded.chip,
        "chips_identical": memory.uniform,
        "fits": memory.fits,
        "warnings": list(plan.warnings),
        "taken": list(planned.loaded.taken),
        "activation_method": ACTIVATION_METHOD,
        "predicted": predicted_summary(planned),
    }


def predicted_summary(planned: PlannedStrategy) -> dict:
    """Time and cost per image, predicted (`meshlab compare --json` has every term)."""
    from meshlab.cost.predict import predict

    p = predict(planned.plan, planned.strategy, planned.hardware)
    return {"label": "predicted", "latency_s": p.first_call_s, "seconds_per_image": p.seconds_per_image,
            "step_s": p.step.total,
            "steps": p.layout.steps, "images_per_call": p.layout.images, "images_per_second": p.images_per_second,
            "usd_per_chip_hour": planned.hardware.usd_per_chip_hour, "usd_per_hour": p.usd_per_hour,
            "usd_per_image": p.usd_per_image}


def rule_summaries(planned: PlannedStrategy) -> list[dict]:
    """Per rule: what it matched, the specs it gave, and the bytes per chip of what it covers."""
    plan = planned.plan
    held = weights_scale(planned.strategy)
    rows = []
    for index, rule in enumerate(planned.strategy.rules):
        matched = [p for p in plan.parameters if p.rule == index]
        rows.append({
            "index": index, "pattern": rule.pattern,
            "shard": rule.shard if isinstance(rule.shard, str) else "explicit",
            "axis": list(rule.axes), "matched": len(matched),
            "specs": _spec_counts(matched),
            "bytes_per_device": int(sum(p.bytes_per_device(plan.mesh) for p in matched) * held),
        })
    return rows


def _spec_counts(params) -> dict[str, int]:
    return dict(sorted(Counter(str(p.spec) for p in params).items(), key=lambda kv: (-kv[1], kv[0])))


def coverage(planned: PlannedStrategy) -> dict:
    plan = planned.plan
    unmatched = plan.replicated
    held = weights_scale(planned.strategy)
    return {
        "unmatched_rules": [planned.strategy.rules[i].pattern for i in plan.unmatched_rules],
        "unmatched_parameters": len(unmatched),
        "unmatched_bytes_per_chip": int(sum(p.bytes_per_device(plan.mesh) for p in unmatched) * held),
        "unmatched_examples": [p.name for p in unmatched[:5]],
        "padding_bytes_per_chip": planned.memory.most_loaded.padding,
        "tile_padding_bytes_per_chip": planned.memory.most_loaded.tile_padding,
    }


def chip_document(chip: ChipMemory) -> dict:
    return {
        "chip": chip.chip,
        "weights_bytes": chip.weights,
        "activation_bytes": chip.activation_peak,
        "other_bytes": chip.other,
        "total_bytes": chip.total,
        "hbm_bytes": chip.hbm,
        "headroom_bytes": chip.headroom,
        "breakdown": {
            "weights_sharded": chip.weights_sharded, "weights_replicated": chip.weights_replicated,
            "padding": chip.padding, "activations": chip.activations, "vae_weights": chip.vae_weights,
            "vae_decode": chip.vae_decode, "text_encoder": chip.text_encoder, "text_encode": chip.text_encode,
            "reserve": chip.reserve, "scan_stacked_weights": chip.scan_stacked, "tile_padding": chip.tile_padding,
            "gathered_weights": chip.gathered_weights, "buffers": chip.buffers,
        },
        "peak_phase": chip.peak_phase,
    }
