"""--scan: every block list through torch_xla's scan, the plan's per-block specs kept on the stacked weights."""

import importlib.util

import pytest

from meshlab.parallelisms.scan import homogeneous_specs
from meshlab.check.setup import CheckOptions, check_setup
from meshlab.core.errors import PlanError
from meshlab.core.spec import PartitionSpec

from tests.conftest import REPO


def test_a_list_whose_blocks_share_specs_gives_one_spec_per_parameter():
    setup = check_setup(REPO / "strategies" / "pairs.yaml", CheckOptions(layers=2, scan=True))
    specs = homogeneous_specs(setup.planned.plan, "transformer_blocks", 60)
    assert specs["attn.to_q.weight"] == PartitionSpec("model", None)
    assert specs["attn.to_out.0.weight"] == PartitionSpec(None, "model")
    assert specs["img_mod.1.weight"] == PartitionSpec(None, "model")
    assert len(specs) == 32  # every parameter of a Qwen-Image block


def test_a_list_whose_blocks_differ_is_refused_before_any_worker(write_strategy):
    text = (REPO / "strategies" / "pairs.yaml").read_text().replace(
        'rules:\n', 'rules:\n  - match: "transformer_blocks.0.attn.to_q.weight"\n    shard: replicate\n', 1)
    path = write_strategy(text)
    with pytest.raises(PlanError, match=r"transformer_blocks\.\*\.attn\.to_q\.weight differs between blocks"):
        check_setup(path, CheckOptions(layers=2, scan=True))
    check_setup(path, CheckOptions(layers=2, scan=False))  # unrolled, it is a valid plan


def test_the_cli_says_so_in_one_line(write_strategy):
    from typer.testing import CliRunner

    from meshlab.cli.app import app

    text = (REPO / "strategies" / "pairs.yaml").read_text().replace(
        'rules:\n', 'rules:\n  - match: "transformer_blocks.0.img_mod.1.weight"\n    shard: replicate\n', 1)
    result = CliRunner().invoke(app, ["check", str(write_strategy(text)), "--scan"])
    assert result.exit_code == 2
    [line] = result.stderr.strip().splitlines()
    assert "--scan needs every block of transformer_blocks alike" in line and "run without --scan" in line


@pytest.mark.xla
@pytest.mark.slow
@pytest.mark.memory  # more than 5 GiB of host memory at once: one at a time (tests/conftest.py)
@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("torch_xla", "diffusers")),
                    reason="needs the xla extra: pip install -e '.[xla]'")
def test_scanned_forward_matches_the_unsharded_model_and_loops(tmp_path):
    """Two full-width Qwen-Image blocks under pairs.yaml, scanned: every shard where the plan puts it, the output
    within bf16 tolerance of the unsharded float32 forward (as unrolled), one XLA while loop in the program."""
    from meshlab.check.against_xla import run_check

    report = run_check(REPO / "strategies" / "pairs.yaml", CheckOptions(layers=2, scan=True, dump_dir=tmp_path))
    assert report.scanned == ("transformer_blocks",)
    assert not report.mismatches and report.output_agrees, (report.max_abs_error, report.tolerance)
    assert " while(" in (tmp_path / report.hlo_module).read_text()
    assert report.compile_seconds > 0 and report.full_depth_compile_seconds() == report.compile_seconds
