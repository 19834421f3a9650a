"""Checked facts about Qwen-Image (shared/reference/qwen-image.md), reproduced from the shipped card."""

import pytest

from meshlab.models.card import load_card
from meshlab.plan.planner import make_plan
from meshlab.strategy.schema import Strategy

from tests.conftest import REPO

GIB = 2**30


def weights_per_chip(mesh: dict, rules: list) -> float:
    strategy = Strategy.model_validate({"name": "fact", "model": "qwen-image", "hardware": "v6e-8", "mesh": mesh,
                                        "rules": rules})
    plan = make_plan(strategy, load_card("qwen-image"), 8)
    return sum(p.bytes_per_device(plan.mesh) for p in plan.parameters) / GIB


def test_parameter_count_and_bytes():
    card = load_card("qwen-image")
    assert card.total_params == 20_430_401_088
    assert round(sum(p.bytes for p in card.parameters) / GIB, 2) == 38.05


@pytest.mark.parametrize("data, model, expected", [(8, 1, 38.05), (4, 2, 19.03), (2, 4, 9.52), (1, 8, 4.77)])
def test_largest_dim_weights_per_chip(data, model, expected):
    rules = [{"match": "*", "min_rank": 2, "shard": "largest", "axis": "model"}]
    assert round(weights_per_chip({"data": data, "model": model}, rules), 2) == expected


def test_replicated_does_not_fit_a_v6e_chip():
    from meshlab.plan.planned import plan_file

    planned = plan_file(REPO / "strategies" / "data.yaml")
    assert not planned.memory.fits
    assert planned.memory.most_loaded.weights / GIB > planned.hardware.usable_hbm_bytes / GIB == 31.25
