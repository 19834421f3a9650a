"""meshlab export: the torch-xla snippet resolves every parameter to the plan's spec; the JSON map is the plan."""

from __future__ import annotations

import json
import sys
import types

import pytest
from typer.testing import CliRunner

from meshlab.export import spec_map_document, torch_xla_snippet
from meshlab.planning import plan_file
from meshlab.strategy.schema import Activations, Rule

from tests.conftest import STRATEGIES, small_card


@pytest.fixture
def fake_torch_xla(monkeypatch):
    """The snippet imports torch_xla at its top; these stand-ins record what it asks of them."""
    spmd = types.ModuleType("torch_xla.distributed.spmd")
    spmd.marked = []
    spmd.mark_sharding = lambda t, mesh, spec: spmd.marked.append((t, spec))
    spmd.Mesh = lambda ids, shape, names: ("Mesh", tuple(ids), shape, names)
    runtime = types.ModuleType("torch_xla.runtime")
    runtime.global_runtime_device_count = lambda: 8
    runtime.device_type = lambda: "CPU"
    for name, module in {"torch_xla": types.ModuleType("torch_xla"), "torch_xla.runtime": runtime,
                         "torch_xla.distributed": types.ModuleType("torch_xla.distributed"),
                         "torch_xla.distributed.spmd": spmd}.items():
        monkeypatch.setitem(sys.modules, name, module)
    return spmd


def run_snippet(text: str) -> dict:
    namespace: dict = {}
    exec(compile(text, "<snippet>", "exec"), namespace)
    return namespace


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda p: p.stem)
def test_snippet_resolves_every_parameter_as_the_plan(strategy, fake_torch_xla):
    planned = plan_file(strategy)
    snippet = torch_xla_snippet(planned.plan, planned.strategy.rules, planned.strategy.activations)
    namespace = run_snippet(snippet)
    for p in planned.plan.parameters:
        assert namespace["spec_for"](p.name, p.shape) == p.spec.to_torch_xla(), p.name
    assert namespace["make_mesh"]()[2:] == (planned.plan.mesh.shape, planned.plan.mesh.names)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda p: p.stem)
def test_snippet_is_grouped_by_rule_not_by_parameter(strategy):
    planned = plan_file(strategy)
    snippet = torch_xla_snippet(planned.plan, planned.strategy.rules, planned.strategy.activations)
    assert len(snippet.splitlines()) < 60 + 2 * len(planned.strategy.rules)
    assert "transformer_blocks.1." not in snippet


def test_snippet_handles_explicit_specs_regexes_and_axis_lists(fake_torch_xla):
    from meshlab.plan.planner import make_plan
    from meshlab.strategy.schema import Strategy

    rules = [
        Rule(regex=r"transformer_blocks\.\d+\.attn\.to_q\.weight", shard=[None, ["data", "model"]]),
        Rule(match="*_mod.1.*", shard="row", axis=["data", "model"]),
        Rule(match="*.norm_q.*", shard="replicate"),
        Rule(match="*", shard="largest", axis="model", min_rank=2),
    ]
    strategy = Strategy(name="mixed", model="x", hardware="v6e-8", mesh={"data": 2, "model": 4}, rules=rules)
    plan = make_plan(strategy, small_card(), 8)
    namespace = run_snippet(torch_xla_snippet(plan, rules, Activations(batch="data")))
    for p in plan.parameters:
        assert namespace["spec_for"](p.name, p.shape) == p.spec.to_torch_xla(), p.name


def test_snippet_marks_every_parameter(fake_torch_xla):
    planned = plan_file(STRATEGIES[0])
    namespace = run_snippet(torch_xla_snippet(planned.plan, planned.strategy.rules, planned.strategy.activations))

    class Param:
        def __init__(self, shape):
            self.shape = shape

    class Module:
        def named_parameters(self):
            return [(p.name, Param(p.shape)) for p in planned.plan.parameters]

    namespace["shard_module"](Module(), "mesh")
    assert len(fake_torch_xla.marked) == len(planned.plan.parameters)


def test_spec_map_document_is_the_plan():
    planned = plan_file(STRATEGIES[0])
    document = spec_map_document(planned.plan)
    assert document["mesh"] == planned.plan.mesh.as_dict()
    assert document["parameters"] == {p.name: p.spec.to_json() for p in planned.plan.parameters}
    json.dumps(document)


@pytest.mark.parametrize("fmt", ["torch-xla", "json"])
def test_export_command(fmt):
    from meshlab.cli.app import app
    from meshlab.cli.commands_check import register

    if "export" not in {c.name for c in app.registered_commands}:
        register(app)
    result = CliRunner().invoke(app, ["export", str(STRATEGIES[0]), "--format", fmt])
    assert result.exit_code == 0, result.output
    if fmt == "json":
        assert "parameters" in json.loads(result.stdout)
    else:
        assert "def spec_for" in result.stdout and "xs.mark_sharding" in result.stdout


def test_export_rejects_an_unknown_format():
    from meshlab.cli.app import app
    from meshlab.cli.commands_check import register

    if "export" not in {c.name for c in app.registered_commands}:
        register(app)
    result = CliRunner().invoke(app, ["export", str(STRATEGIES[0]), "--format", "onnx"])
    assert result.exit_code == 2
