"""Sweep: enumeration, the Pareto front, the written YAML, and no-valid-factorization errors."""

import pytest

from meshlab.models.card import load_card
from meshlab.core.errors import InputError
from meshlab.core.hardware import load_hardware
from meshlab.strategy.loader import load_strategy
from meshlab.strategy.schema import Workload
from meshlab.core.files import write_atomic
from meshlab.search.sweep import factorizations, meshes, pareto, strategy_yaml, sweep
from meshlab.plan.planned import plan_file


def test_factorizations_are_every_ordered_product():
    assert factorizations(8, 2) == [(1, 8), (2, 4), (4, 2), (8, 1)]
    assert sorted(factorizations(12, 3)) == sorted(
        (a, b, 12 // (a * b)) for a in range(1, 13) for b in range(1, 13) if 12 % (a * b) == 0)
    assert factorizations(7, 2) == [(1, 7), (7, 1)]


def test_meshes_cover_every_family_and_cfg_axis():
    found = meshes(8, cfg=True)
    as_set = {(family, tuple(mesh.items())) for family, mesh in found}
    assert len(as_set) == len(found)
    for data, model in factorizations(8, 2):
        if model > 1:
            assert ("pairs", (("data", data), ("model", model))) in as_set
    for data, model in factorizations(4, 2):
        if model > 1:
            assert ("pairs", (("cfg", 2), ("data", data), ("model", model))) in as_set
    assert ("data", (("data", 8),)) in as_set and ("data", (("cfg", 2), ("data", 4))) in as_set
    assert not any("cfg" in mesh for _, mesh in meshes(8, cfg=False))


@pytest.fixture(scope="module")
def qwen_sweep():
    hw = load_hardware("v6e-8")
    return sweep(load_card("qwen-image"), hw, "qwen-image", Workload(), objective="throughput"), hw


def test_sweep_drops_what_does_not_fit_and_ranks_the_rest(qwen_sweep):
    result, _ = qwen_sweep
    dropped = {c.strategy.name for c in result.candidates if c.dropped}
    assert "data-data8" in dropped  # 38 GiB of replicated weights on a 31.25 GiB chip
    assert result.best.fits and result.best in result.front
    times = [c.prediction.seconds_per_image for c in result.front]
    headroom = [c.headroom for c in result.front]
    assert times == sorted(times) and headroom == sorted(headroom)  # faster costs headroom along the front
    assert all(c.prediction.seconds_per_image >= result.best.prediction.seconds_per_image
               for c in result.candidates if c.fits)


def test_pareto_front_keeps_only_undominated(qwen_sweep):
    result, _ = qwen_sweep
    fitting = [c for c in result.candidates if c.fits]
    for c in fitting:
        dominated = any(o.prediction.seconds_per_image <= c.prediction.seconds_per_image and o.headroom >= c.headroom
                        and (o.prediction.seconds_per_image, o.headroom) != (c.prediction.seconds_per_image, c.headroom)
                        for o in fitting)
        assert (c in pareto(fitting)) == (not dominated)


def test_written_yaml_is_a_ready_strategy(qwen_sweep, tmp_path):
    result, hw = qwen_sweep
    path = tmp_path / "best.yaml"
    write_atomic(path, strategy_yaml(result.best, hw))
    assert load_strategy(path).strategy.mesh == result.best.strategy.mesh
    planned = plan_file(path)
    assert planned.memory.fits and [p.spec for p in planned.plan.parameters] == \
        [p.spec for p in result.best.plan.parameters]
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind


def test_no_valid_factorization_is_bad_input():
    hw = load_hardware("v6e-8", {"chips": 7, "topology": [7], "wraparound": [False]})
    # 24 heads do not split 7 ways and replicated weights do not fit: only FSDP over 7 chips is left
    with pytest.raises(InputError, match="no factorization of 7 devices"):
        sweep(load_card("qwen-image"), hw, "qwen-image", Workload(), families=("data", "model", "2d", "pairs"))
    assert sweep(load_card("qwen-image"), hw, "qwen-image", Workload()).best.family == "fsdp"


def test_sweep_covers_the_hybrid_families(qwen_sweep):
    result, _ = qwen_sweep
    families = {c.family for c in result.candidates}
    assert {"ulysses+pairs", "ring+pairs", "fsdp", "ulysses", "ring", "pairs", "2d", "data"} <= families
    ulysses = next(c for c in result.candidates if c.family == "ulysses+pairs" and c.fits)
    kinds = {c.kind for c in ulysses.prediction.collectives}
    assert "all-to-all" in kinds and ulysses.strategy.rewrites == ["layernorm-rows"]


def test_yaml_carries_device_override(tmp_path):
    hw = load_hardware("v6e-8", {"chips": 2, "topology": [2], "wraparound": [False]})
    result = sweep(load_card("qwen-image"), hw, "qwen-image", Workload())
    path = tmp_path / "two.yaml"
    write_atomic(path, strategy_yaml(result.best, hw))
    planned = plan_file(path)  # plans on 2 devices, not the catalog's 8
    assert planned.hardware.chips == 2 and planned.plan.mesh.device_count == 2


@pytest.mark.parametrize("model", ["qwen-image", "flux-dev"])
def test_no_candidate_computes_more_than_the_chips_can(model):
    """MFU, at the predicted step and at the roofline, is at most 1 for every candidate the sweep plans, and for
    FSDP twins of them (every weight's largest dim over data, gathered before use)."""
    from meshlab.models.card import load_card
    from meshlab.core.hardware import load_hardware
    from meshlab.strategy.schema import Rule, Workload
    from meshlab.search.sweep import _evaluate, meshes, sweep

    card, hardware = load_card(model), load_hardware("v6e-8")
    workload = Workload(height=1024, width=1024, steps=50, cfg=True, text_tokens=512)
    result = sweep(card, hardware, model, workload)
    fsdp = [Rule(match="*", min_rank=2, shard="largest", axis="data")]
    twins = [_evaluate("fsdp", m, fsdp, card, hardware, model, workload, 1) for _, m in meshes(8, True)
             if m.get("data", 1) > 1 and "model" not in m]
    planned = [c for c in (*result.candidates, *twins) if c.prediction is not None]
    assert len(planned) > 10 and any(c.family == "fsdp" for c in planned)
    for c in planned:
        assert c.prediction.roofline_mfu <= 1.0 and c.prediction.mfu <= 1.0, c.strategy.name


@pytest.fixture(scope="module")
def systems_sweep():
    from meshlab.search.sweep import sweep_systems

    systems = tuple(load_hardware(n) for n in ("v6e-8", "v5e-8", "h100", "h100:1"))
    return sweep_systems(load_card("qwen-image"), systems, "qwen-image", Workload()), systems


def test_several_systems_price_each_candidate_on_its_own(systems_sweep):
    """A plan shared by systems of one size is priced on each: its time from that system's rates, its dollars
    from that system's list price, its memory against that system's HBM."""
    from meshlab.cost.predict import predict

    result, systems = systems_sweep
    assert {c.hardware.name for c in result.candidates} == {hw.name for hw in systems}
    for c in result.candidates:
        assert c.strategy.name.endswith("-on-" + c.hardware.name.replace(":", "-"))
    twin = {c.hardware.name: c for c in result.candidates if c.strategy.name.startswith("fsdp-data8-on-")}
    v6e, v5e = twin["v6e-8"], twin["v5e-8"]
    assert v6e.plan is v5e.plan and v6e.prediction.seconds_per_image < v5e.prediction.seconds_per_image
    fresh = predict(v5e.plan, v5e.strategy, load_hardware("v5e-8"))  # priced alone, without the shared work
    assert fresh.seconds_per_image == v5e.seconds
    assert v5e.usd == 1.20 * 8 * v5e.seconds / 3600  # the catalog's v5e list price x 8 chips x the time
    assert v5e.memory.most_loaded.hbm == load_hardware("v5e-8").usable_hbm_bytes


def test_best_by_latency_throughput_and_dollars(systems_sweep):
    result, _ = systems_sweep
    fitting = [c for c in result.candidates if c.fits]
    assert result.objective == "latency" and result.best is result.lowest_latency
    assert result.best.latency == min(c.prediction.first_call_s for c in fitting)
    assert result.highest_throughput.seconds == min(c.prediction.seconds_per_image for c in fitting)
    assert result.cheapest.usd == min(c.prediction.usd_per_image for c in fitting)
    front = result.cost_front
    assert front[0].latency == result.best.latency and front[-1].usd == result.cheapest.usd
    assert all(a.latency <= b.latency and a.usd > b.usd for a, b in zip(front, front[1:]))
    assert not any(o.latency <= c.latency and o.usd < c.usd for c in front for o in fitting)


def test_each_system_says_what_limits_it(systems_sweep):
    """The binding term is the largest of a plan's terms per image: its ops (compute- or HBM-bound), the host's
    launches where they outlast the chip's work (then they set the whole step: more chips would not help), its
    collectives, the host's part, the text encode on the device and the VAE decode."""
    result, _ = systems_sweep
    by = {s.hardware.name: s for s in result.systems}
    assert by["h100:1"].fitting == 1 and by["h100:1"].best.strategy.mesh == {"data": 1}
    for s in result.systems:
        c = s.best
        p, t = c.prediction, c.prediction.terms
        per_image = p.layout.steps / p.layout.images
        on_host = c.strategy.placement.text_encoder != "device"
        terms = {("compute" if p.step.compute >= p.step.hbm else "HBM bandwidth"): p.step.local * per_image,
                 "host launches": (p.step.launch_floor if p.step.launch_wait else 0) * per_image,
                 "collectives": p.step.collective * per_image,
                 "host": t.overhead_s + t.transfer_s + (t.text_encode_s if on_host else 0.0),
                 "text encode": 0.0 if on_host else t.text_encode_s, "VAE decode": t.vae_decode_s}
        term = max(terms, key=terms.get)
        assert (s.binding.term, s.binding.seconds) == (term, terms[term])
        assert abs(s.binding.share - terms[term] / p.seconds_per_image) < 1e-12 and s.binding.move
        if p.step.launch_wait:  # launch-bound: the launches, not the compute they hide
            assert s.binding.term == "host launches"
    assert any(s.best.prediction.step.launch_wait for s in result.systems)  # the case above is exercised


def test_a_small_image_on_eight_gpus_is_bound_by_eager_launches():
    """Qwen-Image at 256x256 over an 8-GPU node: each GPU's share of a call is far shorter than the host's
    dispatch of its ops, so the launches bind, and the move names torch.compile."""
    from meshlab.search.sweep import sweep_systems

    result = sweep_systems(load_card("qwen-image"), (load_hardware("h100"),), "qwen-image",
                           Workload(height=256, width=256))
    (s,) = result.systems
    p = s.best.prediction
    assert p.step.launch_wait > p.step.local
    assert s.binding.term == "host launches" and "torch.compile" in s.binding.move


def test_shared_memory_is_each_system_s_own(systems_sweep):
    """Memory planned once per size, re-sized to each system: the same as a fresh report on that system (v5e is
    priced holding two blocks gathered where v6e holds one, whichever system the sweep planned first)."""
    from meshlab.plan.memory import memory_on

    result, _ = systems_sweep
    for c in result.candidates:
        if c.memory is not None:
            assert c.memory == memory_on(c.plan, c.strategy, c.hardware), c.strategy.name


def test_goals_keep_only_plans_that_meet_them_and_name_the_closest():
    from meshlab.search.sweep import Limits, sweep_systems

    systems = (load_hardware("v6e-8"), load_hardware("v5e-8"))
    card = load_card("qwen-image")
    goal = sweep_systems(card, systems, "qwen-image", Workload(), limits=Limits(max_seconds_per_image=20.0))
    fast = {c.strategy.name for c in goal.candidates if c.fits and c.prediction.first_call_s <= 20.0}
    assert {c.strategy.name for c in goal.candidates if c.fits and not goal.limits.problem(c)} == fast
    assert goal.best.strategy.name in fast and {c.strategy.name for c in goal.cost_front} <= fast
    none = sweep_systems(card, systems, "qwen-image", Workload(), limits=Limits(max_seconds_per_image=0.5))
    assert none.best is None and none.cheapest is None and none.cost_front == ()
    assert none.closest.latency == min(c.latency for c in none.candidates if c.fits)
    budget = sweep_systems(card, systems, "qwen-image", Workload(), limits=Limits(max_usd_per_image=0.001))
    assert budget.best is None and budget.closest.usd == min(c.usd for c in budget.candidates if c.fits)


def test_a_system_nothing_fits_is_named_not_an_error():
    from meshlab.search.sweep import sweep_systems

    result = sweep_systems(load_card("qwen-image"), (load_hardware("v6e-8"), load_hardware("v6e-1")), "qwen-image",
                           Workload())
    lone = next(s for s in result.systems if s.hardware.name == "v6e-1")
    assert lone.best is None and lone.fitting == 0 and lone.binding.term == "HBM capacity"
    assert "no plan fits" in lone.binding.move and result.best.hardware.name == "v6e-8"


def test_gpu_sweeps_search_usp_and_run_rings_as_xdit_does_tpus_as_xla_does(systems_sweep):
    """ulysses x ring (USP) is searched beside ulysses and ring; on GPUs a ring runs xDiT's overlapped passes and
    is priced as a ring, on TPUs the partitioner's gather. Every GPU sequence split is xDiT's, Ulysses too."""
    result, _ = systems_sweep
    usp = [c for c in result.candidates if c.family.startswith("ulysses+ring")]
    assert {c.hardware.kind for c in usp} == {"gpu", "tpu"}
    for c in usp:
        activations = c.strategy.activations
        assert activations.sequence_axes == ("ring", "seq") and c.strategy.mesh["ring"] > 1
        assert activations.sequence_parallel == ("xdit" if c.hardware.kind == "gpu" else "partitioner")
        assert activations.ring == ("p2p-passes" if c.hardware.kind == "gpu" else "gather")
    priced = next(c for c in usp if c.hardware.kind == "gpu" and c.prediction is not None)
    assert priced.prediction.step.rings and priced.prediction.layout.ulysses_degree > 1
    rings = [c for c in result.candidates if c.family.split("+")[0] == "ring" and c.prediction is not None]
    assert {bool(c.prediction.step.rings) for c in rings if c.hardware.kind == "tpu"} == {False}
    ulysses = [c for c in result.candidates if c.family.split("+")[0] == "ulysses" and c.hardware.kind == "gpu"]
    assert ulysses and {c.strategy.activations.sequence_parallel for c in ulysses} == {"xdit"}


def test_a_plan_whose_full_decode_does_not_fit_decodes_in_tiles():
    """Wan 2.1 14B at 720p x 81 on a v6e-8: a full-resolution decode holds about 9 GiB beside every chip's weights,
    more than most plans have left; the sweep turns on the tiled decode (diffusers' enable_tiling()) where the full
    one is what does not fit, and keeps the full decode where it fits."""
    from meshlab.plan.memory import memory_report

    card, hw = load_card("wan-2.1-t2v-14b"), load_hardware("v6e-8")
    result = sweep(card, hw, "wan-2.1-t2v-14b", Workload(height=720, width=1280, frames=81, steps=50))
    tiled = [c for c in result.candidates if c.fits and c.strategy.placement.vae_decode == "tiled"]
    assert tiled and result.best.strategy.placement.vae_decode == "tiled"
    for c in tiled:
        full = c.strategy.model_copy(update={"placement": c.strategy.placement.model_copy(
            update={"vae_decode": "full"})})
        assert not memory_report(c.plan, full, hw.usable_hbm_bytes, hw.runtime_reserve_bytes).fits, c.strategy.name
    assert any(c.fits and c.strategy.placement.vae_decode == "full" for c in result.candidates)


def test_the_ulysses_candidate_beside_largest_dim_weights_is_the_plan_xla_tpu_agreed_with():
    """The sweep's Ulysses rules keep the residual's features on model where the weights split on their largest
    dim: tests/cost/data/strategies/ulysses-largest-seq2-model4.yaml, whose XLA:TPU program agrees with the
    prediction (benchmarks/results/tpu_matrix_256.txt); leaving them whole gathered the residual every block."""
    from meshlab.search.sweep import Arrangement, _activations

    from tests.conftest import REPO

    checked = load_strategy(REPO / "tests" / "cost" / "data" / "strategies" / "ulysses-largest-seq2-model4.yaml")
    swept = _activations(Arrangement({"data": 1, "seq": 2, "model": 4}, "largest", "ulysses"))
    assert [(r.point, r.spec) for r in swept.rules] == [(r.point, r.spec) for r in checked.strategy.activations.rules]
    pairs = _activations(Arrangement({"data": 1, "seq": 2, "model": 4}, "pairs", "ulysses"))
    assert pairs.rules[0].spec == ["data", "seq", None]  # pairs: the residual is whole between blocks


def test_a_tpu_candidate_is_planned_and_keyed_as_its_exported_file_is(tmp_path):
    """Wan patchifies inside, so a ring candidate on v6e-8 (no block.input rule of its own) gets the rule planning
    adds, in the sweep as in `meshlab try` of its exported file: the same rules, prices and compile key, so a
    compile `check --backend tpu` measured of that file is the candidate's. The file leaves the added rule out
    and planning adds it again (and says so)."""
    from meshlab.plan.activations import added_split
    from meshlab.plan.compile_times import compile_key

    card, hw = load_card("wan-2.1-t2v-1.3b"), load_hardware("v6e-8")
    result = sweep(card, hw, "wan-2.1-t2v-1.3b", Workload(height=480, width=832, frames=21, steps=2, cfg=True,
                                                          text_tokens=512), families=("ring",))
    rings = [c for c in result.candidates if c.prediction is not None and c.strategy.activations.sequence_axes]
    assert rings
    for c in rings[:3]:
        assert added_split(c.strategy.activations) is not None, c.strategy.name
        path = tmp_path / f"{c.strategy.name}.yaml"
        write_atomic(path, strategy_yaml(c))
        assert "added by meshlab" not in path.read_text()
        planned = plan_file(path)
        assert planned.strategy.activations.rules == c.strategy.activations.rules
        assert any("patchifies its latent inside" in line for line in planned.loaded.taken)
        assert compile_key(planned.strategy, card, "v6e-8") == compile_key(c.strategy, card, "v6e-8")


def test_a_tpu_candidate_s_first_image_takes_its_measured_compile(tmp_path, monkeypatch):
    """A compile `meshlab check --backend tpu` kept for a candidate's plan is its startup's compile, marked measured
    in the sweep's document; the others stay modelled."""
    from meshlab.plan.compile_times import MeasuredCompile, record_compile
    from meshlab.search.sweep import sweep_document

    monkeypatch.setenv("MESHLAB_COMPILE_TIMES", str(tmp_path / "times.json"))
    card, hw = load_card("qwen-image"), load_hardware("v6e-8")
    workload = Workload(height=512, width=512, steps=2, cfg=True, text_tokens=64)
    before = sweep(card, hw, "qwen-image", workload, families=("pairs", "2d"))
    best = before.best
    assert not best.prediction.startup.compile_measured
    measured = MeasuredCompile(seconds=1234.0, strategy=best.strategy.name, front_end="torch-xla", system="v6e-8",
                               host="h", cores=2, libtpu="0.0.52", measured_at="2026-12-06T00:00:00+00:00")
    record_compile(best.strategy, card, "v6e-8", measured)
    after = sweep(card, hw, "qwen-image", workload, families=("pairs", "2d"))
    found = {c.strategy.name: c for c in after.candidates if c.prediction is not None}
    startup = found[best.strategy.name].prediction.startup
    assert startup.compile_measured and startup.compile_s == 1234.0
    others = [c for name, c in found.items() if name != best.strategy.name]
    assert others and not any(c.prediction.startup.compile_measured for c in others)
    document = sweep_document(after, hw)
    row = next(r for r in document["candidates"] if r["name"] == best.strategy.name)
    assert row["predicted"]["time_to_first_image"]["compile"] == "measured"
    system = document["systems"][0]  # the best by latency: a startup does not rank it
    assert (system["best"], system["compile"]) == (best.strategy.name, "measured")
