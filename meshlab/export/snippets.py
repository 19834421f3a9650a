"""A plan in forms other tools read: a standalone PyTorch/XLA snippet, the same plan as a torch.distributed
DTensor snippet, and the parameter-to-spec map. Pure.

The snippet carries the strategy's rules, not one line per parameter: a ten-line resolver in it gives every
parameter the spec meshlab's planner gave it (tests hold the two to exact agreement on every built-in strategy).
"""

from __future__ import annotations

import textwrap
from collections import Counter

from pydantic import Field

from meshlab.core.document import Document
from meshlab.plan.plan import Plan
from meshlab.strategy.schema import Activations, Rule

_SPEC_FOR = '''


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
            kernel = (None,) * (len(shape) - 2)  # a pointwise convolution's [out, in, 1, 1]: its kernel dims whole
            return (axis, None, *kernel) if shard == "column" else (None, axis, *kernel)
        return tuple(shard)  # an explicit spec, one entry per dim
    return (None,) * len(shape)
'''

_TORCH_XLA = '''

def make_mesh():
    count = xr.global_runtime_device_count()
    if count != DEVICES:
        raise RuntimeError(f"this plan is for {DEVICES} devices, {count} are present")
    if xr.device_type() == "TPU":  # device order that follows the physical topology (and the slices)
        return xs.HybridMesh(ici_mesh_shape=ICI_MESH_SHAPE, dcn_mesh_shape=DCN_MESH_SHAPE, axis_names=AXES)
    return xs.Mesh(np.arange(count), MESH_SHAPE, AXES)


def shard_module(module, mesh):
    """Mark every parameter, replicated ones too (an unmarked one changes sharding after the first step,
    which compiles the graph a second time)."""
    for name, param in module.named_parameters():
        xs.mark_sharding(param, mesh, spec_for(name, tuple(param.shape)))
'''


def left_out_of_snippet(activations: Activations, rewrites: tuple[str, ...] | list[str] = (),
                        scan: bool = False) -> list[str]:
    """What a strategy asks beyond its parameters' specs that a torch-xla snippet does not write as code, one phrase
    each: activation rules (hooks inside the blocks), rewrites (module changes) and scanned blocks."""
    from meshlab.plan.activations import added_split, given_rules, rule_spec

    left = []
    given = given_rules(activations)
    if given:
        points = ", ".join(dict.fromkeys(r.point for r in given))
        left.append(f"{len(given)} activation rule{'s' * (len(given) > 1)} ({points})")
    if (added := added_split(activations)) is not None:
        features = rule_spec(added).entries[-1]
        kept = f", its features kept split on {'+'.join(features)}" if features else ""
        left.append(f"the token split over {'+'.join(activations.sequence_axes)} at each block's input{kept} "
                    "(block.input, which planning adds: the model patchifies its latent inside)")
    if rewrites:
        left.append(f"the rewrite{'s' * (len(rewrites) > 1)} {', '.join(rewrites)}")
    if scan:
        left.append("compile.scan_blocks")
    from meshlab.plan.axes import ring_axes

    if activations.sequence_parallel != "partitioner" and (ring := ring_axes(activations)):
        left.append(f"the ring over {'+'.join(ring)} as {activations.sequence_parallel} runs it (passes of the keys "
                    "and values between chips; XLA's partitioner gathers them whole instead, which `meshlab check` "
                    "and a copy of the file with activations.sequence_parallel: partitioner price)")
    return left


def torch_xla_snippet(plan: Plan, rules: list[Rule] | tuple[Rule, ...], activations: Activations,
                      dcn: dict[str, int] | None = None, libtpu_flags: tuple[str, ...] = (),
                      left_out: list[str] | tuple[str, ...] = (), source: str = "S.yaml") -> str:
    """A Python snippet a user pastes into a script: the mesh, the rules, and the mark_sharding calls. With `dcn`
    (axis -> slices it spans) the TPU mesh is a ``HybridMesh`` whose DCN shape puts those axes across slices; with
    `libtpu_flags` (the strategy's compile.libtpu_flags) the snippet sets LIBTPU_INIT_ARGS before torch_xla loads.
    `left_out` (`left_out_of_snippet`) names what the plan has that the snippet does not apply: its header says so,
    and how to apply the whole plan from `source`."""
    mesh, dcn = plan.mesh, dcn or {}
    warning = [] if not left_out else [
        *textwrap.wrap(f"NOT APPLIED BY THIS SNIPPET, yet part of the plan meshlab priced: {'; '.join(left_out)}. "
                       "Without these, XLA's sharding propagation chooses other collectives than the predicted ones. "
                       "To apply the whole plan:", 114, initial_indent="# ", subsequent_indent="# "),
        f"#     applied = meshlab.apply(pipe.transformer, meshlab.load_plan({source!r}))"]
    flags = [] if not libtpu_flags else [
        "import os",
        "",
        "# XLA:TPU flags the plan is compiled with (libtpu reads them when torch_xla first loads it)",
        f"os.environ[\"LIBTPU_INIT_ARGS\"] = (os.environ.get(\"LIBTPU_INIT_ARGS\", \"\") + {' ' + ' '.join(libtpu_flags)!r}"
        ").strip()",
        ""]
    dcn_shape = tuple(dcn.get(name, 1) for name in mesh.names)
    ici_shape = tuple(size // k for size, k in zip(mesh.shape, dcn_shape))
    lines = [
        f"# Sharding plan {plan.strategy_name!r} for {plan.card.name} ({plan.card.class_name}) on a "
        f"{mesh.describe()} mesh, exported by meshlab.",
        "# Usage: xr.use_spmd() before any tensor is on the XLA device; move the transformer to the device;",
        "# then mesh = make_mesh(); shard_module(pipe.transformer, mesh).",
        *warning,
        *flags,
        "import fnmatch",
        "import re",
        "",
        "import numpy as np",
        "import torch_xla.distributed.spmd as xs",
        "import torch_xla.runtime as xr",
        "",
        *_constants(plan, rules, [
            f"ICI_MESH_SHAPE = {ici_shape!r}  # within one slice",
            f"DCN_MESH_SHAPE = {dcn_shape!r}  # across slices" + (
                f": {', '.join(f'{a} spans {k}' for a, k in dcn.items())}" if dcn else ": one slice")]),
    ]
    batch = _batch_entry(activations, mesh)
    hidden = f"({batch!r}, {_entry(activations.sequence)!r}, None)"
    return "\n".join(lines) + _SPEC_FOR + _TORCH_XLA + _inputs_comment(activations, [
        f"# xs.mark_sharding(hidden_states, mesh, {hidden})",
        f"# xs.mark_sharding(encoder_hidden_states, mesh, ({batch!r}, None, None))"], mesh)


_DTENSOR = '''

def placements_for(spec):
    """DTensor placements, one per mesh axis: Shard(d) where the axis splits dim d, else Replicate()."""
    placements = [Replicate()] * len(AXES)
    for dim, entry in enumerate(spec):
        for axis in (entry,) if isinstance(entry, str) else entry or ():
            placements[AXES.index(axis)] = Shard(dim)
    return placements


def make_mesh():
    """Every rank calls this after torch.distributed.init_process_group() (torchrun sets the environment)."""
    world = dist.get_world_size()
    if world != DEVICES:
        raise RuntimeError(f"this plan is for {DEVICES} ranks, the process group has {world}")
    kind = "cuda" if dist.get_backend() == "nccl" else "cpu"
    if kind == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", dist.get_rank() % torch.cuda.device_count())))
    return init_device_mesh(kind, MESH_SHAPE, mesh_dim_names=AXES)


def shard_module(module, mesh):
    """Give every parameter its placements. Every rank holds the same weights (same checkpoint or seed), so each
    keeps its own slice with no communication (src_data_rank=None)."""
    for name, param in list(module.named_parameters()):
        owner_path, _, leaf = name.rpartition(".")
        owner = module.get_submodule(owner_path) if owner_path else module
        value = param.detach().to(mesh.device_type)
        placed = distribute_tensor(value, mesh, placements_for(spec_for(name, tuple(value.shape))),
                                   src_data_rank=None)
        setattr(owner, leaf, torch.nn.Parameter(placed, requires_grad=False))
'''


def dtensor_snippet(plan: Plan, rules: list[Rule] | tuple[Rule, ...], activations: Activations,
                    source: str = "S.yaml") -> str:
    """The plan for torch.distributed: a DeviceMesh of the plan's axes and DTensor placements from the same rules.
    A spec DTensor cannot express (meshlab.plan.placements) is a PlanError naming the parameter; so are the file's
    activation rules. The block.input rule planning adds for a sequence split is left out, and the header says so
    (`left_out_of_snippet`)."""
    from meshlab.core.errors import PlanError
    from meshlab.plan.placements import required
    from meshlab.plan.activations import given_rules

    mesh = plan.mesh
    given = given_rules(activations)
    if given:
        raise PlanError(f"the strategy has {len(given)} activation rule(s), which a DTensor snippet cannot "
                        "write as code (they are hooks that redistribute tensors inside the blocks)",
                        "apply the plan with meshlab.apply(module, plan, backend='dtensor'), which installs them, or "
                        "export --format torch-xla", field=("activations", "rules"))
    for p in plan.parameters:
        required(p.spec, mesh, p.name)
    left_out = left_out_of_snippet(activations)
    warning = [] if not left_out else [
        *textwrap.wrap(f"NOT APPLIED BY THIS SNIPPET, yet part of the plan meshlab priced: {'; '.join(left_out)}. "
                       "To apply the whole plan:", 114, initial_indent="# ", subsequent_indent="# "),
        f"#     applied = meshlab.apply(pipe.transformer, meshlab.load_plan({source!r}), backend='dtensor')"]
    lines = [
        f"# Sharding plan {plan.strategy_name!r} for {plan.card.name} ({plan.card.class_name}) on a "
        f"{mesh.describe()} mesh, exported by meshlab for torch.distributed (DTensor).",
        *warning,
        f"# Usage: torchrun --nproc-per-node {mesh.device_count} your_script.py; in it, after",
        "# torch.distributed.init_process_group(): mesh = make_mesh(); shard_module(pipe.transformer, mesh); run the",
        "# forward under torch.distributed.tensor.experimental.implicit_replication(). On CPU ranks (gloo), DTensor has",
        "# no rule for SDPA's CPU kernel: meshlab.parallelisms.dtensor.cpu_attention_rule() registers one.",
        "import fnmatch",
        "import os",
        "import re",
        "",
        "import torch",
        "import torch.distributed as dist",
        "from torch.distributed.device_mesh import init_device_mesh",
        "from torch.distributed.tensor import Replicate, Shard, distribute_tensor",
        "",
        *_constants(plan, rules),
    ]
    hidden = f"({_batch_entry(activations, mesh)!r}, {_entry(activations.sequence)!r}, None)"
    return "\n".join(lines) + _SPEC_FOR + _DTENSOR + _inputs_comment(activations, [
        f"# hidden_states = distribute_tensor(hidden_states, mesh, placements_for({hidden}), src_data_rank=None)"],
        mesh)


def _constants(plan: Plan, rules, mesh_extra: list[str] | tuple = ()) -> list[str]:
    """The snippet's constants: device count, mesh shape and axes (and what `mesh_extra` adds), then the rules."""
    mesh = plan.mesh
    return [
        f"DEVICES = {mesh.device_count}",
        f"MESH_SHAPE = {tuple(mesh.shape)!r}",
        f"AXES = {tuple(mesh.names)!r}",
        *mesh_extra,
        "",
        "# (regex over the parameter path, how, mesh axes, min rank); the first match wins, no match: replicated.",
        "RULES = [",
        *_rule_lines(plan, rules),
        "]",
    ]


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


def _batch_entry(activations: Activations, mesh):
    """The axes dim 0 of a batched input splits over (meshlab.plan.inputs.batch_axes: the guidance axis, then the
    batch axis), as a spec entry: None, one axis, or a tuple of them."""
    from meshlab.plan.inputs import batch_axes

    axes = batch_axes(activations, mesh)
    return None if not axes else axes[0] if len(axes) == 1 else axes


def _inputs_comment(activations: Activations, examples: list[str], mesh) -> str:
    """How to split the inputs as ``activations`` says, with the backend's `examples` (comment lines)."""
    batch, sequence = _batch_entry(activations, mesh), activations.sequence
    if not batch and not sequence:
        return ""
    parts = ([f"the batch dim (dim 0) of every batched input over {batch!r}"] if batch else []) + (
        [f"hidden_states' token dim over {_entry(sequence)!r}"] if sequence else [])
    return "\n\n# Inputs: split " + ", and ".join(parts) + ", e.g.\n" + "".join(f"{line}\n" for line in examples)


class SpecMapDocument(Document):
    """`meshlab export --format json`: the mesh, and every parameter's spec in torch_xla's form."""

    strategy: str
    model: str
    class_: str = Field(alias="class")
    mesh: dict[str, int]
    parameters: dict[str, list[str | list[str] | None]] = Field(
        description="parameter -> per dim, the mesh axis (or axes) it splits over, or null")


def spec_map_document(plan: Plan) -> dict:
    """The plan as JSON: mesh, and every parameter's spec in torch_xla's form (null: whole on every device)."""
    return {
        "strategy": plan.strategy_name,
        "model": plan.card.name,
        "class": plan.card.class_name,
        "mesh": plan.mesh.as_dict(),
        "parameters": {p.name: p.spec.to_json() for p in plan.parameters},
    }
