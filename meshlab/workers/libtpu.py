"""XLA:TPU ahead of time, on a host without a TPU: libtpu's topologies and its compile-only client, through jax.

What MaxText's ``train_compile.py`` does for JAX programs, for any program meshlab hands it: libtpu describes a
TPU system (``jax.experimental.topologies.get_topology_desc``: its devices, with their ids and torus coordinates,
and a compile-only client), and XLA:TPU compiles a partitioned program for it on the host CPU. Nothing runs; the
compiled executable reports its per-chip memory (``memory_analysis``), its cost analysis and its optimized HLO.

Two programs reach it (meshlab.workers.check_tpu): torch_xla's pre-partitioning HLO, whose GSPMD shardings
name logical devices 0..n-1 (torch_xla's global ordinals: the devices sorted by id), and a jax function traced by
torchax over the topology's devices. The HLO route needs jaxlib's HLO-to-StableHLO converter and the client's
``compile``, both private (jax 0.10.2), and the torchax route replaces torch's attention in torchax's op table
(`sdpa_replaced`, private to put its own back): they are wrapped here, in one place, and nowhere else. Written by hand
because no library compiles another framework's HLO for a TPU topology; MaxText's ``train_compile.py`` does the
jax half only.

Environment (set by the parent before jax starts, see meshlab.runtime.tpu_topology.environment): libtpu reads
``TPU_ACCELERATOR_TYPE`` and ``TPU_WORKER_HOSTNAMES`` at start and complains without them;
``ALLOW_MULTIPLE_LIBTPU_LOAD`` lets several processes (parallel tests) load it.
"""

from __future__ import annotations

import math
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass

from meshlab.core.errors import BackendError, InputError
from meshlab.runtime.tpu_topology import Topology

def import_torchax():
    """(torchax, torchax.interop). torch_xla 2.9's wheel carries an older torchax in the same folder; installed
    after torchax it overwrites torchax's files with a copy that imports flax, which meshlab does not install."""
    try:
        import torchax
        from torchax import interop
    except ModuleNotFoundError as exc:
        raise BackendError(f"torchax does not import ({exc}): torch_xla's wheel overwrote torchax's files with the "
                           "older copy it carries", f"reinstall it: pip install --force-reinstall --no-deps "
                           f"torchax=={_version('torchax')}") from None
    return torchax, interop


@contextmanager
def sdpa_replaced(env, make):
    """torch's ``scaled_dot_product_attention`` in torchax's `env` replaced, inside the block, by ``make(reference)``,
    where ``reference(query, key, value, attn_mask, dropout_p, is_causal, scale, enable_gqa)`` is torchax's own
    lowering of it (torch's reference math). ``env.override_op_definition`` is torchax's documented hook; calling
    the lowering it replaces and putting that back are not public (its op table): wrapped here, in one place."""
    import torch

    op = torch.nn.functional.scaled_dot_product_attention
    own = env._ops.get(op)

    def reference(*args):
        return own.func(*args, env=env) if own.needs_env else own.func(*args)

    env.override_op_definition(op, make(reference))
    try:
        yield
    finally:
        if own is None:
            env._ops.pop(op, None)
        else:
            env._ops[op] = own


def _version(package: str) -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return "0.0.13"


def devices(topology: Topology) -> list:
    """The topology's devices, sorted by id (torch_xla's global ordinals follow this order)."""
    from jax.experimental import topologies

    kwargs = {"chip_config_name": topology.chip_config} if topology.chip_config else {}
    try:
        found = topologies.get_topology_desc(platform="tpu", topology_name=topology.name,
                                             num_slices=topology.slices, **kwargs).devices
    except Exception as exc:  # libtpu's own error type; its message names the topology
        raise InputError(f"libtpu does not know the topology {topology.name} x{topology.slices}: "
                         f"{str(exc).splitlines()[0][:200]}", "use a catalog TPU system libtpu accepts "
                         "(v6e-8, v5e-8, v5p-8, v4-8, ...)") from None
    if len(found) != topology.chips:
        raise BackendError(f"libtpu's {topology.name} x{topology.slices} has {len(found)} devices, the catalog "
                           f"says {topology.chips}", "fix the catalog's topology for this system")
    return sorted(found, key=lambda d: d.id)


def ici_and_dcn(shape: tuple[int, ...], names: tuple[str, ...], dcn: dict[str, int]) -> tuple[tuple, tuple]:
    """A mesh's shape split into its shape within a slice (ICI) and across slices (DCN, the strategy's ``dcn:``)."""
    across = tuple(dcn.get(name, 1) for name in names)
    return tuple(n // k for n, k in zip(shape, across)), across


def jax_device_grid(devices: list, shape: tuple[int, ...], names: tuple[str, ...], dcn: dict[str, int]) -> list[int]:
    """Device ids in row-major mesh order as jax lays a mesh out over the torus (``create_device_mesh``, or
    ``create_hybrid_device_mesh`` across slices): what a torchax or jax user's mesh is."""
    import numpy as np
    from jax.experimental import mesh_utils

    ici, across = ici_and_dcn(shape, names, dcn)
    try:
        if math.prod(across) > 1:
            grid = mesh_utils.create_hybrid_device_mesh(ici, across, devices=devices, allow_split_physical_axes=True)
        else:
            grid = mesh_utils.create_device_mesh(tuple(shape), devices=devices, allow_split_physical_axes=True)
    except Exception:  # a shape the torus layout cannot place: devices in id order, as Mesh(np.arange(n))
        grid = np.array(devices).reshape(shape)
    return [int(d.id) for d in np.asarray(grid).flatten()]


@dataclass(frozen=True)
class Compiled:
    """What XLA:TPU made of one program."""

    seconds: float
    memory: dict[str, int]  # memory_analysis: argument, output, alias, temp, generated_code bytes per chip
    flops: float | None  # cost_analysis, per chip
    bytes_accessed: float | None
    hlo: str  # the optimized TPU program
    out_of_memory: str = ""  # XLA:TPU's refusal when the program does not fit (then the rest is empty)
    required_bytes: int | None = None  # what it asked for, when it said


def compile_hlo(hlo_text: str, devices: list) -> Compiled:
    """Compile an HLO module with GSPMD shardings (torch_xla's) for `devices`, as torch_xla's runtime would: SPMD
    over every device, GSPMD (not Shardy, which ignores the module's ``mhlo.sharding``), outputs sharded as
    propagated."""
    import jaxlib._hlo as hlo
    import numpy as np
    from jax._src import compiler
    from jax._src.interpreters import mlir as jax_mlir
    from jax._src.lib import _jax, xla_client
    from jax._src.lib.mlir import ir

    proto = hlo.hlo_module_from_text(hlo_text).as_serialized_hlo_module_proto()
    with jax_mlir.make_ir_context():
        module = ir.Module.parse(_jax.mlir.hlo_to_stablehlo(proto))
        options = compiler.get_compile_options(num_replicas=1, num_partitions=len(devices),
                                               device_assignment=np.array([[d.id for d in devices]]))
        options.executable_build_options.use_shardy_partitioner = False
        options.executable_build_options.allow_spmd_sharding_propagation_to_output = [True]
        return _timed_compile(lambda: devices[0].client.compile(
            module, executable_devices=xla_client.DeviceList(tuple(devices)), compile_options=options))


def compile_lowered(lowered) -> Compiled:
    """Compile a ``jax.jit(...).lower(...)`` (torchax's route) and read it the same way."""
    return _timed_compile(lowered.compile)


def _timed_compile(compile_fn) -> Compiled:
    start = time.perf_counter()
    try:
        executable = compile_fn()
    except Exception as exc:
        message = str(exc)
        if "RESOURCE_EXHAUSTED" in message and ("HBM" in message or "hbm" in message):
            return Compiled(time.perf_counter() - start, {}, None, None, "", _first_line(message),
                            required_bytes(message))
        raise BackendError(f"XLA:TPU could not compile the program: {_first_line(message)}",
                           "run `meshlab try` on the strategy; report the message if the plan looks right") from None
    seconds = time.perf_counter() - start
    stats = executable.memory_analysis() if hasattr(executable, "memory_analysis") \
        else executable.get_compiled_memory_stats()
    memory = {key: int(getattr(stats, f"{key}_size_in_bytes"))
              for key in ("argument", "output", "alias", "temp", "generated_code")}
    cost = executable.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) and cost else cost or {}
    return Compiled(seconds, memory, _finite(cost.get("flops")), _finite(cost.get("bytes accessed")),
                    _program_text(executable))


def _program_text(executable) -> str:
    """The optimized TPU program. Reading it back can fail where XLA:TPU moved work to the SparseCore (an
    ``async-update`` with several operands trips a check in XLA's proto reader: seen with Flux through torchax);
    then this is "", and the caller reads the program XLA:TPU dumped (meshlab.workers.check_tpu._largest)."""
    for read in (lambda: executable.as_text(), lambda: executable.hlo_modules()[0].to_string()):
        try:
            return read()
        except Exception:  # AttributeError (the other executable type), or XLA's INTERNAL error above
            continue
    return ""


def required_bytes(message: str) -> int | None:
    """The bytes XLA:TPU said a program needs (``... required for HLO temporaries (39.04G) exceeds ...``)."""
    match = (re.search(r"(?:required|requires)[^(]*\(([\d.]+)([KMGT])\)", message)
             or re.search(r"Used ([\d.]+)([KMGT]) of [\d.]+[KMGT] hbm", message))
    if not match:
        return None
    return int(float(match.group(1)) * 1024 ** " KMGT".index(match.group(2)))


def _first_line(message: str) -> str:
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    useful = [line for line in lines if "RESOURCE_EXHAUSTED" in line or "memory" in line.lower()] or lines
    return (useful[0] if useful else "no message")[:400]


def _finite(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None
