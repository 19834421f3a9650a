"""meshlab export: the torch-xla snippet resolves every parameter to the plan's spec; the JSON map is the plan."""

from __future__ import annotations

import json
import sys
import types
from collections import Counter

import pytest
from typer.testing import CliRunner

from meshlab.export.snippets import spec_map_document, torch_xla_snippet
from meshlab.plan.planned import plan_file
from meshlab.core.spec import PartitionSpec
from meshlab.strategy.schema import Activations, Rule

from tests.conftest import REPO, STRATEGIES, small_card


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
    assert len(snippet.splitlines()) < 62 + 2 * len(planned.strategy.rules)
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
    assert [spec for _, spec in fake_torch_xla.marked] == [p.spec.to_torch_xla() for p in planned.plan.parameters]


COLUMN, ROW, WHOLE, VECTOR = ["model", None], [None, "model"], [None, None], [None]
SPLIT_VECTOR = ["model"]

#: strategies/pairs.yaml over meshlab/models/cards/qwen-image.json, written out by hand: every parameter of one block
#: (by its path past ``transformer_blocks.<i>.``) and its spec. Column: q/k/v and MLP-in, their biases split
#: with their output; row: out-projections, MLP-out and the modulation Linears, their biases whole; norms whole.
PAIRS_BLOCK = {
    "img_mod.1.weight": ROW, "img_mod.1.bias": VECTOR,
    "txt_mod.1.weight": ROW, "txt_mod.1.bias": VECTOR,
    **{f"attn.{n}.weight": COLUMN for n in ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj")},
    **{f"attn.{n}.bias": SPLIT_VECTOR for n in ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj")},
    "attn.to_out.0.weight": ROW, "attn.to_out.0.bias": VECTOR,
    "attn.to_add_out.weight": ROW, "attn.to_add_out.bias": VECTOR,
    **{f"attn.{n}.weight": VECTOR for n in ("norm_q", "norm_k", "norm_added_q", "norm_added_k")},
    **{f"{s}_mlp.net.0.proj.weight": COLUMN for s in ("img", "txt")},
    **{f"{s}_mlp.net.0.proj.bias": SPLIT_VECTOR for s in ("img", "txt")},
    **{f"{s}_mlp.net.2.weight": ROW for s in ("img", "txt")},
    **{f"{s}_mlp.net.2.bias": VECTOR for s in ("img", "txt")},
}
#: outside the blocks no rule of pairs.yaml matches: every weight whole
PAIRS_OUTSIDE = {
    **{f"{m}.weight": WHOLE for m in ("time_text_embed.timestep_embedder.linear_1",
                                      "time_text_embed.timestep_embedder.linear_2", "img_in", "txt_in",
                                      "norm_out.linear", "proj_out")},
    **{f"{m}.bias": VECTOR for m in ("time_text_embed.timestep_embedder.linear_1",
                                     "time_text_embed.timestep_embedder.linear_2", "img_in", "txt_in",
                                     "norm_out.linear", "proj_out")},
    "txt_norm.weight": VECTOR,
}


def test_spec_map_document_is_the_plan():
    """pairs.yaml's document against its specs written out by hand, for all 60 blocks of Qwen-Image."""
    document = spec_map_document(plan_file(REPO / "strategies" / "pairs.yaml").plan)
    assert {k: v for k, v in document.items() if k != "parameters"} == {
        "strategy": "pairs", "model": "qwen-image", "class": "QwenImageTransformer2DModel",
        "mesh": {"data": 2, "model": 4}}
    expected = dict(PAIRS_OUTSIDE)
    for block in range(60):
        expected.update({f"transformer_blocks.{block}.{name}": spec for name, spec in PAIRS_BLOCK.items()})
    assert len(expected) == 13 + 60 * 32 == 1933
    assert document["parameters"] == expected
    # per spec: 8 column weights and their 8 biases, 6 row weights, 6 row biases + 4 norms per block; outside,
    # 6 whole weights, 6 biases and txt_norm
    counts = Counter(json.dumps(spec) for spec in json.loads(json.dumps(document))["parameters"].values())
    assert counts == {'["model", null]': 480, '["model"]': 480, '[null, "model"]': 360, "[null]": 607,
                      "[null, null]": 6}


def test_spec_map_document_largest_dim_by_hand():
    """2d.yaml (largest dim over model, ties to dim 0) on a few parameters whose shapes decide, and its counts."""
    document = spec_map_document(plan_file(REPO / "strategies" / "2d.yaml").plan)
    specs = document["parameters"]
    assert specs["img_in.weight"] == COLUMN  # 3072 x 64
    assert specs["txt_in.weight"] == ROW  # 3072 x 3584
    assert specs["proj_out.weight"] == ROW  # 64 x 3072
    assert specs["transformer_blocks.7.attn.to_q.weight"] == COLUMN  # 3072 x 3072: the tie goes to dim 0
    assert specs["transformer_blocks.59.txt_mod.1.weight"] == COLUMN  # 18432 x 3072
    assert specs["transformer_blocks.0.img_mlp.net.2.weight"] == ROW  # 3072 x 12288
    assert specs["transformer_blocks.0.img_mlp.net.0.proj.bias"] == VECTOR  # 1-D: below min_rank 2
    # per block 12 weights split on dim 0 (2 modulation, 8 attention, 2 MLP-in), 2 on dim 1 (MLP-out), 18
    # vectors; outside, dim 0: linear_1, linear_2, img_in, norm_out.linear; dim 1: txt_in, proj_out; 7 vectors
    counts = Counter(json.dumps(spec) for spec in specs.values())
    assert counts == {'["model", null]': 60 * 12 + 4, '[null, "model"]': 60 * 2 + 2, "[null]": 60 * 18 + 7}


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


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda p: p.stem)
def test_dtensor_snippet_places_every_parameter_as_the_plan(strategy):
    pytest.importorskip("torch")
    from meshlab.export.snippets import dtensor_snippet
    from meshlab.plan.placements import placements_of

    planned = plan_file(strategy)
    if planned.strategy.activations.rules:  # hooks inside the blocks: no snippet can write them, so it refuses
        from meshlab.core.errors import PlanError

        with pytest.raises(PlanError, match="activation rule") as refused:
            dtensor_snippet(planned.plan, planned.strategy.rules, planned.strategy.activations)
        assert "meshlab.apply(module, plan, backend='dtensor')" in refused.value.fix
        return
    namespace = run_snippet(dtensor_snippet(planned.plan, planned.strategy.rules, planned.strategy.activations))
    for p in planned.plan.parameters:
        placements = namespace["placements_for"](namespace["spec_for"](p.name, p.shape))
        assert "[" + ", ".join(map(_placement, placements)) + "]" == str(placements_of(p.spec, planned.plan.mesh))
    assert (namespace["MESH_SHAPE"], namespace["AXES"]) == (planned.plan.mesh.shape, planned.plan.mesh.names)


@pytest.fixture
def fake_process_group():
    """torch's in-process fake backend: a DeviceMesh of 8 ranks in one process, this one rank 0."""
    torch = pytest.importorskip("torch")
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=8)
    yield torch
    dist.destroy_process_group()


def _app():
    from meshlab.cli.app import app
    from meshlab.cli.commands_check import register

    if "export" not in {c.name for c in app.registered_commands}:
        register(app)
    return app


def _placement(p) -> str:
    return f"Shard({p.dim})" if p.is_shard() else "Replicate()"


def test_dtensor_snippet_runs_on_a_device_mesh(fake_process_group):
    """The pasted snippet builds the mesh and leaves rank 0 holding exactly its planned slice of each weight."""
    import torch

    from meshlab.export.snippets import dtensor_snippet
    from meshlab.plan.placements import local_shape

    planned = plan_file(STRATEGIES[0].with_name("2d.yaml"))
    namespace = run_snippet(dtensor_snippet(planned.plan, planned.strategy.rules, planned.strategy.activations))
    module = torch.nn.Module()
    module.proj = torch.nn.Linear(6, 10)  # 10 x 6: the largest dim (10) over model's 4 ranks: 3, 3, 3, 1
    mesh = namespace["make_mesh"]()
    namespace["shard_module"](module, mesh)
    weight = module.proj.weight
    spec = namespace["spec_for"]("proj.weight", (10, 6))
    assert spec == ("model", None)
    assert tuple(weight.to_local().shape) == local_shape((10, 6), PartitionSpec("model", None),
                                                         planned.plan.mesh, 0) == (3, 6)
    assert tuple(weight.shape) == (10, 6)


def test_dtensor_export_refuses_what_dtensor_cannot_hold(tmp_path):
    strategy = tmp_path / "reversed.yaml"
    strategy.write_text((REPO / "strategies" / "2d.yaml").read_text().replace(
        "    axis: model\n", "    axis: [model, data]\n", 1))
    result = CliRunner().invoke(_app(), ["export", str(strategy), "--format", "dtensor"])
    assert result.exit_code == 2, result.output
    assert "DTensor cannot hold" in result.output and "mesh order" in result.output
    assert "reversed.yaml" in result.output


def test_snippet_builds_a_hybrid_mesh_across_slices(fake_torch_xla, tmp_path):
    """With dcn, the TPU mesh is a HybridMesh whose DCN shape spans the slices on the named axis."""
    strategy = tmp_path / "across.yaml"
    strategy.write_text((REPO / "strategies" / "2d.yaml").read_text().replace("hardware: v6e-8", "hardware: v6e-8x2")
                        .replace("  data: 2\n", "  data: 4\n").replace("rules:", "dcn: {data: 2}\nrules:", 1)
                        .replace("  batch: 2\n", "  batch: 4\n"))
    planned = plan_file(strategy)
    recorded = {}
    fake_torch_xla.HybridMesh = lambda **kwargs: recorded.update(kwargs) or "hybrid"
    sys.modules["torch_xla.runtime"].device_type = lambda: "TPU"
    sys.modules["torch_xla.runtime"].global_runtime_device_count = lambda: 16
    snippet = torch_xla_snippet(planned.plan, planned.strategy.rules, planned.strategy.activations, planned.strategy.dcn)
    assert run_snippet(snippet)["make_mesh"]() == "hybrid"
    assert recorded == {"ici_mesh_shape": (2, 4), "dcn_mesh_shape": (2, 1), "axis_names": ("data", "model")}


def test_a_strategy_s_libtpu_flags_are_set_before_torch_xla_loads(fake_torch_xla, monkeypatch, tmp_path):
    """compile.libtpu_flags: the snippet sets LIBTPU_INIT_ARGS (after any the user set) at its top, before its
    torch_xla imports; a plan without flags writes no such line."""
    flags = "--xla_tpu_enable_windowed_einsum_for_all_gather=false"
    strategy = tmp_path / "flags.yaml"
    strategy.write_text((REPO / "strategies" / "2d.yaml").read_text() + f"compile:\n  libtpu_flags: [{flags}]\n")
    monkeypatch.setenv("LIBTPU_INIT_ARGS", "--xla_enable_async_all_gather=true")
    done = CliRunner().invoke(__import__("meshlab.cli.app", fromlist=["app"]).app,
                              ["export", str(strategy), "--format", "torch-xla"])
    assert done.exit_code == 0, done.output
    lines = done.stdout.splitlines()
    first_import = next(i for i, line in enumerate(lines) if "torch_xla" in line and line.startswith("import"))
    assert any("LIBTPU_INIT_ARGS" in line for line in lines[:first_import])
    run_snippet(done.stdout)
    import os

    assert os.environ["LIBTPU_INIT_ARGS"] == f"--xla_enable_async_all_gather=true {flags}"
    plain = plan_file(REPO / "strategies" / "2d.yaml")
    assert "LIBTPU_INIT_ARGS" not in torch_xla_snippet(plain.plan, plain.strategy.rules, plain.strategy.activations)


def test_the_torch_xla_snippet_says_what_of_the_plan_it_does_not_apply(fake_torch_xla):
    """hybrid.yaml: three activation rules and layernorm-rows are priced but are not mark_sharding calls on
    parameters; the snippet's header says so and how to apply the whole plan (the CLI says it on stderr too), and
    its input hint splits dim 0 over the guidance axis. A strategy of parameter rules alone: no such header."""
    from meshlab.export.snippets import left_out_of_snippet

    planned = plan_file(REPO / "strategies" / "hybrid.yaml")
    strategy = planned.strategy
    left_out = left_out_of_snippet(strategy.activations, strategy.rewrites, strategy.compile.scan_blocks)
    assert left_out == ["3 activation rules (block.input, attention.qkv, attention.output)",
                        "the rewrite layernorm-rows"]
    snippet = torch_xla_snippet(planned.plan, strategy.rules, strategy.activations, left_out=left_out,
                                source="strategies/hybrid.yaml")
    header = " ".join(line.lstrip("# ") for line in snippet.splitlines()[:8])
    assert ("NOT APPLIED BY THIS SNIPPET, yet part of the plan meshlab priced: 3 activation rules (block.input, "
            "attention.qkv, attention.output); the rewrite layernorm-rows.") in header
    assert "meshlab.apply(pipe.transformer, meshlab.load_plan('strategies/hybrid.yaml'))" in snippet
    assert "xs.mark_sharding(hidden_states, mesh, ('cfg', 'seq', None))" in snippet  # the guidance axis, then seq
    run_snippet(snippet)
    done = CliRunner().invoke(__import__("meshlab.cli.app", fromlist=["app"]).app,
                              ["export", str(REPO / "strategies" / "hybrid.yaml")])
    assert done.exit_code == 0 and "NOT APPLIED BY THIS SNIPPET" in done.stdout
    assert done.stderr == ("meshlab: note: the snippet applies the parameters' specs only, not 3 activation rules "
                           "(block.input, attention.qkv, attention.output); the rewrite layernorm-rows (its header "
                           "says how to apply the whole plan)\n")
    assert left_out_of_snippet(Activations(batch="data"), (), False) == []
    bare = torch_xla_snippet(planned.plan, strategy.rules, Activations(batch="data"))
    assert "NOT APPLIED" not in bare and "meshlab.apply" not in bare
    # a ring priced as xDiT runs it is not what XLA runs: the snippet says so (hybrid's Ulysses has no ring)
    usp = plan_file(REPO / "strategies" / "flux-usp-h100.yaml").strategy.activations
    assert left_out_of_snippet(usp)[-1].startswith("the ring over ring as xdit runs it (passes of the keys and values "
                                                   "between chips; XLA's partitioner gathers them whole instead")
    assert not any("ring" in phrase for phrase in left_out)
