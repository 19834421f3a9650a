"""The model rewrites a strategy asks for (``rewrites:``), applied to a torch module before it is sharded.

``layernorm-rows``: every ``torch.nn.LayerNorm`` over one (last) dim becomes a ``RowLayerNorm``, which computes
the same normalization as mean and variance over the last dim in float32. PyTorch/XLA lowers ``nn.LayerNorm`` as
a batch-norm-training over ``[1, batch x tokens, features]``, whose merged row dim XLA's SPMD partitioner cannot
keep split: a batch, guidance or sequence split is all-gathered at every LayerNorm (see
meshlab.cost.collectives). The rewritten norm reduces within each row, so the rows stay split and no collective
is issued. The module keeps its class's parameters and their names (the plan still covers it).
"""

from __future__ import annotations

import torch

from meshlab.strategy.schema import REWRITES


class RowLayerNorm(torch.nn.LayerNorm):
    """``nn.LayerNorm`` over the last dim, written as a per-row mean and variance (float32, cast back)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        mean = x32.mean(-1, keepdim=True)
        centered = x32 - mean
        y = centered * torch.rsqrt(centered.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.weight is not None:
            y = y * self.weight.float()
        if self.bias is not None:
            y = y + self.bias.float()
        return y.to(x.dtype)


def apply_rewrites(module: torch.nn.Module, names: list[str] | tuple[str, ...]) -> dict[str, int]:
    """Apply each named rewrite in place; returns how many modules each changed."""
    unknown = [n for n in names if n not in REWRITES]
    if unknown:
        raise ValueError(f"unknown rewrites {unknown}")  # the strategy schema refuses these first
    changed = {}
    for name in names:
        if name == "layernorm-rows":
            changed[name] = _layernorm_rows(module)
    return changed


#: LayerNorm classes whose forward is the plain normalization (diffusers' FP32LayerNorm, Wan's, computes it in
#: float32 and casts back, as RowLayerNorm does); a subclass with another forward is left alone.
_PLAIN_LAYER_NORMS = ("LayerNorm", "FP32LayerNorm")


def _layernorm_rows(module: torch.nn.Module) -> int:
    count = 0
    for sub in module.modules():
        if type(sub).__name__ in _PLAIN_LAYER_NORMS and isinstance(sub, torch.nn.LayerNorm) \
                and len(sub.normalized_shape) == 1:
            sub.__class__ = RowLayerNorm  # same parameters and buffers, another forward
            count += 1
    return count
