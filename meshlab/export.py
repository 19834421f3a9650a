"""A plan in forms other tools read: a standalone PyTorch/XLA snippet, and the parameter-to-spec map. Pure.

The snippet carries the strategy's rules, not one line per parameter: a ten-line resolver in it gives every
parameter the spec meshlab's planner gave it (tests hold the two to exact agreement on every built-in strategy).
"""

from __future__ import annotations

from collections import Counter

from meshlab.plan.plan import Plan
from meshlab.strategy.schema import Activations, Rule

_RESOLVER = '''


def spec_for(name, shape):
    """The partition spec of one parameter: the first rule that matches it, else replicated."""
    for pattern, shard, axes, min_rank in RULES:
        if len(shape) < min_rank or not re.fullmatch(pattern, name):
            continue
        axis = axes[0] if len(axes) == 1 else axes
        if shard == "replicate":
            break
        if shard == "largest":
            dim = max(range(len(shape)), key=lambda d: (shape[d], -d)) if shape else None
            return tuple(axis if d == dim else None for d in range(len(shape)))
        if shard in ("column", "row"):
            if name.endswith(".bias"):  # a bias follows its weight's output dim
                return (axis,) if shard == "column" else (None,)
            return (axis, None) if shard == "column" else (None, axis)
        return tuple(shard)  # an explicit spec, one entry per dim
    return (None,) * len(shape)


def make_mesh():
    count = xr.global_runtime_device_count()
    if count != DEVICES:
        raise RuntimeError(f"this plan is for {DEVICES} devices, {count} are present")
    if xr.device_type() == "TPU":  # device order that follows the physical topology
        return xs.HybridMesh(ici_mesh_shape=MESH_SHAPE, axis_names=AXES)
    return xs.Mesh(np.arange(count), MESH_SHAPE, AXES)


def shard_module(module, mesh):
    """Mark every parameter, replicated ones too (an unmarked one changes sharding after the first step,
    which compiles the graph a second time)."""
    for name, param in module.named_parameters():
        xs.mark_sharding(param, mesh, spec_for(name, tuple(param.shape)))
'''


def torch_xla_snippet(plan: Plan, rules: list[Rule] | tuple[Rule, ...], activations: Activations) -> str:
    """A Python snippet a user pastes into a script: the mesh, the rules, and the mark_sharding calls."""
    mesh = plan.mesh
    lines = [
        f"# Sharding plan {plan.strategy_name!r} for {plan.card.name} ({plan.card.class_name}) on a "
        f"{mesh.describe()} mesh, exported by meshlab.",
        "# Usage: xr.use_spmd() before any tensor is on the XLA device; move the transformer to the device;",
        "# then mesh = make_mesh(); shard_module(pipe.transformer, mesh).",
        "import fnmatch",
        "import re",
        "",
        "import numpy as np",
        "import torch_xla.distributed.spmd as xs",
        "import torch_xla.runtime as xr",
        "",
        f"DEVICES = {mesh.device_count}",
        f"MESH_SHAPE = {tuple(mesh.shape)!r}",
        f"AXES = {tuple(mesh.names)!r}",
        "",
        "# (regex over the parameter path, how, mesh axes, min rank); the first match wins, no match: replicated.",
        "RULES = [",
        *_rule_lines(plan, rules),
        "]",
    ]
    return "\n".join(lines) + _RESOLVER + _inputs_comment(activations, mesh.names)


def _rule_lines(plan: Plan, rules) -> list[str]:
    matched = Counter(p.rule for p in plan.parameters)
    lines = []
    for index, rule in enumerate(rules):
        pattern = f"fnmatch.translate({rule.match!r})" if rule.match is not None else repr(rule.regex)
        shard = rule.shard if isinstance(rule.shard, str) else [_entry(e) for e in rule.shard]
        count = matched.get(index, 0)
        lines.append(f"    # rule {index}: {count} parameter{'s' if count != 1 else ''}"
                     + (f"; {rule.note}" if rule.note else ""))
        lines.append(f"    ({pattern}, {shard!r}, {tuple(rule.axes)!r}, {rule.min_rank}),")
    unmatched = matched.get(None, 0)
    lines.append(f"    # {unmatched} parameter{'s' if unmatched != 1 else ''} match no rule and stay replicated")
    return lines


def _entry(entry):
    return tuple(entry) if isinstance(entry, list) else entry


def _inputs_comment(activations: Activations, axes: tuple[str, ...]) -> str:
    if not activations.batch and not activations.sequence:
        return ""
    batch, sequence = activations.batch, activations.sequence
    hidden = (repr(batch), repr(sequence), "None")
    return (
        "\n\n# Inputs: split the batch dim (dim 0) of every batched input over "
        f"{batch!r}" + (f", and hidden_states' token dim over {sequence!r}" if sequence else "") + ", e.g.\n"
        f"# xs.mark_sharding(hidden_states, mesh, ({', '.join(hidden)}))\n"
        f"# xs.mark_sharding(encoder_hidden_states, mesh, ({batch!r}, None, None))\n"
    )


def spec_map_document(plan: Plan) -> dict:
    """The plan as JSON: mesh, and every parameter's spec in torch_xla's form (null: whole on every device)."""
    return {
        "strategy": plan.strategy_name,
        "model": plan.card.name,
        "class": plan.card.class_name,
        "mesh": plan.mesh.as_dict(),
        "parameters": {p.name: p.spec.to_json() for p in plan.parameters},
    }
