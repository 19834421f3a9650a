"""Apply a plan in a user's own script (PyTorch/XLA SPMD)::

    import torch_xla.runtime as xr
    import meshlab

    xr.use_spmd()
    planned = meshlab.load_plan("strategies/2d.yaml")
    applied = meshlab.apply(pipe.transformer, planned)      # builds the mesh, marks every parameter
    inputs = meshlab.shard_inputs(applied, planned, hidden_states=latents, encoder_hidden_states=prompt_embeds,
                                  timestep=t, img_shapes=img_shapes)
    assert not applied.mismatches

Parameters still on the CPU move to the XLA device one at a time before they are marked, so the whole model is
never held twice.

The same plan drives torch.distributed's DTensor (every rank runs the script, e.g. under ``torchrun``)::

    torch.distributed.init_process_group()
    applied = meshlab.apply(pipe.transformer, planned, backend="dtensor")   # a DeviceMesh; DTensor parameters
    inputs = meshlab.shard_inputs(applied, planned, hidden_states=latents, ...)
    with meshlab.parallelisms.dtensor.forward_context():
        out = pipe.transformer(**inputs)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshlab.parallelisms import xla
from meshlab.plan.inputs import input_spec
from meshlab.check.readback import AppliedParameter, LocalParameter, compare_parameter
from meshlab.core.errors import InputError
from meshlab.plan.plan import Plan
from meshlab.plan.planned import PlannedStrategy, plan_file


@dataclass(frozen=True)
class Applied:
    """A plan applied to a module: the ``xs.Mesh`` it built, and every parameter as planned and as XLA holds it."""

    mesh: Any  # torch_xla.distributed.spmd.Mesh, or a DeviceMesh under the DTensor backend
    plan: Plan
    parameters: tuple[AppliedParameter, ...] | tuple[LocalParameter, ...]
    scanned: tuple[str, ...] = ()  # block lists that run through torch_xla's scan (see meshlab.parallelisms.scan)
    rewrites: tuple[tuple[str, int], ...] = ()  # (rewrite, modules it changed), see meshlab.parallelisms.rewrites
    activation_points: int = 0  # tensors the strategy's activation rules mark (one hook each)
    backend: str = "xla"

    @property
    def mismatches(self) -> tuple[AppliedParameter, ...]:
        return tuple(p for p in self.parameters if not p.agrees)


def load_plan(path: str | Path) -> PlannedStrategy:
    """Plan a strategy file (no torch): its ``.plan``, ``.strategy``, ``.card``, ``.memory``."""
    return plan_file(path)


#: What ``apply`` can apply a plan with.
BACKENDS = ("xla", "dtensor")


def apply(module, plan: PlannedStrategy | Plan, mesh=None, scan: bool | None = None, strategy=None,
          backend: str = "xla") -> Applied:
    """Mark every parameter of `module` with its spec on a mesh of the plan's axes; read back what XLA holds.

    ``backend="dtensor"`` gives every parameter its DTensor placements on a ``DeviceMesh`` instead (see
    meshlab.parallelisms.dtensor; torch.distributed's process group must be up) and reads back each local shard.

    With a strategy, its ``rewrites`` change the module first (meshlab.parallelisms.rewrites) and its activation rules
    become hooks that mark the tensors they name (meshlab.parallelisms.activation_hooks).
    `scan` runs every block list through torch_xla's scan (one compiled loop body; meshlab.parallelisms.scan); None
    takes the strategy's ``compile.scan_blocks`` (off for a bare Plan). `strategy` gives a bare Plan the strategy
    whose rewrites and activation rules to apply (a PlannedStrategy carries its own)."""
    if backend not in BACKENDS:
        raise InputError(f"unknown backend {backend!r}", f"use one of {', '.join(BACKENDS)}")
    strategy = plan.strategy if isinstance(plan, PlannedStrategy) else strategy
    if backend == "dtensor":
        return _apply_dtensor(module, plan.plan if isinstance(plan, PlannedStrategy) else plan, strategy, mesh)
    xla.require()
    xla.require_spmd()
    if scan is None:
        scan = strategy.compile.scan_blocks if strategy else False
    plan = plan.plan if isinstance(plan, PlannedStrategy) else plan
    _check_names(module, plan)
    rules = strategy.activations.rules if strategy else []
    rewrites = ()
    if strategy and strategy.rewrites:
        from meshlab.parallelisms.rewrites import apply_rewrites

        rewrites = tuple(apply_rewrites(module, strategy.rewrites).items())
    xla_mesh = mesh if mesh is not None else xla.build_mesh(plan.mesh)
    specs = {p.name: p for p in plan.parameters}
    for name in [name for name, _ in module.named_parameters()]:  # names only: each CPU copy is freed as it moves
        param = _on_device(module, name, module.get_parameter(name))
        xla.mark(param, xla_mesh, specs[name].spec, name)
    scanned = ()
    if scan:
        from meshlab.parallelisms import scan as scanning

        scanned = scanning.install(module, plan, xla_mesh)
    points = ()
    if rules:
        from meshlab.parallelisms import activation_hooks
        from meshlab.plan.activations import activation_points

        points = activation_points(plan.card, rules)
        activation_hooks.install(module, points, activation_hooks.xla_marker(xla_mesh))
    return Applied(xla_mesh, plan, read_back(module, plan, xla_mesh), scanned, rewrites, len(points))


def _apply_dtensor(module, plan: Plan, strategy, device_mesh=None) -> Applied:
    from meshlab.parallelisms import dtensor

    from meshlab.plan.placements import required

    dtensor.require_process_group()
    _check_names(module, plan)
    for p in plan.parameters:  # refused before any parameter changes, not halfway through the module
        required(p.spec, plan.mesh, p.name)
    rewrites = ()
    if strategy and strategy.rewrites:
        from meshlab.parallelisms.rewrites import apply_rewrites

        rewrites = tuple(apply_rewrites(module, strategy.rewrites).items())
    device_mesh = device_mesh if device_mesh is not None else dtensor.build_mesh(plan.mesh)
    position = dtensor.mesh_position(device_mesh, plan.mesh)
    specs = {p.name: p for p in plan.parameters}
    parameters = []
    for name in [name for name, _ in module.named_parameters()]:
        planned, value = specs[name], module.get_parameter(name).detach()
        sharded = dtensor.distribute(value, device_mesh, planned.spec, plan.mesh, name)
        parameters.append(_local_parameter(planned, plan, position, sharded,
                                           dtensor.holds_its_slice(value, sharded, planned.spec, plan.mesh, position)))
        _set_parameter(module, name, sharded, requires_grad=False)
        del value
    points = ()
    if strategy and strategy.activations.rules:
        from meshlab.parallelisms import activation_hooks
        from meshlab.plan.activations import activation_points

        points = activation_points(plan.card, strategy.activations.rules)
        activation_hooks.install(module, points, dtensor.marker(device_mesh, plan.mesh))
    return Applied(device_mesh, plan, tuple(parameters), (), rewrites, len(points), "dtensor")


def _local_parameter(planned, plan: Plan, position: int, sharded, holds: bool) -> LocalParameter:
    from meshlab.parallelisms.dtensor import placements_held
    from meshlab.plan.placements import local_shape, placements_of

    return LocalParameter(planned.name, planned.shape, planned.spec, str(placements_of(planned.spec, plan.mesh)),
                          str(placements_held(sharded)), local_shape(planned.shape, planned.spec, plan.mesh, position),
                          tuple(sharded.to_local().shape), holds)


def _set_parameter(module, name: str, value, requires_grad: bool):
    """Put `value` in place of the parameter `name` of `module` (a dotted path), as a Parameter; returns it."""
    import torch

    owner_path, _, leaf = name.rpartition(".")
    owner = module.get_submodule(owner_path) if owner_path else module
    param = torch.nn.Parameter(value, requires_grad=requires_grad)
    setattr(owner, leaf, param)
    return param


def read_back(module, plan: Plan, xla_mesh) -> tuple[AppliedParameter, ...]:
    """Every parameter's sharding as XLA holds it, compared with the plan."""
    specs = {p.name: p for p in plan.parameters}
    ids = xla.mesh_device_ids(xla_mesh)
    return tuple(
        compare_parameter(specs[name], plan.mesh, ids, xla.sharding_string(param), xla.device_slices(param),
                          _dtype_name(param))
        for name, param in module.named_parameters()
    )


def shard_inputs(mesh, plan: PlannedStrategy, **inputs) -> dict[str, Any]:
    """Move the forward's tensor inputs to the device and split them as ``activations`` says (batch, sequence); a
    tuple of tensors (CogVideoX's rotary tables) moves whole, replicated."""
    import torch

    if not isinstance(plan, PlannedStrategy):
        raise InputError("shard_inputs needs the strategy's activations", "pass what meshlab.load_plan returned")
    if isinstance(mesh, Applied) and mesh.backend == "dtensor":
        from meshlab.parallelisms.dtensor import distribute_inputs

        return distribute_inputs(inputs, mesh.mesh, plan.plan.mesh, plan.strategy.activations)
    xla_mesh = mesh.mesh if isinstance(mesh, Applied) else mesh
    out = {}
    for name, value in inputs.items():
        if isinstance(value, torch.Tensor):
            value = value if value.device.type == "xla" else xla.to_device(value)
            spec = input_spec(name, tuple(value.shape), plan.strategy.activations, plan.plan.mesh)
            xla.mark(value, xla_mesh, spec, name)
        elif isinstance(value, tuple) and value and all(isinstance(v, torch.Tensor) for v in value):
            value = tuple(v if v.device.type == "xla" else xla.to_device(v) for v in value)
        out[name] = value
    return out


def _check_names(module, plan: Plan) -> None:
    have = {name for name, _ in module.named_parameters()}
    planned = {p.name for p in plan.parameters}
    for names, problem in ((planned - have, "the plan names parameters the module does not have"),
                           (have - planned, "the module has parameters the plan does not cover")):
        if names:
            shown = sorted(names)
            more = f" and {len(shown) - 5} more" if len(shown) > 5 else ""
            raise InputError(f"{problem}: {', '.join(shown[:5])}{more}",
                             f"plan the model the module is (card {plan.card.name!r}, class {plan.card.class_name}) "
                             "at the module's depth")


def _on_device(module, name: str, param):
    if param.device.type == "xla":
        return param
    return _set_parameter(module, name, xla.to_device(param.detach()), param.requires_grad)


def _dtype_name(tensor) -> str:
    return str(tensor.dtype).removeprefix("torch.")
