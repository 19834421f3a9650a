"""Command-line values out of a workload field's bounds: one line naming the flag, exit 2, before any work starts."""

import pytest
from typer.testing import CliRunner

from meshlab.cli.app import app
from meshlab.cli.commands_check import register

from tests.conftest import STRATEGIES

if "check" not in {c.name for c in app.registered_commands}:
    register(app)

TWO_D = str(next(p for p in STRATEGIES if p.stem == "2d"))


@pytest.mark.parametrize("args, message", [
    (["check", TWO_D, "--height", "100000"],
     "command line: --height: Input should be less than or equal to 16384; --height is image height in pixels"),
    (["check", TWO_D, "--batch", "4"],
     "--batch 4 sets the images XLA:TPU compiles, and --backend is xla, whose check runs one sample per chip; add "
     "--backend tpu, or drop --batch"),
    (["run", TWO_D, "--steps", "5000", "--checkpoint", "tiny"],
     "command line: --steps: Input should be less than or equal to 1000; --steps is denoising steps"),
    (["sweep", "--model", "qwen-image", "--hardware", "v6e-8", "--batch-per-replica", "1024", "--no-progress"],
     "--batch-per-replica 1024 on 8 devices makes batches of up to 8192 images, over the workload's 4096; ask for "
     "at most 512 images per replica"),
])
def test_a_flag_out_of_bounds_is_one_line_and_exit_2(args, message):
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 2, result.output
    [line] = result.stderr.strip().splitlines()
    assert line == f"meshlab: error: {message}"


@pytest.mark.parametrize("args, says", [
    (["run", "strategies/2d.yaml", "--layers", "0"],
     "command line: Invalid value for '--layers': Input should be greater than or equal to 1; see `meshlab run --help`"),
    (["try", "strategies/2d.yaml", "--bogus"], "command line: No such option: --bogus; see `meshlab try --help`"),
    (["sweep", "--hardware", "v6e-8"], "command line: Missing option '--model'; see `meshlab sweep --help`"),
    (["nosuch"], "command line: No such command 'nosuch'; see `meshlab --help`"),
])
def test_click_s_own_usage_errors_are_one_line_too(args, says):
    """Options typer checks itself (types, ranges, unknown or missing ones) come out as meshlab's one line, not
    typer's boxed usage text."""
    import subprocess
    import sys

    from tests.conftest import REPO

    done = subprocess.run([sys.executable, "-m", "meshlab", *args], capture_output=True, text=True, cwd=REPO)
    says = says.replace("`meshlab", "`python -m meshlab")  # click names the program as it was started
    assert done.returncode == 2 and done.stderr == f"meshlab: error: {says}\n"


def test_meshlab_alone_still_prints_its_help():
    import subprocess
    import sys

    import re

    done = subprocess.run([sys.executable, "-m", "meshlab"], capture_output=True, text=True)
    shown = done.stdout + done.stderr
    assert done.returncode == 2 and "Usage: python -m meshlab" in shown
    commands = set(re.findall(r"^│ ([a-z]+) ", shown, flags=re.M))
    assert {"try", "compare", "sweep", "explain", "export", "check", "run", "report", "calibrate", "profile",
            "schema", "hardware", "models"} == commands
