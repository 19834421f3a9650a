"""Activation rules resolved against a model card: which tensor of which module each rule splits. Pure, no torch.

A rule names a point of every block (``ACTIVATION_POINTS``) and optionally a stream, and for the attention points
whether it means self- or cross-attention (``attention``: a cross-attention's keys come from another stream, as Wan's
text); it resolves to one ``ActivationPoint`` per module the card has there:

- ``attention.qkv``: q, k and v as the attention kernel reads them (``[batch, tokens, heads, head dim]``: the
  spec's features entry splits the heads), joined over every stream the attention joins, so the rule takes no
  stream; the kernel's output is marked alike;
- ``attention.output``: the input of every output projection of that stream (the attention's output, cut back
  to the stream);
- ``linear.output``: the output of every Linear inside the blocks, of that stream (conditioning Linears, whose
  output is ``[batch, features]``, take the batch and features entries);
- ``block.input``: the stream's hidden states as a block receives them (the forward argument the stream comes in
  as, ``STREAM_ARGUMENTS``).

The backend (meshlab.parallelisms.activation_hooks) marks exactly these tensors; the cost model prices the same rules.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from meshlab.models.card import ModelCard, block_position
from meshlab.core.errors import PlanError
from meshlab.core.mesh import AbstractMesh
from meshlab.core.spec import PartitionSpec
from meshlab.strategy.schema import ActivationRule, Strategy
from meshlab.plan.tokens import token_counts

#: the note of the block.input rule planning adds for a sequence split (meshlab.plan.planned.with_block_input_split)
ADDED_SPLIT_NOTE = "added by meshlab for activations.sequence: the model patchifies its latent inside"


def added_split(activations) -> ActivationRule | None:
    """The block.input rule planning added for the sequence split (`ADDED_SPLIT_NOTE`), or None."""
    return next((r for r in activations.rules if r.note == ADDED_SPLIT_NOTE), None)


def given_rules(activations) -> list[ActivationRule]:
    """The activation rules the file gives: all of them but the one planning added (`added_split`)."""
    return [r for r in activations.rules if r.note != ADDED_SPLIT_NOTE]

#: The forward argument of a block that carries each stream's hidden states (Qwen-Image's and Flux's blocks).
STREAM_ARGUMENTS = {"image": "hidden_states", "text": "encoder_hidden_states"}


@dataclass(frozen=True)
class ActivationPoint:
    module: str  # module path
    where: str  # "kernel": q/k/v and output of its attention kernel; "input": its first input; "argument:<name>"
    point: str  # the rule's point
    stream: str
    spec: PartitionSpec
    rule: int  # index into activations.rules


def rule_spec(rule: ActivationRule) -> PartitionSpec:
    return PartitionSpec(*rule.spec)


def linear_streams(card: ModelCard) -> dict[str, str]:
    """Module path -> stream, for every Linear of the card (`ModelCard.linear_modules`)."""
    linears = card.linear_modules
    return {p.module: p.stream for p in card.parameters if p.module in linears and not p.is_bias}


def card_streams(card: ModelCard) -> tuple[str, ...]:
    return tuple(dict.fromkeys(s for a in card.attention for s in a.streams))


def activation_points(card: ModelCard, rules: list[ActivationRule] | tuple[ActivationRule, ...]
                      ) -> tuple[ActivationPoint, ...]:
    """Every tensor the rules split, in rule order (the first rule naming a tensor wins)."""
    streams = linear_streams(card)
    found: dict[tuple[str, str], ActivationPoint] = {}
    for index, rule in enumerate(rules):
        spec = rule_spec(rule)
        wanted = (lambda s: rule.stream is None or s == rule.stream)  # noqa: E731
        for attention in card.attention:
            if rule.attention is not None and (rule.attention == "cross") != bool(attention.keys):
                continue
            if rule.point == "attention.qkv":
                found.setdefault((attention.module, "kernel"), ActivationPoint(
                    attention.module, "kernel", rule.point, "+".join(attention.streams), spec, index))
            if rule.point == "attention.output":
                for module in attention.out:
                    stream = streams.get(module)
                    if stream and wanted(stream):
                        found.setdefault((module, "input"), ActivationPoint(module, "input", rule.point, stream, spec, index))
        if rule.point == "linear.output":
            for module, stream in streams.items():  # a reference stream (Wan I2V's image context) stays whole
                if block_position(module) and wanted(stream) and stream != "reference":
                    found.setdefault((module, "output"), ActivationPoint(module, "output", rule.point, stream, spec, index))
        if rule.point == "block.input":
            blocks = {_block_of(a.module): a.streams for a in card.attention if _block_of(a.module)}
            for block, block_streams in blocks.items():
                for stream in block_streams:
                    argument = STREAM_ARGUMENTS.get(stream)
                    if argument and wanted(stream):
                        where = f"argument:{argument}"
                        found.setdefault((block, where), ActivationPoint(block, where, rule.point, stream, spec, index))
    return tuple(found.values())


def check_activation_rules(strategy: Strategy, card: ModelCard, mesh: AbstractMesh) -> tuple[str, ...]:
    """Errors (PlanError, placed at the rule) for a rule the model or mesh cannot take; warnings for padding."""
    warnings = []
    streams = card_streams(card)
    tokens = token_counts(strategy.workload, card.architecture)
    for index, rule in enumerate(strategy.activations.rules):
        field = ("activations", "rules", index)
        if rule.stream is not None and rule.point == "attention.qkv":
            raise PlanError(f"activations.rules[{index}] gives attention.qkv a stream, but the attention kernel reads "
                            "q, k and v of every stream joined", "leave `stream` out of this rule",
                            field=field + ("stream",))
        if rule.attention is not None and rule.point not in ("attention.qkv", "attention.output"):
            raise PlanError(f"activations.rules[{index}] names attention {rule.attention!r} at {rule.point}, which "
                            "is no attention point", "leave `attention` out, or use attention.qkv or attention.output",
                            field=field + ("attention",))
        if rule.attention == "cross" and not any(a.keys for a in card.attention):
            raise PlanError(f"activations.rules[{index}] is for cross-attention, and {card.name} has none (its "
                            "attentions join their streams' queries and keys)", "leave `attention` out",
                            field=field + ("attention",))
        if rule.stream is not None and rule.stream not in streams:
            raise PlanError(f"activations.rules[{index}] names stream {rule.stream!r}, which {card.name} does not "
                            "have", f"use one of {list(streams)} or leave `stream` out (every stream)",
                            field=field + ("stream",))
        try:
            spec = rule_spec(rule)
        except PlanError as exc:
            raise PlanError(f"activations.rules[{index}].spec: {exc.problem}", exc.fix, field=field + ("spec",)) from None
        for axis in spec.axes:
            if axis not in mesh.names:
                raise PlanError(f"activations.rules[{index}].spec names unknown mesh axis {axis!r}",
                                f"use axes of the mesh {list(mesh.names)}", field=field + ("spec",))
        _, token_axes, feature_axes = spec.entries
        features = math.prod(mesh.size(a) for a in feature_axes or ())
        if rule.point in ("attention.qkv", "attention.output") and features > 1:
            for attention in card.attention:
                if rule.attention is not None and (rule.attention == "cross") != bool(attention.keys):
                    continue  # the rule is for the other kind of attention
                if attention.heads % features:
                    raise PlanError(
                        f"activations.rules[{index}] splits {rule.point} features over {features} devices "
                        f"({'+'.join(feature_axes)}), but {attention.module} has {attention.heads} heads, "
                        f"not divisible by {features}", heads_fix(attention.heads, features, mesh.as_dict(), (
                            set(feature_axes) == set(strategy.activations.sequence_axes))), field=field + ("spec",))
        split = math.prod(mesh.size(a) for a in token_axes or ())
        for stream in (streams if rule.stream is None else (rule.stream,)):
            n = tokens.of_stream(stream)
            if split > 1 and n % split:
                padded = -(-n // split) * split
                which = ("activations.sequence (the block.input rule planning adds for it)"
                         if rule.note == ADDED_SPLIT_NOTE else f"activations.rules[{index}]")
                warnings.append(f"{which} splits the {stream} stream's {n} tokens over {split} "
                                f"devices: XLA pads them to {padded} ({padded - n} padding tokens per sample)")
    return tuple(warnings)


def heads_fix(heads: int, devices: int, mesh: dict[str, int] | None = None, ulysses: bool = False) -> str:
    """How to split `heads` over `devices` that do not divide them: where the split is the sequence's alone
    (`ulysses`: Ulysses over the sequence axes), first what keeps every device busy (Ulysses over the largest degree
    dividing both and a ring over the rest, as xDiT's USP runs it, the `mesh`'s other axes kept; or a ring alone,
    which splits no heads), then the degree nearest `devices` that divides the heads."""
    divisors = [d for d in range(1, heads + 1) if heads % d == 0]
    nearest = min(divisors, key=lambda d: (abs(d - devices), -d))
    both, ways = math.gcd(heads, devices), ""
    if ulysses and 1 < both < devices:
        others = ",".join(f"{a}={n}" for a, n in (mesh or {}).items() if a not in ("seq", "ring") and n > 1)
        flags = ",".join(x for x in (others, f"ring={devices // both},seq={both}") if x)
        ways = (f"split heads {both} ways (it divides {heads} heads and {devices} devices) and ring the other "
                f"{devices // both}: Ulysses {both} x ring {devices // both} (a mesh axis `ring: {devices // both}` "
                f"before the Ulysses axis in activations.sequence; on the command line --mesh {flags} --rules "
                "ulysses+ring), or ")
    elif ulysses and both == 1:
        ways = f"run the {devices} devices as a ring, which splits no heads (--rules ring), or "
    return f"{ways}split heads {nearest} ways, the nearest degree that divides {heads} (any of {divisors})"


def _block_of(module: str) -> str | None:
    position = block_position(module)
    return f"{position[0]}.{position[1]}" if position else None
