"""Strategies over the small synthetic card for the cost tests."""

from meshlab.cost.predict import predict
from meshlab.core.hardware import load_hardware
from meshlab.plan.planner import make_plan
from meshlab.strategy.schema import Strategy

from tests.conftest import small_card

LARGEST = [{"match": "*", "min_rank": 2, "shard": "largest", "axis": "model"}]
PAIRS = [
    {"match": "*.attn.to_[qkv].*", "shard": "column", "axis": "model"},
    {"match": "*.attn.add_[qkv]_proj.*", "shard": "column", "axis": "model"},
    {"match": "*.attn.to_out.0.*", "shard": "row", "axis": "model"},
    {"match": "*.attn.to_add_out.*", "shard": "row", "axis": "model"},
    {"match": "*_mlp.net.0.proj.*", "shard": "column", "axis": "model"},
    {"match": "*_mlp.net.2.*", "shard": "row", "axis": "model"},
]


def strategy(**overrides) -> Strategy:
    base = {"name": "t", "model": "small", "hardware": "v6e-8", "mesh": {"data": 2, "model": 4},
            "rules": LARGEST, "activations": {"batch": "data"},
            "workload": {"batch": 2, "height": 64, "width": 64, "text_tokens": 8}}
    base.update(overrides)
    return Strategy.model_validate(base)


def predicted(card=None, **overrides):
    card = card or small_card()
    s = strategy(**overrides)
    return predict(make_plan(s, card, 8), s, load_hardware("v6e-8"))


def forward_flops(card, tokens) -> float:
    """One transformer call's FLOPs on one sample as the cost model counts them (``graph_flops`` over the card's
    folded graph, on a one-chip plan): what the hand counts in the tests are held against."""
    from meshlab.cost.flops import graph_flops
    from meshlab.cost.graph import graph_of
    from meshlab.plan.planner import make_plan

    one_chip = Strategy.model_validate({"name": "one", "model": card.name, "hardware": "v6e-1", "mesh": {"data": 1}})
    return graph_flops(graph_of(make_plan(one_chip, card, 1)), tokens)
