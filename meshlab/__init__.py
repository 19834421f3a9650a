"""meshlab: design, check and compare SPMD sharding plans for diffusion transformers.

``import meshlab`` stays light (no torch); the apply API loads on first use::

    planned = meshlab.load_plan("strategies/2d.yaml")
    applied = meshlab.apply(pipe.transformer, planned)
    inputs = meshlab.shard_inputs(applied, planned, hidden_states=..., encoder_hidden_states=...)
"""

from __future__ import annotations

__all__ = ["load_plan", "apply", "shard_inputs"]


def __getattr__(name: str):
    if name in __all__:
        from meshlab import api

        return getattr(api, name)
    raise AttributeError(f"module 'meshlab' has no attribute {name!r}")
