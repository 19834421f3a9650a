"""Profiles as hardware: reading and checking a profile file, and pricing a plan from it (pure, no torch)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from meshlab.cost.predict import predict, profile_key
from meshlab.cost.profile import by_ops
from meshlab.core.profile_file import load_profile, profile_document
from meshlab.core.profile_points import Curve, Point, fit, interpolate
from meshlab.core.errors import InputError
from meshlab.core.hardware import load_hardware
from meshlab.plan.planned import at_depth, plan_file, with_workload

ROOT = Path(__file__).resolve().parents[2]
ONE_CPU = ROOT / "experiments" / "strategies" / "qwen-image-one-cpu.yaml"


def _strategy(folder: Path, hardware: str, mesh: dict | None = None) -> Path:
    data = yaml.safe_load(ONE_CPU.read_text())
    data["hardware"] = hardware
    if mesh:
        data["mesh"] = mesh
    path = folder / "s.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _profile(folder: Path, key: str, devices: int = 1, outer=(1.0, 2.0), stack=(5.0, 8.0), calls: int = 2) -> Path:
    """A profile measured (as if) for the plan `key`: outer and 3-block calls at 8 and 32 text tokens."""
    points = [Point("dispatch", (1,), 0, 0, 0.002), Point("copy", (1000,), 0, 4e9, 1.0),
              Point("linear", (256, 3072, 3072), 2.0 * 256 * 3072 * 3072, 1.0, 0.1),
              Point("linear", (32, 3072, 3072), 2.0 * 32 * 3072 * 3072, 1.0, 0.04),
              Point("host_matmul", (32, 3584, 3584), 2.0 * 32 * 3584 * 3584, 0, 0.01),
              Point("host_transfer", (1, 3, 256, 256), 0, 786432, 0.001),
              Point("vae_decode", (256, 256), 7.0e11, 0, 10.0)]
    for text, o, s in zip((8, 32), outer, stack):
        points += [Point("outer", (256, text, calls), 0, 0, o), Point("stack", (256, text, calls, 3), 0, 0, s),
                   Point("block", (256, text, calls), 0, 0, (s - o), "transformer_blocks")]
    device = {"platform": "cpu", "devices": devices, "name": "test CPU", "memory_bytes": 2**34}
    plan = {"key": key, "strategy": "qwen-image-one-cpu", "image_tokens": 256}
    path = folder / "p.json"
    path.write_text(json.dumps(profile_document(device, {}, plan, tuple(points), 1.0)))
    return path


@pytest.fixture
def keyed(tmp_path):
    """A strategy naming a profile measured for its own plan."""
    catalog = plan_file(_strategy(tmp_path, "h200:1"))
    key = profile_key(catalog.plan, catalog.strategy)
    profile = _profile(tmp_path, key)
    return _strategy(tmp_path, profile.name), profile


def test_interpolate_is_exact_at_points_linear_between_and_says_how_far_it_extrapolates():
    points = [(8.0, 1.0), (32.0, 2.0)]
    assert interpolate(points, 8) == (1.0, 1.0)
    assert interpolate(points, 20) == (1.5, 1.0)
    y, stretch = interpolate(points, 64)
    assert y == pytest.approx(3.333333) and stretch == 2.0
    y, stretch = interpolate(points, 4)
    assert y == pytest.approx(0.833333) and stretch == 2.0


def test_fit_recovers_latency_and_rate():
    points = [Point("linear", (n,), 1e9 * n, 0, 0.01 + 1e9 * n / 5e10) for n in (1, 4, 16)]
    curve = fit("linear", points)
    assert curve.latency_s == pytest.approx(0.01) and curve.rate == pytest.approx(5e10)
    assert curve.stretch(64e9) == pytest.approx(4.0) and curve.stretch(4e9) == 1.0


def test_the_call_is_priced_by_blocks_from_the_one_and_three_block_calls(keyed):
    strategy, _ = keyed
    planned = plan_file(strategy)
    assert planned.hardware.kind == "cpu" and planned.hardware.profile is not None
    for layers, text, outer, stack in ((2, 8, 1.0, 5.0), (60, 32, 2.0, 8.0), (2, 20, 1.5, 6.5)):
        at = with_workload(at_depth(planned, layers), text_tokens=text)
        p = predict(at.plan, at.strategy, at.hardware)
        per_call = outer + (layers - 1) * (stack - outer) / 2  # the slope between 1 and 3 blocks, per call of 2
        assert p.measured.basis == "blocks" and p.measured.stretch == 1.0
        assert p.step.local == pytest.approx(2 * per_call / 2)  # points hold 2 calls; the step makes 2
        assert p.step.overhead == 0.002  # the measured dispatch
        assert p.step.total == pytest.approx(p.step.local + p.step.collective + 0.002)


def test_text_tokens_beyond_the_measured_ones_are_extrapolated_and_say_so(keyed):
    strategy, _ = keyed
    at = with_workload(plan_file(strategy), text_tokens=128)
    assert predict(at.plan, at.strategy, at.hardware).measured.stretch == 4.0


def test_another_plan_is_priced_op_by_op_and_names_what_was_assumed(keyed, tmp_path):
    _, profile = keyed
    other = yaml.safe_load(_strategy(tmp_path, profile.name).read_text())
    other["workload"]["height"] = 512  # other image tokens: the block points are not this plan's
    path = tmp_path / "other.yaml"
    path.write_text(yaml.safe_dump(other))
    planned = plan_file(path)
    p = predict(planned.plan, planned.strategy, planned.hardware)
    assert p.measured.basis == "ops" and "priced op by op" in p.measured.note
    assert p.measured.measured and p.measured.assumed  # the 3072x3072 Linears measured, the rest assumed
    assert p.measured.stretch > 1.0  # 1024 tokens against points at 32 and 256


def test_ops_composition_sums_measured_points_and_the_fallback():
    from meshlab.cost.flops import Work
    from meshlab.core.profile_points import Profile

    profile = Profile("p.json", {"platform": "cpu", "devices": 1}, {}, {},
                      (Point("linear", (4, 8, 8), 512.0, 0, 0.5),))
    work = (Work("a", 0, 512.0, 0.0, "linear", count=3, shape=(4, 8, 8)),
            Work("b", 0, 10.0, 0.0, "attention", shape=(1, 1, 1, 1, 1)))
    priced = by_ops(profile, work, lambda w: 7.0)
    assert priced.seconds == pytest.approx(3 * 0.5 + 7.0)
    assert priced.measured == ("a",) and priced.assumed == ("b",)


def test_the_profile_entry_takes_measured_host_figures(keyed):
    strategy, _ = keyed
    hw = plan_file(strategy).hardware
    assert hw.host_flops == pytest.approx(2.0 * 32 * 3584 * 3584 / 0.01)
    assert hw.host_link_bandwidth == pytest.approx(786432 / 0.001)
    assert hw.sources["host_flops"].startswith("measured")
    assert hw.sources["collective_latency_s"].startswith("assumption")


def test_vae_decode_comes_from_the_profile_at_its_resolution(keyed):
    strategy, _ = keyed
    planned = plan_file(strategy)
    p = predict(planned.plan, planned.strategy, planned.hardware)
    assert p.terms.vae_decode_s == pytest.approx(10.0)


@pytest.mark.parametrize("content, says", [
    ("{", "corrupt or truncated"),
    ('{"meshlab_profile": 99}', "format 99"),
    ('{"meshlab_profile": 1, "device": {"platform": "cpu", "devices": 1}, "plan": {}, '
     '"points": [{"op": "linear", "shape": [1], "flops": 1, "bytes": 1, "seconds": -1}]}', "points.0.seconds: Input should be greater than 0"),
    ('{"meshlab_profile": 1, "device": {"platform": "cpu", "devices": 1}, "plan": {}, '
     '"points": [{"op": "fft", "shape": [1], "flops": 1, "bytes": 1, "seconds": 1}]}', "points.0.op: Input should be 'linear'"),
    ('{"meshlab_profile": 1, "plan": {}, "points": []}', "device: Field required"),
    *[(f'{{"meshlab_profile": 1, "device": {{"platform": "cpu", "devices": 1}}, "plan": {{}}, '
       f'"points": [{{"op": "{op}", "shape": {shape}, "flops": 1, "bytes": 1, "seconds": 1}}]}}', says)
      for op, shape, says in (("outer", "[]", "points.0.shape: List should have at least 1 item"),
                              ("stack", "[-1, 8, 2, 3]", "points.0.shape.0: Input should be greater than or equal to 0"),
                              ("stack", "[1024, 8, 2.5, 3]", "points.0.shape.2: Input should be a valid integer"),
                              ("stack", "[1024, 8, 2]", "4 figures"),
                              ("block", "[1024, 8, 0]", "calls and blocks are at least 1"))],
    ('{"meshlab_profile": 1, "device": {"platform": "cpu", "devices": 1}, "plan": {}, '
     '"points": [{"op": "linear", "shape": [1], "flops": NaN, "bytes": 1, "seconds": 1}]}', "points.0.flops: Input should be a finite number"),
    ('{"meshlab_profile": 1, "device": {"platform": "cpu", "devices": 1, "memory_bytes": -5}, "plan": {}, '
     '"points": []}', "device.memory_bytes: Input should be greater than or equal to 0"),
    ('{"meshlab_profile": 1, "device": {"platform": "cpu", "devices": true}, "plan": {}, "points": []}',
     "device.devices: Input should be a valid integer"),  # JSON's true is not a count
])
def test_a_bad_profile_is_one_line_naming_the_file(tmp_path, content, says):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(InputError) as error:
        load_profile(path)
    assert str(path) in error.value.problem and says in error.value.problem
    assert "meshlab profile" in error.value.fix


def test_a_profile_of_another_device_count_is_refused_at_the_hardware_line(keyed, tmp_path):
    strategy, profile = keyed
    data = json.loads(profile.read_text())
    data["device"]["devices"] = 8
    profile.write_text(json.dumps(data))
    with pytest.raises(InputError) as error:
        plan_file(strategy)
    assert "measured on 8 cpu device(s), and this mesh uses 1" in error.value.problem
    assert error.value.location.line == yaml_line(strategy, "hardware")


def yaml_line(path: Path, key: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if line.startswith(f"{key}:"))


def test_a_gpu_profile_keeps_its_catalog_entry(tmp_path):
    catalog = plan_file(_strategy(tmp_path, "h200:1"))
    profile = _profile(tmp_path, profile_key(catalog.plan, catalog.strategy))
    data = json.loads(profile.read_text())
    data["device"] = {"platform": "cuda", "devices": 1, "name": "NVIDIA H200", "hardware": "h200"}
    profile.write_text(json.dumps(data))
    hw = plan_file(_strategy(tmp_path, profile.name)).hardware
    assert hw.kind == "gpu" and hw.bf16_flops == catalog.hardware.bf16_flops
    assert hw.step_overhead_s == 0.002 and "profile p.json" in hw.name
    assert hw.eager_dispatch_s == catalog.hardware.eager_dispatch_s  # no launch point: the catalog's figure


def test_a_gpu_profile_s_launch_points_give_the_host_s_seconds_per_dispatched_op(tmp_path):
    """`meshlab profile` on a CUDA GPU times the host issuing the one- and the 3-block forward (meshlab.workers
    .measure._launches), each with the ops the card traced for it: the slope between them is the host's seconds per
    op (what the forward does outside the blocks falls out), at which the eager launch floor is then priced."""
    catalog = plan_file(_strategy(tmp_path, "h200:1"))
    profile = _profile(tmp_path, profile_key(catalog.plan, catalog.strategy))
    data = json.loads(profile.read_text())
    data["device"] = {"platform": "cuda", "devices": 1, "name": "NVIDIA H200", "hardware": "h200"}
    data["points"] += [{"op": "launch", "shape": [ops], "flops": 0, "bytes": 0, "seconds": seconds}
                       for ops, seconds in ((141, 0.0060), (333, 0.0060 + 192 * 3e-5))]
    profile.write_text(json.dumps(data))
    strategy = yaml.safe_load(_strategy(tmp_path, profile.name).read_text())
    strategy["compile"] = {"elementwise": "eager"}
    strategy["workload"]["height"] = strategy["workload"]["width"] = 128  # no block points: priced op by op
    path = tmp_path / "eager.yaml"
    path.write_text(yaml.safe_dump(strategy, sort_keys=False))
    planned = plan_file(path)
    assert planned.hardware.eager_dispatch_s == pytest.approx(3e-5)
    assert planned.hardware.sources["eager_dispatch_s"] == "measured: meshlab profile p.json"
    step = predict(planned.plan, planned.strategy, planned.hardware).step
    assert step.dispatches > 0 and step.launch_floor == pytest.approx(step.dispatches * 3e-5)


@pytest.mark.parametrize("launches, per_op", [
    (((141, 0.0060), (333, 0.0060 + 192 * 3e-5)), 3e-5),  # the slope: the 1.8 ms outside the blocks falls out
    (((141, 0.0042),), 0.0042 / 141),  # one forward: its seconds over its ops
    (((141, 0.0060), (333, 0.0059)), None),  # noise above the blocks' own time: no figure
    ((), None),
])
def test_the_launch_rate_is_the_slope_between_the_forwards(launches, per_op):
    from meshlab.core.profile_hardware import launch_seconds_per_op
    from meshlab.core.profile_points import Profile

    profile = Profile("p.json", {"platform": "cuda", "devices": 1}, {}, {},
                      tuple(Point("launch", (ops,), 0, 0, s) for ops, s in launches))
    assert launch_seconds_per_op(profile) == (pytest.approx(per_op) if per_op else None)


def test_cli_bad_profile_exits_2_with_one_line(tmp_path):
    (tmp_path / "p.json").write_text('{"meshlab_profile": 1, "dev')
    strategy = _strategy(tmp_path, "p.json")
    done = subprocess.run([sys.executable, "-m", "meshlab", "try", str(strategy)], capture_output=True, text=True)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "corrupt or truncated" in done.stderr
    assert "Traceback" not in done.stderr


def test_explain_and_compare_say_what_was_measured(keyed):
    strategy, _ = keyed
    done = subprocess.run([sys.executable, "-m", "meshlab", "compare", str(strategy), "--json"], capture_output=True,
                          text=True, check=True)
    document = json.loads(done.stdout)
    entry = (document["entries"] if isinstance(document, dict) else document)[0]
    priced = entry["predicted"]["priced"]
    assert priced["from"] == "profile" and priced["basis"] == "blocks" and priced["assumed"] == []
    done = subprocess.run([sys.executable, "-m", "meshlab", "explain", str(strategy)], capture_output=True, text=True,
                          check=True)
    assert "Priced from" in done.stdout and "(measured)" in done.stdout


def test_a_catalog_prediction_says_it_is_assumed():
    from meshlab.cost.document import priced_document

    planned = plan_file(ROOT / "strategies" / "2d.yaml")
    p = predict(planned.plan, planned.strategy, planned.hardware)
    priced = priced_document(p)
    assert priced["from"] == "catalog" and priced["measured"] == [] and priced["published"] == []
    assert priced["assumed"] == [f"every op ({sum(w.count for w in p.work)}) at compute_efficiency and hbm_efficiency"]


def test_a_hopper_catalog_prediction_says_which_ops_rest_on_measured_or_published_rates():
    """On one H200, every Linear is priced from OpenXLA's GEMM table and every attention from fa2's rates. The
    MLP's 12288-wide contraction lies 3x above the grid's 4096; the timestep embedder's first Linear (one row)
    256x below its 256 rows, where the trend of its smallest shapes sets the time (the modulation Linears, also one
    row, are bound by their weight reads and do not count)."""
    from meshlab.cost.document import priced_document

    planned = plan_file(ROOT / "experiments" / "strategies" / "qwen-image-one-h200.yaml")
    p = predict(planned.plan, planned.strategy, planned.hardware)
    linears = sum(w.count for w in p.work if w.kind == "linear")
    attentions = sum(w.count for w in p.work if w.kind == "attention")
    assert p.pricing.linears_measured == linears and p.pricing.attention_published == attentions == 60
    assert p.pricing.assumed == sum(w.count for w in p.work) - linears - attentions
    assert p.pricing.linears_above == pytest.approx(12288 / 4096) and p.pricing.linears_below == 256
    priced = priced_document(p)
    assert priced["measured"] == [f"{linears} Linears at the measured GEMM rate for their shape"]
    flat = plan_file(ROOT / "experiments" / "strategies" / "qwen-image-one-h200.yaml")
    flat_hw = load_hardware("h200:1", {"matmul_rates": "none", "attention_kernel": "none"})
    assert predict(flat.plan, flat.strategy, flat_hw).pricing.linears_measured == 0


def test_curve_json_round_trip():
    curve = Curve("linear", 0.01, 5e10, 1e9, 1e11)
    assert curve.to_json() == {"basis": "flops", "latency_s": 0.01, "rate": 5e10, "low": 1e9, "high": 1e11}


def test_collectives_are_priced_from_measured_points_over_their_axes(tmp_path):
    data = yaml.safe_load((ROOT / "strategies" / "model.yaml").read_text())
    data["hardware"] = "p8.json"
    data["workload"].update(height=256, width=256)
    strategy = tmp_path / "model.yaml"
    strategy.write_text(yaml.safe_dump(data))
    points = (Point("copy", (1000,), 0, 4e9, 1.0), Point("linear", (256, 3072, 384), 1e9, 1.0, 0.1),
              Point("collective", (8, 1000), 0, 1000, 0.001, "all-reduce over model"),
              Point("collective", (8, 2000), 0, 2000, 0.003, "all-reduce over model"))
    device = {"platform": "cpu", "devices": 8, "name": "test CPU", "memory_bytes": 2**34}
    (tmp_path / "p8.json").write_text(json.dumps(profile_document(device, {}, {"key": "another plan"}, points, 1.0)))
    planned = plan_file(strategy)
    profile = planned.hardware.profile
    assert profile.collective_seconds("all-reduce", ("model",), 1500).seconds == pytest.approx(0.002)
    assert profile.collective_seconds("all-reduce", ("model",), 4000).stretch == 2.0
    assert profile.collective_seconds("all-gather", ("model",), 1500) is None
    p = predict(planned.plan, planned.strategy, planned.hardware)
    reduces = [t for t in p.step.collectives if t.collective.kind == "all-reduce"]
    assert reduces and all(t.seconds == profile.collective_seconds("all-reduce", ("model",),
                                                                   t.collective.bytes).seconds for t in reduces)
    assert p.measured.basis == "ops" and p.measured.collectives_measured == len(reduces)
    assert p.measured.collectives_assumed == len(p.collectives) - len(reduces)


def test_compare_and_explain_warn_when_a_figure_is_far_beyond_the_measured_sizes(keyed, tmp_path):
    strategy, _ = keyed
    data = yaml.safe_load(strategy.read_text())
    data["workload"]["text_tokens"] = 128  # points at 8 and 32 text tokens: 4x beyond
    strategy.write_text(yaml.safe_dump(data))
    for command in ("compare", "explain"):
        done = subprocess.run([sys.executable, "-m", "meshlab", command, str(strategy)], capture_output=True,
                              text=True, check=True)
        assert "warning:" in done.stdout and "4.0x beyond the sizes the profile measured" in done.stdout


def test_two_block_lists_share_the_slope_as_their_blocks_alone_compare():
    from meshlab.cost.profile import by_blocks
    from meshlab.core.profile_points import Profile

    points = (Point("outer", (256, 8, 1), 0, 0, 1.0), Point("stack", (256, 8, 1, 3), 0, 0, 3.0),
              Point("block", (256, 8, 1), 0, 0, 0.2, "double"), Point("block", (256, 8, 1), 0, 0, 0.6, "single"))
    profile = Profile("p.json", {"platform": "cpu", "devices": 1}, {}, {}, points)
    # 3 blocks per list add one block to each list per step of depth: slope 1.0 s = one double + one single block
    priced = by_blocks(profile, {"double": 3, "single": 5}, 8)
    assert priced.seconds == pytest.approx(1.0 + 2 * 0.25 + 4 * 0.75)
    alone = Profile("p.json", {"platform": "cpu", "devices": 1}, {}, {}, points[:1] + points[2:])
    assert by_blocks(alone, {"double": 3, "single": 5}, 8).seconds == pytest.approx(1.0 + 2 * 0.2 + 4 * 0.6)


def test_a_run_priced_from_a_profile_records_which_measurement_it_was(keyed):
    """The record's prediction carries the profile's digest, which calibrate matches runs to."""
    import hashlib

    from meshlab.experiments.recording import prediction as _prediction

    strategy, profile = keyed
    prediction = _prediction(plan_file(strategy))
    assert prediction["profile_digest"] == hashlib.sha256(profile.read_bytes()).hexdigest()[:16]


def test_a_device_is_not_read_as_a_profile():
    with pytest.raises(InputError, match="/dev/zero: a device, not a profile"):
        load_profile("/dev/zero")
