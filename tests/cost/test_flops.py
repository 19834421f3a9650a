"""FLOPs against hand counts: the small card by hand, Qwen-Image against the reference figures."""

import pytest

from meshlab.models.card import load_card
from meshlab.plan.tokens import TokenCounts

from tests.conftest import small_card
from tests.cost.helpers import PAIRS, forward_flops, predicted


def hand_count(width: int, blocks: int, image: int, text: int, mlp: int = 4) -> float:
    """Per block and stream: q, k, v, out (4 w^2) and the MLP (2 mlp w^2) at that stream's tokens; modulation
    6 w^2 once per sample and stream; attention 4 x S^2 x w; outside: img_in, txt_in (16 -> w), proj_out."""
    per_token = 4 * width * width + 2 * mlp * width * width
    block = 2 * per_token * (image + text) + 2 * 2 * 6 * width * width + 4 * (image + text) ** 2 * width
    outside = 2 * 16 * width * image + 2 * 16 * width * text + 2 * width * 16 * image
    return blocks * block + outside


def test_small_card_matches_hand_count():
    assert forward_flops(small_card(), TokenCounts(16, 8)) == hand_count(64, 2, 16, 8)


@pytest.mark.parametrize("text, reference", [(128, 70.6e12), (512, 78.3e12)])
def test_qwen_image_forward_matches_reference(text, reference):
    # qwen-image.md: one forward at 1024x1024 is about 70.6 TFLOP (128 text tokens), 78.3 (512)
    flops = forward_flops(load_card("qwen-image"), TokenCounts(4096, text))
    assert flops == pytest.approx(reference, rel=0.02)


def test_two_params_tokens_overstates_qwen_image():
    card = load_card("qwen-image")
    naive = 2 * card.total_params * (4096 + 512)
    assert naive / forward_flops(card, TokenCounts(4096, 512)) == pytest.approx(2.4, abs=0.1)


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
    """Everything replicated on 8 chips: each chip's FLOPs and bytes are the whole forward's, counted by hand,
    and the MFUs follow from v6e's figures in meshlab/data/hardware.yaml."""
    peak, bandwidth = 918e12, 1.6e12  # v6e bf16_flops, hbm_bandwidth
    hbm_efficiency, step_overhead = 0.85, 1.0e-3  # v6e hbm_efficiency, step_overhead_s

    def hand_bytes(width: int, heads: int, blocks: int, image: int, text: int, mlp: int = 4) -> int:
        """HBM bytes of one call of the small card on one sample, weights whole, bf16, flash attention: each
        Linear reads its weight and bias once, reads its input and writes its output at its stream's tokens
        (the modulation Linears once per sample); each attention reads q, k, v and writes its output at the
        joint tokens; each block's norm_q scale is read once."""
        def linear(out, inp, tokens):
            return 2 * (out * inp + out + tokens * (inp + out))

        block = 2 * linear(6 * width, width, 1)  # img_mod.1, txt_mod.1
        for tokens in (image, text):
            block += 4 * linear(width, width, tokens)  # q, k, v and out of this stream
            block += linear(mlp * width, width, tokens) + linear(width, mlp * width, tokens)
        block += 2 * 4 * (image + text) * width  # attention
        block += 2 * (width // heads)  # attn.norm_q.weight
        outside = linear(width, 16, image) + linear(width, 16, text) + linear(16, width, image)
        return blocks * block + outside

    # data 1 x model 8, no rules: every chip repeats the whole forward, two guidance calls per step, on
    # 16 image tokens ((64 / 8 / 2)^2) and 8 text tokens
    p = predicted(mesh={"data": 1, "model": 8}, rules=[], workload={"batch": 1, "height": 64, "width": 64,
                                                                     "text_tokens": 8})
    flops, nbytes = hand_count(64, 2, 16, 8), hand_bytes(64, 4, 2, 16, 8)
    assert (flops, nbytes) == (5_292_032, 749_152)  # the two hand counts, evaluated
    assert p.step.flops == 2 * flops and p.step.hbm_bytes == 2 * nbytes
    assert p.collectives == () and p.step.collective == 0
    # 7 FLOP per byte against v6e's 574: HBM-bound, the roofline is the bytes at 100% bandwidth
    assert flops / peak < nbytes / bandwidth
    assert p.step.roofline == pytest.approx(2 * nbytes / bandwidth, rel=1e-12)
    # the useful work is one copy over 8 chips' peak: 1/8 of what one chip's roofline reaches
    assert p.roofline_mfu == pytest.approx(flops * bandwidth / (8 * peak * nbytes), rel=1e-12)
    assert p.roofline_mfu == pytest.approx(0.0015390043, rel=1e-8)
    # every op is HBM-bound at the derated rates too (none above about 12 FLOP per byte, against 540): the
    # predicted step is the bytes at 85% of the bandwidth plus 1 ms of host time
    total = 2 * nbytes / (bandwidth * hbm_efficiency) + step_overhead
    assert p.step.total == pytest.approx(total, rel=1e-12)
    assert p.mfu == pytest.approx(2 * flops / (8 * peak * total), rel=1e-12)

    # a wide card on a 1024 x 1024 image is compute-bound: the roofline MFU of 8 chips repeating it is 1/8
    wide = predicted(small_card(width=2048, heads=16), mesh={"data": 1, "model": 8}, rules=[],
                     workload={"batch": 1, "height": 1024, "width": 1024, "text_tokens": 8})
    flops, nbytes = hand_count(2048, 2, 4096, 8), hand_bytes(2048, 16, 2, 4096, 8)
    assert wide.step.flops == 2 * flops and wide.step.hbm_bytes == 2 * nbytes
    assert flops / peak > nbytes / bandwidth
    assert wide.step.roofline == pytest.approx(2 * flops / peak, rel=1e-12)
    assert wide.roofline_mfu == pytest.approx(1 / 8, rel=1e-12)


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
    from meshlab.core.hardware import load_hardware
    from meshlab.plan.planner import make_plan
    from tests.cost.helpers import strategy

    s = strategy(model="qwen-image", mesh={"data": 8}, rules=FSDP_RULES,
                 workload={"batch": 8, "height": 1024, "width": 1024, "text_tokens": 512})
    p = predict(make_plan(s, load_card("qwen-image"), 8), s, load_hardware("v6e-8"))
    per_call = sum(w.flops * w.count for w in p.work)
    assert per_call == pytest.approx(78.3e12, rel=0.02)
    assert p.roofline_mfu <= 1.0


def test_elementwise_passes_are_the_cards_bytes_per_token_at_the_chips_tokens():
    """One row per block list, counted once per block: the traced bytes per token of each stream times the
    tokens this chip holds; splitting the image tokens over a sequence axis halves the image stream's part."""
    from meshlab.cost.predict import predict
    from meshlab.core.hardware import load_hardware
    from meshlab.plan.planner import make_plan
    from tests.cost.helpers import strategy

    card = load_card("qwen-image")
    per_token = {stream: sum(e.bytes_per_token for e in card.elementwise if (e.stream, e.execution) == (
        stream, "fused")) for stream in ("image", "text", "joint")}
    workload = {"batch": 2, "height": 1024, "width": 1024, "text_tokens": 64}

    def rows(**overrides):
        s = strategy(model="qwen-image", rules=[], workload=workload, **overrides)
        p = predict(make_plan(s, card, 8), s, load_hardware("v6e-8"))
        return p.layout, [w for w in p.work if w.kind == "elementwise"]

    layout, (row,) = rows(mesh={"data": 2, "model": 4})
    assert row.count == 60 and row.flops == 0
    assert layout.local.image == 4096 and layout.local.text == 64 and layout.batch == 1
    expected = per_token["image"] * 4096 + per_token["text"] * 64 + per_token["joint"] * (4096 + 64)
    assert row.hbm_bytes == pytest.approx(expected)
    split, (halved,) = rows(mesh={"data": 2, "seq": 4}, activations={"batch": "data", "sequence": "seq"})
    assert split.local.image == 1024
    assert halved.hbm_bytes == pytest.approx(per_token["image"] * 1024 + per_token["text"] * split.local.text
                                             + per_token["joint"] * (1024 + split.local.text))
    assert halved.hbm_bytes < row.hbm_bytes


def test_tensor_parallel_splits_the_elementwise_tensors_its_linears_split():
    """Under column/row pairs over a model axis of 4, what a column Linear makes (q/k/v, the MLP's hidden
    activation), what a row Linear reads, and what goes into or comes out of attention is a quarter per chip; the
    residual stream and what row Linears make stay whole."""
    from meshlab.cost.predict import predict
    from meshlab.core.hardware import load_hardware
    from meshlab.plan.planner import make_plan
    from tests.cost.helpers import PAIRS, strategy

    card = load_card("qwen-image")
    workload = {"batch": 2, "height": 1024, "width": 1024, "text_tokens": 64}
    s = strategy(model="qwen-image", rules=PAIRS, workload=workload)
    p = predict(make_plan(s, card, 8), s, load_hardware("v6e-8"))
    (row,) = [w for w in p.work if w.kind == "elementwise"]
    column = ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj", "net.0.proj")
    row_parallel = ("to_out.0", "to_add_out", "net.2")

    def split(e) -> int:
        if e.side == "attention" or (e.side == "out" and e.linear.endswith(column)) or (
                e.side == "in" and e.linear.endswith(row_parallel)):
            return 4
        return 1

    tokens = {"image": 4096, "text": 64, "joint": 4096 + 64}
    fused = [e for e in card.elementwise if e.execution == "fused"]
    expected = sum(e.bytes_per_token * tokens[e.stream] / split(e) for e in fused)
    assert row.hbm_bytes == pytest.approx(expected)
    whole = sum(e.bytes_per_token * tokens[e.stream] for e in fused)
    assert 0.4 * whole < row.hbm_bytes < 0.7 * whole  # about half of Qwen-Image's passes are split
    s_eager = strategy(model="qwen-image", rules=PAIRS, workload=workload, compile={"elementwise": "eager"})
    eager = predict(make_plan(s_eager, card, 8), s_eager, load_hardware("v6e-8"))
    (eager_row,) = [w for w in eager.work if w.kind == "elementwise"]
    eager_entries = [e for e in card.elementwise if e.execution == "eager"]
    assert eager_row.hbm_bytes == pytest.approx(sum(e.bytes_per_token * tokens[e.stream] / split(e)
                                                    for e in eager_entries))
    eager_whole = sum(e.bytes_per_token * tokens[e.stream] for e in eager_entries)
    assert 0.4 * eager_whole < eager_row.hbm_bytes < 0.8 * eager_whole  # eager intermediates split with their op


def test_eager_execution_prices_every_ops_reads_and_writes():
    """compile: {elementwise: eager} prices the card's eager entries (every op its own kernel) instead of the fused
    gaps: for Qwen-Image about four times the bytes, and a step that much longer in its elementwise part."""
    from meshlab.cost.predict import predict
    from meshlab.core.hardware import load_hardware
    from meshlab.plan.planner import make_plan
    from tests.cost.helpers import strategy

    card = load_card("qwen-image")
    workload = {"batch": 1, "height": 1024, "width": 1024, "text_tokens": 64}
    by_execution = {}
    for execution in ("fused", "eager"):
        s = strategy(model="qwen-image", rules=[], mesh={"data": 8}, workload=workload,
                     compile={"elementwise": execution})
        p = predict(make_plan(s, card, 8), s, load_hardware("h100"))
        (row,) = [w for w in p.work if w.kind == "elementwise"]
        per_token = {stream: sum(e.bytes_per_token for e in card.elementwise if (e.stream, e.execution) == (
            stream, execution)) for stream in ("image", "text", "joint")}
        assert row.hbm_bytes == pytest.approx(per_token["image"] * 4096 + per_token["text"] * 64
                                              + per_token["joint"] * (4096 + 64))
        assert ("eager" in row.name) == (execution == "eager")
        by_execution[execution] = p
    ratio = by_execution["eager"].step.elementwise_bytes / by_execution["fused"].step.elementwise_bytes
    assert 3.5 < ratio < 5
    assert by_execution["eager"].step.total - by_execution["fused"].step.total == pytest.approx(
        by_execution["eager"].step.elementwise - by_execution["fused"].step.elementwise)


def test_a_card_without_an_elementwise_trace_prices_none():
    import dataclasses

    from tests.cost.helpers import predicted

    card = dataclasses.replace(load_card("qwen-image"), elementwise=())
    p = predicted(card=card, model="qwen-image", rules=[],
                  workload={"batch": 2, "height": 256, "width": 256, "text_tokens": 8})
    assert not [w for w in p.work if w.kind == "elementwise"]


def test_the_step_reports_its_elementwise_part():
    """`compare --json`'s per_step.elementwise_s: the elementwise rows priced at the effective HBM bandwidth, once per
    call; a part of compute_or_hbm_s."""
    from meshlab.cost.document import prediction_document
    from meshlab.cost.predict import predict
    from meshlab.core.hardware import load_hardware
    from meshlab.plan.planner import make_plan
    from tests.cost.helpers import strategy

    s = strategy(model="qwen-image", rules=[], mesh={"data": 8},
                 workload={"batch": 8, "height": 512, "width": 512, "text_tokens": 32})
    hw = load_hardware("v6e-8")
    p = predict(make_plan(s, load_card("qwen-image"), 8), s, hw)
    (row,) = [w for w in p.work if w.kind == "elementwise"]
    per_step = prediction_document(p)["per_step"]
    assert per_step["elementwise_bytes_per_chip"] == pytest.approx(2 * 60 * row.hbm_bytes)
    assert per_step["elementwise_s"] == pytest.approx(2 * 60 * row.hbm_bytes / (hw.hbm_bandwidth * hw.hbm_efficiency))
    assert 0 < per_step["elementwise_s"] < per_step["compute_or_hbm_s"]
