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

from meshlab.errors import InputError, Location
from meshlab.strategy.yaml_source import YamlDocument

#: The rule families a quick question can name (meshlab.sweep builds each), and what each needs of the mesh.
RULES = {
    "data": "every weight whole, the batch over data",
    "model": "every >= 2-D weight on its largest dim over model",
    "2d": "every >= 2-D weight on its largest dim over model, the batch over data",
    "pairs": "column/row pairs over model (q/k/v and MLP-in by output, out-projections by input)",
    "fsdp": "every block weight split over data and gathered before use",
    "ulysses": "the tokens over seq, re-split to heads around attention (all-to-alls)",
    "ring": "the tokens over seq, every query gathering the whole sequence's keys and values",
}
AXES = ("cfg", "data", "seq", "model")
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
        return Location(f"command line: {FLAGS.get(path[0], '--' + str(path[0])) if path else 'meshlab try'}")


def parse_mesh(text: str) -> dict[str, int]:
    """``data=2,model=4`` -> {"data": 2, "model": 4}; axes from AXES, sizes positive."""
    mesh = {}
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, _, size = part.partition("=")
        if name not in AXES:
            raise InputError(f"--mesh axis {name!r} is not one the rule families use",
                             f"name axes from {', '.join(AXES)}, e.g. --mesh data=2,model=4", Location("command line"))
        if name in mesh:
            raise InputError(f"--mesh names {name} twice", "give each axis once", Location("command line"))
        if not size.isdigit() or int(size) < 1:
            raise InputError(f"--mesh {part!r} has no positive size", "write axis=size, e.g. model=4",
                             Location("command line"))
        mesh[name] = int(size)
    if not mesh:
        raise InputError(f"--mesh {text!r} names no axis", "e.g. --mesh data=8", Location("command line"))
    return {axis: mesh[axis] for axis in AXES if axis in mesh}  # the sweep's axis order


def default_rules(mesh: dict[str, int]) -> str:
    if mesh.get("seq", 1) > 1:
        return "ulysses"
    if mesh.get("model", 1) > 1:
        return "2d" if mesh.get("data", 1) > 1 else "model"
    return "data"


def quick_document(model: str, hardware: str, mesh: dict[str, int] | None, rules: str | None, workload: dict,
                   text_encoder: str | None) -> dict:
    """The strategy document the flags describe (plain data, ready for YAML and the loader)."""
    from meshlab.cards.card import load_card
    from meshlab.hardware import load_hardware
    from meshlab.sweep import quick_strategy

    try:
        card = load_card(model, Path.cwd())
    except InputError as exc:
        raise InputError(exc.problem, exc.fix, Location("command line: --model")) from None
    try:
        hw = load_hardware(hardware)
    except InputError as exc:
        raise InputError(exc.problem, exc.fix, Location("command line: --hardware")) from None
    mesh = mesh or {"data": hw.chips}
    devices = math.prod(mesh.values())
    if devices != hw.chips:
        hw = hw.using(devices)
        if devices != hw.chips:
            raise InputError(f"{','.join(f'{k}={v}' for k, v in mesh.items())} uses {devices} devices and "
                             f"{hardware} has {hw.chips}", f"make the sizes multiply to {hw.chips}" + (
                                 " (or fewer, on a GPU node)" if hw.kind == "gpu" else ""),
                             Location("command line: --mesh"))
    mesh = {"data": 1, **mesh} if "data" not in mesh else mesh  # the batch axis the rule families name
    mesh = {axis: mesh[axis] for axis in AXES if axis in mesh}
    family = rules or default_rules(mesh)
    parts = family.split("+")
    unknown = [p for p in parts if p not in RULES]
    if unknown:
        raise InputError(f"--rules {family!r} names no rule family {unknown[0]!r}",
                         "use one of " + ", ".join(RULES) + " (a sequence family and a weight family join with +, "
                         "e.g. ulysses+pairs)", Location("command line: --rules"))
    strategy = quick_strategy(card, hw, model, workload, mesh, parts)
    document = {"name": f"{model}-{family.replace('+', '-')}-{'x'.join(f'{k}{v}' for k, v in mesh.items())}",
                "description": f"{model} on {hw.name}: {'; '.join(RULES[p] for p in parts)} (from meshlab try "
                               "flags)",
                "model": model, "hardware": hw.name, "mesh": dict(mesh),
                "rules": [{k: v for k, v in r.model_dump(exclude_none=True).items()
                           if not (k == "min_rank" and v == 0)} for r in strategy.rules],
                "activations": strategy.activations.model_dump(exclude_none=True),
                "rewrites": list(strategy.rewrites), "workload": strategy.workload.model_dump()}
    if text_encoder:
        document["placement"] = {"text_encoder": "device" if text_encoder == "device" else "cpu"}
    if strategy.compile.elementwise != "fused":
        document["compile"] = strategy.compile.model_dump()
    return document
