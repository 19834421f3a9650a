"""How a transformer's forward inputs shard under a strategy's ``activations``. Pure, no torch.

Inputs that carry the batch in dim 0 split it over ``activations.batch``; ``hidden_states`` packed as tokens
(``[batch, tokens, channels]``) also splits dim 1 over ``activations.sequence``; an unpatchified latent (SD3's
4-D, Wan's 5-D) stays whole past the batch: the model patchifies it, and a ``block.input`` rule splits the tokens.
Everything else (position ids, image shapes) stays whole.

With a guidance axis (a mesh axis ``cfg`` of size 2, see meshlab.cost.layout), one transformer call carries both
guidance branches as a batch of twice the images, and dim 0 splits over ``cfg`` first (the branch), then over
``activations.batch``: that is the call the cost model prices, so ``check`` must run that call.
"""

from __future__ import annotations

import math

from meshlab.plan.axes import guidance_axis
from meshlab.core.errors import InputError
from meshlab.core.mesh import AbstractMesh
from meshlab.core.spec import PartitionSpec
from meshlab.strategy.schema import Activations

#: Forward arguments of the supported transformers whose dim 0 is the batch.
BATCHED_INPUTS = frozenset({
    "hidden_states", "encoder_hidden_states", "encoder_hidden_states_mask", "timestep", "pooled_projections",
    "guidance", "additional_t_cond",
    "encoder_attention_mask",  # HunyuanVideo's and LTX-Video's text mask
    "encoder_hidden_states_image",  # Wan I2V's image context
})
#: Forward arguments whose dim 1 is the image-token sequence.
SEQUENCE_INPUTS = frozenset({"hidden_states"})


def batch_axes(activations: Activations, mesh: AbstractMesh) -> tuple[str, ...]:
    """Mesh axes that split dim 0 of the batched inputs, major to minor: the guidance axis, then the batch axis."""
    return tuple(a for a in (guidance_axis(mesh), activations.batch) if a)


def input_spec(name: str, shape: tuple[int, ...], activations: Activations, mesh: AbstractMesh) -> PartitionSpec:
    """The spec of one forward input; an input whose batch does not split evenly is an InputError."""
    entries: list = [None] * len(shape)
    axes = batch_axes(activations, mesh)
    if axes and name in BATCHED_INPUTS and shape:
        entries[0] = axes[0] if len(axes) == 1 else axes
    sequence = activations.sequence_axes
    if sequence and name in SEQUENCE_INPUTS and len(shape) == 3:  # packed [batch, tokens, channels]
        entries[1] = sequence[0] if len(sequence) == 1 else list(sequence)
    for dim, axis in enumerate(entries):
        split = math.prod(mesh.size(a) for a in ((axis,) if isinstance(axis, str) else axis or ()))
        if axis is not None and shape[dim] % split:
            what = "batch" if dim == 0 else "token count"
            raise InputError(
                f"{name} has {what} {shape[dim]}, which does not split over mesh axes {axis!r} ({split} ways)",
                f"use a {what} that is a multiple of {split}",
            )
    return PartitionSpec(*entries)
