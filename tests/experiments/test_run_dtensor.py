"""`meshlab run --backend dtensor` on the tiny offline pipeline: 8 gloo processes started by meshlab, or by torchrun."""

import importlib.util
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from meshlab.cli.app import app
from meshlab.experiments.records import read_records

from tests.conftest import REPO

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("torch", "diffusers", "transformers")),
                       reason="needs torch, diffusers and transformers: pip install -e '.[xla]'"),
]
TINY = ["--checkpoint", "tiny", "--height", "64", "--width", "64", "--steps", "3", "--backend", "dtensor"]


@pytest.fixture(scope="module")
def env(tmp_path_factory):
    return {"MESHLAB_CACHE": str(tmp_path_factory.mktemp("cache"))}


def test_dtensor_run_matches_the_stock_pipeline_and_is_recorded(env, tmp_path):
    out, results = tmp_path / "out", tmp_path / "results"
    result = CliRunner().invoke(app, ["run", str(REPO / "strategies" / "2d.yaml"), *TINY, "--verify", "--out", str(out),
                                      "--results", str(results)], env=env)
    assert result.exit_code == 0, result.output
    [record] = [r.model_dump() for r in read_records([results / "2d.jsonl"]).records]
    assert record["status"] == "ok" and record["backend"] == "dtensor" and record["mismatches"] == []
    assert record["max_abs_error_vs_cpu"] < 1e-4
    assert record["hardware_seen"] == {"device_type": "cpu", "devices": 8, "process_group": "gloo"}
    assert len(record["timings"]["step_s"]) == 3 and record["timings"]["steady_step_median_s"] > 0
    assert len(set(record["memory"]["weight_bytes_per_rank"])) == 1  # 2d splits evenly: every rank holds the same
    [image] = out.glob("*.png")
    assert image.name == record["image"].rsplit("/", 1)[-1]
    assert not list(out.glob(".meshlab-*")), "no scratch or partial files left behind"


def test_a_guidance_axis_is_refused_with_a_record(env, tmp_path):
    out, results = tmp_path / "out", tmp_path / "results"
    result = CliRunner().invoke(app, ["run", str(REPO / "strategies" / "ulysses.yaml"), *TINY, "--out", str(out),
                                      "--results", str(results)], env=env)
    assert result.exit_code == 2 and "once per guidance branch" in result.stderr
    [record] = [r.model_dump() for r in read_records([results / "ulysses.jsonl"]).records]
    assert record["status"] == "refused" and not list(out.glob("*.png"))


def test_under_torchrun_each_rank_joins_and_rank_0_records(env, tmp_path):
    """torchrun starts 4 copies of the command (2d.yaml on a v6e-4's 2x2 mesh: every copy is a whole CLI and
    worker, so 8 would double the minute this takes and show nothing 4 do not); their workers join torchrun's
    group instead of starting ranks."""
    out, results = tmp_path / "out", tmp_path / "results"
    strategy = tmp_path / "2d.yaml"
    text = (REPO / "strategies" / "2d.yaml").read_text()
    strategy.write_text(text.replace("hardware: v6e-8", "hardware: v6e-4").replace("  model: 4\n", "  model: 2\n"))
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4", "-m", "meshlab",
               "run", str(strategy), *TINY, "--out", str(out), "--results", str(results)]
    done = subprocess.run(command, cwd=REPO, env={**os.environ, **env, "OMP_NUM_THREADS": "1"}, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    [record] = [r.model_dump() for r in read_records([results / "2d.jsonl"]).records]
    assert record["status"] == "ok" and record["hardware_seen"]["devices"] == 4
    assert len(list(out.glob("*.png"))) == 1
