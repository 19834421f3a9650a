"""`meshlab profile`: bad input is one line and exit 2, a failed profile leaves no file; the slow test profiles this
CPU and holds a 2-layer Qwen-Image run to the profile's prediction (issue 8's validation)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from meshlab.runtime.protocol import WorkerFailed
from meshlab.core.errors import InputError

ROOT = Path(__file__).resolve().parents[2]
ONE_CPU = ROOT / "experiments" / "strategies" / "qwen-image-one-cpu.yaml"


def _strategy(folder: Path, steps: int = 5, side: int | None = None) -> Path:
    data = yaml.safe_load(ONE_CPU.read_text())
    data.update(hardware="cpu.json")
    data["workload"]["steps"] = steps
    if side:
        data["workload"].update(height=side, width=side)
    path = folder / "one.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _meshlab(*args, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "meshlab", *map(str, args)], capture_output=True, text=True, cwd=cwd)


@pytest.mark.parametrize("extra, says", [
    (["--backend", "tpu"], "unknown backend 'tpu'"),
    (["--text-tokens", "8,x"], "--text-tokens '8,x' is not a list"),
    (["--hardware", "zz-99"], "--hardware 'zz-99' is not a catalog entry"),
])
def test_bad_options_are_one_line_and_exit_2(tmp_path, extra, says):
    done = _meshlab("profile", _strategy(tmp_path), "-o", tmp_path / "cpu.json", *extra)
    assert done.returncode == 2 and says in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "cpu.json").exists()


def test_the_output_must_be_a_json_file_in_a_writable_folder(tmp_path):
    done = _meshlab("profile", _strategy(tmp_path), "-o", tmp_path / "missing" / "cpu.json")
    assert done.returncode == 2 and "not a writable folder" in done.stderr
    done = _meshlab("profile", _strategy(tmp_path), "-o", tmp_path / "cpu.txt")
    assert done.returncode == 2 and "a profile is a .json file" in done.stderr


def test_an_output_that_cannot_be_written_is_refused_before_measuring(tmp_path, monkeypatch):
    from meshlab.experiments import profiling

    def measure(*_args, **_kwargs):
        raise AssertionError("the worker started: -o was checked only after minutes of measuring")

    monkeypatch.setattr(profiling, "call_worker", measure)
    (tmp_path / "folder.json").mkdir()
    with pytest.raises(InputError, match="is a folder"):
        profiling.profile_strategy(_strategy(tmp_path), profiling.ProfileOptions(out=tmp_path / "folder.json",
                                                                                 backend="xla"))


def test_a_failed_profile_leaves_no_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    from meshlab.experiments import profiling

    out = tmp_path / "cpu.json"
    out.write_text("the profile measured before")

    def fail(*_args, **_kwargs):
        raise WorkerFailed("the worker died", "")

    monkeypatch.setattr(profiling, "call_worker", fail)
    with pytest.raises(WorkerFailed):
        profiling.profile_strategy(_strategy(tmp_path), profiling.ProfileOptions(out=out, backend="xla"))
    assert out.read_text() == "the profile measured before"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cpu.json", "one.yaml"]


def test_a_plan_the_profile_is_the_hardware_of_is_planned_before_it_exists(tmp_path):
    from meshlab.experiments.profiling import plan_for_profiling

    planned = plan_for_profiling(_strategy(tmp_path))
    assert planned.plan.mesh.device_count == 1 and planned.hardware.profile is None


def test_the_plain_pytorch_profile_is_one_device(tmp_path):
    from meshlab.experiments.profiling import ProfileOptions, profile_strategy

    data = yaml.safe_load((ROOT / "strategies" / "model.yaml").read_text())
    path = tmp_path / "model.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(InputError, match="plain PyTorch profiles one device"):
        profile_strategy(path, ProfileOptions(out=tmp_path / "p.json", backend="torch"))


#: How far a run may be from its profile's prediction in this test. The issue's target is 15%, and that is what
#: `benchmarks/cpu_validation.py` measures and the notes report (+4.3% and +5.1% on one device). This shared 2-core
#: machine also drifts: in two CI runs with the same profile prediction (4.54 s and 4.63 s), one run's steady steps
#: were 4.25 to 4.59 s and the other's 5.16 to 5.75 s, its first step and VAE decode slower by the same 20%. So a
#: unit test holds only what a bug would break: a wrong basis, call count or text length is 2x or more. It runs at
#: 128x128 (64 image tokens), with the call timed at the 12 text tokens the random checkpoint's prompt encodes to
#: (tests/cost/test_profile.py holds the interpolation between text lengths): 105 s here, where the benchmark's
#: 256x256 at 8 and 32 text tokens takes 190 s. The profile is taken at the run's shapes, so a bug in the basis
#: shows the same.
RUN_VS_PROFILE = 0.5
ENCODED_TEXT_TOKENS = 12


@pytest.mark.slow
@pytest.mark.serial  # a run timed against a profile taken minutes before: no other test's load between them
def test_a_two_layer_cpu_run_is_priced_by_its_profile(tmp_path):
    strategy = _strategy(tmp_path, side=128)
    done = _meshlab("profile", strategy, "-o", tmp_path / "cpu.json", "--no-vae", "--backend", "xla",
                    "--text-tokens", ENCODED_TEXT_TOKENS)
    assert done.returncode == 0, done.stderr
    profile = json.loads((tmp_path / "cpu.json").read_text())
    assert {p["op"] for p in profile["points"]} >= {"linear", "attention", "outer", "stack", "block", "dispatch"}
    assert profile["device"]["platform"] == "cpu" and profile["device"]["devices"] == 1
    done = _meshlab("run", strategy, "--checkpoint", "random", "--layers", "2", "--backend", "xla",
                    "--results", tmp_path, "--out", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    record = json.loads((tmp_path / "qwen-image-one-cpu.jsonl").read_text().splitlines()[-1])
    prediction, measured = record["prediction"], record["timings"]["steady_step_median_s"]
    assert prediction["priced"]["basis"] == "blocks" and prediction["priced"]["assumed"] == []
    # priced at what the run encoded, not at the strategy's text length
    assert prediction["strategy_text_tokens"] == 32 and prediction["text_tokens"] == ENCODED_TEXT_TOKENS
    assert prediction["elementwise"] == "fused"  # XLA fuses the elementwise work it compiles
    assert abs(prediction["step_s"] - measured) / measured < RUN_VS_PROFILE, (prediction["step_s"], measured)
    done = _meshlab("calibrate", tmp_path / "qwen-image-one-cpu.jsonl", "--hardware", tmp_path / "cpu.json", "--json")
    assert done.returncode == 0, done.stderr
    slowdown = json.loads(done.stdout)["slowdown"]  # measured over predicted: calibrate reads the same record
    assert slowdown == pytest.approx(measured / prediction["step_s"], rel=0.05)
    assert 1 - RUN_VS_PROFILE < slowdown < 1 + RUN_VS_PROFILE


def test_the_summary_shows_every_call_point(tmp_path):
    import io
    from types import SimpleNamespace

    from rich.console import Console

    from meshlab.cli.render_run import render_profile
    from meshlab.core.profile_file import profile_document
    from meshlab.core.profile_points import Point

    points = (Point("linear", (8, 16, 16), 4096.0, 1.0, 0.001), Point("outer", (256, 8, 2), 0, 0, 2.0),
              Point("block", (256, 8, 2), 0, 0, 2.5, "transformer_blocks"), Point("stack", (256, 8, 2, 3), 0, 0, 7.0))
    document = profile_document({"platform": "cpu", "devices": 1, "name": "test CPU"}, {}, {"strategy": "s"}, points,
                                1.0)
    out = io.StringIO()
    render_profile(SimpleNamespace(document=document, seconds=1.0, path=tmp_path / "p.json"),
                   Console(file=out, width=200))
    text = out.getvalue()
    assert "1 block(s) per list, whole call" in text and "transformer_blocks[0] alone" in text
    assert "3 block(s) per list, whole call" in text and "256x8x2x3" in text
