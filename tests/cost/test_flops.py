"""FLOPs against hand counts: the small card by hand, Qwen-Image against the reference figures."""

import pytest

from meshlab.cards.card import load_card
from meshlab.cost.flops import model_flops
from meshlab.tokens import TokenCounts

from tests.conftest import small_card
from tests.cost.helpers import PAIRS, predicted


def hand_count(width: int, blocks: int, image: int, text: int, mlp: int = 4) -> float:
    """Per block and stream: q, k, v, out (4 w^2) and the MLP (2 mlp w^2) at that stream's tokens; modulation
    6 w^2 once per sample and stream; attention 4 x S^2 x w; outside: img_in, txt_in (16 -> w), proj_out."""
    per_token = 4 * width * width + 2 * mlp * width * width
    block = 2 * per_token * (image + text) + 2 * 2 * 6 * width * width + 4 * (image + text) ** 2 * width
    outside = 2 * 16 * width * image + 2 * 16 * width * text + 2 * width * 16 * image
    return blocks * block + outside


def test_small_card_matches_hand_count():
    assert model_flops(small_card(), TokenCounts(16, 8)) == hand_count(64, 2, 16, 8)


@pytest.mark.parametrize("text, reference", [(128, 70.6e12), (512, 78.3e12)])
def test_qwen_image_forward_matches_reference(text, reference):
    # qwen-image.md: one forward at 1024x1024 is about 70.6 TFLOP (128 text tokens), 78.3 (512)
    flops = model_flops(load_card("qwen-image"), TokenCounts(4096, text))
    assert flops == pytest.approx(reference, rel=0.02)


def test_two_params_tokens_overstates_qwen_image():
    card = load_card("qwen-image")
    naive = 2 * card.total_params * (4096 + 512)
    assert naive / model_flops(card, TokenCounts(4096, 512)) == pytest.approx(2.4, abs=0.1)


def test_pairs_divide_linear_flops_by_model_axis():
    whole = predicted(mesh={"data": 8}, rules=[], workload={"batch": 8, "height": 64, "width": 64, "text_tokens": 8})
    pairs = predicted(rules=PAIRS)
    paired = [w for w in pairs.work if w.kind == "linear" and w.block is not None and "_mod" not in w.name]
    by_name = {w.name: w for w in whole.work}
    for w in paired:
        assert w.flops == by_name[w.name].flops / 4
    attention = [w for w in pairs.work if w.kind == "attention"]
    assert all(w.flops == by_name[w.name].flops / 4 for w in attention)  # 4 heads, one per chip


def test_replicated_work_is_counted_per_chip():
    # data 1 x model 8 with everything replicated: every chip repeats the whole forward
    p = predicted(mesh={"data": 1, "model": 8}, rules=[], workload={"batch": 1, "height": 64, "width": 64,
                                                                     "text_tokens": 8})
    assert p.step.flops == 2 * p.model_flops_per_call  # two guidance calls per step
    assert p.mfu < 1 / 8 + 1e-9 or p.roofline_mfu <= 1 / 8 + 1e-9


def test_cfg_axis_halves_calls():
    with_axis = predicted(mesh={"cfg": 2, "data": 2, "model": 2})
    without = predicted(mesh={"data": 2, "model": 4})
    assert with_axis.layout.calls == 1 and without.layout.calls == 2
    assert any(c.per_step and c.axes == ("cfg",) for c in with_axis.collectives)


FSDP_RULES = [{"match": "*", "min_rank": 2, "shard": "largest", "axis": "data"}]
EIGHT = {"batch": 8, "height": 64, "width": 64, "text_tokens": 8}


def test_fsdp_chip_flops_equal_data_parallel_for_the_same_samples_per_chip():
    """A weight split over the batch axis is gathered before use: each chip multiplies whole weights."""
    fsdp = predicted(mesh={"data": 8}, rules=FSDP_RULES, workload=EIGHT)
    data = predicted(mesh={"data": 8}, rules=[], workload=EIGHT)
    assert fsdp.step.flops == data.step.flops
    assert fsdp.step.flops == 2 * fsdp.model_flops_per_call  # one sample per chip, two guidance calls
    assert fsdp.roofline_mfu <= 1.0


def test_qwen_image_fsdp_per_chip_flops_are_one_whole_forward():
    """The reviewer's case: data 8, every weight's largest dim over data, batch 8: 78.3 TFLOP per call per chip."""
    from meshlab.cost.predict import predict
    from meshlab.hardware import load_hardware
    from meshlab.plan.planner import make_plan
    from tests.cost.helpers import strategy

    s = strategy(model="qwen-image", mesh={"data": 8}, rules=FSDP_RULES,
                 workload={"batch": 8, "height": 1024, "width": 1024, "text_tokens": 512})
    p = predict(make_plan(s, load_card("qwen-image"), 8), s, load_hardware("v6e-8"))
    per_call = sum(w.flops * w.count for w in p.work)
    assert per_call == pytest.approx(78.3e12, rel=0.02)
    assert p.roofline_mfu <= 1.0
