"""`meshlab run`'s options are checked before anything is built or written: each refusal below happens in the
parent process in well under a second, and (where the run got far enough to know its record file) is recorded."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest

from meshlab.core.errors import InputError
from meshlab.experiments.compile_cache import cache_for
from meshlab.experiments.definition import experiment_runs
from meshlab.experiments.options import RunOptions
from meshlab.experiments.run import run_strategy
from meshlab.plan.planned import plan_file

from tests.conftest import REPO

ONE_CPU = REPO / "experiments" / "strategies" / "qwen-image-one-cpu.yaml"


def options(tmp_path: Path, **given) -> RunOptions:
    defaults = {"checkpoint": "random", "out_dir": tmp_path / "out", "results_dir": tmp_path / "results",
                "backend": "xla", "force": True}
    return RunOptions(**(defaults | given))


@pytest.mark.parametrize("given, says", [
    ({"cfg_scale": math.nan}, "--cfg-scale nan is not a finite number"),
    ({"height": 0}, "--height: Input should be greater than or equal to"),
    ({"steps": 0}, "--steps: Input should be greater than or equal to 1"),
])
def test_values_out_of_range_are_refused_not_replaced_by_defaults(tmp_path, given, says):
    with pytest.raises(InputError, match=says):
        run_strategy(ONE_CPU, options(tmp_path, **given))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("flag, field", [("--out", "out_dir"), ("--results", "results_dir"),
                                         ("--cache-dir", "cache_dir")])
def test_a_folder_option_naming_a_file_is_refused_first(tmp_path, flag, field):
    (tmp_path / "a-file").write_text("kept")
    with pytest.raises(InputError, match=f"{flag} .*a-file is not a folder"):
        run_strategy(ONE_CPU, replace(options(tmp_path), **{field: tmp_path / "a-file"}))
    assert (tmp_path / "a-file").read_text() == "kept" and not (tmp_path / "out").exists()


def test_scan_is_refused_with_plain_pytorch(tmp_path):
    with pytest.raises(InputError, match="plain PyTorch has no scan"):
        run_strategy(ONE_CPU, options(tmp_path, scan=True, backend="torch"))


def test_a_checkpoint_whose_index_is_not_json_is_refused_and_recorded(tmp_path):
    folder = tmp_path / "pipeline"
    folder.mkdir()
    (folder / "model_index.json").write_text("{not json")
    with pytest.raises(InputError, match="is not a pipeline index"):
        run_strategy(ONE_CPU, replace(options(tmp_path), checkpoint=str(folder)))
    [line] = (tmp_path / "results" / "qwen-image-one-cpu.jsonl").read_text().splitlines()
    assert json.loads(line)["status"] == "refused"


def test_the_compile_cache_of_a_random_checkpoint_is_keyed_by_its_depth(tmp_path):
    planned = plan_file(ONE_CPU)
    two, three = (cache_for(planned, "random", options(tmp_path, cache_dir=tmp_path / "cache", layers=n))
                  for n in (2, 3))
    assert two != three
    assert json.loads((two / "meshlab-cache.json").read_text())["checkpoint"] == "random, 2 blocks per list"


def test_an_experiments_batch_and_guidance_reach_its_runs(tmp_path):
    experiment = tmp_path / "e.yaml"
    experiment.write_text(f"name: e\ncheckpoint: random\nstrategies: [{ONE_CPU}]\n"
                          "workloads: [{batch: 2, cfg: false, steps: 3}, {}]\n")
    (_, first), (_, second) = experiment_runs(experiment, RunOptions(checkpoint="tiny"))
    assert (first.batch, first.cfg, first.steps) == (2, False, 3)
    assert (second.batch, second.cfg, second.steps) == (None, None, None)


def test_an_experiment_with_a_bad_strategy_runs_nothing(tmp_path):
    from typer.testing import CliRunner

    from meshlab.cli.app import app

    broken = tmp_path / "broken.yaml"
    broken.write_text(ONE_CPU.read_text().replace("mesh:", "mesh: [", 1))
    experiment = tmp_path / "e.yaml"
    experiment.write_text(f"name: e\ncheckpoint: random\nstrategies: [{ONE_CPU}, {broken}]\nworkloads: [{{}}]\n")
    result = CliRunner().invoke(app, ["run", str(experiment), "--results", str(tmp_path / "results"), "--out",
                                      str(tmp_path / "out")])
    assert result.exit_code == 2 and f"experiment {experiment}: {broken}:" in result.stderr
    assert "nothing was run" in result.stderr and not (tmp_path / "results").exists()


def test_a_checkpoint_of_another_model_is_refused_in_the_parent(tmp_path):
    folder = tmp_path / "flux"
    folder.mkdir()
    (folder / "model_index.json").write_text(json.dumps({"_class_name": "FluxPipeline",
                                                         "transformer": ["diffusers", "FluxTransformer2DModel"]}))
    with pytest.raises(InputError, match="has a FluxTransformer2DModel, and the strategy's model is a "
                                         "QwenImageTransformer2DModel"):
        run_strategy(ONE_CPU, options(tmp_path, checkpoint=str(folder)))


def test_a_ring_priced_as_a_gpu_tool_runs_it_is_refused_with_the_export_that_takes_it(tmp_path):
    """flux-usp-h100.yaml is priced as xDiT runs its ring, and xDiT's export refuses it (no CFG parallelism for
    Flux): the refusal sends the user to diffusers' export, which takes it, not to xDiT's."""
    from meshlab.experiments.refusals import refuse_ring, taking_tools

    planned = plan_file(REPO / "strategies" / "flux-usp-h100.yaml")
    assert taking_tools(planned) == ["diffusers"]
    with pytest.raises(InputError) as error:
        refuse_ring(planned, "run")
    assert error.value.fix.endswith("or run it with diffusers (meshlab export --format diffusers)")
    assert error.value.location is not None and error.value.location.line is not None


def test_a_tpu_plan_s_refusal_names_no_gpu_tool(tmp_path):
    from meshlab.experiments.refusals import refuse_placement

    path = tmp_path / "tiled.yaml"
    path.write_text((REPO / "strategies" / "2d.yaml").read_text().replace("  vae: device", "  vae: device\n"
                                                                          "  vae_decode: tiled"))
    with pytest.raises(InputError) as error:
        refuse_placement(plan_file(path), "run")
    assert error.value.fix == "set placement.vae_decode: full to run it here"
