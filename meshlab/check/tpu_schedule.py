"""XLA:TPU's own time estimate of a compiled program: its latency-hiding scheduler's schedule. Pure, no jax.

With ``XLA_FLAGS="--xla_dump_to=D --xla_dump_latency_hiding_schedule=true"`` XLA:TPU writes
``D/<module>.schedule.txt``, a text proto: the scheduled module (each instruction's name, opcode and ``id``), then
``schedule { instructions { id, start_timestamp_cycles, end_timestamp_cycles } ... scheduler_statistics {
total_cycles, <kind>_wasted_cycles ... } }`` and ``cycles_per_microsecond``. It is the cost model XLA:TPU schedules
by, not a measurement: `Schedule` reads the program's total, the time each opcode holds the (entry computation's)
timeline, and the cycles the scheduler says collectives leave exposed. No library reads this file (the proto's
Python class is not in jaxlib's public API), so it is read here with a few patterns over its text.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from meshlab.check.hlo import COLLECTIVE_KINDS

_OP = re.compile(r'instructions \{\n\s+name: "([^"]+)"\n\s+opcode: "([^"]+)"(?:(?!\n\s+instructions \{).)*?'
                 r'\n\s+id: (\d+)', re.S)
_SLOT = re.compile(r"id: (\d+)\n\s+start_timestamp_cycles: ([\d.e+-]+)\n\s+end_timestamp_cycles: ([\d.e+-]+)")


@dataclass(frozen=True)
class Schedule:
    """One program's schedule, in seconds (XLA:TPU's estimate)."""

    total_s: float
    by_kind: dict[str, float] = field(default_factory=dict)  # timeline held by each collective kind (sync ops, and
    #                                                          the -done / async-collective-done waits of async ones)
    wasted_s: dict[str, float] = field(default_factory=dict)  # scheduler_statistics' *_wasted_cycles, by name
    cycles_per_microsecond: float = 0.0

    @property
    def collective_s(self) -> float:
        return sum(self.by_kind.values())

    @property
    def compute_s(self) -> float:
        """The rest of the timeline: fusions (matmuls, attention, elementwise), copies, everything not a collective."""
        return self.total_s - self.collective_s

    def to_json(self) -> dict:
        return {"total_s": self.total_s, "compute_s": self.compute_s, "collective_s": self.collective_s,
                "collective_s_by_kind": dict(self.by_kind), "wasted_s": dict(self.wasted_s),
                "cycles_per_microsecond": self.cycles_per_microsecond,
                "what": "XLA:TPU's latency-hiding scheduler's estimate for the compiled program (its cost model, "
                        "not a measurement)"}


def parse_schedule(text: str) -> Schedule | None:
    """The schedule of a ``*.schedule.txt`` dump; None when the text holds none. libtpu writes the module, then one
    ``computation_schedules { computation_id ... }`` per scheduled computation (a program with loops has one per
    loop body, each with its own total): the entry computation's is the program's, and a loop's collectives are
    inside its ``while`` there (counted as compute). An older layout keeps one schedule inside the module."""
    if "\n  schedule {" not in text:
        return None
    module, schedule = text.split("\n  schedule {", 1)
    blocks = schedule.split("\ncomputation_schedules {")[1:]
    if blocks:
        entry = re.search(r"entry_computation_id: (\d+)", module)
        ids = [re.match(r"\s*computation_id: (\d+)", b) for b in blocks]
        chosen = [b for b, i in zip(blocks, ids) if entry and i and i.group(1) == entry.group(1)]
        if not chosen and len(blocks) > 1:
            return None
        schedule = (chosen or blocks)[0]
    rate = re.search(r"cycles_per_microsecond: ([\d.e+-]+)", schedule)
    total = re.search(r"total_cycles: ([\d.e+-]+)", schedule)
    if not rate or not total:
        return None
    per_second = float(rate.group(1)) * 1e6
    ops = {int(i): (name, opcode) for name, opcode, i in _OP.findall(module)}
    held: Counter = Counter()
    for i, start, end in _SLOT.findall(schedule):
        kind = collective_kind(*ops.get(int(i), ("", "")))
        if kind:
            held[kind] += (float(end) - float(start)) / per_second
    wasted = {name: float(v) / per_second for name, v in re.findall(r"(\w+)_wasted_cycles: ([\d.e+-]+)", schedule)}
    return Schedule(float(total.group(1)) / per_second, dict(held), wasted, float(rate.group(1)))


def collective_kind(name: str, opcode: str) -> str | None:
    """The collective kind an instruction of the schedule holds the timeline for: a synchronous collective, the
    -done of an async pair, or the done of an async collective fusion; None for the rest."""
    if opcode in COLLECTIVE_KINDS:
        return opcode
    if opcode.endswith("-done") and opcode[:-5] in COLLECTIVE_KINDS:
        return opcode[:-5]
    if opcode in ("fusion", "custom-call", "async-done") and "done" in name:
        return next((kind for kind in COLLECTIVE_KINDS if kind in name), None)
    return None
