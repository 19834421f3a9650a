"""Golden files: each built-in strategy's parameter-to-spec map and per-chip bytes, diffed in CI.

Regenerate after an intended change with: MESHLAB_REGEN_GOLDEN=1 python -m pytest tests/test_golden.py
"""

import json
import os

import pytest

from meshlab.planning import plan_file
from meshlab.report import chip_document

from tests.conftest import REPO, STRATEGIES

GOLDEN = REPO / "tests" / "golden"


def snapshot(path) -> dict:
    planned = plan_file(path)
    mesh = planned.plan.mesh
    return {
        "parameters": {p.name: [p.spec.to_json(), list(p.shard_shape(mesh))] for p in planned.plan.parameters},
        "per_chip": [chip_document(c) for c in planned.memory.chips],
    }


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda p: p.stem)
def test_matches_golden(strategy):
    golden = GOLDEN / f"{strategy.stem}.json"
    current = snapshot(strategy.relative_to(REPO))
    if os.environ.get("MESHLAB_REGEN_GOLDEN"):
        golden.write_text(json.dumps(current, indent=1) + "\n")
    expected = json.loads(golden.read_text())
    changed = [n for n in expected["parameters"] if expected["parameters"][n] != current["parameters"].get(n)]
    assert not changed, f"{len(changed)} specs changed, e.g. {changed[:3]}"
    assert set(current["parameters"]) == set(expected["parameters"])
    assert current["per_chip"] == expected["per_chip"]
