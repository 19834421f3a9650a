"""Roles from the traced dataflow: what each Linear's output feeds decides the collectives its split implies."""

from __future__ import annotations

from meshlab.cost.graph import graph_of
from meshlab.plan.planned import plan_file as load_plan
from meshlab.search.sweep import pairs_rules

from tests.conftest import REPO


def flux_graph(tmp_path):
    text = (REPO / "strategies" / "2d.yaml").read_text().replace("model: qwen-image", "model: flux-dev")
    (tmp_path / "flux.yaml").write_text(text)
    planned = load_plan(tmp_path / "flux.yaml")
    return planned.plan, {op.module: op for op in graph_of(planned.plan).linears}


def test_flux_single_block_roles_follow_the_trace(tmp_path):
    _, ops = flux_graph(tmp_path)
    s = "single_transformer_blocks.0"
    assert ops[f"{s}.attn.to_q"].source is None  # reads the modulated norm, not proj_out
    assert ops[f"{s}.proj_out"].role == "out" and ops[f"{s}.proj_out"].source == f"{s}.attn"
    assert ops[f"{s}.proj_out"].also == (f"{s}.proj_mlp",)
    assert ops[f"{s}.proj_mlp"].role == "hidden"
    assert (ops[f"{s}.norm.linear"].role, ops[f"{s}.norm.linear"].modulates, ops[f"{s}.norm.linear"].norms) == (
        "chunks", "joint", 1)
    assert (ops["norm_out.linear"].modulates, ops["norm_out.linear"].norms) == ("image", 1)
    assert ops["transformer_blocks.0.norm1_context.linear"].modulates == "text"


def test_sweep_pairs_split_flux_single_proj_out_by_input(tmp_path):
    plan, _ = flux_graph(tmp_path)
    shard = {r.match: r.shard for r in pairs_rules(plan)}
    assert shard["single_transformer_blocks.*.proj_out.*"] == "row"
    assert shard["single_transformer_blocks.*.proj_mlp.*"] == "column"


def test_linears_come_in_forward_order_block_by_block(tmp_path):
    _, ops = flux_graph(tmp_path)
    order = list(ops)
    single = [m for m in order if m.startswith("single_transformer_blocks.0.")]
    assert single == ["single_transformer_blocks.0." + n for n in (
        "norm.linear", "proj_mlp", "attn.to_q", "attn.to_k", "attn.to_v", "proj_out")]
    assert order.index("transformer_blocks.0.ff_context.net.2") < order.index("single_transformer_blocks.0.norm.linear")
