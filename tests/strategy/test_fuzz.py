"""Property test: no mutation of a strategy file may crash or hang the loader or the planner.

Whatever the bytes, `plan_file` either returns a plan or raises meshlab's InputError (one line, placed).
"""

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshlab.core.errors import InputError
from meshlab.plan.planned import plan_file

REPO = Path(__file__).resolve().parents[2]
SEEDS = [p.read_bytes() for p in sorted((REPO / "strategies").glob("*.yaml"))]
TOKENS = [b":", b"-", b" ", b"\n", b"*", b"&a", b"[", b"]", b"{", b"}", b"!!", b"'", b'"', b"-1", b"0",
          b"null", b"model", b"data", b"largest", b"\xff", b"\t", b"#", b"99999999999999999999", b"<<"]


@st.composite
def mutated(draw) -> bytes:
    data = bytearray(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(0, len(data)))
        action = draw(st.sampled_from(["insert", "delete", "replace"]))
        token = draw(st.sampled_from(TOKENS) | st.binary(min_size=1, max_size=4))
        if action == "insert":
            data[at:at] = token
        elif action == "delete":
            data[at:at + draw(st.integers(1, 40))] = b""
        else:
            data[at:at + len(token)] = token
    return bytes(data)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=mutated())
def test_mutated_strategies_never_crash(tmp_path, content):
    path = tmp_path / "mutated.yaml"
    path.write_bytes(content)
    try:
        planned = plan_file(path)
    except InputError as error:
        line = error.one_line()
        assert "\n" not in line and line.startswith(str(path))
    else:
        assert planned.plan.parameters
