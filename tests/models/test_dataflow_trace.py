"""Rotary embeddings and q/k norms come from what the traced forward does, not from module names."""

import pytest

from meshlab.models.card import QkNorm, load_card

torch = pytest.importorskip("torch")


def flows(card: str) -> dict:
    return {f.module: f for f in load_card(card).dataflow}


def test_wan_rotates_its_self_attention_in_halves_and_normalizes_q_and_k_across_heads():
    wan = flows("wan-2.1-t2v-14b")
    for name in ("to_q", "to_k"):
        assert wan[f"blocks.*.attn1.{name}"].rotary == "halves"
        assert wan[f"blocks.*.attn1.{name}"].qk_norm == QkNorm(f"blocks.*.attn1.norm_{name[-1]}", 5120)
        assert wan[f"blocks.*.attn2.{name}"].rotary == ""  # the cross-attention is not rotated
    assert wan["blocks.*.attn1.to_v"].rotary == "" and wan["blocks.*.attn1.to_v"].qk_norm is None


@pytest.mark.parametrize("card", ["qwen-image", "flux-dev"])
def test_joint_attention_rotates_both_streams_whole_and_normalizes_per_head(card):
    found = flows(card)
    for name in ("to_q", "to_k", "add_q_proj", "add_k_proj"):
        flow = found[f"transformer_blocks.*.attn.{name}"]
        assert flow.rotary == "whole" and flow.qk_norm is not None and flow.qk_norm.width == 128
    assert not any(f.rotary == "halves" for f in found.values())


def test_sd35_has_per_head_norms_and_no_rotary_embeddings():
    found = flows("sd3.5-large")
    assert found["transformer_blocks.*.attn.to_q"].qk_norm.width == 64
    assert not any(f.rotary for f in found.values())


class _Attention(torch.nn.Module):
    """An attention whose modules are named as no diffusers model names them: what the tracer keys on is the
    work (a norm over every head, a multiply by frequencies written into strided slices), not ``to_q``."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.wq, self.wk, self.wv, self.wo = (torch.nn.Linear(width, width) for _ in range(4))
        self.q_ln, self.k_ln = torch.nn.RMSNorm(width), torch.nn.RMSNorm(width)
        self.pre = torch.nn.RMSNorm(width)  # a norm of the attention's input (diffusers' norm_cross): no q/k norm

    def forward(self, x, cos, sin, mask):
        def rotate(t):
            a, b = t.unflatten(-1, (-1, 2)).unbind(-1)
            out = torch.empty_like(t)
            out[..., 0::2] = a * cos - b * sin
            out[..., 1::2] = a * sin + b * cos
            return out

        x = self.pre(x)
        q, k, v = rotate(self.q_ln(self.wq(x))), rotate(self.k_ln(self.wk(x))), self.wv(x) * mask  # a padding mask
        split = lambda t: t.unflatten(-1, (self.heads, -1)).transpose(1, 2)  # noqa: E731
        out = torch.nn.functional.scaled_dot_product_attention(split(q), split(k), split(v))
        return self.wo(out.transpose(1, 2).flatten(2))


class _Model(torch.nn.Module):
    def __init__(self, width: int = 32, heads: int = 4):
        super().__init__()
        self.ff = torch.nn.Linear(width, width)
        self.layers = torch.nn.ModuleList([_Attention(width, heads)])

    def forward(self, hidden_states, cos, sin, mask, return_dict=False):
        hidden_states = hidden_states + self.ff(hidden_states)
        for layer in self.layers:
            hidden_states = hidden_states + layer(hidden_states, cos, sin, mask)
        return (hidden_states,)


def test_the_tracer_finds_rotary_halves_and_a_norm_across_heads_under_any_names_and_nothing_else():
    from meshlab.models.importer.dataflow_trace import trace_dataflow

    torch.manual_seed(0)
    tokens, width = 6, 32
    inputs = {"hidden_states": torch.randn(1, tokens, width), "cos": torch.randn(tokens, width // 2),
              "sin": torch.randn(tokens, width // 2), "mask": torch.ones(1, tokens, 1)}
    found, *_ = trace_dataflow(_Model(width), inputs, {"layers"}, width, lambda shape: "image")
    by_name = {f.module: f for f in found}
    for name, norm in (("wq", "q_ln"), ("wk", "k_ln")):
        assert by_name[f"layers.*.{name}"].rotary == "halves"
        assert by_name[f"layers.*.{name}"].qk_norm == QkNorm(f"layers.*.{norm}", width)
    assert by_name["layers.*.wv"].rotary == "" and by_name["layers.*.wv"].qk_norm is None
    assert by_name["layers.*.wo"].rotary == "" and by_name["layers.*.wq"].attention == "layers.*"
    # the attention's own input norm reads the feed-forward's output: no q/k norm of that Linear
    assert by_name["ff"].qk_norm is None and by_name["ff"].rotary == ""


class _Joined(torch.nn.Module):
    """Two producers joined along the tokens and cut apart again (as Wan I2V's image context and text): each cut
    reads its own part; a slice across both, a Linear of the whole, and a cut after an in-place write read both."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.a, self.b = torch.nn.Linear(width, width), torch.nn.Linear(width, width)
        self.first, self.second, self.across, self.whole, self.after = (torch.nn.Linear(width, width)
                                                                       for _ in range(5))

    def forward(self, x, y, return_dict=False):
        joined = torch.cat([self.a(x), self.b(y)], dim=-2)  # x: 3 tokens, y: 5 tokens
        out = self.first(joined[:, :3]) + 0 * self.second(joined[:, -5:]).sum()
        out = out + self.across(joined[:, 2:4]).sum() + self.whole(joined).sum()
        written = torch.cat([self.a(x), self.b(y)], dim=1)
        written[:, :1] = 0.0
        return (out + self.after(written[:, :3]).sum(),)


def test_a_cut_of_a_concatenation_reads_only_the_parts_it_falls_within():
    from meshlab.models.importer.dataflow_trace import trace_dataflow

    inputs = {"x": torch.randn(1, 3, 8), "y": torch.randn(1, 5, 8)}
    found, *_ = trace_dataflow(_Joined(), inputs, set(), 99, lambda shape: "image")
    reads = {f.module: f.reads for f in found}
    assert reads["first"] == ("linear:a",) and reads["second"] == ("linear:b",)
    assert reads["across"] == reads["whole"] == reads["after"] == ("linear:a", "linear:b")
    assert not any(f.modulates for f in found)  # a concatenation is no modulation


class _Linearized(torch.nn.Module):
    """A linear attention written as matmuls (``relu(K)^T [V; 1]`` first, then the queries, as SANA's processor) and
    a feed-forward of pointwise and depthwise convolutions over the token grid (SANA's GLUMBConv), under names no
    diffusers model uses."""

    def __init__(self, width: int = 8, heads: int = 2):
        super().__init__()
        self.heads = heads
        self.wq, self.wk, self.wv, self.wo = (torch.nn.Linear(width, width) for _ in range(4))
        self.up = torch.nn.Conv2d(width, 4 * width, 1)
        self.spatial = torch.nn.Conv2d(4 * width, 4 * width, 3, padding=1, groups=4 * width)
        self.down = torch.nn.Conv2d(2 * width, width, 1)

    def forward(self, x, grid=(2, 3)):
        q = torch.relu(self.wq(x)).transpose(1, 2).unflatten(1, (self.heads, -1))
        k = torch.relu(self.wk(x)).transpose(1, 2).unflatten(1, (self.heads, -1)).transpose(2, 3)
        v = torch.nn.functional.pad(self.wv(x).transpose(1, 2).unflatten(1, (self.heads, -1)), (0, 0, 0, 1), value=1.0)
        out = torch.matmul(torch.matmul(v, k), q)
        x = x + self.wo((out[:, :, :-1] / out[:, :, -1:]).flatten(1, 2).transpose(1, 2))
        h, gate = self.spatial(self.up(x.unflatten(1, grid).permute(0, 3, 1, 2))).chunk(2, dim=1)
        return x + self.down(h * torch.nn.functional.silu(gate)).flatten(2).transpose(1, 2)


class _LinearModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([_Linearized()])

    def forward(self, hidden_states, return_dict=False):
        return (self.layers[0](hidden_states),)


def test_a_linear_attention_of_matmuls_and_pointwise_convolutions_are_traced_as_attention_and_linears():
    """SANA's self-attention calls no F.scaled_dot_product_attention: its matmuls are the kernel, the first of
    which reads only k and v; its 1x1 convolutions are Linears over the channels, the depthwise 3x3 is neither."""
    from meshlab.models.importer.dataflow_trace import trace_dataflow

    found, _, kernels, _ = trace_dataflow(_LinearModel(), {"hidden_states": torch.randn(1, 6, 8)}, {"layers"}, 8,
                                          lambda shape: "image")
    by_name = {f.module: f for f in found}
    assert {by_name[f"layers.*.{n}"].attention for n in ("wq", "wk", "wv")} == {"layers.*"}
    assert by_name["layers.*.wo"].reads == ("attention:layers.*",)
    assert kernels["layers.*"][0] == frozenset({"layers.*.wk", "layers.*.wv"})  # the state first: no q
    assert kernels["layers.*"][1] == frozenset({"layers.*.wq"})
    assert by_name["layers.*.down"].reads == ("linear:layers.*.up",)  # through the depthwise conv and the gate
    assert "layers.*.spatial" not in by_name
    assert by_name["layers.*.up"].gated == 2  # its output cut in two halves that are multiplied (a GLU)
    assert by_name["layers.*.wq"].gated == by_name["layers.*.wv"].gated == 0  # v's pad and q's relu: no pieces


class _Attend(torch.nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.heads = 2
        self.to_q, self.to_k, self.to_v = (torch.nn.Linear(width, width) for _ in range(3))

    def forward(self, x, mask=None, positional=False):
        q, k, v = (f(x).unflatten(-1, (self.heads, -1)).transpose(1, 2) for f in (self.to_q, self.to_k, self.to_v))
        sdpa = torch.nn.functional.scaled_dot_product_attention
        out = sdpa(q, k, v, mask) if positional else sdpa(q, k, v, attn_mask=mask)
        return x + out.transpose(1, 2).flatten(2)


class _Masked(torch.nn.Module):
    """Two blocks of two self-attentions each; the forward masks the second's, positionally in the second block."""

    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.ModuleDict({"attn1": _Attend(), "attn2": _Attend()})
                                           for _ in range(2)])

    def forward(self, hidden_states, return_dict=False):
        mask = torch.ones(hidden_states.shape[1], hidden_states.shape[1], dtype=torch.bool)
        for i, block in enumerate(self.blocks):
            hidden_states = block["attn2"](block["attn1"](hidden_states), mask, positional=i == 1)
        return (hidden_states,)


def test_the_attentions_the_forward_calls_with_a_mask_are_recorded():
    """An F.scaled_dot_product_attention called with an attn_mask (Qwen-Image's and HunyuanVideo's text padding)
    marks its attention module, by pattern; one called without does not."""
    from meshlab.models.importer.dataflow_trace import trace_dataflow

    *_, masked = trace_dataflow(_Masked(), {"hidden_states": torch.randn(1, 6, 8)}, {"blocks"}, 8,
                                lambda shape: "image")
    assert masked == frozenset({"blocks.*.attn2"})


def _rotate(x, cos, sin):
    return x * cos + torch.flip(x, [-1]) * sin


class _JointAttention(torch.nn.Module):
    """Names no diffusers model uses. q: each stream's projection, joined, then rotated over the joint tokens (Flux's
    double blocks); k: one projection of the joint sequence, its image tokens rotated and the text's joined back
    (HunyuanVideo's single blocks); a second q rotated on its image tokens and written back in place (CogVideoX);
    and a sum of two projections of the image rotated over the image's tokens, no join."""

    heads = 2

    def __init__(self, width: int):
        super().__init__()
        self.q_image, self.q_text, self.k_joint, self.q_written, self.a, self.b = (
            torch.nn.Linear(width, width) for _ in range(6))

    def forward(self, image, text, cos, sin, cos_image, sin_image):
        n = image.shape[1]
        q = _rotate(torch.cat([self.q_image(image), self.q_text(text)], dim=1), cos, sin)
        k = self.k_joint(torch.cat([image, text], dim=1))
        k = torch.cat([_rotate(k[:, :n], cos_image, sin_image), k[:, n:]], dim=1)
        written = self.q_written(torch.cat([image, text], dim=1))
        written[:, :n] = _rotate(written[:, :n], cos_image, sin_image)
        summed = _rotate(self.a(image) + self.b(image), cos_image, sin_image)  # two Linears, their own tokens
        return q + k + written + 0 * summed.sum()


class _EdgeBlock(torch.nn.Module):
    """Joins its two arguments first and cuts the result into the two it returns last (Flux's single blocks); with
    `one`, returns the image's part alone."""

    def __init__(self, width: int, one: bool = False):
        super().__init__()
        self.one, self.attn, self.proj = one, _JointAttention(width), torch.nn.Linear(width, width)

    def forward(self, hidden_states, encoder_hidden_states, cos, sin, cos_image, sin_image):
        n = hidden_states.shape[1]
        joint = torch.cat([hidden_states, encoder_hidden_states], dim=1)
        joint = joint + self.proj(self.attn(hidden_states, encoder_hidden_states, cos, sin, cos_image, sin_image))
        image, text = joint[:, :n], joint[:, n:]
        return image if self.one else (image, text)


class _EdgeModel(torch.nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.blocks = torch.nn.ModuleList([_EdgeBlock(width)])
        self.tails = torch.nn.ModuleList([_EdgeBlock(width, one=True)])

    def forward(self, hidden_states, encoder_hidden_states, cos, sin, cos_image, sin_image, return_dict=False):
        for block in self.blocks:  # called by keyword, as Flux calls its blocks
            hidden_states, encoder_hidden_states = block(
                hidden_states=hidden_states, encoder_hidden_states=encoder_hidden_states, cos=cos, sin=sin,
                cos_image=cos_image, sin_image=sin_image)
        for block in self.tails:
            hidden_states = block(hidden_states, encoder_hidden_states, cos, sin, cos_image, sin_image)
        return (hidden_states,)


def test_the_tracer_finds_joined_and_partial_rotations_and_the_joins_at_a_block_s_edges():
    """A rotation over more tokens than each of its Linears made is of the joined streams; over fewer, of a part, but
    only where that part is joined back (not written back in place); a block's join of its own arguments is at its
    start, and a cut is at its end only where the block returns every part of it."""
    from meshlab.models.card import Join
    from meshlab.models.importer.dataflow_trace import trace_dataflow

    torch.manual_seed(0)
    image, text, width = 6, 3, 8
    streams = {image: "image", text: "text", image + text: "joint"}
    inputs = {"hidden_states": torch.randn(1, image, width), "encoder_hidden_states": torch.randn(1, text, width),
              "cos": torch.randn(image + text, width), "sin": torch.randn(image + text, width),
              "cos_image": torch.randn(image, width), "sin_image": torch.randn(image, width)}
    found, joins, _, _ = trace_dataflow(_EdgeModel(width), inputs, {"blocks", "tails"}, width,
                                        lambda shape: streams.get(shape[1], "none"))
    flows = {f.module: f for f in found if f.module.startswith("blocks.")}
    a = "blocks.*.attn"
    assert {m for m, f in flows.items() if f.rotary_joint} == {f"{a}.q_image", f"{a}.q_text"}
    assert {m for m, f in flows.items() if f.rotary_part} == {f"{a}.k_joint"}
    assert flows[f"{a}.q_written"].rotary == "whole" and not flows[f"{a}.q_written"].rotary_part
    assert flows[f"{a}.a"].rotary == flows[f"{a}.b"].rotary == "whole"  # rotated, but neither joined nor in part
    assert set(joins) == {Join("blocks.*", "concat", width, "start"), Join("blocks.*", "split", width, "end"),
                          Join("tails.*", "concat", width, "start"), Join("tails.*", "split", width),
                          # the attention joins the two streams it is called with before k_joint (CogVideoX)
                          Join("blocks.*.attn", "concat", width), Join("tails.*.attn", "concat", width)}


class _RejoiningAttention(torch.nn.Module):
    """Joins the two tensors it is called with, or (`projected`) their projections, 3-D, as a q/k/v join would be
    if it were not 4-D."""

    heads = 2

    def __init__(self, width: int, projected: bool = False):
        super().__init__()
        self.projected = projected
        self.to_qkv, self.add_qkv = torch.nn.Linear(width, width), torch.nn.Linear(width, width)

    def forward(self, image, text):
        if self.projected:
            return torch.cat([self.to_qkv(image), self.add_qkv(text)], dim=1)
        return self.to_qkv(torch.cat([image, text], dim=1))


class _CutBlock(torch.nn.Module):
    """Cuts a joint tensor it made and hands the parts to an attention that joins them again (HunyuanVideo's single
    blocks), or hands it two tensors of its own (`own`, CogVideoX's norm outputs)."""

    def __init__(self, width: int, mode: str):
        super().__init__()
        self.own, self.mode = mode not in ("cut", "two cuts"), mode
        self.attn = _RejoiningAttention(width, projected=mode == "projected")

    def forward(self, hidden_states, encoder_hidden_states):
        n = hidden_states.shape[1]
        if self.own:
            return self.attn(hidden_states * 2, encoder_hidden_states * 2)
        joint = torch.cat([hidden_states, encoder_hidden_states], dim=1) * 2
        other = joint * 3 if self.mode == "two cuts" else joint  # parts of two tensors: a real join
        return self.attn(joint[:, :n], other[:, n:])


class _CutModel(torch.nn.Module):
    def __init__(self, width: int, mode: str):
        super().__init__()
        self.blocks = torch.nn.ModuleList([_CutBlock(width, mode), _CutBlock(width, mode)])

    def forward(self, hidden_states, encoder_hidden_states, return_dict=False):
        return tuple(b(hidden_states, encoder_hidden_states) for b in self.blocks)


@pytest.mark.parametrize("mode", ["cut", "two cuts", "own", "projected"])
def test_an_attention_s_join_of_the_streams_it_is_called_with_is_recorded_unless_it_undoes_a_cut(mode):
    """A join inside an attention of the two tensors it was called with is a join of the streams (recorded in the
    attention), except where they are the parts of a cut the block made: the join restores that tensor (HunyuanVideo
    under seq 2 x model 4 agrees with XLA:TPU's program without pricing it). A join of its projections is the
    attention's own business."""
    from meshlab.models.card import Join
    from meshlab.models.importer.dataflow_trace import trace_dataflow

    image, text, width = 6, 3, 8
    streams = {image: "image", text: "text", image + text: "joint"}
    model = _CutModel(width, mode)
    inputs = {"hidden_states": torch.randn(1, image, width), "encoder_hidden_states": torch.randn(1, text, width)}
    _, joins, _, _ = trace_dataflow(model, inputs, {"blocks"}, width, lambda shape: streams.get(shape[1], "none"))
    assert (Join("blocks.*.attn", "concat", width) in joins) == (mode in ("own", "two cuts"))
    assert (Join("blocks.*", "split", width) in joins) == (mode in ("cut", "two cuts"))
