"""`meshlab check`'s verdict: the plan held against what XLA read back, partitioned and allocated. Pure, no torch.

Per-block figures come from the collectives meshlab tagged with the module that caused them; the full depth is
the ops outside the blocks, plus each list's first checked block for every block but its last, plus its last
block (the last block of a list can differ: Qwen-Image's last block computes a text stream nothing reads, and
XLA drops it).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from meshlab.check.hlo import HloCollective, XlaMemory, mesh_axes
from meshlab.check.readback import AppliedParameter, weights_per_device
from meshlab.check.setup import CheckSetup
from meshlab.models.card import block_position

#: Largest |sharded - reference| accepted, as a fraction of the reference's largest |value| (at least 1):
#: the sharded forward runs in the plan's dtype, the reference in float32.
TOLERANCE = {"bfloat16": 5e-2, "float16": 1e-2, "float32": 1e-4}

CPU_CAVEATS = {
    "temporaries": "CPU backend: bf16 dot operands (weight shards included) are converted to f32, so its "
                   "temporaries run well above a TPU's",
    "collective_bytes": "CPU backend: collectives carry f32 where a TPU moves bf16 (up to 2x the bytes)",
    "reduce_scatter": "CPU backend: never emits reduce-scatter; it all-reduces, then slices",
}
OUTSIDE = "outside blocks"
#: Collective kinds whose count per middle block must be within COLLECTIVE_TOLERANCE of XLA's for `agrees`;
#: collective-permutes of split modulation chunks are a listed difference (meshlab.cost.collectives).
VERDICT_KINDS = ("all-reduce", "all-gather", "all-to-all")
COLLECTIVE_TOLERANCE = 0.10


@dataclass(frozen=True)
class MeasuredCollective:
    """One collective of the checked forward, its groups mapped back to mesh axes."""

    hlo: HloCollective
    mesh_axes: tuple[str, ...]
    #: the block it stands for where its op name has no module scope to place it (a scanned loop body's)
    block: tuple[str, int] | None = None

    @property
    def group(self) -> tuple[str, int] | None:
        """(block list, index) of the block the op came from, None outside the blocks or when untagged."""
        return block_position(self.hlo.layer) if self.hlo.layer else self.block

    def to_json(self) -> dict:
        shapes = self.hlo.result
        return {
            "kind": self.hlo.kind,
            "shape": list(shapes[0].dims) if len(shapes) == 1 else [list(s.dims) for s in shapes],
            "dtype": shapes[0].dtype if shapes else None,
            "bytes_per_device": self.hlo.bytes_per_device,
            "mesh_axes": list(self.mesh_axes),
            "layer": self.hlo.layer,
            "block": f"{self.group[0]}.{self.group[1]}" if self.group else None,
            "async": self.hlo.asynchronous,
        }


class OutputVerdict:
    """What every check report says the same way: the parameters off the plan, and the forward's tolerance."""

    @property
    def mismatches(self) -> tuple:
        return tuple(p for p in self.parameters if not p.agrees)

    @property
    def tolerance(self) -> float:
        return TOLERANCE[self.setup.strategy.workload.dtype] * max(1.0, self.reference_max_abs)

    @property
    def output_agrees(self) -> bool:
        return self.max_abs_error <= self.tolerance


@dataclass(frozen=True)
class CheckReport(OutputVerdict):
    setup: CheckSetup
    parameters: tuple[AppliedParameter, ...]
    collectives: tuple[MeasuredCollective, ...]
    xla_memory: XlaMemory | None
    max_abs_error: float
    reference_max_abs: float
    device_type: str
    device_count: int
    forwards: tuple[dict, ...]  # per forward: compiles, seconds
    timings: dict
    hlo_module: str | None  # the dump file the collectives and memory come from
    predicted_per_block: dict[str, Counter] = field(default_factory=dict)  # meshlab's cost model, per block
    predicted_full_depth: Counter = field(default_factory=Counter)  # meshlab's cost model, one call, full depth
    scanned: tuple[str, ...] = ()  # block lists that ran through torch_xla's scan (one loop body each)
    #: FLOPs of one forward on one device: meshlab's per-chip count, and the dots of XLA's partitioned program
    predicted_flops: float = 0.0
    xla_dot_flops: float | None = None

    def collective_differences(self) -> tuple[str, ...]:
        """Where the cost model's collectives of a middle block (not a list's last, where XLA drops what nothing
        reads) differ from XLA's by more than 10% in count, for the kinds held to it (see VERDICT_KINDS)."""
        measured, found = self.per_block(), []
        for block, predicted in self.predicted_per_block.items():
            if is_last_block(block, self.setup) or block.split(".")[0] in self.scanned:
                continue
            xla = measured.get(block, Counter())
            for kind in VERDICT_KINDS:
                p, x = predicted.get(kind, 0), xla.get(kind, 0)
                if abs(p - x) > COLLECTIVE_TOLERANCE * x:
                    found.append(f"{block}: {kind} predicted {p}, XLA {x}")
        return tuple(found)

    @property
    def middle_blocks_checked(self) -> bool:
        """Whether a middle block's collectives were held to the prediction (a scanned list's loop body runs every
        block, so its collectives are not attributed to one)."""
        return any(not is_last_block(b, self.setup) and b.split(".")[0] not in self.scanned
                   for b in self.predicted_per_block)

    def full_depth_compile_seconds(self) -> float | None:
        """This host's compile of the checked forward scaled to full depth, an upper bound: an unrolled list
        compiles one copy per block, and the whole measured compile (the part outside the blocks too) is scaled by
        blocks; a scanned list compiles one loop body whatever its depth (benchmarks/compile_time.py measured about
        1 s per full-width Qwen-Image block unrolled on 8 virtual CPU devices, and no growth scanned). A TPU
        compiles differently."""
        if self.compile_seconds is None:
            return None
        checked = sum(n for name, n in self.setup.checked_blocks.items() if name not in self.scanned)
        full = sum(self.setup.full_blocks[name] for name in self.setup.checked_blocks if name not in self.scanned)
        return self.compile_seconds * (full / checked if checked else 1.0)

    @property
    def agrees(self) -> bool:
        return not self.mismatches and self.output_agrees and not self.collective_differences()

    @property
    def checked_forward(self) -> dict:
        """The forward whose program is read: the last that compiled one."""
        compiled = [f for f in self.forwards if f.get("compiles")]
        return compiled[-1] if compiled else (self.forwards[-1] if self.forwards else {})

    @property
    def compile_seconds(self) -> float | None:
        """XLA's compile time of the checked forward's graph (torch_xla's CompileTime metric)."""
        return self.checked_forward.get("compile_seconds")

    @property
    def on_cpu(self) -> bool:
        return self.device_type.upper() == "CPU"

    def weights(self) -> tuple[int, int]:
        """(predicted, XLA) bytes of weights on one device, checked depth."""
        return weights_per_device(self.parameters)

    def full_depth_weights(self) -> tuple[int, int]:
        """(meshlab's plan of the full model, XLA's checked figures extrapolated) per device."""
        predicted = sum(p.bytes_per_device(self.setup.planned.plan.mesh) for p in self.setup.planned.plan.parameters)
        by_group: dict = {}
        for p in self.parameters:
            by_group.setdefault(block_position(p.name) if _in_block(p.name, self.setup) else None, []).append(p)
        xla = sum(p.xla_bytes for p in by_group.get(None, []))
        xla += self._extrapolate({g: sum(p.xla_bytes for p in ps) for g, ps in by_group.items() if g})
        return predicted, int(xla)

    def per_block(self, measure=lambda c: 1) -> dict[str, Counter]:
        """Collectives by kind in each checked block, keyed ``transformer_blocks.0``; ``outside blocks`` too.

        `measure` says what to add up per collective: 1 (a count, the default) or its bytes per device."""
        return per_block_counts(self.collectives, self.setup, measure)

    def full_depth_collectives(self, measure=lambda c: 1) -> Counter:
        per_block = self.per_block(measure)
        total = Counter(per_block[OUTSIDE])
        for kind in {k for c in per_block.values() for k in c}:
            total[kind] += int(self._extrapolate({
                (name, index): per_block.get(f"{name}.{index}", Counter())[kind]
                for name, checked in self.setup.checked_blocks.items() for index in range(checked)}))
        return +total

    def _extrapolate(self, per_block: dict[tuple[str, int], float]) -> float:
        """Figures of the checked blocks scaled to the full depth (see the module's docstring)."""
        total = 0.0
        for name, checked in self.setup.checked_blocks.items():
            full = self.setup.full_blocks[name]
            first, last = per_block.get((name, 0), 0), per_block.get((name, checked - 1), 0)
            middle = sum(per_block.get((name, i), 0) for i in range(checked - 1))
            total += middle + first * (full - checked) + last if checked > 1 else last * full
        return total

    def caveats(self) -> dict[str, str]:
        return dict(CPU_CAVEATS) if self.on_cpu else {}


def per_block_counts(collectives, setup: CheckSetup, measure=lambda c: 1) -> dict[str, Counter]:
    """Collectives by kind in each checked block (``transformer_blocks.0``) and ``outside blocks``, each adding
    `measure` (1: a count; or its bytes per device)."""
    counts: dict[str, Counter] = {OUTSIDE: Counter()}
    for c in collectives:
        key = f"{c.group[0]}.{c.group[1]}" if c.group and c.group[0] in setup.checked_blocks else OUTSIDE
        counts.setdefault(key, Counter())[c.hlo.kind] += measure(c)
    return counts


def _in_block(name: str, setup: CheckSetup) -> bool:
    position = block_position(name)
    return position is not None and position[0] in setup.checked_blocks


def collectives_of(hlo: tuple[HloCollective, ...], setup: CheckSetup,
                   device_ids: tuple[int, ...]) -> tuple[MeasuredCollective, ...]:
    axes = setup.plan.mesh.axes
    return tuple(MeasuredCollective(c, mesh_axes(c.groups, axes, device_ids)) for c in hlo)


def checked_prediction(setup: CheckSetup):
    """meshlab's prediction for the checked (cut) model and forward: what the per-block collectives and the FLOPs
    of the report come from, computed once."""
    from meshlab.cost.predict import predict

    return predict(setup.plan, setup.strategy, setup.planned.hardware)


def predicted_flops(setup: CheckSetup, prediction=None) -> float:
    """meshlab's FLOPs of the checked forward on one device (Linears and attention, as XLA's dots count), less
    the dead tail of the model's last block: where the last block list ends on a block whose attention joins
    text and image (Qwen-Image), nothing reads its text stream after the attention, and XLA drops the text
    Linears that would compute it (see meshlab/data/known_differences.yaml: the cost model counts every block alike).
    Convolutions XLA keeps as convolutions (SANA's depthwise 3x3) are left out, as the dots leave them out; its
    pointwise ones are Linears here and dots in the partitioned program (convolutions through SPMD partitioning, so
    no collective matmul, then rewritten as dots: SANA's ratio is 1.0)."""
    from meshlab.cost.graph import graph_of

    work = (prediction or checked_prediction(setup)).work
    dead = _dead_text_tail(graph_of(setup.plan))
    # a kept block stands for `count` identical ones (Graph.repeats): the tail is dead in the last of them only
    return sum(w.flops * (w.count - (w.name in dead)) for w in work if w.kind != "conv")


def dead_tail_weight_bytes(setup: CheckSetup, tiles: bool = False) -> int:
    """Bytes per device of the weights of the last block's dead text tail (see `predicted_flops`): a compiled
    program takes no argument nothing reads, though a run holds them on the device. `tiles`: as a TPU lays them
    out (meshlab.core.tpu_tiles)."""
    mesh = setup.plan.mesh
    return sum(p.tiled_bytes_per_device(mesh) if tiles else p.bytes_per_device(mesh)
               for p in dead_tail_parameters(setup))


def dead_tail_parameters(setup: CheckSetup) -> list:
    """The weights of the last block's dead text tail (see `dead_tail_weight_bytes`)."""
    from meshlab.cost.graph import graph_of

    dead = _dead_text_tail(graph_of(setup.plan))
    return [p for p in setup.plan.parameters if p.parameter.module in dead]


def _dead_text_tail(graph) -> set[str]:
    """Text-stream Linears of the last block that no later block reads (not its q/k/v)."""
    blocks = [op.block for op in graph.linears if op.block is not None]
    if not blocks:
        return set()
    last = max(blocks)
    joint = any(set(a.streams) >= {"text", "image"} and any(op.block == last and op.module in a.qkv
                                                            for op in graph.linears) for a in graph.attentions)
    return {op.module for op in graph.linears
            if joint and op.block == last and op.stream == "text" and op.role != "qkv"}


def predicted_per_block(setup: CheckSetup, prediction=None, issued: bool = False) -> dict[str, Counter]:
    """meshlab's cost model, keyed as ``per_block`` keys XLA's counts. It derives one block of each list and
    counts the blocks identical to it, so every checked block of a list gets its list's first block. `issued`:
    as the hardware's compiler issues them (XLA:TPU combines), not as the partitioner makes them."""
    prediction = prediction or checked_prediction(setup)
    first: dict[str, int] = {}
    for p in setup.plan.parameters:
        position = block_position(p.name) if p.parameter.block is not None else None
        if position and position[1] == 0:
            first.setdefault(position[0], p.parameter.block)
    return {f"{name}.{index}": Counter(prediction.block_collectives(first[name], issued))
            for name, checked in setup.checked_blocks.items() if name in first for index in range(checked)}


def predicted_full_depth(setup: CheckSetup) -> Counter:
    """meshlab's cost model: the collectives of one call of the full-depth model, by kind."""
    from meshlab.cost.predict import predict

    prediction = predict(setup.planned.plan, setup.strategy, setup.planned.hardware)
    total = Counter()
    for c in prediction.collectives:
        if not c.per_step:
            total[c.kind] += c.count
    return total


def is_last_block(key: str, setup: CheckSetup) -> bool:
    position = block_position(key + ".")
    return position is not None and position[1] == setup.checked_blocks.get(position[0], 0) - 1


def _bytes(collective: MeasuredCollective) -> int:
    return collective.hlo.bytes_per_device


def check_document(report: CheckReport) -> dict:
    """The JSON of `meshlab check --json`."""
    setup = report.setup
    memory = setup.memory.most_loaded
    predicted_weights, xla_weights = report.weights()
    full_predicted, full_xla = report.full_depth_weights()
    return {
        "strategy": {"name": setup.strategy.name, "file": str(setup.planned.loaded.path)},
        "model": {"name": setup.card.name, "class": setup.card.class_name, "blocks": setup.checked_blocks,
                  "full_blocks": setup.full_blocks},
        "device": {"type": report.device_type, "count": report.device_count},
        "options": setup.options.to_json(),
        "forward": {"batch": setup.geometry.batch, "image_tokens": setup.geometry.image_tokens,
                    "text_tokens": setup.geometry.text_tokens, "dtype": setup.strategy.workload.dtype},
        "agrees": report.agrees,
        "mismatches": [p.name for p in report.mismatches],
        "collective_differences": list(report.collective_differences()),
        "compile_seconds": report.compile_seconds,
        "compile_seconds_full_depth_extrapolated": report.full_depth_compile_seconds(),
        "scanned": list(report.scanned),
        "host_transfers": report.checked_forward.get("host_transfers"),
        "parameters": [p.to_json() for p in report.parameters],
        "weights_per_device": {"predicted": predicted_weights, "xla": xla_weights,
                               "full_depth_predicted": full_predicted, "full_depth_xla": full_xla},
        "collectives": [c.to_json() for c in report.collectives],
        "collectives_per_block": {k: dict(v) for k, v in report.per_block().items()},
        "collectives_full_depth": dict(report.full_depth_collectives()),
        "collective_bytes_per_block": {k: dict(v) for k, v in report.per_block(_bytes).items()},
        "collective_bytes_full_depth": dict(report.full_depth_collectives(_bytes)),
        "predicted_collectives_per_block": {k: dict(v) for k, v in report.predicted_per_block.items()},
        "predicted_collectives_full_depth": dict(report.predicted_full_depth),
        "xla_memory_per_device": report.xla_memory.to_json() if report.xla_memory else None,
        "meshlab_memory_per_device": {"weights": memory.weights, "activations": memory.activations,
                                      "scan_stacked_weights": memory.scan_stacked,
                                      "gathered_weights": memory.gathered_weights, "buffers": memory.buffers,
                                      "total": memory.resident + memory.denoise},
        "max_abs_error": report.max_abs_error,
        "reference_max_abs": report.reference_max_abs,
        "tolerance": report.tolerance,
        "forwards": list(report.forwards),
        "timings_seconds": report.timings,
        "hlo_module": report.hlo_module,
        "flops_per_device": {
            "predicted": report.predicted_flops, "xla_dots": report.xla_dot_flops,
            "ratio": report.predicted_flops / report.xla_dot_flops if report.xla_dot_flops else None,
            "what": "one forward on one device: meshlab's Linears and attention against the dots of XLA's "
                    "partitioned program (2 x result elements x contracted elements, as HloCostAnalysis counts)"},
        "caveats": report.caveats(),
    }
