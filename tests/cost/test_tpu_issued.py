"""What XLA:TPU issues in place of the partitioner's collectives (meshlab.cost.collectives.issued_on), held on the CPU
against figures XLA:TPU's own ahead-of-time programs gave (`meshlab check S --backend tpu --front-end torch-xla
--layers 3 --height 256 --width 256 --text-tokens 32`, v6e-8, libtpu 0.0.52; tests/check/test_tpu_check.py compiles
them again where the [tpu] extra is installed), and the rule's edges on hand-made collectives. Pure."""

from collections import Counter

import pytest

from meshlab.check.against_tpu import predicted_bytes_per_block, tpu_options
from meshlab.check.setup import CheckOptions, check_setup
from meshlab.check.verdict import checked_prediction, predicted_per_block
from meshlab.cost.collectives import Collective, collective_matmuls, gathered_once, issued_on

from tests.conftest import REPO

DATA = REPO / "tests" / "cost" / "data" / "strategies"
SMALL = {"layers", "height", "width", "text_tokens"}

#: a middle block of XLA:TPU's program: counts and bytes per kind (collective-permutes: the program's own count,
#: held within 10%; the rest exactly)
XLA_TPU = {
    "2d": ("strategies/2d.yaml", "transformer_blocks.1",
           {"all-gather": (4, 3_538_944), "all-reduce": (4, 4_608), "collective-permute": (46, 2_718_720)}),
    "model": ("strategies/model.yaml", "transformer_blocks.1",
              {"all-gather": (4, 3_538_944), "all-reduce": (2, 2_304)}),
    "flux-2d": ("tests/cost/data/strategies/flux-2d.yaml", "single_transformer_blocks.1",
                {"all-gather": (1, 1_769_472), "all-reduce": (1, 1_152), "all-to-all": (3, 4_423_680)}),
    "2d-stock": ("tests/cost/data/strategies/2d-stock.yaml", "transformer_blocks.1",
                 {"all-gather": (4, 3_538_944), "all-reduce": (2, 2_304)}),
}


def issued_block(path: str, block: str) -> tuple[Counter, Counter]:
    options = tpu_options(REPO / path, CheckOptions(layers=3, height=256, width=256, text_tokens=32), SMALL)
    setup = check_setup(REPO / path, options)
    prediction = checked_prediction(setup)
    return predicted_per_block(setup, prediction, issued=True)[block], predicted_bytes_per_block(setup, prediction)[
        block]


@pytest.mark.parametrize("name", XLA_TPU)
def test_a_middle_block_issues_what_xla_tpu_s_program_holds(name):
    path, block, measured = XLA_TPU[name]
    counts, nbytes = issued_block(path, block)
    for kind, (count, size) in measured.items():
        if kind == "collective-permute":
            assert abs(counts[kind] - count) <= 0.1 * count and abs(nbytes[kind] - size) <= 0.1 * size, kind
        else:
            assert (counts[kind], nbytes[kind]) == (count, size), kind


def test_the_cpu_partitioner_s_collectives_stay_off_a_tpu():
    """The same plan priced on a GPU keeps every collective the partitioner makes: 2d's 6 q/k/v gathers per block."""
    from meshlab.cost.predict import predict
    from meshlab.plan.planned import plan_file

    planned = plan_file(REPO / "strategies" / "2d.yaml")
    p = predict(planned.plan, planned.strategy, planned.hardware)
    derived = [c for c in p.collectives if c.block == 0 and c.phase == "attention:in"]
    issued = [c for c in p.issued_collectives if c.block == 0 and c.phase == "attention:in"]
    assert len(derived) == 6 and len(issued) == 2
    assert issued_on(p.collectives, "gpu", 4928.0, {"data": 2, "model": 4}) == p.collectives


def gather(bytes_: int, flops: float, axes=("model",), **more) -> Collective:
    return Collective("all-gather", axes, bytes_, 0, "mlp:in", "a gather", window="gather", dot_flops=flops, **more)


def test_a_collective_matmul_starts_at_the_measured_intensity():
    """On 4 chips the threshold is 4928 x 2 / 4 = 2464 FLOP per byte of the gather: at it, n - 1 = 3 permutes of a
    quarter each, both ways round the ring; below it, the gather."""
    at, below = gather(1000, 2_464_000.0), gather(1000, 2_463_000.0)
    made = collective_matmuls((at, below), 4928.0, {"model": 4})
    assert [c.kind for c in made] == ["collective-permute"] * 3 + ["all-gather"]
    assert [c.bytes for c in made[:3]] == [250] * 3 and all(c.both_ways for c in made[:3])


def test_no_collective_matmul_across_slices_or_over_several_axes():
    """Measured on one axis inside one slice only: an axis that crosses slices (DCN) or a group of several axes
    keeps the partitioner's gather, however intense the matmul."""
    crossing = gather(1000, 1e12, axes=("data",))
    assert collective_matmuls((crossing,), 4928.0, {"data": 4}, across_slices={"data"}) == (crossing,)
    two = gather(1000, 1e12, axes=("data", "model"))
    assert collective_matmuls((two,), 4928.0, {"data": 2, "model": 4}) == (two,)
    assert collective_matmuls((crossing,), 4928.0, {"data": 4})[0].kind == "collective-permute"  # one slice


def test_readers_of_one_tensor_share_one_gather_but_another_attention_s_do_not():
    """Wan: attn1's q, k and v read one normed stream; attn2's q reads another (after the self-attention's residual
    add), so it keeps a gather of its own."""
    from meshlab.cost.predict import predict
    from meshlab.plan.planned import plan_file

    planned = plan_file(DATA / "wan-2d.yaml")
    p = predict(planned.plan, planned.strategy, planned.hardware)
    issued = [c for c in p.issued_collectives if c.block == 0 and c.kind == "all-gather" and c.phase == "attention:in"]
    whys = [c.why for c in issued]
    assert any(w.startswith("attn1.to_q") and "attn1.to_v reads the same gather" in w for w in whys), whys
    assert any(w.startswith("attn2.to_q") for w in whys) and not any("attn2.to_q reads" in w for w in whys), whys


def test_the_conditioning_is_gathered_once_unless_the_blocks_are_scanned():
    conditioning = Collective("all-gather", ("model",), 6144, 0, "img_mod.1:in", "img_mod.1: a gather", count=60,
                              role="modulation", reads="conditioning")
    assert gathered_once((conditioning,))[0].count == 1 and gathered_once((conditioning,))[0].only == "first"
    assert gathered_once((conditioning,), scanned=True)[0].count == 60


def test_a_text_made_outside_the_blocks_is_gathered_once_for_them_all():
    """Wan under 2d (wan-2d.yaml, 3 blocks, 256²): its cross-attention's k and v read the text embedding, made outside
    the blocks and split over model; XLA:TPU gathers it once, outside the blocks, where the CPU partitioner gathers
    it in each: a middle block holds 5 all-gathers moving 220,323,840 B (this model: 5 moving 220,262,400 B)."""
    counts, nbytes = issued_block("tests/cost/data/strategies/wan-2d.yaml", "blocks.1")
    assert counts["all-gather"] == 5 and abs(nbytes["all-gather"] - 220_323_840) <= 0.001 * 220_323_840


def test_sanas_gated_mlp_moves_what_xla_tpu_moves_and_its_all_reduces_agree():
    """SANA under 2d (sana-2d.yaml, model 2, 3 blocks, 256²): XLA:TPU moves its GLUMBConv's two halves in 2
    collective-permutes of 358,400 B (2800 channels x 64 tokens), as the CPU partitioner does; beside them 3 small
    permutes realign the modulation's chunks, which this model does not price (known_differences.yaml). Its 5
    all-reduces move 287,744 B."""
    counts, nbytes = issued_block("tests/cost/data/strategies/sana-2d.yaml", "transformer_blocks.1")
    assert (counts["all-reduce"], nbytes["all-reduce"]) == (5, 287_744)
    assert (counts["collective-permute"], nbytes["collective-permute"]) == (2, 2 * 358_400)


def test_a_collective_matmul_s_permute_shows_only_what_outlasts_its_slice_of_the_matmul():
    """Each of the n - 1 permutes runs beside a 1/n slice of the matmul (XLA's windowed einsum): on 2d's v6e-8 plan
    the MLP's 6 MiB shards take 71 us on one link, their 19.3 GFLOP slices 26 us at 918 TFLOP/s x 0.8, so 26 us of
    each hides; a plain gather hides nothing."""
    from meshlab.cost.predict import predict
    from meshlab.plan.planned import plan_file

    planned = plan_file(REPO / "strategies" / "2d.yaml")
    hw = planned.hardware
    step = predict(planned.plan, planned.strategy, hw).step
    windowed = [t for t in step.collectives if t.collective.beside_flops]
    assert windowed and all(t.collective.kind == "collective-permute" for t in windowed)
    for t in windowed:
        slice_s = t.collective.beside_flops / (hw.bf16_flops * hw.compute_efficiency)
        assert t.hidden == pytest.approx(min(slice_s, t.seconds + t.hidden)) and t.hidden > 0
    mlp = max(windowed, key=lambda t: t.collective.bytes)
    assert mlp.collective.bytes == 6 * 2**20 and mlp.collective.beside_flops == 4096 * 3072 * 3072 * 2 / 4
    assert mlp.seconds + mlp.hidden == pytest.approx(70.9e-6, abs=0.1e-6)  # 6 MiB over one 90 GB/s link
    assert mlp.hidden == pytest.approx(26.3e-6, abs=0.1e-6)
    hidden = sum(t.collective.count * t.hidden for t in windowed) * step.calls
    assert hidden == pytest.approx(21.3e-3, abs=0.1e-3)  # a step's, as explain says
    assert all(t.hidden == 0 for t in step.collectives if not t.collective.beside_flops)
    exposed = sum(t.collective.count * t.seconds for t in step.collectives if not t.collective.per_step)
    assert step.collective == pytest.approx(step.calls * exposed + sum(
        t.collective.count * t.seconds for t in step.collectives if t.collective.per_step))
