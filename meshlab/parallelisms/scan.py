"""Run a diffusers block list through torch_xla's ``scan``: one compiled loop body instead of one copy per block.

XLA compiles each of Qwen-Image's 60 blocks as its own copy of the same program, so compile time grows with
depth. ``ScannedBlocks`` replaces a model's block ``ModuleList`` with one that holds the same blocks under the same
names (plans, state dicts and ``meshlab.apply``'s read-back see nothing new) but, when iterated, yields ONE
callable: diffusers' own ``for block in self.transformer_blocks: ... = block(...)`` then runs once, and that call
runs every block through ``torch_xla.experimental.scan.scan`` (no diffusers code is patched).

- Carry: scan wants ``fn(carry) -> carry`` with one pytree carry whose leaves are floating point (it traces with
  AOTAutograd and marks every leaf as requiring grad). The two token streams and the loop invariants (``temb``,
  RoPE tables, masks) ride in one dict; bool and int invariants travel as float32 and are cast back (exact for
  masks and small indices); non-tensor keyword arguments are static.
- Shardings: every block's parameters are stacked along a new leading dim each forward, and the stacked tensor is
  marked with ``(None, *per-block spec)``: the layer dim whole, every other dim split as the plan splits each
  block's copy. The plan's per-block specs must therefore agree across a list (a PlanError otherwise). Measured
  (8 virtual CPU devices, pairs.yaml): the loop tuple holds each stacked weight at exactly that local shape, and
  the loop body's collectives per iteration are the unrolled block's.
- Cost: the stacked copy of a list's weights is live during the forward (a second copy of the block weights; on
  a TPU expect that, on the CPU backend also f32 copies of the stacked bf16 weights). Dead work of the last block
  (Qwen-Image's text stream after the last attention) is not removed inside the loop.

Only the classes in ``meshlab.models.importer.build`` are supported (their blocks take the streams by keyword and return
``(encoder_hidden_states, hidden_states)``); controlnet residuals and gradient checkpointing are not.
"""

from __future__ import annotations

import functools
from collections import defaultdict

from meshlab.models.card import block_position
from meshlab.core.errors import PlanError

#: The two streams every supported block updates; each block returns (encoder_hidden_states, hidden_states).
STREAMS = ("hidden_states", "encoder_hidden_states")


def homogeneous_specs(plan, list_name: str, blocks: int) -> dict[str, object]:
    """Each parameter's per-block spec (by its name inside a block), which every block of the list must share."""
    found: dict[str, set] = defaultdict(set)  # name inside a block -> {(spec, shape)}
    indices: dict[str, set] = defaultdict(set)  # name inside a block -> the blocks that have it
    for p in plan.parameters:
        position = block_position(p.name)
        if position and position[0] == list_name:
            local = p.name.split(".", 2)[2]
            found[local].add((p.spec, p.shape))
            indices[local].add(position[1])
    for local in sorted(found):
        if len(found[local]) > 1 or len(indices[local]) != blocks:
            specs = ", ".join(sorted({str(spec) for spec, _ in found[local]}))
            shapes = sorted({shape for _, shape in found[local]})
            raise PlanError(
                f"--scan needs every block of {list_name} alike, but {list_name}.*.{local} differs between blocks "
                f"(specs {specs}; shapes {shapes})",
                "give every block of the list the same rules, or run without --scan",
            )
    return {local: next(iter(variants))[0] for local, variants in found.items()}


def install(model, plan, xla_mesh) -> tuple[str, ...]:
    """Swap every block list of `model` named in the plan's card for a ScannedBlocks; returns the lists swapped."""
    import torch

    lists = []
    for name in sorted(plan.card.block_lists):
        blocks = getattr(model, name, None)
        if not isinstance(blocks, torch.nn.ModuleList) or getattr(blocks, "meshlab_scanned", False):
            continue
        specs = homogeneous_specs(plan, name, len(blocks))
        scanned = _scanned_blocks_class()(blocks, {k: s.to_torch_xla() for k, s in specs.items()}, xla_mesh)
        setattr(model, name, scanned)  # nn.Module.__setattr__ replaces the entry: parameter names unchanged
        lists.append(name)
    return tuple(lists)


@functools.cache
def _scanned_blocks_class():
    """``ScannedBlocks(blocks, specs, xla_mesh)``, a ``torch.nn.ModuleList``: defined on first use, so that this
    module imports without torch."""
    import torch
    from torch import nn

    class CarryBlock(nn.Module):
        """One block as ``forward(carry: dict) -> dict`` (see the module's docstring)."""

        def __init__(self, block: nn.Module):
            super().__init__()
            self.block = block
            self.static: dict = {}
            self.casts: dict = {}

        def forward(self, carry: dict) -> dict:
            invariants = {k: (v.to(self.casts[k]) if k in self.casts else v) for k, v in carry["inv"].items()}
            encoder_hidden_states, hidden_states = self.block(
                hidden_states=carry["hidden_states"], encoder_hidden_states=carry["encoder_hidden_states"],
                **invariants, **self.static)
            return {"hidden_states": hidden_states, "encoder_hidden_states": encoder_hidden_states,
                    "inv": carry["inv"]}

    class ScannedBlocks(nn.ModuleList):
        meshlab_scanned = True

        def __init__(self, blocks: nn.ModuleList, specs: dict, xla_mesh):
            super().__init__(list(blocks))
            object.__setattr__(self, "wrappers", [CarryBlock(b) for b in blocks])  # not registered: no new names
            object.__setattr__(self, "specs", {f"block.{k}": v for k, v in specs.items()})
            object.__setattr__(self, "xla_mesh", xla_mesh)
            object.__setattr__(self, "_fn", self._layer_fn())

        def __iter__(self):
            return iter([self._scan_call])

        def _layer_fn(self):
            template = self.wrappers[0]

            def one_layer(carry, params):  # created once, so scan's trace cache (keyed by fn) hits
                return torch.func.functional_call(template, params, (carry,), strict=True), None

            return one_layer

        def _stacked(self) -> dict:
            import torch_xla.distributed.spmd as xs

            params = [dict(w.named_parameters()) for w in self.wrappers]
            stacked = {k: torch.stack([p[k] for p in params], dim=0) for k in params[0]}
            for k, t in stacked.items():
                xs.mark_sharding(t, self.xla_mesh, (None, *self.specs[k]))
            return stacked

        def _scan_call(self, *args, **kwargs):
            from torch_xla.experimental.scan import scan

            if args:
                raise PlanError("a block was called with positional arguments (gradient checkpointing?)",
                                "run without --scan")
            carry, static, casts = _split(kwargs)
            for w in self.wrappers:
                w.static, w.casts = static, casts
            out, _ = scan(self._fn, carry, self._stacked(), is_fn_pure=True)
            return out["encoder_hidden_states"], out["hidden_states"]

    def _split(kwargs: dict):
        """(carry, static keyword arguments, casts) from what diffusers passes one block."""
        invariants, static, casts = {}, {}, {}
        for key, value in kwargs.items():
            if key in STREAMS:
                continue
            if isinstance(value, torch.Tensor):
                if not (value.is_floating_point() or value.is_complex()):
                    casts[key], value = value.dtype, value.to(torch.float32)
                invariants[key] = value
            elif isinstance(value, (tuple, list)) and value and all(isinstance(t, torch.Tensor) for t in value):
                invariants[key] = tuple(value)  # RoPE tables: (image, text) or (cos, sin)
            else:
                static[key] = value
        return ({"hidden_states": kwargs["hidden_states"], "encoder_hidden_states": kwargs["encoder_hidden_states"],
                 "inv": invariants}, static, casts)

    return ScannedBlocks
