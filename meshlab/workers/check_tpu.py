"""The torch half of `meshlab check --backend tpu`: ``python -m meshlab.workers.check_tpu REQUEST RESULT``.

Compiles the strategy's transformer for its TPU system with XLA:TPU ahead of time (meshlab.workers.libtpu), at
the depth and size the parent asks (by default the whole model at the workload's real size), through one or both
front ends, and returns what XLA:TPU made of each. No weight is allocated:

- ``torch-xla``: the program a PyTorch/XLA SPMD user runs. The model is built on ``meta``, every parameter
  becomes a torch_xla placeholder (a tensor with no data) annotated, under its module's scope, with its spec on
  a mesh laid out as ``xs.HybridMesh`` lays it over the topology (`hybrid_mesh_ordinals`: torus coordinates
  within a slice, the strategy's ``dcn`` axis across slices), the plan is applied as ``meshlab.apply`` applies it
  (rewrites, activation rules, scan), the forward is traced lazily on virtual CPU devices, and torch_xla's
  pre-partitioning HLO is compiled for the TPU. Nothing is compiled for the CPU.
- ``torchax``: the same module run as a jax function by torchax on a mesh jax lays out
  (``create_device_mesh`` / ``create_hybrid_device_mesh``), every parameter an abstract ``jax.ShapeDtypeStruct``
  with its ``NamedSharding``, activation rules as ``with_sharding_constraint``, each module under a named scope,
  and, where the strategy says ``flash_attention``, each attention as jax's Pallas TPU flash kernel (`flash_sdpa`).

The request: ``{"strategy", "options": CheckOptions, "front_ends": [...], "topology": Topology}``. Each result is
meshlab.runtime.results.FrontEndCompiled (its memory, FLOPs, program and schedule files, the temporaries live at
once, the attention calls by how they ran, XLA:TPU's refusal) or ``{"front_end", "error"}``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import sys
import time
from collections import Counter
from pathlib import Path

from meshlab.runtime.protocol import report_progress as progress
from meshlab.runtime.protocol import serve
from meshlab.runtime.requests import TpuCheckRequest
from meshlab.runtime.tpu_topology import Topology
from meshlab.check.setup import CheckOptions, CheckSetup, check_setup
from meshlab.core.errors import BackendError, LoweringError, MeshlabError, error_message

FRONT_ENDS = ("torch-xla", "torchax")
#: what the host's allocators say when the trace does not fit this host's memory (torch's CPU allocator, C++'s)
HOST_OUT_OF_MEMORY = ("can't allocate memory", "Cannot allocate memory", "std::bad_alloc")


def handle(request: TpuCheckRequest) -> dict:
    from meshlab.workers import libtpu

    topology = Topology(**request.topology)
    if "torch-xla" in request.front_ends:
        from meshlab.parallelisms import xla

        xla.enable_spmd()  # torch_xla before jax: the two XLA builds share the process in this order
    setup = check_setup(request.strategy, CheckOptions(**request.options))
    devices = libtpu.devices(topology)
    out = Path(request.scratch)
    results = []
    for front in request.front_ends:
        try:
            results.append(_compile(front, setup, devices, out))
        except LoweringError as exc:  # a class this front end cannot lower: the parent falls back, or says so
            results.append({"front_end": front, "error": exc.problem, "fix": exc.fix, "cause": "lowering"})
        except MeshlabError as exc:  # the parent falls back to the other front end, or says why neither compiled
            results.append({"front_end": front, "error": exc.one_line(), "problem": exc.problem})
        except Exception as exc:  # noqa: BLE001 - a front end's own failure is its result, not the worker's end
            said = f"{front} failed: {type(exc).__name__}: {error_message(exc)}"
            if isinstance(exc, MemoryError) or any(m in str(exc) for m in HOST_OUT_OF_MEMORY):
                results.append({"front_end": front, "error": said, "cause": "host-memory"})  # the trace is too big
            else:
                results.append({"front_end": front, "error": said})
    return {"results": results, "topology_devices": [{"id": d.id, "coords": list(d.coords)} for d in devices]}


def _compile(front: str, setup: CheckSetup, devices: list, out: Path) -> dict:
    from meshlab.workers import libtpu

    mesh, dcn = setup.plan.mesh, setup.strategy.dcn
    if front == "torch-xla":  # torch_xla's ordinals: the topology's devices in id order, laid out as HybridMesh does
        mesh_ids = hybrid_mesh_ordinals(devices, mesh.shape, mesh.names, dcn)
    else:  # mesh positions name devices by id (the compile maps them)
        mesh_ids = libtpu.jax_device_grid(devices, mesh.shape, mesh.names, dcn)
    progress(f"{front}: tracing {setup.card.class_name} ({_depth(setup)}) with no weights")
    dump = out / "xla-dump"
    before = set(dump.iterdir()) if dump.is_dir() else set()  # another front end's dumps stay beside this one's
    start, attention = time.perf_counter(), Counter()
    if front == "torch-xla":
        hlo_text = torch_xla_program(setup, mesh_ids)
        traced = time.perf_counter() - start
        progress(f"{front}: XLA:TPU compiling for {len(devices)} chips")
        compiled = libtpu.compile_hlo(hlo_text, devices)
    else:
        lowered = torchax_program(setup, devices, mesh_ids, attention)
        traced = time.perf_counter() - start
        progress(f"{front}: XLA:TPU compiling for {len(devices)} chips")
        compiled = libtpu.compile_lowered(lowered)
    hlo_file = out / f"{front}.tpu.hlo.txt"
    program = compiled.hlo
    if not program and not compiled.out_of_memory:
        dumped = _largest(dump, before, ".after_optimizations.txt")
        program = dumped.read_text() if dumped else ""
    if program:
        hlo_file.write_text(program)
    schedules = sorted((p for p in dump.glob("*.schedule.txt") if p not in before), key=lambda p: p.stat().st_mtime)
    schedule = None
    if schedules:  # XLA:TPU's latency-hiding schedule of this compile (the parent asked for it in XLA_FLAGS)
        schedule = out / f"{front}.schedule.txt"
        schedules[-1].replace(schedule)
    return {"front_end": front, "trace_seconds": traced, "compile_seconds": compiled.seconds,
            **_temporaries(dump, before),
            "other_argument_bytes": _other_arguments(setup, front),
            "memory": compiled.memory, "flops": compiled.flops, "bytes_accessed": compiled.bytes_accessed,
            "hlo_file": str(hlo_file) if program else None, "mesh_device_ids": mesh_ids,
            "schedule_file": str(schedule) if schedule else None,
            "out_of_memory": compiled.out_of_memory, "required_bytes": compiled.required_bytes,
            "attention_calls": dict(attention)}


#: how XLA names a module's buffer assignment in its dump folder
BUFFER_ASSIGNMENT = ".after_optimizations-buffer-assignment.txt"


def files_beside(assignment: Path) -> dict[str, Path]:
    """The files XLA dumps beside a module's buffer assignment: its live ranges ("-live-range"), memory-usage
    report ("-memory-usage-report") and optimized program ("")."""
    return {what: assignment.with_name(assignment.name.replace(BUFFER_ASSIGNMENT, f".after_optimizations{what}.txt"))
            for what in ("-live-range", "-memory-usage-report", "")}


def _largest(dump: Path, before: set[Path], suffix: str) -> Path | None:
    """The largest file named ``*<suffix>`` XLA dumped that was not there `before` this compile (the TPU program's;
    the host's small helper programs are dumped beside it). XLA:TPU writes its optimized program there itself,
    which the check reads where reading the executable back fails (meshlab.workers.libtpu._program_text)."""
    written = [p for p in dump.glob(f"*{suffix}") if p not in before] if dump.is_dir() else []
    return max(written, key=lambda p: p.stat().st_size) if written else None


def _temporaries(dump: Path, before: set[Path]) -> dict:
    """What this compile's program holds at once, from the files XLA dumped for it (the largest buffer assignment
    this compile wrote, `_largest`, and the live ranges, memory-usage report and optimized program of the same
    module): its temporaries in HBM (meshlab.check.hlo.temporaries_live_peak), its working set in HBM and on chip
    (VMEM, v4's CMEM: hlo.working_set_live_peak) with what it holds then (hlo.working_set_peak) and the bytes of
    each memory space (hlo.memory_space_bytes); None or empty where XLA wrote none of them."""
    from meshlab.check import hlo

    found = {"temporaries_live_peak": None, "working_set_live_peak": None, "working_set_at_peak": [],
             "memory_spaces": {}}
    assignment = _largest(dump, before, BUFFER_ASSIGNMENT)
    if assignment is None:
        return found
    beside = files_beside(assignment)
    report = beside["-memory-usage-report"].read_text() if beside["-memory-usage-report"].exists() else ""
    found["memory_spaces"] = hlo.memory_space_bytes(report)
    if not beside["-live-range"].exists():
        return found
    text, live_range = assignment.read_text(), beside["-live-range"].read_text()
    found["temporaries_live_peak"] = hlo.temporaries_live_peak(text, live_range)
    on_chip = hlo.on_chip_colors(report)
    if on_chip and beside[""].exists():  # else the check holds HBM's temporaries, and says so
        peak = hlo.working_set_peak(text, live_range, on_chip, beside[""].read_text())
        if peak is not None:
            found["working_set_live_peak"] = peak.bytes
            found["working_set_at_peak"] = [dataclasses.asdict(h) for h in peak.holdings]
    return found


def _depth(setup: CheckSetup) -> str:
    return ", ".join(f"{n} of {setup.full_blocks[k]} {k}" for k, n in setup.checked_blocks.items())


def empty_model(setup: CheckSetup):
    """The checked depth of the card's diffusers class with every parameter on ``meta`` (each is replaced by a
    placeholder at the workload's dtype) and its buffers real, in the dtypes ``from_pretrained(torch_dtype=...)``
    loads them in at the workload's dtype (`as_loaded`: a persistent buffer, which the checkpoint holds, converted;
    SD3.5's positional table, float32 as the class makes it, is 342 MiB a chip whole and 171 MiB in bfloat16, as a
    user's pipeline holds it)."""
    import diffusers
    import torch
    from accelerate import init_empty_weights

    from meshlab.models.importer.build import depth_config
    from meshlab.models.importer.card_import import as_loaded

    cls = getattr(diffusers, setup.card.class_name)
    with init_empty_weights(include_buffers=False):
        model = cls.from_config(depth_config(setup.card, setup.options.layers))
    return as_loaded(model, getattr(torch, setup.strategy.workload.dtype)).eval().requires_grad_(False)


def _other_arguments(setup: CheckSetup, front: str) -> dict[str, int]:
    """Bytes per chip of the program's arguments that are not weights: the inputs, split as the activations say,
    and (torch_xla, which passes them in; torchax folds them into the program) the model's buffers, whole."""
    import math

    import torch

    from meshlab.plan.inputs import input_spec

    mesh, activations = setup.plan.mesh, setup.strategy.activations
    inputs = sum(math.prod(input_spec(k, tuple(v.shape), activations, mesh).shard_shape(tuple(v.shape), mesh))
                 * v.element_size() for k, v in _inputs(setup).items() if isinstance(v, torch.Tensor))
    model = empty_model(setup)
    tables = [*model.buffers(), *(value for _, _, value in tensor_attributes(model))]
    buffers = sum(b.numel() * b.element_size() for b in tables) if front == "torch-xla" else 0
    return {"inputs": int(inputs), "buffers": int(buffers)}


def tensor_attributes(model) -> list[tuple]:
    """(module, name, tensor) of every tensor a module keeps as a plain attribute, neither parameter nor buffer
    (Qwen-Image's RoPE frequency tables): torch_xla passes them to the program as arguments of their own."""
    import torch

    found = []
    for module in model.modules():
        for name, value in vars(module).items():
            if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
                found.append((module, name, value))
    return found


def _inputs(setup: CheckSetup) -> dict:
    from meshlab.models.importer.build import example_inputs

    return example_inputs(setup.card, setup.geometry, setup.strategy.workload.dtype, setup.options.seed)


# --- torch_xla -----------------------------------------------------------------------------------------------


def hybrid_mesh_ordinals(devices: list, shape: tuple[int, ...], names: tuple[str, ...], dcn: dict[str, int]
                         ) -> list[int]:
    """torch_xla ordinals (the topology's devices in id order) in row-major mesh order, as ``xs.HybridMesh`` lays
    out a mesh over a real TPU's devices (within a slice by torus coordinates, slices by their index): the program
    meshlab's export runs there. HybridMesh itself reads the runtime's devices, which here are virtual CPU ones;
    its layout function (private, torch_xla 2.9) is called on the topology's coordinates instead."""
    import numpy as np
    from torch_xla.distributed.spmd.xla_sharding import _create_device_mesh_for_nd_torus

    from meshlab.workers.libtpu import ici_and_dcn

    ici, across = ici_and_dcn(shape, names, dcn)
    slices: dict[int, list[int]] = {}
    for ordinal, d in enumerate(devices):
        slices.setdefault(int(getattr(d, "slice_index", 0) or 0), []).append(ordinal)

    def within(ordinals: list[int]):
        coords = [tuple(devices[o].coords) for o in ordinals]
        physical = np.empty(tuple(c + 1 for c in map(max, zip(*coords))), dtype=int)
        for c, o in zip(coords, ordinals):
            physical[c] = o
        try:
            grid, _ = _create_device_mesh_for_nd_torus(physical, ici, allow_split_physical_axes=True)
        except (ValueError, NotImplementedError, AssertionError):  # HybridMesh would fail too: plain order
            grid = np.array(ordinals).reshape(ici)
        return grid

    meshes = [within(slices[k]) for k in sorted(slices)]
    if len(meshes) == 1:
        return [int(o) for o in np.asarray(meshes[0]).flatten()]
    layout = np.arange(len(meshes)).reshape(across)
    blocks = np.vectorize(lambda i: meshes[i], otypes=[object])(layout)
    return [int(o) for o in np.block(blocks.tolist()).flatten()]


def torch_xla_program(setup: CheckSetup, mesh_ids: list[int]) -> str:
    """torch_xla's pre-partitioning HLO of one forward under the plan, parameters as sharded placeholders."""
    import numpy as np
    import torch
    import torch_xla
    import torch_xla.core.xla_builder as xb
    import torch_xla.distributed.spmd as xs

    from meshlab.parallelisms import activation_hooks, xla
    from meshlab.plan.inputs import input_spec
    from meshlab.models.importer.build import forward

    plan, strategy = setup.plan, setup.strategy
    model = empty_model(setup)
    dtype = getattr(torch, strategy.workload.dtype)
    if strategy.rewrites:
        from meshlab.parallelisms.rewrites import apply_rewrites

        apply_rewrites(model, strategy.rewrites)
    mesh = xs.Mesh(np.array(mesh_ids), plan.mesh.shape, plan.mesh.names)
    specs = {p.name: p.spec for p in plan.parameters}
    for module_name, module in model.named_modules():
        for leaf, param in list(module._parameters.items()):
            if param is None:
                continue
            name = f"{module_name}.{leaf}" if module_name else leaf
            placeholder = xb.create_placeholder_tensor(tuple(param.shape), dtype)
            # under the module's scope, so the gathers XLA makes of this weight (FSDP) name the module
            scope = torch_xla._XLAC.profiler.scope_pusher(module_name + xla.SCOPE_MARK) if module_name else None
            torch_xla._XLAC._xla_annotate_custom_sharding(placeholder, mesh.get_op_sharding(
                specs[name].to_torch_xla()))
            del scope
            module._parameters[leaf] = torch.nn.Parameter(placeholder, requires_grad=False)
    model = model.to(xla.device())  # buffers (masks, tables): small and real
    for module, attribute, value in tensor_attributes(model):  # tables kept as plain attributes (Qwen's RoPE)
        setattr(module, attribute, value.to(xla.device()))
    if setup.scan:
        from meshlab.parallelisms import scan as scanning

        scanning.install(model, plan, mesh)
    if strategy.activations.rules:
        from meshlab.plan.activations import activation_points

        activation_hooks.install(model, activation_points(plan.card, strategy.activations.rules),
                                 activation_hooks.xla_marker(mesh))
    inputs = {}
    for name, value in _inputs(setup).items():
        if isinstance(value, torch.Tensor):
            value = xla.to_device(value)
            xla.mark(value, mesh, input_spec(name, tuple(value.shape), strategy.activations, plan.mesh), name)
        inputs[name] = value
    try:
        with torch.no_grad(), xla.tag_layers(model):
            output = forward(model, inputs)
        text = xla.pending_hlo([output])
    except RuntimeError as exc:
        raise BackendError(f"torch_xla could not trace the forward: {error_message(exc)}",
                           "run `meshlab check` (XLA on CPU) on the strategy first") from None
    return shard_parameters(text)


_ANNOTATION = re.compile(r'custom-call\(([^)]*%([\w.\-]+))\), custom_call_target="Sharding", '
                         r'sharding=(\{[^}]*\})')


def shard_parameters(hlo_text: str) -> str:
    """Give each HLO parameter the sharding of the ``Sharding`` custom call torch_xla wrapped around it (what a
    placeholder's annotation becomes), so that XLA:TPU takes the argument as sharded, as a marked tensor is."""
    for _, name, sharding in _ANNOTATION.findall(hlo_text):
        hlo_text = re.sub(r"(%" + re.escape(name) + r" = [^\n]*? parameter\(\d+\))(?!, sharding)",
                          lambda m: m.group(1) + ", sharding=" + sharding, hlo_text)
    return hlo_text


# --- torchax -------------------------------------------------------------------------------------------------


def torchax_program(setup: CheckSetup, devices: list, mesh_ids: list[int], tally: Counter | None = None):
    """The forward as a jax function (torchax), lowered over abstract sharded parameters and inputs; each module's
    ops under a named scope of its path (as torch_xla's are under meshlab.parallelisms.xla.tag_layers); `tally`
    counts its attention calls by how they ran (`flash_sdpa`)."""
    import warnings

    import jax
    import numpy as np
    import torch
    from jax.sharding import Mesh, NamedSharding

    from meshlab.parallelisms import activation_hooks
    from meshlab.workers import libtpu
    from meshlab.plan.inputs import input_spec

    plan, strategy = setup.plan, setup.strategy
    if setup.scan:
        raise BackendError("torchax has no scan of a torch block list that meshlab drives",
                           "compile the torch-xla front end for a scanned plan (--front-end torch-xla)")
    torchax, interop = libtpu.import_torchax()
    model = empty_model(setup)
    if strategy.rewrites:
        from meshlab.parallelisms.rewrites import apply_rewrites

        apply_rewrites(model, strategy.rewrites)
    by_id = {d.id: d for d in devices}
    mesh = Mesh(np.array([by_id[i] for i in mesh_ids]).reshape(plan.mesh.shape), plan.mesh.names)
    jdtype = getattr(jax.numpy, strategy.workload.dtype)

    def named(spec) -> NamedSharding:
        return NamedSharding(mesh, jax.sharding.PartitionSpec(*spec.to_torch_xla()))

    specs = {p.name: p.spec for p in plan.parameters}
    params = {name: jax.ShapeDtypeStruct(tuple(p.shape), jdtype, sharding=named(specs[name]))
              for name, p in model.named_parameters()}
    buffers = dict(model.named_buffers())
    example = _inputs(setup)
    tensors = {k: v for k, v in example.items() if isinstance(v, torch.Tensor)}
    rest = {k: v for k, v in example.items() if not isinstance(v, torch.Tensor)}
    abstract = {k: jax.ShapeDtypeStruct(tuple(v.shape), _jax_dtype(v.dtype),
                                        sharding=named(input_spec(k, tuple(v.shape), strategy.activations, plan.mesh)))
                for k, v in tensors.items()}
    env = torchax.default_env()
    if strategy.activations.rules:
        from meshlab.plan.activations import activation_points

        def mark(tensor, spec, _label):
            constrained = jax.lax.with_sharding_constraint(interop.jax_view(tensor), named(spec))
            return interop.torch_view(constrained)

        activation_hooks.install(model, activation_points(plan.card, strategy.activations.rules), mark)

    scopes = jax_scopes(model)
    if strategy.workload.flash_attention:  # the attention as a TPU user's flash kernel runs it (`flash_sdpa`)
        from meshlab.plan.attention_kernel import kernel_layouts

        layouts = kernel_layouts(plan, strategy.activations)

    def run(params, inputs):
        with env, scopes:
            state = {**interop.torch_view(params), **{k: env.to_xla(v) for k, v in buffers.items()}}
            kwargs = {**interop.torch_view(inputs), **rest, "return_dict": False}
            out = torch.func.functional_call(model, state, args=(), kwargs=kwargs)[0]
            return interop.jax_view(out)

    try:
        with warnings.catch_warnings(), contextlib.ExitStack() as stack:
            warnings.simplefilter("ignore", UserWarning)  # int64 inputs become int32 without jax's x64 mode,
            # as a TPU run has them
            if strategy.workload.flash_attention:
                stack.enter_context(libtpu.sdpa_replaced(env, lambda reference: flash_sdpa(
                    mesh, layouts, scopes.current, interop, reference, Counter() if tally is None else tally)))
            return jax.jit(run).lower(params, abstract)
    except MemoryError:
        raise
    except Exception as exc:  # torchax raises plain errors naming the aten op it has no lowering for
        if any(m in str(exc) for m in HOST_OUT_OF_MEMORY):
            raise
        where = f" in {failed}" if (failed := scopes.failed_in(exc)) else ""
        raise LoweringError(f"torchax could not lower {setup.card.class_name}{where}: "
                            f"{str(exc).splitlines()[0][:300]}",
                            "compile the torch-xla front end (--front-end torch-xla)") from None


def flash_sdpa(mesh, layouts: dict, module, interop, reference, tally: Counter):
    """torch's ``scaled_dot_product_attention`` as jax's Pallas TPU flash attention kernel under ``shard_map``, laid
    out for the attention module that calls it (`module()`, its path) as the plan runs it (`layouts`:
    meshlab.plan.attention_kernel): what a torchax or JAX user runs on a TPU in place of torch's reference math
    (torchax's own lowering, which writes the scores), as maxdiffusion runs its Flux and Wan attention. A key-padding
    mask becomes the kernel's segment ids, as does the padding of tokens no block divides: a boolean one of one row of
    keys per sample (Qwen-Image's text mask), or an additive one (LTX-Video's and SANA's, 0 where a key is kept,
    repeated over the heads: the first head's row is read). A call the kernel does not take (any other mask, dropout,
    causal, grouped heads, a batch of keys unlike the queries', or outside a planned attention) stays the reference
    math (`reference`), as does a head dim over 128 that is no multiple of it, which the kernel does not take.
    `tally` counts the calls: "kernel" and "reference"."""
    import jax
    import jax.numpy as jnp
    import torch
    from jax.experimental.pallas.ops.tpu.flash_attention import BlockSizes, SegmentIds, flash_attention
    from jax.sharding import PartitionSpec

    from meshlab.plan.attention_kernel import fitted, kernel_block

    sizes = dict(zip(mesh.axis_names, mesh.devices.shape))

    def kernel(scale, q, k, v, keep=None):
        """One chip's attention; `keep`: 1 for each key a query may attend, 0 for a masked one (None: every key)."""
        (q_block, q_padded), (k_block, k_padded) = kernel_block(q.shape[2]), kernel_block(k.shape[2])
        queries, keys, segments = q.shape[2], k.shape[2], None
        if keep is not None or (q_padded, k_padded) != (queries, keys):  # a query sees the keys of its segment
            def ids(tokens: int, padded: int):
                return jnp.broadcast_to((jnp.arange(padded) < tokens).astype(jnp.int32), (q.shape[0], padded))

            kv = ids(keys, k_padded) if keep is None else jnp.pad(keep, ((0, 0), (0, k_padded - keys)))
            segments = SegmentIds(q=ids(queries, q_padded), kv=kv)
            pad = lambda t, n: jnp.pad(t, ((0, 0), (0, 0), (0, n - t.shape[2]), (0, 0)))
            q, k, v = pad(q, q_padded), pad(k, k_padded), pad(v, k_padded)
        blocks = BlockSizes(block_q=q_block, block_k_major=k_block, block_k=k_block, block_b=1)
        return flash_attention(q, k, v, segment_ids=segments, sm_scale=scale, block_sizes=blocks)[:, :, :queries]

    def key_padding(mask, batch: int, heads: int, keys: int) -> bool:
        boolean, additive = mask.dtype == torch.bool, mask.dtype.is_floating_point
        return (mask.ndim == 4 and mask.shape[2] == 1 and mask.shape[3] == keys and mask.shape[0] in (1, batch)
                and (boolean and mask.shape[1] == 1 or additive and mask.shape[1] in (1, heads)))

    def make(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
        layout = layouts.get(module())
        if (layout is None or dropout_p or is_causal or query.ndim != 4 or key.ndim != 4
                or key.shape[:2] != query.shape[:2] or key.shape[3] != query.shape[3] or value.shape != key.shape
                or query.shape[3] > 128 and query.shape[3] % 128  # the kernel's head dims: to 128, or whole 128s
                or (attn_mask is not None
                    and not key_padding(attn_mask, query.shape[0], query.shape[1], key.shape[2]))):
            tally["reference"] += 1
            return reference(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)
        tally["kernel"] += 1
        q, k, v = (interop.jax_view(t) for t in (query, key, value))
        q_entries = fitted(layout.q_entries(), q.shape, sizes)
        kv_entries = fitted(layout.kv_entries(), k.shape, sizes)  # q's batch and heads: the shapes agree there
        specs = [PartitionSpec(*q_entries), PartitionSpec(*kv_entries), PartitionSpec(*kv_entries)]
        operands = [q, k, v]
        if attn_mask is not None:
            mask = interop.jax_view(attn_mask)[:, 0, 0, :]
            keep = (mask if attn_mask.dtype == torch.bool else mask == 0).astype(jnp.int32)
            operands.append(jnp.broadcast_to(keep, (q.shape[0], k.shape[2])))
            specs.append(PartitionSpec(q_entries[0], None))
        run = jax.shard_map(lambda *t: kernel(scale or q.shape[3] ** -0.5, *t), mesh=mesh, in_specs=tuple(specs),
                            out_specs=specs[0], check_vma=False)
        return interop.torch_view(run(*operands))

    return make


class jax_scopes:
    """Every submodule's forward under ``jax.named_scope("<path>#")``: the op names XLA:TPU keeps on the
    collectives then say which module caused each, as meshlab.parallelisms.xla.tag_layers makes torch_xla's do.
    `current` names the innermost module running; `failed_in`, the innermost one an exception left."""

    def __init__(self, model):
        self.model, self.handles, self.open, self.names = model, [], [], []
        self.failures: list[tuple[str, BaseException]] = []  # each exception seen leaving a module, and the first

    def current(self) -> str | None:
        return self.names[-1] if self.names else None

    def failed_in(self, exc: BaseException) -> str | None:
        """The innermost module `exc` (or the exception it was raised from) left; None where it left none (one a
        module caught and recovered from is another exception, and does not count)."""
        seen: BaseException | None = exc
        while seen is not None:
            for name, failure in self.failures:
                if failure is seen:
                    return name
            seen = seen.__cause__ or seen.__context__
        return None

    def __enter__(self):
        import jax

        from meshlab.parallelisms.xla import SCOPE_MARK

        def enter(_module, _args, name):
            scope = jax.named_scope(name + SCOPE_MARK)
            scope.__enter__()
            self.open.append(scope)
            self.names.append(name)

        def leave(_module, _args, _output):
            self.open.pop().__exit__(None, None, None)
            name = self.names.pop()
            failure = sys.exc_info()[1]  # torch calls this hook from its except clause when the forward raised
            if failure is not None and not any(f is failure for _, f in self.failures):
                self.failures.append((name, failure))  # the innermost module it left: outer ones see it later

        for name, sub in self.model.named_modules():
            if name:
                self.handles.append(sub.register_forward_pre_hook(lambda m, a, name=name: enter(m, a, name)))
                self.handles.append(sub.register_forward_hook(leave, always_call=True))
        return self

    def __exit__(self, *exc):
        while self.open:
            self.open.pop().__exit__(None, None, None)
        self.names.clear()
        for handle in self.handles:
            handle.remove()


def _jax_dtype(dtype):
    import jax.numpy as jnp

    return {"torch.bfloat16": jnp.bfloat16, "torch.float32": jnp.float32, "torch.float16": jnp.float16,
            "torch.int64": jnp.int64, "torch.int32": jnp.int32, "torch.bool": jnp.bool_}.get(str(dtype), jnp.float32)


def main(argv: list[str]) -> int:
    return serve(handle, argv, "the XLA:TPU compile", TpuCheckRequest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
