"""torchax's attention as the TPU check replaces it with a flash kernel (meshlab.workers.check_tpu.flash_sdpa), run on
8 virtual CPU devices against torchax's own reference math by tests/check/flash_kernel_probe.py (a stand-in for the
Pallas kernel, which runs on no CPU; everything around it is meshlab's)."""

import importlib.util
import json
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.skipif(not all(importlib.util.find_spec(m) for m in ("jax", "torchax")),
                                reason="needs the [tpu] extra: jax, torchax")


@pytest.fixture(scope="module")
def probe():
    done = subprocess.run([sys.executable, str(REPO / "tests" / "check" / "flash_kernel_probe.py")],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


KERNEL = ["blocks divide", "queries and keys padded", "queries padded", "keys padded", "boolean mask",
          "boolean mask of one sample", "boolean mask and padding", "additive mask over heads",
          "a batch no axis divides"]


@pytest.mark.parametrize("name", KERNEL)
def test_the_kernel_computes_what_torch_s_reference_math_does(probe, name):
    """Padding masked off by segment ids, a key-padding mask (boolean, or additive over the heads) as segment ids,
    one sample's mask broadcast, a batch too small to split: each the reference's attention to float32 rounding."""
    case = probe["cases"][name]
    assert case["calls"] == {"kernel": 1} and case["error"] < 1e-5


def test_each_chip_runs_its_slice_in_whole_blocks(probe):
    """Layout (data, model, ring) on a 2x2x2 mesh: one sample, one head and half the queries a chip, every key;
    tokens no block divides are padded to whole 128-token blocks, and then the kernel takes segment ids."""
    cases = probe["cases"]
    assert cases["blocks divide"]["kernel"] == [[[1, 1, 128, 16], [1, 1, 256, 16], False]]
    assert cases["queries and keys padded"]["kernel"] == [[[1, 1, 256, 16], [1, 1, 512, 16], True]]
    assert cases["keys padded"]["kernel"] == [[[1, 1, 128, 16], [1, 1, 384, 16], True]]
    # one sample: on every chip (no axis splits it), its heads and queries still split
    assert cases["a batch no axis divides"]["kernel"] == [[[1, 1, 128, 16], [1, 1, 256, 16], True]]


@pytest.mark.parametrize("name", ["integer mask", "a mask per query", "keys of another batch", "a head dim of 192"])
def test_a_call_the_kernel_does_not_take_keeps_the_reference_math_and_is_counted(probe, name):
    """torchax adds an integer mask as a bias, a mask per query is no key padding, a batch of keys unlike the
    queries' has no layout, the kernel takes head dims to 128 or whole 128s: each stays torchax's own lowering,
    counted as such."""
    case = probe["cases"][name]
    assert case["calls"] == {"reference": 1} and case["kernel"] == [] and case["error"] == 0.0


def test_only_a_planned_attention_runs_the_kernel_and_torchax_gets_its_own_back(probe):
    """A model with two attention modules, one in the plan's layouts: that one runs the kernel, the other the
    reference; afterwards torchax's op table holds its own lowering again and no module name is left open."""
    assert probe["planned_modules"] == {"kernel": 1, "reference": 1}
    assert probe["restored"] and probe["names_left"] == []
