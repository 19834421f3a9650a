"""The DTensor backend: a plan applied with torch.distributed's ``DeviceMesh`` and ``DTensor`` (no torch_xla).

Every rank runs the same script (``torchrun``, or meshlab's own gloo processes for ``check --backend dtensor``);
each builds the same weights, keeps its own slice of each (``distribute_tensor(..., src_data_rank=None)``: no
communication, since every rank already holds the whole value) and frees the rest. Placements come from
meshlab.plan.placements; the few specs DTensor cannot express are refused there with the reason.

The forward runs under ``implicit_replication`` (plain tensors the model makes, such as RoPE tables, count as
replicated). DTensor (torch 2.9) has no sharding rule for SDPA's CPU kernel
(``aten._scaled_dot_product_flash_attention_for_cpu``), and its math kernel reshapes batch and heads into one dim,
which DTensor cannot do when both are split. ``cpu_attention_rule`` registers one, through DTensor's private
``register_op_strategy`` (the only private call here): attention is independent per batch row and per head, so q,
k, v and the output may all be split on either; q may also be split on its tokens while k and v stay whole (what a
sequence split with no rule costs: k and v gathered, as XLA does). Anything else DTensor redistributes to one of
these, issuing the collectives itself.
"""

from __future__ import annotations

import contextlib
import math
import os

from meshlab.core.errors import BackendError, InputError
from meshlab.core.mesh import AbstractMesh, ravel
from meshlab.plan.placements import Placements, local_slices, required
from meshlab.core.spec import PartitionSpec


def require_process_group() -> None:
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        raise InputError("the DTensor backend needs torch.distributed's process group, and none is initialised",
                         "call torch.distributed.init_process_group() first (torchrun sets its environment), "
                         "or use `meshlab check --backend dtensor`, which starts its own processes")


def device_type() -> str:
    import torch.distributed as dist

    return "cuda" if dist.get_backend() == "nccl" else "cpu"


def build_mesh(mesh: AbstractMesh):
    """A ``DeviceMesh`` of the plan's axes over the process group's ranks, row-major as XLA numbers devices."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    if world != mesh.device_count:
        raise InputError(f"the plan's mesh {mesh.describe()} has {mesh.device_count} devices but the process group "
                         f"has {world} ranks", f"start {mesh.device_count} processes (torchrun --nproc-per-node "
                         f"{mesh.device_count}) or plan for {world} devices")
    if device_type() == "cuda":
        import torch

        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", dist.get_rank() % torch.cuda.device_count())))
    return init_device_mesh(device_type(), mesh.shape, mesh_dim_names=mesh.names)


def mesh_position(device_mesh, mesh: AbstractMesh) -> int:
    """This rank's position in the plan's row-major device numbering."""
    return ravel(device_mesh.get_coordinate(), mesh.shape)


def placements_held(sharded) -> Placements:
    """What a DTensor holds, in meshlab.plan.placements' terms (compared with the plan's as strings)."""
    return Placements(tuple(("shard", p.dim) if p.is_shard() else ("replicate",) for p in sharded.placements))


def torch_placements(placements: Placements) -> list:
    from torch.distributed.tensor import Replicate, Shard

    return [Shard(p[1]) if p[0] == "shard" else Replicate() for p in placements.placements]


def distribute(value, device_mesh, spec: PartitionSpec, mesh: AbstractMesh, name: str):
    """`value` (the same on every rank) as a DTensor holding only this rank's slice; the rest can be freed."""
    from torch.distributed.tensor import DTensor, distribute_tensor

    placements = torch_placements(required(spec, mesh, name))
    if device_type() == "cuda" and value.device.type != "cuda":
        value = value.to("cuda")
    sharded = distribute_tensor(value, device_mesh, placements, src_data_rank=None)
    local = sharded.to_local()
    if local.untyped_storage().data_ptr() == value.untyped_storage().data_ptr():
        local = local.clone()  # a view would keep the whole value alive
    return DTensor.from_local(local, device_mesh, placements, run_check=False, shape=sharded.shape,
                              stride=sharded.stride())


def distribute_inputs(inputs: dict, device_mesh, mesh: AbstractMesh, activations) -> dict:
    """A forward's tensor inputs split as the strategy's ``activations`` say (meshlab.plan.inputs); a tuple of tensors
    (CogVideoX's rotary tables) replicated; the rest as they are."""
    import torch

    from meshlab.plan.inputs import input_spec

    def placed(name: str, value):
        if isinstance(value, torch.Tensor):
            return distribute(value, device_mesh, input_spec(name, tuple(value.shape), activations, mesh), mesh, name)
        if isinstance(value, tuple) and value and all(isinstance(v, torch.Tensor) for v in value):
            return tuple(distribute(v, device_mesh, PartitionSpec.replicated(v.dim()), mesh, name) for v in value)
        return value

    return {name: placed(name, value) for name, value in inputs.items()}


def holds_its_slice(value, sharded, spec: PartitionSpec, mesh: AbstractMesh, position: int) -> bool:
    """Whether this rank's local tensor is exactly the slice of `value` the plan gives its mesh position."""
    index = tuple(slice(a, b) for a, b in local_slices(tuple(value.shape), spec, mesh, position))
    local = sharded.to_local()
    return tuple(local.shape) == tuple(value[index].shape) and bool((local.cpu() == value[index].cpu()).all())


def marker(device_mesh, mesh: AbstractMesh):
    """The activation rules' ``mark`` for DTensor: redistribute the tensor to the rule's spec and return it."""
    from torch.distributed.tensor import DTensor, Replicate

    def mark(tensor, spec: PartitionSpec, label: str):
        placements = torch_placements(required(spec, mesh, label))
        if not isinstance(tensor, DTensor):  # a tensor the model made whole on every rank
            tensor = DTensor.from_local(tensor, device_mesh, [Replicate()] * len(mesh.axes), run_check=False)
        try:
            return tensor.redistribute(device_mesh, placements)
        except (RuntimeError, NotImplementedError) as exc:
            raise BackendError(f"DTensor could not move {label} to {spec}: {str(exc).splitlines()[0]}",
                               "use the torch_xla backend for this rule") from None

    return mark


@contextlib.contextmanager
def forward_context():
    """What a sharded forward runs under: plain tensors count as replicated, no autograd, the Linears of
    ``_linears``; on the CPU, DTensor's rule for SDPA's kernel (``cpu_attention_rule``)."""
    import torch
    from torch.distributed.tensor.experimental import implicit_replication

    if device_type() == "cpu":
        cpu_attention_rule()
    with torch.no_grad(), implicit_replication(), _linears():
        yield


@contextlib.contextmanager
def _linears():
    """Two things every ``nn.Linear`` does differently while a sharded forward runs (restored afterwards):

    - its output never stays a pending sum (``Partial``): it is all-reduced there, as a row-split Linear is under
      XLA and in ``RowwiseParallel``. DTensor in torch 2.9 adds a Python scalar to each rank's part of a pending
      sum (``1 + scale`` in every modulation gives wrong pixels; pytorch/pytorch#163193, fixed by #170030 after
      2.9), and diffusers adds scalars right after Linears;
    - an input split on both batch and tokens runs as a batched matmul: ``F.linear`` flattens the two into one
      dim, which DTensor cannot do while both are split (a batch and a sequence axis together, as Ulysses with
      data or guidance parallelism has them).
    """
    import torch
    from torch.distributed.tensor import DTensor, Partial, Replicate

    original = torch.nn.Linear.forward

    def forward(self, x):
        if isinstance(x, DTensor) and x.ndim == 3 and _splits(x, 0) and _splits(x, 1):
            weight = self.weight.t().unsqueeze(0).expand(x.shape[0], -1, -1)
            y = torch.bmm(x, weight)
            y = y + self.bias if self.bias is not None else y
        else:
            y = original(self, x)
        if isinstance(y, DTensor) and any(isinstance(p, Partial) for p in y.placements):
            y = y.redistribute(y.device_mesh, [Replicate() if isinstance(p, Partial) else p for p in y.placements])
        return y

    torch.nn.Linear.forward = forward
    try:
        yield
    finally:
        torch.nn.Linear.forward = original


@contextlib.contextmanager
def missing_rules():
    """An op DTensor has no sharding rule for (``NotImplementedError``) becomes a BackendError naming it."""
    try:
        yield
    except NotImplementedError as exc:
        import torch

        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise BackendError(f"DTensor (torch {torch.__version__}) cannot run this model's forward: {first}",
                           "check this plan with --backend xla; the DTensor backend needs that rule") from None


def _splits(tensor, dim: int) -> bool:
    return any(p.is_shard(dim) for p in tensor.placements)


_REGISTERED: list[bool] = []


def cpu_attention_rule() -> None:
    """Register DTensor's sharding rule for SDPA's CPU kernel (once per process; see the module's docstring)."""
    if _REGISTERED:
        return
    import torch
    from torch.distributed.tensor import Replicate, Shard

    try:
        from torch.distributed.tensor._ops.utils import expand_to_full_mesh_op_strategy, register_op_strategy
    except ImportError as exc:
        raise BackendError(f"this torch has no DTensor op-strategy registry ({exc})",
                           "use torch 2.9 to 2.11 for the DTensor backend on the CPU") from None
    op = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    # [output, logsumexp, q, k, v]; q, k, v and the output are [batch, heads, tokens, head dim], logsumexp
    # [batch, heads, tokens]
    per_mesh_dim = [
        [Replicate(), Replicate(), Replicate(), Replicate(), Replicate()],
        [Shard(0), Shard(0), Shard(0), Shard(0), Shard(0)],  # batch rows
        [Shard(1), Shard(1), Shard(1), Shard(1), Shard(1)],  # heads
        [Shard(2), Shard(2), Shard(2), Replicate(), Replicate()],  # query tokens; every key on every rank
    ]

    @register_op_strategy(op)
    def strategy(op_schema):
        return expand_to_full_mesh_op_strategy(op_schema.get_mesh_from_args(), op_schema, per_mesh_dim, input_index=2)

    _REGISTERED.append(True)


def whole(tensor):
    """The full tensor on every rank (a collective: every rank must call it)."""
    from torch.distributed.tensor import DTensor

    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def local_bytes(module) -> int:
    """Bytes of the parameters this rank holds."""
    from torch.distributed.tensor import DTensor

    total = 0
    for param in module.parameters():
        local = param.to_local() if isinstance(param, DTensor) else param
        total += math.prod(local.shape) * local.element_size()
    return total
