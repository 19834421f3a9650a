"""Golden files: each built-in strategy's parameter-to-spec map and per-chip bytes, diffed in CI.

The test only reads the golden files. Regenerate them after an intended change, then review the diff:

    python -m tests.test_golden            # every built-in strategy
    python -m tests.test_golden 2d pairs   # some of them
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from meshlab.plan.planned import plan_file
from meshlab.search.try_document import chip_document

from tests.conftest import REPO, STRATEGIES

GOLDEN = REPO / "tests" / "golden"
REGENERATE = "python -m tests.test_golden"


def snapshot(path) -> dict:
    planned = plan_file(path)
    mesh = planned.plan.mesh
    return {
        "parameters": {p.name: [p.spec.to_json(), list(p.shard_shape(mesh))] for p in planned.plan.parameters},
        "per_chip": [chip_document(c) for c in planned.memory.chips],
    }


def render(document: dict) -> str:
    return json.dumps(document, indent=1) + "\n"


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda p: p.stem)
def test_matches_golden(strategy):
    if os.environ.get("MESHLAB_REGEN_GOLDEN"):
        pytest.skip(f"MESHLAB_REGEN_GOLDEN is set: the test no longer writes golden files; run `{REGENERATE}`")
    golden = GOLDEN / f"{strategy.stem}.json"
    expected = json.loads(golden.read_text())  # checked in, written by an earlier run of `main`
    current = snapshot(strategy.relative_to(REPO))
    changed = [n for n in expected["parameters"] if expected["parameters"][n] != current["parameters"].get(n)]
    assert not changed, f"{len(changed)} specs changed, e.g. {changed[:3]} (if intended: `{REGENERATE}`)"
    assert set(current["parameters"]) == set(expected["parameters"])
    assert current["per_chip"] == expected["per_chip"]


def main(argv: list[str]) -> int:
    """Write the golden file of each named built-in strategy (all of them by default)."""
    by_name = {p.stem: p for p in STRATEGIES}
    unknown = [n for n in argv if n not in by_name]
    if unknown:
        print(f"unknown strategies {unknown}; built-in: {sorted(by_name)}", file=sys.stderr)
        return 2
    for name in argv or sorted(by_name):
        path = GOLDEN / f"{name}.json"
        text = render(snapshot(by_name[name]))
        old = path.read_text() if path.exists() else None
        path.write_text(text)
        print(f"{path}: {'unchanged' if old == text else 'written'}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
