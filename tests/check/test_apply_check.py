"""meshlab.apply and meshlab check under 8 virtual CPU devices (torch_xla in worker processes; slow: minutes).

Small configurations of Qwen-Image and Flux (cards made by the importer) under every built-in image strategy, of
Wan under the video one, one
full-width Qwen-Image block under 2d.yaml and pairs.yaml, and the API's errors.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path

import jsonschema
import pytest

from tests.conftest import REPO, STRATEGIES

pytestmark = [
    pytest.mark.xla,
    pytest.mark.slow,
    pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("torch_xla", "diffusers")),
                       reason="needs the xla extra: pip install -e '.[xla]'"),
]

SMALL = {  # diffusers' own test sizes, with 8 heads so that every built-in mesh axis divides them
    "qwen": ("QwenImageTransformer2DModel", dict(
        patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16, num_attention_heads=8,
        joint_attention_dim=20, axes_dims_rope=[8, 4, 4])),
    "flux": ("FluxTransformer2DModel", dict(
        patch_size=1, in_channels=16, out_channels=None, num_layers=2, num_single_layers=2, attention_head_dim=16,
        num_attention_heads=8, joint_attention_dim=20, pooled_projection_dim=24, guidance_embeds=True,
        axes_dims_rope=[4, 6, 6])),
    "wan": ("WanTransformer3DModel", dict(
        patch_size=[1, 2, 2], num_attention_heads=8, attention_head_dim=16, in_channels=4, out_channels=4,
        text_dim=32, freq_dim=16, ffn_dim=256, num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
        eps=1e-06, rope_max_seq_len=1024)),
}
VIDEO = {"wan"}  # small models the video strategies run on; the image ones run on the others


def _is_video(strategy: Path) -> bool:
    import yaml

    from meshlab.models.card import load_card

    return load_card(yaml.safe_load(strategy.read_text())["model"]).architecture.is_video


def _pairs() -> list[tuple[str, Path]]:
    """(small model, built-in strategy) for every strategy, on the models of its kind (image or video)."""
    return [(m, s) for m in SMALL for s in STRATEGIES if (m in VIDEO) == _is_video(s)]
#: txt_norm.weight has 20 entries: over 8 devices each holds a padded shard of 3, the last two hold padding only.
PADDED = """
name: padded
model: {card}
hardware: v6e-8
mesh: {{data: 2, model: 4}}
rules:
  - match: "txt_norm.weight"
    shard: [[data, model]]
  - match: "*"
    min_rank: 2
    shard: largest
    axis: model
activations: {{batch: data}}
"""


@pytest.fixture(scope="session")
def small_strategies(tmp_path_factory) -> dict[str, Path]:
    from meshlab.models.importer.card_import import import_card, write_card

    folder = tmp_path_factory.mktemp("small")
    paths = {}
    cards = {model: write_card(import_card(class_name, config, f"{model}-small"), folder / f"{model}-small.json")
             for model, (class_name, config) in SMALL.items()}
    for model, strategy in _pairs():
        text = re.sub(r"(?m)^model: .*$", f"model: {cards[model]}", strategy.read_text())
        paths[f"{model}-{strategy.stem}"] = folder / f"{model}-{strategy.stem}.yaml"
        paths[f"{model}-{strategy.stem}"].write_text(text)
    paths["qwen-padded"] = folder / "qwen-padded.yaml"
    paths["qwen-padded"].write_text(PADDED.format(card=folder / "qwen-small.json"))
    return paths


@pytest.fixture(scope="session")
def small_reports(small_strategies, tmp_path_factory):
    from meshlab.check.against_xla import run_checks
    from meshlab.check.setup import CheckOptions

    keys = sorted(small_strategies)
    dump = tmp_path_factory.mktemp("dump")
    # The worker's XLA compiles without LLVM's optimisations: these toy widths compile in about half the time and run
    # in milliseconds either way. The partitioned HLO, its collectives, the buffer assignment and the shards are
    # XLA's HLO passes', which the flag leaves alone (compared: every report's collectives, shards, buffer sizes
    # and dot FLOPs are the same as at the default level).
    with pytest.MonkeyPatch.context() as env:
        env.setenv("XLA_FLAGS", f"{os.environ.get('XLA_FLAGS', '')} --xla_backend_optimization_level=0".strip())
        reports = run_checks([small_strategies[k] for k in keys], CheckOptions(layers=2, dump_dir=dump))
    return dict(zip(keys, reports)), dump


def _small_keys():
    return [f"{m}-{s.stem}" for m, s in _pairs()] + ["qwen-padded"]


@pytest.mark.parametrize("key", _small_keys())
def test_small_models_agree_with_the_plan_exactly(small_reports, key):
    report = small_reports[0][key]
    assert not report.mismatches, [p.to_json() for p in report.mismatches[:3]]
    for p in report.parameters:
        assert p.xla_shard_shape == p.predicted_shard_shape, p.name
        assert not p.misplaced, p.name
    assert report.output_agrees, (report.max_abs_error, report.tolerance)
    assert report.weights()[0] == report.weights()[1]
    # the buffer assignment's parts add up, and its parameters hold the weights read back but for the last block's
    # text tail, which nothing reads, so the compiled program takes no argument for it
    from meshlab.check.verdict import dead_tail_weight_bytes

    memory = report.xla_memory
    assert memory.parameters + memory.temporaries + memory.outputs + memory.constants == memory.total
    assert memory.parameters >= report.weights()[1] - dead_tail_weight_bytes(report.setup)
    mesh_names = set(report.setup.plan.mesh.names)
    assert all(set(c.mesh_axes) <= mesh_names for c in report.collectives)


def test_padding_shows_in_the_shards_xla_holds(small_reports):
    report = small_reports[0]["qwen-padded"]
    (norm,) = [p for p in report.parameters if p.name == "txt_norm.weight"]
    assert norm.predicted_shard_shape == norm.xla_shard_shape == (3,)
    assert report.setup.plan.warnings  # the planner says it pads


@pytest.mark.parametrize("key", ["qwen-2d", "flux-model", "qwen-pairs"])
def test_the_parser_counts_the_live_dump_as_a_plain_text_search_does(small_reports, key):
    report, dump = small_reports[0][key], small_reports[1]
    text = (dump / report.hlo_module).read_text()
    found = Counter(m for m in re.findall(r"\s(all-reduce|all-gather|reduce-scatter|all-to-all|collective-permute)"
                                          r"(?:-start)?\(", text))
    assert Counter(c.hlo.kind for c in report.collectives) == found
    assert sum(1 for c in report.collectives if c.hlo.layer) >= 0.9 * len(report.collectives)


def test_collectives_are_attributed_to_blocks(small_reports):
    report = small_reports[0]["flux-2d"]
    blocks = report.per_block()
    assert {"transformer_blocks.0", "transformer_blocks.1", "single_transformer_blocks.0"} <= set(blocks)
    assert report.full_depth_collectives() == sum(blocks.values(), Counter())  # checked depth is the full depth


@pytest.fixture(scope="module")
def full_width_reports():
    from meshlab.check.against_xla import run_checks
    from meshlab.check.setup import CheckOptions

    paths = [REPO / "strategies" / "2d.yaml", REPO / "strategies" / "pairs.yaml"]
    return dict(zip(("2d", "pairs"), run_checks(paths, CheckOptions(layers=1))))


@pytest.mark.parametrize("strategy", ["2d", "pairs"])
def test_one_full_width_qwen_block_agrees_with_the_plan(full_width_reports, strategy):
    report = full_width_reports[strategy]
    assert not report.mismatches
    assert all(p.xla_shard_shape == p.predicted_shard_shape for p in report.parameters)
    assert report.output_agrees
    assert report.weights()[0] == report.weights()[1]


def test_largest_dim_cuts_the_modulation_chunks_and_pairs_do_not(full_width_reports):
    """18432 rows over 4 devices are 4608-row shards that cut the six 3072-wide chunks: XLA permutes."""
    cut = [c for c in full_width_reports["2d"].collectives if c.hlo.kind == "collective-permute"]
    assert cut and all(c.group == ("transformer_blocks", 0) or c.group is None for c in cut)
    assert not [c for c in full_width_reports["pairs"].collectives if c.hlo.kind == "collective-permute"]


API_SCRIPT = textwrap.dedent("""
    import json, sys
    from meshlab.check.setup import CheckOptions, check_setup
    from meshlab.models.importer.build import build_model
    from meshlab.core.errors import MeshlabError
    setup = check_setup(sys.argv[1], CheckOptions(layers=1))
    out = {}
    def attempt(key, call):
        try:
            call()
            out[key] = "ok"
        except MeshlabError as exc:
            out[key] = type(exc).__name__ + ": " + exc.one_line()
    import meshlab
    model = build_model(setup.card, 1, "bfloat16", 0)
    attempt("spmd_off", lambda: meshlab.apply(model, setup.plan))
    from meshlab.parallelisms import xla
    xla.enable_spmd()
    if sys.argv[2] == "8":
        bigger = build_model(setup.planned.card, 2, "bfloat16", 0)
        attempt("names", lambda: meshlab.apply(bigger, setup.plan))
        import torch
        from meshlab.core.spec import PartitionSpec
        mesh = xla.build_mesh(setup.plan.mesh)
        vector = torch.zeros(6).to(xla.device())
        attempt("rejected", lambda: xla.mark(vector, mesh, PartitionSpec("model", None), "norm.weight"))
        attempt("applied", lambda: meshlab.apply(model, setup.plan))
    else:
        attempt("too_big", lambda: meshlab.apply(model, setup.plan))
    print(json.dumps(out))
""")


def _api(strategy: Path, devices: int) -> dict:
    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": str(devices)}
    run = subprocess.run([sys.executable, "-c", API_SCRIPT, str(strategy), str(devices)], env=env,
                         capture_output=True, text=True, timeout=600, cwd=REPO)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_apply_reports_its_errors_in_one_line(small_strategies):
    out = _api(small_strategies["qwen-2d"], 8)
    assert out["spmd_off"].startswith("BackendError: PyTorch/XLA SPMD is not enabled")
    assert out["names"].startswith("InputError: the module has parameters the plan does not cover: "
                                   "transformer_blocks.1.")
    assert out["rejected"].startswith("BackendError: XLA rejected the sharding (model, None) of norm.weight [6]")
    assert "Frames" not in out["rejected"] and "stack trace" not in out["rejected"]
    assert out["applied"] == "ok"


def test_apply_refuses_a_mesh_larger_than_the_devices(small_strategies):
    out = _api(small_strategies["qwen-2d"], 4)
    assert "needs 8 devices, more than the 4 present" in out["too_big"]


def test_check_command_prints_the_json_document(small_strategies):
    from typer.testing import CliRunner

    from meshlab.cli.app import app
    from meshlab.cli.commands_check import register

    if "check" not in {c.name for c in app.registered_commands}:
        register(app)
    result = CliRunner().invoke(app, ["check", str(small_strategies["qwen-pairs"]), "--layers", "1", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    jsonschema.validate(document, json.loads(CliRunner().invoke(app, ["schema", "check"]).stdout))
    assert document["parameters"] and document["collectives"] and document["xla_memory_per_device"]["total"] > 0
