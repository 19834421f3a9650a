"""Rules are data; resolving them is one pure function.

``resolve(parameter, rules, mesh)`` returns the spec of the first rule that matches, or a replicated spec
and ``None`` when none does. Example, on a (data: 2, model: 4) mesh::

    rules = compile_rules([Rule(match="*.to_q.*", shard="column", axis="model")])
    resolve(Parameter("blocks.0.attn.to_q.weight", (3072, 3072), ...), rules, mesh)
    # -> (PartitionSpec(("model",), None), 0)
    resolve(Parameter("blocks.0.attn.to_q.bias", (3072,), ...), rules, mesh)
    # -> (PartitionSpec(("model",),), 0)        the bias follows the weight's output dim
"""

from __future__ import annotations

import fnmatch
import functools
import re
from dataclasses import dataclass

from meshlab.models.card import Parameter
from meshlab.core.errors import PlanError
from meshlab.core.mesh import AbstractMesh
from meshlab.core.spec import PartitionSpec
from meshlab.strategy.schema import Rule


@dataclass(frozen=True)
class CompiledRule:
    index: int
    rule: Rule
    pattern: re.Pattern

    def matches(self, parameter: Parameter) -> bool:
        return parameter.rank >= self.rule.min_rank and _matched(self.pattern, parameter.name)


@functools.lru_cache(maxsize=1 << 16)
def _matched(pattern: re.Pattern, name: str) -> bool:
    """A sweep plans one card's names under the same few rules many times: each match is worked out once."""
    return pattern.fullmatch(name) is not None


def compile_rules(rules: list[Rule] | tuple[Rule, ...]) -> tuple[CompiledRule, ...]:
    return tuple(CompiledRule(i, r, _compile(r)) for i, r in enumerate(rules))


def _compile(rule: Rule) -> re.Pattern:
    source = fnmatch.translate(rule.match) if rule.match is not None else rule.regex
    return re.compile(source)


def check_rule_axes(rules: tuple[CompiledRule, ...], mesh: AbstractMesh) -> None:
    """Every axis a rule names must be on the mesh, whether or not the rule matched anything."""
    for compiled in rules:
        rule = compiled.rule
        named = rule.axes if not isinstance(rule.shard, list) else _explicit_axes(rule.shard)
        for axis in named:
            if axis not in mesh.names:
                raise PlanError(
                    f"rule {compiled.index} ({rule.pattern}) names unknown mesh axis {axis!r}",
                    f"use one of the mesh axes {list(mesh.names)}",
                    field=("rules", compiled.index, "axis" if not isinstance(rule.shard, list) else "shard"),
                )


def _explicit_axes(entries: list) -> list[str]:
    return [a for e in entries if e is not None for a in ([e] if isinstance(e, str) else e)]


def resolve(
    parameter: Parameter, rules: tuple[CompiledRule, ...], mesh: AbstractMesh
) -> tuple[PartitionSpec, int | None]:
    for compiled in rules:
        if compiled.matches(parameter):
            return _apply(compiled, parameter, mesh), compiled.index
    return PartitionSpec.replicated(parameter.rank), None


def _apply(compiled: CompiledRule, parameter: Parameter, mesh: AbstractMesh) -> PartitionSpec:
    rule, field = compiled.rule, ("rules", compiled.index, "shard")
    try:
        if rule.shard == "replicate":
            return PartitionSpec.replicated(parameter.rank)
        if rule.shard == "largest":
            return _largest(parameter, rule.axes)
        if rule.shard in ("column", "row"):
            return _linear(parameter, rule.shard, rule.axes, compiled.index)
        return _explicit(parameter, rule.shard, compiled.index)
    except PlanError as exc:
        raise PlanError(exc.problem, exc.fix, field=exc.field or field) from None


def _largest(parameter: Parameter, axes: tuple[str, ...]) -> PartitionSpec:
    if parameter.rank == 0:
        return PartitionSpec()
    dim = max(range(parameter.rank), key=lambda d: (parameter.shape[d], -d))
    return PartitionSpec.of(*[axes if d == dim else None for d in range(parameter.rank)])


def _linear(parameter: Parameter, how: str, axes: tuple[str, ...], index: int) -> PartitionSpec:
    """A column or row split of a Linear, or of a pointwise convolution's [out, in, 1, 1] weight (the Linear over
    channels it is: its kernel dims stay whole)."""
    pointwise = parameter.kind == "conv" and (parameter.is_bias or parameter.pointwise)
    if parameter.kind != "linear" and not pointwise:
        raise PlanError(
            f"rule {index} shards {parameter.name} as '{how}' but it belongs to a {parameter.kind}, not a Linear",
            "narrow the rule's pattern to Linear weights and biases, or use largest / an explicit spec",
        )
    if parameter.is_bias:  # the bias follows the weight's output dim
        return PartitionSpec.of(axes if how == "column" else None)
    kernel = (None,) * (parameter.rank - 2)
    return PartitionSpec.of(axes, None, *kernel) if how == "column" else PartitionSpec.of(None, axes, *kernel)


def _explicit(parameter: Parameter, entries: list, index: int) -> PartitionSpec:
    if len(entries) != parameter.rank:
        raise PlanError(
            f"rule {index} gives a spec of {len(entries)} entries to {parameter.name}, which has "
            f"{parameter.rank} dims {list(parameter.shape)}",
            "give one entry per dim, or narrow the pattern (min_rank helps)",
        )
    return PartitionSpec(*entries)
