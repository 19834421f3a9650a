"""Compare strategy files: plan each, predict each, rank by predicted seconds per image, say why losers lose."""

from __future__ import annotations

import glob
from dataclasses import dataclass
from pathlib import Path

from meshlab.cost.predict import Prediction, predict
from meshlab.strategy.schema import output_noun
from meshlab.core.errors import InputError
from meshlab.plan.planned import PlannedStrategy, plan_file


@dataclass(frozen=True)
class Entry:
    planned: PlannedStrategy
    prediction: Prediction
    rank: int  # 1-based; fitting plans first, each group by predicted seconds per image
    why: str  # why it loses to the best ("" for the best)

    @property
    def fits(self) -> bool:
        return self.planned.memory.fits


@dataclass(frozen=True)
class Comparison:
    entries: tuple[Entry, ...]  # ranked within each model and workload (`work_of`), the groups in the order given
    notes: tuple[str, ...]  # e.g. strategies for different models

    @property
    def best_per_work(self) -> dict[tuple, Entry]:
        """The fastest plan that fits of each model and workload (`work_of`: plans that do different work have no
        best of all)."""
        found: dict[tuple, Entry] = {}
        for e in self.entries:
            if e.fits and e.rank == 1:
                found.setdefault(work_of(e.planned), e)
        return found

    @property
    def best_per_model(self) -> dict[str, Entry]:
        """Each model's best plan, where each model's plans share one workload (else that model has none)."""
        works: dict[str, set] = {}
        for e in self.entries:
            works.setdefault(e.planned.card.name, set()).add(work_of(e.planned))
        return {e.planned.card.name: e for work, e in self.best_per_work.items() if len(works[work[0]]) == 1}

    @property
    def best(self) -> Entry | None:
        """The fastest plan that fits, where every plan is for one model and one workload."""
        bests = self.best_per_work
        works = {work_of(e.planned) for e in self.entries}
        return next(iter(bests.values())) if len(works) == 1 and bests else None

    def is_best(self, entry: Entry) -> bool:
        return self.best_per_work.get(work_of(entry.planned)) is entry


def expand(patterns: list[str]) -> list[Path]:
    """Files named or matched by `patterns` (globs the shell did not expand), in order, without repeats."""
    if not patterns:
        raise InputError("no strategy files given", "pass one or more files or globs, e.g. strategies/*.yaml")
    found: list[Path] = []
    for pattern in patterns:
        if Path(pattern).is_file():
            matches = [pattern]
        elif glob.has_magic(pattern):
            matches = sorted(m for m in glob.glob(pattern) if Path(m).is_file())
            if not matches:
                raise InputError(f"no file matches {pattern!r}", "check the glob, e.g. strategies/*.yaml")
        else:
            raise InputError(f"no such strategy file {pattern!r}", "pass an existing YAML file or a glob")
        found += [Path(m) for m in matches if Path(m) not in found]
    return found


def compare(patterns: list[str]) -> Comparison:
    planned = [plan_file(path) for path in expand(patterns)]
    return rank([(p, predict(p.plan, p.strategy, p.hardware)) for p in planned])


#: predicted times closer than this ratio are a tie: compare says so of a loser, and sweep gives a tie to the cheaper
#: plan
TIE_RATIO = 1.02

#: the workload fields that set the work one image is: plans that differ in any of them do different work
WORK_FIELDS = ("height", "width", "frames", "steps", "cfg", "text_tokens")


def work_of(planned: PlannedStrategy) -> tuple:
    """The model and the work one image asks of it: plans ranked together share it."""
    workload = planned.strategy.workload
    return (planned.card.name,) + tuple(getattr(workload, f) for f in WORK_FIELDS)


def differing_work(planned: list[PlannedStrategy] | tuple[PlannedStrategy, ...]) -> list[str]:
    """The `WORK_FIELDS` in which these plans' workloads differ."""
    return [f for f in WORK_FIELDS if len({getattr(p.strategy.workload, f) for p in planned}) > 1]


def rank(pairs: list[tuple[PlannedStrategy, Prediction]]) -> Comparison:
    """Plans of one model and one workload (`WORK_FIELDS`) ranked among themselves (fitting first, then by seconds
    per image), each loser against its group's best: plans for different models or workloads do different work and
    are never held to each other. Plans of one group on different hardware are ranked together (which system makes
    the image sooner), and a loser's reason names both systems."""
    groups: dict[tuple, list] = {}
    for pair in pairs:
        groups.setdefault(work_of(pair[0]), []).append(pair)
    entries = []
    for group in groups.values():
        ordered = sorted(group, key=lambda pp: (not pp[0].memory.fits, pp[1].seconds_per_image, pp[0].strategy.name))
        best = ordered[0] if ordered and ordered[0][0].memory.fits else None
        entries += [Entry(p, pred, i + 1, "" if best and p is best[0] else why_loses(p, pred, best))
                    for i, (p, pred) in enumerate(ordered)]
    return Comparison(tuple(entries), _notes(pairs))


def _notes(pairs) -> tuple[str, ...]:
    notes = []
    models = sorted({p.card.name for p, _ in pairs})
    if len(models) > 1:
        notes.append(f"these strategies are for different models ({', '.join(models)}): each is ranked among its "
                     "own model's plans of the same workload (their times are for different work)")
    for model in models:
        mine = [p for p, _ in pairs if p.card.name == model]
        differing = differing_work(mine)
        if differing:
            listed = "; ".join(f"{f} " + " vs ".join(str(v) for v in dict.fromkeys(
                getattr(p.strategy.workload, f) for p in mine)) for f in differing)
            notes.append(f"the {model} strategies ask for different work ({listed}): each is ranked among those "
                         "with the same workload, never against the others")
    hardware = sorted({p.hardware.name for p, _ in pairs})
    if len(hardware) > 1:
        what = output_noun([p.strategy.workload for p, _ in pairs])
        notes.append(f"these strategies run on different hardware ({', '.join(hardware)}): plans "
                     f"of one model and workload are ranked together by seconds per {what}, whatever their system, "
                     f"so compare $/{what} too")
    if pairs and not any(p.memory.fits for p, _ in pairs):
        notes.append("no strategy fits: there is no best plan")
    return tuple(notes)


def why_loses(planned: PlannedStrategy, pred: Prediction, best) -> str:
    """One line: the biggest reason this plan is slower than (or excluded against) the best."""
    chip = planned.memory.most_loaded
    if not planned.memory.fits:
        gib = 2**30
        if chip.weights_replicated > chip.weights_sharded:
            return (f"weights replicated: does not fit ({chip.weights_replicated / gib:.1f} GiB of whole weights "
                    f"per chip, {chip.total / gib:.1f} of {chip.hbm / gib:.2f} GiB)")
        return f"does not fit: {chip.total / gib:.1f} GiB needed per chip, {chip.hbm / gib:.2f} GiB usable"
    if best is None:
        return ""
    b = best[1]
    per_image = pred.layout.steps / pred.layout.images
    best_per_image = b.layout.steps / b.layout.images
    deltas = {
        "collective": pred.step.collective * per_image - b.step.collective * best_per_image,
        "local": pred.step.local * per_image - b.step.local * best_per_image,
        "overhead": pred.step.overhead * per_image - b.step.overhead * best_per_image,
        "launches": pred.step.launch_wait * per_image - b.step.launch_wait * best_per_image,
    }
    if pred.terms is not None and b.terms is not None:  # the pipeline around the denoising loop
        deltas["encode"] = pred.terms.text_encode_s - b.terms.text_encode_s
        deltas["decode"] = (pred.terms.vae_decode_s + pred.terms.transfer_s) - (b.terms.vae_decode_s
                                                                                + b.terms.transfer_s)
    worst = max(deltas, key=deltas.get)
    tie = pred.seconds_per_image <= TIE_RATIO * b.seconds_per_image
    mine, theirs = planned.hardware.name, best[0].hardware.name
    systems = f"on {mine} against {best[0].strategy.name} on {theirs}: " if mine != theirs else ""
    return systems + ("ties with the best within 2%; " if tie else "") + _reason(worst, pred, b, per_image,
                                                                                  best_per_image, planned, best[0])


def _reason(worst: str, pred: Prediction, b: Prediction, per_image: float, best_per_image: float,
            planned: PlannedStrategy, best: PlannedStrategy) -> str:
    what = output_noun([planned.strategy.workload])  # a video model's plans make videos
    if worst == "encode":
        def where(p: PlannedStrategy) -> str:
            words = {"cpu": "on the host", "device": "on each chip", "sharded": "split over the chips"}
            placement = p.strategy.placement
            places = placement.places(c.name for c in p.card.encoders)
            if len(set(places.values())) > 1:  # placement.encoders puts them apart
                return "(" + ", ".join(f"{name} {words[place]}" for name, place in places.items()) + ")"
            return words[next(iter(places.values()), placement.text_encoder)]

        return (f"its text encoder {where(planned)}: {pred.terms.text_encode_s:.2f} s/{what} vs "
                f"{b.terms.text_encode_s:.2f} {where(best)} (`meshlab explain` shows the encode term)")
    if worst == "decode":
        return (f"VAE decode and host transfers: {pred.terms.vae_decode_s + pred.terms.transfer_s:.2f} s/{what} "
                f"vs {b.terms.vae_decode_s + b.terms.transfer_s:.2f}")
    if worst == "collective":
        counts = pred.block_collectives(issued=True)  # as the hardware issues them: what the time is priced from
        listed = ", ".join(f"{n} {kind}{'s' if n > 1 else ''}" for kind, n in sorted(counts.items(), key=lambda kv: -kv[1]))
        return (f"{listed or 'collectives'} per block: {pred.step.collective * per_image:.2f} s/{what} in "
                f"collectives vs {b.step.collective * best_per_image:.2f}")
    if worst == "local":
        mine = pred.step.flops * per_image / 1e12
        theirs = b.step.flops * best_per_image / 1e12
        if mine > 1.05 * theirs and pred.chips == 1:
            return f"one device does all the work: {mine:.0f} TFLOP per {what} vs {theirs:.0f} per chip"
        if mine > 1.05 * theirs:
            return f"repeats work across chips: {mine:.0f} TFLOP per chip per {what} vs {theirs:.0f}"
        # only where it holds: the reason's prefix already names two systems
        why = f" (fewer {what}s per call to share weight reads)" if pred.layout.images < b.layout.images else ""
        return (f"slower compute/HBM per {what}: {pred.step.local * per_image:.2f} s vs "
                f"{b.step.local * best_per_image:.2f}{why}")
    if worst == "launches":
        return (f"waits on eager PyTorch's launches: {pred.step.launch_wait * per_image:.2f} s/{what} beyond its "
                f"own work vs {b.step.launch_wait * best_per_image:.2f} (each chip's share too small to hide the host)")
    return f"host overhead: {pred.step.overhead * per_image:.2f} s/{what} vs {b.step.overhead * best_per_image:.2f}"


def entry_document(entry: Entry) -> dict:
    from meshlab.cost.document import prediction_document

    planned = entry.planned
    chip = planned.memory.most_loaded
    return {
        "rank": entry.rank,
        "best": entry.rank == 1 and entry.fits,  # of the plans with its model and workload
        "name": planned.strategy.name,
        "file": str(planned.loaded.path),
        "model": planned.card.name,
        "hardware": planned.hardware.name,
        "mesh": planned.plan.mesh.as_dict(),
        "workload": {"batch": planned.strategy.workload.batch,
                     **{f: getattr(planned.strategy.workload, f) for f in WORK_FIELDS}},
        "weights_bytes_per_chip": chip.weights,
        "peak_bytes_per_chip": chip.total,
        "usable_hbm_bytes": chip.hbm,
        "padding_bytes_per_chip": chip.padding,
        "tile_padding_bytes_per_chip": chip.tile_padding,
        "fits": entry.fits,
        "why_not_best": entry.why,
        "predicted": prediction_document(entry.prediction),
    }


def comparison_document(comparison: Comparison) -> dict:
    from meshlab.cost.document import assumptions_document

    hardware = {}
    for entry in comparison.entries:
        hardware.setdefault(entry.planned.hardware.name, assumptions_document(entry.planned.hardware))
    return {
        "label": "predicted",
        "best": comparison.best.planned.strategy.name if comparison.best else None,
        "best_per_model": {model: e.planned.strategy.name for model, e in comparison.best_per_model.items()},
        "best_per_workload": [{"model": work[0], **dict(zip(WORK_FIELDS, work[1:])), "best": e.planned.strategy.name}
                              for work, e in comparison.best_per_work.items()],
        "notes": list(comparison.notes),
        "entries": [entry_document(e) for e in comparison.entries],
        "assumptions": hardware,
    }
