"""SANA 1600M (issue 26, part 5): a linear self-attention and a convolutional MLP, read from the shipped card (pure,
no torch), priced by hand, held against torch's own count of a real forward, and planned under the layouts that
split its tokens."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from meshlab.cli.app import app
from meshlab.core.errors import PlanError
from meshlab.cost.flops import linear_flops
from meshlab.models.card import load_card
from meshlab.plan.tokens import TokenCounts
from meshlab.strategy.schema import Strategy

from tests.cost.helpers import forward_flops

runner = CliRunner()
WIDTH, HEADS, HEAD_DIM, MLP, LAYERS = 2240, 70, 32, 5600, 20


def sana_strategy(mesh: dict, activations: dict | None = None, **workload) -> Strategy:
    return Strategy.model_validate({
        "name": "sana", "model": "sana-1600m", "hardware": "h100", "mesh": mesh,
        "rules": [{"match": "*", "min_rank": 2, "shard": "largest", "axis": "model"}] if "model" in mesh else [],
        "activations": activations or {"batch": "data"} if "data" in mesh else activations or {},
        "workload": {"height": 1024, "width": 1024, "batch": 2, "steps": 20, "cfg": True, "text_tokens": 300,
                     **workload}})


def test_the_self_attention_is_linear_the_cross_attention_softmax_and_the_mlp_convolutions():
    card = load_card("sana-1600m")
    kinds = {a.module.split(".")[-1]: a.kind for a in card.attention if a.module.startswith("transformer_blocks.0.")}
    assert kinds == {"attn1": "linear", "attn2": "softmax"}
    block = "transformer_blocks.0.ff."
    assert {block + "conv_inverted", block + "conv_point", "patch_embed.proj"} <= card.linear_modules
    assert block + "conv_depth" not in card.linear_modules  # a depthwise 3x3: not a Linear
    params = {p.name: p for p in card.parameters}
    assert params[block + "conv_depth.weight"].shape == (2 * MLP, 1, 3, 3)
    assert params[block + "conv_depth.weight"].stream == params[block + "conv_inverted.weight"].stream == "image"
    assert card.architecture.vae_scale_factor == 32 and card.architecture.mlp_ratio == 5.0  # GLU: 2 x 2.5


def test_flops_count_the_linear_attention_and_the_convolutions_by_hand():
    """One forward, one sample, 1024 image and 300 text tokens: the Linears, the state and its product with the
    queries (2 x 2 x N x d x (d + 1) per head), the cross-attention, the depthwise 3x3 (2 x 9 per channel)."""
    n, t, d = 1024, 300, HEAD_DIM
    block = (4 * linear_flops(WIDTH, WIDTH, n)  # attn1's q, k, v and out
             + 2 * linear_flops(WIDTH, WIDTH, n) + 2 * linear_flops(WIDTH, WIDTH, t)  # attn2: q, out; k, v
             + linear_flops(WIDTH, 2 * MLP, n) + linear_flops(MLP, WIDTH, n)  # the 1x1 convolutions
             + 2.0 * 9 * 2 * MLP * n  # the depthwise 3x3
             + 4.0 * n * d * (d + 1) * HEADS  # the linear attention
             + 4.0 * n * t * 112 * 20)  # the cross-attention: 20 heads of 112
    outside = (linear_flops(32, WIDTH, n) + linear_flops(WIDTH, 32, n)  # patch embedding (1x1), proj_out
               + linear_flops(2304, WIDTH, t) + linear_flops(WIDTH, WIDTH, t)  # the caption projection
               + linear_flops(256, WIDTH, 1) + linear_flops(WIDTH, WIDTH, 1) + linear_flops(WIDTH, 6 * WIDTH, 1))
    assert forward_flops(load_card("sana-1600m"), TokenCounts(n, t)) == pytest.approx(LAYERS * block + outside,
                                                                                      rel=1e-12)


def test_a_block_holds_no_scores_and_grows_linearly_with_the_image():
    """Without flash attention a softmax self-attention's peak grows with the square of the tokens; SANA's holds no
    scores, and its cross-attention's are text-long: at 1024, 2048 and 3072 image tokens the block's peak grows by
    the same bytes each step (the text's share is the constant)."""
    from meshlab.plan.memory import block_activation_bytes
    from meshlab.plan.planner import make_plan
    from meshlab.plan.tokens import token_counts

    card = load_card("sana-1600m")
    peaks = []
    for width in (1024, 2048, 3072):
        strategy = sana_strategy({"data": 1}, width=width, flash_attention=False, batch=1)
        tokens = token_counts(strategy.workload, card.architecture)
        peaks.append(block_activation_bytes(make_plan(strategy, card, 1), strategy, tokens))
    assert peaks[2] - peaks[1] == peaks[1] - peaks[0] > 0


def test_the_linear_attention_holds_float32_copies_of_q_k_v_and_its_output_and_no_keys_of_other_chips():
    """attn1 on one chip at 1024 tokens: q, k and v (2240 wide each), their float32 copies (two bf16 elements
    each; v's padded with a row of ones a head, as diffusers pads it after the cast), and the float32 output of
    head_dim + 1 rows per head; no scores, no gathered keys."""
    from meshlab.plan.memory import _attention_elements, _Shape
    from meshlab.plan.planner import make_plan
    from meshlab.plan.tokens import token_counts

    card = load_card("sana-1600m")
    strategy = sana_strategy({"data": 1}, batch=1, flash_attention=False)
    plan = make_plan(strategy, card, 1)
    tokens = token_counts(strategy.workload, card.architecture)
    weights = {p.parameter.module: p for p in plan.parameters
               if p.parameter.module in card.linear_modules and not p.parameter.is_bias and p.parameter.block == 0}
    attn1 = next(a for a in card.attention if a.module == "transformer_blocks.0.attn1")
    n = 1024
    got = _attention_elements(attn1, weights, plan, _Shape(tokens, tokens, frozenset(), False, itemsize=2))
    assert got == 3 * n * WIDTH * (1 + 2) + 2 * n * HEADS + 2 * n * HEADS * (HEAD_DIM + 1)


def test_pairs_split_the_pointwise_convolutions_as_the_linears_they_are():
    """`--rules pairs` reads column/row from the graph, where SANA's 1x1 convolutions are Linears: conv_inverted
    column ([out, in, 1, 1] split on out), conv_point row; the kernel dims stay whole."""
    from meshlab.plan.planner import make_plan
    from meshlab.search.sweep import pairs_rules

    card = load_card("sana-1600m")
    base = sana_strategy({"data": 4, "model": 2})
    rules = [r.model_dump(exclude_none=True) for r in pairs_rules(make_plan(base, card, 8))]
    pairs = Strategy.model_validate({**base.model_dump(exclude_none=True), "rules": rules})
    specs = {p.name: p.spec.entries for p in make_plan(pairs, card, 8).parameters}
    assert specs["transformer_blocks.0.ff.conv_inverted.weight"] == (("model",), None, None, None)
    assert specs["transformer_blocks.0.ff.conv_inverted.bias"] == (("model",),)
    assert specs["transformer_blocks.0.ff.conv_point.weight"] == (None, ("model",), None, None)
    result = runner.invoke(app, ["try", "--model", "sana-1600m", "--hardware", "v6e-8", "--mesh", "data=4,model=2",
                                 "--rules", "pairs"])
    assert result.exit_code == 0, result.output


def _collectives(strategy: Strategy):
    from meshlab.cost.predict import predict
    from meshlab.core.hardware import load_hardware
    from meshlab.plan.planner import make_plan

    card = load_card("sana-1600m")
    plan = make_plan(strategy, card, 8)
    return [c for c in predict(plan, strategy, load_hardware("h100")).collectives if c.block == 0]


def test_a_sequence_split_sums_the_linear_attentions_state_and_passes_the_convolutions_rows():
    """Tokens over seq (2): each block all-reduces attn1's state, 70 heads x 33 x 32 float32 per sample (heads
    split over model: 35), gathers no keys, and its depthwise 3x3 receives a row of 32 tokens from each neighbour at
    its chip's channels."""
    found = _collectives(sana_strategy({"data": 2, "seq": 2, "model": 2}, {"batch": "data", "sequence": "seq"}))
    state = [c for c in found if c.phase == "attention:state"]
    assert [(c.kind, c.axes, c.bytes) for c in state] == [("all-reduce", ("seq",), 1 * 35 * 33 * 32 * 4)]
    assert not [c for c in found if c.phase == "attention:kv"]
    halo = [c for c in found if c.phase.endswith(":halo")]
    row = 1 * 1 * 32 * (2 * MLP // 2) * 2  # a sample, a row of 32 tokens, the chip's 5600 channels, bf16
    assert [(c.kind, c.bytes) for c in halo] == [("collective-permute", row)] * 2
    whole = _collectives(sana_strategy({"data": 4, "model": 2}))
    assert not [c for c in whole if c.phase == "attention:state" or c.phase.endswith(":halo")]


def test_a_tools_ring_over_the_linear_attention_is_refused():
    from meshlab.plan.planner import make_plan

    strategy = sana_strategy({"data": 4, "ring": 2}, {"batch": "data", "sequence": "ring",
                                                      "sequence_parallel": "xdit"})
    with pytest.raises(PlanError, match="linear") as raised:
        make_plan(strategy, load_card("sana-1600m"), 8)
    assert raised.value.field == ("activations", "sequence_parallel")


def test_the_default_pipeline_plans_end_to_end_and_exports_for_xla_but_not_diffusers_context_parallel(tmp_path):
    result = runner.invoke(app, ["try", "--model", "sana-1600m", "--hardware", "h100:1", "--json"])
    assert result.exit_code == 0, result.output
    path = tmp_path / "seq.yaml"
    path.write_text("name: s\nmodel: sana-1600m\nhardware: h100\nmesh: {seq: 8}\n"
                    "activations:\n  sequence: seq\n  rules:\n    - point: block.input\n      spec: [null, seq, null]\n"
                    "workload: {height: 1024, width: 1024, batch: 1, steps: 20, cfg: true, text_tokens: 300}\n")
    refused = runner.invoke(app, ["export", str(path), "--format", "diffusers"])
    assert refused.exit_code == 2 and "_cp_plan" in refused.output and "Traceback" not in refused.output
    assert runner.invoke(app, ["export", str(path), "--format", "torch-xla"]).exit_code == 0


@pytest.mark.xla
@pytest.mark.parametrize("grid", [(32, 32), (64, 64)])
def test_flops_match_torchs_count_of_a_forward(grid):
    """The card's FLOPs against torch's FlopCounterMode over one forward of SanaTransformer2DModel (two blocks, on
    ``meta``) at 1024 and 2048 px: the linear attention's two matmuls, every convolution, every Linear."""
    pytest.importorskip("diffusers")
    import diffusers
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from meshlab.models.families import Geometry
    from meshlab.models.importer.forward_inputs import forward_inputs
    from meshlab.models.truncate import truncate_card

    card = load_card("sana-1600m")
    config, geometry = card.source["config"], Geometry(1, grid, 300)
    cls = diffusers.SanaTransformer2DModel
    with torch.device("meta"):
        model = cls.from_config({**config, "num_layers": 2}).eval()
        inputs = forward_inputs(cls, config, geometry, torch.bfloat16, None)
        torch.nn.Module.to(model, torch.bfloat16)
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(**inputs)
    ours = forward_flops(truncate_card(card, 2), TokenCounts(geometry.image_tokens, geometry.text_tokens))
    assert ours == pytest.approx(counter.get_total_flops(), rel=0.02)
