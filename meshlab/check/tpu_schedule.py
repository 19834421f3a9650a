"""XLA:TPU's own time estimate of a compiled program: its latency-hiding scheduler's schedule. Pure, no jax.

With ``XLA_FLAGS="--xla_dump_to=D --xla_dump_latency_hiding_schedule=true"`` XLA:TPU writes
``D/<module>.schedule.txt``, a text proto: the scheduled module (each instruction's name, opcode, ``id`` and the
computations it calls), then one ``computation_schedules { computation_id, instructions { id,
start_timestamp_cycles, end_timestamp_cycles } ... scheduler_statistics { total_cycles, <kind>_wasted_cycles ... }
cycles_per_microsecond }`` per scheduled computation: the entry, and each loop body (libtpu 0.0.52; fsdp.yaml's
program at full depth has 361). An older layout keeps one ``schedule { ... }`` inside the module. It is the cost
model XLA:TPU schedules by, not a measurement: `Schedule` reads the entry computation's total, the time each
collective kind holds its timeline (a loop's collectives: its body's, times the loop's trips, the while's span over
its body's total), the cycles the scheduler says collectives leave exposed, and what the rest of the timeline
holds, op by op (meshlab.cost.compiled_call.OP_CLASSES, told apart by each op's own instructions and metadata:
`op_class`). No library reads this file (the proto's Python class is not in jaxlib's public API), so it is read
here with a few patterns over its text.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field

from meshlab.check.hlo import COLLECTIVE_KINDS
from meshlab.cost.compiled_call import ATTENTION, COPIES, ELEMENTWISE, IDLE, MATMULS, OP_CLASSES, OTHER

_OP_FIELDS = re.compile(r'^\s+name: "([^"]+)"\n\s+opcode: "([^"]+)"')
_COMPUTATION_ID = re.compile(r"^    id: (\d+)$", re.M)
_MARKS = re.compile(r'^\s+(?:op_name|source_file): "([^"]*)"', re.M)
_OP_ID = re.compile(r"^      id: (\d+)$", re.M)
_CALLED = re.compile(r"^      called_computation_ids: (\d+)$", re.M)
_PALLAS = 'custom_call_target: "tpu_custom_call"'  # a Pallas kernel's call (jax.experimental.pallas on a TPU)
_KERNEL = "kernel"
#: proto3 leaves a zero out: an instruction starting at cycle 0 has no start line
_SLOT = re.compile(r"id: (\d+)\n(?:\s+start_timestamp_cycles: ([\d.e+-]+)\n)?\s+end_timestamp_cycles: ([\d.e+-]+)")

#: What an instruction's metadata (its op_name and source_file) says it came from. torch_xla names the aten op and
#: the Python file that called it, torchax the torch function and the op (``.../linear/...``):
#: a Linear's or a convolution's (torch's linear.py and conv.py; XLA may lower a small one to a multiply and a reduce)
LINEAR_MARKS = ("linear.py", "conv.py", "aten__mm", "aten__addmm", "aten__convolution", "/linear/", "aten::mm",
                "aten::addmm", "aten::linear", "aten::convolution", "conv_general_dilated")
#: the attention's: its batched products (scores and output; also a linear attention's), its softmax (and the kernel
#: libtpu rewrites a softmax and its product into, named "online-softmax"), torch's SDPA, diffusers' dispatcher
ATTENTION_MARKS = ("scaled_dot_product_attention", "aten__matmul", "aten__bmm", "aten::matmul", "aten::bmm",
                   "softmax", "attention_dispatch.py")
#: the file of an attention processor that does its own math: its products are the attention's (its Linears come
#: from linear.py, its reshapes and adds are elementwise)
ATTENTION_PRODUCT_MARKS = ("attention_processor.py",)
_MATMUL_OPCODES = frozenset({"convolution", "dot"})
_COPY_OPCODES = frozenset({"copy", "copy-start", "copy-done", "transpose"})
_NOT_OPS = frozenset({"parameter", "constant", "get-tuple-element", "tuple", "bitcast"})  # hold no time of their own
#: instructions that compute nothing of their own: their names say where a view or a wrapper came from, not the work
#: (torchax names a norm-and-RoPE fusion's reshapes after the SDPA call that reads them)
_NO_WORK = _NOT_OPS | {"fusion", "copy", "reshape", "transpose", "broadcast"}
#: neither elementwise work nor a layout change: kernels and calls XLA:TPU sees into no further, host traffic
_OTHER_OPCODES = frozenset({"custom-call", "call", "conditional", "while", "send", "send-done", "recv", "recv-done",
                            "infeed", "outfeed", "async-start", "async-update", "async-done"})


@dataclass(frozen=True)
class Schedule:
    """One program's schedule, in seconds (XLA:TPU's estimate)."""

    total_s: float
    #: timeline held by each collective kind: sync ops, and the -done / async-collective-done ops of async ones, which
    #: hold little (hybrid.yaml's async all-to-alls at full depth: 0.24 us a forward); the waits on them are idle
    #: cycles, which `wasted_s` counts by kind (12.4 ms there; meshlab.cost.compiled_call.waits_as_collectives)
    by_kind: dict[str, float] = field(default_factory=dict)
    wasted_s: dict[str, float] = field(default_factory=dict)  # scheduler_statistics' *_wasted_cycles, by name
    cycles_per_microsecond: float = 0.0
    #: the rest of the timeline by what its ops are (OP_CLASSES): sums to `compute_s`
    by_op: dict[str, float] = field(default_factory=dict)
    #: of `by_op`, what Pallas kernels hold (custom calls to ``tpu_custom_call``: a flash attention's), which XLA:TPU
    #: times by the cost estimate each kernel declares (its FLOPs at the MXU's peak), not by a model of its own
    kernel_by_op: dict[str, float] = field(default_factory=dict)

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
                "cycles_per_microsecond": self.cycles_per_microsecond, "compute_s_by_op": dict(self.by_op),
                "kernel_s_by_op": dict(self.kernel_by_op),
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
    program = _Program.read(module)
    held = _held(entry, blocks, program, set())
    by_kind = {k: cycles / per_second for k, cycles in held.items() if k not in OP_CLASSES and isinstance(k, str)}
    by_op = {k: held[k] / per_second for k in OP_CLASSES if held.get(k)}
    kernels = {k: held[_KERNEL, k] / per_second for k in OP_CLASSES if held.get((_KERNEL, k))}
    wasted = {name: float(v) / per_second for name, v in re.findall(r"(\w+)_wasted_cycles: ([\d.e+-]+)", entry)}
    return Schedule(total / per_second, by_kind, wasted, float(rate.group(1)), by_op, kernels)


def _id(pattern: str, text: str) -> int:
    """A computation id the text names (proto3 leaves a 0 out: no line is id 0)."""
    found = re.search(pattern, text, re.M)
    return int(found.group(1)) if found else 0


def _total(block: str) -> float | None:
    found = re.search(r"total_cycles: ([\d.e+-]+)", block)
    return float(found.group(1)) if found else None


@dataclass(frozen=True)
class _Op:
    name: str
    opcode: str
    called: tuple[int, ...]  # the computations it calls (a fusion's fused computation, a loop's body)
    marks: str  # its metadata's op_name and source_file
    kernel: bool = False  # a Pallas kernel (a custom call to tpu_custom_call)


@dataclass(frozen=True)
class _Program:
    """The scheduled module's instructions by id, and each computation's instruction ids."""

    ops: dict[int, _Op]
    computations: dict[int, tuple[int, ...]]

    @staticmethod
    def read(module: str) -> "_Program":
        ops, computations = {}, {}
        for computation in module.split("\n  computations {\n")[1:]:
            chunks = computation.split("instructions {\n")
            ids = []
            for chunk in chunks[1:]:
                fields, op_id = _OP_FIELDS.match(chunk), _OP_ID.search(chunk)
                if fields and op_id:
                    ids.append(int(op_id.group(1)))
                    ops[ids[-1]] = _Op(fields.group(1), fields.group(2), tuple(int(c) for c in _CALLED.findall(chunk)),
                                       " ".join(_MARKS.findall(chunk)), _PALLAS in chunk)
            # the computation's id is its only line at this depth (an instruction's is deeper; proto3 leaves 0 out)
            own = _COMPUTATION_ID.search(computation.split("\n  }\n", 1)[0])
            computations[int(own.group(1)) if own else 0] = tuple(ids)
        return _Program(ops, computations)

    def inside(self, op: _Op, seen: frozenset = frozenset()) -> list[_Op]:
        """`op` and every instruction of the computations it calls, however deep."""
        found = [op]
        for c in op.called:
            if c not in seen:
                for i in self.computations.get(c, ()):
                    found += self.inside(self.ops[i], seen | {c})
        return found


def op_class(program: _Program, op: _Op) -> str | None:
    """Which of OP_CLASSES an op of the timeline is (None: a collective's, or one that holds no time), by what it
    holds and where its instructions came from (`LINEAR_MARKS`, `ATTENTION_MARKS`): an op holding a matmul is a
    Linear's where one of its matmuls names a Linear, the attention's where one names the attention (or an attention
    processor's file), else a Linear's; an op holding none is the attention's where an instruction names it, a
    Linear's where one names a Linear (a small one XLA lowers to a multiply and a reduce), a copy, another kind of
    op (`_OTHER_OPCODES`), or elementwise work."""
    if collective_kind(op.name, op.opcode) or op.opcode in _NOT_OPS:
        return None
    if op.opcode in _COPY_OPCODES:
        return COPIES
    held = program.inside(op)
    names = lambda o, marks: any(mark in o.marks for mark in marks)
    matmuls = [o for o in held if o.opcode in _MATMUL_OPCODES]
    if matmuls:
        if any(names(o, LINEAR_MARKS) for o in matmuls):
            return MATMULS
        attention = ATTENTION_MARKS + ATTENTION_PRODUCT_MARKS
        return ATTENTION if any(names(o, attention) for o in matmuls) else MATMULS
    if any(names(o, ATTENTION_MARKS) for o in held if o.opcode not in _NO_WORK):
        return ATTENTION
    if any(names(o, LINEAR_MARKS) for o in held if o.opcode == "reduce"):
        return MATMULS
    return OTHER if op.opcode in _OTHER_OPCODES else ELEMENTWISE


def _held(block: str, blocks: dict[int, str], program: _Program, seen: set[int]) -> Counter:
    """Cycles each collective kind and each of OP_CLASSES holds of a computation's timeline: its own, and a loop's
    body's times its trips (the while's span over the body's total); the cycles no op holds are IDLE. A Pallas
    kernel's cycles also count under ``(_KERNEL, its class)``."""
    held: Counter = Counter()
    for i, start, end in _SLOT.findall(block):
        op = program.ops.get(int(i), _Op("", "custom-call", (), ""))  # not in the module: an op of its own kind
        span = float(end) - float(start or 0)
        kind = collective_kind(op.name, op.opcode) or _started(op)
        if kind:
            held[kind] += span
        elif op.opcode == "while":
            body = next((c for c in op.called if c in blocks and c not in seen), None)
            body_total = _total(blocks[body]) if body is not None else None
            if body_total:
                for k, cycles in _held(blocks[body], blocks, program, seen | {body}).items():
                    held[k] += span / body_total * cycles
            else:
                held[OTHER] += span
        elif span:
            what = op_class(program, op) or OTHER
            held[what] += span
            if any(o.kernel for o in program.inside(op)):  # a Pallas kernel's call, or a fusion or wrapper holding one
                held[_KERNEL, what] += span
    idle = (_total(block) or 0.0) - sum(v for k, v in held.items() if isinstance(k, str))
    if idle >= 0.5:  # cycles; below, the float sum's rounding
        held[IDLE] += idle
    return held


def _started(op: _Op) -> str | None:
    """The collective kind whose async pair an instruction starts (its issue holds the timeline briefly)."""
    return op.opcode[:-6] if op.opcode.endswith("-start") and op.opcode[:-6] in COLLECTIVE_KINDS else None


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
