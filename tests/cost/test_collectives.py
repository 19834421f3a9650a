"""Collectives derived per layer from the plan."""

from collections import Counter

import pytest

from meshlab.errors import PlanError
from meshlab.hardware import load_hardware
from meshlab.cost.collectives import combine
from meshlab.cost.topology import collective_seconds, route
from meshlab.mesh import AbstractMesh

from tests.conftest import small_card
from tests.cost.helpers import PAIRS, predicted


def block_ops(p, block=0):
    return [c for c in p.collectives if c.block == block]


def test_column_row_pairs_need_one_all_reduce_each():
    p = predicted(rules=PAIRS)
    ops = block_ops(p)
    assert {c.kind for c in ops} == {"all-reduce"}
    # one per attention (image and text out-projections) and one per MLP, per stream: 4 in all
    assert len(ops) == 4 and all(c.axes == ("model",) for c in ops)
    # bytes: batch 1 per chip x tokens of the stream x width 64 x 2 bytes
    assert sorted(c.bytes for c in ops) == [8 * 64 * 2] * 2 + [16 * 64 * 2] * 2
    merged = combine(list(ops))  # a combiner would merge each stream pair at the same point
    assert len(merged) == 2 and sum(c.operands for c in merged) == 4
    assert not [c for c in p.collectives if c.block is None]  # nothing outside the blocks is split


def test_identical_blocks_are_folded_but_counted():
    p = predicted(rules=PAIRS)
    assert {c.count for c in p.collectives} == {2}  # 2 blocks of the small card
    assert not block_ops(p, block=1)


def test_largest_gathers_out_projection_and_permutes_cut_chunks():
    p = predicted()
    kinds = Counter()
    for c in block_ops(p):
        kinds[c.kind] += c.operands
    # to_out / to_add_out are split on their output (square: lowest dim): gather in and out, 2 streams;
    # modulation (6 x 64 = 384 rows over 4: 96-row shards cut 64-wide chunks): gathered, plus permutes
    assert kinds["all-gather"] == 2 * 2 + 2
    assert kinds["all-reduce"] == 2  # MLP-out (largest dim is its input): row
    assert kinds["collective-permute"] == 2 * 2  # shard boundaries at 96 and 288 cut a chunk; 192 does not


def test_aligned_chunks_do_not_permute():
    p = predicted(mesh={"data": 4, "model": 2}, workload={"batch": 4, "height": 64, "width": 64, "text_tokens": 8})
    assert not [c for c in p.collectives if c.kind == "collective-permute"]  # 192-row shards = 3 chunks


def test_replicated_plan_has_no_collectives():
    assert predicted(mesh={"data": 8}, rules=[], workload={"batch": 8, "height": 64, "width": 64,
                                                            "text_tokens": 8}).collectives == ()


def test_fsdp_weights_are_gathered_over_the_batch_axis():
    rules = [{"match": "*", "min_rank": 2, "shard": "largest", "axis": "data"}]
    p = predicted(rules=rules)
    weights = [c for c in p.collectives if c.phase.endswith(":weights")]
    assert weights and all(c.axes == ("data",) for c in weights)


def test_sequence_axis_gathers_image_keys_and_values():
    p = predicted(mesh={"data": 2, "seq": 4}, rules=[], activations={"batch": "data", "sequence": "seq"})
    kv = [c for c in p.collectives if c.phase == "attention:kv"]
    assert len(kv) == 2 and all(c.axes == ("seq",) for c in kv)  # k and v of the image stream


def test_cfg_axis_must_have_size_two_with_guidance():
    with pytest.raises(PlanError, match="cfg"):
        predicted(mesh={"cfg": 4, "model": 2})


def test_v6e_8_axes_are_open_lines_and_the_whole_slice_a_ring():
    hw = load_hardware("v6e-8")
    mesh = AbstractMesh((("data", 2), ("model", 4)))
    assert route(("model",), mesh, hw).shape == "line"
    assert route(("data",), mesh, hw).shape == "line"
    whole = route(("data", "model"), mesh, hw)
    assert whole.shape == "grid" and whole.bandwidth == 2 * hw.ici_link_bandwidth
    strided = route(("data",), AbstractMesh((("data", 4), ("model", 2))), hw)
    assert strided.shape == "strided"


def test_all_reduce_costs_twice_an_all_gather():
    hw = load_hardware("v6e-8")
    r = route(("model",), AbstractMesh((("data", 2), ("model", 4))), hw)
    gather = collective_seconds("all-gather", 4e6, r, 0.0)
    assert gather == pytest.approx(3e6 / hw.ici_link_bandwidth)
    assert collective_seconds("all-reduce", 4e6, r, 0.0) == pytest.approx(2 * gather)


def test_flux_card_derives_without_error():
    from meshlab.cards.card import load_card
    from meshlab.cost.predict import predict
    from meshlab.plan.planner import make_plan
    from tests.cost.helpers import strategy

    card = load_card("flux-dev")
    s = strategy(workload={"batch": 2, "height": 1024, "width": 1024, "text_tokens": 512, "cfg": False})
    p = predict(make_plan(s, card, 8), s, load_hardware("v6e-8"))
    assert p.step.total > 0 and p.block_collectives()
