"""Strategies over the small synthetic card for the cost tests."""

from meshlab.cost.predict import predict
from meshlab.hardware import load_hardware
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
