"""The typed records strategies are read into: conversion, bounds, unions, extras, immutability, the JSON Schema."""

import json
import pickle
import subprocess
import sys
from pathlib import Path
from typing import Optional, Union

import pytest
import yaml

from meshlab.experiments.definition import Experiment
from meshlab.strategy.records import Closed, FieldInvalid, RecordError, field
from meshlab.strategy.schema import HardwareRef, Rule, Strategy, Workload

from tests.conftest import STRATEGIES

REPO = Path(__file__).resolve().parents[2]


class Inner(Closed):
    """An inner record."""

    size: int = field(ge=1, le=8, description="a size")
    tags: list[str] = field(factory=list, max_length=2)


class Outer(Closed):
    """An outer record."""

    name: str = field(min_length=1)
    inner: Inner = field(factory=lambda: Inner(size=1))
    pick: Union[bool, list[Inner]] = False
    maybe: Optional[int] = None

    def _check(self) -> None:
        if self.name == "bad":
            raise FieldInvalid("name", "not that name")
        if self.name == "worse":
            raise ValueError("the record as a whole")


def problems(data) -> list[tuple[tuple, str, str]]:
    with pytest.raises(RecordError) as info:
        Outer.model_validate(data)
    return [(e["loc"], e["type"], e["msg"]) for e in info.value.errors()]


def test_defaults_and_nested_records_from_data():
    outer = Outer.model_validate({"name": "a", "inner": {"size": 3}})
    assert outer == Outer(name="a", inner=Inner(size=3))
    assert outer.inner.tags == [] and outer.pick is False and outer.maybe is None
    assert Outer(name="b").inner is not Outer(name="c").inner  # a factory makes a fresh default each time


@pytest.mark.parametrize("value, expected", [(3, 3), (3.0, 3), ("3", 3), (" 4 ", 4)])
def test_an_int_accepts_what_a_yaml_author_means(value, expected):
    assert Inner.model_validate({"size": value}).size == expected


@pytest.mark.parametrize("value", [True, 3.5, "three", None, [3]])
def test_an_int_refuses_the_rest(value):
    with pytest.raises(RecordError) as info:
        Inner.model_validate({"size": value})
    assert info.value.errors()[0]["loc"] == ("size",)


def test_bools_and_strings():
    assert Outer.model_validate({"name": "a", "pick": "yes"}).pick is True
    assert Outer.model_validate({"name": "a", "pick": 0}).pick is False
    [(loc, kind, _)] = problems({"name": 7})
    assert (loc, kind) == (("name",), "string_type")  # a number is not a string


def test_bounds_are_checked_with_the_limit_named():
    assert problems({"name": "a", "inner": {"size": 9}}) == [
        (("inner", "size"), "value_error", "Input should be less than or equal to 8")]
    assert problems({"name": ""})[0][2] == "String should have at least 1 character"
    assert "at most 2 items" in problems({"name": "a", "inner": {"size": 1, "tags": ["x", "y", "z"]}})[0][2]


def test_missing_and_unknown_keys_every_problem_placed():
    found = problems({"inner": {"sise": 2}, "colour": "red"})
    assert (("inner", "sise"), "extra_forbidden", "Extra inputs are not permitted") in found
    assert (("inner", "size"), "missing", "Field required") in found
    assert (("colour",), "extra_forbidden", "Extra inputs are not permitted") in found
    assert (("name",), "missing", "Field required") in found


def test_a_union_reports_the_member_that_got_furthest():
    # a list of records whose second item is wrong: the item's own problem, not "should be a boolean"
    assert problems({"name": "a", "pick": [{"size": 1}, {"size": 0}]}) == [
        (("pick", 1, "size"), "value_error", "Input should be greater than or equal to 1")]
    [(loc, kind, message)] = problems({"name": "a", "pick": "perhaps"})
    assert loc == ("pick",) and kind == "union_error"
    assert message == "Input should be true or false or a list"


def test_checks_place_their_problem():
    assert problems({"name": "bad"}) == [(("name",), "value_error", "not that name")]
    assert problems({"name": "worse"}) == [((), "value_error", "the record as a whole")]


def test_records_are_immutable_values():
    outer = Outer(name="a")
    with pytest.raises(AttributeError, match="immutable"):
        outer.name = "b"
    assert outer == Outer(name="a") and outer != Outer(name="b")
    assert {Workload(): "hashable"}[Workload()] == "hashable"  # a record of scalars can be a key
    assert pickle.loads(pickle.dumps(outer)) == outer
    assert repr(Inner(size=2)) == "Inner(size=2, tags=[])"


def test_model_copy_validates_the_new_values():
    outer = Outer(name="a")
    assert outer.model_copy(update={"maybe": 5}).maybe == 5 and outer.maybe is None
    with pytest.raises(RecordError):
        outer.model_copy(update={"inner": Inner(size=2), "name": ""})
    with pytest.raises(TypeError, match="no keyword 'nmae'"):
        Outer(name="a", nmae="b")
    with pytest.raises(TypeError, match="needs the keyword 'name'"):
        Outer()


def test_hardware_overrides_are_kept_and_dumped_back():
    ref = HardwareRef.model_validate({"name": "h100", "attention_kernel": "fa3"})
    assert ref.extra == {"attention_kernel": "fa3"} and ref.field_names() == ["name"]
    assert ref.model_dump() == {"name": "h100", "attention_kernel": "fa3"}


@pytest.mark.parametrize("path", STRATEGIES, ids=lambda p: p.stem)
def test_every_built_in_strategy_survives_a_round_trip(path):
    strategy = Strategy.model_validate(yaml.safe_load(path.read_text()))
    dumped = strategy.model_dump()
    assert Strategy.model_validate(dumped) == strategy
    assert json.loads(json.dumps(dumped)) == dumped  # plain JSON data


def test_exclude_none_drops_unset_fields_but_not_list_items():
    rule = Rule(match="*", shard=[None, "model"])
    assert rule.model_dump(exclude_none=True) == {"match": "*", "shard": [None, "model"], "min_rank": 0}


def test_construction_validates_like_loading():
    with pytest.raises(RecordError, match="greater than or equal to 16"):
        Workload(height=8)
    with pytest.raises(RecordError, match="needs `axis"):
        Rule(match="*", shard="largest")


def test_json_schema_matches_the_records():
    schema = Outer.model_json_schema()
    assert schema["required"] == ["name"] and schema["additionalProperties"] is False
    inner = schema["properties"]["inner"]
    assert inner["properties"]["size"] == {"type": "integer", "description": "a size", "minimum": 1, "maximum": 8}
    assert inner["properties"]["tags"]["maxItems"] == 2 and schema["properties"]["name"]["minLength"] == 1
    assert schema["properties"]["inner"]["default"] == {"size": 1, "tags": []}
    assert Experiment.model_json_schema()["properties"]["workloads"]["default"] == [
        {"height": None, "width": None, "steps": None, "batch": None, "cfg": None}]


def test_try_imports_neither_pydantic_nor_torch():
    code = ("import sys, io, contextlib\n"
            "from meshlab.cli.app import main\n"
            "sys.argv = ['meshlab', 'try', 'strategies/2d.yaml']\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n        main()\n    except SystemExit as exc:\n        assert exc.code in (0, None), exc.code\n"
            "print(sorted(m for m in ('pydantic', 'torch', 'numpy') if m in sys.modules))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


def test_a_pattern_must_match_the_whole_string():
    # Python's `$` also matches before a final newline; an axis name may not end in one
    assert Strategy.model_validate({"name": "a", "model": "q", "hardware": "v6e-8", "mesh": {"model": 8}})
    with pytest.raises(RecordError, match="a mesh axis name"):
        Strategy.model_validate({"name": "a", "model": "q", "hardware": "v6e-8", "mesh": {"model\n": 8}})


@pytest.mark.parametrize("value", ["9" * 5000, "１０２４", "١٠٢٤"])
def test_only_short_ascii_digit_strings_are_ints(value):
    with pytest.raises(RecordError, match="integer"):  # not Python's ValueError past its 4300-digit limit
        Inner.model_validate({"size": value})


def test_an_undescribed_record_field_is_described_by_its_record():
    assert Strategy.field_description("workload") == "what one generation asks of the model"
    assert Workload.field_metadata("batch")["le"] == 4096


def test_optional_string_bounds_are_string_bounds_in_the_schema():
    class Named(Closed):
        label: Optional[str] = field(None, max_length=5)

    assert Named.model_json_schema()["properties"]["label"]["maxLength"] == 5
