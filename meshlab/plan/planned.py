"""The planning path end to end: strategy file -> validated strategy -> plan -> memory. No torch."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from pathlib import Path

from pydantic import ValidationError

from meshlab.models.card import ModelCard, load_card, module_pattern
from meshlab.core.errors import InputError, Location, MeshlabError, PlanError
from meshlab.core.hardware import Hardware, load_hardware
from meshlab.plan.memory import MemoryReport, memory_on
from meshlab.core.mesh import AbstractMesh
from meshlab.plan.plan import Plan
from meshlab.plan.axes import GUIDANCE_AXIS, activation_axes
from meshlab.plan.activations import ADDED_SPLIT_NOTE, added_split, rule_spec
from meshlab.plan.planner import make_plan
from meshlab.strategy.loader import LoadedStrategy, load_strategy
from meshlab.strategy.schema import ActivationRule, Strategy, Workload
from meshlab.core.spec import PartitionSpec


@dataclass(frozen=True)
class PlannedStrategy:
    """Everything `meshlab try` reports on one strategy file."""

    loaded: LoadedStrategy
    card: ModelCard
    hardware: Hardware
    plan: Plan
    memory: MemoryReport

    @property
    def strategy(self) -> Strategy:
        return self.loaded.strategy

    @property
    def files_read(self) -> tuple[Path, ...]:
        """The strategy file, and the card and profile files it names (not built-in cards or catalog entries)."""
        folder, strategy = self.loaded.path.parent, self.strategy
        named = [name for name in (strategy.model, strategy.hardware_name) if name.endswith(".json")]
        return (self.loaded.path, *(folder / name for name in named))


def unmatched_rules(planned: PlannedStrategy) -> list[InputError]:
    """A problem for every rule that gives no parameter its spec (a typo leaves the weights it meant replicated),
    placed at the rule's line: a warning, or with ``--strict`` an error."""
    return [InputError(f"rule {i} ({planned.strategy.rules[i].pattern!r}) matches no parameter of "
                       f"{planned.card.name}", "fix its pattern (`meshlab try --json` lists every parameter's name) "
                       "or remove it", planned.loaded.document.locate(("rules", i)))
            for i in planned.plan.unmatched_rules]


def plan_file(path: str | Path) -> PlannedStrategy:
    """Load, plan and size a strategy file; every error comes back placed at its line in the file."""
    loaded = load_strategy(path)
    try:
        return plan_strategy(loaded)
    except MeshlabError as exc:
        raise loaded.place(exc) from None


def plan_strategy(loaded: LoadedStrategy, hardware: Hardware | None = None) -> PlannedStrategy:
    """`hardware`: plan on it instead of what the strategy names (`meshlab profile`, before the profile exists).
    Workload fields the file leaves out are the model's pipeline's defaults, as `try --model` and `sweep` take them
    (`with_pipeline_workload`), and a compile mode it leaves out is the system's (`with_system_compile`)."""
    as_written = loaded
    loaded = with_pipeline_workload(loaded)
    card = _with_field(lambda: load_card(loaded.strategy.model, loaded.path.parent), ("model",))
    loaded = with_pipeline_vae(loaded, card.name)
    hardware = hardware or _with_field(lambda: _hardware(loaded), ("hardware",))
    loaded = with_system_compile(loaded, hardware)
    try:
        return _planned(loaded, card, hardware)
    except MeshlabError as exc:
        said = "; ".join(line for line in loaded.taken if line.startswith("workload:"))
        if not said:
            raise
        try:  # the file's own workload: does it fail alike? Then the values taken are not why
            _planned(with_system_compile(as_written, hardware), card, hardware)
        except MeshlabError as own:
            if own.problem == exc.problem:
                raise exc from None
        raise type(exc)(f"{exc.problem} ({said})", exc.fix, exc.location, exc.field) from None


def _planned(loaded: LoadedStrategy, card: ModelCard, hardware: Hardware) -> PlannedStrategy:
    strategy = loaded.strategy
    if -1 not in strategy.mesh.values():  # a GPU node can be used in part: one GPU, or four of eight
        hardware = hardware.using(math.prod(strategy.mesh.values()))
    strategy, plan = planned_with_block_input(strategy, card, hardware.chips)
    if strategy is not loaded.strategy:
        loaded = replace(loaded, strategy=strategy,
                         taken=(*loaded.taken, block_input_line(added_split(strategy.activations), card)))
    check_dcn(strategy.dcn, plan.mesh, hardware)
    if strategy.placement.vae_decode == "parallel" and (hardware.kind != "gpu" or strategy.placement.vae == "cpu"):
        where = "the VAE runs on the host (placement.vae: cpu)" if strategy.placement.vae == "cpu" else \
            f"{hardware.name} is a {hardware.kind}"
        raise PlanError(f"placement.vae_decode: parallel splits the decode over the GPUs as xDiT's parallel VAE does, "
                        f"and {where}", "use full or tiled", field=("placement", "vae_decode"))
    check_encoder_names(strategy, card)
    memory = memory_on(plan, strategy, hardware)
    if hardware.kind == "tpu":
        from meshlab.plan.compile_times import measured_compile

        measured = measured_compile(strategy, card, hardware.name)
        hardware = replace(hardware, compile_measured=measured) if measured else hardware
    return PlannedStrategy(loaded, card, hardware, plan, memory)


def check_encoder_names(strategy: Strategy, card: ModelCard) -> None:
    """A PlanError at ``placement.encoders`` where it names an encoder the card does not have."""
    names = [c.name for c in card.encoders]
    for name in strategy.placement.encoders:
        if name not in names:
            has = f"its encoders are {', '.join(names)}" if names else "it has none"
            raise PlanError(f"placement.encoders names {name!r}, which is not an encoder of {card.name} ({has})",
                            f"name one of {', '.join(names)}" if names else "remove placement.encoders",
                            field=("placement", "encoders", name))


def _hardware(loaded: LoadedStrategy) -> Hardware:
    """The catalog entry the strategy names, or the one a profile file stands for (``hardware: cpu.json``, a path
    relative to the strategy; read only then, so `meshlab try` on a catalog name never touches it)."""
    strategy = loaded.strategy
    name = strategy.hardware_name
    if not name.endswith(".json"):
        return load_hardware(name, strategy.hardware_overrides)
    from meshlab.core.profile_hardware import profile_hardware

    devices = math.prod(strategy.mesh.values()) if -1 not in strategy.mesh.values() else None
    return profile_hardware(loaded.path.parent / name, devices, strategy.hardware_overrides)


def check_dcn(dcn: dict[str, int], mesh: AbstractMesh, hardware: Hardware) -> None:
    """`dcn` (axis -> slices it spans) must name mesh axes, divide them, and multiply to the hardware's slices."""
    for axis, slices in dcn.items():
        if axis not in mesh.names:
            raise PlanError(f"dcn names axis {axis!r}, which the mesh ({', '.join(mesh.names)}) does not have",
                            f"name a mesh axis, e.g. dcn: {{{mesh.names[0]}: {hardware.slices}}}", field=("dcn", axis))
        if mesh.size(axis) % slices:
            raise PlanError(f"dcn: {{{axis}: {slices}}} does not divide axis {axis!r} of size {mesh.size(axis)}",
                            f"span a divisor of {mesh.size(axis)} slices, or grow the axis", field=("dcn", axis))
    spanned = math.prod(dcn.values())
    if spanned == hardware.slices:
        return
    if hardware.slices == 1:
        raise PlanError(f"dcn spans {spanned} slices, but {hardware.name} is one slice",
                        f"drop dcn, or use hardware {hardware.name}x{spanned}", field=("dcn",))
    fits = [a for a in mesh.names if mesh.size(a) % hardware.slices == 0]
    example = f"e.g. dcn: {{{fits[0]}: {hardware.slices}}}" if fits else "grow an axis to a multiple of the slices"
    raise PlanError(f"{hardware.name} is {hardware.slices} slices, and dcn spans {spanned}",
                    f"say which mesh axes cross slices, {example}", field=("dcn",))


def workload_with(workload: Workload, **updates) -> Workload:
    """`workload` with fields a command line set (``--height`` ...): a value out of the field's bounds is an
    InputError naming the flag."""
    try:
        return workload.model_copy(update=updates)
    except ValidationError as exc:
        problem = exc.errors(include_url=False)[0]
        flag = "--" + str(problem["loc"][0]).replace("_", "-") if problem["loc"] else "the workload"
        what = Workload.field_description(str(problem["loc"][0])) if problem["loc"] else ""
        raise InputError(f"{flag}: {problem['msg']}", f"{flag} is {what}" if what else "see `meshlab schema`",
                         Location("command line")) from None  # placed, so no strategy line claims it


def with_pipeline_workload(loaded: LoadedStrategy) -> LoadedStrategy:
    """`loaded` with the workload fields its file leaves out (steps, cfg, text tokens, size, frames) taken from its
    model's pipeline defaults, where the model has them, and a line saying so: without it a Flux.1-dev file with
    no workload was priced at 50 steps with CFG, and a Wan one as a single 1024x1024 frame (the VAE's dtype:
    `with_pipeline_vae`, once the card is known). Pure."""
    from meshlab.models.defaults import FIELDS, pipeline_defaults

    strategy = loaded.strategy
    defaults = pipeline_defaults(strategy.model)
    if defaults is None:
        return loaded
    given = _given(strategy, "workload")
    if strategy.mesh.get(GUIDANCE_AXIS, 1) != 1:  # a cfg axis carries two guidance branches: the file wants CFG
        given = given | {"cfg"}
    missing = {f: getattr(defaults, f) for f in FIELDS  # where the pipeline's differs from the generic default
               if f not in given and getattr(defaults, f) != getattr(strategy.workload, f)}
    if not missing:
        return loaded
    workload = strategy.workload.model_copy(update=missing)
    basis = (f"workload: {defaults.pipeline}'s defaults for what the file leaves out: "
             + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in missing.items()))
    return replace(loaded, strategy=strategy.model_copy(update={"workload": workload}), taken=(*loaded.taken, basis))


def _given(strategy: Strategy, section: str) -> set[str]:
    """The fields of `section` (workload, placement) the strategy itself set, not its defaults."""
    return getattr(strategy, section).model_fields_set if section in strategy.model_fields_set else set()


def pipeline_vae_dtype(card_name: str, strategy: Strategy) -> str | None:
    """The dtype the VAE of `card_name`'s pipeline is loaded in by its documented use (Wan's: float32), where
    `strategy` gives no ``placement.vae_dtype``, holds its VAE on the device and computes in another dtype; None
    otherwise. Pure."""
    from meshlab.models.defaults import pipeline_defaults

    defaults = pipeline_defaults(card_name)
    if defaults is None or not defaults.vae_dtype or "vae_dtype" in _given(strategy, "placement") \
            or strategy.placement.vae != "device" or defaults.vae_dtype == strategy.workload.dtype:
        return None
    return defaults.vae_dtype


def with_pipeline_vae_dtype(strategy: Strategy, card_name: str) -> Strategy:
    """`strategy` with its VAE held in the dtype its pipeline's documented use loads it in (`pipeline_vae_dtype`;
    the strategy itself where there is none): for a file (`with_pipeline_vae`) and the sweep's plans alike. Pure."""
    dtype = pipeline_vae_dtype(card_name, strategy)
    if dtype is None:
        return strategy
    return strategy.model_copy(update={"placement": strategy.placement.model_copy(update={"vae_dtype": dtype})})


def with_pipeline_vae(loaded: LoadedStrategy, card_name: str) -> LoadedStrategy:
    """`loaded` with its VAE held in the dtype its pipeline's documented use loads it in (`pipeline_vae_dtype`),
    and a line saying so: a Wan decode priced in the transformer's bfloat16 held half the bytes WanPipeline's
    example holds. Memory only: the decode's time stays priced at the workload's dtype. Pure."""
    from meshlab.models.defaults import pipeline_defaults

    strategy = with_pipeline_vae_dtype(loaded.strategy, card_name)
    if strategy is loaded.strategy:
        return loaded
    line = (f"placement: the VAE held in {strategy.placement.vae_dtype}, as {pipeline_defaults(card_name).pipeline}'s "
            f"documented example loads it (placement.vae_dtype not given; memory only: its decode's time stays priced "
            f"at {strategy.workload.dtype})")
    return replace(loaded, strategy=strategy, taken=(*loaded.taken, line))


def planned_with_block_input(strategy: Strategy, card: ModelCard, chips: int) -> tuple[Strategy, Plan]:
    """`strategy` planned on `chips`, with the ``block.input`` rule a sequence split needs added where the file
    gives none (`with_block_input_split`), keeping the residual's feature split the plan's weights leave
    (`kept_residual_split`, read from the plan made with the rule). `meshlab try` and the sweep plan alike, so a
    sweep's candidate is priced as its exported file is. Pure."""
    try:  # the rule a sequence split takes is added before planning, which checks it (its padding warning)
        mesh = AbstractMesh.resolve(strategy.mesh, chips)
        added = with_block_input_split(strategy, card, mesh)
    except PlanError:
        added = strategy  # a mesh the chips cannot hold: make_plan says so at its line
    plan = make_plan(added, card, chips)
    if added is not strategy and (features := kept_residual_split(plan, added)):
        added = with_block_input_split(strategy, card, mesh, features)
        plan = make_plan(added, card, chips)
    return added, plan


def with_block_input_split(strategy: Strategy, card: ModelCard, mesh: AbstractMesh,
                           features: tuple[str, ...] = ()) -> Strategy:
    """`strategy` with a ``block.input`` rule splitting the image stream's tokens over ``activations.sequence``
    (noted `ADDED_SPLIT_NOTE`; `block_input_line` says so), where the model patchifies its latent inside (SD3.5,
    Wan, HunyuanVideo, CogVideoX, SANA: its input stays whole past the batch, meshlab.plan.inputs), the partitioner
    runs the split (``sequence_parallel: partitioner``; diffusers and xDiT split the sequence themselves) and no
    such rule is given. The cost model prices the tokens split as the file says; without the rule the backends left
    them whole (measured: Wan 2.1 14B under seq 2 x model 4, `check --backend tpu`: every block ran all 5,376
    tokens, no collective over seq). `features`: the axes the image stream's residual arrives split on between
    blocks (the plan's weights decide them: `kept_residual_split`), which the rule keeps, for a spec that left them
    whole would gather the residual at every block's start (XLA:TPU: hunyuan-seq2-model4-whole-input.yaml). Pure."""
    activations = strategy.activations
    if not activations.sequence_axes or activations.sequence_parallel != "partitioner":
        return strategy
    from meshlab.models.families import FAMILIES
    from meshlab.plan.inputs import batch_axes

    fam = FAMILIES.get(card.class_name)  # a class meshlab cannot build runs nowhere: nothing to split
    if fam is None or fam.latent == "tokens" or any(
            r.point == "block.input" and r.stream in (None, "image") for r in activations.rules):
        return strategy
    spec = PartitionSpec(batch_axes(activations, mesh), activations.sequence_axes, tuple(features) or None).to_json()
    rule = ActivationRule(point="block.input", stream="image", spec=spec, note=ADDED_SPLIT_NOTE)
    updated = activations.model_copy(update={"rules": [*activations.rules, rule]})
    return strategy.model_copy(update={"activations": updated})


def block_input_line(rule: ActivationRule, card: ModelCard) -> str:
    """What `try` and `explain` say of the block.input rule planning added (`with_block_input_split`)."""
    shown = json.dumps(rule.spec).replace('"', "")  # as the file would write it: [null, seq, null]; [null, seq, model]
    sequence, features = rule_spec(rule).entries[1] or (), rule_spec(rule).entries[2] or ()
    return (f"activations: {card.class_name} patchifies its latent inside the model, so its tokens are split over "
            f"{'+'.join(sequence)} at each block's input (block.input, stream image, spec {shown}; the file gives no "
            "such rule" + (f"; its features stay split on {'+'.join(features)}, as the plan's weights leave the "
                           "residual" if features else "") + ")")


def kept_residual_split(plan: Plan, strategy: Strategy) -> tuple[str, ...]:
    """The axes the image stream's residual is split on between blocks under `plan`'s weights (largest-dim weights
    leave it split on model: the gates that scale its updates are, `residual_splits`), for the block.input rule
    planning adds to keep. Measured (XLA:TPU, torch_xla's program of HunyuanVideo over seq 2 x model 4 at 256², 3
    blocks of each list): with the features whole (hunyuan-seq2-model4-whole-input.yaml) a middle block gathers the
    image residual once more, 7 all-gathers of 364,511,232 B a double block against 6 of 312,606,720 keeping them
    (hunyuan-seq2-model4.yaml), and a single block's collectives move 808 MB against 717 MB."""
    splits = residual_splits(plan, activation_axes(strategy.activations, plan.mesh))
    image = splits.get("image", ())
    # the rule pins the image tokens of every block: where single blocks carry a joint residual split otherwise,
    # only the axes both splits share are kept (the others are gathered in one list or the other, and priced so)
    return tuple(a for a in image if a in splits.get("joint", image) and plan.mesh.size(a) > 1)


def residual_splits(plan: Plan, gathered: frozenset[str]) -> dict[str, tuple[str, ...]]:
    """Stream -> the mesh axes its residual is split on, on its features, between blocks (streams whose residual a
    modulation scales: "joint" is the single blocks' of Flux and HunyuanVideo): as the output rows of the Linear
    that makes the gates of its last update in a block (CogVideoX's norm2.linear, not norm1's), less the axes that
    split activations (`gathered`: an FSDP weight is gathered before use) and those of size 1, where every piece
    splits evenly; the last block that splits it decides, and a modulation outside the blocks that conditions
    their norms (Wan's time_proj) only where none in them does. The cost model derives the same from its graph
    (meshlab.cost.collectives `_Deriver.residual`; tests/cost/test_collectives.py holds the two equal). Pure."""
    flows = {f.module: f for f in plan.card.dataflow if f.modulates}
    lists = plan.card.block_lists
    by_block: dict[tuple, tuple[str, ...]] = {}  # (block, stream) -> its last modulation's split
    outside: dict[str, tuple[str, ...]] = {}
    for p in plan.parameters:
        flow = flows.get(module_pattern(p.name.removesuffix(".weight"), lists))
        if flow is None or not p.name.endswith(".weight") or p.parameter.is_bias:
            continue
        rows = tuple(a for a in p.spec.entries[0] or () if a not in gathered and plan.mesh.size(a) > 1)
        chunk, n = min(m.width for m in flow.modulates), math.prod(plan.mesh.size(a) for a in rows)
        split = rows if rows and chunk % n == 0 and p.shape[0] % chunk == 0 else ()
        stream = flow.modulates[0].stream
        if p.parameter.block is not None:
            by_block[p.parameter.block, stream] = split
        elif split and any(".*" in m.norm for m in flow.modulates):  # conditions the blocks' norms
            outside.setdefault(stream, split)
    splits = {stream: () for _, stream in by_block} | {stream: () for stream in outside}
    for (_, stream), split in by_block.items():
        splits[stream] = split or splits[stream]
    return {stream: splits[stream] or outside.get(stream, ()) for stream in splits}


def with_system_compile(loaded: LoadedStrategy, hardware: Hardware) -> LoadedStrategy:
    """On a GPU, a file that does not say how its elementwise ops run is priced eager, as PyTorch, diffusers and
    xDiT run without torch.compile (the schema's default, fused, is what XLA does on a TPU): the same layout was
    priced twice as fast from a file as from `try --model`, which prices GPUs eager. Pure."""
    if hardware.kind != "gpu" or gives_elementwise(loaded):
        return loaded
    line = ("compile: eager, as PyTorch runs on a GPU unless told otherwise (the file leaves compile.elementwise "
            "out; fused prices torch.compile)")
    return replace(loaded, strategy=_elementwise(loaded.strategy, "eager"), taken=(*loaded.taken, line))


def gives_elementwise(loaded: LoadedStrategy) -> bool:
    """Does the file itself say how its elementwise ops run (``compile.elementwise``)?"""
    return "elementwise" in ((loaded.document.data or {}).get("compile") or {})


def _elementwise(strategy: Strategy, execution: str) -> Strategy:
    return strategy.model_copy(update={"compile": strategy.compile.model_copy(update={"elementwise": execution})})


def default_workload(model: str, required_text: int = 0, **given) -> tuple:
    """The workload `model` (a card's name) is run at by default, its pipeline's (else meshlab's generic one, at
    the `required_text` tokens a card's forward requires, if any), with what the command line gave (not None) in
    place of it, and a line saying what it rests on. Pure."""
    from meshlab.models.defaults import pipeline_defaults

    defaults = pipeline_defaults(model)
    base = Workload(**defaults.workload_fields()) if defaults else \
        Workload(**({"text_tokens": required_text} if required_text else {}))
    changed = {k: v for k, v in given.items() if v is not None}
    workload = workload_with(base, **changed)
    basis = defaults.describe() if defaults else f"meshlab's generic workload (no pipeline defaults for {model!r})"
    if changed:
        basis += "; from the command line: " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in changed.items())
    return workload, basis


def with_workload(planned: PlannedStrategy, **updates) -> PlannedStrategy:
    """The same strategy planned at another workload (e.g. the size a run actually used)."""
    strategy = planned.strategy.model_copy(update={"workload": workload_with(planned.strategy.workload, **updates)})
    return _replanned(planned, strategy, make_plan(strategy, planned.card, planned.hardware.chips))


def with_placement(planned: PlannedStrategy, **updates) -> PlannedStrategy:
    """The same plan with its pipeline's components placed otherwise (e.g. text_encoder="device"): memory changes,
    the plan does not."""
    strategy = planned.strategy.model_copy(update={"placement": planned.strategy.placement.model_copy(update=updates)})
    return _replanned(planned, strategy, planned.plan)


def _replanned(planned: PlannedStrategy, strategy, plan) -> PlannedStrategy:
    """`planned` with another strategy and its plan, and their memory on the same hardware."""
    loaded = replace(planned.loaded, strategy=strategy)
    return PlannedStrategy(loaded, planned.card, planned.hardware, plan, memory_on(plan, strategy, planned.hardware))


def with_elementwise(planned: PlannedStrategy, execution: str) -> PlannedStrategy:
    """The same plan priced with its elementwise work run as `execution` ("fused" or "eager"): what a backend
    runs (meshlab.experiments.run); planning and memory do not depend on it."""
    return replace(planned, loaded=replace(planned.loaded, strategy=_elementwise(planned.strategy, execution)))


def at_depth(planned: PlannedStrategy, layers: int) -> PlannedStrategy:
    """The same strategy planned over its card cut to `layers` blocks per list (what ``--checkpoint random
    --layers`` builds): memory and predictions for the model that runs."""
    from meshlab.models.truncate import truncate_card

    card = truncate_card(planned.card, layers)
    plan = make_plan(planned.strategy, card, planned.hardware.chips)
    return PlannedStrategy(planned.loaded, card, planned.hardware, plan, memory_on(plan, planned.strategy,
                                                                                   planned.hardware))


def _with_field(load, field: tuple):
    try:
        return load()
    except MeshlabError as exc:
        if exc.location is None and not exc.field:
            raise type(exc)(exc.problem, exc.fix, None, field) from None
        raise
