"""Read what XLA wrote: HLO sharding strings, partitioned HLO text, and buffer-assignment reports. Pure, no torch.

The three inputs, as XLA prints them (``--xla_dump_to=DIR --xla_dump_hlo_as_text``):

- a sharding: ``{devices=[4,1,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}``, ``{replicated}``, or the iota form
  ``{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}``;
- the per-device program after SPMD partitioning (``*after_optimizations.txt``), whose collectives look like
  ``%all-gather.1 = f32[1,512,3072]{2,0,1} all-gather(%call.70), replica_groups={{0,4},{1,5}}, dimensions={1}``;
- its buffer assignment (``*after_optimizations-buffer-assignment.txt``): one ``allocation N: size S, ...`` line
  per buffer of one device, and ``Total bytes used: N``.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Collection, Iterator
from dataclasses import dataclass

from meshlab.core.errors import BackendError
from meshlab.core.mesh import unravel
from meshlab.cost.collectives import COLLECTIVE_KINDS

#: Bytes per element of every XLA primitive type (xla/xla_data.proto's PrimitiveType, as HLO text spells them);
#: sub-byte types are packed (s4: two to a byte), so their arrays take a fraction of a byte per element.
ELEMENT_BYTES = {
    "pred": 1, "s1": 0.125, "u1": 0.125, "s2": 0.25, "u2": 0.25, "s4": 0.5, "u4": 0.5, "s8": 1, "u8": 1,
    "s16": 2, "u16": 2, "s32": 4, "u32": 4, "s64": 8, "u64": 8, "f16": 2, "bf16": 2, "f32": 4, "f64": 8,
    "f4e2m1fn": 0.5, "f8e3m4": 1, "f8e4m3": 1, "f8e4m3fn": 1, "f8e4m3b11fnuz": 1, "f8e4m3fnuz": 1, "f8e5m2": 1,
    "f8e5m2fnuz": 1, "f8e8m0fnu": 1, "c64": 8, "c128": 16, "token": 0, "opaque": 0,
}


# --- shardings -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HloSharding:
    """A parsed HLO sharding: tiles per tensor dim, and the devices in tile order (replicas last)."""

    tiles: tuple[int, ...]  # one entry per tensor dim (the replication dim removed)
    replicas: int  # devices that hold each tile (1: no replication)
    devices: tuple[int, ...]  # device ids in tile-assignment order, len = prod(tiles) * replicas

    @property
    def is_replicated(self) -> bool:
        return math.prod(self.tiles) == 1

    def shard_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """What each device allocates: every dim padded to ceil(n / tiles), as XLA pads it."""
        if self.is_replicated:
            return tuple(shape)
        return tuple(-(-n // k) for n, k in zip(shape, self.tiles))


_SHARDING = re.compile(r"^\{devices=\[([\d,]+)\](\S+)((?:\s+\w+)*)\}$")


def parse_sharding(text: str, rank: int, device_count: int) -> HloSharding:
    """Parse an HLO sharding string of a `rank`-dim tensor; an empty or ``{replicated}`` one is replicated."""
    text = text.strip()
    if text in ("", "{replicated}"):
        return HloSharding((1,) * rank, device_count, tuple(range(device_count)))
    match = _SHARDING.match(text)
    if not match:
        raise ValueError(f"unsupported HLO sharding {text!r}")
    dims = tuple(int(d) for d in match.group(1).split(","))
    devices = _device_list(match.group(2), math.prod(dims))
    replicate = "last_tile_dim_replicate" in match.group(3).split()
    tiles, replicas = (dims[:-1], dims[-1]) if replicate else (dims, 1)
    if len(tiles) != rank:
        raise ValueError(f"HLO sharding {text!r} has {len(tiles)} tiled dims for a tensor of rank {rank}")
    return HloSharding(tiles, replicas, devices)


def _device_list(text: str, count: int) -> tuple[int, ...]:
    if text.startswith("<="):
        iota = re.fullmatch(r"<=\[([\d,]+)\](?:T\(([\d,]+)\))?", text)
        if not iota:
            raise ValueError(f"unsupported iota device list {text!r}")
        return iota_devices(_ints(iota.group(1)), _ints(iota.group(2)) if iota.group(2) else None)
    devices = tuple(int(d) for d in text.split(","))
    if len(devices) != count:
        raise ValueError(f"device list {text!r} has {len(devices)} devices, the tiles need {count}")
    return devices


def iota_devices(dims: tuple[int, ...], perm: tuple[int, ...] | None = None) -> tuple[int, ...]:
    """XLA's iota tile assignment: ``iota(prod(dims))`` reshaped to `dims`, transposed by `perm`, flattened."""
    perm = perm or tuple(range(len(dims)))
    out_dims = [dims[p] for p in perm]
    strides = [math.prod(dims[i + 1:]) for i in range(len(dims))]
    devices = []
    for flat in range(math.prod(dims)):
        index = unravel(flat, out_dims)
        devices.append(sum(index[k] * strides[p] for k, p in enumerate(perm)))
    return tuple(devices)


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


# --- collectives ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArrayShape:
    dtype: str
    dims: tuple[int, ...]

    @property
    def bytes(self) -> int:
        return math.ceil(math.prod(self.dims) * ELEMENT_BYTES[self.dtype])

    def __str__(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.dims))}]"


@dataclass(frozen=True)
class HloCollective:
    """One collective of the per-device program, as XLA wrote it."""

    name: str  # the instruction's name, e.g. all-gather.1
    kind: str  # one of COLLECTIVE_KINDS
    result: tuple[ArrayShape, ...]  # one entry, or several for a combined (tuple-shaped) collective
    operands: tuple[ArrayShape, ...]  # empty when the operands' definitions were not found
    groups: tuple[tuple[int, ...], ...]  # replica groups; source-target pairs for collective-permute
    op_name: str | None  # the op_name of its metadata (meshlab tags it "<module path>/<aten op>")
    asynchronous: bool = False  # issued as a start/done pair (XLA:TPU overlaps compute between the two)
    computation: str = ""  # the computation it sits in (its first, for an async fusion's copies)

    @property
    def bytes_per_device(self) -> int:
        """The larger of what one device sends in and gets out (all-gather: its result; reduce-scatter: its input)."""
        return max(sum(s.bytes for s in self.result), sum(s.bytes for s in self.operands))

    @property
    def layer(self) -> str | None:
        """The innermost module the op came from, when meshlab scoped the forward (``transformer_blocks.0.attn``)."""
        return layer_of(self.op_name)


_SCOPE = re.compile(r"^(.*)#(?:\.\d+)?$")


_PARAMETER = re.compile(r"params\[\\?'([^'\\]+)\\?'\]")  # the HLO text escapes the quotes: params[\'a.b\']


def layer_of(op_name: str | None) -> str | None:
    """The innermost meshlab scope of an op name: ``a#.3/a.b#.5/aten__mm`` -> ``a.b``; None without one. An op XLA
    made of several names them all, joined by ``;`` (``b#.9/aten__add;b#.9/aten__view``): the first that has a scope
    (LTX-Video's modulation all-to-alls under 2d were read as outside the blocks). A jax program names an op on a
    weight argument (an FSDP gather) after the argument, ``params['a.b.weight']``: its module ``a.b``."""
    for name in (op_name or "").split(";"):
        for segment in reversed(name.split("/")[:-1]):
            match = _SCOPE.match(segment)
            if match:
                return match.group(1)
    weight = _PARAMETER.search(op_name or "")
    if weight:
        return weight.group(1).rpartition(".")[0] or None
    return None


_INSTRUCTION = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_KIND = re.compile(r"\s(" + "|".join(COLLECTIVE_KINDS) + r")(-start)?\(")
_ARRAY = re.compile(r"(?<![\w.%'\-])([a-z][a-z0-9]*)\[([\d,]*)\]")  # any type name: an unknown one is refused


def parse_collectives(hlo_text: str) -> tuple[HloCollective, ...]:
    """Every collective of an HLO module's text, in program order, each once.

    Async pairs count once, at -start. XLA:TPU's async collective fusions copy one collective into the
    computations that start and finish it (the same ``channel_id``, under ``AsyncCollectiveStart`` /
    ``AsyncCollectiveDone`` custom calls): it counts once, marked asynchronous. A reduce-scatter XLA:TPU writes
    as an all-reduce and a slice inside an ``all-reduce-scatter`` fusion counts as the reduce-scatter it is, once
    per fusion. A combined collective (several operands) that XLA named takes the op_name of what made its largest
    operand, which may belong to a block other than the one XLA's combiner named it after
    (`_largest_operand_op_name`); one XLA left unnamed stays so (a multi-slice program keeps no collective's name,
    though its fusions keep theirs: naming a few of its collectives would have its calls held as blocks)."""
    shapes = definitions(hlo_text)
    computations = _computations(hlo_text)
    asynchronous = {channel for name, lines in computations for channel in _channels(lines)
                    if any("AsyncCollective" in line for line in lines)}
    callers = _callers(hlo_text)
    made = _ops(computations)
    # a fused or async computation: the operands its (first) caller passes
    fed = {op.called: op.operands for op in reversed(made.values()) if op.kind in ("fusion", "async-start")}
    found, seen = [], set()
    for computation, lines in computations:
        for line in lines:
            instruction = _INSTRUCTION.match(line)
            kind = _KIND.search(line) if instruction else None
            if not kind:
                continue
            channel = _channel(line)
            head = line[instruction.start(2):kind.start()]
            operand_names = _operand_names(line[kind.end():])
            operands = tuple(s for o in operand_names for s in shapes.get(o, ()))
            result = array_shapes(head) if not kind.group(2) else _start_result(head)
            groups = _groups(line)
            # an async fusion's copies agree on all four; each all-reduce-scatter fusion is a collective of its own,
            # though XLA:TPU may number two alike (sd35-2d.yaml at 128 text tokens: two blocks' MLP sums, channel 1)
            copy = (channel, kind.group(1), result, groups,
                    computation if computation.startswith("all-reduce-scatter") else "")
            if channel is not None and copy in seen:
                continue
            seen.add(copy)
            name, op_name = kind.group(1), _op_name(line)
            if len(operand_names) > 1 and layer_of(op_name) is not None:
                op_name = _largest_operand_op_name(operand_names, shapes, made, fed) or op_name
            if name == "all-reduce" and computation.startswith("all-reduce-scatter"):
                name, result = "reduce-scatter", _computation_result(hlo_text, computation) or result
                op_name = op_name or callers.get(computation)  # the fusion that calls it carries the op's name
            found.append(HloCollective(
                name=instruction.group(1), kind=name, result=result, operands=operands, groups=groups,
                op_name=op_name, asynchronous=bool(kind.group(2)) or channel in asynchronous,
                computation=computation,
            ))
    return tuple(found)


#: what only carries a value on, whose maker names it: views and memory-space assignment's async copies
_CARRIES = ("bitcast", "copy", "copy-start", "copy-done")


def _largest_operand_op_name(operands: list[str], shapes: dict[str, tuple[ArrayShape, ...]],
                             made: dict[str, _Op], callers: dict[str, list[str]]) -> str | None:
    """The op_name of what made a combined collective's largest operand (the first of the largest): the operand's
    own, else its maker's back through what only carries a value on (`_CARRIES`; a get-tuple-element of a tuple, to
    the element; a fused or async computation's parameter, to the operand its caller passes, `callers`); None where
    the first that computes has no meshlab scope (a multi-output fusion's element is not named by the fusion, which
    names its root).

    XLA's combiners name the op they make after its first operand, which may be another block's: on SD3.5 under
    data 4 x model 2 at 1024² with 333 text tokens (sd35-2d.yaml's workload) XLA:TPU sums block 1's text MLP output
    (1,619,712 B) with two modulation sums of 4,864 B that every block computes from one silu(temb), which XLA
    made once and named after block 0's: the op counted in block 0 left block 1 one all-reduce and 1.6 MB short. So
    a combined collective is the block's that gives it most of its bytes."""
    sizes = [sum(s.bytes for s in shapes.get(o, ())) for o in operands]
    name, seen = operands[sizes.index(max(sizes))], set()
    while name in made and name not in seen:
        seen.add(name)
        op = made[name]
        if layer_of(op.op_name) is not None:
            return op.op_name
        if op.kind in _CARRIES and len(op.operands) == 1:
            name = op.operands[0]
            continue
        source = made.get(op.operands[0], _NONE) if op.kind == "get-tuple-element" and op.operands else _NONE
        # the values `op.index` picks from: a tuple's elements, or the operands a computation's caller passes
        picked = source.operands if source.kind == "tuple" else (
            callers.get(op.computation, []) if op.kind == "parameter" else [])
        if op.index is None or op.index >= len(picked):
            return None
        name = picked[op.index]
    return None


_CALLED = re.compile(r"\b(?:calls|to_apply|body|condition|branch_computations|called_computations)="
                     r"(\{[^}]*\}|%?[\w.\-]+)")


def loop_body_computations(hlo_text: str) -> frozenset[str]:
    """Every computation that runs inside a ``while`` loop's body: the bodies and all they call (fusions, async
    collectives, reductions, nested loops). torch_xla's scan runs a scanned block list as such a loop."""
    calls: dict[str, set[str]] = {}
    bodies: set[str] = set()
    for name, lines in _computations(hlo_text):
        for line in lines:
            for match in _CALLED.finditer(line):
                called = {c.strip().lstrip("%") for c in match.group(1).strip("{}").split(",") if c.strip()}
                calls.setdefault(name, set()).update(called)
            body = re.search(r"\swhile\(.*\bbody=%?([\w.\-]+)", line)
            if body:
                bodies.add(body.group(1))
    reached, todo = set(), list(bodies)
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo.extend(calls.get(name, ()))
    return frozenset(reached)


def _callers(hlo_text: str) -> dict[str, str]:
    """The op_name of the instruction that calls each computation (``calls=%name``), by computation name."""
    found = {}
    for line in hlo_text.splitlines():
        called = re.search(r"calls=%?([\w.\-]+)", line)
        name = _op_name(line) if called else None
        if name:
            found.setdefault(called.group(1), name)
    return found


_COMPUTATION = re.compile(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s*(?:\(.*\))?\s*->.*\{\s*$")


def _computations(hlo_text: str) -> list[tuple[str, list[str]]]:
    """(name, instruction lines) of each computation of the module, in order ("" for lines outside any)."""
    out, name, lines = [], "", []
    for line in hlo_text.splitlines():
        header = _COMPUTATION.match(line)
        if header and not line.startswith(" "):
            if lines:
                out.append((name, lines))
            name, lines = header.group(1), []
        elif line.startswith("}"):
            out.append((name, lines))
            name, lines = "", []
        else:
            lines.append(line)
    if lines:
        out.append((name, lines))
    return out


def _computation_result(hlo_text: str, computation: str) -> tuple[ArrayShape, ...]:
    header = re.search(r"^%?" + re.escape(computation) + r"\s*\(.*\)\s*->\s*(.*)\{\s*$", hlo_text, re.M)
    return array_shapes(header.group(1)) if header else ()


def _channel(line: str) -> int | None:
    match = re.search(r"channel_id=(\d+)", line)
    return int(match.group(1)) if match else None


def _channels(lines: list[str]) -> set[int]:
    return {c for line in lines if _KIND.search(line) and (c := _channel(line)) is not None}


_DOT = re.compile(r"\sdot\(")
_CONTRACTING = re.compile(r"lhs_contracting_dims=\{([\d,]*)\}")


def pallas_kernels(hlo_text: str) -> int:
    """How many Pallas kernels a TPU program calls (custom calls to ``tpu_custom_call``: a flash attention's)."""
    return hlo_text.count('custom_call_target="tpu_custom_call"')


def dot_flops(hlo_text: str) -> float:
    """FLOPs of every dot in an HLO module's text, as XLA's HloCostAnalysis counts a dot: 2 x the result's
    elements x the contracted elements (fused computations included; each is called once in a module without
    loops). Convolutions and elementwise work are left out, as meshlab's FLOP count leaves them out."""
    shapes = definitions(hlo_text)
    total = 0.0
    for line in hlo_text.splitlines():
        instruction = _INSTRUCTION.match(line)
        dot = _DOT.search(line) if instruction else None
        if not dot:
            continue
        result = array_shapes(line[instruction.start(2):dot.start()])
        operands = _operand_names(line[dot.end():])
        contracting = _CONTRACTING.search(line)
        lhs = shapes.get(operands[0], ()) if operands else ()
        if not result or not lhs or contracting is None:
            continue
        contracted = math.prod(lhs[0].dims[i] for i in _ints(contracting.group(1)))
        total += 2.0 * math.prod(result[0].dims) * contracted
    return total


def definitions(hlo_text: str) -> dict[str, tuple[ArrayShape, ...]]:
    """Each instruction's result shapes, by its name (every computation of the module)."""
    shapes = {}
    for line in hlo_text.splitlines():
        instruction = _INSTRUCTION.match(line)
        if instruction:
            head = re.split(r"\s[a-z][a-z0-9\-]*\(", " " + instruction.group(2), maxsplit=1)[0]
            shapes[instruction.group(1)] = array_shapes(head)
    return shapes


def array_shapes(text: str) -> tuple[ArrayShape, ...]:
    """Every array shape written in `text` (``bf16[8,16]{1,0}``), in order. A type XLA names that is not in
    ELEMENT_BYTES is an error saying so: sized at a guess, a collective's bytes would be silently wrong."""
    shapes = []
    for dtype, dims in _ARRAY.findall(text):
        if dtype not in ELEMENT_BYTES:
            raise UnknownElementType(dtype)
        shapes.append(ArrayShape(dtype, _ints(dims)))
    return tuple(shapes)


class UnknownElementType(BackendError):
    """XLA wrote an element type meshlab cannot size (a newer XLA's): one line naming it, exit 3."""

    def __init__(self, dtype: str):
        super().__init__(f"XLA wrote an array of element type {dtype!r}, whose size meshlab does not know",
                         "add it to meshlab.check.hlo.ELEMENT_BYTES (xla_data.proto's PrimitiveType says its bits)")
        self.dtype = dtype


def _start_result(text: str) -> tuple[ArrayShape, ...]:
    """An async -start returns (operands, results[, scalar contexts]); keep the results."""
    shapes = tuple(s for s in array_shapes(text) if s.dims)
    return shapes[len(shapes) // 2:] if len(shapes) > 1 else shapes


def _operand_names(text: str) -> list[str]:
    depth, end = 1, 0
    for end, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if depth == 0:
            break
    return re.findall(r"%([\w.\-]+)", text[:end])


def _op_name(line: str) -> str | None:
    match = re.search(r'op_name="([^"]*)"', line)
    return match.group(1) if match else None


def _groups(line: str) -> tuple[tuple[int, ...], ...]:
    pairs = re.search(r"source_target_pairs=\{((?:\{[\d,]*\},?)*)\}", line)
    if pairs:
        return tuple(_ints(g) for g in re.findall(r"\{([\d,]*)\}", pairs.group(1)))
    iota = re.search(r"replica_groups=\[([\d,]+)\]<=\[([\d,]+)\](?:T\(([\d,]+)\))?", line)
    if iota:
        shape = _ints(iota.group(1))
        devices = iota_devices(_ints(iota.group(2)), _ints(iota.group(3)) if iota.group(3) else None)
        size = shape[-1]
        return tuple(devices[i:i + size] for i in range(0, len(devices), size))
    explicit = re.search(r"replica_groups=\{((?:\{[\d,]*\},?)*)\}", line)
    if explicit:
        return tuple(_ints(g) for g in re.findall(r"\{([\d,]*)\}", explicit.group(1)))
    named = re.search(r"replica_groups=mesh\[([^\]]*)\](?:,\s*device_ids=\(([\d,]*)\))?\s*\{([^}]*)\}", line)
    if named:
        groups = mesh_groups(tuple((a, int(n)) for a, n in re.findall(r"'([^']+)'=(\d+)", named.group(1))),
                             tuple(re.findall(r"'([^']+)'", named.group(3))))
        ids = _ints(named.group(2)) if named.group(2) else None
        return tuple(tuple(ids[p] for p in g) for g in groups) if ids else groups
    return ()


def mesh_groups(axes: tuple[tuple[str, int], ...], over: tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
    """Replica groups written as a mesh (``mesh['x'=2,'y'=4] {'y'}``): mesh positions numbered row-major, each
    group the positions that differ only along the axes `over` (``device_ids=(...)`` after the mesh maps
    positions to devices; the caller applies it)."""
    sizes = [n for _, n in axes]
    names = [a for a, _ in axes]
    groups: dict[tuple[int, ...], list[int]] = {}
    for device in range(math.prod(sizes)):
        coords = unravel(device, sizes)
        key = tuple(c for c, name in zip(coords, names) if name not in over)
        groups.setdefault(key, []).append(device)
    return tuple(tuple(g) for g in groups.values())


def mesh_axes(groups: tuple[tuple[int, ...], ...], axes: tuple[tuple[str, int], ...],
              device_ids: tuple[int, ...] | None = None) -> tuple[str, ...]:
    """The mesh axes a collective runs over: those along which the members of a group differ.

    `axes` are the mesh's (name, size) pairs; `device_ids[p]` is the device at row-major mesh position p
    (default: position = id). No groups means one group of every device.
    """
    names = [name for name, _ in axes]
    sizes = [size for _, size in axes]
    count = math.prod(sizes)
    position = {d: p for p, d in enumerate(device_ids or range(count))}
    groups = groups or (tuple(range(count)),)
    varying = set()
    for group in groups:
        coords = [unravel(position.get(d, d), sizes) for d in group]
        varying.update(i for i in range(len(sizes)) if len({c[i] for c in coords}) > 1)
    return tuple(names[i] for i in sorted(varying))


# --- memory --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class XlaMemory:
    """One device's buffers for one compiled program, by what they hold (bytes)."""

    parameters: int  # the program's arguments: weights, inputs, cached tables
    temporaries: int  # scratch XLA reuses between ops
    outputs: int  # results that live past the program
    constants: int
    total: int  # "Total bytes used"

    def to_json(self) -> dict:
        return {"parameters": self.parameters, "temporaries": self.temporaries, "outputs": self.outputs,
                "constants": self.constants, "total": self.total}


_ALLOCATION = re.compile(r"^allocation \d+: size (\d+), (.*):\s*$", re.M)


def parse_buffer_assignment(text: str) -> XlaMemory:
    """Sum a buffer-assignment report's allocations by kind; the total is XLA's own figure when it gives one."""
    sums = {"parameters": 0, "temporaries": 0, "outputs": 0, "constants": 0}
    for size, what in _ALLOCATION.findall(text):
        sums[_allocation_kind(what)] += int(size)
    total = re.search(r"Total bytes used: (\d+)", text)
    return XlaMemory(**sums, total=int(total.group(1)) if total else sum(sums.values()))


def _allocation_kind(what: str) -> str:
    if re.search(r"\bparameter \d+", what):
        return "parameters"
    if "output shape" in what or "live-out" in what:
        return "outputs"
    if "constant" in what:
        return "constants"
    return "temporaries"


def total_bytes_used(memory_report: str) -> int | None:
    """The ``Total bytes used`` of a memory-usage report."""
    match = re.search(r"Total bytes used: (\d+)", memory_report)
    return int(match.group(1)) if match else None


# --- arguments as laid out -----------------------------------------------------------------------------------

_LAID_OUT = r"(\w+)\[([\d,]*)\]\{([\d,]*)(?::([^}]*))?\}"  # bf16[2240]{0:T(1024)(128)(2,1)}
_ENTRY_PARAMETER = re.compile(_LAID_OUT + r" parameter\(\d+\)")
_FIRST_TILE = re.compile(r"T\(([\d,]+)\)")


@dataclass(frozen=True)
class EntryArgument:
    """One argument of a compiled program's entry computation: its shape and the bytes its layout allocates."""

    shape: ArrayShape
    bytes: int  # the shape rounded up to its layout's tiles (XLA:TPU's ``T(8,128)``), as the device holds it


def entry_arguments(hlo_text: str) -> tuple[EntryArgument, ...]:
    """The entry computation's arguments as the optimized program lays them out (``bf16[2240]{0:T(1024)...}``):
    the sizes sum to ``memory_analysis()``'s argument bytes (held on SANA's, Wan 2.1's and CogVideoX's XLA:TPU
    programs)."""
    start = hlo_text.find("\nENTRY")
    if start < 0:
        return ()
    body = hlo_text[start:hlo_text.find("\n}", start)]
    return tuple(_argument(*found) for found in _ENTRY_PARAMETER.findall(body))


def laid_out(text: str) -> EntryArgument:
    """One array as a program writes it with its layout (``bf16[2240,2240]{1,0:T(8,128)(2,1)}``)."""
    found = re.fullmatch(_LAID_OUT, text.strip())
    if not found:
        raise BackendError(f"not an array with a layout: {text[:80]!r}", "pass a shape as HLO writes it")
    return _argument(*found.groups())


def _argument(dtype: str, dims: str, minor_to_major: str, tiles: str | None) -> EntryArgument:
    if dtype not in ELEMENT_BYTES:
        raise UnknownElementType(dtype)
    shape = ArrayShape(dtype, _ints(dims))
    return EntryArgument(shape, _laid_out_bytes(shape, _ints(minor_to_major), tiles or ""))


def _laid_out_bytes(shape: ArrayShape, minor_to_major: tuple[int, ...], tiles: str) -> int:
    """Bytes of `shape` in a layout: its dims major to minor, the minor ones rounded up to the first tile's (the
    tiles after it subdivide that tile and add nothing); a scalar is one element of a tile."""
    dims = [shape.dims[d] for d in reversed(minor_to_major)] if minor_to_major else list(shape.dims)
    tile = _FIRST_TILE.match(tiles)
    if tile:
        sizes = _ints(tile.group(1))
        dims = [1] * max(0, len(sizes) - len(dims)) + dims
        lead, minor = dims[:len(dims) - len(sizes)], dims[len(dims) - len(sizes):]
        dims = lead + [-(-n // t) * t for n, t in zip(minor, sizes)]
    return math.ceil(math.prod(dims) * ELEMENT_BYTES[shape.dtype])


# --- temporaries live at once ----------------------------------------------------------------------------------

_TEMP_ALLOCATION = re.compile(r"^allocation \d+: size \d+, (?:color (\d+), )?page \d+, preallocated-temp:\n"
                              r"((?: .*\n?)*)", re.M)
#: a value of the buffer assignment: its name, size, offset and (where XLA writes it) its array, "(" for a tuple
_VALUE = re.compile(r"value: <\d+ (\S+) @\d+> \(size=(\d+),offset=(\d+)\)(?:: (\(|[a-z][a-z0-9]*\[[\d,]*\]))?")
_LIVE_RANGE = re.compile(r"^\s+(\S+):(\d+)-(\d+)$", re.M)


def temporaries_live_peak(buffer_assignment: str, live_range: str) -> int | None:
    """The most bytes of the program's temporaries (its preallocated temp buffer in device memory, color 0) in use
    at one point of its instruction sequence, from XLA's buffer assignment (each value's offset and size) and its
    live ranges (``*-buffer-assignment.txt``, ``*-live-range.txt``): the union of the live values' byte ranges,
    so values that share bytes (a loop's carried state, an op done in place) count once. The temp buffer itself,
    ``memory_analysis()``'s temp bytes, is at least this: XLA packs the values into it at offsets, and packing
    leaves gaps (XLA:TPU's program of pairs.yaml at full depth: 0.98 GiB in use at once in a 1.55 GiB temp
    buffer). None where either file says nothing of them."""
    return _live_peak(buffer_assignment, live_range, lambda color, name: color == 0)


def working_set_live_peak(buffer_assignment: str, live_range: str, on_chip: Collection[int],
                          program: str) -> int | None:
    """`temporaries_live_peak` over the temporaries in HBM and those in the on-chip memories XLA:TPU's memory-space
    assignment fills (the buffer assignment's colors `on_chip`, ``ON_CHIP_SPACES``) together, less their copies of
    the program's arguments and of a scanned loop's carried weights (`argument_copies` of its optimized `program`,
    whose instruction names the buffer assignment's values carry): the forward's working set wherever XLA:TPU
    placed it. A small working set sits on chip whole (2d at 256², 3 blocks on v6e: 18,752 B of temporaries in HBM
    at once, 6.7 MiB with VMEM's; on v4, 3.0 MiB in HBM, 12.4 MiB with CMEM's), a large one in HBM (2d at 1024²:
    VMEM adds 6.9 MiB to 1,001.4 MiB, copies of activations on their way between the two counted in both while
    both are live); the weights it prefetches on chip, most of what it places there, are not temporaries."""
    peak = working_set_peak(buffer_assignment, live_range, on_chip, program)
    return peak.bytes if peak else None


@dataclass(frozen=True)
class PeakHolding:
    """Values of one kind that XLA's program holds at its working set's peak (`working_set_peak`)."""

    memory_space: str  # "hbm", or the on-chip memory's name (ON_CHIP_SPACES: "vmem", "cmem")
    shape: str  # the value's array, ``f32[24,4608,4608]``; "" for a tuple's (its buffer holds pointers)
    made_by: str  # the module and op that made it, its block number as "*" (`_Named.made_by`)
    count: int
    bytes: int  # all `count` of them, as allocated, each byte once

    @property
    def label(self) -> str:
        """``2 x f32[24,4608,4608] (transformer_blocks.*.attn: softmax), HBM``: how the check's table and the
        benchmarks name it."""
        return f"{self.count} x {self.shape or 'tuple'} ({self.made_by}), {self.memory_space.upper()}"


@dataclass(frozen=True)
class WorkingSetPeak:
    """The most bytes a program's working set holds at once (`working_set_live_peak`), and what they are."""

    bytes: int
    holdings: tuple[PeakHolding, ...]  # the `top` largest kinds of value live then, the largest first


def working_set_peak(buffer_assignment: str, live_range: str, on_chip: Collection[int], program: str,
                     top: int = 8) -> WorkingSetPeak | None:
    """`working_set_live_peak`, and what the program holds then: the `top` largest kinds of value live at the
    first point of its instruction sequence where the working set peaks (`PeakHolding`). Each byte counts once:
    where values share bytes (a loop's state, an op done in place, a join of the slices it spans) the largest is
    credited them, the earliest made of equals, so every kind's bytes sum to the peak. The figure a prediction is
    held to, made checkable: which buffers, from which module, XLA:TPU keeps at once. None where either file says
    nothing of them."""
    copies = argument_copies(program)
    values = _working_set_values(buffer_assignment, live_range, on_chip, copies)
    found = _peak_of(values)
    if found is None:
        return None
    peak, time = found
    return WorkingSetPeak(peak, _held_at(values, time, _Named.of(program, copies), top))


def working_set_by_module(buffer_assignment: str, live_range: str, on_chip: Collection[int], program: str,
                          top: int = 6) -> dict[str, WorkingSetPeak]:
    """`working_set_peak` phase by phase: for each module the program's ops are scoped to (its block number as
    "*": ``transformer_blocks.*.attn1``), the most bytes the working set holds at a point of the instruction
    sequence where one of its ops runs, and the `top` largest kinds of value live then. What a prediction's phases
    (a block's attention, its MLP) are held to where the whole program's peak is another's. Points whose op no
    module scopes (a memory-space assignment's copy or slice, a fusion's parameter) are left out."""
    copies = argument_copies(program)
    values = _working_set_values(buffer_assignment, live_range, on_chip, copies)
    named = _Named.of(program, copies)
    sequence = _instruction_sequence(live_range)
    peaks: dict[str, tuple[int, int]] = {}
    for time, held in _held_over_time(values):
        made_by = named.made_by(sequence[time]) if time in sequence else ""
        module, scoped, _ = made_by.partition(": ")  # "module: op" where a module scopes the op
        if scoped and not made_by.startswith("copy of") and held > peaks.get(module, (-1, 0))[0]:
            peaks[module] = (held, time)
    return {module: WorkingSetPeak(held, _held_at(values, time, named, top))
            for module, (held, time) in sorted(peaks.items(), key=lambda item: (-item[1][0], item[0]))}


def _working_set_values(buffer_assignment: str, live_range: str, on_chip: Collection[int],
                        copies: frozenset[str]) -> list[tuple]:
    """The working set's values (`working_set_live_peak`): the temporaries in HBM and on chip, less the on-chip
    copies of the program's arguments."""
    return _temporary_values(buffer_assignment, live_range, lambda color, name: color == 0 or (
        color in on_chip and name.partition("{")[0] not in copies))


def _instruction_sequence(live_range: str) -> dict[int, str]:
    """The live ranges' instruction sequence: each point's instruction."""
    listed = live_range.partition("BufferLiveRange:")[0]
    return {int(time): name for time, name in re.findall(r"^\s+(\d+):(\S+)$", listed, re.M)}


def _held_at(values: list[tuple], time: int, named: "_Named", top: int) -> tuple[PeakHolding, ...]:
    """The `top` largest kinds of value `values` keep live at `time` (`working_set_peak`)."""
    spaces = {color: name for (color, _), name in ON_CHIP_SPACES.items()}
    covered: dict[int, list[tuple[int, int]]] = {}
    groups: Counter = Counter()
    counts: Counter = Counter()
    for (start, end), color, offset, size, name, shape in sorted(values, key=lambda v: (-v[3], v[1], v[2], v[0], v[4])):
        if not start <= time <= end:
            continue
        held = covered.setdefault(color, [])
        new = size - _union_bytes((max(a, offset), min(b, offset + size)) for a, b in held
                                  if a < offset + size and b > offset)
        held.append((offset, offset + size))
        if new > 0:
            key = (spaces.get(color, "hbm"), shape, named.made_by(name.partition("{")[0], shape))
            groups[key] += new
            counts[key] += 1
    kinds = sorted(groups, key=lambda key: (-groups[key], key))[:top]
    return tuple(PeakHolding(*key, counts[key], groups[key]) for key in kinds)


#: a module path's block number: the number after its first name (``transformer_blocks.3.attn``), as
#: meshlab.models.card.block_position reads it
_BLOCK_NUMBER = re.compile(r"^([A-Za-z_]\w*\.)\d+(?=\.|$)")
_VIEWS = ("bitcast", "get-tuple-element")  # an unnamed one is the value it views
_COPIES = ("copy", "copy-start", "copy-done")  # memory-space assignment's, between HBM and VMEM or CMEM


@dataclass(frozen=True)
class _Named:
    """What `_Named.made_by` reads of an optimized program."""

    heads: dict[str, tuple[str, str | None]]  # each instruction's text after "=" and its op_name
    copies: frozenset[str]  # `argument_copies`
    #: a computation that holds a collective: its kind, its op_name and its result arrays (empty: every value the
    #: computation returns is the collective's, as an all-reduce-scatter fusion's reduce-scatter)
    collectives: dict[str, tuple[str, str | None, frozenset[str]]]
    run_by: dict[str, str]  # an instruction of an async computation: the async-start that runs it
    scopes: dict[str, str]  # a computation: the op_name of its root, or of the op nearest it a module scopes

    @classmethod
    def of(cls, program: str, copies: frozenset[str]) -> "_Named":
        heads, collectives, members, scopes = {}, {}, {}, {}
        for computation, lines in _computations(program):
            for line in lines:
                instruction = _INSTRUCTION.match(line)
                if instruction:
                    heads[instruction.group(1)] = (instruction.group(2), _op_name(line))
                    members[instruction.group(1)] = computation
            roots = [line for line in lines if line.lstrip().startswith("ROOT ")]  # then the op nearest its output
            scoped = next((n for n in map(_op_name, roots + lines[::-1]) if layer_of(n) is not None), None)
            if scoped:
                scopes[computation] = scoped
            kind = next((k for k in (_KIND.search(line) for line in lines) if k), None)
            if computation.startswith("all-reduce-scatter"):  # parse_collectives counts it a reduce-scatter
                collectives[computation] = ("reduce-scatter", _op_name(kind.string) if kind else None, frozenset())
            elif kind:
                arrays = frozenset(str(s) for s in array_shapes(kind.string[:kind.start()].partition("=")[2]))
                collectives[computation] = (kind.group(1), _op_name(kind.string), arrays)
        starts = {called.group(1): name for name, (head, _) in heads.items()
                  if (called := re.search(r"\sasync-start\(.*\bcalls=%?([\w.\-]+)", head))}
        run_by = {name: starts[computation] for name, computation in members.items() if computation in starts}
        return cls(heads, copies, collectives, run_by, scopes)

    def made_by(self, instruction: str, shape: str = "", depth: int = 0) -> str:
        """`PeakHolding.made_by` of an instruction's value (its array `shape`): "copy of an argument" for a weight
        or input moved about (`argument_copies`); else the module its op_name scopes, its block number as "*", and
        the op: a collective's kind, and a fusion's where the value is the collective's it wraps (XLA:TPU's
        all-reduce-scatter and async collective fusions, named after the collective's module); a fusion XLA left
        unnamed by what it fuses (`scopes`). A value an unnamed op only moves (memory-space assignment's copies,
        which keep its array, and slices between HBM and VMEM, an async computation's values) is "copy of" what it
        moves, one an unnamed view makes the value it views; else the op or opcode."""
        if instruction in self.copies:
            return "copy of an argument"
        head, op_name = self.heads.get(instruction, ("", None))
        opcode = _OPCODE.search(" " + head)
        kind = opcode.group(1) if opcode else ""
        if kind == "custom-call" and 'custom_call_target="ConcatBitcast"' in head:
            kind = "concat-bitcast"
        if not op_name and depth < 16 and instruction in self.run_by:
            return self._moved(self.run_by[instruction], depth)
        if not op_name and depth < 16 and kind in _MOVES and kind != "tuple":  # a tuple's buffer: pointers
            operands = _operand_names((" " + head)[opcode.end():])
            if operands:  # a view or a copy keeps its value's array, a slice does not
                moved = self.made_by(operands[0], shape if kind in _VIEWS + _COPIES else "", depth + 1)
                return moved if kind in _VIEWS else self._copy_of(moved)
        called = re.search(r"\bcalls=%?([\w.\-]+)", head) if kind == "fusion" else None
        wrapped = self.collectives.get(called.group(1)) if called else None
        collective = _KIND.search(" " + head.split(", metadata=")[0])
        if called and not op_name:  # a fusion XLA left unnamed: named by what it fuses
            op_name = self.scopes.get(called.group(1))
        if wrapped and not wrapped[2]:  # every value the collective's: named by it, or by the fusion
            op, op_name = wrapped[0], (wrapped[1] if layer_of(wrapped[1]) else op_name)
        elif wrapped and shape in wrapped[2]:  # the collective's value beside a computation's: named by it alone
            op, op_name = wrapped[0], wrapped[1]
        elif collective and kind.startswith(collective.group(1)):
            op = collective.group(1)
        else:
            op = None
        names = (op_name or "").split(";")
        scoped = next((n for n in names if layer_of(n) is not None), names[0])
        module, op = layer_of(scoped), op or re.sub(r"^(?:aten|xla)__", "", scoped.rpartition("/")[2])
        if module:
            module = _BLOCK_NUMBER.sub(r"\1*", module)
            return f"{module}: {op}" if op else module
        return op or kind or instruction

    def _moved(self, instruction: str, depth: int) -> str:
        return self._copy_of(self.made_by(instruction, "", depth + 1))

    @staticmethod
    def _copy_of(made_by: str) -> str:
        return made_by if made_by.startswith("copy of") else f"copy of {made_by}"


def _live_peak(buffer_assignment: str, live_range: str, counted) -> int | None:
    """The most bytes of the temp buffers' values that `counted(color, name)` keeps in use at once (each color's
    buffer its own bytes)."""
    found = _peak_of(_temporary_values(buffer_assignment, live_range, counted))
    return found[0] if found else None


def _temporary_values(buffer_assignment: str, live_range: str, counted) -> list[tuple]:
    """The temp buffers' values that `counted(color, name)` keeps: ((start, end), color, offset, size, name, array)
    each, its live range from `live_range` (its array ``f32[8]``, "" for a tuple's or where the assignment does not
    write it); [] where that says nothing of them."""
    ranges_at = live_range.find("BufferLiveRange:")
    if ranges_at < 0:
        return []
    ranges = {name: (int(start), int(end)) for name, start, end in _LIVE_RANGE.findall(live_range[ranges_at:])}
    values = []
    for color, block in _TEMP_ALLOCATION.findall(buffer_assignment):
        for name, size, offset, array in _VALUE.findall(block):
            span = ranges.get(name if "{" in name else name + "{}")
            if span is not None and int(size) and counted(int(color or 0), name):
                values.append((span, int(color or 0), int(offset), int(size), name, array.strip("(")))
    return values


def _peak_of(values: list[tuple]) -> tuple[int, int] | None:
    """The most bytes `values` (`_temporary_values`) keep in use at once (each color's buffer its own bytes), and
    the first point of the instruction sequence where they do; None without values."""
    peak = None
    for time, held in _held_over_time(values):
        if peak is None or held > peak[0]:
            peak = (held, time)
    return peak


def _held_over_time(values: list[tuple]) -> Iterator[tuple[int, int]]:
    """Each point of the instruction sequence where one of `values` (`_temporary_values`) starts, in order, and the
    bytes they keep in use then (each color's buffer its own bytes, each byte once)."""
    starts: dict[int, list[tuple[int, int]]] = {}
    ends: dict[int, list[tuple[int, int]]] = {}
    for span, color, offset, size, *_ in values:
        at = color << 48  # each memory space's bytes apart from the others'
        piece = (at + offset, at + offset + size)
        starts.setdefault(span[0], []).append(piece)
        ends.setdefault(span[1] + 1, []).append(piece)
    live: Counter = Counter()  # the pieces live now, each as often as values hold it (none that none holds)
    for time in sorted(starts.keys() | ends.keys()):
        for piece in ends.get(time, ()):
            live[piece] -= 1
            if not live[piece]:
                del live[piece]
        live.update(starts.get(time, ()))
        if time in starts:
            yield time, _union_bytes(p for p, n in live.items() if n > 0)


_MEMORY_SPACE = re.compile(r"^Memory Space: (\S+) \(color=(\d+)\)\nTotal bytes: (\d+)", re.M)

#: the on-chip memories XLA:TPU's memory-space assignment prefetches weights into and keeps small temporaries in, by
#: their buffer-assignment color and the name XLA's memory-usage report gives them, each with the name the check
#: gives it: color 1 ``vmem``, the TensorCore's VMEM (v5e, v5p, v6e); color 3 ``hbm``, v4's CMEM. v4's buffer
#: assignment has no color 1 (its kernels use VMEM only as scoped scratch) and fills color 3 instead, which is not
#: v4's HBM (color 0, ``default``, holds the arguments and outputs): only temporaries sit there, the weight slices
#: it prefetches and computed values (score buffers, activations, gathers), and 2d-v4-8.yaml's program at 256²
#: fills it to 127.95 MiB, just under v4's 128 MiB of CMEM (Jouppi et al., "TPU v4", ISCA 2023). Keyed by both, so
#: that another chip's color 3 under another name is not taken for one.
ON_CHIP_SPACES = {(1, "vmem"): "vmem", (3, "hbm"): "cmem"}


def memory_space_bytes(memory_usage_report: str) -> dict[str, int]:
    """Bytes the program's buffer assignment placed in each memory space, from XLA's
    ``*-memory-usage-report.txt``, by the space's name: on a TPU ``default`` (HBM: arguments, outputs,
    temporaries), ``vmem`` (the TensorCore's on-chip memory: the weights XLA:TPU's memory-space assignment
    prefetches there, most of it, and the temporaries it keeps there), on v4 ``cmem`` instead (``ON_CHIP_SPACES``:
    the report's ``hbm`` at color 3), ``smem``, ``host``."""
    return {ON_CHIP_SPACES.get((int(color), name), name): int(total)
            for name, color, total in _MEMORY_SPACE.findall(memory_usage_report)}


def on_chip_colors(memory_usage_report: str) -> frozenset[int]:
    """The colors of the on-chip memories (``ON_CHIP_SPACES``) the program's buffer assignment used."""
    return frozenset(int(color) for name, color, _ in _MEMORY_SPACE.findall(memory_usage_report)
                     if (int(color), name) in ON_CHIP_SPACES)


_OPCODE = re.compile(r"\s([a-z][a-z0-9\-]*)\(")
#: ops that only move a value: what XLA:TPU's memory-space assignment adds to prefetch on chip (async copies,
#: async slices it joins again with a ConcatBitcast custom-call) and the views between them
_MOVES = frozenset({"bitcast", "copy", "copy-start", "copy-done", "get-tuple-element", "async-start", "async-done",
                    "slice", "dynamic-slice", "tuple", "concat-bitcast"})


def argument_copies(program: str) -> frozenset[str]:
    """The instructions of an optimized program whose values are only its arguments (or constants) moved about:
    each of `_MOVES` whose operands are all such (a dynamic-slice's first: its indices are computed), from the
    entry's parameters. A fusion or an async-start whose computation only moves values (and reads constants) moves
    the operands its root is read from (a dynamic-slice's sliced one); an async computation's instructions are as
    its async-start is. In a while loop's body (torch_xla's scan) an element of the loop's state that the body passes
    on unchanged, moved about at most, counts as one too: the stacked block weights a scanned list carries, which the
    loop's state holds (meshlab prices them as the scan's stacked copy), so their slices and copies on chip are not
    more temporaries; the state itself, wherever it sits, is counted.

    `program` is the text XLA dumps beside the buffer assignment (`*.after_optimizations.txt`), which prints each
    async slice as an async-start calling its computation. The sugared text JAX's `as_text` gives torchax
    (`slice-start` with the slice inline) has no such computations, so the values the buffer assignment names
    after their slices are not found in it: on 2d at 256² through torchax the working set reads 6.5 MB with the
    dump's program and 43.7 MB with the sugared one (every prefetched weight slice taken for a temporary)."""
    entry = re.search(r"^ENTRY\s+%?([\w.\-]+)", program, re.M)
    ops = _ops(_computations(program))
    roots = {op.computation: name for name, op in ops.items() if op.root}  # computation: its root instruction
    # an async computation: the async-start that runs it
    run_by = {op.called: name for name, op in ops.items() if op.called and op.kind == "async-start"}
    loop_bodies = {op.called for op in ops.values() if op.called and op.kind == "while"}

    def moved(name: str) -> list[str] | None:
        """The operands whose values `name`'s value is, where it only moves them; None where it computes."""
        op = ops.get(name, _NONE)
        if op.computation in run_by:
            return [run_by[op.computation]]
        if op.kind in ("async-start", "fusion"):
            read = _parameters_read(ops, roots.get(op.called, ""))
            return None if read is None else [op.operands[k] for k in read if k < len(op.operands)]
        if op.kind == "dynamic-slice":
            return op.operands[:1]
        return op.operands if op.kind in _MOVES and not _loop_state(ops, loop_bodies, op) else None

    origins: dict[str, frozenset[str]] = {}

    def origin(name: str, depth: int = 0) -> frozenset[str]:
        """The values `name`'s is moved from: itself where it computes (or is a loop's state element)."""
        if name not in origins:
            origins[name] = frozenset({name})  # a cycle stops here
            sources = moved(name) if depth < 500 else None
            if sources:
                origins[name] = frozenset().union(*(origin(o, depth + 1) for o in sources))
        return origins[name]

    def copies(name: str) -> bool:
        """`name` is an argument, a constant, or a loop's state element its body passes on unchanged."""
        op = ops.get(name, _NONE)
        if _loop_state(ops, loop_bodies, op):
            root = ops.get(roots.get(op.computation, ""), _NONE)
            passed = root.operands[op.index] if root.kind == "tuple" and op.index < len(root.operands) else ""
            return bool(passed) and all(ops.get(o, _NONE).index == op.index and ops[o].operands == op.operands
                                        and _loop_state(ops, loop_bodies, ops[o]) for o in origin(passed))
        return op.kind in ("parameter", "constant") and entry is not None and op.computation == entry.group(1)

    return frozenset(name for name in ops if all(copies(o) for o in origin(name)))


@dataclass(frozen=True)
class _Op:
    """One instruction of a module, as `argument_copies` and `_largest_operand_op_name` follow it."""

    computation: str
    kind: str  # its opcode; "concat-bitcast" for XLA:TPU's ConcatBitcast custom-call
    operands: list[str]
    index: int | None = None  # a get-tuple-element's element, a parameter's number
    called: str = ""  # the computation a fusion, async-start or while (its body) runs
    op_name: str | None = None
    root: bool = False  # its computation's ROOT


_NONE = _Op("", "", [])


def _ops(computations: list[tuple[str, list[str]]]) -> dict[str, _Op]:
    """Each instruction of a module (`_computations`), by its name."""
    ops = {}
    for computation, lines in computations:
        for line in lines:
            instruction = _INSTRUCTION.match(line)
            opcode = _OPCODE.search(" " + instruction.group(2)) if instruction else None
            if opcode is None:
                continue
            kind = opcode.group(1)
            if kind == "custom-call" and 'custom_call_target="ConcatBitcast"' in line:
                kind = "concat-bitcast"
            index = re.search(r"\bindex=(\d+)" if kind == "get-tuple-element" else r"\sparameter\((\d+)\)", line)
            called = re.search(r"\b(calls|body)=%?([\w.\-]+)", line) if kind in ("async-start", "fusion", "while") \
                else None
            operands = _operand_names((" " + instruction.group(2))[opcode.end():])
            ops[instruction.group(1)] = _Op(computation, kind, operands, int(index.group(1)) if index else None,
                                            called.group(2) if called else "", _op_name(line),
                                            line.lstrip().startswith("ROOT "))
    return ops


def _parameters_read(ops: dict[str, _Op], root: str) -> list[int] | None:
    """The numbers of the parameters a computation's `root` is only moved from (through `_MOVES`, a dynamic-slice's
    sliced operand; constants read are nothing moved); None where the computation computes it."""
    numbers, todo, seen = set(), [root], set()
    while todo:
        name = todo.pop()
        op = ops.get(name, _NONE)
        if name in seen or op.kind == "constant":
            continue
        seen.add(name)
        if op.kind == "parameter" and op.index is not None:
            numbers.add(op.index)
        elif op.kind in _MOVES:
            todo.extend(op.operands[:1] if op.kind == "dynamic-slice" else op.operands)
        else:
            return None
    return sorted(numbers)


def _loop_state(ops: dict[str, _Op], loop_bodies: set[str], op: _Op) -> bool:
    """`op` takes an element of a while body's state: a get-tuple-element of the body's parameter."""
    return (op.kind == "get-tuple-element" and op.computation in loop_bodies and op.index is not None
            and bool(op.operands) and ops.get(op.operands[0], _NONE).kind == "parameter")


def _union_bytes(pieces) -> int:
    """Bytes covered by byte ranges ``[start, stop)`` that may overlap."""
    covered, reach = 0, -1
    for start, stop in sorted(pieces):
        if stop > reach:
            covered += stop - max(start, reach)
            reach = stop
    return covered
