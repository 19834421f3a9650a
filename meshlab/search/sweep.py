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

from meshlab.models.card import ModelCard
from meshlab.cost.graph import graph_of
from meshlab.plan.axes import GUIDANCE_AXIS
from meshlab.plan.activations import given_rules
from meshlab.cost.predict import Prediction, plan_work, predict
from meshlab.search.compare import TIE_RATIO
from meshlab.core.errors import InputError, MeshlabError
from meshlab.core.hardware import Hardware
from meshlab.plan.memory import MemoryReport, ScoreBuffers, gathered_blocks_on, memory_on
from meshlab.plan.plan import Plan
from meshlab.plan.planned import planned_with_block_input, with_pipeline_vae_dtype
from meshlab.plan.planner import make_plan
from meshlab.strategy.schema import (ActivationRule, Activations, Compile, Rule, Strategy, Workload, output_noun,
                                     with_article)

FAMILIES = ("data", "model", "2d", "pairs", "fsdp", "ulysses", "ring")
#: What `best` minimises: "latency" (seconds one request waits), "throughput" (seconds per image with the plan's
#: batch in flight), or "cost" (dollars per image).
OBJECTIVES = ("latency", "throughput", "cost")
#: What `meshlab sweep` compares when no --hardware is given: one host of each TPU in the catalog, each GPU
#: node whole, and one GPU of each (what clouds rent by the hour); a model that fits none of them says so.
DEFAULT_SYSTEMS = ("v6e-8", "v5e-8", "v5p-8", "v4-8", "h100", "h200", "a100-80gb", "h100:1", "h200:1", "a100-80gb:1")
SWEEP_REWRITES = ("layernorm-rows",)
SEQUENCE_AXIS = "seq"
RING_AXIS = "ring"  # USP's ring axis, beside SEQUENCE_AXIS carrying Ulysses
#: What runs a sequence split on each kind of system (Activations.sequence_parallel): on GPUs xDiT (its Ulysses, and
#: its ring's passes over blocks sent by async send/recv), on TPUs XLA's partitioner (a ring's keys gathered)
RUNTIME_BY_KIND = {"gpu": "xdit", "tpu": "partitioner"}


@dataclass(frozen=True)
class Arrangement:
    """One way of using a mesh: what splits the tokens, what splits the weights."""

    mesh: dict[str, int]
    weights: str  # "replicate", "largest" or "pairs"
    sequence: str | None = None  # "ulysses", "ring", "ulysses+ring" (USP: mesh axes seq and ring) or None
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
    hardware: Hardware | None = None  # the system it was planned and priced on
    images: int | None = None  # the images a user plans to make in one session (None: the steady state)

    @property
    def fits(self) -> bool:
        return not self.dropped

    @property
    def headroom(self) -> int:
        return self.memory.most_loaded.headroom if self.memory else 0

    @property
    def seconds(self) -> float:
        """Seconds per image at throughput: the call's time shared among its images (what the chips are held for)."""
        return self.prediction.seconds_per_image

    @property
    def latency(self) -> float:
        """Seconds one request waits for its image: a whole pipeline call, its images all coming out at its end."""
        return self.prediction.first_call_s

    @property
    def usd(self) -> float | None:
        """Dollars per image: the steady state's, or over `images` images with the startup (load, compile) shared
        among them."""
        if self.prediction is None:
            return None
        return self.prediction.usd_per_image if self.images is None else self.prediction.usd_per_image_over(self.images)


@dataclass(frozen=True)
class Limits:
    """Goals a plan must meet to be chosen: seconds per image and dollars per image, at most (None: no goal). The
    seconds are one request's wait for its image (latency), or with `throughput` (the throughput objective) each
    image's share of a call (seconds per image with the plan's batch in flight)."""

    max_seconds_per_image: float | None = None
    max_usd_per_image: float | None = None
    throughput: bool = False

    def seconds(self, c: Candidate) -> float:
        """The candidate's seconds the goal holds: its latency, or its seconds per image at throughput."""
        return c.seconds if self.throughput else c.latency

    def problem(self, c: Candidate) -> str:
        """Why a fitting candidate misses the goals ("" when it meets them)."""
        made = output_noun([c.strategy.workload])
        if self.max_seconds_per_image is not None and self.seconds(c) > self.max_seconds_per_image:
            what = f"s per {made} at throughput" if self.throughput else f"s for {with_article(made)} (latency)"
            return f"{self.seconds(c):.2f} {what}, over the {self.max_seconds_per_image:g} s goal"
        if self.max_usd_per_image is not None and (c.usd is None or c.usd > self.max_usd_per_image):
            cost = "no price" if c.usd is None else f"${c.usd:.4f} per {made}"
            return f"{cost}, over the ${self.max_usd_per_image:g} budget"
        return ""

    def shortfall(self, c: Candidate) -> float:
        """How far a candidate is from the goals, as the largest ratio to a goal (<= 1: meets them)."""
        ratios = [self.seconds(c) / self.max_seconds_per_image] if self.max_seconds_per_image else []
        if self.max_usd_per_image is not None:
            ratios.append(math.inf if c.usd is None else c.usd / max(self.max_usd_per_image, 1e-12))
        return max(ratios, default=0.0)

    @property
    def given(self) -> bool:
        return self.max_seconds_per_image is not None or self.max_usd_per_image is not None


@dataclass(frozen=True)
class Binding:
    """What limits a system: the term that takes the most of its best plan's time per image, or its memory."""

    term: str  # "HBM capacity", "compute", "HBM bandwidth", "collectives", "host", "VAE decode"
    seconds: float | None  # that term's seconds per image (None for HBM capacity)
    share: float | None  # of the plan's seconds per image
    move: str  # what would move it

    def describe(self) -> str:
        if self.seconds is None:
            return f"{self.term}: {self.move}"
        return f"{self.term} ({self.seconds:.2f} s, {100 * self.share:.0f}% of its time): {self.move}"


@dataclass(frozen=True)
class SystemSummary:
    hardware: Hardware
    best: Candidate | None  # the best plan by the objective that fits and meets the goals (a tie: the cheaper)
    fitting: int
    dropped: int
    binding: Binding


@dataclass(frozen=True)
class SweepResult:
    candidates: tuple[Candidate, ...]
    front: tuple[Candidate, ...]  # Pareto front: fastest per image against most memory headroom, by time
    best: Candidate | None  # the plan that fits, meets the goals and is best by the objective (None: none meets them)
    cheapest: Candidate | None = None  # the lowest dollars per image among those
    cost_front: tuple[Candidate, ...] = ()  # Pareto front of seconds against dollars per image, fastest first
    systems: tuple[SystemSummary, ...] = ()
    limits: Limits = Limits()
    closest: Candidate | None = None  # when no plan meets the goals: the one nearest them
    images: int | None = None  # dollars per image are over this many images, startup included (None: steady state)
    objective: str = "latency"
    lowest_latency: Candidate | None = None
    highest_throughput: Candidate | None = None


def factorizations(n: int, parts: int) -> list[tuple[int, ...]]:
    """Every ordered way of writing n as a product of `parts` positive integers."""
    if parts == 1:
        return [(n,)]
    return [(d,) + rest for d in range(1, n + 1) if n % d == 0 for rest in factorizations(n // d, parts - 1)]


def arrangements(devices: int, cfg: bool) -> list[Arrangement]:
    """Every factorization into cfg x data x seq x model, with every use of the axes larger than 1; a sequence
    split of 4 or more also as USP, every ring x ulysses factorization of it with both larger than 1."""
    found = []
    for g in ([1, 2] if cfg and devices % 2 == 0 else [1]):
        for data, seq, model in factorizations(devices // g, 3):
            sequences: list[tuple[str | None, dict[str, int]]] = [(None, {})]
            if seq > 1:
                sequences = [("ulysses", {SEQUENCE_AXIS: seq}), ("ring", {SEQUENCE_AXIS: seq})]
                sequences += [("ulysses+ring", {RING_AXIS: r, SEQUENCE_AXIS: u})
                              for r, u in factorizations(seq, 2) if r > 1 and u > 1]
            for sequence, axes in sequences:
                mesh = {**({GUIDANCE_AXIS: g} if g > 1 else {}), "data": data, **axes,
                        **({"model": model} if model > 1 else {})}
                for weights in (["largest", "pairs"] if model > 1 else ["replicate"]):
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
          families: tuple[str, ...] = FAMILIES, progress: Callable[[int, int], None] | None = None,
          limits: Limits = Limits(), objective: str = "latency") -> SweepResult:
    """Every arrangement of `hardware`'s chips, planned and predicted (`sweep_systems` with one system)."""
    return sweep_systems(card, (hardware,), model, workload, batch_per_replica, families, progress, limits,
                         objective=objective)


def sweep_systems(card: ModelCard, systems: tuple[Hardware, ...], model: str, workload: Workload,
                  batch_per_replica: int = 1, families: tuple[str, ...] = FAMILIES,
                  progress: Callable[[int, int], None] | None = None, limits: Limits = Limits(),
                  images: int | None = None, objective: str = "latency", text_encoder: str = "auto") -> SweepResult:
    """Every arrangement of each system's chips, planned and predicted on it. Systems of one size and kind share
    their plans, per-chip memory (re-sized to each chip's HBM) and per-call work: only the pricing is per system.
    GPU candidates run eager (as diffusers runs a pipeline), TPU candidates fused (XLA).
    With one system a candidate keeps its plain name; with several its name ends in the system's. With `images`,
    dollars per image are over that many images, the load and compile before the first shared among them."""
    groups: dict[tuple[int, int, str], list[Hardware]] = {}
    for hw in systems:  # one kind of chip: GPUs run eager, TPUs fused (see _strategy), so their work differs
        groups.setdefault((hw.chips, hw.slices, hw.kind), []).append(hw)
    layouts = {key: across_slices([a for a in arrangements(key[0], workload.cfg) if a.uses(families)], key[1])
               for key in groups}
    total, done = sum(len(layouts[k]) * len(v) for k, v in groups.items()), 0
    suffix = len(systems) > 1
    kept = None
    if any(hw.kind == "tpu" for hw in systems):  # a TPU plan's time to first image takes its measured compile
        from meshlab.plan.compile_times import read_compile_times

        kept = read_compile_times()
    candidates = []
    for key, members in groups.items():
        base_rules = None
        for arrangement in layouts[key]:
            if arrangement.weights == "pairs" and base_rules is None:
                probe = {"data": 1, "model": key[0]}
                base_rules = pairs_rules(make_plan(_strategy("probe", "pairs", probe, [], model, members[0],
                                                             workload, 1), card, key[0]))
            shared = _Shared()
            for hw in members:
                candidates.append(_evaluate(arrangement.family, arrangement.mesh, _rules(arrangement, base_rules, card),
                                            card, hw, model, workload, batch_per_replica,
                                            _activations(arrangement, RUNTIME_BY_KIND.get(hw.kind, "partitioner")),
                                            SWEEP_REWRITES, arrangement.dcn, shared, suffix, images,
                                            text_encoder, kept))
                done += 1
                if progress:
                    progress(done, total)
    fitting = [c for c in candidates if c.fits]
    if not fitting and len(systems) == 1:
        hardware = systems[0]
        examples = "; ".join(f"{c.strategy.name}: {c.dropped}" for c in candidates[:3])
        raise InputError(
            f"no factorization of {hardware.chips} devices over {', '.join(families)} plans and fits "
            f"{card.name} on {hardware.name} (e.g. {examples})",
            "try more devices, a smaller workload, or a strategy of your own with `meshlab try`",
        )
    eligible = [c for c in fitting if not limits.problem(c)]
    priced = [c for c in eligible if c.usd is not None]
    fastest = min(eligible, key=ranking_key("latency"), default=None)
    busiest = min(eligible, key=ranking_key("throughput"), default=None)
    cheapest = min(priced, key=lambda c: (c.usd, c.latency), default=None)
    best = cheapest if objective == "cost" else _best_of(eligible, objective)  # a tie goes to the cheaper plan
    closest = min(fitting, key=lambda c: (limits.shortfall(c), c.latency), default=None) if not eligible else None
    summaries = tuple(_summary(hw, [c for c in candidates if c.hardware is hw], limits, objective) for hw in systems)
    return SweepResult(tuple(candidates), pareto(eligible, objective), best, cheapest, cost_pareto(priced), summaries,
                       limits, closest, images, objective, fastest, busiest)


def _best_of(candidates: list[Candidate], objective: str) -> Candidate | None:
    """The first by `objective`; among plans within TIE_RATIO of its time (a tie, as compare calls it), the cheapest
    per image."""
    first = min(candidates, key=ranking_key(objective), default=None)
    if first is None or objective == "cost":
        return first
    time = (lambda c: c.seconds) if objective == "throughput" else (lambda c: c.latency)  # noqa: E731
    tied = [c for c in candidates if time(c) <= TIE_RATIO * time(first)]
    return min(tied, key=lambda c: (c.usd if c.usd is not None else float("inf"), *ranking_key(objective)(c)))


def ranking_key(objective: str):
    """How candidates are ordered by an objective (ties: the other time, then more headroom)."""
    if objective == "throughput":
        return lambda c: (c.seconds, c.latency, -c.headroom)
    if objective == "cost":
        return lambda c: (c.usd if c.usd is not None else float("inf"), c.latency, -c.headroom)
    return lambda c: (c.latency, c.seconds, -c.headroom)


class _Shared:
    """What one arrangement's candidates on systems of one size share: its plan, memory (by the blocks a chip holds
    gathered at once, meshlab.plan.memory.gathered_blocks_on, and the keys at which its math attention holds one
    score buffer or more, meshlab.plan.memory.ScoreBuffers: systems of one size may differ in them) and per-call
    work."""

    plan = work = activations = strategy = None
    problem = ""

    def __init__(self):
        self.memory: dict[tuple, object] = {}


def _summary(hw: Hardware, candidates: list[Candidate], limits: Limits, objective: str = "latency") -> SystemSummary:
    fitting = [c for c in candidates if c.fits]
    eligible = [c for c in fitting if not limits.problem(c)]
    best = _best_of(eligible, objective)
    shown = best or min(fitting, key=lambda c: (limits.shortfall(c), c.latency), default=None)
    return SystemSummary(hw, best, len(fitting), len(candidates) - len(fitting), binding(shown, candidates, hw))


def binding(best: Candidate | None, candidates: list[Candidate], hw: Hardware) -> Binding:
    """The term that limits `best` on `hw` (or its memory, when nothing fits), and what would move it."""
    if best is None:
        planned = [c for c in candidates if c.memory is not None]
        if not planned:
            return Binding("HBM capacity", None, None, "no arrangement plans (heads or tokens do not divide)")
        least = min(planned, key=lambda c: c.memory.most_loaded.total)
        chip = least.memory.most_loaded
        return Binding("HBM capacity", None, None, f"no plan fits: the leanest needs {chip.total / 2**30:.1f} GiB "
                       f"of {chip.hbm / 2**30:.2f} GiB per chip; more chips, or chips with more HBM")
    p = best.prediction
    what = output_noun([best.strategy.workload])
    steps_per_image = p.layout.steps / p.layout.images
    compute_bound = p.step.compute >= p.step.hbm
    terms = p.terms
    on_host = best.strategy.placement.text_encoder != "device"
    host = terms.overhead_s + terms.transfer_s + (terms.text_encode_s if on_host else 0.0)
    rows = [
        ("compute" if compute_bound else "HBM bandwidth", p.step.local * steps_per_image,
         "more chips splitting the work, or a faster chip" if compute_bound else
         f"more {what}s per call (the weights are read once per call), or chips with faster HBM"),
        # where the host's dispatches outlast the chip's work they set the whole step, not only the wait beyond it
        ("host launches", (p.step.launch_floor if p.step.launch_wait else 0.0) * steps_per_image,
         f"torch.compile (fewer, fused kernels) or CUDA graphs, or more work per call (larger {what}s, fewer "
         "chips)"),
        ("collectives", p.step.collective * steps_per_image,
         "replicate the weights where they fit (FSDP gathers them every call), or a faster interconnect"
         if best.family.split("+")[-1] == "fsdp" else
         "fewer splits of the weights (more data or cfg parallelism), or a faster interconnect"),
        ("host", host, "placement.text_encoder: device, where it fits" if on_host else
         "fewer host round trips per step"),
        ("text encode", 0.0 if on_host else terms.text_encode_s, "an encoder split over the chips, or a smaller one"),
        ("VAE decode", terms.vae_decode_s, "decode the batch over more chips"),
    ]
    term, seconds, move = max(rows, key=lambda row: row[1])
    return Binding(term, seconds, seconds / p.seconds_per_image, move)


def quick_strategy(card: ModelCard, hardware: Hardware, model: str, workload: Workload, mesh: dict[str, int],
                   parts: list[str]) -> Strategy:
    """The strategy the sweep would build for `mesh` and the families `parts` (``["ulysses", "pairs"]``): what
    `meshlab try --model --mesh --rules` plans. A family the mesh cannot carry is an InputError naming why."""
    from meshlab.core.errors import Location

    def refuse(problem: str, fix: str) -> InputError:
        return InputError(problem, fix, Location("command line: --rules"))

    sequence = "+".join(p for p in ("ulysses", "ring") if p in parts) or None
    weights = "pairs" if "pairs" in parts else "largest" if {"model", "2d"} & set(parts) else "replicate"
    fsdp = "fsdp" in parts
    if sequence and mesh.get(SEQUENCE_AXIS, 1) < 2:
        raise refuse(f"--rules {sequence} splits the tokens over {SEQUENCE_AXIS}, and --mesh has no {SEQUENCE_AXIS} "
                     "axis larger than 1", f"add {SEQUENCE_AXIS}=N to --mesh")
    if mesh.get(RING_AXIS, 1) > 1 and sequence != "ulysses+ring":
        raise InputError(f"--mesh has a {RING_AXIS} axis, which only USP uses (--rules ulysses+ring: the ring over "
                         f"{RING_AXIS}, Ulysses over {SEQUENCE_AXIS}); --rules {'+'.join(parts)} would leave it idle",
                         f"use --mesh {RING_AXIS}=R,{SEQUENCE_AXIS}=U --rules ulysses+ring, or a ring alone as --mesh "
                         f"{SEQUENCE_AXIS}=N --rules ring", Location("command line: --mesh"))
    if sequence == "ulysses+ring" and mesh.get(RING_AXIS, 1) < 2:
        raise refuse(f"--rules ulysses+ring (USP) runs Ulysses over {SEQUENCE_AXIS} and a ring over {RING_AXIS}, and "
                     f"--mesh has no {RING_AXIS} axis larger than 1", f"add {RING_AXIS}=N to --mesh, e.g. "
                     f"{RING_AXIS}=2,{SEQUENCE_AXIS}=2")
    if weights != "replicate" and mesh.get("model", 1) < 2:
        raise refuse("--rules splits weights over model, and --mesh has no model axis larger than 1",
                     "add model=N to --mesh")
    if fsdp and (mesh.get("data", 1) < 2 or weights != "replicate"):
        raise refuse("--rules fsdp splits the blocks' weights over data: it needs a data axis and no model split",
                     "use --mesh data=N with --rules fsdp (or ulysses+fsdp)")
    arrangement = Arrangement(dict(mesh), weights, sequence, fsdp)
    base = None
    if weights == "pairs":
        probe = {"data": 1, "model": hardware.chips}
        base = pairs_rules(make_plan(_strategy("probe", "pairs", probe, [], model, hardware, workload, 1), card,
                                     hardware.chips))
    return _strategy("quick", arrangement.family, mesh, _rules(arrangement, base, card), model, hardware, workload,
                     1, _activations(arrangement, RUNTIME_BY_KIND.get(hardware.kind, "partitioner")), SWEEP_REWRITES)


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


def _activations(arrangement: Arrangement, runtime: str = "partitioner") -> Activations:
    """The activation rules of an arrangement: Ulysses re-splits attention's q/k/v to heads and back (under USP
    the tokens stay split over the ring axis at the kernel); FSDP pins every block Linear's output to the batch
    split (else XLA gathers activations, not weights: see fsdp.yaml). `runtime`: what runs a sequence split."""
    mesh = arrangement.mesh
    batch = [a for a in (GUIDANCE_AXIS, "data") if a in mesh]
    batch_entry = batch[0] if len(batch) == 1 else batch
    usp = arrangement.sequence == "ulysses+ring"
    sequence = [RING_AXIS, SEQUENCE_AXIS] if usp else SEQUENCE_AXIS if arrangement.sequence else None
    rules = []
    if arrangement.fsdp:
        rules.append(ActivationRule(point="linear.output", spec=[batch_entry, sequence, None]))
    if arrangement.sequence in ("ulysses", "ulysses+ring"):
        heads = ["model", SEQUENCE_AXIS] if "model" in mesh else SEQUENCE_AXIS
        features = "model" if arrangement.weights in ("pairs", "largest") else None
        # largest-dim weights keep the residual split on model between blocks: a block.input spec that left the
        # features whole would gather it every block (XLA:TPU, Qwen-Image over seq 2 x model 4 at 256²: 6 all-gathers
        # of 3,538,944 B a block against 4 of 1,769,472 B keeping model, and 5.6 MB of collectives against 4.1 MB)
        residual = "model" if arrangement.weights == "largest" else None
        rules += [ActivationRule(point="block.input", spec=[batch_entry, sequence, residual]),
                  ActivationRule(point="attention.qkv", spec=[batch_entry, RING_AXIS if usp else None, heads]),
                  ActivationRule(point="attention.output", spec=[batch_entry, sequence, features])]
    return Activations(batch="data", sequence=sequence, rules=rules,
                       sequence_parallel=runtime if arrangement.sequence else "partitioner")


def pareto(candidates: list[Candidate], objective: str = "throughput") -> tuple[Candidate, ...]:
    """Candidates no other beats on both the objective (lower) and headroom (higher), best first."""
    ordered = sorted(candidates, key=ranking_key(objective))
    front, best_headroom = [], -math.inf
    for c in ordered:
        if c.headroom > best_headroom:
            front.append(c)
            best_headroom = c.headroom
    return tuple(front)


def cost_pareto(candidates: list[Candidate]) -> tuple[Candidate, ...]:
    """Priced candidates no other beats on both latency and dollars per image (both lower), fastest first."""
    ordered = sorted((c for c in candidates if c.usd is not None), key=lambda c: (c.latency, c.usd))
    front, cheapest = [], math.inf
    for c in ordered:
        if c.usd < cheapest:
            front.append(c)
            cheapest = c.usd
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
        # a GPU runs as diffusers runs it, eager (torch.compile's fusion would need a compile the startup prices)
        compile=Compile(elementwise="eager" if hardware.kind == "gpu" else "fused"),
    )


def _evaluate(family, mesh, rules, card, hardware, model, workload, batch_per_replica, activations=None,
              rewrites=(), dcn=None, shared: _Shared | None = None, suffix: bool = False,
              images: int | None = None, text_encoder: str = "host", kept=None) -> Candidate:
    """One arrangement planned and priced on `hardware`; `shared` carries the plan, memory and work to the other
    systems of its size (each prices them itself). `text_encoder`: "host", "device", or "auto" (the device where
    the plan still fits with it there, as diffusers places it on a GPU, else the host). A plan whose full VAE
    decode is what does not fit decodes in tiles instead (``placement.vae_decode: tiled``), as a user would turn
    on ``vae.enable_tiling()``, before the text encoder leaves the device. `kept`: XLA:TPU compiles measured
    (meshlab.plan.compile_times): a TPU candidate's startup takes its own where one was kept, as `try` does."""
    shared = shared if shared is not None else _Shared()
    name = _name(family, mesh, dcn) + (f"-on-{hardware.name.replace(':', '-')}" if suffix else "")
    strategy = _strategy(name, family, mesh, rules, model, hardware, workload, batch_per_replica, activations,
                         rewrites, dcn)
    strategy = with_pipeline_vae_dtype(strategy, card.name)  # the VAE as its pipeline's documented use loads it
    if text_encoder == "device" or (text_encoder == "auto" and hardware.kind == "gpu"):
        strategy = strategy.model_copy(update={"placement": strategy.placement.model_copy(
            update={"text_encoder": "device"})})
    try:
        if shared.problem:
            raise InputError(shared.problem, "")
        if shared.plan is None:  # planned as `meshlab try` plans its exported file: a rule it adds is priced
            planned, shared.plan = planned_with_block_input(strategy, card, hardware.chips)
            shared.activations = planned.activations
            shared.strategy = planned
            shared.work = plan_work(shared.plan, planned, xla=hardware.kind == "tpu")
        plan = shared.plan
        strategy = strategy.model_copy(update={"activations": shared.activations})
        held = (gathered_blocks_on(strategy, hardware), ScoreBuffers.of(hardware))  # what memory reads of the chip
        if held not in shared.memory:
            shared.memory[held] = memory_on(plan, shared.strategy, hardware)
        memory = shared.memory[held].on(hardware.usable_hbm_bytes, hardware.runtime_reserve_bytes)
        if not memory.fits and memory.most_loaded.peak_phase == "decode":  # decode in tiles (enable_tiling())
            tiled = strategy.model_copy(update={"placement": strategy.placement.model_copy(
                update={"vae_decode": "tiled"})})
            tiled_memory = memory_on(plan, tiled, hardware)
            if tiled_memory.most_loaded.total < memory.most_loaded.total:
                strategy, memory = tiled, tiled_memory
        if text_encoder == "auto" and not memory.fits:  # no room beside the plan: the encoder runs on the host
            strategy = strategy.model_copy(update={"placement": strategy.placement.model_copy(
                update={"text_encoder": "cpu"})})
            memory = memory_on(plan, strategy, hardware)
        priced_on = hardware
        if kept is not None and hardware.kind == "tpu":
            from meshlab.plan.compile_times import measured_compile

            measured = measured_compile(strategy, card, hardware.name, kept)
            priced_on = replace(hardware, compile_measured=measured) if measured else hardware
        prediction = predict(plan, strategy, priced_on, work=shared.work)
    except MeshlabError as exc:
        shared.problem = exc.problem
        return Candidate(strategy, family, dropped=f"invalid: {exc.problem}", hardware=hardware, images=images)
    chip = memory.most_loaded
    dropped = "" if memory.fits else f"does not fit: {chip.total / 2**30:.1f} GiB of {chip.hbm / 2**30:.2f} GiB"
    return Candidate(strategy, family, plan, memory, prediction, dropped, hardware, images)


def strategy_yaml(candidate: Candidate, hardware: Hardware | None = None, objective: str = "latency") -> str:
    """A ready strategy file for `candidate` (on its own system unless `hardware` is given), with a header saying
    what it is and what meshlab predicts."""
    import yaml

    hardware = hardware or candidate.hardware
    s, p = candidate.strategy, candidate.prediction
    rules = [{k: v for k, v in r.model_dump(exclude_none=True).items() if not (k == "min_rank" and v == 0)}
             for r in s.rules]
    document = {
        "name": s.name, "description": s.description, "model": s.model, "hardware": _hardware_entry(hardware),
        "mesh": dict(s.mesh), **({"dcn": dict(s.dcn)} if s.dcn else {}), "rules": rules,
        # the rules a file gives: planning adds its block.input rule again, and says so, when the file is read
        "activations": s.activations.model_copy(update={"rules": given_rules(s.activations)}).model_dump(
            exclude_none=True),
        "rewrites": list(s.rewrites), "workload": s.workload.model_dump(exclude_none=True),
        "placement": s.placement.model_dump(exclude_none=True, exclude=set() if s.placement.encoders else {"encoders"}),
        **({"compile": s.compile.model_dump(exclude={"libtpu_flags"})} if s.compile.elementwise != "fused" else {}),
    }
    what = output_noun([s.workload])
    header = (
        f"# Written by `meshlab sweep`: the best plan by {objective} that fits, of {candidate.family} family.\n"
        f"# Predicted (not measured) on {hardware.name}: {p.first_call_s:.2f} s for a call of {p.layout.images} "
        f"{what}(s), {p.seconds_per_image:.2f} s per {what} at throughput, "
        f"{p.step.total * 1e3:.0f} ms per step, MFU {100 * p.mfu:.0f}%, "
        f"{candidate.headroom / 2**30:.2f} GiB headroom per chip"
        + (f", ${p.usd_per_image:.4f} per {what} at list price in the steady state"
           + (f" (${candidate.usd:.4f} over {candidate.images} {what}s with the startup)" if candidate.images else "")
           + ".\n" if p.usd_per_image is not None else ".\n")
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


def sweep_document(result: SweepResult, hardware: Hardware | None = None, seconds: float | None = None,
                   default_systems: tuple[str, ...] = ()) -> dict:
    """The sweep as JSON. `hardware` names the one system of a single-system sweep (kept for its callers);
    `default_systems` says the systems were meshlab's default set (and which)."""
    from meshlab.cost.document import assumptions_document, prediction_document

    def row(c: Candidate) -> dict:
        doc = {"name": c.strategy.name, "family": c.family, "hardware": c.hardware.name if c.hardware else None,
               "mesh": dict(c.strategy.mesh), **({"dcn": dict(c.strategy.dcn)} if c.strategy.dcn else {}),
               "batch": c.strategy.workload.batch, "fits": c.fits, "dropped": c.dropped}
        if c.memory is not None:
            doc["peak_bytes_per_chip"] = c.memory.most_loaded.total
            doc["headroom_bytes_per_chip"] = c.headroom
        if c.prediction is not None:
            doc["predicted"] = prediction_document(c.prediction)
            doc["latency_s"] = c.latency
            doc["text_encoder"] = "device" if c.strategy.placement.text_encoder == "device" else "host"
            doc["vae_decode"] = c.strategy.placement.vae_decode
            doc["meets_goals"] = c.fits and not result.limits.problem(c)
            if result.images is not None:
                doc["usd_per_image_over_images"] = c.usd
        return doc

    def name(c: Candidate | None) -> str | None:
        return c.strategy.name if c is not None else None

    systems = [s.hardware for s in result.systems] or ([hardware] if hardware else [])
    return {
        "label": "predicted",
        "hardware": systems[0].name if len(systems) == 1 else [hw.name for hw in systems],
        "devices": systems[0].chips if len(systems) == 1 else {hw.name: hw.chips for hw in systems},
        "default_systems": list(default_systems),
        "goals": {"max_seconds_per_image": result.limits.max_seconds_per_image,
                  "max_usd_per_image": result.limits.max_usd_per_image,
                  "seconds": "throughput" if result.limits.throughput else "latency"},
        "usd_per_image_over": result.images,
        "candidates": [row(c) for c in result.candidates],
        "pareto_front": [c.strategy.name for c in result.front],
        "cost_front": [c.strategy.name for c in result.cost_front],
        "objective": result.objective,
        "best": name(result.best),
        "lowest_latency": name(result.lowest_latency),
        "highest_throughput": name(result.highest_throughput),
        "cheapest": name(result.cheapest),
        "closest": None if result.closest is None else {
            "name": result.closest.strategy.name, "misses": result.limits.problem(result.closest),
            "binding": _binding_document(binding(result.closest, [], result.closest.hardware))},
        "systems": [{"hardware": s.hardware.name, "chips": s.hardware.chips,
                     "usd_per_chip_hour": s.hardware.usd_per_chip_hour, "best": name(s.best),
                     "latency_s": s.best.latency if s.best else None,
                     "seconds_per_image": s.best.seconds if s.best else None,
                     "usd_per_image": s.best.prediction.usd_per_image if s.best else None,
                     **({"usd_per_image_over_images": s.best.usd if s.best else None}
                        if result.images is not None else {}),
                     "time_to_first_image_s": s.best.prediction.time_to_first_image if s.best else None,
                     "compile": _compile_basis(s.best.prediction) if s.best and s.hardware.kind == "tpu" else None,
                     "fitting": s.fitting, "dropped": s.dropped,
                     "binding": _binding_document(s.binding)} for s in result.systems],
        "sweep_seconds": seconds,
        "assumptions": assumptions_document(systems[0]) if len(systems) == 1 else
        {hw.name: assumptions_document(hw) for hw in systems},
    }


def _compile_basis(prediction: Prediction) -> str | None:
    """Whether a TPU plan's time to first image takes a measured XLA:TPU compile or the catalog's model (None: no
    startup)."""
    startup = prediction.startup
    return None if startup is None else "measured" if startup.compile_measured else "modelled"


def _binding_document(b: Binding) -> dict:
    return {"term": b.term, "seconds_per_image": b.seconds, "share": b.share, "move": b.move}
