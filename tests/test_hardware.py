"""The hardware catalog: every figure sourced, slices consistent, overrides parsed and recorded. No torch."""

from __future__ import annotations

import dataclasses
import math

import pytest

from meshlab.errors import InputError
from meshlab.hardware import (
    FIGURES,
    Hardware,
    catalog,
    describe_rows,
    load_hardware,
    parse_bytes,
)

GIB = 2**30
REQUIRED = {
    "v4-8", "v5e-8", "v5p-8", "v6e-1", "v6e-4", "v6e-8", "v6e-16", "v6e-32", "v6e-64", "v6e-256",
    "a100-80gb", "h100", "h200",
}


def test_catalog_has_the_required_entries():
    assert REQUIRED <= set(catalog())


@pytest.mark.parametrize("name", sorted(catalog()))
def test_every_figure_has_a_source(name):
    hardware = catalog()[name]
    assert set(FIGURES) <= set(hardware.sources)
    assert all(hardware.sources[figure].strip() for figure in FIGURES)
    assert hardware.overridden == ()


@pytest.mark.parametrize("name", sorted(catalog()))
def test_topology_matches_chips_and_wraparound(name):
    hardware = catalog()[name]
    assert math.prod(hardware.topology) * hardware.slices == hardware.chips
    assert len(hardware.wraparound) == len(hardware.topology)
    assert 0 < hardware.budget_bytes < hardware.usable_hbm_bytes <= hardware.hbm_bytes


def test_v6e_8_is_one_host_of_2x4_open_lines():
    hardware = load_hardware("v6e-8")
    assert hardware.kind == "tpu"
    assert hardware.chips == 8
    assert hardware.topology == (2, 4)
    assert hardware.wraparound == (False, False)
    assert hardware.usable_hbm_bytes == int(31.25 * GIB)
    assert hardware.hosts == 1
    assert hardware.host_memory_bytes == 1536 * GIB
    assert "tpu_info" in hardware.sources["usable_hbm_bytes"]


def test_v5e_v6e_wrap_only_at_full_length_16():
    for hardware in catalog().values():
        if hardware.kind == "tpu" and len(hardware.topology) == 2:
            assert hardware.wraparound == tuple(n == 16 for n in hardware.topology), hardware.name


def test_gpu_nodes_are_switched():
    for name in ("a100-80gb", "h100", "h200"):
        hardware = load_hardware(name)
        assert hardware.kind == "gpu" and hardware.interconnect == "nvswitch"
        assert hardware.topology == (8,) and hardware.wraparound == (True,)


def test_catalog_returns_a_fresh_dict():
    catalog().clear()
    assert "v6e-8" in catalog()


def test_override_replaces_and_records():
    hardware = load_hardware("v6e-8", {"usable_hbm_bytes": "30GiB", "compute_efficiency": 0.6})
    assert hardware.usable_hbm_bytes == 30 * GIB
    assert hardware.compute_efficiency == 0.6
    assert hardware.sources["usable_hbm_bytes"] == "override"
    assert hardware.sources["compute_efficiency"] == "override"
    assert hardware.sources["hbm_bytes"] != "override"
    assert hardware.overridden == ("usable_hbm_bytes", "compute_efficiency")
    assert load_hardware("v6e-8").usable_hbm_bytes == int(31.25 * GIB)  # the catalog is untouched


def test_override_rates_and_shapes():
    hardware = load_hardware(
        "v6e-8", {"hbm_bandwidth": "1.6e12", "chips": 8, "topology": "4x2", "wraparound": [False, False]}
    )
    assert hardware.hbm_bandwidth == 1.6e12
    assert hardware.topology == (4, 2)


def test_unknown_name_lists_valid_names():
    with pytest.raises(InputError) as caught:
        load_hardware("v6e-7")
    assert "v6e-7" in caught.value.problem
    assert "v6e-8" in caught.value.fix and "h100" in caught.value.fix


def test_unknown_field_lists_valid_fields():
    with pytest.raises(InputError) as caught:
        load_hardware("v6e-8", {"hbm_gb": 32})
    assert "hbm_gb" in caught.value.problem
    assert "usable_hbm_bytes" in caught.value.fix and "topology" in caught.value.fix


@pytest.mark.parametrize(
    "overrides",
    [
        {"hbm_bytes": "32 parsecs"},
        {"hbm_bandwidth": "fast"},
        {"chips": 8.5},
        {"wraparound": "no"},
        {"interconnect": "ethernet"},
        {"compute_efficiency": True},
    ],
)
def test_ill_typed_override_is_an_input_error(overrides):
    with pytest.raises(InputError) as caught:
        load_hardware("v6e-8", overrides)
    assert next(iter(overrides)) in caught.value.problem


@pytest.mark.parametrize(
    "overrides",
    [
        {"chips": 16},  # topology still 2x4
        {"topology": [2, 2, 2]},  # wraparound still has two axes
        {"usable_hbm_bytes": "40GiB"},  # above the 32 GiB of HBM
        {"compute_efficiency": 1.5},
        {"runtime_reserve_bytes": "31.25GiB"},
    ],
)
def test_inconsistent_overrides_are_refused(overrides):
    with pytest.raises(InputError) as caught:
        load_hardware("v6e-8", overrides)
    assert "do not fit" in caught.value.problem


@pytest.mark.parametrize(
    "text, expected",
    [
        ("31.25GiB", int(31.25 * GIB)),
        ("32GB", 32 * 10**9),
        ("32 gb", 32 * 10**9),
        ("1.6e12", 1_600_000_000_000),
        ("512MiB", 512 * 2**20),
        ("2TiB", 2 * 2**40),
        ("1024", 1024),
        (1024, 1024),
        (1.6e12, 1_600_000_000_000),
    ],
)
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text", ["32 parsecs", "-1GB", "", "GiB", True, None, [32]])
def test_parse_bytes_refuses(text):
    with pytest.raises(InputError) as caught:
        parse_bytes(text)
    assert "GiB" in caught.value.fix


def test_hardware_refuses_broken_invariants():
    base = load_hardware("v6e-8")
    with pytest.raises(ValueError, match="topology"):
        dataclasses.replace(base, topology=(3, 3))
    with pytest.raises(ValueError, match="source"):
        dataclasses.replace(base, sources={})
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.chips = 4  # type: ignore[misc]
    assert isinstance(base, Hardware)


def test_describe_rows_one_per_entry():
    rows = describe_rows()
    assert [row["name"] for row in rows] == list(catalog())
    v6e_8 = next(row for row in rows if row["name"] == "v6e-8")
    assert v6e_8["topology"] == "2x4"
    assert v6e_8["usable_hbm"] == "31.25 GiB"
    assert v6e_8["ici"] == "90 GB/s x 4"
    assert v6e_8["wraparound"] == "none"
    assert {"kind", "chips", "hbm", "hbm_bandwidth", "bf16_peak"} <= set(v6e_8)


def test_describe_rows_with_sources_is_json_ready():
    import json

    rows = describe_rows(with_sources=True)
    v6e_8 = next(row for row in rows if row["name"] == "v6e-8")
    assert v6e_8["figures"]["topology"] == [2, 4]
    assert v6e_8["figures"]["usable_hbm_bytes"] == int(31.25 * GIB)
    assert set(v6e_8["sources"]) == set(FIGURES)
    json.dumps(rows)


def test_a_gpu_node_can_be_used_in_part(tmp_path):
    """One GPU of an h100 node (or four of eight) plans as that many devices, with no topology written by hand;
    a TPU slice is used whole."""
    from meshlab.planning import plan_file

    for devices, mesh in ((1, "{model: 1}"), (4, "{data: 2, model: 2}")):
        path = tmp_path / f"gpu{devices}.yaml"
        path.write_text(f"name: t\nmodel: qwen-image\nhardware: h100\nmesh: {mesh}\n")
        planned = plan_file(path)
        assert planned.hardware.chips == devices and planned.hardware.name == f"h100:{devices}"
        assert planned.plan.mesh.device_count == devices
        assert load_hardware(f"h100:{devices}") == planned.hardware  # records name it; it loads back
    path = tmp_path / "tpu.yaml"
    path.write_text("name: t\nmodel: qwen-image\nhardware: v6e-8\nmesh: {model: 4}\n")
    with pytest.raises(Exception, match="has 4 devices but the hardware has 8"):
        plan_file(path)
    with pytest.raises(Exception, match="unknown hardware 'v6e-8:4'"):
        load_hardware("v6e-8:4")
