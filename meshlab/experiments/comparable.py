"""When a measured run can be held against its prediction. Pure, one rule for `report` and `calibrate`.

A prediction is for one model (card name and diffusers config), on the catalog hardware's kind of chip and
chip count, at one batch and dtype. A run is compared with it only when it ran exactly that: a `tiny`
checkpoint run says nothing about full Qwen-Image, 8 virtual CPU devices nothing about a TPU, and a float32
load nothing about a bf16 prediction.
"""

from __future__ import annotations

from meshlab.core.errors import InputError
from meshlab.experiments.records import RunRecord
from meshlab.core.hardware import load_hardware

PLATFORMS = {"tpu": ("tpu",), "gpu": ("cuda", "gpu"), "cpu": ("cpu",)}


def ran_platform(record: RunRecord) -> str:
    """The platform a record's run went on: what its worker saw (``hardware_seen.device_type``) when it says,
    else the parent's guess in ``hardware.platform`` (the parent imports no torch, so it cannot see a CUDA GPU:
    records of plain-PyTorch runs before 2026-12 say cpu there)."""
    if record.hardware_seen.device_type:
        return record.hardware_seen.device_type.lower()
    return record.hardware.platform or "?"


def comparison_problem(record: RunRecord) -> str | None:
    """Why `record`'s measurement cannot be compared with its prediction; None when it can."""
    prediction, ran, devices = record.prediction, record.ran, record.hardware.devices
    if record.status != "ok":
        return f"the run did not succeed ({record.status})"
    if prediction.kind:  # a profile's entry (or a newer record): its kind and chips are in the record
        name, kind, chips = prediction.hardware, prediction.kind, prediction.chips
    else:
        try:
            catalog = load_hardware(prediction.hardware or "?")
        except InputError:
            return f"predicted for unknown hardware {prediction.hardware!r}"
        name, kind, chips = catalog.name, catalog.kind, catalog.chips
    if ran_platform(record) not in PLATFORMS.get(kind, ()):
        return f"ran on {ran_platform(record)}, predicted for {name} ({kind})"
    if devices != chips:
        return f"ran on {'?' if devices is None else devices} devices, predicted for {chips}"
    measured_with = prediction.profile_backend
    if measured_with and record.backend and record.backend != measured_with:
        return f"ran with backend {record.backend}, its profile was measured with {measured_with}"
    if ran is None or not ran.model_fields_set:
        return "the record does not say which model, batch and dtype ran (recorded by an older meshlab)"
    for key, what in (("model", "model"), ("config_digest", "model config"), ("batch", "batch"), ("dtype", "dtype")):
        if getattr(ran, key) != getattr(prediction, key):
            return f"ran {what} {getattr(ran, key)!r}, predicted for {getattr(prediction, key)!r}"
    return None
