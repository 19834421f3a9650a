"""XLA:TPU's own time estimate of a compiled program: its latency-hiding scheduler's schedule. Pure, no jax.

With ``XLA_FLAGS="--xla_dump_to=D --xla_dump_latency_hiding_schedule=true"`` XLA:TPU writes
``D/<module>.schedule.txt``, a text proto: the scheduled module (each instruction's name, opcode, ``id`` and the
computations it calls), then one ``computation_schedules { computation_id, instructions { id,
start_timestamp_cycles, end_timestamp_cycles } ... scheduler_statistics { total_cycles, <kind>_wasted_cycles ... }
cycles_per_microsecond }`` per scheduled computation: the entry, and each loop body (libtpu 0.0.52; fsdp.yaml's
program at full depth has 361). An older layout keeps one ``schedule { ... }`` inside the module. It is the cost
model XLA:TPU schedules by, not a measurement: `Schedule` reads the entry computation's total, the time each
collective kind holds its timeline (a loop's collectives: its body's, times the loop's trips, the while's span over
its body's total), and the cycles the scheduler says collectives leave exposed. No library reads this file (the
proto's Python class is not in jaxlib's public API), so it is read here with a few patterns over its text.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from meshlab.check.hlo import COLLECTIVE_KINDS

_OP_FIELDS = re.compile(r'^\s+name: "([^"]+)"\n\s+opcode: "([^"]+)"')
_OP_ID = re.compile(r"^      id: (\d+)$", re.M)
_CALLED = re.compile(r"^      called_computation_ids: (\d+)$", re.M)
#: proto3 leaves a zero out: an instruction starting at cycle 0 has no start line
_SLOT = re.compile(r"id: (\d+)\n(?:\s+start_timestamp_cycles: ([\d.e+-]+)\n)?\s+end_timestamp_cycles: ([\d.e+-]+)")


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
    """The entry computation's schedule in a ``*.schedule.txt`` dump (see the module); None when the text holds none
    or none can be told to be the entry's."""
    if "\ncomputation_schedules {" in text:
        module, *rest = text.split("\ncomputation_schedules {")
        blocks = {_id(r"^  computation_id: (\d+)$", b): b for b in rest}
        entry = blocks.get(_id(r"^  entry_computation_id: (\d+)$", module))
    elif "\n  schedule {" in text:  # the older layout: one schedule, the entry's, inside the module
        module, entry = text.split("\n  schedule {", 1)
        blocks = {}
    else:
        return None
    if entry is None:
        return None
    rate = re.search(r"cycles_per_microsecond: ([\d.e+-]+)", entry)
    total = _total(entry)
    if not rate or total is None:
        return None
    per_second = float(rate.group(1)) * 1e6
    ops = _instructions(module)
    held = {kind: cycles / per_second for kind, cycles in _held(entry, blocks, ops, set()).items()}
    wasted = {name: float(v) / per_second for name, v in re.findall(r"(\w+)_wasted_cycles: ([\d.e+-]+)", entry)}
    return Schedule(total / per_second, held, wasted, float(rate.group(1)))


def _id(pattern: str, text: str) -> int:
    """A computation id the text names (proto3 leaves a 0 out: no line is id 0)."""
    found = re.search(pattern, text, re.M)
    return int(found.group(1)) if found else 0


def _total(block: str) -> float | None:
    found = re.search(r"total_cycles: ([\d.e+-]+)", block)
    return float(found.group(1)) if found else None


def _instructions(module: str) -> dict[int, tuple[str, str, tuple[int, ...]]]:
    """id -> (name, opcode, the computations it calls), for every instruction of the module."""
    found = {}
    for chunk in module.split("instructions {\n")[1:]:
        fields, op_id = _OP_FIELDS.match(chunk), _OP_ID.search(chunk)
        if fields and op_id:
            found[int(op_id.group(1))] = (fields.group(1), fields.group(2),
                                          tuple(int(c) for c in _CALLED.findall(chunk)))
    return found


def _held(block: str, blocks: dict[int, str], ops: dict, seen: set[int]) -> Counter:
    """Cycles each collective kind holds of a computation's timeline: its own, and a loop's body's times its trips
    (the while's span over the body's total)."""
    held: Counter = Counter()
    for i, start, end in _SLOT.findall(block):
        name, opcode, called = ops.get(int(i), ("", "", ()))
        span = float(end) - float(start or 0)
        kind = collective_kind(name, opcode)
        if kind:
            held[kind] += span
        elif opcode == "while":
            body = next((c for c in called if c in blocks and c not in seen), None)
            body_total = _total(blocks[body]) if body is not None else None
            if body_total:
                for k, cycles in _held(blocks[body], blocks, ops, seen | {body}).items():
                    held[k] += span / body_total * cycles
    return held


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
