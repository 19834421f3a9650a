"""Which mesh axes split activations rather than weights. Pure, no torch.

The batch axis and the sequence axis are named in ``activations``. The guidance axis is a mesh axis named ``cfg``
of size 2: it puts the conditional and unconditional branches of classifier-free guidance on different chips
(see meshlab.cost.layout). A weight split over any of these axes is all-gathered before use (FSDP): its split
saves memory, never work.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from meshlab.mesh import AbstractMesh
from meshlab.strategy.schema import Activations

GUIDANCE_AXIS = "cfg"


def guidance_axis(mesh: AbstractMesh) -> str | None:
    return GUIDANCE_AXIS if GUIDANCE_AXIS in mesh.names and mesh.size(GUIDANCE_AXIS) == 2 else None


def activation_axes(activations: Activations, mesh: AbstractMesh) -> frozenset[str]:
    """Axes that split activations (by sample, token or guidance branch)."""
    return frozenset(a for a in (activations.batch, *activations.sequence_axes, guidance_axis(mesh)) if a)


def compute_split(axes: Iterable[str] | None, mesh: AbstractMesh, gathered: Iterable[str]) -> int:
    """How many ways a weight dim split over `axes` is split as a chip computes with it: axes in `gathered`
    (those that split activations) are all-gathered first, so they do not count."""
    skip = set(gathered)
    return math.prod(mesh.size(a) for a in axes or () if a not in skip)
