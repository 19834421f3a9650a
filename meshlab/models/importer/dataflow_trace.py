"""Which op feeds which in a real diffusers transformer, traced from one forward (needs torch).

A ``TorchFunctionMode`` tags every tensor the forward makes with the set of producers it was computed from,
and passes the union of its inputs' tags on through every op, with three boundaries that start a new tag:

- ``F.linear``: the output is tagged by the Linear (found by its weight); what its input was tagged with is
  what it ``reads``. A pointwise convolution (1 x ... x 1 kernel, one group, stride 1: SANA's GLUMBConv) is the
  Linear over channels it is, and is traced as one; any other convolution passes its input's tags on.
- attention (``F.scaled_dot_product_attention``): the output is tagged by the attention module it runs in; the
  Linears in its q/k/v tags feed it. An attention computed as matmuls instead (SANA's linear attention): each matmul
  inside an attention module that reads its own q/k/v Linears or its running result is the kernel, and the Linears
  each reads are returned in order (the first of a linear attention reads only k and v).
- a norm over the hidden width (``F.layer_norm`` and the like, the LayerNorms of the residual streams): the
  output is tagged by the norm; what reaches its input joins a residual stream. So is a module with no Linear
  inside, in a block, whose forward takes a mean over the last dim of a hidden-wide tensor and returns one
  (diffusers' ``RMSNorm``, which computes its mean of squares by hand: LTX-Video's norm1 and norm2), recorded as an
  RMS norm. One outside the blocks (SANA's caption_norm over the text embedding) is no residual stream's, and stays
  transparent.

Outside attention, a concatenation of the text and image streams along the token dim into one joint sequence,
and the slicing of a joint sequence back into the two, are recorded as ``Join`` events of the module they run
in (Flux's single blocks do both; the q/k/v concatenations inside attention are the attention's own business),
the first of each kind in a module. An attention module that concatenates its own arguments, the streams' hidden
states before its projections (CogVideoX's attn1 joins the two norm outputs it is called with), records that join
too, in the attention module. A block's concatenation of its own arguments, or its cut whose parts it
returns, is at the block's edge (``Join.edge``: Flux's single blocks join their streams first and cut them last;
HunyuanVideo's first cut is its norm's output, inside the block).

An elementwise op that combines a norm-tagged tensor with a tensor tagged only by Linears (no norm) is a modulation:
those Linears condition that norm (shift and scale), with pieces as wide as that tensor's last dim (a concatenation
is no such op), and in that tensor's dtype where it is not the forward's `dtype` (Wan's float32 pieces). A plain
slice of a concatenation's output that falls within some of its parts carries only those parts' tags (Wan I2V joins
the image context and the text along the tokens, and its cross-attention cuts them apart again); ``split``,
``chunk`` and ``narrow``, or a slice after an in-place write, carry the union, as any other op. Model inputs are
tagged ``input:<name>``. Norms run inside an attention module are not boundaries: per-head q/k norms (over the head
dim), and Wan's q/k norms across all heads (over the hidden width).

Inside an attention, two more edges of each q/k/v Linear are recorded, from what the ops do rather than from
module names:

- a q/k norm: a norm function (or a mean over the last dim, as diffusers' ``RMSNorm`` computes one) whose input
  carries the Linear's tag; the innermost module running it is the norm, and the input's last dim is the width
  it normalizes over (a head's, or every head's at once);
- rotary embeddings: a multiply of two tensors whose last dims are equal and larger than 1, one carrying the
  Linear's tag and the other no Linear, norm or attention tag, at least 2-D and not a parameter (the cos/sin or
  complex frequencies, made from the model's inputs or buffers; a (batch, tokens, 1) mask is not one). A rotated
  value written into strided slices of the last dim (Wan's ``out[..., 0::2] = ...``) is rotated as interleaved
  halves. A rotated value that carries more than one of the attention's own Linears, with frequencies for more
  tokens than each of them made, is the joint sequence, its streams' q (or k) concatenated before the rotation
  (Flux's double blocks): each of those Linears is recorded as rotated jointly. Frequencies for fewer tokens than
  the Linear's output holds (their longest dim but the last, against the output's [batch, tokens, features])
  rotate a part of its tokens, the image's of a joint sequence, joined with the rest again (HunyuanVideo's single
  blocks cut q and k, rotate the image's tokens and join the text's back): recorded as rotated in part. One
  written back in place (CogVideoX's ``query[:, :, text:] = ...``) is not: XLA:TPU moves nothing for it
  (cog-seq2-model4.yaml).

Both are recorded only for the Linears of the attention they run in (a norm over the residual stream that an
attention module happens to run is not a q/k norm of the feed-forward that made its input).

A gated unit (GLU: FLUX.2's SwiGLU, SANA's GLUMBConv): a Linear's output cut along its features (``chunk``,
``split``, or a slice of the last dim) into pieces, two of which are multiplied, is recorded on that Linear
(``Flow.gated``, the pieces).

The result is keyed by module pattern: a path with the block index replaced by ``*``
(``transformer_blocks.*.attn.to_q``), so one traced block stands for every block of its list.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace
from typing import Any, Callable

from meshlab.models.card import Flow, Join, Modulation, QkNorm
from meshlab.models.card import module_pattern as pattern_of


def trace_dataflow(model: Any, inputs: dict, block_lists: set[str], hidden: int,
                   stream_of: Callable[[tuple[int, ...]], str], dtype: Any = None
                   ) -> tuple[tuple[Flow, ...], tuple[Join, ...], dict[str, tuple[frozenset[str], ...]],
                              frozenset[str]]:
    """Run ``model(**inputs)`` once under the tracer: every Linear's flow, in the order the forward calls them,
    the joins and splits of the token streams outside attention's q/k/v, for each attention computed as matmuls
    rather than one ``F.scaled_dot_product_attention``, the q/k/v Linears each of its matmuls reads, and the
    attentions (patterns) whose ``F.scaled_dot_product_attention`` the forward passes a mask (``attn_mask``)."""
    import torch
    from torch.overrides import TorchFunctionMode
    from torch.utils._pytree import tree_flatten

    F = torch.nn.functional
    linear_of = {id(m.weight): pattern_of(p, block_lists) for p, m in model.named_modules()
                 if isinstance(m, torch.nn.Linear) or pointwise_conv(m)}
    products = {F.linear, F.conv1d, F.conv2d, F.conv3d}  # a pointwise conv is a Linear over its channels
    matmuls = {torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.bmm, torch.Tensor.bmm}
    attention_modules = {p for p, m in model.named_modules() if isinstance(getattr(m, "heads", None), int)}
    stack: list[str] = []
    #: per attention (pattern) that computes without F.scaled_dot_product_attention: the own q/k/v Linears each of
    #: its matmuls reads, in order (a linear attention's first reads k and v only)
    kernels: dict[str, list[frozenset[str]]] = defaultdict(list)
    masked: set[str] = set()  # attentions (patterns) called with an attn_mask

    def enter(path: str) -> Callable:
        def hook(module, args) -> None:  # a hook that returns something replaces the inputs or output
            stack.append(path)
        return hook

    def leave(module, args, output) -> None:
        path = stack.pop()
        label = rms_inputs.pop(path, None)
        norm = pattern_of(path, block_lists)
        if label is not None and ".*" in norm and torch.is_tensor(output) and output.dim() \
                and output.shape[-1] == hidden and not in_attention() \
                and not any(isinstance(m, torch.nn.Linear) for m in module.modules()):
            residual.update(linears(label))  # an RMS norm of a residual stream (see the module's docstring)
            rms_norms.add(norm)
            tag(output, frozenset({f"norm:{norm}|{stream_of(tuple(output.shape))}"}))

    for path, module in model.named_modules():
        module.register_forward_pre_hook(enter(path))
        module.register_forward_hook(leave)
    reads: dict[str, set[str]] = defaultdict(set)
    order: list[str] = []
    feeds: dict[str, str] = {}
    residual: set[str] = set()
    modulations: dict[str, dict[str, Modulation]] = defaultdict(dict)
    norms = {F.layer_norm, F.group_norm, getattr(F, "rms_norm", F.layer_norm)}
    #: module path -> what reached the last-dim mean it runs over a hidden-wide tensor (an RMS norm's, until it returns)
    rms_inputs: dict[str, frozenset] = {}
    rms_norms: set[str] = set()
    joins: dict[tuple[str, str], Join] = {}
    qk_norms: dict[str, QkNorm] = {}
    rotary: dict[str, str] = {}
    rotary_joint: set[str] = set()  # Linears whose outputs are rotated after joining the streams
    rotary_part: set[str] = set()  # Linears whose outputs are rotated on part of their tokens
    written_back: set[str] = set()  # of those, the ones whose rotated part is written back in place (CogVideoX)
    made: dict[str, int] = {}  # Linear -> the tokens of its (first) output, [batch, tokens, features]; 0: other
    multiplies = {torch.mul, torch.Tensor.mul, torch.Tensor.__mul__, torch.Tensor.__rmul__}
    means = {torch.mean, torch.Tensor.mean}

    def in_attention() -> bool:
        return any(p in attention_modules for p in stack)

    def record_attention_edges(func, args, kwargs, incoming: list[frozenset]) -> None:
        """q/k norms and rotary embeddings inside an attention (see the module's docstring), for the Linears of the
        innermost attention running."""
        owner = next((p for p in reversed(stack) if p in attention_modules), None)
        if not incoming or owner is None:
            return
        prefix = pattern_of(owner, block_lists) + "."

        def own(label: frozenset) -> set[str]:
            return {name for name in linears(label) if name.startswith(prefix)}

        first = tree_flatten(args)[0][:1]
        if (func in norms or (func in means and _last_dim(args, kwargs))) and first and torch.is_tensor(first[0]):
            where = pattern_of(stack[-1], block_lists)
            for name in own(incoming[0]):
                qk_norms.setdefault(name, QkNorm(where, int(first[0].shape[-1])))
        if func in multiplies:
            tensors = [t for t in tree_flatten(args)[0] if torch.is_tensor(t)]
            labels = tags(args)
            if len(tensors) == 2 and tensors[0].dim() and tensors[1].dim() \
                    and tensors[0].shape[-1] == tensors[1].shape[-1] > 1:
                for frequencies, rotated in ((0, 1), (1, 0)):
                    t, label = tensors[frequencies], labels[frequencies]
                    if t.dim() >= 2 and not isinstance(t, torch.nn.Parameter) and not any(
                            x.split(":", 1)[0] in ("linear", "norm", "attention") for x in label):
                        mine = own(labels[rotated])
                        for name in mine:
                            rotary.setdefault(name, "whole")
                        tokens = max(t.shape[:-1])
                        if len(mine) > 1 and all(0 < made.get(name, 0) < tokens for name in mine):
                            rotary_joint.update(mine)
                        rotary_part.update(name for name in mine if tokens < made.get(name, 0))
        if func is torch.Tensor.__setitem__ and len(args) == 3 and torch.is_tensor(args[2]) \
                and _strided_last(args[1], args[0].dim()):
            for name in own(tags(args[2])[0] if tags(args[2]) else frozenset()):
                if name in rotary:
                    rotary[name] = "halves"
        elif func is torch.Tensor.__setitem__ and len(args) == 3 and torch.is_tensor(args[2]):
            written_back.update(own(tags(args[2])[0] if tags(args[2]) else frozenset()) & rotary_part)

    #: block path -> the tensors its forward was called with; and its first cut of a joint sequence (where, the
    #: joint tensor, the parts sliced from it), until the block returns
    block_arguments: dict[str, list] = {}
    block_cuts: dict[str, tuple[str, Any, list]] = {}
    #: module path -> (joint tensor, a stream's part sliced from it) for every such slice it made, until the block
    #: it runs in returns (the model's own, under "", stay to the end)
    stream_cuts: dict[str, list] = {}

    def record_join(func, args, kwargs, out) -> None:
        if any(p in attention_modules for p in stack):
            record_attention_join(func, args, kwargs, out)
            return
        path = stack[-1] if stack else ""
        where = pattern_of(path, block_lists)
        if func is torch.cat and torch.is_tensor(out) and out.dim() == 3:
            parts = args[0] if args else kwargs.get("tensors", ())
            dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
            if dim in (1, -2) and stream_of(tuple(out.shape)) == "joint" and len(parts) == 2 and all(
                    stream_of(tuple(t.shape)) in ("text", "image") for t in parts) and (where, "concat") not in joins:
                edge = "start" if all(any(t is a for a in block_arguments.get(path, ())) for t in parts) else ""
                joins[where, "concat"] = Join(where, "concat", int(out.shape[-1]), edge)
        if func is torch.Tensor.__getitem__ and torch.is_tensor(out) and out.dim() == 3 and torch.is_tensor(args[0]):
            if stream_of(tuple(args[0].shape)) == "joint" and stream_of(tuple(out.shape)) in ("text", "image"):
                stream_cuts.setdefault(path, []).append((args[0], out))
            if stream_of(tuple(args[0].shape)) == "joint" and stream_of(tuple(out.shape)) in ("text", "image") \
                    and (where, "split") not in joins:
                joins[where, "split"] = Join(where, "split", int(out.shape[-1]))
                block_cuts[path] = (where, args[0], [out])
            elif path in block_cuts and args[0] is block_cuts[path][1]:
                block_cuts[path][2].append(out)  # another part of the same cut

    def record_attention_join(func, args, kwargs, out) -> None:
        """An attention module's concatenation of the two streams it was called with (not of its q/k/v), unless
        they are parts cut from one tensor, put back together (HunyuanVideo's single blocks cut their norm's output
        and their attention joins the parts again: hunyuan-seq2-model4.yaml agrees with XLA:TPU's program without
        pricing that join)."""
        path = stack[-1] if stack else ""
        if path not in attention_modules or func is not torch.cat or not torch.is_tensor(out) or out.dim() != 3:
            return
        parts = args[0] if args else kwargs.get("tensors", ())
        dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
        where = pattern_of(path, block_lists)
        if dim in (1, -2) and stream_of(tuple(out.shape)) == "joint" and len(parts) == 2 and all(
                stream_of(tuple(t.shape)) in ("text", "image") and any(t is a for a in attention_arguments.get(
                    path, ())) for t in parts) and (where, "concat") not in joins and not rejoins_a_cut(parts):
            joins[where, "concat"] = Join(where, "concat", int(out.shape[-1]))

    def rejoins_a_cut(parts) -> bool:
        """Every part was sliced from one and the same tensor."""
        cuts = [cut for made in stream_cuts.values() for cut in made]
        sources = [next((source for source, part in cuts if part is t), None) for t in parts]
        return sources[0] is not None and all(source is sources[0] for source in sources)

    def arguments_kept(into: dict, path: str) -> Callable:
        """A forward pre-hook keeping the tensors a module is called with in `into`, under its path."""
        def hook(module, args, kwargs) -> None:
            into[path] = [t for t in tree_flatten((args, kwargs))[0] if torch.is_tensor(t)]
        return hook

    def block_left(path: str) -> Callable:
        def hook(module, args, output) -> None:
            """A cut whose parts (every slice of its source) the block returns is at the block's end."""
            returned = [t for t in tree_flatten(output)[0] if torch.is_tensor(t)]
            block_arguments.pop(path, None)
            for inner in [p for p in stream_cuts if p == path or p.startswith(path + ".")]:
                del stream_cuts[inner]
            where, _, parts = block_cuts.pop(path, ("", None, []))
            if len(parts) > 1 and len(parts) == len(returned) and all(any(t is r for r in returned) for t in parts):
                joins[where, "split"] = replace(joins[where, "split"], edge="end")
        return hook

    #: attention module path -> the tensors its forward was called with, until it returns
    attention_arguments: dict[str, list] = {}

    def attention_left(path: str) -> Callable:
        def hook(module, args, output) -> None:
            attention_arguments.pop(path, None)
        return hook

    for path, module in model.named_modules():
        if path.rpartition(".")[0] in block_lists and path.rpartition(".")[2].isdigit():
            module.register_forward_pre_hook(arguments_kept(block_arguments, path), with_kwargs=True)
            module.register_forward_hook(block_left(path))
        if path in attention_modules:
            module.register_forward_pre_hook(arguments_kept(attention_arguments, path), with_kwargs=True)
            module.register_forward_hook(attention_left(path))

    concatenations = {torch.cat, torch.concat, torch.concatenate}
    cuts = {torch.chunk, torch.Tensor.chunk, torch.split, torch.Tensor.split, torch.tensor_split,
            torch.Tensor.tensor_split}
    widths = {pattern_of(p, block_lists): (m.out_features if isinstance(m, torch.nn.Linear) else m.out_channels)
              for p, m in model.named_modules() if isinstance(m, torch.nn.Linear) or pointwise_conv(m)}
    gates: dict[str, int] = {}

    def record_pieces(func, args, kwargs, incoming: list[frozenset], out) -> None:
        """A gated unit (GLU): one Linear's output cut along its features into pieces, two of which are then
        multiplied. Each piece carries (Linear, index, pieces) on ``_meshlab_piece`` through the ops that read it
        alone; a product of two pieces of one Linear records it in `gates`."""
        tensors = [t for t in tree_flatten(args)[0] if torch.is_tensor(t)]
        if func in cuts and tensors and isinstance(out, (tuple, list)) and len(out) > 1:
            own = linears(incoming[0]) if incoming else set()
            dim = args[2] if len(args) > 2 else kwargs.get("dim", 0)
            name = next(iter(own)) if len(own) == 1 else None
            equal = len({piece.shape[dim] for piece in out}) == 1  # a GLU's halves (not q | k | v | mlp)
            if name is not None and isinstance(dim, int) and tensors[0].shape[dim] == widths.get(name) and equal:
                for index, piece in enumerate(out):
                    piece._meshlab_piece = (name, index, len(out))
            return
        if func is torch.Tensor.__getitem__ and tensors and torch.is_tensor(out) and incoming:
            own = linears(incoming[0])  # FLUX.2's SwiGLU: x[..., :half] and x[..., half:]
            name = next(iter(own)) if len(own) == 1 else None
            entries = args[1] if len(args) > 1 and isinstance(args[1], tuple) else (args[1] if len(args) > 1 else None,)
            last = entries[-1] if Ellipsis in entries or len(entries) == tensors[0].dim() else None
            width = widths.get(name)
            if name is not None and isinstance(last, slice) and tensors[0].shape[-1] == width:
                start, stop, step = last.indices(width)
                size = stop - start
                if step == 1 and 0 < size < width and width % size == 0 and start % size == 0:
                    out._meshlab_piece = (name, start // size, width // size)
                return
        pieces = {getattr(t, "_meshlab_piece", None) for t in tensors} - {None}
        if func in multiplies and len(pieces) == 2 and len({p[0] for p in pieces}) == 1:
            name, _, count = next(iter(pieces))
            if all(linears(label) == {name} for label in tags(args)):  # the two pieces alone: hidden x act(gate)
                gates[name] = count
        elif len(pieces) == 1 and torch.is_tensor(out) and len(tensors) == sum(
                hasattr(t, "_meshlab_piece") for t in tensors):  # an op of the piece alone (an activation, a cast)
            out._meshlab_piece = next(iter(pieces))

    def record_parts(args, kwargs, out) -> None:
        """On a concatenation's output: the dim, and each part's [start, stop) along it with its tags."""
        parts = args[0] if args else kwargs.get("tensors", ())
        dim = args[1] if len(args) > 1 else kwargs.get("dim", 0)
        if not torch.is_tensor(out) or not all(torch.is_tensor(t) and t.dim() == out.dim() for t in parts):
            return
        dim = dim % out.dim()
        spans, start = [], 0
        for t in parts:
            spans.append((start, start + t.shape[dim], getattr(t, "_meshlab_from", frozenset())))
            start += t.shape[dim]
        out._meshlab_parts = (dim, tuple(spans))

    def sliced_part(args) -> frozenset | None:
        """The tags of the parts a plain slice of a concatenation's output falls within (None: not such a
        slice)."""
        source, index = args[0], args[1] if len(args) > 1 else None
        parts = getattr(source, "_meshlab_parts", None) if torch.is_tensor(source) else None
        if parts is None:
            return None
        dim, spans = parts
        entries = index if isinstance(index, tuple) else (index,)
        if len(entries) <= dim or not all(isinstance(e, slice) and e == slice(None) for e in entries[:dim]) \
                or not isinstance(entries[dim], slice):
            return None
        try:
            start, stop, step = entries[dim].indices(source.shape[dim])
        except (TypeError, ValueError):  # a bound that is no int (a tensor)
            return None
        if step != 1:
            return None
        within = [label for begin, end, label in spans if begin < stop and start < end]
        return frozenset().union(*within) if within else None

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
            if args and torch.is_tensor(args[0]) and _in_place(func):
                args[0].__dict__.pop("_meshlab_parts", None)  # written in place: its parts are no longer known
            if func in products:
                name = linear_of.get(id(args[1] if len(args) > 1 else kwargs["weight"]))
                if name is not None:
                    if name not in reads:
                        order.append(name)
                    reads[name].update(tags(args[0])[0])
                    made.setdefault(name, out.shape[1] if out.dim() == 3 else 0)
                    tag(out, frozenset({f"linear:{name}"}))
                    return out
            incoming = tags((args, kwargs))
            if func is F.scaled_dot_product_attention:
                owner = next((p for p in reversed(stack) if p in attention_modules), "attention")
                if (args[3] if len(args) > 3 else kwargs.get("attn_mask")) is not None:
                    masked.add(pattern_of(owner, block_lists))
                for name in linears(frozenset().union(*incoming[:3])):
                    feeds[name] = pattern_of(owner, block_lists)
                tag(out, frozenset({f"attention:{pattern_of(owner, block_lists)}"}))
                return out
            if func in matmuls and in_attention():
                owner = next(p for p in reversed(stack) if p in attention_modules)
                where = pattern_of(owner, block_lists)
                everything = frozenset().union(*incoming) if incoming else frozenset()
                own = {name for name in linears(everything) if name.startswith(where + ".")}
                if own or f"attention:{where}" in everything:  # a kernel written as matmuls (SANA's linear attention)
                    kernels[where].append(frozenset(own))
                    for name in own:
                        feeds[name] = where
                    tag(out, frozenset({f"attention:{where}"}))
                    return out
            if func in norms and torch.is_tensor(args[0]) and args[0].shape[-1] == hidden and not any(
                    p in attention_modules for p in stack):  # a q/k norm across heads (Wan) is attention's own
                residual.update(linears(incoming[0]))
                norm = pattern_of(stack[-1] if stack else "norm", block_lists)
                if func is not F.layer_norm and func is not F.group_norm:  # torch's own F.rms_norm
                    rms_norms.add(norm)
                tag(out, frozenset({f"norm:{norm}|{stream_of(tuple(args[0].shape))}"}))
                return out
            if func in means and stack and not in_attention() and torch.is_tensor(args[0]) and args[0].dim() \
                    and args[0].shape[-1] == hidden and _last_dim(args, kwargs):
                rms_inputs.setdefault(stack[-1], incoming[0])
            record_pieces(func, args, kwargs, incoming, out)
            if func in concatenations:
                record_parts(args, kwargs, out)
            else:
                self._modulation(args, incoming)
            record_join(func, args, kwargs, out)
            if func is torch.Tensor.__getitem__ and torch.is_tensor(out):
                part = sliced_part(args)
                if part is not None:
                    tag(out, part)
                    return out
            record_attention_edges(func, args, kwargs, incoming)
            if func is torch.Tensor.__setitem__ and len(args) == 3 and torch.is_tensor(args[0]) \
                    and torch.is_tensor(args[2]):  # the written value's producers join the target's
                tag(args[0], frozenset().union(*tags(args[0]), *tags(args[2])))
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
                            modulations[name].setdefault(norm, Modulation(
                                norm, stream, int(t.shape[-1]), rms=norm in rms_norms,
                                dtype=str(t.dtype).removeprefix("torch.") if dtype and t.dtype != dtype else ""))

    for name, value in inputs.items():
        if torch.is_tensor(value):
            value._meshlab_from = frozenset({f"input:{name}"})
    with torch.no_grad(), Tracer():
        output = model(**inputs, return_dict=False)[0]
    residual.update(linears(getattr(output, "_meshlab_from", frozenset())))
    flows = tuple(
        Flow(module=name, reads=tuple(sorted(reads[name])), attention=feeds.get(name),
             modulates=tuple(sorted(modulations[name].values(), key=lambda m: m.norm)),
             residual=name in residual, qk_norm=qk_norms.get(name), rotary=rotary.get(name, ""),
             gated=gates.get(name, 0), rotary_joint=name in rotary_joint,
             rotary_part=name in rotary_part - written_back)
        for name in order
    )
    return flows, tuple(joins.values()), {where: tuple(reads) for where, reads in kernels.items()}, frozenset(masked)


def pointwise_conv(module: Any) -> bool:
    """A convolution over a 1 x ... x 1 kernel with stride 1 and one group: a Linear applied at every position."""
    import torch

    return (isinstance(module, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Conv3d)) and module.groups == 1
            and all(k == 1 for k in module.kernel_size) and all(s == 1 for s in module.stride))


def _in_place(func) -> bool:
    """An op that writes its first argument: ``x[...] = y``, ``x.add_(y)``, ``x += y``."""
    name = getattr(func, "__name__", "")
    return name == "__setitem__" or (name.endswith("_") and not name.startswith("_")) or (
        name.startswith("__i") and name.endswith("__") and name not in ("__index__", "__init__", "__iter__"))


def _last_dim(args: tuple, kwargs: dict) -> bool:
    """A reduction over the last dim only (``x.mean(-1, keepdim=True)``)."""
    dim = args[1] if len(args) > 1 else kwargs.get("dim")
    dims = tuple(dim) if isinstance(dim, (tuple, list)) else (dim,)
    return len(dims) == 1 and dims[0] in (-1, args[0].dim() - 1 if hasattr(args[0], "dim") else -1)


def _strided_last(index, dims: int) -> bool:
    """An index whose step of 2 or more falls on the last of `dims` dims (``[..., 0::2]``, or one entry per dim)."""
    entries = index if isinstance(index, tuple) else (index,)
    if not entries or (Ellipsis not in entries and len(entries) != dims):
        return False
    last = entries[-1]
    return isinstance(last, slice) and last.step not in (None, 1)
