"""The one module that calls torch_xla's SPMD APIs and its private ``_XLAC`` functions, each wrapped once.

Everything here turns torch_xla's failures into meshlab's errors: a missing install, SPMD not enabled, a mesh
that does not fit the devices, or a sharding XLA rejects (its message, with the parameter's name, without the
C++ stack trace).
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator

from meshlab.core.errors import BackendError, MissingExtra, error_message
from meshlab.core.mesh import AbstractMesh
from meshlab.core.spec import PartitionSpec

INSTALL_FIX = "install the extra: pip install -e '.[xla]'"


def require() -> None:
    """torch_xla must be importable (checked without importing it)."""
    for module in ("torch", "torch_xla"):
        if importlib.util.find_spec(module) is None:
            raise MissingExtra(f"{module} is not installed, and applying a plan needs PyTorch/XLA", INSTALL_FIX)


def enable_spmd() -> None:
    """Turn SPMD on; only safe before any tensor is on an XLA device (meshlab's own worker process)."""
    import torch_xla.runtime as xr

    xr.use_spmd()


def require_spmd() -> None:
    import torch_xla.runtime as xr

    if not xr.is_spmd():
        raise BackendError("PyTorch/XLA SPMD is not enabled",
                           "call torch_xla.runtime.use_spmd() at the start of the script, before any tensor is "
                           "on the XLA device")


def device():
    import torch_xla

    return torch_xla.device()


def device_count() -> int:
    import torch_xla.runtime as xr

    return xr.global_runtime_device_count()


def device_type() -> str:
    import torch_xla.runtime as xr

    return str(xr.device_type())


def build_mesh(mesh: AbstractMesh):
    """An ``xs.Mesh`` of the plan's axes over every device; on a TPU in the order of the physical topology."""
    import numpy as np
    import torch_xla.distributed.spmd as xs

    present = device_count()
    if present != mesh.device_count:
        bigger = "more" if mesh.device_count > present else "fewer"
        raise BackendError(
            f"the plan's mesh {mesh.describe()} needs {mesh.device_count} devices, {bigger} than the {present} present",
            f"plan for {present} devices (a mesh whose sizes multiply to {present}, or hardware with {present} chips)",
        )
    if device_type() == "TPU":
        return xs.HybridMesh(ici_mesh_shape=mesh.shape, axis_names=mesh.names)
    return xs.Mesh(np.arange(present), mesh.shape, mesh.names)


def shifted_mesh(xla_mesh, mesh: AbstractMesh, axis: str):
    """The same mesh with its devices moved one step along `axis` (position i of that axis gets the device of
    position i - 1): a tensor marked with one spec on both meshes goes from each device to its neighbour in one
    collective-permute."""
    import numpy as np
    import torch_xla.distributed.spmd as xs

    ids = np.array(mesh_device_ids(xla_mesh)).reshape(mesh.shape)
    return xs.Mesh(np.roll(ids, 1, axis=mesh.names.index(axis)).flatten(), mesh.shape, mesh.names)


def mesh_device_ids(xla_mesh) -> tuple[int, ...]:
    """The device id at each row-major mesh position."""
    return tuple(int(d) for d in xla_mesh.device_ids)


def to_device(tensor):
    return tensor.to(device())


def mark(tensor, xla_mesh, spec: PartitionSpec, name: str):
    """``xs.mark_sharding`` of one tensor; XLA's refusal becomes a BackendError naming the tensor. Returns the tensor
    to pass on: `tensor` itself, marked in place; inside a block that torch_xla's ``scan`` traces (AOTAutograd's
    functional tensors, which ``mark_sharding`` refuses: "Expected XLA tensor"), the marked copy that
    ``xs.mark_sharding_with_gradients`` returns, torch_xla's mark for AOTAutograd (its ``xla::aot_mark_sharding``
    op, replayed on the loop body's XLA tensors)."""
    import torch_xla.distributed.spmd as xs

    try:
        if _traced_functionally(tensor):
            return xs.mark_sharding_with_gradients(tensor, xla_mesh, spec.to_torch_xla())
        xs.mark_sharding(tensor, xla_mesh, spec.to_torch_xla())
        return tensor
    except (AssertionError, RuntimeError, ValueError, TypeError) as exc:
        raise BackendError(f"XLA rejected the sharding {spec} of {name} {list(tensor.shape)}: {error_message(exc)}",
                           "fix the rule that gives it this spec (see `meshlab try`)") from None


def _traced_functionally(tensor) -> bool:
    """Whether `tensor` is one of AOTAutograd's functional tensors (a block body that ``scan`` traces), not an XLA
    tensor ``mark_sharding`` can annotate in place. (torch_xla's own tensors are functional too, in C++: not this
    Python subclass.)"""
    from torch._subclasses.functional_tensor import FunctionalTensor

    return isinstance(tensor, FunctionalTensor)


def sharding_string(tensor) -> str:
    """The HLO sharding XLA holds for the tensor (``""`` when it was never marked)."""
    import torch_xla

    return torch_xla._XLAC._get_xla_sharding_spec(tensor)


def pending_hlo(tensors: list) -> str:
    """The HLO text of the not-yet-synced graph behind `tensors` (torch_xla's private debugging call)."""
    import torch_xla

    return torch_xla._XLAC._get_xla_tensors_hlo(tensors)


def device_slices(tensor) -> list[list[tuple[int, int]]]:
    """For each device (by id), the ``[start, stop)`` of every dim of the data it holds (padding excluded)."""
    import torch_xla

    (per_device,) = torch_xla._XLAC._get_local_shard_replica_and_indices([tensor])
    slices = []
    for _replica, index in per_device:
        if index is Ellipsis:
            slices.append([(0, n) for n in tensor.shape])
        else:
            slices.append([(s.start, s.stop) for s in index])
    return slices


def compile_count() -> int:
    """Graphs compiled so far in this process."""
    import torch_xla.debug.metrics as met

    return _metric_count(met, "CompileTime")


def compile_seconds() -> float:
    """Seconds XLA has spent compiling graphs so far in this process (torch_xla's CompileTime metric)."""
    import torch_xla.debug.metrics as met

    data = met.metric_data("CompileTime")
    return float(data[1]) / 1e9 if data else 0.0


#: torch_xla counters that say why data moved between host and device, and what a person did to cause it.
TRANSFER_CAUSES = {
    "aten::_local_scalar_dense": ".item() or a Python scalar read of a device tensor",
    "xla::_to_cpu": ".cpu(), printing, or indexing on the CPU side of a device tensor",
    "xla::_copy_from": "a copy into a device tensor: from the host when a CPU tensor (a scalar, a timestep, a mask) "
                       "meets device math",
}


def traffic() -> dict[str, int]:
    """Counts so far in this process: transfers from and to the device, syncs, and the counters that cause them
    (every ``aten::*`` counter is a CPU fallback, which moves its operands to the host and back)."""
    import torch_xla.debug.metrics as met

    counts = {"from_device": _metric_count(met, "TransferFromDeviceTime"),
              "to_device": _metric_count(met, "TransferToDeviceTime"),
              "syncs": met.counter_value("MarkStep") or 0}
    for name in met.counter_names():
        if name in TRANSFER_CAUSES or name.startswith("aten::"):
            counts[name] = met.counter_value(name) or 0
    return counts


def traffic_since(before: dict[str, int]) -> dict[str, int]:
    """What `traffic()` counted after `before`, leaving out what did not move."""
    now = traffic()
    return {k: v - before.get(k, 0) for k, v in now.items() if v != before.get(k, 0)}


def persistent_cache() -> dict[str, int]:
    """The persistent compile cache's counters so far in this process: hits, misses, and programs it found but
    could not load."""
    import torch_xla.debug.metrics as met

    return {"hits": met.counter_value("PersistentCacheHit") or 0,
            "misses": met.counter_value("PersistentCacheMiss") or 0,
            "deserialize_failures": met.counter_value("PersistentCacheDeserializeFailure") or 0}


def _metric_count(met, name: str) -> int:
    data = met.metric_data(name)
    return int(data[0]) if data else 0


def sync() -> None:
    """Cut the pending graph, run it, and wait until the device is done (so wall time covers device work).

    ``torch_xla.sync(wait=True)`` alone returns before the CPU backend has run the graph (torch_xla 2.9, measured:
    20 chained 2048-wide matmuls took 0.41 s to "sync" and 8.1 s more to fetch), so steps timed with it looked
    ten times faster than they ran; ``wait_device_ops`` waits for the execution itself."""
    import torch_xla
    import torch_xla.core.xla_model as xm

    torch_xla.sync(wait=True)
    xm.wait_device_ops()


#: Ends every scope meshlab pushes, so its module path can be told from the counter XLA appends (".7").
SCOPE_MARK = "#"


@contextlib.contextmanager
def tag_layers(module) -> Iterator[None]:
    """Record every op inside `module`'s forward under the scopes of the submodules that ran it.

    XLA then writes ``op_name="transformer_blocks.0#.7/transformer_blocks.0.attn.to_q#.3/aten__addmm"`` into the
    HLO metadata, which the partitioner copies onto the collectives it creates (``hlo.HloCollective.layer``
    reads the innermost). Needs ``XLA_HLO_DEBUG=1`` set before torch_xla starts. A TorchDispatchMode that
    names each op would change torch_xla's numerics (seen with 2.9: 5% off on Qwen-Image); scopes do not.
    """
    import torch_xla

    scopes: list = []

    def enter(_module, _args, name: str) -> None:
        scopes.append(torch_xla._XLAC.profiler.scope_pusher(name + SCOPE_MARK))

    def leave(_module, _args, _output) -> None:
        scopes.pop()  # dropping the pusher pops the scope

    handles = []
    for name, sub in module.named_modules():
        if name:
            handles.append(sub.register_forward_pre_hook(lambda m, a, name=name: enter(m, a, name)))
            handles.append(sub.register_forward_hook(leave))
    try:
        yield
    finally:
        scopes.clear()
        for handle in handles:
            handle.remove()
