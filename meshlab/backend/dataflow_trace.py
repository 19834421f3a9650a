"""Which op feeds which in a real diffusers transformer, traced from one forward (needs torch).

A ``TorchFunctionMode`` tags every tensor the forward makes with the set of producers it was computed from,
and passes the union of its inputs' tags on through every op, with three boundaries that start a new tag:

- ``F.linear``: the output is tagged by the Linear (found by its weight); what its input was tagged with is
  what it ``reads``.
- attention (``F.scaled_dot_product_attention``): the output is tagged by the attention module it runs in; the
  Linears in its q/k/v tags feed it.
- a norm over the hidden width (``F.layer_norm`` and the like, the LayerNorms of the residual streams): the
  output is tagged by the norm; what reaches its input joins a residual stream.

Outside attention, a concatenation of the text and image streams along the token dim into one joint sequence,
and the slicing of a joint sequence back into the two, are recorded as ``Join`` events of the module they run
in (Flux's single blocks do both; the q/k/v concatenations inside attention are the attention's own business).

An elementwise op that combines a norm-tagged tensor with a tensor tagged only by Linears (no norm) is a
modulation: those Linears condition that norm (shift and scale), with pieces as wide as that tensor's last
dim. Model inputs are tagged ``input:<name>``. Norms run inside an attention module are not boundaries: per-head
q/k norms (over the head dim), and Wan's q/k norms across all heads (over the hidden width).

The result is keyed by module pattern: a path with the block index replaced by ``*``
(``transformer_blocks.*.attn.to_q``), so one traced block stands for every block of its list.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable

from meshlab.cards.card import Flow, Join, Modulation
from meshlab.cards.card import module_pattern as pattern_of


def trace_dataflow(model: Any, inputs: dict, block_lists: set[str], hidden: int,
                   stream_of: Callable[[tuple[int, ...]], str]) -> tuple[tuple[Flow, ...], tuple[Join, ...]]:
    """Run ``model(**inputs)`` once under the tracer: every Linear's flow, in the order the forward calls them,
    and the joins and splits of the token streams outside attention."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._pytree import tree_flatten

    F = torch.nn.functional
    linear_of = {id(m.weight): pattern_of(p, block_lists) for p, m in model.named_modules()
                 if isinstance(m, torch.nn.Linear)}
    attention_modules = {p for p, m in model.named_modules() if isinstance(getattr(m, "heads", None), int)}
    stack: list[str] = []

    def enter(path: str) -> Callable:
        def hook(module, args) -> None:  # a hook that returns something replaces the inputs or output
            stack.append(path)
        return hook

    def leave(module, args, output) -> None:
        stack.pop()

    for path, module in model.named_modules():
        module.register_forward_pre_hook(enter(path))
        module.register_forward_hook(leave)
    reads: dict[str, set[str]] = defaultdict(set)
    order: list[str] = []
    feeds: dict[str, str] = {}
    residual: set[str] = set()
    modulations: dict[str, dict[str, Modulation]] = defaultdict(dict)
    norms = {F.layer_norm, F.group_norm, getattr(F, "rms_norm", F.layer_norm)}
    joins: dict[tuple[str, str], Join] = {}

    def record_join(func, args, kwargs, out) -> None:
        if any(p in attention_modules for p in stack):
            return
        if func is torch.cat and torch.is_tensor(out) and out.dim() == 3:
            parts = args[0] if args else kwargs.get("tensors", ())
            dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
            if dim in (1, -2) and stream_of(tuple(out.shape)) == "joint" and len(parts) == 2 and all(
                    stream_of(tuple(t.shape)) in ("text", "image") for t in parts):
                where = pattern_of(stack[-1] if stack else "", block_lists)
                joins.setdefault((where, "concat"), Join(where, "concat", int(out.shape[-1])))
        if func is torch.Tensor.__getitem__ and torch.is_tensor(out) and out.dim() == 3 and torch.is_tensor(args[0]):
            if stream_of(tuple(args[0].shape)) == "joint" and stream_of(tuple(out.shape)) in ("text", "image"):
                where = pattern_of(stack[-1] if stack else "", block_lists)
                joins.setdefault((where, "split"), Join(where, "split", int(out.shape[-1])))

    def tags(values) -> list[frozenset]:
        return [getattr(t, "_meshlab_from", frozenset()) for t in tree_flatten(values)[0] if torch.is_tensor(t)]

    def tag(values, label: frozenset) -> None:
        for t in tree_flatten(values)[0]:
            if torch.is_tensor(t):
                t._meshlab_from = label

    def linears(label: frozenset) -> set[str]:
        return {x.split(":", 1)[1] for x in label if x.startswith("linear:")}

    class Tracer(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if func is F.linear:
                name = linear_of.get(id(args[1] if len(args) > 1 else kwargs["weight"]))
                if name is not None:
                    if name not in reads:
                        order.append(name)
                    reads[name].update(tags(args[0])[0])
                    tag(out, frozenset({f"linear:{name}"}))
                    return out
            incoming = tags((args, kwargs))
            if func is F.scaled_dot_product_attention:
                owner = next((p for p in reversed(stack) if p in attention_modules), "attention")
                for name in linears(frozenset().union(*incoming[:3])):
                    feeds[name] = pattern_of(owner, block_lists)
                tag(out, frozenset({f"attention:{pattern_of(owner, block_lists)}"}))
                return out
            if func in norms and torch.is_tensor(args[0]) and args[0].shape[-1] == hidden and not any(
                    p in attention_modules for p in stack):  # a q/k norm across heads (Wan) is attention's own
                residual.update(linears(incoming[0]))
                norm = pattern_of(stack[-1] if stack else "norm", block_lists)
                tag(out, frozenset({f"norm:{norm}|{stream_of(tuple(args[0].shape))}"}))
                return out
            self._modulation(args, incoming)
            record_join(func, args, kwargs, out)
            tag(out, frozenset().union(*incoming) if incoming else frozenset())
            return out

        @staticmethod
        def _modulation(args, incoming: list[frozenset]) -> None:
            normed = [x for label in incoming for x in label if x.startswith("norm:")]
            if not normed:
                return
            tensors = [t for t in tree_flatten(args)[0] if torch.is_tensor(t)]
            for t, label in zip(tensors, incoming):
                if label and not any(x.startswith("norm:") for x in label) and linears(label) == {
                        x.split(":", 1)[1] for x in label}:
                    for name in linears(label):
                        for norm_label in normed:
                            norm, stream = norm_label[5:].rsplit("|", 1)
                            modulations[name].setdefault(norm, Modulation(norm, stream, int(t.shape[-1])))

    for name, value in inputs.items():
        if torch.is_tensor(value):
            value._meshlab_from = frozenset({f"input:{name}"})
    with torch.no_grad(), Tracer():
        output = model(**inputs, return_dict=False)[0]
    residual.update(linears(getattr(output, "_meshlab_from", frozenset())))
    flows = tuple(
        Flow(module=name, reads=tuple(sorted(reads[name])), attention=feeds.get(name),
             modulates=tuple(sorted(modulations[name].values(), key=lambda m: m.norm)),
             residual=name in residual)
        for name in order
    )
    return flows, tuple(joins.values())
