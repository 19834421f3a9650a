"""Activation rules made real: each resolved point (meshlab.plan.activations) becomes one forward hook that
marks the tensor there. Under torch_xla the mark is ``xs.mark_sharding`` (inside a block that torch_xla's scan traces,
``xs.mark_sharding_with_gradients``: meshlab.parallelisms.xla.mark) and XLA's partitioner then moves the
data between the splits on either side (a token split turned into a heads split is an all-to-all); under DTensor
it is a ``redistribute`` to the point's placements (meshlab.parallelisms.dtensor.marker), whose result the hook passes
on in place of the tensor."""

from __future__ import annotations

import contextvars
import inspect
import sys
from typing import Any, Callable

from meshlab.core.errors import BackendError
from meshlab.plan.activations import ActivationPoint
from meshlab.core.spec import PartitionSpec

#: The kernel marks of the attention module whose forward is running (set by its pre-hook, read by the wrapped
#: ``dispatch_attention_fn``); None outside any marked attention.
_ACTIVE = contextvars.ContextVar("meshlab_attention_marks", default=None)


#: ``mark(tensor, spec, label) -> tensor``: the tensor as the backend holds it under `spec`.
Mark = Callable[[Any, PartitionSpec, str], Any]


def xla_marker(xla_mesh) -> Mark:
    from meshlab.parallelisms import xla

    def mark(tensor, spec: PartitionSpec, label: str):
        return xla.mark(tensor, xla_mesh, spec, label)

    return mark


def install(module, points: tuple[ActivationPoint, ...], mark: Mark) -> list:
    """Register one hook per point on the named submodules of `module`; returns the hook handles."""
    handles = []
    for point in points:
        target = module.get_submodule(point.module)
        if point.where == "kernel":
            _wrap_dispatch(target, point)
            handles.append(target.register_forward_pre_hook(_enter(point, mark)))
            handles.append(target.register_forward_hook(_leave))
        elif point.where == "output":
            handles.append(target.register_forward_hook(_mark_output(point, mark)))
        elif point.where == "input":
            handles.append(target.register_forward_pre_hook(_mark_input(point, mark)))
        else:
            handles.append(target.register_forward_pre_hook(_mark_argument(point, mark, target), with_kwargs=True))
    return handles


def _label(point: ActivationPoint) -> str:
    return f"{point.point} of {point.module} ({point.stream})"


def _enter(point: ActivationPoint, mark: Mark):
    batch, tokens, heads = point.spec.entries
    spec = PartitionSpec(batch, tokens, heads, None)  # [batch, tokens, heads, head dim], as the kernel reads them

    def hook(_module, _args):
        _ACTIVE.set((point, spec, mark))
        return None

    return hook


def _leave(_module, _args, _output):
    _ACTIVE.set(None)


def _wrap_dispatch(attention_module, point: ActivationPoint) -> None:
    """Wrap ``dispatch_attention_fn`` where the module's attention processor calls it (diffusers' one entry to
    every attention kernel) so that, inside a marked attention, q, k, v and the output are marked."""
    processor = getattr(attention_module, "processor", None)
    home = sys.modules.get(type(processor).__module__) if processor is not None else None
    original = getattr(home, "dispatch_attention_fn", None)
    if original is None:
        raise BackendError(f"{point.module}'s attention processor {type(processor).__name__} does not call diffusers' "
                           "dispatch_attention_fn, so an attention.qkv rule cannot reach its q, k and v",
                           "drop the attention.qkv rule for this model")
    if getattr(original, "__meshlab_wrapped__", False):
        return

    def dispatch(query, key, value, *args, **kwargs):
        active = _ACTIVE.get()
        if active is None:
            return original(query, key, value, *args, **kwargs)
        marked, spec, mark = active
        query, key, value = (mark(tensor, spec, f"{name} of {marked.module}")
                             for name, tensor in (("q", query), ("k", key), ("v", value)))
        out = original(query, key, value, *args, **kwargs)
        if out.dim() == 4:
            out = mark(out, spec, f"the attention output of {marked.module}")
        return out

    dispatch.__meshlab_wrapped__ = True
    home.dispatch_attention_fn = dispatch


def _mark_output(point: ActivationPoint, mark: Mark):
    batch, _tokens, features = point.spec.entries
    flat = PartitionSpec(batch, features)  # a [batch, features] output (conditioning Linears)

    def hook(_module, _args, output):
        return mark(output, point.spec if output.dim() == 3 else flat, _label(point))

    return hook


def _mark_input(point: ActivationPoint, mark: Mark):
    def hook(_module, args):
        if args:
            return (mark(args[0], point.spec, _label(point)), *args[1:])
        return None

    return hook


def _mark_argument(point: ActivationPoint, mark: Mark, target):
    """The block's forward argument the point names, passed by keyword (Qwen-Image's, Flux's blocks) or by position
    (Wan's, SANA's and HunyuanVideo's models call ``block(hidden_states, ...)``: a hook that read only keywords
    left their block.input rules unapplied)."""
    name = point.where.split(":", 1)[1]
    parameters = inspect.signature(target.forward).parameters.values()
    positional = [p.name for p in parameters if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    position = positional.index(name) if name in positional else None  # None: by keyword only, or absent
    if position is None and not any(p.name == name or p.kind == p.VAR_KEYWORD for p in parameters):
        raise BackendError(f"{point.module}'s forward ({type(target).__name__}) takes no argument {name!r}, which "
                           f"the {point.point} rule marks: the rule would split nothing",
                           "leave the rule out, or name the stream this model's blocks take")

    def hook(_module, args, kwargs):
        value = kwargs.get(name)
        if value is not None:
            return args, {**kwargs, name: mark(value, point.spec, _label(point))}
        if position is not None and position < len(args) and args[position] is not None:
            marked = mark(args[position], point.spec, _label(point))
            return (*args[:position], marked, *args[position + 1:]), kwargs
        return None

    return hook
