"""`meshlab sweep` across systems from the command line: the document, the default set, goals and bad input."""

import json

import pytest
from typer.testing import CliRunner

from meshlab.cli.app import app

runner = CliRunner()


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a sweep writes best.yaml beside the caller unless told otherwise


def sweep(*args, cwd=None):
    return runner.invoke(app, ["sweep", "--model", "qwen-image", "--no-progress", *args])


def test_the_json_document_names_best_cheapest_and_each_system(tmp_path):
    done = sweep("--hardware", "v6e-8,h100:1", "--json", "--out", str(tmp_path / "best.yaml"), cwd=tmp_path)
    assert done.exit_code == 0, done.output
    doc = json.loads(done.output)
    assert doc["hardware"] == ["v6e-8", "h100:1"] and doc["default_systems"] == []
    names = {c["name"]: c for c in doc["candidates"]}
    assert doc["best"] in names and doc["cheapest"] in names
    best, cheapest = names[doc["best"]], names[doc["cheapest"]]
    fitting = [c for c in doc["candidates"] if c["fits"]]
    assert best["predicted"]["seconds_per_image"] == min(c["predicted"]["seconds_per_image"] for c in fitting)
    assert cheapest["predicted"]["usd_per_image"] == min(c["predicted"]["usd_per_image"] for c in fitting)
    assert [s["hardware"] for s in doc["systems"]] == ["v6e-8", "h100:1"]
    assert all(s["binding"]["term"] and s["usd_per_chip_hour"] > 0 for s in doc["systems"])
    assert (tmp_path / "best.yaml").read_text().startswith("# Written by `meshlab sweep`")


def test_no_hardware_sweeps_the_default_set_and_says_so(tmp_path):
    from meshlab.sweep import DEFAULT_SYSTEMS

    done = sweep("--out", str(tmp_path / "b.yaml"), cwd=tmp_path)
    assert done.exit_code == 0, done.output
    assert "meshlab's default set" in done.output and all(name in done.output for name in DEFAULT_SYSTEMS)


def test_a_goal_no_plan_meets_is_an_empty_front_not_an_error(tmp_path):
    done = sweep("--hardware", "v6e-8", "--max-seconds-per-image", "0.1", "--json", "--out",
                 str(tmp_path / "b.yaml"), cwd=tmp_path)
    assert done.exit_code == 0, done.output
    doc = json.loads(done.output)
    assert doc["best"] is None and doc["cost_front"] == [] and doc["closest"]["binding"]["term"]
    assert "over the 0.1 s goal" in doc["closest"]["misses"] and not (tmp_path / "b.yaml").exists()


@pytest.mark.parametrize("args, says", [
    (["--hardware", "v6e-8,nosuch"], "--hardware: unknown hardware 'nosuch'; use one of: v6e-1"),
    (["--hardware", "v6e-8,h100", "--devices", "4"], "--devices 4 re-sizes one system, and 2 are swept"),
    (["--hardware", "v6e-8", "--budget-usd-per-image", "-1"], "--budget-usd-per-image -1.0 is not a goal"),
    (["--hardware", "v6e-8", "--max-seconds-per-image", "nan"], "--max-seconds-per-image nan is not a goal"),
    (["--hardware", " , "], "names no system"),
    (["--hardware", "v6e-8", "--json", "--out", "-"], "--out - and --json would print YAML and JSON on one stdout"),
])
def test_bad_input_is_one_line_and_exit_2(args, says, tmp_path):
    done = sweep(*args, cwd=tmp_path)
    assert done.exit_code == 2 and says in done.output and "Traceback" not in done.output
    assert not list(tmp_path.iterdir())  # nothing written


def test_images_share_the_startup_and_say_when_it_outweighs_them(tmp_path):
    done = sweep("--hardware", "v6e-8", "--images", "5", "--json", "--out", str(tmp_path / "b.yaml"))
    doc = json.loads(done.output)
    assert doc["usd_per_image_over"] == 5
    best = next(c for c in doc["candidates"] if c["name"] == doc["best"])
    p = best["predicted"]
    startup = p["time_to_first_image"]["startup_s"]
    assert abs(best["usd_per_image_over_images"] - p["usd_per_hour"] * (startup + 5 * p["seconds_per_image"]) / 3600 / 5
               ) < 1e-12
    shown = sweep("--hardware", "v6e-8", "--images", "5", "--out", str(tmp_path / "b.yaml"))
    assert "take longer than the 5 images" in shown.output
