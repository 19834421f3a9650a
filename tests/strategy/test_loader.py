"""Loading strategy files: every failure is one located, fixable InputError."""

import pytest

from meshlab.core.errors import InputError
from meshlab.strategy.loader import load_strategy

GOOD = """\
name: t
model: qwen-image
hardware: v6e-8
mesh:
  data: 2
  model: 4
rules:
  - match: "*"
    shard: largest
    axis: model
"""


def error_of(path) -> InputError:
    with pytest.raises(InputError) as info:
        load_strategy(path)
    return info.value


def test_good_file_loads_with_defaults(write_strategy):
    loaded = load_strategy(write_strategy(GOOD))
    strategy = loaded.strategy
    assert list(strategy.mesh.items()) == [("data", 2), ("model", 4)]
    assert strategy.workload.height == 1024 and strategy.placement.text_encoder == "cpu"
    assert loaded.document.locate(("rules", 0, "axis")).line == 10


def test_unknown_key_names_line_and_valid_keys(write_strategy):
    error = error_of(write_strategy(GOOD.replace("    axis: model", "    axis: model\n    axes: data")))
    assert (error.location.line, error.location.column) == (11, 5)
    assert "unknown key 'axes' in rules[0]" in error.problem and "match, regex, shard, axis" in error.fix


def test_wrong_type_and_bad_literal(write_strategy):
    error = error_of(write_strategy(GOOD.replace("data: 2", "data: two")))
    assert error.location.line == 5 and "mesh.data" in error.problem
    error = error_of(write_strategy(GOOD.replace("shard: largest", "shard: biggest")))
    assert error.location.line == 9 and "rules[0].shard" in error.problem


def test_missing_field_and_rule_without_axis(write_strategy):
    error = error_of(write_strategy(GOOD.replace("model: qwen-image\n", "")))
    assert "model is missing" in error.problem and "add `model:`" in error.fix
    error = error_of(write_strategy(GOOD.replace("    axis: model\n", "")))
    assert "needs `axis" in error.problem and error.location.line == 8


def test_invalid_regex_is_located(write_strategy):
    error = error_of(write_strategy(GOOD.replace('match: "*"', 'regex: "(["')))
    assert "invalid regex" in error.problem and error.location.line == 8


@pytest.mark.parametrize(
    "content, message",
    [(b"", "empty"), (b"name: [unclosed\n", "invalid YAML"), (b"- a\n- b\n", "mapping"),
     (b"name: t\xff\n", "UTF-8"), (b"a: 1\na: 2\n", "duplicate key"),
     (b"!!python/object:os.system {}\n", "unsupported YAML"), (b"a: !!binary aGVsbG8=\n", "unsupported"),
     (b"base: &b {x: 1}\nmore:\n  <<: *b\n", "merge keys"), (b"name: a\x00b\n", "U+0000")],
)
def test_bad_documents(tmp_path, content, message):
    path = tmp_path / "bad.yaml"
    path.write_bytes(content)
    error = error_of(path)
    assert message in error.problem and error.location.file == str(path)


def test_utf8_error_points_at_the_byte(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_bytes(b"name: t\nmodel: q\xc3(\n")
    assert (error_of(path).location.line, error_of(path).location.column) == (2, 9)


def test_missing_file_and_directory(tmp_path):
    assert "no such file" in error_of(tmp_path / "nope.yaml").problem
    assert "directory" in error_of(tmp_path).problem


def test_alias_bomb_is_refused_quickly(tmp_path):
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [*a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}, *a{i-1}]"
              for i in range(1, 9)]
    path = tmp_path / "bomb.yaml"
    path.write_text("\n".join(lines) + "\n")
    assert "expands to more than" in error_of(path).problem


def test_ten_thousand_levels_are_one_line_not_a_recursion_error(tmp_path):
    from typer.testing import CliRunner

    from meshlab.cli.app import app

    deep = tmp_path / "deep.yaml"
    deep.write_text("name: t\nmodel: qwen-image\nhardware: v6e-8\nmesh: " + "[" * 10_000 + "\n")
    result = CliRunner().invoke(app, ["try", str(deep)])
    assert result.exit_code == 2 and "Traceback" not in result.output
    [line] = result.stderr.strip().splitlines()
    assert line == f"meshlab: error: {deep}:4:38: nesting deeper than 32 levels; a strategy is a few levels deep"


def test_deep_nesting_and_huge_files_are_refused(tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("a: " + "[" * 100 + "]" * 100 + "\n")
    assert "nesting deeper" in error_of(deep).problem
    huge = tmp_path / "huge.yaml"
    huge.write_text("# " + "x" * (2 << 20) + "\n")
    assert "larger than" in error_of(huge).problem


@pytest.mark.parametrize("change, message", [
    (("height: 1024", "height: " + "9" * 5000), "unreadable YAML value: Exceeds the limit"),
    (("axis: model", "axis: []"), "shard: largest needs `axis"),
    (("hardware: v6e-8", "hardware: v6e-8\ncompile:\n  libtpu_flags: [xla_tpu_foo=1]"),
     "compile.libtpu_flags: 'xla_tpu_foo=1' is not a libtpu flag: write --name or --name=value"),
    (("hardware: v6e-8", "hardware: v6e-8\ncompile:\n  libtpu_flags: ['--a=1 --b=2']"), "one flag per item"),
])
def test_edge_values_are_one_located_error(write_strategy, change, message):
    text = GOOD.replace("hardware: v6e-8", "hardware: v6e-8\nworkload:\n  height: 1024")
    error = error_of(write_strategy(text.replace(*change)))
    assert message in error.problem and error.location.line is not None


def test_a_hardware_override_too_large_for_a_float_is_input(write_strategy):
    from meshlab.plan.planned import plan_file

    path = write_strategy(GOOD.replace("hardware: v6e-8", "hardware: {name: v6e-8, chips: 1" + "0" * 400 + "}"))
    with pytest.raises(InputError, match="hardware override chips: 1000.* is too large a number"):
        plan_file(path)


def test_an_experiment_needs_a_workload(tmp_path):
    from meshlab.experiments.definition import load_experiment

    (tmp_path / "a.yaml").write_text(GOOD)
    path = tmp_path / "e.yaml"
    path.write_text("name: e\nstrategies: [a.yaml]\ncheckpoint: tiny\nworkloads: []\n")
    with pytest.raises(InputError, match="workloads: List should have at least 1 item"):
        load_experiment(path)
    path.write_text("name: e\nstrategies: [a.yaml]\ncheckpoint: tiny\nworkloads: [{height: tall}]\n")
    with pytest.raises(InputError, match=r"workloads\[0\].height: Input should be a valid integer, unable to parse "
                       "string as an integer; see experiments/"):
        load_experiment(path)
