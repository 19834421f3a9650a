"""How a transformer's forward inputs shard under a strategy's ``activations``. Pure, no torch.

Inputs that carry the batch in dim 0 split it over ``activations.batch``; ``hidden_states`` (the image tokens)
also split dim 1 over ``activations.sequence``. Everything else (position ids, image shapes) stays whole.
"""

from __future__ import annotations

from meshlab.errors import InputError
from meshlab.mesh import AbstractMesh
from meshlab.spec import PartitionSpec
from meshlab.strategy.schema import Activations

#: Forward arguments of the supported transformers whose dim 0 is the batch.
BATCHED_INPUTS = frozenset({
    "hidden_states", "encoder_hidden_states", "encoder_hidden_states_mask", "timestep", "pooled_projections",
    "guidance", "additional_t_cond",
})
#: Forward arguments whose dim 1 is the image-token sequence.
SEQUENCE_INPUTS = frozenset({"hidden_states"})


def input_spec(name: str, shape: tuple[int, ...], activations: Activations, mesh: AbstractMesh) -> PartitionSpec:
    """The spec of one forward input; an input whose batch does not split evenly is an InputError."""
    entries: list[str | None] = [None] * len(shape)
    if activations.batch and name in BATCHED_INPUTS and shape:
        entries[0] = activations.batch
    if activations.sequence and name in SEQUENCE_INPUTS and len(shape) > 1:
        entries[1] = activations.sequence
    for dim, axis in enumerate(entries):
        if axis is not None and shape[dim] % mesh.size(axis):
            what = "batch" if dim == 0 else "token count"
            raise InputError(
                f"{name} has {what} {shape[dim]}, which does not split over mesh axis {axis!r} of size "
                f"{mesh.size(axis)}",
                f"use a {what} that is a multiple of {mesh.size(axis)}",
            )
    return PartitionSpec(*entries)
