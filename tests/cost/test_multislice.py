"""Several slices joined by DCN: catalog entries, `dcn` in a strategy, collectives crossing slices priced at DCN."""

from __future__ import annotations

import math

import pytest

from meshlab.cost.predict import predict
from meshlab.cost.topology import collective_seconds, dcn_seconds, route
from meshlab.core.errors import InputError, PlanError
from meshlab.core.hardware import load_hardware
from meshlab.core.mesh import AbstractMesh
from meshlab.plan.planned import plan_file

STRATEGY = """\
name: {name}
model: qwen-image
hardware: {hardware}
mesh: {{data: {data}, model: 8}}
{dcn}
rules:
  - {{match: "*", min_rank: 2, shard: largest, axis: model}}
activations: {{batch: data}}
rewrites: [layernorm-rows]
workload: {{height: 1024, width: 1024, batch: {data}, steps: 50}}
"""


def write(tmp_path, name="plan", hardware="v6e-8x2", data=2, dcn="dcn: {data: 2}"):
    path = tmp_path / f"{name}.yaml"
    path.write_text(STRATEGY.format(name=name, hardware=hardware, data=data, dcn=dcn))
    return path


def test_a_multislice_name_counts_every_chip_and_host_of_its_slices():
    one, two = load_hardware("v6e-8"), load_hardware("v6e-8x2")
    assert (two.chips, two.hosts, two.slices, two.topology) == (16, 2, 2, one.topology)
    assert two.dcn_bandwidth_per_host == 2.5e10 and "scaling-book" in two.sources["dcn_bandwidth_per_host"]
    assert two.dcn_bandwidth_per_chip == 2.5e10 / 8
    big = load_hardware("v6e-256x4")
    assert (big.chips, big.hosts, big.dcn_bandwidth_per_chip) == (1024, 128, 2.5e10 * 32 / 256)


def test_unknown_multislice_names_are_refused():
    for name in ("h100x2", "v6e-9x2", "v6e-8x1"):
        with pytest.raises(InputError):
            load_hardware(name)


def test_dcn_splits_an_axis_into_slices_and_its_inside_part(tmp_path):
    mesh = AbstractMesh((("data", 4), ("model", 4)))
    hw = load_hardware("v6e-8x2")
    inside = route(("model",), mesh, hw, {"data": 2})  # model stays in the slice: the 4-chip line of the 2x4
    assert (inside.slices, inside.shape) == (1, "line")
    across = route(("data",), mesh, hw, {"data": 2})  # 2 chips in the slice x 2 slices
    assert (across.chips, across.slices, across.shape) == (2, 2, "line+dcn")
    assert across.dcn_bandwidth == hw.dcn_bandwidth_per_chip


def test_dcn_part_of_each_collective():
    hw = load_hardware("v6e-8x2")
    r = route(("data",), AbstractMesh((("data", 4), ("model", 4))), hw, {"data": 2})
    v, bw = 8e6, hw.dcn_bandwidth_per_chip
    assert dcn_seconds("all-gather", v, r) == pytest.approx(v / 2 * 0.5 / bw)  # the ICI-sized piece, half remote
    assert dcn_seconds("all-reduce", v, r) == pytest.approx(2 * v / 2 * 0.5 / bw)
    assert dcn_seconds("all-to-all", v, r) == pytest.approx(v * 0.5 / bw)
    assert dcn_seconds("collective-permute", v, r) == pytest.approx(v / bw)
    inside = route(("model",), AbstractMesh((("data", 4), ("model", 4))), hw, {"data": 2})
    assert dcn_seconds("all-gather", v, inside) == 0.0
    assert collective_seconds("all-gather", v, r, 0.0) > collective_seconds("all-gather", v, inside, 0.0) / 2


def test_data_across_slices_is_predicted_faster_than_model_across(tmp_path):
    """The issue's target: on v6e-8x2 the same 2x8 mesh with data across the slices beats model across them,
    and the DCN term is what makes the difference."""
    results = {}
    for axis in ("data", "model"):
        planned = plan_file(write(tmp_path, axis, dcn=f"dcn: {{{axis}: 2}}"))
        results[axis] = predict(planned.plan, planned.strategy, planned.hardware)
    data, model = results["data"], results["model"]
    assert data.seconds_per_image < model.seconds_per_image
    assert model.step.dcn > data.step.dcn
    # most of the gap is DCN; the rest is the model axis's ICI part, 4 chips in a slice instead of 8
    assert model.step.dcn - data.step.dcn > 0.8 * (model.step.collective - data.step.collective)


def test_one_slice_prices_nothing_on_dcn(tmp_path):
    planned = plan_file(write(tmp_path, hardware="v6e-16", dcn=""))
    assert predict(planned.plan, planned.strategy, planned.hardware).step.dcn == 0.0


@pytest.mark.parametrize("dcn, hardware, message", [
    ("dcn: {data: 4}", "v6e-8x2", "does not divide axis 'data' of size 2"),
    ("dcn: {seq: 2}", "v6e-8x2", "which the mesh (data, model) does not have"),
    ("", "v6e-8x2", "v6e-8x2 is 2 slices, and dcn spans 1"),
    ("dcn: {model: 4}", "v6e-8x2", "dcn spans 4"),
    ("dcn: {data: 2}", "v6e-16", "v6e-16 is one slice"),
])
def test_bad_dcn_is_one_error_at_its_line(tmp_path, dcn, hardware, message):
    path = write(tmp_path, hardware=hardware, dcn=dcn)
    with pytest.raises(PlanError) as error:
        plan_file(path)
    text = str(error.value)
    assert message in text and str(path) in text, text
    if dcn:
        assert ":5:" in text, text  # the dcn line


def test_dcn_leaves_memory_alone(tmp_path):
    a = plan_file(write(tmp_path, "a", dcn="dcn: {data: 2}"))
    b = plan_file(write(tmp_path, "b", dcn="dcn: {model: 2}"))
    assert a.memory.most_loaded == b.memory.most_loaded
    assert math.prod(a.plan.mesh.shape) == 16


def test_the_sweep_tries_each_axis_across_the_slices_and_puts_data_there():
    from meshlab.models.card import load_card
    from meshlab.strategy.schema import Workload
    from meshlab.search.sweep import sweep

    hardware = load_hardware("v6e-8x2")
    result = sweep(load_card("qwen-image"), hardware, "qwen-image", Workload(), families=("data", "model", "2d"),
                   objective="throughput")
    crossing = {tuple(c.strategy.dcn) for c in result.candidates}
    assert crossing >= {("data",), ("model",)}
    assert all(math.prod(c.strategy.dcn.values()) == 2 for c in result.candidates)
    assert list(result.best.strategy.dcn) == ["data"]


def test_explain_shows_the_dcn_term(tmp_path):
    from typer.testing import CliRunner

    from meshlab.cli.app import app

    result = CliRunner().invoke(app, ["explain", str(write(tmp_path, dcn="dcn: {model: 2}"))])
    assert result.exit_code == 0 and "of which DCN" in result.stdout and "model over 2" in result.stdout
