"""XLA:TPU's tiled layouts: meshlab's reading of a layout and its rule for the layout XLA:TPU picks, held to what
libtpu's compiler wrote (tests/core/data/tpu_layouts.jsonl, from benchmarks/tpu_tile_layouts.py) and to the
arguments of two real programs (tests/check/data/tpu_entry_*.txt)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from meshlab.check import hlo
from meshlab.core.tpu_tiles import tiled_bytes
from tests.conftest import REPO

DATA = Path(__file__).parent / "data"
COMPILES = [json.loads(line) for line in (DATA / "tpu_layouts.jsonl").read_text().splitlines()]


def test_the_measurements_cover_every_usage():
    assert {c["usage"] for c in COMPILES} == {"alone", "linear", "conv1x1", "depthwise3x3"} and len(COMPILES) == 90


@pytest.mark.parametrize("compile_", COMPILES, ids=lambda c: f"{c['usage']}-{'-'.join(c['arguments'])}")
def test_layouts_read_and_rule_equal_what_xla_tpu_allocated(compile_):
    arguments = [hlo.laid_out(a) for a in compile_["arguments"]]
    assert sum(a.bytes for a in arguments) == compile_["argument_bytes"]  # the layout read as XLA:TPU sizes it
    for a in arguments:  # the layout XLA:TPU chose is the one that pads least
        assert tiled_bytes(a.shape.dims, int(hlo.ELEMENT_BYTES[a.shape.dtype])) == a.bytes, a.shape


def test_tiles_pad_as_measured():
    assert tiled_bytes((2240, 2240), 2) == 2240 * 2304 * 2  # both dims 2240: the minor one pads to 2304
    assert tiled_bytes((3072, 2240), 2) == 3072 * 2240 * 2  # 3072 laid minor: no padding
    assert tiled_bytes((1536,), 2) == 2048 * 2  # a 1-D array pads to a multiple of 1024
    assert tiled_bytes((128,), 2) == 512 and tiled_bytes((), 4) == 512  # 512 bytes at least


@pytest.mark.parametrize("name", ["sana-2d", "cog-2d"])
def test_a_plans_weights_equal_xla_tpu_s_arguments_to_the_byte(name):
    """The entry arguments of XLA:TPU's program (two blocks, 256²): they sum to memory_analysis' argument bytes,
    and less the inputs (read from the program) they are the plan's weights as the TPU lays them out, exactly.
    SANA's 2240-wide Linears pad; CogVideoX's video latent (32 wide) pads 4x and its RoPE table comes 8 times."""
    from meshlab.check.against_tpu import other_arguments
    from meshlab.check.setup import CheckOptions, check_setup
    from meshlab.check.verdict import dead_tail_parameters, dead_tail_weight_bytes

    text = (REPO / "tests" / "check" / "data" / f"tpu_entry_{name}.txt").read_text()
    arguments = hlo.entry_arguments(text)
    assert sum(a.bytes for a in arguments) == int(re.search(r"argument bytes: (\d+)", text).group(1))
    setup = check_setup(REPO / "tests" / "cost" / "data" / "strategies" / f"{name}.yaml",
                        CheckOptions(layers=2, height=256, width=256))
    chip = setup.memory.most_loaded
    other, missing = other_arguments(arguments, setup)
    weights = sum(a.bytes for a in arguments) - other["not_weights"]
    assert weights == chip.weights - dead_tail_weight_bytes(setup, tiles=True)
    assert missing == len(dead_tail_parameters(setup))  # every planned shard found, but what XLA drops
    if name == "sana-2d":
        assert chip.tile_padding > 0.016 * chip.weights  # without the tiles the prediction would miss by 1.7%
