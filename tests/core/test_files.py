"""meshlab.core.files: every output is written whole, never over an input, a folder or a device; links are written
through and a replaced file keeps its permissions."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from meshlab.core.errors import InputError
from meshlab.core.files import output_path, write_atomic

from tests.conftest import REPO


def test_a_new_file_gets_the_umask_mode_and_a_replaced_one_keeps_its_own(tmp_path):
    old = os.umask(0o022)
    try:
        fresh = write_atomic(tmp_path / "new.yaml", "a: 1\n")
        assert fresh.read_text() == "a: 1\n" and fresh.stat().st_mode & 0o777 == 0o644
        kept = tmp_path / "kept.yaml"
        kept.write_text("old")
        kept.chmod(0o640)
        write_atomic(kept, "new")
        assert kept.read_text() == "new" and kept.stat().st_mode & 0o777 == 0o640
    finally:
        os.umask(old)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.yaml", "new.yaml"]  # no temporary left


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path, monkeypatch):
    path = tmp_path / "best.yaml"
    path.write_text("the old plan")

    def full(*_args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", full)
    with pytest.raises(InputError, match="cannot write the output .*best.yaml: No space left on device"):
        write_atomic(path, "the new plan")
    assert path.read_text() == "the old plan" and [p.name for p in tmp_path.iterdir()] == ["best.yaml"]


def test_a_link_is_written_through(tmp_path):
    (tmp_path / "real.yaml").write_text("old")
    (tmp_path / "link.yaml").symlink_to("real.yaml")
    write_atomic(tmp_path / "link.yaml", "new")
    assert (tmp_path / "link.yaml").is_symlink() and (tmp_path / "real.yaml").read_text() == "new"


@pytest.mark.parametrize("target, says", [
    ("folder", "is a folder"),
    ("/dev/null", "is not a regular file"),
    ("missing/out.yaml", "is not a folder"),
    ("input.yaml", "is one of this command's inputs"),
    ("link-to-input.yaml", "is one of this command's inputs"),
])
def test_what_is_not_an_output_file_is_refused_before_anything_is_written(tmp_path, target, says):
    (tmp_path / "folder").mkdir()
    (tmp_path / "input.yaml").write_text("the input")
    (tmp_path / "link-to-input.yaml").symlink_to("input.yaml")
    path = target if target.startswith("/") else tmp_path / target
    with pytest.raises(InputError, match=says):
        output_path(path, [tmp_path / "input.yaml"], "--out")
    with pytest.raises(InputError, match=says):
        write_atomic(path, "x", [tmp_path / "input.yaml"], "--out")
    assert (tmp_path / "input.yaml").read_text() == "the input"


def test_report_refuses_to_plot_over_its_records(tmp_path):
    pytest.importorskip("matplotlib")
    records = tmp_path / "runs.jsonl"
    shutil.copy(REPO / "experiments" / "records" / "qwen-image-one-cpu.jsonl", records)
    before = records.read_bytes()
    done = subprocess.run([sys.executable, "-m", "meshlab", "report", str(records), "--plot", str(records)],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "--plot" in done.stderr and "the plot is a PNG image" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and records.read_bytes() == before
    named_png = tmp_path / "runs.png"  # records under a PNG's name: refused as an input, not by the name
    shutil.copy(records, named_png)
    done = subprocess.run([sys.executable, "-m", "meshlab", "report", str(named_png), "--plot", str(named_png)],
                          capture_output=True, text=True)
    assert done.returncode == 2 and "--plot" in done.stderr and "one of this command's inputs" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1 and named_png.read_bytes() == before
    done = subprocess.run([sys.executable, "-m", "meshlab", "report", str(records), "--plot", str(tmp_path / "p.png")],
                          capture_output=True, text=True)
    assert done.returncode == 0 and (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("args", [["export", "strategies/data.yaml"], ["try", "strategies/2d.yaml", "--json"],
                                  ["schema"]])
def test_a_full_disk_on_stdout_is_one_line_and_exit_2(args):
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "meshlab", *args], stdout=full, stderr=subprocess.PIPE,
                              text=True, cwd=REPO)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == ["meshlab: error: cannot write the output: No space left on device; "
                                                "free space or write it elsewhere"]


@pytest.mark.parametrize("command", ["try", "explain", "report"])
def test_a_device_given_as_an_input_is_refused_not_read_forever(command):
    done = subprocess.run([sys.executable, "-m", "meshlab", command, "/dev/zero"], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2 and "/dev/zero: is a device" in done.stderr


@pytest.mark.parametrize("command, source", [("try", "strategies/2d.yaml"), ("report", "experiments/records/2d.jsonl")])
def test_a_pipe_is_read_like_a_file(command, source):
    done = subprocess.run([sys.executable, "-m", "meshlab", command, "/dev/stdin", "--json"], capture_output=True,
                          text=True, timeout=60, cwd=REPO, input=(REPO / source).read_text())
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)


def test_a_full_disk_under_a_file_the_command_writes_names_that_file(capsys):
    """Not stdout: the one line names the file, and stdout stays as it was."""
    import errno

    import typer

    from meshlab.cli.output import reports_errors

    @reports_errors
    def command():
        print("the outcome so far")
        raise OSError(errno.ENOSPC, "No space left on device", "results/data.jsonl")

    with pytest.raises(typer.Exit) as exit_:
        command()
    captured = capsys.readouterr()
    assert exit_.value.exit_code == 2 and captured.out == "the outcome so far\n"
    assert captured.err == ("meshlab: error: cannot write results/data.jsonl: No space left on device; free space "
                            "and run it again\n")


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_help_to_a_full_disk_is_one_line_too():
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "meshlab", "models"], stdout=full, stderr=subprocess.PIPE,
                              text=True, cwd=REPO)
    assert done.returncode == 2 and done.stderr.startswith("meshlab: error: cannot write the output")


def test_shipped_strategies_quote_no_predicted_time_that_could_go_stale():
    """A header explains a plan; the figures the cost model predicts come from `meshlab explain`, not a comment."""
    import re

    stale = re.compile(r"\b\d+(\.\d+)? ?(s|ms|us|min|minutes|seconds|hours)\b|\d ?s/(image|video|step)|\bMFU\b|"
                       r"(?-i:Predicted)|predicted:", re.I)
    assert stale.search("1.09 s/image") and stale.search("16 min a video") and stale.search("45 ms on v6e-8")
    for path in sorted((REPO / "strategies").glob("*.yaml")) + sorted((REPO / "experiments").rglob("*.yaml")):
        comments = [line for line in path.read_text().splitlines() if line.lstrip().startswith("#")]
        assert not [line for line in comments if stale.search(line)], path.name


def test_every_file_a_shipped_strategy_or_experiment_names_is_in_the_repository():
    """A profile or card named as a strategy's hardware or model, and an experiment's strategies, all exist."""
    import yaml

    for path in sorted((REPO / "experiments").rglob("*.yaml")) + sorted((REPO / "strategies").glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        hardware = data.get("hardware")
        named = [hardware if isinstance(hardware, str) else (hardware or {}).get("name"), data.get("model")]
        named += list(data.get("strategies") or [])
        for name in named:
            if isinstance(name, str) and name.endswith((".json", ".yaml")):
                assert (path.parent / name).exists(), f"{path.relative_to(REPO)} names {name}"
