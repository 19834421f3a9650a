"""Command-line values out of a workload field's bounds: one line naming the flag, exit 2, before any work starts."""

import json

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
    # a frame count no candidate can take: the flag named (checked before the sweep's progress bar starts)
    (["sweep", "--model", "wan-2.1-t2v-14b", "--hardware", "v6e-8", "--frames", "80"],
     "command line: --frames: workload.frames 80 is not 1 + a multiple of 4 (the VAE compresses 4 frames to one "
     "after the first); use 77 or 81"),
    (["try", "--model", "qwen-image", "--hardware", "h100:9"],
     "command line: --hardware: 'h100:9' asks for 9 of the h100 node's 8 GPUs; name 1 to 8 of them (h100:1 ... "
     "h100:8), or h100 for the whole node"),
    (["try", "--model", "qwen-image", "--hardware", "v6e-8:2"],
     "command line: --hardware: 'v6e-8:2': a TPU system is named whole (its size is in its name); use one of: "
     "v6e-1, v6e-4, v6e-8, v6e-16, v6e-32, v6e-64, v6e-128, v6e-256, v5e-8, v5p-8, v4-8, v6e-8x2, v6e-8x4, "
     "v6e-64x2, v6e-256x2, v6e-256x4, v5e-8x2, v5p-8x2"),
    (["compare", TWO_D, "--plot", "plot.txt"],
     "command line: --plot: plot.txt: the plot is a PNG image; name a .png file, e.g. plot.png"),
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


def test_a_card_file_that_is_not_there_is_named_as_missing(tmp_path):
    (tmp_path / "s.yaml").write_text("name: s\nmodel: cards/nocard.json\nhardware: v6e-8\nmesh: {data: 8}\n")
    result = CliRunner().invoke(app, ["try", str(tmp_path / "s.yaml")])
    assert result.exit_code == 2
    assert result.stderr.startswith(f"meshlab: error: {tmp_path / 's.yaml'}:2:1: no such model card file "
                                    f"'{tmp_path / 'cards' / 'nocard.json'}'; check the path")


def test_the_text_encoder_flag_takes_the_strategy_file_s_name_for_the_host():
    """`--text-encoder cpu` is `host`, as `placement.text_encoder: cpu` names it in a strategy file."""
    host = CliRunner().invoke(app, ["try", "--model", "qwen-image", "--hardware", "h100", "--text-encoder", "host",
                                    "--json"])
    cpu = CliRunner().invoke(app, ["try", "--model", "qwen-image", "--hardware", "h100", "--text-encoder", "cpu",
                                   "--json"])
    assert host.exit_code == cpu.exit_code == 0, cpu.output
    assert host.stdout == cpu.stdout and json.loads(cpu.stdout)["text_encoder"] == "on the host (--text-encoder)"


def test_a_quick_question_whose_plan_does_not_fit_points_to_the_sweep():
    """`try --model qwen-image --hardware v6e-8` plans every weight whole (38 GiB a chip, over v6e's 31.25): the
    answer ends with where to find a plan that fits; a quick plan that fits has no such hint."""
    unfit = " ".join(CliRunner().invoke(app, ["try", "--model", "qwen-image", "--hardware", "v6e-8"]).stdout.split())
    assert "DOES NOT FIT" in unfit and unfit.endswith(
        "hint: this plan does not fit; `meshlab sweep --model qwen-image --hardware v6e-8` finds the best that does, "
        "or name one with --rules (2d, pairs, fsdp, ulysses+pairs, ...) and --mesh")
    fits = CliRunner().invoke(app, ["try", "--model", "qwen-image", "--hardware", "v6e-8", "--rules", "2d",
                                    "--mesh", "data=2,model=4"]).stdout
    assert "FITS" in fits and "hint:" not in fits
