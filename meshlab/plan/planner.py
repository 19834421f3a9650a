"""Turn a validated strategy into a plan: resolve the mesh, the rules, and the static checks."""

from __future__ import annotations

import dataclasses
import math

from meshlab.models.card import ModelCard, regenerate_command
from meshlab.core.errors import PlanError
from meshlab.core.mesh import AbstractMesh
from meshlab.plan.activations import check_activation_rules
from meshlab.plan.axes import GUIDANCE_AXIS, activation_axes, compute_split
from meshlab.plan.plan import Plan, PlannedParameter
from meshlab.plan.rules import check_rule_axes, compile_rules, resolve
from meshlab.strategy.schema import Strategy


def make_plan(strategy: Strategy, card: ModelCard, device_count: int) -> Plan:
    try:
        mesh = AbstractMesh.resolve(strategy.mesh, device_count)
    except PlanError as exc:
        raise PlanError(exc.problem, exc.fix, field=("mesh",)) from None
    _check_activation_axes(strategy, mesh)
    _check_guidance_axis(strategy, mesh)
    activation_warnings = check_activation_rules(strategy, card, mesh)  # before the ring: a typo'd axis says so
    _check_ring_split(strategy, card, mesh)
    rules = compile_rules(strategy.rules)
    check_rule_axes(rules, mesh)
    dtype = strategy.workload.dtype
    planned = []
    for parameter in card.parameters:
        if parameter.dtype != dtype:
            parameter = dataclasses.replace(parameter, dtype=dtype)
        spec, rule = resolve(parameter, rules, mesh)
        planned.append(PlannedParameter(parameter, spec, rule))
    _check_heads(card, planned, mesh, activation_axes(strategy.activations, mesh))
    used = {p.rule for p in planned}
    unmatched = tuple(i for i in range(len(rules)) if i not in used)
    warnings = (_batch_warnings(strategy, mesh) + _padding_warnings(planned, mesh) + activation_warnings
                + _card_warnings(card))
    return Plan(strategy.name, card, mesh, tuple(planned), unmatched, warnings)


def _card_warnings(card: ModelCard) -> tuple[str, ...]:
    """A card file imported before meshlab recorded a transformer's buffers: any it has are not counted."""
    if card.buffers is not None:
        return ()
    return (f"model card {card.name!r} records no buffers (imported before meshlab recorded them): a buffer every "
            f"chip holds, such as SD3.5's 171 MiB positional table, is not counted; regenerate it with "
            f"`{regenerate_command(card.source)}`",)


def _check_activation_axes(strategy: Strategy, mesh: AbstractMesh) -> None:
    for key, axes in (("batch", (strategy.activations.batch,)), ("sequence", strategy.activations.sequence_axes)):
        for axis in axes:
            if axis is not None and axis not in mesh.names:
                raise PlanError(
                    f"activations.{key} names unknown mesh axis {axis!r}",
                    f"use one of {list(mesh.names)} or null",
                    field=("activations", key),
                )


def _check_guidance_axis(strategy: Strategy, mesh: AbstractMesh) -> None:
    """A ``cfg`` axis larger than 1 carries the two guidance branches: size 2, with workload.cfg, and no other split."""
    if GUIDANCE_AXIS not in mesh.names or mesh.size(GUIDANCE_AXIS) == 1:
        return
    size = mesh.size(GUIDANCE_AXIS)
    if size != 2 or not strategy.workload.cfg:
        raise PlanError(
            f"mesh axis {GUIDANCE_AXIS!r} has size {size} with workload.cfg {strategy.workload.cfg}; the "
            f"{GUIDANCE_AXIS!r} axis carries the two guidance branches",
            f"give {GUIDANCE_AXIS!r} size 2 with workload.cfg: true, or rename the axis",
            field=("mesh", GUIDANCE_AXIS),
        )
    if GUIDANCE_AXIS in (strategy.activations.batch, *strategy.activations.sequence_axes):
        raise PlanError(
            f"mesh axis {GUIDANCE_AXIS!r} splits the guidance branches; it cannot also split the batch or sequence",
            "give activations.batch / activations.sequence another axis",
            field=("activations",),
        )


def _check_ring_split(strategy: Strategy, card: ModelCard, mesh: AbstractMesh) -> None:
    """A sequence split run by the GPU tools (``activations.sequence_parallel`` diffusers or xdit, over sequence axes
    larger than 1, ring or Ulysses) splits the tokens evenly over the sequence axes, or refuses: XLA pads an uneven
    split, diffusers' sharder (EquipartitionSharder) asserts an even one (its text too, where the model splits it).
    The fix names the smaller sequence degrees (ring x Ulysses) that divide the tokens, the nearest height the present
    degree divides, or the text length. A sequence axis the attention.qkv rule neither keeps on the tokens (a ring)
    nor moves onto the heads (Ulysses) leaves the kernel whole tokens, which the tools have no form for; a ring over
    a linear attention (SANA's) has no keys to pass, and diffusers splits no SANA sequence at all."""
    from meshlab.plan.axes import ring_axes, ulysses_axes
    from meshlab.plan.tokens import joins_text, token_counts

    activations = strategy.activations
    sequence = [a for a in activations.sequence_axes if mesh.size(a) > 1]
    if activations.ring == "gather" or not sequence:
        return
    idle = [a for a in sequence if a not in ring_axes(activations) + ulysses_axes(activations)]
    if idle:
        raise PlanError(f"sequence axis {idle[0]!r} splits the tokens between attentions, and the attention.qkv rule "
                        "neither keeps it on the tokens (a ring) nor moves it onto the heads (Ulysses): "
                        f"{activations.sequence_parallel} has no such form, and would not run what is priced",
                        f"put {idle[0]!r} in the qkv rule's tokens or features entry, or set "
                        "activations.sequence_parallel: partitioner", field=("activations", "rules"))
    linear = next((a for a in card.attention if a.is_linear), None)
    if linear is not None and activations.sequence_parallel == "diffusers":
        raise PlanError(diffusers_cannot_split(card), "set activations.sequence_parallel: partitioner (XLA), or keep "
                        "the sequence whole", field=("activations", "sequence_parallel"))
    if linear is not None and math.prod(mesh.size(a) for a in ring_axes(activations)) > 1:
        raise PlanError(f"{activations.sequence_parallel}'s ring passes blocks of keys and values between softmax "
                        f"attention kernels, but {card.name}'s self-attention ({linear.module.split('.')[-1]}) is "
                        "linear: it sums a (head_dim + 1) x head_dim state over the tokens, which a sequence split "
                        "all-reduces", "set activations.sequence_parallel: partitioner (the state's all-reduce), or "
                        "move the ring axes onto the heads (Ulysses)", field=("activations", "sequence_parallel"))
    split = math.prod(mesh.size(a) for a in activations.sequence_axes)
    tokens = token_counts(strategy.workload, card.architecture)
    counts = {"image": tokens.image, **({"text": tokens.text} if joins_text(card) else {})}
    uneven = {stream: n for stream, n in counts.items() if n % split}
    if not uneven:
        return
    # smaller sequence degrees on the same devices (the rest to another axis): the divisors of the present one
    degrees = sorted((d for d in range(2, split) if split % d == 0 and all(n % d == 0 for n in counts.values())),
                     key=lambda d: (abs(d - split), d))[:3]
    w = strategy.workload
    step = card.architecture.vae_scale_factor * card.architecture.patch_size
    per_row = tokens.image // (w.height // step)  # image tokens per row of patches (frames x columns)
    heights = sorted((h for h in range(step, 4 * w.height + step, step) if per_row * (h // step) % split == 0),
                     key=lambda h: (abs(h - w.height), h))[:1]
    what = " and ".join(f"{n} {stream} tokens" for stream, n in uneven.items())
    sizes = ([f"height {heights[0]}"] if "image" in uneven and heights else []) + (
        [f"text_tokens {-(-tokens.text // split) * split}"] if "text" in uneven else [])  # both, where both are uneven
    fixes = ([f"a sequence degree (ring x Ulysses) of {' or '.join(map(str, degrees))}"] if degrees else []) + (
        [" and ".join(sizes)] if sizes else [])
    raise PlanError(
        f"the sequence axes {'+'.join(activations.sequence_axes)} split {what} {split} ways, which does not divide "
        f"them, and the sequence split {activations.sequence_parallel} runs needs an even one",
        "use " + ", or ".join(fixes),
        field=UNEVEN_TOKENS)


#: the field an uneven token split is placed at: activations.sequence in a file (its deepest line there); the quick
#: form names the flags that set the degree and the size (meshlab.search.quick)
UNEVEN_TOKENS = ("activations", "sequence", "<tokens>")


def diffusers_cannot_split(card: ModelCard) -> str | None:
    """Why diffusers' context parallelism cannot split this card's sequence (None where it can): a linear attention
    (SANA's) has no context-parallel plan in diffusers and does not go through the function it hooks."""
    linear = next((a for a in card.attention if a.is_linear), None)
    if linear is None:
        return None
    return (f"diffusers has no context-parallel plan for {card.class_name} (its _cp_plan is None, diffusers 0.42.1), "
            f"and its linear attention ({linear.module.split('.')[-1]}, SanaLinearAttnProcessor2_0) does not go "
            "through dispatch_attention_fn, which diffusers' context parallelism hooks")


def _batch_warnings(strategy: Strategy, mesh: AbstractMesh) -> tuple[str, ...]:
    """A batch that does not fill the batch axis still runs (XLA pads it), but chips compute padding."""
    axis, batch = strategy.activations.batch, strategy.workload.batch
    if axis is None or batch % mesh.size(axis) == 0:
        return ()
    padded = -(-batch // mesh.size(axis)) * mesh.size(axis)
    return (f"workload.batch {batch} does not split evenly over axis {axis!r} of size {mesh.size(axis)}: XLA pads "
            f"it to {padded}, so {padded - batch} of every {padded} samples computed are padding",)


def _check_heads(card: ModelCard, planned: list[PlannedParameter], mesh: AbstractMesh,
                 gathered: frozenset[str] = frozenset()) -> None:
    """A q/k/v projection split on its output dim must split whole heads, or attention reshards every head.

    Axes in `gathered` split activations: a weight split over one is all-gathered before use (FSDP), so its
    split never reaches the heads."""
    by_name = {p.name: p for p in planned}
    for attention in card.attention:
        for module in attention.qkv:
            weight = by_name.get(f"{module}.weight")
            split = compute_split(weight.spec.entries[0], mesh, gathered) if weight else 1
            if attention.heads % split:
                axes = [a for a in weight.spec.entries[0] if a not in gathered]
                divisors = [d for d in range(1, attention.heads + 1) if attention.heads % d == 0]
                nearest = min(divisors, key=lambda d: (abs(d - split), -d))
                raise PlanError(
                    f"{weight.name} splits its output over {split} devices ({'+'.join(axes)}) "
                    f"but {attention.module} has {attention.heads} heads, not divisible by {split}",
                    f"shard q/k/v {nearest} ways, the nearest that divides {attention.heads} (any of {divisors}), "
                    "or replicate them",
                    field=("rules", weight.rule, "axis"),
                )


def _padding_warnings(planned: list[PlannedParameter], mesh: AbstractMesh) -> tuple[str, ...]:
    """One warning per distinct (shape, spec) that XLA has to pad, with the bytes it wastes in all."""
    waste: dict[tuple, list] = {}
    wasted_by: dict[tuple, int] = {}  # one parameter's padding, by shape, dtype and spec: worked out once each
    for p in planned:
        splits = p.spec.split_counts(mesh)
        if all(n % k == 0 for n, k in zip(p.shape, splits)):
            continue
        kind = (p.shape, p.parameter.dtype, p.spec)
        if kind not in wasted_by:
            wasted_by[kind] = p.bytes_per_device(mesh) * mesh.device_count - sum(
                p.real_bytes_on(d, mesh) for d in range(mesh.device_count))
        entry = waste.setdefault((p.shape, str(p.spec)), [0, 0, p.name])
        entry[0] += 1
        entry[1] += wasted_by[kind]
    return tuple(
        f"{count} parameter(s) like {example} {list(shape)} {spec} need padding: "
        f"{wasted / 2**20:.2f} MiB wasted over all devices"
        for (shape, spec), (count, wasted, example) in sorted(waste.items(), key=lambda kv: -kv[1][1])
    )
