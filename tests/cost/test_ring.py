"""USP (Ulysses x ring) and ring attention priced as a ring (issue 26, parts 1 and 2)."""

from __future__ import annotations

import json
import os

import pytest
import yaml

from meshlab.cost.predict import predict
from meshlab.cost.collectives import STREAM_RESPLITS
from meshlab.cost.ring import (CAST_BYTES_PER_ELEMENT, GATHER_PHASE, MERGE_BYTES_PER_ELEMENT, MERGE_HBM_FRACTION,
                               RingAttention)
from meshlab.core.errors import MeshlabError
from meshlab.api import load_plan
from tests.conftest import REPO

USP = REPO / "strategies" / "flux-usp-h100.yaml"


def _variant(tmp_path, source, name="v.yaml", **activations):
    doc = yaml.safe_load(source.read_text())
    doc["activations"] = {**doc["activations"], **activations}
    path = tmp_path / name
    path.write_text(yaml.safe_dump(doc))
    return path


def _predicted(path):
    planned = load_plan(path)
    return planned, predict(planned.plan, planned.strategy, planned.hardware)


def test_usp_names_its_ulysses_and_ring_axes_and_splits_tokens_over_both():
    planned, p = _predicted(USP)
    layout = p.layout
    assert planned.strategy.activations.sequence_axes == ("ring", "seq")
    assert (layout.ulysses_axes, layout.ring_axes, layout.ulysses_degree, layout.ring_degree) == (("seq",), ("ring",),
                                                                                                  2, 2)
    assert layout.local.image == 4096 // 4  # the tokens split over ring x seq between attentions
    assert "ring" in layout.activation_axes() and "seq" in layout.activation_axes()


def test_a_ring_is_n_passes_and_n_minus_1_merges_at_the_kernel_rate_for_its_block():
    """Each pass does 1/n of the attention's FLOPs on 1/n of the keys, on the heads Ulysses left the chip and the
    tokens the ring's share holds; a merge and a cast move their float32 output's bytes; the ring's time is the
    sum, its transfers hidden where a pass outlasts them."""
    planned, p = _predicted(USP)
    hw = planned.hardware
    rings = p.step.rings
    flux_attentions = 19 + 38
    assert sum(r.count for r in rings) == flux_attentions and {r.degree for r in rings} == {2}
    r = rings[0]
    attention = next(w for w in p.work if w.kind == "attention" and w.name == r.module)
    batch, heads, queries, keys, head_dim = attention.shape
    # under USP the chip's heads are split by Ulysses and its queries are the ring's share of the tokens
    per_pass_flops = attention.flops / 2
    # the kernel's rate at the block's keys, times how full the pass's tiles (the chip's heads x queries) keep the SMs
    rate_at_block = hw.attention_rate(-(-keys // 2), head_dim) * hw.attention_occupancy(batch, heads // 2,
                                                                                         queries * 2)
    assert hw.attention_occupancy(batch, heads // 2, queries * 2) < 1  # one image's pass fills few waves
    assert r.pass_seconds == pytest.approx(per_pass_flops / rate_at_block)  # compute-bound at this size
    out_elements = batch * queries * 2 * (heads // 2) * head_dim  # queries x Ulysses, heads / Ulysses
    merge_bandwidth = hw.hbm_bandwidth * MERGE_HBM_FRACTION  # what eager merges were measured to reach
    assert r.merge_seconds == pytest.approx(MERGE_BYTES_PER_ELEMENT * out_elements / merge_bandwidth)
    assert r.block_bytes == 2 * batch * (keys // 2) * (heads // 2) * head_dim * 2  # k and v, bf16
    assert r.cast_seconds == pytest.approx(CAST_BYTES_PER_ELEMENT * out_elements / merge_bandwidth)
    assert r.seconds == pytest.approx(2 * r.pass_seconds + r.merge_seconds + 3 * r.cast_seconds + r.exposed_transfer)
    assert r.exposed_transfer == max(0.0, r.transfer_seconds - r.pass_seconds)
    assert r.seconds > r.whole_seconds  # shorter keys run slower, and the merge is extra


def test_the_merge_bandwidth_is_the_h200_measurement_it_cites():
    """MERGE_HBM_FRACTION is read from the 2026-12-05 H200 file, not chosen: the mean of the readings the host's
    dispatch does not touch. Flux's graphed rings at 2 and 4 ranks less their graphed passes leave the first cast
    and n - 1 merges; Wan's merges, timed alone, run for milliseconds each (a merge and its two casts). At 8 ranks
    Flux's reading is lower (the kernels' own start and tail, left out)."""
    from meshlab.core.hardware import load_hardware

    measured = json.loads((REPO / "experiments" / "profiles" / "h200-2026-12-05" / "ring-attention.json").read_text())
    spec = load_hardware("h200").hbm_bandwidth
    graphed, alone = {}, {}
    for c in measured["cases"]:
        n, elements = c["degree"], c["batch"] * c["tokens"] // c["degree"] * c["heads"] * c["head_dim"]
        if c.get("ring_graph_s") is not None:
            moved = elements * (n * CAST_BYTES_PER_ELEMENT + (n - 1) * MERGE_BYTES_PER_ELEMENT)
            graphed[n] = moved / (c["ring_graph_s"] - n * c["pass_graph_s"]) / spec
        else:
            assert c["merge_s"] > 5e-4  # long enough that one call's dispatch does not show
            alone[n] = elements * (2 * CAST_BYTES_PER_ELEMENT + MERGE_BYTES_PER_ELEMENT) / c["merge_s"] / spec
    assert sorted(graphed) == sorted(alone) == [2, 4, 8]
    readings = [graphed[2], graphed[4], *alone.values()]
    assert MERGE_HBM_FRACTION == pytest.approx(sum(readings) / len(readings), abs=0.001)
    assert graphed[8] < min(readings) and max(readings) < 0.85  # below a long streaming copy's assumed efficiency


def test_the_implementation_decides_the_transfers(tmp_path):
    """gather: every chip gathers k and v; a ring moves them itself (diffusers one all-gather behind the first
    pass, xDiT a block behind each pass). On a GPU no plan re-splits the streams to join them (the tools join each
    chip's own shards); the partitioner's program, which `check` holds, does."""
    steps = {}
    for tool, ring in (("partitioner", "gather"), ("diffusers", "gather-passes"), ("xdit", "p2p-passes")):
        _planned, p = _predicted(_variant(tmp_path, USP, f"{ring}.yaml", sequence_parallel=tool))
        steps[ring] = p.step
    gather, passes, p2p = (steps[k] for k in ("gather", "gather-passes", "p2p-passes"))
    gathers = lambda step: [t for t in step.collectives if t.collective.phase == GATHER_PHASE]  # noqa: E731
    assert not gather.rings and gathers(gather) and not gathers(passes) and not gathers(p2p)
    planned, p = _predicted(USP)
    assert any(c.phase in STREAM_RESPLITS for c in p.collectives)  # what XLA's partitioner makes
    issued = p.issued_collectives
    assert not any(c.phase in STREAM_RESPLITS or c.phase == GATHER_PHASE for c in issued)  # not what xDiT runs
    ulysses = [c for c in issued if c.kind == "all-to-all"]
    assert ulysses and {c.axes for c in ulysses} == {p.layout.ulysses_axes}  # over seq alone, as xDiT's
    assert any(c.axes == ("ring", "seq") for c in p.collectives if c.kind == "all-to-all")  # XLA's joins ride it
    gathered = passes.rings[0]  # diffusers' one gather of n blocks over the ring, behind the first pass
    from meshlab.cost.topology import collective_seconds

    route = next(t.route for t in steps["gather"].collectives if t.collective.axes == ("ring",))
    hw = planned.hardware
    assert gathered.transfer_seconds == pytest.approx(collective_seconds(
        "all-gather", 2 * gathered.block_bytes, route, hw.collective_latency_s))
    gathered = passes.rings[0]
    assert gathered.exposed_transfer == max(0.0, gathered.transfer_seconds - gathered.pass_seconds)
    assert passes.local > gather.local and p2p.local == pytest.approx(passes.local)
    assert p2p.dispatches > gather.dispatches  # each pass and merge is more kernels for the host


def test_a_ring_s_attention_costs_more_than_ulysses_one_kernel_at_the_same_degree(tmp_path):
    """cfg 2 x sequence 4 for Qwen-Image at 1024x1024 on 8 H100s: both do the same attention FLOPs per chip, but
    the ring in 4 passes at a quarter of the keys each (a lower published rate) plus 3 merges, where Ulysses runs
    one kernel over every key on a quarter of the heads."""
    from meshlab.cost.timing import op_seconds

    ulysses = REPO / "strategies" / "ulysses.yaml"
    ring = _variant(tmp_path, ulysses, "ring.yaml", rules=[], sequence_parallel="xdit")
    planned, u = _predicted(ulysses)
    _, r = _predicted(ring)
    hw = planned.hardware
    kernels = [w for w in u.work if w.kind == "attention"]
    assert sum(w.flops * w.count for w in kernels) == pytest.approx(sum(w.flops * w.count for w in r.work
                                                                        if w.kind == "attention"))
    ulysses_s = sum(w.count * op_seconds(w, hw) for w in kernels)
    ring_s = sum(x.count * x.compute_seconds for x in r.step.rings)
    assert ring_s > ulysses_s
    assert hw.attention_rate(4608 // 4, 128) < hw.attention_rate(4608, 128)


def test_a_ulysses_attention_fills_the_sms_as_its_kernel_runs_after_the_all_to_all(tmp_path):
    """Ulysses over 4 chips moves the tokens onto the heads: the kernel runs a quarter of the heads over every
    query, and its tiles are counted so. At 736x736 Qwen-Image has 46 x 46 + 512 = 2,628 tokens, 657 a chip
    between attentions (5.1 tiles of 128 a head: 6 x 24 = 144 as split there, two waves of 132 SMs) and
    ceil(2628 / 128) x 6 = 126 at the kernel (one wave): the kernel's count is the one priced."""
    from meshlab.cost.timing import op_rate

    doc = yaml.safe_load((REPO / "strategies" / "ulysses.yaml").read_text())
    doc["workload"] = {**doc["workload"], "height": 736, "width": 736}
    path = tmp_path / "ulysses-736.yaml"
    path.write_text(yaml.safe_dump(doc))
    planned, p = _predicted(path)
    hw = planned.hardware
    w = next(w for w in p.work if w.kind == "attention")
    batch, heads, queries, keys, head_dim = w.shape
    assert (w.ulysses, queries, keys) == (4, 657, 2628) and w.kernel_rows == (batch, heads // 4, 2628)
    at_kernel = hw.attention_occupancy(batch, heads // 4, 2628)
    assert at_kernel > 1.5 * hw.attention_occupancy(batch, heads, 657)
    assert op_rate(w, hw) == pytest.approx(hw.attention_rate(keys, head_dim) * at_kernel)


def test_only_the_attentions_a_ulysses_rule_marks_run_their_heads_split():
    """Wan 2.1 under cfg 2 x Ulysses 4 with its Ulysses rules for self-attention only: the self-attention's kernel
    runs a quarter of the heads over every token; the cross-attention keeps its heads and its tokens split (it
    gathers the text instead), as the collectives read the same rules."""
    _planned, p = _predicted(REPO / "strategies" / "wan-14b-v6e-8.yaml")
    by_name = {w.name.rsplit(".", 1)[-1]: w for w in p.work if w.kind == "attention"}
    assert by_name["attn1"].ulysses == 4 and by_name["attn2"].ulysses == 1
    batch, heads, queries = by_name["attn2"].shape[:3]
    assert by_name["attn2"].kernel_rows == (batch, heads, queries)


def test_a_profile_timed_attention_is_not_repriced_as_a_ring():
    profiled = REPO / "experiments" / "strategies" / "qwen-image-one-h200-profiled-512.yaml"
    planned, p = _predicted(profiled)
    assert p.measured is not None and p.step.rings == ()


def test_a_ring_that_does_not_divide_the_tokens_names_what_would(tmp_path):
    """1008 x 1008 is 63 x 63 patches: 3,969 image tokens, odd, so ring 2 x Ulysses 2 cannot split them evenly, and
    no sequence degree the 4 devices beside cfg allow divides them: the nearest height 4 divides is 1024. Flux's
    text joins the sequence, so its 510 tokens must divide too."""
    doc = yaml.safe_load(USP.read_text())
    doc["workload"].update(height=1008, width=1008)
    path = tmp_path / "odd.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(MeshlabError) as error:
        load_plan(path)
    text = str(error.value)
    assert "split 3969 image tokens 4 ways" in text and "the sequence split xdit runs needs an even one" in text
    assert text.endswith("; use height 1024")
    doc = yaml.safe_load(USP.read_text())
    doc["workload"]["text_tokens"] = 510
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(MeshlabError, match=r"split 510 text tokens 4 ways.*use a sequence degree \(ring x Ulysses\) "
                       r"of 2, or text_tokens 512"):
        load_plan(path)
    doc["workload"].update(height=1008, width=1008)  # both uneven: the fix needs both sizes, not either
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(MeshlabError) as error:
        load_plan(path)
    assert str(error.value).endswith("; use height 1024 and text_tokens 512")
    load_plan(_variant(tmp_path, path, "gathered.yaml", sequence_parallel="partitioner"))  # XLA pads an uneven split: planned
    ulysses = yaml.safe_load((REPO / "strategies" / "ulysses.yaml").read_text())
    ulysses["activations"]["sequence_parallel"] = "xdit"
    ulysses["workload"].update(height=1008, width=1008)
    path.write_text(yaml.safe_dump(ulysses))
    with pytest.raises(MeshlabError,
                       match="split 3969 image tokens 4 ways.*the sequence split xdit runs needs an even one"):
        load_plan(path)  # Ulysses alone: the tools shard the sequence evenly too (diffusers' EquipartitionSharder)
    ulysses["activations"]["sequence_parallel"] = "partitioner"
    path.write_text(yaml.safe_dump(ulysses))
    load_plan(path)  # XLA pads it


def test_a_sequence_axis_the_tools_cannot_place_is_refused(tmp_path):
    """USP whose qkv rule names only the Ulysses axis and not the ring's in its tokens: the ring axis splits the
    tokens between attentions but neither stays on them at the kernel nor moves onto the heads. No GPU tool runs
    that; priced, it came out faster than the plan they do run."""
    doc = yaml.safe_load(USP.read_text())
    doc["activations"]["rules"][1]["spec"] = ["cfg", None, "seq"]
    path = tmp_path / "idle.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(MeshlabError, match="sequence axis 'ring' splits the tokens between attentions.*put 'ring' in "
                       "the qkv rule's tokens or features entry"):
        load_plan(path)


def test_sequence_lists_are_checked():
    from pydantic import ValidationError

    from meshlab.strategy.schema import Activations

    with pytest.raises(ValidationError, match="named twice"):
        Activations(sequence=["seq", "seq"])
    with pytest.raises(ValidationError, match="splits the batch"):
        Activations(batch="data", sequence=["data", "seq"])
    with pytest.raises(ValidationError, match="empty list"):
        Activations(sequence=[])
    assert Activations(sequence="seq").sequence_axes == ("seq",)


def test_explain_gives_the_ring_term_and_its_reasons():
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "meshlab", "explain", str(USP), "--json"], capture_output=True,
                          text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    ring = json.loads(done.stdout)["predicted"]["ring"]
    assert ring["implementation"] == "p2p-passes" and ring["degree"] == 2 and ring["axes"] == ["ring"]
    assert ring["attentions_per_call"] == 57 and ring["per_call_s"] > 0
    done = subprocess.run([sys.executable, "-m", "meshlab", "explain", str(USP)], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "COLUMNS": "200"})
    assert "ring attention" in done.stdout and "2 passes of" in done.stdout and "1 merge of" in done.stdout


def test_ring_attention_holds_its_own_arithmetic():
    r = RingAttention("a", 3, 4, "p2p-passes", pass_seconds=1.0, merge_seconds=0.5, cast_seconds=0.1,
                      transfer_seconds=1.5, block_bytes=10, whole_seconds=3.0)
    assert r.exposed_transfer == 3 * 0.5 and r.seconds == pytest.approx(4 * 1.0 + 3 * 0.5 + 5 * 0.1 + 1.5)
    gathered = RingAttention("a", 3, 4, "gather-passes", 1.0, 0.5, 0.1, 1.5, 10, 3.0)
    assert gathered.exposed_transfer == 0.5  # only the first pass hides the one gather
    assert (gathered.transferred_bytes, r.transferred_bytes) == (40, 30)  # the gathered buffer; the blocks sent


def test_a_cross_attention_over_whole_text_keys_is_no_ring(tmp_path):
    """Wan under a ring: attn1's keys are the split video tokens, a ring; attn2's keys are the whole text, one
    kernel as before (diffusers gives it no parallel config), and XLA's partitioner gathers nothing for it."""
    from meshlab.cost.predict import plan_work

    path = tmp_path / "wan-ring.yaml"
    path.write_text(yaml.safe_dump({
        "name": "wan-ring", "model": "wan-2.1-t2v-14b", "hardware": "h100", "mesh": {"cfg": 2, "seq": 4},
        "rules": [{"match": "*", "shard": "replicate"}], "activations": {"sequence": "seq", "sequence_parallel": "xdit"},
        "workload": {"height": 480, "width": 832, "frames": 81, "steps": 40, "text_tokens": 512}}))
    planned, p = _predicted(path)
    ringed = {r.module.rsplit(".", 1)[-1] for r in p.step.rings}
    assert ringed == {"attn1"}
    gathers = [c for c in plan_work(planned.plan, planned.strategy).collectives if c.phase == "attention:kv"]
    assert len(gathers) == 2 and {c.count for c in gathers} == {40}  # attn1's k and v in each of the 40 blocks
    # under USP rules the text is split between attentions too (a block.input rule on every stream): attn2 still
    # runs its one kernel, as diffusers runs it
    usp = tmp_path / "wan-usp.yaml"
    usp.write_text(yaml.safe_dump({
        "name": "wan-usp", "model": "wan-2.1-t2v-14b", "hardware": "h100", "mesh": {"cfg": 2, "ring": 2, "seq": 2},
        "rules": [{"match": "*", "shard": "replicate"}],
        "activations": {"sequence": ["ring", "seq"], "sequence_parallel": "xdit", "rules": [
            {"point": "block.input", "spec": ["cfg", ["ring", "seq"], None]},
            {"point": "attention.qkv", "spec": ["cfg", "ring", "seq"]},
            {"point": "attention.output", "spec": ["cfg", ["ring", "seq"], None]}]},
        "workload": {"height": 480, "width": 832, "frames": 81, "steps": 40, "text_tokens": 512}}))
    _, p = _predicted(usp)
    assert {r.module.rsplit(".", 1)[-1] for r in p.step.rings} == {"attn1"}


def test_a_ring_of_sent_blocks_holds_two_blocks_of_keys_not_all(tmp_path):
    """seq 4: a p2p ring holds its own block of k and v and the incoming one (half the keys), where the gather and
    diffusers' gathered passes hold every key; both rings keep a float32 running output beside the pass's."""
    ulysses = REPO / "strategies" / "ulysses.yaml"
    held = {}
    for tool, ring in (("partitioner", "gather"), ("diffusers", "gather-passes"), ("xdit", "p2p-passes")):
        planned = load_plan(_variant(tmp_path, ulysses, f"{ring}.yaml", rules=[], sequence_parallel=tool))
        held[ring] = planned.memory.most_loaded.activations
    assert held["p2p-passes"] < held["gather"] < held["gather-passes"]


def test_keys_made_before_rings_stay_valid():
    """A profile's plan key and a run's compile-cache identity read the activations as they were before `ring` and
    sequence lists: the default ring left out, a one-axis list its name."""
    from meshlab.strategy.schema import Activations

    plain = Activations(batch="data", sequence="seq").identity()
    assert plain == {"batch": "data", "sequence": "seq", "rules": []}
    assert Activations(batch="data", sequence=["seq"]).identity() == plain
    usp = Activations(sequence=["ring", "seq"], sequence_parallel="xdit")
    assert usp.identity()["sequence_parallel"] == "xdit" and usp.ring == "p2p-passes"
