"""`meshlab try --model M --hardware H --mesh data=2,model=4 --rules pairs`: a strategy from the command line.

A quick question is planned exactly as a strategy file would be: the flags become a strategy document (the sweep's
rule families, the model's pipeline defaults for the workload), which goes through the same loader and planner; an
error names the flag that caused it. ``--save S.yaml`` writes the document, and ``meshlab try S.yaml`` then says
the same. Pure, no torch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from meshlab.core.errors import InputError, Location
from meshlab.strategy.yaml_source import YamlDocument
from meshlab.plan.planner import UNEVEN_TOKENS

#: The rule families a quick question can name (meshlab.search.sweep builds each), and what each needs of the mesh.
RULES = {
    "data": "every weight whole, the batch over data",
    "model": "every >= 2-D weight on its largest dim over model",
    "2d": "every >= 2-D weight on its largest dim over model, the batch over data",
    "pairs": "column/row pairs over model (q/k/v and MLP-in by output, out-projections by input)",
    "fsdp": "every block weight split over data and gathered before use",
    "ulysses": "the tokens over seq, re-split to heads around attention (all-to-alls)",
    "ring": "the tokens over seq, attention as a ring over them (GPUs: xDiT's passes; TPUs: XLA's gather of the "
            "keys and values); with ulysses (USP): a ring over the ring axis, Ulysses over seq",
}
AXES = ("cfg", "data", "ring", "seq", "model")
#: Which flag each top-level field of the document comes from (a planning error names it).
FLAGS = {"model": "--model", "hardware": "--hardware", "mesh": "--mesh", "rules": "--rules",
         "activations": "--rules", "placement": "--text-encoder", "workload": "--height/--width/--frames/--steps",
         "dcn": "--mesh"}


@dataclass(frozen=True)
class CommandLineDocument(YamlDocument):
    """A strategy document made from flags: a problem in a field is placed at the flag that set it."""

    def locate(self, path) -> Location:
        if path and path[0] == "workload" and len(path) > 1:
            return Location(f"command line: --{str(path[1]).replace('_', '-')}")
        if tuple(path) == UNEVEN_TOKENS:  # tokens a sequence degree cannot split: the mesh's degree or the size
            return Location("command line: --mesh and --height/--width/--text-tokens")
        return Location(f"command line: {FLAGS.get(path[0], '--' + str(path[0])) if path else 'meshlab try'}")


def parse_mesh(text: str) -> dict[str, int]:
    """``data=2,model=4`` -> {"data": 2, "model": 4}; axes from AXES, sizes positive."""
    mesh, where = {}, Location("command line: --mesh")
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, _, size = part.partition("=")
        if name not in AXES:
            raise InputError(f"axis {name!r} is not one the rule families use",
                             f"name axes from {', '.join(AXES)}, e.g. --mesh data=2,model=4", where)
        if name in mesh:
            raise InputError(f"{name} is named twice", "give each axis once", where)
        if not size.isdigit() or int(size) < 1:
            raise InputError(f"{part!r} has no positive size", "write axis=size, e.g. model=4", where)
        mesh[name] = int(size)
    if not mesh:
        raise InputError(f"{text!r} names no axis", "e.g. --mesh data=8", where)
    return {axis: mesh[axis] for axis in AXES if axis in mesh}  # the sweep's axis order


def default_rules(mesh: dict[str, int]) -> str:
    if mesh.get("ring", 1) > 1 and mesh.get("seq", 1) > 1:
        return "ulysses+ring"
    if mesh.get("seq", 1) > 1:
        return "ulysses"
    if mesh.get("model", 1) > 1:
        return "2d" if mesh.get("data", 1) > 1 else "model"
    return "data"


def parse_rules(text: str | None) -> list[str] | None:
    """``ulysses+pairs`` -> ["ulysses", "pairs"]: sequence families (ulysses, ring, both for USP) and at most one
    weight family, none twice."""
    if text is None:
        return None
    parts = [p.strip() for p in text.split("+")]
    where = Location("command line: --rules")
    unknown = [p for p in parts if p not in RULES]
    if unknown:
        raise InputError(f"--rules {text!r} names no rule family {unknown[0]!r}",
                         "use one of " + ", ".join(RULES) + " (a sequence family and a weight family join with +, "
                         "e.g. ulysses+pairs)", where)
    weights = [p for p in parts if p not in ("ulysses", "ring", "data")]
    if len(set(parts)) < len(parts) or len(set(weights) - {"fsdp"}) > 1:
        raise InputError(f"--rules {text!r} names two families of one kind", "join sequence families (ulysses, "
                         "ring, or both: USP) with one weight family (model, 2d, pairs, fsdp), e.g. ulysses+pairs",
                         where)
    return parts


@dataclass(frozen=True)
class QuickAnswer:
    planned: object  # meshlab.plan.planned.PlannedStrategy
    document: dict  # the strategy document it planned
    placement: str  # where the text encoder went, and why


def text_encoder_flag(value: str | None) -> str | None:
    """--text-encoder as given, with `cpu` (a strategy file's name for the host) read as `host`."""
    return "host" if value == "cpu" else value


def plan_quick(model: str | None, hardware: str | None, mesh: str | None, rules: str | None, given: dict,
               text_encoder: str | None) -> QuickAnswer:
    """The quick question planned: the model's pipeline defaults with what `given` overrides; the text encoder on
    the device where the plan still fits with it on a GPU (as diffusers places it), on the host on a TPU (as
    meshlab run's PyTorch/XLA pipeline and the seed's port run it) or where --text-encoder says."""
    from meshlab.models.card import load_card
    from meshlab.plan.planned import default_workload
    from meshlab.core.errors import MeshlabError
    from meshlab.core.hardware import load_hardware
    from meshlab.plan.planned import plan_strategy

    if model is None or hardware is None:
        raise InputError("a strategy file, or --model and --hardware, is needed",
                         "e.g. meshlab try strategies/2d.yaml, or meshlab try --model qwen-image --hardware h200:1")
    text_encoder = text_encoder_flag(text_encoder)
    if text_encoder not in (None, "auto", "host", "device"):
        raise InputError(f"--text-encoder {text_encoder!r} is not auto, host or device",
                         "give --text-encoder auto, host or device", Location("command line: --text-encoder"))
    try:
        card = load_card(model, Path.cwd())
    except InputError as exc:
        raise InputError(exc.problem, exc.fix, Location("command line: --model")) from None
    try:
        hw = load_hardware(hardware)
    except InputError as exc:
        raise InputError(exc.problem, exc.fix, Location("command line: --hardware")) from None
    workload, _basis = default_workload(card.name, card.architecture.text_tokens, **given)
    parsed, parts = parse_mesh(mesh) if mesh else None, parse_rules(rules)
    auto = text_encoder in (None, "auto")
    first = "device" if text_encoder == "device" or (auto and hw.kind == "gpu") else "host"

    def plan(where: str):
        loaded = loaded_from(quick_document(card, model, hw, parsed, parts, workload, where))
        try:
            return plan_strategy(loaded)
        except MeshlabError as exc:
            raise loaded.place(exc) from None

    planned = plan(first)
    placement = ("on the device, where it fits beside the plan (as diffusers places it)" if first == "device" and auto
                 else "on the host (as a PyTorch/XLA pipeline runs it)" if first == "host" and auto
                 else f"on the {first} (--text-encoder)")
    if first == "device" and not planned.memory.fits:
        on_host = plan("host")
        if auto:
            planned, placement = on_host, "on the host: no room for it beside the plan"
        elif on_host.memory.fits:
            chip = planned.memory.most_loaded
            raise InputError(f"the text encoder ({chip.text_encoder / 2**30:.2f} GiB) does not fit beside the plan: "
                             f"{chip.total / 2**30:.2f} GiB of {chip.hbm / 2**30:.2f} GiB per chip",
                             "put it on the host (--text-encoder host), where the plan fits",
                             Location("command line: --text-encoder"))
    return QuickAnswer(planned, planned.loaded.document.data, placement)


def loaded_from(document: dict):
    from meshlab.strategy.loader import LoadedStrategy
    from meshlab.strategy.schema import Strategy

    return LoadedStrategy(Strategy.model_validate(document), CommandLineDocument("command line", document),
                          Path.cwd() / "command-line.yaml")


def save_quick(answer: QuickAnswer, path: Path):
    """Write the answer's strategy file and plan it from there (it plans the same); a model card named by its
    path is written relative to the file, and the card itself is never written over."""
    import os

    import yaml

    from meshlab.core.files import write_atomic
    from meshlab.plan.planned import plan_file

    document = dict(answer.document)
    card = document["model"]
    inputs = []
    if card.endswith(".json"):
        card_path = Path(card) if Path(card).is_absolute() else Path.cwd() / card
        inputs.append(card_path)
        document["model"] = os.path.relpath(card_path, Path(path).resolve().parent)
    text = ("# Written by `meshlab try --model ...`: the strategy the command line asked about.\n"
            + yaml.safe_dump(document, sort_keys=False, default_flow_style=None, width=110))
    write_atomic(path, text, inputs, "--save")
    return plan_file(path)


def quick_document(card, model: str, hw, mesh: dict[str, int] | None, parts: list[str] | None, workload,
                   text_encoder: str) -> dict:
    """The strategy document the flags describe (plain data, ready for YAML and the loader)."""
    from meshlab.search.sweep import quick_strategy

    mesh = mesh or {"data": hw.chips}
    devices = math.prod(mesh.values())
    if devices != hw.chips:
        hw = hw.using(devices)
        if devices != hw.chips:
            raise InputError(f"{','.join(f'{k}={v}' for k, v in mesh.items())} uses {devices} devices and "
                             f"{hw.name} has {hw.chips}", f"make the sizes multiply to {hw.chips}" + (
                                 " (or fewer, on a GPU node)" if hw.kind == "gpu" else ""),
                             Location("command line: --mesh"))
    mesh = {"data": 1, **mesh} if "data" not in mesh else mesh  # the batch axis the rule families name
    mesh = {axis: mesh[axis] for axis in AXES if axis in mesh}
    if mesh.get("cfg", 1) > 1 and not workload.cfg:
        raise InputError(f"--mesh splits the guidance branches over cfg, and {card.name} runs without CFG here",
                         "drop cfg from --mesh, or ask for --cfg", Location("command line: --mesh"))
    parts = parts or default_rules(mesh).split("+")
    family = "+".join(parts)
    strategy = quick_strategy(card, hw, model, workload, mesh, parts)
    document = {"name": f"{model}-{family.replace('+', '-')}-{'x'.join(f'{k}{v}' for k, v in mesh.items())}",
                "description": f"{model} on {hw.name}: {'; '.join(RULES[p] for p in parts)} (from meshlab try "
                               "flags)",
                "model": model, "hardware": hw.name, "mesh": dict(mesh),
                "rules": [{k: v for k, v in r.model_dump(exclude_none=True).items()
                           if not (k == "min_rank" and v == 0)} for r in strategy.rules],
                "activations": strategy.activations.model_dump(exclude_none=True),
                "rewrites": list(strategy.rewrites), "workload": strategy.workload.model_dump(exclude_none=True)}
    document["placement"] = {"text_encoder": "device" if text_encoder == "device" else "cpu"}
    if strategy.compile.elementwise != "fused":
        document["compile"] = strategy.compile.model_dump(exclude={"libtpu_flags"})
    if hw.slices > 1:  # several slices: one axis crosses them over DCN, data where it can (as the sweep tries first)
        across = next((a for a in ("data", "cfg", "seq", "model") if mesh.get(a, 1) % hw.slices == 0), None)
        if across is None:
            raise InputError(f"no --mesh axis splits into {hw.slices} slices", f"give an axis a size that "
                             f"{hw.slices} divides, e.g. data={hw.chips}",
                             Location("command line: --mesh"))
        document["dcn"] = {across: hw.slices}
    return document
