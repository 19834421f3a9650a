"""The check's verdict and its rendering, from a checked-in dump excerpt and a fabricated read-back (no torch)."""

from __future__ import annotations

import io
from collections import Counter
from pathlib import Path

import pytest
from rich.console import Console

from meshlab.backend import hlo
from meshlab.backend.compare import OUTSIDE, CheckReport, check_document, collectives_of
from meshlab.backend.readback import compare_parameter, expected_slices, predicted_sharding
from meshlab.backend.setup import CheckOptions, check_setup
from meshlab.cli.render_check import render_check

from tests.conftest import REPO

DATA = Path(__file__).parent / "data"


def fabricated(misplace: str | None = None) -> CheckReport:
    """One Qwen-Image block under 2d.yaml, read back as the plan says (or with one parameter's shards swapped)."""
    setup = check_setup(REPO / "strategies" / "2d.yaml", CheckOptions())
    mesh, ids = setup.plan.mesh, tuple(range(8))
    parameters = []
    for p in setup.plan.parameters:
        slices = [expected_slices(p, mesh, d) for d in ids]
        if p.name == misplace:
            slices[0], slices[1] = slices[1], slices[0]
        parameters.append(compare_parameter(p, mesh, ids, predicted_sharding(p.spec, mesh, ids), slices))
    collectives = collectives_of(hlo.parse_collectives((DATA / "qwen_2d_partitioned_excerpt.txt").read_text()),
                                 setup, ids)
    memory = hlo.parse_buffer_assignment((DATA / "qwen_2d_buffer_assignment_excerpt.txt").read_text())
    return CheckReport(setup, tuple(parameters), collectives, memory, 0.02, 3.7, "CPU", 8,
                       ({"compiles": 2, "seconds": 8.0}, {"compiles": 2, "seconds": 7.0}),
                       {"build": 3.0, "reference": 2.0, "apply": 1.5}, "module_0050.txt", {})


def test_per_block_and_full_depth_collectives():
    report = fabricated()
    blocks = report.per_block()
    assert blocks["transformer_blocks.0"] == {"all-reduce": 1, "all-gather": 15, "collective-permute": 24}
    assert blocks[OUTSIDE] == {"all-reduce": 2, "all-gather": 4, "collective-permute": 4}
    # one checked block of 60: outside once, the block 60 times
    assert report.full_depth_collectives() == {"all-reduce": 62, "all-gather": 904, "collective-permute": 1444}


def test_full_depth_weights_extrapolate_to_the_full_plan():
    report = fabricated()
    predicted, xla = report.full_depth_weights()
    full = report.setup.planned.plan
    assert predicted == xla == sum(p.bytes_per_device(full.mesh) for p in full.parameters)


def test_agreement_and_a_misplaced_shard():
    assert fabricated().agrees
    report = fabricated(misplace="transformer_blocks.0.attn.to_q.weight")
    assert [p.name for p in report.mismatches] == ["transformer_blocks.0.attn.to_q.weight"]
    assert report.mismatches[0].misplaced == (0, 1)
    assert not report.agrees


def test_an_output_beyond_the_tolerance_disagrees():
    report = fabricated()
    object.__setattr__(report, "max_abs_error", 1.0)
    assert not report.output_agrees and not report.agrees


def test_json_document_has_what_the_issue_asks_for():
    document = check_document(fabricated())
    assert set(document["parameters"][0]) >= {"name", "predicted_spec", "xla_sharding", "predicted_shard_shape",
                                               "xla_shard_shape"}
    assert set(document["collectives"][0]) >= {"kind", "shape", "dtype", "bytes_per_device", "mesh_axes", "layer"}
    assert set(document["xla_memory_per_device"]) >= {"parameters", "temporaries", "outputs", "total"}
    assert document["max_abs_error"] == 0.02
    assert document["collectives"][0]["mesh_axes"] == ["model"]
    assert "temporaries" in document["caveats"]


def test_render_prints_plan_vs_xla_with_the_caveats_beside_the_numbers():
    buffer = io.StringIO()
    render_check(fabricated(misplace="img_in.weight"), Console(file=buffer, width=200, highlight=False))
    text = buffer.getvalue()
    assert "44 of 45" in text and "img_in.weight" in text
    assert "Plan vs XLA" in text and "181.5 MiB" in text
    assert "never emits reduce-scatter" in text and "converted to f32" in text
    assert "the plan and XLA disagree" in text
