"""What `meshlab run` and `meshlab profile` refuse of a strategy priced as a GPU tool runs it, at the strategy's line,
with the tools' exports that do take the plan (meshlab.export.gpu). Pure, no torch."""

from __future__ import annotations

import math

from meshlab.core.errors import InputError, PlanError
from meshlab.export.gpu import FORMS
from meshlab.plan.planned import PlannedStrategy


def taking_tools(planned: PlannedStrategy) -> list[str]:
    """The GPU tools whose export (`meshlab export --format`) takes the plan as it stands."""
    takes = []
    for fmt, form in FORMS.items():
        try:
            form(planned.plan, planned.strategy, planned.hardware)
        except PlanError:
            continue
        takes.append(fmt)
    return takes


def _elsewhere(planned: PlannedStrategy, preferred: str | None = None) -> str:
    """', or run it with TOOL (meshlab export --format TOOL)' for the tools that take the plan (the one it is priced
    for first); where none does, where to read why."""
    if planned.hardware.kind != "gpu":  # the GPU tools do not run a TPU's plan
        return ""
    takes = sorted(taking_tools(planned), key=lambda t: t != preferred)
    if takes:
        return f", or run it with {' or '.join(takes)} (meshlab export --format {takes[0]})"
    return (f" (neither GPU tool's export takes it as written: `meshlab export --format {preferred or 'diffusers'}` "
            "says why)")


def refuse_placement(planned: PlannedStrategy, what: str) -> None:
    """meshlab's pipelines decode the whole image and keep a text encoder whole (on the host or the device): a
    tiled or parallel decode, or a sharded encoder, is priced as the GPU tools run it, not run here, so a run of it
    is refused at its line."""
    placement = planned.strategy.placement
    sharded = placement.first_at("sharded", [c.name for c in planned.card.encoders])
    for field, value, plain in ((("placement", "vae_decode"), placement.vae_decode, "full"),
                                (sharded, "sharded" if sharded else None, "cpu or device")):
        if value in ("tiled", "parallel", "sharded"):
            key = ".".join(field[1:])
            raise planned.loaded.place(InputError(
                f"meshlab {what} decodes the whole image and keeps each encoder whole, and this strategy's "
                f"placement.{key} is {value}", f"set placement.{key}: {plain} to {what} it here{_elsewhere(planned)}",
                field=field))


def refuse_ring(planned: PlannedStrategy, what: str) -> None:
    """meshlab runs and profiles a sequence split as XLA's partitioner and DTensor do (every chip gathers a ring's k
    and v, and the streams are re-split to be joined): one a GPU tool runs (``activations.sequence_parallel``) is
    priced as the tool runs it, not run here, so a run of it is refused at that line."""
    activations, mesh = planned.strategy.activations, planned.plan.mesh
    tool = activations.sequence_parallel
    if tool != "partitioner" and math.prod(mesh.size(a) for a in activations.sequence_axes) > 1:
        raise planned.loaded.place(InputError(
            f"meshlab {what} runs a sequence split as XLA's partitioner and DTensor do, and this strategy's is priced "
            f"as {tool} runs it", f"set activations.sequence_parallel: partitioner to {what} it here"
            f"{_elsewhere(planned, tool)}", field=("activations", "sequence_parallel")))
