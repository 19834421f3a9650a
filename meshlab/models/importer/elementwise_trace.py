"""The HBM traffic of a block's elementwise work when each gap between matmuls runs as one fused pass (needs torch).

One forward runs under a ``TorchDispatchMode`` that records every aten op with the tensors it reads and writes,
on the ``meta`` device (shapes only). Matmuls (``mm``, ``addmm``, ``bmm``, ``baddbmm``, convolutions) and each
whole ``F.scaled_dot_product_attention`` are the heavy ops the cost model prices already; every other op is
elementwise work (norms, modulation, RoPE, activations, residual adds, dtype casts).

The ops between two consecutive heavy ops, in the order the forward runs them, make one *gap*. The model: a
compiler (XLA, torch.compile) fuses each gap into one pass, so a gap's traffic is the tensors it reads that were
made outside it (a matmul's output, the residual stream, RoPE tables) plus the tensors it makes that something
outside it reads, each counted once per gap at its own size. Intermediates inside a gap cost nothing; views cost
nothing; weights (and tensors made only from weights) are the matmuls' business and are not counted. Eager
execution, which writes every op's output, moves more; a compiler that also fuses a gap into the neighbouring
matmul moves less.

Each counted tensor is charged to the stream whose token dim it carries (``stream_of``), per token, and to the
block whose forward made the op; tensors without a token dim (per-sample modulation vectors) are left out. It
also says which matmul it meets: the output of a Linear (or of attention), the input of Linears only (or of
attention), or neither (the residual stream): a plan that splits that Linear's features splits that tensor.

The torch internals this leans on are all here: ``TorchDispatchMode`` (``torch.utils._python_dispatch``, the
documented home of ``__torch_dispatch__`` modes) and an ``OpOverload``'s ``_schema`` (which outputs alias an
input) and ``_overloadpacket`` (the op's name).
"""

from __future__ import annotations

import itertools
from collections import defaultdict
from typing import Any, Callable

#: aten ops the cost model prices as matmuls (the Linears, a convolutional patch embedding)
HEAVY = frozenset({"mm", "addmm", "bmm", "baddbmm", "convolution", "_convolution"})


def trace_elementwise_both(model: Any, inputs: dict, blocks: dict[str, int],
                           stream_of: Callable[[tuple[int, ...]], str]) -> tuple[dict, dict, dict]:
    """From one forward of `model(**inputs)` (a model on the ``meta`` device at the dtype that runs), for block
    `blocks[list]` of each block list:

    - the fused bytes per block moved by the elementwise gaps, by (block list, stream, side, Linear): how each
      counted tensor meets the matmul beside it (see `_side`), so a plan that splits that Linear's features splits
      the tensor too;
    - the eager bytes (`_Recorder.eager_bytes_per_block`);
    - the ops each traced block dispatches (`_Recorder.dispatches`)."""
    recorder = _record(model, inputs, blocks)
    return recorder.bytes_per_block(stream_of), recorder.eager_bytes_per_block(stream_of), recorder.dispatches()


def _record(model: Any, inputs: dict, blocks: dict[str, int]) -> "_Recorder":
    current: list[str | None] = [None]
    hooks = []
    for name, index in blocks.items():
        block = getattr(model, name)[index]
        hooks.append(block.register_forward_pre_hook(lambda module, args, name=name: current.__setitem__(0, name)))
        hooks.append(block.register_forward_hook(lambda module, args, output: current.__setitem__(0, None)))
    try:
        return record_call(model, lambda: model(**inputs), current)
    finally:
        for hook in hooks:
            hook.remove()


def record_call(model: Any, call: Callable[[], Any], current: list | None = None) -> "_Recorder":
    """Every aten op `call()` runs, with the tensors it reads and writes; `model`'s parameters and buffers are
    weights; `current[0]` names the block running (None outside the traced blocks)."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    current = current or [None]

    def tensors(tree) -> list:
        return [t for t in tree_flatten(tree)[0] if isinstance(t, torch.Tensor)]

    recorder = _Recorder({})
    for name, t in (*model.named_parameters(), *model.named_buffers()):
        recorder.weights[recorder.key(t)] = name.rpartition(".")[0]

    class Dispatch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if not recorder.inside_attention:
                schema = func._schema
                view = any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
                recorder.op(func._overloadpacket.__name__, view, tensors((args, kwargs)), tensors(out), current[0])
            return out

    class Attention(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            if func is not torch.nn.functional.scaled_dot_product_attention or recorder.inside_attention:
                return func(*args, **(kwargs or {}))
            recorder.inside_attention = True
            try:
                out = func(*args, **(kwargs or {}))
            finally:
                recorder.inside_attention = False
            recorder.op("scaled_dot_product_attention", False, tensors((args, kwargs)), [out], current[0])
            return out

    with torch.no_grad(), Dispatch(), Attention():
        call()
    return recorder


_SERIALS = itertools.count()


class _Shape:
    """What the counts read of a tensor (its shape, size and dtype's width), kept in its place: the tensors
    themselves are freed as the call frees them, so a traced decode holds no more than the decode does."""

    __slots__ = ("shape", "_numel", "_floating", "_itemsize")

    def __init__(self, t):
        self.shape, self._numel = tuple(t.shape), t.numel()
        self._floating, self._itemsize = t.is_floating_point(), t.element_size()

    def numel(self) -> int:
        return self._numel

    def is_floating_point(self) -> bool:
        return self._floating

    def element_size(self) -> int:
        return self._itemsize

    def dim(self) -> int:
        return len(self.shape)


class _Recorder:
    """Ops in program order, each with the tensor versions it reads and writes (views resolved to their base).

    A tensor is known by a serial number it carries as an attribute (torch keeps a tensor's Python object, and so
    the attribute, for the tensor's life), not by ``id``, which a freed tensor's successor may reuse."""

    def __init__(self, weights: dict[int, str]):
        self.weights = weights  # serial of a parameter or buffer (or a tensor made from one alone) -> its module path
        self.inside_attention = False
        self.base: dict[int, int] = {}  # a view's serial -> the serial of the tensor it views
        self.version: dict[int, int] = defaultdict(int)  # base serial -> writes so far
        self.shapes: dict[int, _Shape] = {}  # serial -> what the counts read of that tensor
        #: (heavy op: "linear:<module>", "attention" or "" for elementwise, block, reads, writes)
        self.ops: list[tuple[str, str | None, list, list]] = []

    def key(self, t) -> int:
        serial = t.__dict__.get("_meshlab_serial")
        if serial is None:  # numbered once in the process: a tensor seen by an earlier recording keeps its number
            serial = t._meshlab_serial = next(_SERIALS)
        return serial

    def shape(self, t) -> _Shape:
        return self.shapes.setdefault(self.key(t), _Shape(t))

    def root(self, t) -> int:
        i = self.key(t)
        while i in self.base:
            i = self.base[i]
        return i

    def op(self, name: str, view: bool, reads: list, writes: list, block: str | None) -> None:
        if view:
            for w in writes:
                if reads and self.key(w) != self.key(reads[0]):
                    self.base[self.key(w)] = self.root(reads[0])
            return
        roots = [self.root(t) for t in reads]
        if roots and all(r in self.weights for r in roots):
            for w in writes:  # a cast or transpose of a weight is the matmul's business
                self.weights[self.key(w)] = self.weights[roots[0]]
            return
        if name == "scaled_dot_product_attention":
            heavy = "attention"
        elif name in HEAVY:
            heavy = "linear:" + next((self.weights[r] for r in roots if r in self.weights), "")
        else:
            heavy = ""
        read = [(r, self.version[r], self.shape(t)) for t, r in zip(reads, roots)
                if r not in self.weights and t.dim() > 0]
        written = []
        for t in writes:
            r = self.root(t)
            self.version[r] += 1
            if t.dim() > 0:
                written.append((r, self.version[r], self.shape(t)))
        self.ops.append((heavy, block, read, written))

    def dispatches(self) -> dict[str | None, int]:
        """Ops each block ran that eager PyTorch dispatches from the host (views and casts of weights aside; an
        attention counts once; not every op launches a kernel, and some launch several): by block list, and None
        for the rest of the forward. Against CUDA's own count on an H200 (benchmarks/gpu_eager_blocks.py):
        Qwen-Image's block traces 96 here and launched 101 kernels (96 without a text mask), Flux.1-dev's double
        and single blocks trace 149 and launched 113."""
        counts: dict[str | None, int] = defaultdict(int)
        for _, block, _, _ in self.ops:
            counts[block] += 1
        return dict(counts)

    def moved_bytes(self, itemsize: int) -> tuple[float, float]:
        """HBM bytes of every elementwise op of the call, blocks or not, with floating tensors at `itemsize`
        bytes an element: (eager: each op reads and writes its tensors; fused: each gap moves the tensors that
        cross its edges once, as `bytes_per_block` counts them)."""
        def size(t) -> float:
            return t.numel() * (itemsize if t.is_floating_point() else t.element_size())

        eager = 0.0
        for heavy, _, read, written in self.ops:
            if not heavy:
                once: dict[tuple[int, int], object] = {}  # a version an op meets twice moves once (the first view)
                for r, v, t in [*read, *written]:
                    once.setdefault((r, v), t)
                eager += sum(size(t) for t in once.values())
        return eager, sum(size(t) for _, _, t in self._fused_edges(whole_call=True))

    def _index(self) -> tuple[list, dict, dict]:
        """Each op's gap (None for a heavy op), and by tensor version the op that made it and the ops that read
        it."""
        gap, gaps = 0, []
        for heavy, *_ in self.ops:
            gap += bool(heavy)
            gaps.append(None if heavy else gap)
        made_by: dict[tuple[int, int], int] = {}
        read_by: dict[tuple[int, int], list] = defaultdict(list)
        for i, (_, _, read, written) in enumerate(self.ops):
            for r, v, _ in read:
                read_by[(r, v)].append(i)
            for r, v, _ in written:
                made_by[(r, v)] = i
        return gaps, made_by, read_by

    def bytes_per_block(self, stream_of: Callable[[tuple[int, ...]], str]) -> dict[tuple, float]:
        totals: dict[tuple, float] = defaultdict(float)
        for block, side, t in self._fused_edges():
            _charge(totals, block, side, t, stream_of)
        return dict(totals)

    def _fused_edges(self, whole_call: bool = False) -> list[tuple]:
        """(block, side, tensor) of each tensor a fused gap reads from or writes to outside it, once per gap: in
        the traced blocks, or anywhere in the call with `whole_call`."""
        gaps, made_by, read_by = self._index()
        counted: dict[tuple, tuple[str, str, object]] = {}
        for i, (heavy, block, read, written) in enumerate(self.ops):
            g = gaps[i]
            if heavy or (block is None and not whole_call):
                continue
            for r, v, t in read:
                maker = made_by.get((r, v))
                if maker is None or gaps[maker] != g:  # made by a matmul, another gap, or outside the forward
                    counted.setdefault((g, "read", id(t)), (block, _side("out", self.ops[maker][0]
                                                                         if maker is not None else ""), t))
            for r, v, t in written:
                outside = [c for c in read_by.get((r, v), []) if gaps[c] != g]
                if outside or not read_by.get((r, v)):  # read outside this gap, or the forward's output
                    heavy_readers = [self.ops[c][0] for c in outside if self.ops[c][0]]
                    beside = heavy_readers[0] if heavy_readers and len(heavy_readers) == len(outside) else ""
                    counted.setdefault((g, "write", r, v), (block, _side("in", beside), t))
        return list(counted.values())

    def eager_bytes_per_block(self, stream_of: Callable[[tuple[int, ...]], str]) -> dict[tuple, float]:
        """Bytes per block when every elementwise op runs as its own kernel (eager PyTorch): each op reads each
        tensor it reads and writes each it writes, intermediates included. A tensor's side, as the fused count
        has it at a gap's edges: a matmul's output is "out" of its Linear (or attention's), a tensor from another
        gap has none (the residual stream); an elementwise op's output takes the side of the largest tensor it
        reads (its first among equals: the residual stream in ``x + gate * y``), except an output only Linears
        read, which is that Linear's input ("in")."""
        gaps, made_by, read_by = self._index()
        side_of: dict[tuple[int, int], tuple[str, str]] = {}
        totals: dict[tuple, float] = defaultdict(float)
        for i, (heavy, block, read, written) in enumerate(self.ops):
            if heavy:
                for r, v, _ in written:
                    side_of[(r, v)] = _side("out", heavy)
                continue

            def side(r: int, v: int) -> tuple[str, str]:
                maker = made_by.get((r, v))
                if maker is None or not (self.ops[maker][0] or gaps[maker] == gaps[i]):
                    return ("", "")  # from outside the forward, or from another gap's elementwise op
                return side_of[(r, v)]

            sides = {(r, v): side(r, v) for r, v, _ in read}
            inherited = max(((t.numel(), -k, sides[(r, v)]) for k, (r, v, t) in enumerate(read)),
                            default=(0, 0, ("", "")))[2]
            for r, v, t in written:
                readers = [self.ops[c][0] for c in read_by.get((r, v), [])]
                only_linears = readers and all(h.startswith("linear:") for h in readers)
                side_of[(r, v)] = sides[(r, v)] = _side("in", readers[0]) if only_linears else inherited
            if block is None:
                continue
            once: dict[tuple[int, int], object] = {}  # a tensor version an op meets twice moves once (the first view)
            for r, v, t in [*read, *written]:
                once.setdefault((r, v), t)
            for version, t in once.items():
                _charge(totals, block, sides[version], t, stream_of)
        return dict(totals)


def _charge(totals: dict, block: str, side: tuple[str, str], t, stream_of: Callable[[tuple[int, ...]], str]) -> None:
    """Add `t`'s bytes to its block, stream and side; a tensor without a token dim is left out."""
    stream = stream_of(tuple(t.shape))
    if stream in ("image", "text", "joint", "reference"):
        totals[(block, stream, *side)] += t.numel() * t.element_size()


def _side(direction: str, heavy: str) -> tuple[str, str]:
    """How a counted tensor meets the heavy op beside it: ("out", Linear) made by a Linear, ("in", Linear) read
    only by Linears (the first), ("attention", "") made or read by attention, ("", "") neither (the residual
    stream, RoPE tables, a tensor several kinds of op read)."""
    if heavy == "attention":
        return ("attention", "")
    if heavy.startswith("linear:") and heavy != "linear:":
        return (direction, heavy.removeprefix("linear:"))
    return ("", "")
