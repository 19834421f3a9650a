"""meshlab check's bad input and missing backend, without torch; the pure modules stay free of torch."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from meshlab.cli.app import app
from meshlab.cli.commands_check import register

from tests.conftest import REPO, STRATEGIES

if "check" not in {c.name for c in app.registered_commands}:
    register(app)


def invoke(*args):
    return CliRunner().invoke(app, list(args))


def test_missing_torch_xla_is_one_line_naming_the_extra(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torch_xla" else real(name, *a))
    result = invoke("check", str(STRATEGIES[0]))
    assert result.exit_code == 2  # the user's to fix, as bad input is
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("meshlab: error: torch_xla is not installed")
    assert "pip install -e '.[xla]'" in lines[0]


@pytest.mark.parametrize("args, message", [
    (["--height", "100"], "command line: --height 100 is not a positive multiple of 16"),  # not a strategy line
    (["--layers", "0"], "--layers"),
])
def test_bad_options_exit_2(args, message):
    result = invoke("check", str(STRATEGIES[0]), *args)
    assert result.exit_code == 2
    assert message in result.output + result.stderr


def test_a_missing_strategy_file_exits_2():
    result = invoke("check", "no-such.yaml")
    assert result.exit_code == 2


@pytest.mark.parametrize("module", ["meshlab", "meshlab.check.hlo", "meshlab.check.verdict",
                                    "meshlab.check.against_xla", "meshlab.export.snippets", "meshlab.models.truncate",
                                    "meshlab.cli.commands_check", "meshlab.plan.placements",
                                    "meshlab.check.against_dtensor", "meshlab.parallelisms.dtensor", "meshlab.experiments.run",
                                    "meshlab.cost.topology", "meshlab.search.sweep"])
def test_pure_modules_do_not_import_torch(module):
    code = f"import sys, {module}; assert 'torch' not in sys.modules, 'torch imported'"
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO)
    assert run.returncode == 0, run.stderr


SYNC_SCRIPT = """
import time, torch, torch_xla
from meshlab.parallelisms import xla
device = torch_xla.device()
b = torch.randn(1024, 1024, device=device)
def step(x):
    for _ in range(16):
        x = torch.tanh(x @ b)
    return x
x = step(b)
xla.sync()  # compiles
start = time.perf_counter(); x = step(x); xla.sync(); ran = time.perf_counter() - start
start = time.perf_counter(); x.cpu(); fetched = time.perf_counter() - start
print(ran, fetched)
"""


@pytest.mark.slow
@pytest.mark.serial  # a fetch of milliseconds timed against a step: another test's load could stall either
@pytest.mark.skipif(importlib.util.find_spec("torch_xla") is None, reason="needs torch_xla")
def test_sync_waits_for_the_device_so_step_times_cover_the_work():
    """After xla.sync() the result is computed: fetching it costs a small part of the step it ended (without the
    wait, torch_xla 2.9's CPU backend runs the graph during the fetch instead)."""
    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "1"}
    run = subprocess.run([sys.executable, "-c", SYNC_SCRIPT], capture_output=True, text=True, cwd=REPO, env=env)
    assert run.returncode == 0, run.stderr
    ran, fetched = map(float, run.stdout.split())
    assert fetched < 0.25 * ran, (ran, fetched)
