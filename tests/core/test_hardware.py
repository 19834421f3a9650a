"""The hardware catalog: every figure sourced, slices consistent, overrides parsed and recorded. No torch."""

from __future__ import annotations

import dataclasses
import math

import pytest

from meshlab.core.errors import InputError
from meshlab.core.hardware import (
    FIGURES,
    Hardware,
    catalog,
    load_hardware,
)
from meshlab.core.hardware_rows import describe_rows

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
    assert 0 < hardware.runtime_reserve_bytes < hardware.usable_hbm_bytes <= hardware.hbm_bytes


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
def test_byte_figures_take_units(text, expected):
    """As a strategy writes an override (and the catalog its figures): GB powers of ten, GiB powers of two."""
    assert load_hardware("v6e-8", {"host_memory_bytes": text}).host_memory_bytes == expected


@pytest.mark.parametrize("text", ["32 parsecs", "-1GB", "", "GiB", True, None, [32]])
def test_a_byte_figure_that_is_not_one_is_refused(text):
    with pytest.raises(InputError) as caught:
        load_hardware("v6e-8", {"host_memory_bytes": text})
    assert "hardware override host_memory_bytes" in caught.value.problem and "GiB" in caught.value.fix


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
    assert set(v6e_8["sources"]) == set(FIGURES) | {
        "usd_per_chip_hour", "fp32_flops", "collective_matmul_flop_per_byte", "async_all_to_all_hidden",
        "reduce_scatter_combine_bytes", "fused_softmax_keys", "recomputed_softmax_keys", "mask_broadcast_keys"}
    assert v6e_8["figures"]["usd_per_chip_hour"] == 2.7 and "per chip-hour" in v6e_8["sources"]["usd_per_chip_hour"]
    json.dumps(rows)


def test_every_single_host_system_has_a_sourced_list_price():
    """Dollars per image need a price per chip-hour; each carries where and when it was read."""
    for hw in catalog().values():
        assert hw.usd_per_chip_hour is not None and hw.usd_per_chip_hour > 0, hw.name
        assert "list price, on demand" in hw.sources["usd_per_chip_hour"] and "read 20" in hw.sources["usd_per_chip_hour"]
    assert load_hardware("h100:1").usd_per_hour == load_hardware("h100").usd_per_chip_hour


@pytest.mark.parametrize("price, says", [(-1, "-1.0 is not a price"), ("inf", "not a finite number"),
                                         ("nan", "not a finite number"), ("cheap", "is not a number")])
def test_a_bad_price_override_is_one_error(price, says):
    with pytest.raises(InputError, match="usd_per_chip_hour") as error:
        load_hardware("v6e-8", {"usd_per_chip_hour": price})
    assert says in error.value.one_line() or says in str(error.value)


def test_softmax_keys_out_of_order_are_one_error():
    """The scores alone are held above recomputed_softmax_keys, fused or both below, and a mask's broadcast beside
    both: a recomputed figure below fused_softmax_keys, or a mask figure at or above the recomputed one, says nothing
    a chip could do."""
    with pytest.raises(InputError, match="recomputed_softmax_keys .* must be at least fused_softmax_keys"):
        load_hardware("v6e-8", {"recomputed_softmax_keys": 2048, "mask_broadcast_keys": "none"})
    with pytest.raises(InputError, match="mask_broadcast_keys .* must be below recomputed_softmax_keys"):
        load_hardware("v6e-8", {"mask_broadcast_keys": 8192})  # beside two buffers, which end at 8192
    changed = load_hardware("v6e-8", {"recomputed_softmax_keys": 4096, "mask_broadcast_keys": "none"})
    assert (changed.recomputed_softmax_keys, changed.mask_broadcast_keys) == (4096, None)


def test_a_price_override_of_zero_or_none_is_a_value():
    assert load_hardware("v6e-8", {"usd_per_chip_hour": 0}).usd_per_hour == 0.0
    assert load_hardware("v6e-8", {"usd_per_chip_hour": "none"}).usd_per_chip_hour is None


def test_a_gpu_node_can_be_used_in_part(tmp_path):
    """One GPU of an h100 node (or four of eight) plans as that many devices, with no topology written by hand;
    a TPU slice is used whole."""
    from meshlab.plan.planned import plan_file

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
    with pytest.raises(Exception, match="'v6e-8:4': a TPU system is named whole"):
        load_hardware("v6e-8:4")


# --- published attention rates ---------------------------------------------------------------------------


def test_hopper_attention_is_priced_at_the_fa3_papers_published_rates():
    """H100 (and the H200, the same GH100 compute) carry the FlashAttention-3 paper's forward rates at head dim 128;
    the default kernel is the one torch 2.9's SDPA picks on sm90 (FlashAttention-2)."""
    for name in ("h100", "h200"):
        hw = load_hardware(name)
        assert hw.attention_kernel == "fa2"
        assert hw.attention_rate(512, 128) == 309e12 and hw.attention_rate(16384, 128) == 370e12
        assert hw.sources["attention_rates"] and hw.sources["attention_kernel"]
    fa3 = load_hardware("h100", {"attention_kernel": "fa3"})
    assert fa3.attention_rate(8192, 128) == 646e12 and fa3.sources["attention_kernel"] == "override"


def test_attention_rates_interpolate_in_log_length_and_hold_at_the_ends():
    hw = load_hardware("h100")
    between = hw.attention_rate(1448, 128)  # about halfway between 1k (350) and 2k (362) in log length
    assert 350e12 < between < 362e12 and between == pytest.approx(356e12, rel=0.002)
    assert hw.attention_rate(64, 128) == 309e12 and hw.attention_rate(65536, 128) == 370e12


def test_attention_without_published_rates_falls_back_to_compute_efficiency():
    assert load_hardware("h100").attention_rate(4096, 64) is None  # another head dim
    assert load_hardware("v6e-8").attention_rate(4096, 128) is None  # no rates for the chip
    assert load_hardware("h100", {"attention_kernel": "none"}).attention_rate(4096, 128) is None


def test_an_attention_that_fills_few_waves_of_sms_runs_below_its_published_rate():
    """Tiles of 128 queries per sample and head, one at a time per SM: the kernel lasts as many tile-times as its
    busiest SM holds. The published rates' own setup (2048 tiles on 132 SMs: 16 waves, 0.9697 full) is the
    yardstick. Worked by hand: Flux's 4,608 tokens split 4 ways over 24 heads is 9 x 24 = 216 tiles, 2 waves of 132,
    216 / 264 full; split 8 ways, 576 queries are 4.5 tiles a head, 5 with the partial one, 120 tiles in 1 wave."""
    hw = load_hardware("h100")
    published = 2048 / (132 * 16)
    assert hw.sm_count == 132 and hw.sources["sm_count"]
    assert hw.attention_occupancy(1, 24, 1152) == pytest.approx(216 / 264 / published)
    assert hw.attention_occupancy(1, 24, 576) == pytest.approx(24 * 4.5 / 132 / published)
    assert hw.attention_occupancy(16, 16, 1024) == pytest.approx(1.0)  # the published setup itself
    assert hw.attention_occupancy(1, 40, 37800) > 1  # a long video sequence fills its waves better than it did
    assert load_hardware("v6e-8").attention_occupancy(1, 24, 576) == 1.0  # no SMs catalogued: no scaling
    with pytest.raises(InputError, match="sm_count"):
        load_hardware("h100", {"sm_count": 131.5})


def test_an_unknown_attention_kernel_is_a_one_line_error():
    with pytest.raises(InputError, match="attention_kernel .fa9.*fa2"):
        load_hardware("h100", {"attention_kernel": "fa9"})
    with pytest.raises(InputError, match="no published attention rates on this chip .it has: none"):
        load_hardware("v6e-8", {"attention_kernel": "fa3"})


def test_an_attention_op_is_priced_at_its_kernels_rate():
    from meshlab.cost.flops import Work
    from meshlab.cost.timing import op_seconds

    hw = load_hardware("h100:1")
    work = Work("attn", 0, 1e12, 1.0, "attention", shape=(1, 24, 4096, 4096, 128))
    assert op_seconds(work, hw) == pytest.approx(1e12 / 368e12)
    other = Work("attn", 0, 1e12, 1.0, "attention", shape=(1, 24, 4096, 4096, 64))
    assert op_seconds(other, hw) == pytest.approx(1e12 / (hw.bf16_flops * hw.compute_efficiency))


# ---- measured GEMM rates (OpenXLA's sm_90 table) ----


def test_hopper_linears_are_priced_at_openxlas_measured_gemm_rates():
    """Grid points come back exactly as OpenXLA's sm_90 table has them (bf16, batch 1), with the table's m (rows),
    k (contracted) and n (columns): m=256 with k=4096, n=256 is 90.9 TFLOP/s; with k=256, n=4096 it is 82.6."""
    for name in ("h100", "h200"):
        hw = load_hardware(name)
        assert hw.matmul_rate(4096, 4096, 4096) == 780.2e12
        assert hw.matmul_rate(1024, 2048, 4096) == 639.1e12
        assert hw.matmul_rate(256, 4096, 256) == 90.9e12 and hw.matmul_rate(256, 256, 4096) == 82.6e12
        assert "default_matmul_perf_table.txtpb" in hw.sources["matmul_rates"]


def test_gemm_rates_interpolate_in_log_shape_continue_below_the_grid_and_hold_above_it():
    hw = load_hardware("h100")
    halfway = hw.matmul_rate(round(1024 * 2 ** 0.5), 4096, 4096)  # m between 1024 (751.9) and 2048 (752.3)
    assert halfway == pytest.approx(math.sqrt(751.9e12 * 752.3e12), rel=1e-4)  # log rate, linear in log m
    corners = [hw.matmul_rate(m, k, n) for m in (1024, 2048) for k in (2048, 4096) for n in (2048, 4096)]
    assert hw.matmul_rate(1448, 2896, 2896) == pytest.approx(math.prod(corners) ** (1 / 8), rel=2e-3)
    # below the grid the first two points' trend continues: 128 rows run at 418.4 x 418.4 / 661.6 TFLOP/s (m = 256
    # and 512 at n = k = 4096), so halving the rows takes 0.79 of the time; a single row is far slower still
    assert hw.matmul_rate(128, 4096, 4096) == pytest.approx(418.4e12 ** 2 / 661.6e12, rel=1e-6)
    assert hw.matmul_rate(1, 3072, 3072) < hw.matmul_rate(64, 3072, 3072) < hw.matmul_rate(256, 3072, 3072)
    assert hw.matmul_rate(32760, 5120, 13824) == pytest.approx(780.2e12)  # above it: the largest measured shape's


def test_matmuls_without_measured_rates_fall_back_to_compute_efficiency():
    assert load_hardware("v6e-8").matmul_rate(4096, 4096, 4096) is None
    assert load_hardware("a100-80gb").matmul_rate(4096, 4096, 4096) is None
    off = load_hardware("h100", {"matmul_rates": "none"})
    assert off.matmul_rate(4096, 4096, 4096) is None and off.sources["matmul_rates"] == "override"


@pytest.mark.parametrize("value, message", [
    ({"m": [256], "n": [256]}, "expected .m"),
    ({"m": [512, 256], "n": [256], "k": [256], "flops": [[[1e12]], [[1e12]]]}, r"matmul_rates m \(\[512, 256\]\) must be .*increasing"),
    ({"m": [256], "n": [256], "k": [256, 512], "flops": [[[1e12]]]}, "flops must be 1 x 1 x 2"),
    ({"m": [256], "n": [256], "k": [256], "flops": [[[0]]]}, "positive FLOP/s"),
])
def test_a_bad_gemm_rate_override_is_a_one_line_error(value, message):
    with pytest.raises(InputError, match=message) as caught:
        load_hardware("h100", {"matmul_rates": value})
    assert "\n" not in caught.value.problem and "matmul_rates" in caught.value.problem


def test_a_linear_op_is_priced_at_the_measured_rate_for_its_shape_or_its_weight_reads():
    from meshlab.cost.flops import Work, linear_flops
    from meshlab.cost.timing import op_seconds

    hw = load_hardware("h100:1")
    flops = linear_flops(3072, 3072, 1024)
    image = Work("attn.to_q", 0, flops, 1.0, "linear", shape=(1024, 3072, 3072))
    assert op_seconds(image, hw) == pytest.approx(flops / hw.matmul_rate(1024, 3072, 3072))
    assert 0.6 < flops / op_seconds(image, hw) / hw.bf16_flops < 0.72  # not the flat 0.7 it was before
    weight_bytes = 2.0 * 3072 * 18432
    modulation = Work("img_mod.1", 0, linear_flops(3072, 18432, 1), weight_bytes, "linear", shape=(1, 3072, 18432))
    assert op_seconds(modulation, hw) == pytest.approx(weight_bytes / (hw.hbm_bandwidth * hw.hbm_efficiency))
    flat = load_hardware("h100:1", {"matmul_rates": "none"})
    assert op_seconds(image, flat) == pytest.approx(flops / (hw.bf16_flops * hw.compute_efficiency))
    # a column split over 8 GPUs leaves each a GEMM an eighth as wide, which runs at a lower rate: more than an
    # eighth of the time (with a flat compute_efficiency it was exactly an eighth); at 1k tokens 521 vs 703 TFLOP/s
    whole = Work("img_mlp.net.0.proj", 0, linear_flops(3072, 12288, 1024), 1.0, "linear", shape=(1024, 3072, 12288))
    eighth = Work("img_mlp.net.0.proj", 0, linear_flops(3072, 1536, 1024), 1.0, "linear", shape=(1024, 3072, 1536))
    assert op_seconds(eighth, hw) > 1.25 * op_seconds(whole, hw) / 8
    assert op_seconds(eighth, flat) == pytest.approx(op_seconds(whole, flat) / 8)


def test_the_catalog_json_carries_the_gemm_grid_with_its_source():
    row = next(r for r in describe_rows(with_sources=True) if r["name"] == "h100")
    grid = row["figures"]["matmul_rates"]
    assert grid["m"] == [256, 512, 1024, 2048, 4096] and grid["flops"][4][4][4] == 780.2e12
    assert "sm_90" in row["sources"]["matmul_rates"]


def test_a_float32_workload_runs_at_the_float32_peak_without_the_bf16_rates():
    """PyTorch keeps float32 matmuls off an H100's tensor cores (67 TFLOP/s, its datasheet); torch_xla runs them
    on a TPU as one bf16 pass (its default matmul precision), so there the peak stays."""
    h100 = load_hardware("h100")
    f32 = h100.at_dtype("float32")
    assert f32.bf16_flops == 67e12 and f32.matmul_rates is None and f32.attention_kernel == ""
    assert "FP32 67 TFLOPS" in f32.sources["bf16_flops"] and h100.at_dtype("bfloat16") is h100
    v6e = load_hardware("v6e-8")
    assert v6e.at_dtype("float32").bf16_flops == v6e.bf16_flops
    assert "one bf16 pass" in v6e.sources["fp32_flops"]


# ---- the catalog's entries, read through the same pydantic models as overrides ----


def test_a_catalog_entry_requires_every_figure_the_hardware_has():
    from meshlab.core.hardware import OPTIONAL_FIGURES
    from meshlab.core.hardware_figures import REQUIRED as ENTRY_REQUIRES, CatalogEntry, HardwareFigures

    assert set(ENTRY_REQUIRES) == set(FIGURES)
    assert set(HardwareFigures.model_fields) == set(FIGURES) | set(OPTIONAL_FIGURES)
    assert set(CatalogEntry.model_fields) == set(FIGURES) | set(OPTIONAL_FIGURES) | {"kind", "chip"}


def test_a_broken_catalog_entry_is_one_line_naming_entry_and_field():
    import yaml

    from meshlab.core.hardware import _build

    from tests.conftest import REPO

    data = yaml.safe_load((REPO / "meshlab" / "data" / "hardware.yaml").read_text())
    accelerators, system = data["accelerators"], data["systems"]["v6e-8"]
    assert _build("v6e-8", system, accelerators) == load_hardware("v6e-8")
    cases = [
        ({"topology": {"value": "2y4", "source": "s"}}, "systems.v6e-8.topology: '2y4' is not a number",
         "{value: ..., source: ...}"),
        ({"hbm_gb": {"value": 32, "source": "s"}}, "systems.v6e-8: unknown field hbm_gb", "usable_hbm_bytes"),
        ({"accelerator": "v9"}, "systems.v6e-8.accelerator: 'v9' is not an accelerator", "v6e"),
        ({"topology": {"source": "s"}}, "systems.v6e-8.topology: value is missing", "{value"),
        ({"chips": {"value": 8}}, "figures without a source: ['chips']", "fix the catalog entry"),
        ({"fp32_flops": None}, "systems.v6e-8.fp32_flops: Input should be a valid dictionary", "{value"),
        ({"hbm_bytes": {"value": 1, "source": "s", "note": "n"}}, "systems.v6e-8.hbm_bytes: unknown field note",
         "a figure is {value: ..., source: ...} and nothing else"),
        ({"kind": "npu"}, "systems.v6e-8.kind: Input should be 'tpu', 'gpu' or 'cpu'", "fix the catalog entry"),
        ({"attention_rates": {"value": {"fa2": 5}, "source": "s"}}, "systems.v6e-8.attention_rates: expected {kernel",
         "{value"),
    ]
    for change, problem, fix in cases:
        with pytest.raises(InputError) as caught:
            _build("v6e-8", {**system, **change}, accelerators)
        assert problem in caught.value.problem and fix in caught.value.fix, caught.value.one_line()
        assert "\n" not in caught.value.one_line()
    whole = {**accelerators[system["accelerator"]], **system}
    without_hbm = {k: v for k, v in whole.items() if k not in ("hbm_bytes", "accelerator")}
    with pytest.raises(InputError, match="systems.v6e-8: hbm_bytes is missing"):
        _build("v6e-8", {**without_hbm, "accelerator": "bare"}, {"bare": {}})


@pytest.mark.parametrize("overrides, says", [
    ({"topology": [10**400, 1]}, "hardware override topology: [1000000000000000000... is too large a number"),
    ({"matmul_rates": {"m": [1], "n": [1], "k": [1], "flops": [[[10**400]]]}},
     "hardware override matmul_rates: {'m': [1], 'n': [1],... is too large a number"),
    ({"attention_rates": {"fa2": 5}}, "hardware override attention_rates: expected {kernel: [[sequence length"),
    ({"hbm_bandwidth": "fast", "chips": 8.5}, "hardware override hbm_bandwidth: 'fast' is not a number"),
    ({"chips": 8.5, "hbm_bandwidth": "fast"}, "hardware override chips: 8.5 is not a whole number"),
])
def test_an_override_s_first_problem_in_file_order_is_one_line(overrides, says):
    with pytest.raises(InputError) as caught:
        load_hardware("v6e-8", overrides)
    assert caught.value.problem.startswith(says) and "\n" not in caught.value.one_line(), caught.value.problem
