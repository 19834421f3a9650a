"""The strategy schema as pydantic models: what a YAML author may write, bounds, overrides, immutability, copies."""

import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from meshlab.experiments.definition import Experiment
from meshlab.strategy.schema import Activations, HardwareRef, Rule, Strategy, Workload

from tests.conftest import STRATEGIES

REPO = Path(__file__).resolve().parents[2]
MINIMAL = {"name": "a", "model": "qwen-image", "hardware": "v6e-8", "mesh": {"model": 8}}


def problems(model, data) -> list[tuple[tuple, str]]:
    with pytest.raises(ValidationError) as info:
        model.model_validate(data)
    return [(e["loc"], e["msg"]) for e in info.value.errors(include_url=False)]


@pytest.mark.parametrize("value, expected", [(3, 3), (3.0, 3), ("3", 3), (" 4 ", 4)])
def test_an_int_accepts_what_a_yaml_author_means(value, expected):
    assert Workload.model_validate({"steps": value}).steps == expected


@pytest.mark.parametrize("value", [True, False, 3.5, "three", None, [3], "9" * 5000, "１０２４x"])
def test_an_int_refuses_the_rest(value):
    [(loc, message)] = problems(Workload, {"steps": value})
    assert loc == ("steps",) and "integer" in message


def test_a_bool_is_not_a_count_anywhere():
    """pydantic's lax mode reads YAML's true as 1; a mesh size, a rule's rank or a seed never is one."""
    [(loc, message)] = problems(Strategy, MINIMAL | {"mesh": {"model": True}})
    assert loc == ("mesh", "model") and message == "Value error, Input should be an integer, not true or false"
    [(loc, _)] = problems(Strategy, MINIMAL | {"rules": [{"match": "*", "shard": "replicate", "min_rank": False}]})
    assert loc == ("rules", 0, "min_rank")
    [(loc, _)] = problems(Experiment, {"name": "e", "strategies": ["a.yaml"], "checkpoint": "tiny", "seed": True})
    assert loc == ("seed",)


def test_a_union_names_every_alternative():
    from meshlab.core.closed import first_problem

    data = MINIMAL | {"hardware": ["v6e-8"]}
    with pytest.raises(ValidationError) as info:
        Strategy.model_validate(data)
    assert first_problem(info.value, data) == (("hardware",), "string_type", "Input should be a valid string or a "
                                               "valid dictionary or instance of HardwareRef")


def test_bools_and_strings():
    assert Workload.model_validate({"cfg": "yes"}).cfg is True
    assert Workload.model_validate({"cfg": 0}).cfg is False
    [(loc, message)] = problems(Strategy, MINIMAL | {"name": 7})
    assert loc == ("name",) and message == "Input should be a valid string"  # a number is not a string


def test_bounds_name_the_limit():
    assert problems(Workload, {"batch": 5000}) == [(("batch",), "Input should be less than or equal to 4096")]
    assert problems(Strategy, MINIMAL | {"name": ""}) == [(("name",), "String should have at least 1 character")]


def test_missing_and_unknown_keys_each_placed():
    found = problems(Strategy, {"name": "a", "model": "q", "mesh": {"model": 8}, "colour": "red",
                                "workload": {"hieght": 8}})
    assert (("hardware",), "Field required") in found
    assert (("colour",), "Extra inputs are not permitted") in found
    assert (("workload", "hieght"), "Extra inputs are not permitted") in found


def test_validators_place_their_problem_at_their_field():
    assert problems(Activations, {"batch": "data", "sequence": ["data", "seq"]}) == [
        (("sequence",), "Value error, axis 'data' splits the batch; it cannot also split the sequence")]
    assert problems(Strategy, MINIMAL | {"rewrites": ["layernorm-rows", "layernorm-rows"]}) == [
        (("rewrites",), "Value error, a rewrite is named twice")]
    assert problems(Strategy, MINIMAL | {"mesh": {"model": 0}}) == [
        (("mesh",), "Value error, axis 'model' has size 0; sizes are positive or -1 (inferred)")]
    [(loc, message)] = problems(Rule, {"match": "*", "regex": ".*", "shard": "replicate"})
    assert loc == () and "exactly one of" in message  # a problem of the whole rule


def test_a_pattern_must_match_the_whole_string():
    assert Strategy.model_validate(MINIMAL)
    # Python's `$` also matches before a final newline; an axis name may not end in one
    [(loc, message)] = problems(Strategy, MINIMAL | {"mesh": {"model\n": 8}})
    assert loc[:2] == ("mesh", "model\n") and "not a mesh axis name" in message


def test_records_are_immutable_values():
    workload = Workload()
    with pytest.raises(ValidationError, match="frozen"):
        workload.steps = 3
    assert workload == Workload() and workload != Workload(steps=3)
    assert {Workload(): "hashable"}[Workload()] == "hashable"  # a record of scalars can be a key
    assert pickle.loads(pickle.dumps(workload)) == workload


def test_model_copy_validates_the_new_values():
    workload = Workload()
    assert workload.model_copy(update={"steps": 5}).steps == 5 and workload.steps == 50
    with pytest.raises(ValidationError, match="less than or equal to 4096"):
        workload.model_copy(update={"batch": 5000})  # pydantic's own model_copy would keep 5000
    strategy = Strategy.model_validate(MINIMAL)
    copied = strategy.model_copy(update={"workload": Workload(batch=4)})
    assert copied.workload.batch == 4 and copied.mesh == strategy.mesh


def test_hardware_overrides_are_kept_and_dumped_back():
    ref = HardwareRef.model_validate({"name": "h100", "attention_kernel": "fa3"})
    assert ref.extra == {"attention_kernel": "fa3"} and ref.field_names() == ["name"]
    assert ref.model_dump() == {"name": "h100", "attention_kernel": "fa3"}
    strategy = Strategy.model_validate(MINIMAL | {"hardware": {"name": "h100", "usd_per_chip_hour": 2}})
    assert strategy.hardware_name == "h100" and strategy.hardware_overrides == {"usd_per_chip_hour": 2}
    assert strategy.model_copy(update={"name": "b"}).hardware_overrides == {"usd_per_chip_hour": 2}


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
    with pytest.raises(ValidationError, match="greater than or equal to 16"):
        Workload(height=8)
    with pytest.raises(ValidationError, match="needs `axis"):
        Rule(match="*", shard="largest")


def test_field_helpers_read_pydantic_fields():
    assert Strategy.field_description("workload") == "what one generation asks of the model"
    assert Strategy.field_description("mesh").startswith("ordered mesh axes")
    assert Workload.field_metadata("batch") == {"description": "images (or videos) per call", "ge": 1,
                                                "le": 4096, "min_length": None, "max_length": None}
    assert Strategy.field_record("rules") is Rule and Strategy.field_record("hardware") is HardwareRef
    assert Strategy.field_record("name") is None


def test_the_experiment_default_workload_is_one_empty_override():
    experiment = Experiment.model_validate({"name": "e", "strategies": ["a.yaml"], "checkpoint": "tiny"})
    assert [w.model_dump() for w in experiment.workloads] == [
        {"height": None, "width": None, "steps": None, "batch": None, "cfg": None}]


def test_try_imports_no_torch_numpy_or_jax():
    code = ("import sys, io, contextlib\n"
            "from meshlab.cli.app import main\n"
            "sys.argv = ['meshlab', 'try', 'strategies/2d.yaml']\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    try:\n        main()\n    except SystemExit as exc:\n        assert exc.code in (0, None), exc.code\n"
            "print(sorted(m for m in ('torch', 'numpy', 'jax') if m in sys.modules), 'pydantic' in sys.modules)\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[] True"  # the schema is pydantic's; the heavy stacks stay out
