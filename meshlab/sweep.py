"""Sweep: every factorization of the device count over data x cfg x sequence x model axes, with every way of
using each axis, planned and predicted.

Weights (rules derived from the model card so that any card works):

- ``data``: every weight replicated, the batch over ``data``.
- ``model`` / ``2d``: every weight of 2 or more dims on its largest dim over ``model``, the batch over ``data``
  (``model`` when ``data`` is 1).
- ``pairs``: column/row pairing: q/k/v and MLP-in by output, out-projections and MLP-out by input, modulation
  Linears by input (their chunks stay whole).
- ``fsdp`` (with any of the above): the blocks' weights also split over ``data`` and gathered before use.

Sequence (a ``seq`` axis splitting the tokens): ``ulysses`` (activation rules re-split q/k/v from tokens to heads
around attention: all-to-alls) or ``ring`` (no rule: every query gathers the keys and values of the whole
sequence, the bytes a ring passes in n - 1 steps). A ``cfg`` axis of size 2 in front puts the guidance
branches on different chips when the workload uses guidance. Every candidate uses the rewrites in
``SWEEP_REWRITES`` (equal values, fewer collectives). The batch is ``batch_per_replica`` images per ``data``
shard. A family's name lists what it uses, e.g. ``ulysses+pairs``; plans whose heads or tokens do not divide
are dropped as invalid.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from meshlab.cards.card import ModelCard
from meshlab.cost.graph import graph_of
from meshlab.cost.layout import GUIDANCE_AXIS
from meshlab.cost.predict import Prediction, predict
from meshlab.errors import InputError, MeshlabError
from meshlab.hardware import Hardware
from meshlab.memory import MemoryReport, memory_report
from meshlab.plan.plan import Plan
from meshlab.plan.planner import make_plan
from meshlab.strategy.schema import ActivationRule, Activations, Rule, Strategy, Workload

FAMILIES = ("data", "model", "2d", "pairs", "fsdp", "ulysses", "ring")
SWEEP_REWRITES = ("layernorm-rows",)
SEQUENCE_AXIS = "seq"


@dataclass(frozen=True)
class Arrangement:
    """One way of using a mesh: what splits the tokens, what splits the weights."""

    mesh: dict[str, int]
    weights: str  # "replicate", "largest" or "pairs"
    sequence: str | None = None  # "ulysses", "ring" or None
    fsdp: bool = False
    dcn: dict[str, int] = field(default_factory=dict)  # on several slices: the axis that crosses them

    @property
    def family(self) -> str:
        parts = [self.sequence] if self.sequence else []
        if self.weights != "replicate":
            parts.append("pairs" if self.weights == "pairs" else "model" if self.mesh.get("data", 1) == 1 else "2d")
        if self.fsdp:
            parts.append("fsdp")
        return "+".join(parts) or "data"

    def uses(self, families: tuple[str, ...]) -> bool:
        return all(part in families for part in self.family.split("+"))


@dataclass(frozen=True)
class Candidate:
    strategy: Strategy
    family: str
    plan: Plan | None = None
    memory: MemoryReport | None = None
    prediction: Prediction | None = None
    dropped: str = ""  # why it was dropped ("" if planned and fits)

    @property
    def fits(self) -> bool:
        return not self.dropped

    @property
    def headroom(self) -> int:
        return self.memory.most_loaded.headroom if self.memory else 0


@dataclass(frozen=True)
class SweepResult:
    candidates: tuple[Candidate, ...]
    front: tuple[Candidate, ...]  # Pareto front: fastest per image against most memory headroom, by time
    best: Candidate


def factorizations(n: int, parts: int) -> list[tuple[int, ...]]:
    """Every ordered way of writing n as a product of `parts` positive integers."""
    if parts == 1:
        return [(n,)]
    return [(d,) + rest for d in range(1, n + 1) if n % d == 0 for rest in factorizations(n // d, parts - 1)]


def arrangements(devices: int, cfg: bool) -> list[Arrangement]:
    """Every factorization into cfg x data x seq x model, with every use of the axes larger than 1."""
    found = []
    for g in ([1, 2] if cfg and devices % 2 == 0 else [1]):
        for data, seq, model in factorizations(devices // g, 3):
            mesh = {**({GUIDANCE_AXIS: g} if g > 1 else {}), "data": data,
                    **({SEQUENCE_AXIS: seq} if seq > 1 else {}), **({"model": model} if model > 1 else {})}
            for weights in (["largest", "pairs"] if model > 1 else ["replicate"]):
                for sequence in (["ulysses", "ring"] if seq > 1 else [None]):
                    for fsdp in ([False, True] if data > 1 and model == 1 else [False]):
                        found.append(Arrangement(mesh, weights, sequence, fsdp))
    return found


def meshes(devices: int, cfg: bool) -> list[tuple[str, dict[str, int]]]:
    """(family, mesh) of the arrangements without a sequence axis or FSDP: the data, model, 2d and pairs families."""
    return [(a.family, a.mesh) for a in arrangements(devices, cfg) if not a.sequence and not a.fsdp]


def family_rules(family: str) -> list[Rule]:
    """Rules of the data and largest-dim families (pairs depend on the card: see `pairs_rules`)."""
    if family == "data":
        return [Rule(match="*", shard="replicate", note="data parallel keeps every weight whole")]
    return [Rule(match="*", min_rank=2, shard="largest", axis="model",
                 note="ties go to the lowest dim (a square Linear splits its output dim)")]


def pairs_rules(plan: Plan) -> list[Rule]:
    """Column/row rules for every Linear of the card's first block, its index made a wildcard."""
    graph = graph_of(plan)
    how = {"qkv": "column", "out": "row", "hidden": "column", "chunks": "row"}
    rules, seen = [], set()
    for op in graph.linears:
        if op.block is None:
            continue
        shard = how.get(op.role) or ("row" if _follows_hidden(op, graph) else None)
        pattern = _wildcard(op.module) + ".*"
        if shard and pattern not in seen:
            seen.add(pattern)
            note = "chunks stay whole on every chip" if op.role == "chunks" else None
            rules.append(Rule(match=pattern, shard=shard, axis="model", note=note))
    return rules


def _follows_hidden(op, graph) -> bool:
    return any(o.module == op.source and o.role == "hidden" for o in graph.linears)


def _wildcard(module: str) -> str:
    parts = module.split(".")
    return ".".join("*" if p.isdigit() and i == 1 else p for i, p in enumerate(parts))


def sweep(card: ModelCard, hardware: Hardware, model: str, workload: Workload, batch_per_replica: int = 1,
          families: tuple[str, ...] = FAMILIES, progress: Callable[[int, int], None] | None = None) -> SweepResult:
    layouts = across_slices([a for a in arrangements(hardware.chips, workload.cfg) if a.uses(families)],
                            hardware.slices)
    base_rules = None
    candidates = []
    for i, arrangement in enumerate(layouts):
        if arrangement.weights == "pairs" and base_rules is None:
            probe = {"data": 1, "model": hardware.chips}
            base_rules = pairs_rules(make_plan(_strategy("probe", "pairs", probe, [], model, hardware, workload, 1),
                                               card, hardware.chips))
        rules = _rules(arrangement, base_rules, card)
        candidates.append(_evaluate(arrangement.family, arrangement.mesh, rules, card, hardware, model, workload,
                                    batch_per_replica, _activations(arrangement), SWEEP_REWRITES, arrangement.dcn))
        if progress:
            progress(i + 1, len(layouts))
    fitting = [c for c in candidates if c.fits]
    if not fitting:
        examples = "; ".join(f"{c.strategy.name}: {c.dropped}" for c in candidates[:3])
        raise InputError(
            f"no factorization of {hardware.chips} devices over {', '.join(families)} plans and fits "
            f"{card.name} on {hardware.name} (e.g. {examples})",
            "try more devices, a smaller workload, or a strategy of your own with `meshlab try`",
        )
    front = pareto(fitting)
    best = min(fitting, key=lambda c: (c.prediction.seconds_per_image, -c.headroom))
    return SweepResult(tuple(candidates), front, best)


def across_slices(layouts: list[Arrangement], slices: int) -> list[Arrangement]:
    """On several slices, each arrangement once per mesh axis that can cross them (its size a multiple of the
    slice count): which axis goes over DCN is part of the plan."""
    if slices == 1:
        return layouts
    return [replace(a, dcn={axis: slices}) for a in layouts for axis, size in a.mesh.items() if size % slices == 0]


def _rules(arrangement: Arrangement, pairs: list[Rule] | None, card: ModelCard) -> list[Rule]:
    """The weight rules of an arrangement; FSDP (without a model axis) splits every block weight over ``data``."""
    if arrangement.weights == "pairs":
        return pairs
    if arrangement.weights == "largest":
        return family_rules("model")
    if arrangement.fsdp:
        return [*(Rule(match=f"{name}.*", min_rank=2, shard="largest", axis="data",
                       note="sharded at rest, gathered before use (FSDP)") for name in sorted(card.block_lists)),
                Rule(match="*", shard="replicate")]
    return family_rules("data")


def _activations(arrangement: Arrangement) -> Activations:
    """The activation rules of an arrangement: Ulysses re-splits attention's q/k/v to heads and back; FSDP pins
    every block Linear's output to the batch split (else XLA gathers activations, not weights: see fsdp.yaml)."""
    mesh = arrangement.mesh
    batch = [a for a in (GUIDANCE_AXIS, "data") if a in mesh]
    batch_entry = batch[0] if len(batch) == 1 else batch
    sequence = SEQUENCE_AXIS if arrangement.sequence else None
    rules = []
    if arrangement.fsdp:
        rules.append(ActivationRule(point="linear.output", spec=[batch_entry, sequence, None]))
    if arrangement.sequence == "ulysses":
        heads = ["model", SEQUENCE_AXIS] if "model" in mesh else SEQUENCE_AXIS
        features = "model" if arrangement.weights == "pairs" else None
        rules += [ActivationRule(point="block.input", spec=[batch_entry, SEQUENCE_AXIS, None]),
                  ActivationRule(point="attention.qkv", spec=[batch_entry, None, heads]),
                  ActivationRule(point="attention.output", spec=[batch_entry, SEQUENCE_AXIS, features])]
    return Activations(batch="data", sequence=sequence, rules=rules)


def pareto(candidates: list[Candidate]) -> tuple[Candidate, ...]:
    """Candidates no other beats on both time per image (lower) and headroom (higher), fastest first."""
    ordered = sorted(candidates, key=lambda c: (c.prediction.seconds_per_image, -c.headroom))
    front, best_headroom = [], -math.inf
    for c in ordered:
        if c.headroom > best_headroom:
            front.append(c)
            best_headroom = c.headroom
    return tuple(front)


def _name(family: str, mesh: dict[str, int], dcn: dict[str, int] | None = None) -> str:
    across = "".join(f"-dcn-{axis}" for axis in dcn or {})
    return family.replace("+", "-") + "-" + "x".join(f"{k}{v}" for k, v in mesh.items()) + across


def _strategy(name, family, mesh, rules, model, hardware, workload, batch_per_replica, activations=None,
              rewrites=(), dcn=None) -> Strategy:
    data = mesh.get("data", 1)
    across = "".join(f", {axis} across {k} slices" for axis, k in (dcn or {}).items())
    return Strategy(
        name=name,
        description=f"{family} family on a {' x '.join(f'{k} {v}' for k, v in mesh.items())} mesh{across} "
                    "(from meshlab sweep)",
        model=model, hardware=hardware.name, mesh=mesh, rules=rules, dcn=dict(dcn or {}),
        activations=activations or Activations(batch="data"),
        workload=workload.model_copy(update={"batch": data * batch_per_replica}),
        rewrites=list(rewrites),
    )


def _evaluate(family, mesh, rules, card, hardware, model, workload, batch_per_replica, activations=None,
              rewrites=(), dcn=None) -> Candidate:
    strategy = _strategy(_name(family, mesh, dcn), family, mesh, rules, model, hardware, workload, batch_per_replica,
                         activations, rewrites, dcn)
    try:
        plan = make_plan(strategy, card, hardware.chips)
        memory = memory_report(plan, strategy, hardware.usable_hbm_bytes, hardware.runtime_reserve_bytes)
        prediction = predict(plan, strategy, hardware)
    except MeshlabError as exc:
        return Candidate(strategy, family, dropped=f"invalid: {exc.problem}")
    chip = memory.most_loaded
    dropped = "" if memory.fits else f"does not fit: {chip.total / 2**30:.1f} GiB of {chip.hbm / 2**30:.2f} GiB"
    return Candidate(strategy, family, plan, memory, prediction, dropped)


def strategy_yaml(candidate: Candidate, hardware: Hardware) -> str:
    """A ready strategy file for `candidate`, with a header saying what it is and what meshlab predicts."""
    import yaml

    s, p = candidate.strategy, candidate.prediction
    rules = [{k: v for k, v in r.model_dump(exclude_none=True).items() if not (k == "min_rank" and v == 0)}
             for r in s.rules]
    document = {
        "name": s.name, "description": s.description, "model": s.model, "hardware": _hardware_entry(hardware),
        "mesh": dict(s.mesh), **({"dcn": dict(s.dcn)} if s.dcn else {}), "rules": rules, "activations": s.activations.model_dump(exclude_none=True),
        "rewrites": list(s.rewrites), "workload": s.workload.model_dump(), "placement": s.placement.model_dump(),
    }
    header = (
        f"# Written by `meshlab sweep`: the fastest plan that fits, of {candidate.family} family.\n"
        f"# Predicted (not measured) on {hardware.name}: {p.seconds_per_image:.2f} s per image, "
        f"{p.step.total * 1e3:.0f} ms per step, MFU {100 * p.mfu:.0f}%, "
        f"{candidate.headroom / 2**30:.2f} GiB headroom per chip.\n"
    )
    if GUIDANCE_AXIS in s.mesh:
        header += (f"# Mesh axis '{GUIDANCE_AXIS}' puts the two guidance branches on different chips: run cond and "
                   "uncond as one call of twice the batch, prompts padded to one length.\n")
    return header + yaml.safe_dump(document, sort_keys=False, default_flow_style=None, width=110)


def _hardware_entry(hardware: Hardware) -> str | dict:
    """The catalog name, or the name with the figures the sweep overrode (e.g. --devices)."""
    if not hardware.overridden:
        return hardware.name
    plain = {k: list(v) if isinstance(v, tuple) else v for k in hardware.overridden for v in [getattr(hardware, k)]}
    return {"name": hardware.name, **plain}


def sweep_document(result: SweepResult, hardware: Hardware, seconds: float | None = None) -> dict:
    from meshlab.cost.document import assumptions_document, prediction_document

    def row(c: Candidate) -> dict:
        doc = {"name": c.strategy.name, "family": c.family, "mesh": dict(c.strategy.mesh),
               **({"dcn": dict(c.strategy.dcn)} if c.strategy.dcn else {}),
               "batch": c.strategy.workload.batch, "fits": c.fits, "dropped": c.dropped}
        if c.memory is not None:
            doc["peak_bytes_per_chip"] = c.memory.most_loaded.total
            doc["headroom_bytes_per_chip"] = c.headroom
        if c.prediction is not None:
            doc["predicted"] = prediction_document(c.prediction)
        return doc

    return {
        "label": "predicted",
        "hardware": hardware.name,
        "devices": hardware.chips,
        "candidates": [row(c) for c in result.candidates],
        "pareto_front": [c.strategy.name for c in result.front],
        "best": result.best.strategy.name,
        "sweep_seconds": seconds,
        "assumptions": assumptions_document(hardware),
    }
