"""What XLA:TPU issues in place of the partitioner's collectives (meshlab.cost.collectives.issued_on), held on the CPU
against figures XLA:TPU's own ahead-of-time programs gave (`meshlab check S --backend tpu --front-end torch-xla
--layers 3 --height 256 --width 256 --text-tokens 32`, on the v6e system each strategy names, libtpu 0.0.52;
tests/check/test_tpu_check.py compiles them again where the [tpu] extra is installed), and the rule's edges on
hand-made collectives. Pure."""

import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from meshlab.check.against_tpu import (
    COLLECTIVE_TOLERANCE, TPU_VERDICT_KINDS, compiled_prediction, predicted_bytes_per_block, tpu_options,
)
from meshlab.check.setup import CheckOptions, check_setup
from meshlab.check.verdict import predicted_per_block
from meshlab.cost.collectives import Collective, collective_matmuls, gathered_once, issued_on, reduce_scatters

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
    # libtpu flags turn the collective matmuls off: the MLP's operands gathered, its sums reduce-scattered
    "2d-no-collective-matmul": ("tests/cost/data/strategies/2d-no-collective-matmul.yaml", "transformer_blocks.1",
                                {"all-gather": (6, 5_308_416), "all-reduce": (4, 4_608),
                                 "reduce-scatter": (1, 1_769_472)}),
}


def issued_block(path: str, block: str, text_tokens: int = 32, batch: int | None = None) -> tuple[Counter, Counter]:
    """meshlab's count and bytes per kind of one block of the program the TPU check compiles (torch_xla's), at the
    workload's batch or `batch` images."""
    given = SMALL | ({"batch"} if batch is not None else set())
    options = tpu_options(REPO / path, CheckOptions(layers=3, height=256, width=256, text_tokens=text_tokens,
                                                    batch=batch), given)
    setup = check_setup(REPO / path, options)
    prediction = compiled_prediction(setup, "torch-xla")
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


@pytest.mark.parametrize("flags, open_", [
    ((), {"gather", "scatter"}),
    (("--xla_tpu_enable_windowed_einsum_for_all_gather=false",), {"scatter"}),
    (("--xla_tpu_enable_windowed_einsum_for_reduce_scatter=0", "--xla_tpu_enable_async_collective_fusion=true"),
     {"gather"}),
    (("--xla_tpu_enable_windowed_einsum_for_all_gather=false", "--xla_tpu_enable_windowed_einsum_for_all_gather"),
     {"gather", "scatter"}),  # the last of a name wins, and a bare flag is true
    (("--noxla_tpu_enable_windowed_einsum_for_reduce_scatter",), {"gather"}),  # absl's --noname: off
])
def test_libtpu_flags_close_the_collective_matmuls_they_name(flags, open_):
    from meshlab.cost.collectives import windows_open

    assert windows_open(flags) == open_
    mlp_input = gather(1000, 2_464_000.0)  # at the threshold on 4 chips
    issued = collective_matmuls((mlp_input,), 4928.0, {"model": 4}, windows=windows_open(flags))
    assert {c.kind for c in issued} == ({"collective-permute"} if "gather" in open_ else {"all-gather"})


def test_an_on_off_flag_set_to_neither_is_refused():
    from pydantic import ValidationError

    from meshlab.strategy.schema import Compile

    with pytest.raises(ValidationError, match="neither: write =true or =false"):
        Compile(libtpu_flags=["--xla_tpu_enable_windowed_einsum_for_all_gather=bogus"])
    Compile(libtpu_flags=["--xla_tpu_enable_windowed_einsum_for_all_gather=False", "--xla_jf_rematerialization=2"])


def test_explain_says_which_libtpu_flags_it_priced(tmp_path):
    from typer.testing import CliRunner

    from meshlab.cli.app import app

    path = tmp_path / "flags.yaml"
    path.write_text((DATA / "2d-no-collective-matmul.yaml").read_text().replace(
        "reduce_scatter=false]", "reduce_scatter=false, --xla_tpu_enable_async_collective_fusion=true]"))
    done = CliRunner().invoke(app, ["explain", str(path)], env={"COLUMNS": "300"})
    assert done.exit_code == 0, done.output
    line = next(x for x in done.output.splitlines() if x.startswith("compile.libtpu_flags"))
    assert "no collective matmul for a matmul's gathered operand or a matmul's sum wanted split" in line
    assert line.endswith("not priced: --xla_tpu_enable_async_collective_fusion=true")
    document = json.loads(CliRunner().invoke(app, ["explain", str(path), "--json"]).stdout)  # the same, as JSON
    assert next(a for a in document["assumptions"] if a["name"] == "libtpu_flags")["source"] == line


def test_no_collective_matmul_over_two_chips():
    """Over 2 chips XLA:TPU gathers, even at 5 times the extrapolated threshold (collective_matmul_probe.py: 24576
    FLOP per byte; 2d-4x2.yaml's MLP at 6144)."""
    (made,) = collective_matmuls((gather(1000, 24_576_000.0),), 4928.0, {"model": 2})
    assert made.kind == "all-gather"


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


#: XLA:TPU's middle blocks of every TPU strategy of the matrix, count and bytes per kind, as
#: `python benchmarks/tpu_matrix.py --capture` kept them (each case's command and libtpu beside it)
CAPTURED = json.loads((REPO / "tests" / "cost" / "data" / "tpu_block_collectives.json").read_text())
#: (strategy, block, kind) -> ((XLA:TPU count, bytes), (meshlab count, bytes)) where they still differ by more than
#: COLLECTIVE_TOLERANCE, held at their figures so that a change shows (the note of issue 25 and
#: benchmarks/results/tpu_matrix_256.txt say why each differs)
TPU_DIFFERENCES: dict[tuple[str, str, str], tuple[tuple[int, int], tuple[int, int]]] = {
    # SANA with its tokens over seq (its block.input rule applied since it reaches the blocks' positional hidden
    # states; the tokens stay split: the state's all-reduce over seq and the halo permutes are there): XLA:TPU
    # issues 4 all-reduces where meshlab prices 6 (bytes within 5%), 5 all-gathers of 143,360 B (the inputs of
    # attn1.to_out, attn2.to_q, attn2.to_out and the FFN, and the residual at the block's end for the next block's
    # rule, which meshlab prices too; meshlab also gathers attn1.to_q's input, which XLA reads whole after that
    # gather), and realigns 3 of the modulation's 6 chunks (not modelled)
    ("sana-seq2-model2", "transformer_blocks.1", "all-reduce"): ((4, 304_896), (6, 291_712)),
    ("sana-seq2-model2", "transformer_blocks.1", "all-gather"): ((5, 716_800), (8, 1_003_520)),
    ("sana-seq2-model2", "transformer_blocks.1", "all-to-all"): ((4, 26_880), (7, 40_320)),
    # HunyuanVideo over seq 4 x model 2, held out (the rules were read from seq 2 x model 4, which agrees): a single
    # block issues one all-gather of 26,050,560 B (a chip's quarter of the joint sequence, two samples at 3,072
    # features) fewer than meshlab prices. Not modelled. (Under the rule planning added before, with the features
    # whole, its all-reduces carried 50,944 B against 67,840 B predicted; keeping the features on model, they agree)
    ("hunyuan-seq4-model2", "single_transformer_blocks.1", "all-gather"): ((6, 312_606_720), (7, 338_657_280)),
    # XLA:TPU's combiner merges the three blocks' modulation sums into one op of the first block (seq 8 x model 2
    # only: under seq 4 x model 4 each block keeps its own)
    ("seq8-model2", "transformer_blocks.1", "all-reduce"): ((2, 884_736), (2, 1_032_192)),
    # 2d's rules with the collective matmuls off over 8 chips: XLA:TPU all-reduces the MLP sums (384 features a chip)
    # that meshlab reduce-scatters in one op; over 4 chips both reduce-scatter (no rule found: known_differences.yaml)
    ("2d-no-collective-matmul-model8", "transformer_blocks.1", "all-reduce"): ((3, 3_543_552), (2, 4_608)),
    ("2d-no-collective-matmul-model8", "transformer_blocks.1", "reduce-scatter"): ((0, 0), (1, 3_538_944)),
}


@pytest.mark.parametrize("name", sorted(CAPTURED))
def test_a_middle_block_issues_what_xla_tpu_issued(name):
    case = CAPTURED[name]
    assert case["command"].startswith(f"meshlab check {name} --backend tpu --front-end torch-xla --layers 3")
    assert (case["options"]["layers"], case["options"]["height"], case["options"]["width"]) == (3, 256, 256)
    strategy = name.rsplit("/", 1)[-1].removesuffix(".yaml")
    for block, measured in case["blocks"].items():
        counts, nbytes = issued_block(name, block, case["options"]["text_tokens"], case["options"]["batch"])
        for kind in TPU_VERDICT_KINDS:
            xla, ours = tuple(measured.get(kind, (0, 0))), (counts[kind], nbytes[kind])
            if (strategy, block, kind) in TPU_DIFFERENCES:
                assert (xla, ours) == TPU_DIFFERENCES[strategy, block, kind], f"{block} {kind}: the difference moved"
                continue
            for what, x, d in (("count", xla[0], ours[0]), ("bytes", xla[1], ours[1])):
                assert abs(d - x) <= COLLECTIVE_TOLERANCE * x, f"{block} {kind} {what}: XLA:TPU {x}, meshlab {d}"


def test_every_documented_tpu_difference_is_a_captured_block_and_a_held_kind():
    blocks = {(name.rsplit("/", 1)[-1].removesuffix(".yaml"), block) for name, case in CAPTURED.items()
              for block in case["blocks"]}
    assert {(strategy, block) for strategy, block, _ in TPU_DIFFERENCES} <= blocks
    assert {kind for _, _, kind in TPU_DIFFERENCES} <= set(TPU_VERDICT_KINDS)


def test_every_tpu_difference_is_a_known_difference_held_against_xla_tpu():
    """What explain lists as held against XLA:TPU (known_differences.yaml, truth xla-tpu) names every plan and kind
    that still differs here, and the captured case it was read from."""
    import yaml

    from meshlab.cost.collectives import known_differences

    entries = [e for e in yaml.safe_load((REPO / "meshlab" / "data" / "known_differences.yaml").read_text())
               if e.get("truth") == "xla-tpu"]
    assert [e["difference"] for e in entries] == list(known_differences(truth="xla-tpu"))
    for strategy, block, kind in TPU_DIFFERENCES:
        citing = [e for e in entries if f"{strategy}.yaml" in e["difference"] and kind in e["difference"]]
        assert any(f"tests/cost/data/strategies/{strategy}.yaml" in e["cases"] for e in citing), (strategy, kind)
    assert {case for e in entries for case in e["cases"]} <= set(CAPTURED)


def scatter(rows: int, features: int) -> Collective:
    return Collective("all-reduce", ("model",), rows * features * 2, 0, "mlp:out", "a sum", window="scatter",
                      dot_flops=1.0, rows=rows, features=features)


@pytest.mark.parametrize("rows, features, n, kind", [
    (256, 2432, 2, "reduce-scatter"),  # SD3.5's image stream: 1216 features a chip, rows whole tiles
    (120, 2432, 2, "all-reduce"), (128, 2432, 2, "reduce-scatter"),  # its text stream at 120 and 128 tokens
    (1216, 2432, 2, "reduce-scatter"), (1208, 2432, 2, "all-reduce"),  # 5.0% and 5.6% of the padded rows
    (32, 2048, 4, "reduce-scatter"),  # FLUX.2's text: 512 features a chip are whole 128-lane tiles
    (1344, 2048, 4, "reduce-scatter"),  # LTX-Video's MLP
])
def test_a_sum_wanted_split_reduce_scatters_where_xla_tpu_tiles_its_shares(rows, features, n, kind):
    """A sum no collective matmul takes (here: too few FLOPs) is a reduce-scatter where each chip's share is whole
    tiles (measured points: meshlab.cost.collectives._scatters), else an all-reduce; it moves the same bytes."""
    (windowed,) = collective_matmuls((scatter(rows, features),), 4928.0, {"model": n})
    (issued,) = reduce_scatters((windowed,), {"model": n})
    assert issued.kind == kind and issued.bytes == rows * features * 2
    # over an axis that crosses slices, or over several axes, it stays an all-reduce (not measured)
    (across,) = reduce_scatters((windowed,), {"model": n}, {"model"})
    (several,) = reduce_scatters((replace(windowed, axes=("data", "model")),), {"data": 2, "model": n})
    assert across.kind == several.kind == "all-reduce"


def test_the_reduce_scatters_of_one_phase_combine_into_one():
    """flux2-2d.yaml: the image and text MLP sums of a block are one reduce-scatter of both."""
    image, text = scatter(256, 2048), scatter(32, 2048)
    issued = [c for c in issued_on((image, text), "tpu", 4928.0, {"model": 4}) if c.kind == "reduce-scatter"]
    assert len(issued) == 1 and issued[0].bytes == (256 + 32) * 2048 * 2 and issued[0].operands == 2


def test_math_attention_with_two_samples_a_chip_gathers_every_head():
    """cfg2-model4.yaml (pairs rules, 2 samples a chip): XLA:TPU gathers q, k and v of the joint sequence over model,
    3.5 MB each, and every chip computes every head; pairs.yaml (1 sample a chip) gathers none. A flash kernel
    gathers none either."""
    from meshlab.cost.predict import predict

    counts, nbytes = issued_block("tests/cost/data/strategies/cfg2-model4.yaml", "transformer_blocks.1")
    assert (counts["all-gather"], nbytes["all-gather"]) == (3, 3 * 2 * 24 * 288 * 128 * 2)
    assert issued_block("strategies/pairs.yaml", "transformer_blocks.1")[0]["all-gather"] == 0
    path = REPO / "tests" / "cost" / "data" / "strategies" / "cfg2-model4.yaml"
    setup = check_setup(path, tpu_options(path, CheckOptions(layers=3, height=256, width=256, text_tokens=32), SMALL))
    flash = predict(setup.plan, setup.strategy, setup.planned.hardware)  # the strategy's own: flash
    stock = compiled_prediction(setup, "torch-xla")
    assert not [c for c in flash.collectives if c.phase == "attention:heads"]
    heads = {w.shape[1] for w in stock.work if w.kind == "attention"}, {w.shape[1] for w in flash.work
                                                                          if w.kind == "attention"}
    assert heads == ({24}, {6})  # every head on every chip under the math attention; 24 / model 4 with flash
    from meshlab.cost.compiled_call import strategy_as_compiled
    from meshlab.cost.predict import plan_work

    eager = plan_work(setup.plan, strategy_as_compiled(setup.strategy, "torch-xla"))  # not XLA's program: a GPU's
    assert not [c for c in eager.collectives if c.phase == "attention:heads"]


def test_a_modulation_from_outside_the_blocks_is_realigned_chunk_by_chunk():
    """A block adds its split table to a conditioning split on its chunks x width rows: XLA:TPU moves each of the 6
    chunks by one all-to-all of g / n of a chunk a sample (g = gcd(6, n)), in the dtype the block adds in (Wan's
    float32, read from the card's trace); where n divides 6 (SANA over model 2) the table moves by one all-to-all
    of its share in place of its gather. The CPU partitioner issues none of them (`meshlab check --backend xla`)."""
    from meshlab.models.card import load_card
    from meshlab.plan.planned import plan_file
    from meshlab.cost.predict import predict

    wan = {f.module: f for f in load_card("wan-2.1-t2v-14b").dataflow}["condition_embedder.time_proj"]
    assert {m.dtype for m in wan.modulates} == {"float32"}
    counts, nbytes = issued_block("tests/cost/data/strategies/wan-2d.yaml", "blocks.1")
    assert (counts["all-to-all"], nbytes["all-to-all"]) == (6, 6 * 1 * 5120 * 2 // 4 * 4)  # a sample a chip
    counts, nbytes = issued_block("tests/cost/data/strategies/ltx-model8.yaml", "transformer_blocks.1", batch=2)
    assert (counts["all-to-all"], nbytes["all-to-all"]) == (6, 6 * 2 * 2048 * 2 // 8 * 2)  # two samples, bf16
    counts, nbytes = issued_block("tests/cost/data/strategies/sana-2d.yaml", "transformer_blocks.1")
    table = 6 * 2240 * 2 // 2
    assert (counts["all-to-all"], nbytes["all-to-all"]) == (7, 6 * 2240 * 2 + table)
    planned = plan_file(REPO / "tests" / "cost" / "data" / "strategies" / "sana-2d.yaml")
    on_cpu = [c for c in predict(planned.plan, planned.strategy, planned.hardware.at_dtype("bfloat16")).collectives
              if c.phase == "parameters" and c.block is not None]
    assert on_cpu and all(c.kind == "all-gather" and c.realigned for c in on_cpu)


def test_sana_s_linear_attention_gathers_its_heads_whatever_the_flash_setting(tmp_path):
    """No flash kernel runs a linear attention: with two samples a chip its matmuls gather q, k and the padded v over
    the heads' axis as XLA:TPU's program did (sana-data2-model2.yaml), in the plan try prices (flash on) too, with
    its FLOPs for every head; the softmax cross-attention's flash kernel gathers nothing."""
    from meshlab.cost.predict import predict
    from meshlab.plan.planned import plan_file

    planned = plan_file(DATA / "sana-data2-model2.yaml")
    assert planned.strategy.workload.flash_attention
    p = predict(planned.plan, planned.strategy, planned.hardware)
    gathered = [c for c in p.collectives if c.phase == "attention:heads" and c.block == 0]
    assert {c.why.split(":")[0] for c in gathered} == {"attn1"} and len(gathered) == 3
    assert sorted(c.bytes for c in gathered)[-1] > sorted(c.bytes for c in gathered)[0]  # v: a row a head wider
    linear = [w for w in p.work if w.kind == "linear-attention" and w.block == 0]
    assert linear and all(w.shape[1] == 70 for w in linear)  # every head on every chip
    one = plan_file(DATA / "sana-2d.yaml")  # one sample a chip: none
    assert not [c for c in predict(one.plan, one.strategy, one.hardware).collectives if c.phase == "attention:heads"]


def test_a_table_split_on_its_chunks_is_not_realigned(tmp_path):
    """The realignment was read for a table split on its width; a table split on its chunks (sana-2d's rules plus
    one that splits scale_shift_table's rows) prices its gather and no all-to-all (not measured)."""
    text = (DATA / "sana-2d.yaml").read_text()
    assert "rules:\n" in text
    path = tmp_path / "sana-rows.yaml"
    path.write_text(text.replace("rules:\n", "rules:\n  - match: 'transformer_blocks.*.scale_shift_table'\n"
                                             "    shard: [model, null]\n", 1))
    from meshlab.plan.planned import plan_file

    table = next(p for p in plan_file(path).plan.parameters if p.name == "transformer_blocks.0.scale_shift_table")
    assert table.spec.entries == (("model",), None)
    counts, nbytes = issued_block(str(path), "transformer_blocks.1")
    assert counts["all-to-all"] == 0
    assert issued_block("tests/cost/data/strategies/sana-2d.yaml", "transformer_blocks.1")[0]["all-to-all"] == 7


def _issued(path) -> tuple:
    """What the plan's hardware issues of its predicted collectives."""
    from meshlab.cost.predict import predict
    from meshlab.plan.planned import plan_file

    planned = plan_file(path)
    return predict(planned.plan, planned.strategy, planned.hardware).issued_collectives


def _stream_joins(path) -> list:
    return [c for c in _issued(path) if c.phase.startswith("streams:")]


def _flux_seq2_model4_with(tmp_path, anchor: str, added: str):
    text = (DATA / "flux-seq2-model4.yaml").read_text()
    assert text.count(anchor) == 1
    path = tmp_path / "flux.yaml"
    path.write_text(text.replace(anchor, anchor + added))
    return path


def test_flux_s_single_blocks_join_once_unless_a_rule_constrains_their_inputs(tmp_path):
    """XLA:TPU folds one single block's cut of the streams and the next one's join (flux-seq2-model4.yaml: the join's
    3 all-to-alls in the list's first block only, its cut's permute in the last), where a rule between them keeps
    both in every block, as the CPU partitioner issues them (a block.input rule on the image stream, the kind
    planning adds for HunyuanVideo, whose single blocks XLA:TPU joined in every block)."""
    folded = _stream_joins(DATA / "flux-seq2-model4.yaml")
    assert sorted((c.kind, c.only, c.count) for c in folded) == [("all-to-all", "first", 1)] * 3 + [
        ("collective-permute", "last", 1)] * 2
    path = _flux_seq2_model4_with(tmp_path, "activations:\n", "  rules:\n    - point: block.input\n"
                                                                "      stream: image\n      spec: [null, seq, null]\n")
    kept = _stream_joins(path)
    assert {(c.only, c.count) for c in kept} == {("", 38)} and len(kept) == 5
    assert issued_block(str(path), "single_transformer_blocks.1")[0]["all-to-all"] == 6
    assert issued_block("tests/cost/data/strategies/flux-seq2-model4.yaml", "single_transformer_blocks.1")[0][
        "all-to-all"] == 3


def test_single_blocks_kept_apart_still_join_once_a_call_and_a_scanned_list_joins_in_every_block(tmp_path):
    """A list one of whose blocks plans apart from the rest (a rule of its own) keeps two blocks in the graph: the
    join stays on the list's first block and the cut on the kept block that stands for its last, once each. A
    scanned list runs one loop body, which cannot fold one iteration's cut into the next one's join: priced in
    every block (not measured)."""
    for single, join_block, cut_block in ((0, 19, 20), (5, 19, 19)):  # Flux: 19 double blocks, then 38 single
        apart = _flux_seq2_model4_with(tmp_path, "rules:\n", f"  - match: 'single_transformer_blocks.{single}.*'\n"
                                                              "    shard: replicate\n")
        joins = _stream_joins(apart)
        assert sorted((c.kind, c.only, c.count) for c in joins) == [("all-to-all", "first", 1)] * 3 + [
            ("collective-permute", "last", 1)] * 2
        assert {c.block for c in joins if c.only == "first"} == {join_block}
        assert {c.block for c in joins if c.only == "last"} == {cut_block}  # block 19 stands for 19-23 and 25-56
    text = (DATA / "flux-seq2-model4.yaml").read_text()
    assert "\ncompile:" not in text
    (tmp_path / "scan.yaml").write_text(text + "compile:\n  scan_blocks: true\n")
    assert {(c.only, c.count) for c in _stream_joins(tmp_path / "scan.yaml")} == {("", 38)}


def test_q_and_k_are_read_by_their_place_among_each_stream_s_projections():
    """An attention lists q, k and v of each stream in turn: a role counts where every stream's Linear of it
    qualifies (only k: k alone; one stream's q and k: neither), and one Linear making q, k and v counts for none."""
    from types import SimpleNamespace

    from meshlab.cost.collectives import _Deriver

    names = ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj")
    attention = SimpleNamespace(qkv=names, fused_width=0)
    ops = [SimpleNamespace(module=m) for m in names]

    def picked(*marked: str, on=attention) -> tuple:
        return _Deriver._rotated(on, ops, lambda op: op.module in marked)

    assert picked("to_q", "to_k", "add_q_proj", "add_k_proj") == ("q", "k")
    assert picked("to_k", "add_k_proj") == ("k",)
    assert picked("to_q", "to_k") == ()
    assert picked(*names, on=SimpleNamespace(qkv=names, fused_width=128)) == ()


def test_a_gpu_tool_joins_on_the_chip_what_xla_moves_for_a_partial_rotary(tmp_path):
    """HunyuanVideo's single blocks cut q and k for the rotary on the image tokens and join them again: all-to-alls
    under the partitioner (hunyuan-seq2-model4.yaml), none where xDiT runs the sequence split on each GPU."""
    def rotary(path) -> int:
        return sum(1 for c in _issued(path) if c.phase == "attention:rotary")

    assert rotary(DATA / "hunyuan-seq2-model4.yaml") == 6
    text = (DATA / "hunyuan-seq2-model4.yaml").read_text()
    for old, new in (("hardware: v6e-8", "hardware: h100"), ("  sequence: seq\n", "  sequence: seq\n"
                                                                 "  sequence_parallel: xdit\n")):
        assert text.count(old) == 1
        text = text.replace(old, new)
    (tmp_path / "xdit.yaml").write_text(text)
    assert rotary(tmp_path / "xdit.yaml") == 0


def test_ltx_video_s_rms_norms_sum_one_statistic_a_row():
    """ltx-2d.yaml on XLA:TPU (v6e-8, 256², 1344 rows): each RMSNorm all-reduces one float32 a row (5,376 B), the
    q and k norms of each attention share one op; 6 all-gathers (5 inputs, the table) and the MLP's reduce-scatter."""
    counts, nbytes = issued_block("tests/cost/data/strategies/ltx-2d.yaml", "transformer_blocks.1")
    assert (counts["all-reduce"], nbytes["all-reduce"]) == (4, 2 * 1344 * 4 + 2 * 1344 * 4 + (1344 + 32) * 4)
    assert (counts["all-gather"], nbytes["all-gather"]) == (6, 5 * 1344 * 2048 * 2 + 6 * 2048 * 2)
    assert (counts["reduce-scatter"], nbytes["reduce-scatter"]) == (1, 1344 * 2048 * 2)


def test_the_tpu_check_compiles_the_workload_s_batch_unless_told_another():
    """`meshlab check --backend tpu --batch 4` compiles 4 images a call (2d-4x2.yaml's workload has 2, which do not
    split over data 4); without --batch, the workload's."""
    path = DATA / "2d-4x2.yaml"
    assert tpu_options(path, CheckOptions(batch=4), {"batch"}).batch == 4
    assert tpu_options(path, CheckOptions(batch=4), set()).batch == 2


#: XLA:TPU's programs of the heads gathered under a sequence split at full image size (`meshlab check S --backend tpu
#: --front-end torch-xla --layers 3 --height 1024 --width 1024 --text-tokens 32 --json`, v6e, libtpu 0.0.52): the
#: middle block's (count, bytes) per kind, the temporaries in use at once, and the cost analysis's FLOPs per chip
AT_1024 = {
    # the values' products summed over model (2 divides 4)
    "seq2-model4": ({"all-gather": (4, 126_812_160), "all-reduce": (3, 101_597_184), "all-to-all": (9, 38_043_648)},
                    3_401_086_656, 1_111_847_337_984.0),
    # the values gathered over seq (2 does not divide 4)
    "seq4-model2": ({"all-gather": (5, 139_493_376), "all-reduce": (2, 25_509_888), "all-to-all": (9, 38_043_648)},
                    1_688_322_112, 1_023_898_943_488.0),
}


@pytest.mark.parametrize("name", sorted(AT_1024))
def test_heads_gathered_under_a_sequence_split_at_1024_as_xla_tpu_compiled_it(name):
    """At 4,128 tokens two samples a chip: the collectives agree exactly, the FLOPs within 2% and the temporaries within
    25% of those XLA:TPU holds live at once (meshlab.plan.axes.values_summed; 3.48 GB and 1.81 GB predicted)."""
    from meshlab.check.verdict import predicted_flops
    from meshlab.cost.compiled_call import strategy_as_compiled
    from meshlab.plan.memory import memory_on

    collectives, temporaries, flops = AT_1024[name]
    path = REPO / "tests" / "cost" / "data" / "strategies" / f"{name}.yaml"
    setup = check_setup(path, tpu_options(path, CheckOptions(layers=3, height=1024, width=1024, text_tokens=32),
                                          SMALL))
    prediction = compiled_prediction(setup, "torch-xla")
    counts = predicted_per_block(setup, prediction, issued=True)["transformer_blocks.1"]
    nbytes = predicted_bytes_per_block(setup, prediction)["transformer_blocks.1"]
    assert {kind: (counts[kind], nbytes[kind]) for kind in collectives} == collectives
    assert predicted_flops(setup, prediction) == pytest.approx(flops, rel=0.02)
    held = memory_on(setup.plan, strategy_as_compiled(setup.strategy, "torch-xla"),
                     setup.planned.hardware).most_loaded.denoise
    assert held == pytest.approx(temporaries, rel=0.25)


def test_which_plans_gather_the_heads_and_how_the_values_meet():
    from meshlab.plan.axes import heads_gathered, values_summed

    assert heads_gathered(False, 2, True, sequence_split=True)  # seq2-model4
    assert not heads_gathered(False, 2, True, sequence_split=True, kernel_marked=True)  # an attention.qkv rule
    assert not heads_gathered(False, 2, True, sequence_split=True, linear=True)  # SANA under seq: not measured
    assert heads_gathered(True, 2, True, sequence_split=False, linear=True)  # SANA without: no flash kernel runs it
    assert not heads_gathered(True, 2, True, sequence_split=True)  # a flash kernel keeps the heads split
    assert not heads_gathered(False, 1, True, sequence_split=True)  # one sample a chip
    assert not heads_gathered(False, 2, False, sequence_split=False)  # DTensor on a GPU
    assert [values_summed(m, s) for m, s in ((4, 2), (2, 2), (4, 4), (2, 4), (2, 8))] == [True] * 3 + [False] * 2


def test_the_matrix_results_say_what_the_documented_differences_hold():
    """benchmarks/results/tpu_matrix_256.txt (the note's figures) and TPU_DIFFERENCES agree: every difference a row
    reports is held here at the same figures, and a row that agrees holds none."""
    reported = {}
    for line in (REPO / "benchmarks" / "results" / "tpu_matrix_256.txt").read_text().splitlines():
        path, _, verdict = line.partition(": ")
        if verdict.startswith("not compiled"):
            continue
        strategy = path.rsplit("/", 1)[-1].removesuffix(".yaml")
        reported[strategy] = set() if verdict == "agrees" else set(verdict.split("; "))
    held = {}
    for (strategy, block, kind), ((x_count, x_bytes), (count, nbytes)) in TPU_DIFFERENCES.items():
        for what, x, ours in (("count", x_count, count), ("bytes", x_bytes, nbytes)):
            if abs(ours - x) > COLLECTIVE_TOLERANCE * x:
                held.setdefault(strategy, set()).add(f"{block}: {kind} {what} predicted {ours}, XLA:TPU {x}")
    assert {s: r for s, r in reported.items() if r} == held


def _with_flags(tmp_path, source: str, flags: list[str], hardware: str | None = None):
    from meshlab.plan.planned import plan_file

    data = yaml.safe_load((REPO / source).read_text())
    data.setdefault("compile", {})["libtpu_flags"] = flags
    if hardware:
        data["hardware"] = hardware
    path = tmp_path / f"flags-{len(list(tmp_path.iterdir()))}.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return plan_file(path)


def test_async_all_to_alls_show_what_xla_tpu_s_schedule_leaves_of_them(tmp_path):
    """--xla_tpu_enable_async_all_to_all=true on v6e: each all-to-all shows the share of its time XLA:TPU's schedule
    of hybrid.yaml leaves exposed (the catalog's async_all_to_all_hidden, benchmarks/tpu_async_overlap.py), every
    other collective as it was; turned off again by a later flag, nothing is hidden."""
    from meshlab.cost.collectives import libtpu_flags_line
    from meshlab.cost.predict import predict

    flag = "--xla_tpu_enable_async_all_to_all=true"
    runs = {name: _with_flags(tmp_path, "strategies/hybrid.yaml", flags) for name, flags in
            (("sync", []), ("async", [flag]), ("off again", [flag, "--xla_tpu_enable_async_all_to_all=false"]))}
    steps = {name: predict(p.plan, p.strategy, p.hardware).step for name, p in runs.items()}
    share = runs["async"].hardware.async_all_to_all_hidden
    assert 0 < share < 1
    pairs = list(zip(steps["sync"].collectives, steps["async"].collectives, strict=True))
    assert sum(t.collective.kind == "all-to-all" for t, _ in pairs) >= 7  # a block's Ulysses all-to-alls
    for sync, asynchronous in pairs:
        if sync.collective.kind == "all-to-all":
            assert asynchronous.seconds == pytest.approx((1 - share) * sync.seconds) and sync.seconds > 0
            assert asynchronous.hidden == pytest.approx(share * sync.seconds) and asynchronous.hidden_by == "async"
        else:
            assert asynchronous == sync
    hidden = sum(t.collective.count * t.hidden * (1 if t.collective.per_step else steps["async"].calls)
                 for _, t in pairs)
    assert steps["sync"].collective - steps["async"].collective == pytest.approx(hidden) and hidden > 0
    assert steps["off again"].collective == steps["sync"].collective
    assert "all-to-alls run async" in libtpu_flags_line([flag], share)
    assert "not priced" not in libtpu_flags_line([flag], share)


def test_each_async_share_in_the_catalog_is_its_benchmark_record_s():
    """Every TPU chip's async share (async_all_to_all_hidden, async_weight_gather_hidden) names the record
    benchmarks/tpu_async_overlap.py wrote, and is that record's share to 3 places: v6e's, v5p's and v4's all-to-alls,
    v5e's weight gathers; the records of the programs without a schedule to read (FSDP's gathers on v5p and v4,
    synchronous with libtpu's defaults) hold no share."""
    import re

    from meshlab.core.hardware import catalog

    systems = catalog()
    shares = set()
    for hw in systems.values():
        chip = hw.chip.split()[1]  # "TPU v6e (Trillium)": v6e
        for figure in ("async_all_to_all_hidden", "async_weight_gather_hidden"):
            value = getattr(hw, figure)
            if value is None:
                continue
            record = re.search(r"benchmarks/results/(tpu_async_overlap\w*\.json)", hw.sources[figure]).group(1)
            document = json.loads((REPO / "benchmarks" / "results" / record).read_text())
            assert document["kind"] == ("all-to-all" if figure == "async_all_to_all_hidden" else "all-gather")
            assert round(document["hidden"], 3) == value, (hw.name, figure)
            compiled = re.search(r"--hardware (\S+)", document["command"])  # else the strategy's own (v6e-8)
            assert systems[compiled.group(1) if compiled else "v6e-8"].chip == hw.chip, (hw.name, record)
            shares.add((chip, figure))
    assert {chip for chip, figure in shares if figure == "async_all_to_all_hidden"} == {"v6e", "v5p", "v4"}
    assert {chip for chip, figure in shares if figure == "async_weight_gather_hidden"} == {"v5e"}
    for chip in ("v5p", "v4"):
        document = json.loads((REPO / "benchmarks" / "results" / f"tpu_async_overlap_{chip}_fsdp.json").read_text())
        assert document["hidden"] is None and f"--hardware {chip}-8" in document["command"]
        assert all(p["async_per_block"] == 0 and p["schedule"] is None for p in document["programs"].values())


def test_async_all_to_alls_stay_unpriced_where_the_chip_s_share_was_not_measured(tmp_path):
    """v5e's catalog entry has no async_all_to_all_hidden: its all-to-alls are priced synchronous under the flag,
    and explain names the flag as not priced."""
    from meshlab.cost.collectives import libtpu_flags_line
    from meshlab.cost.predict import predict

    flag = "--xla_tpu_enable_async_all_to_all=true"
    sync, flagged = (_with_flags(tmp_path, "strategies/hybrid.yaml", flags, "v5e-8") for flags in ([], [flag]))
    assert flagged.hardware.async_all_to_all_hidden is None
    one, other = (predict(p.plan, p.strategy, p.hardware).step for p in (sync, flagged))
    assert other.collective == one.collective and not any(t.hidden_by == "async" for t in other.collectives)
    assert libtpu_flags_line([flag], None).endswith(f"not priced: {flag}")


def test_fsdp_s_weight_gathers_hide_where_the_chip_runs_them_async_by_default(tmp_path):
    """v5e runs 6 of fsdp.yaml's 8 weight gathers a block async with libtpu's defaults (v6e none): each weight
    all-gather shows the share its schedule leaves exposed (the catalog's async_weight_gather_hidden), every other
    collective as it was; --xla_enable_async_all_gather=false makes them synchronous, and explain says so."""
    from meshlab.cost.collectives import libtpu_flags_line
    from meshlab.cost.predict import predict
    from meshlab.cost.timing import async_class
    from meshlab.plan.planned import plan_file

    outside = Collective("all-gather", ("data",), 1024, None, "txt_in.weight:weights", "before the blocks")
    assert async_class(outside) == "" and async_class(replace(outside, block=3)) == "weight all-gather"
    off = "--xla_enable_async_all_gather=false"
    runs = {name: _with_flags(tmp_path, "strategies/fsdp.yaml", flags, system) for name, flags, system in
            (("v5e", [], "v5e-8"), ("v5e off", [off], "v5e-8"), ("v6e", [], None))}
    data = yaml.safe_load((REPO / "strategies" / "fsdp.yaml").read_text())
    data["hardware"], data["compile"] = "v5e-8", {"scan_blocks": True}
    (tmp_path / "scan.yaml").write_text(yaml.safe_dump(data))
    scanned = plan_file(tmp_path / "scan.yaml")  # a loop's next gathers: not measured, so not priced
    steps = {name: predict(p.plan, p.strategy, p.hardware).step for name, p in runs.items()}
    share = runs["v5e"].hardware.async_weight_gather_hidden
    assert 0 < share < 1 and runs["v6e"].hardware.async_weight_gather_hidden is None
    weights = 0
    for sync, asynchronous in zip(steps["v5e off"].collectives, steps["v5e"].collectives, strict=True):
        if sync.collective.kind == "all-gather" and sync.collective.phase.endswith(":weights"):
            weights += 1
            assert asynchronous.seconds == pytest.approx((1 - share) * sync.seconds) and sync.seconds > 0
            assert asynchronous.hidden_by == "async" and sync.hidden_by == ""
        else:
            assert asynchronous == sync
    assert weights and steps["v5e"].collective < steps["v5e off"].collective
    assert not any(t.hidden_by == "async" for t in steps["v6e"].collectives)
    assert not any(t.hidden_by == "async" for t in predict(scanned.plan, scanned.strategy,
                                                           scanned.hardware).step.collectives)
    line = libtpu_flags_line([off], None, share, "by-default")
    assert "weight gathers run synchronously" in line and "not priced" not in line


def test_v4_runs_fsdp_s_weight_gathers_async_with_the_flag_and_is_priced_holding_two_blocks(tmp_path):
    """--xla_enable_async_all_gather=true on v4 (the catalog's async_weight_gathers: with-flag): XLA:TPU runs the
    weight gathers async and issues them early (3 blocks at 256²: 1.69 blocks' gathered weights at once in HBM and
    CMEM, 1.08 GB of temporaries in HBM against 0.57 GB without the flag: tpu_check_fsdp-v4-async_256.json), so
    the plan is priced holding two blocks gathered; the time its schedule hides is not measured there, so the step is
    priced as without the flag, and explain says so. v5p and v6e keep them synchronous with the flag (one block), and
    v5e runs them async by default."""
    from meshlab.cost.collectives import libtpu_flags_line
    from meshlab.cost.predict import predict
    from meshlab.plan.memory import gathered_blocks_on

    from meshlab.plan.planned import plan_file

    def fsdp(name, flags, system):
        data = yaml.safe_load((REPO / "strategies" / "fsdp.yaml").read_text())
        data["hardware"], data["compile"] = system, {"libtpu_flags": flags}
        if system in ("v4-8", "v5p-8"):  # 4 chips: fsdp.yaml over data 4, one sample a chip
            data["mesh"], data["workload"]["batch"] = {"data": 4}, 4
        (tmp_path / f"{name}.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
        return plan_file(tmp_path / f"{name}.yaml")

    on = "--xla_enable_async_all_gather=true"
    runs = {name: fsdp(name.replace(" ", "-"), flags, system) for name, flags, system in
            (("v4", [], "v4-8"), ("v4 on", [on], "v4-8"), ("v4 off again", [on, on.replace("true", "false")], "v4-8"),
             ("v5p on", [on], "v5p-8"), ("v6e on", [on], "v6e-8"), ("v5e", [], "v5e-8"))}
    blocks = {name: gathered_blocks_on(p.strategy, p.hardware) for name, p in runs.items()}
    assert blocks == {"v4": 1, "v4 on": 2, "v4 off again": 1, "v5p on": 1, "v6e on": 1, "v5e": 2}
    gathered = {name: p.memory.most_loaded.gathered_weights for name, p in runs.items()}
    assert gathered["v4 on"] == 2 * gathered["v4"] > 0
    steps = {name: predict(p.plan, p.strategy, p.hardware).step for name, p in runs.items()}
    assert steps["v4 on"].collective == steps["v4"].collective
    assert not any(t.hidden_by == "async" for t in steps["v4 on"].collectives)
    hw = runs["v4 on"].hardware
    line = libtpu_flags_line([on], hw.async_all_to_all_hidden, hw.async_weight_gather_hidden, hw.async_weight_gathers)
    assert "weight gathers run async" in line and "not measured" in line and "not priced" not in line
    assert f"not priced: {on}" in libtpu_flags_line([on], None, None, runs["v5p on"].hardware.async_weight_gathers)
    # =auto, the chip's default, undoes an earlier =true (absl: the last setting wins)
    auto = fsdp("v4-auto", [on, on.replace("true", "auto")], "v4-8")
    assert gathered_blocks_on(auto.strategy, auto.hardware) == 1


def test_a_weight_gather_share_needs_the_chip_to_run_them_async():
    from meshlab.core.errors import InputError
    from meshlab.core.hardware import catalog, load_hardware

    modes = {hw.chip.split()[1]: hw.async_weight_gathers for hw in catalog().values() if hw.kind == "tpu"}
    assert modes == {"v6e": "", "v5e": "by-default", "v5p": "", "v4": "with-flag"}
    # each mode is its records': async with libtpu's defaults on v5e only, and with the flag on v4 (fsdp.yaml, full
    # depth; v6e's gathers: benchmarks/results/tpu_aot.txt and tpu_async_flags.txt)
    def programs(record):
        document = json.loads((REPO / "benchmarks" / "results" / record).read_text())
        return {name: p["async_per_block"] for name, p in document["programs"].items()}

    assert programs("tpu_async_overlap_v5e.json")["libtpu's defaults"] > 0
    assert programs("tpu_async_overlap_v5p_fsdp.json")["libtpu's defaults"] == 0
    assert programs("tpu_async_overlap_v4_fsdp_flag.json") == {"libtpu's defaults": 0,
                                                                "--xla_enable_async_all_gather=true": 14}
    flagged = (REPO / "benchmarks" / "results" / "tpu_async_flags_v5p_v4.txt").read_text()
    assert "v5p-8, MaxText's set: 14 all-gathers a middle block, 0 async" in flagged
    with pytest.raises(InputError, match="give async_weight_gathers by-default or with-flag, or "
                                         "async_weight_gather_hidden none as well"):
        load_hardware("v6e-8", {"async_weight_gather_hidden": 0.5})
    with pytest.raises(InputError, match="async_weight_gather_hidden none as well"):
        load_hardware("v5e-8", {"async_weight_gathers": "none"})
    assert load_hardware("v5e-8", {"async_weight_gathers": "none", "async_weight_gather_hidden": "none"})
    with pytest.raises(InputError, match="is not one of"):
        load_hardware("v6e-8", {"async_weight_gathers": "sometimes"})
    assert load_hardware("v6e-8", {"async_weight_gathers": "with-flag"}).async_weight_gathers == "with-flag"


SCATTER_COMBINE = json.loads((REPO / "benchmarks" / "results" / "tpu_scatter_combine.json").read_text())


@pytest.mark.parametrize("case", SCATTER_COMBINE["cases"], ids=lambda c: "{hardware} {ways} ways {height} {text_tokens}"
                         .format(**c).replace("TPU ", ""))
def test_a_block_s_reduce_scatters_combine_as_xla_tpu_combined_them(case):
    """Each case benchmarks/tpu_scatter_combine.py compiled (2d's MLP sums of a middle block, reduce-scattered over 2
    or 4 chips on v6e, v5e, v5p and v4, at sizes around each chip's boundary): meshlab issues as many reduce-scatters
    as XLA:TPU's program held, moving the same bytes together (within the verdict's 10%: at 1024² XLA:TPU pads the
    image sum's shares from 1,536 to 1,560 features, 1.5% more)."""
    options = tpu_options(REPO / case["strategy"], CheckOptions(
        layers=3, height=case["height"], width=case["width"], text_tokens=case["text_tokens"]), SMALL)
    setup = check_setup(REPO / case["strategy"], options)
    prediction = compiled_prediction(setup, "torch-xla")
    block = SCATTER_COMBINE["block"]
    counts = predicted_per_block(setup, prediction, issued=True)[block]
    nbytes = predicted_bytes_per_block(setup, prediction)[block]
    assert counts["reduce-scatter"] == case["reduce_scatters"]
    assert abs(nbytes["reduce-scatter"] - case["bytes"]) <= COLLECTIVE_TOLERANCE * case["bytes"]


def test_each_chip_s_scatter_combine_limit_is_its_record_s_largest_combined_total():
    """The catalog's reduce_scatter_combine_bytes, per chip and group size, is the most bytes the record saw
    combined (0 where it saw none), below the least it saw apart; the source names the record."""
    from meshlab.core.hardware import catalog

    seen: dict[tuple[str, int], tuple[int, float]] = {}
    for case in SCATTER_COMBINE["cases"]:
        key = (case["hardware"].split()[1].split(":")[0], case["ways"])  # "TPU v6e:2x2": v6e
        combined, apart = seen.get(key, (0, float("inf")))
        if case["reduce_scatters"] == 1:
            combined = max(combined, case["bytes"])
        else:
            apart = min(apart, case["bytes"])
        seen[key] = (combined, apart)
    limits = {}
    for hw in catalog().values():
        if hw.kind == "tpu":
            chip = hw.chip.split()[1]
            assert hw.reduce_scatter_combine_bytes, hw.name
            assert "tpu_scatter_combine.json" in hw.sources["reduce_scatter_combine_bytes"], hw.name
            limits |= {(chip, ways): limit for ways, limit in hw.reduce_scatter_combine_bytes}
    assert set(limits) == set(seen)
    for key, (combined, apart) in seen.items():
        assert limits[key] == combined < apart, key


def test_a_phase_s_reduce_scatters_combine_in_order_up_to_the_limit_of_their_group_size():
    """Each joins the op before it while together they stay within the limit; a limit of 0 keeps every one apart;
    a group size not listed takes the nearest listed one's, a tie going to the smaller group; none: all in one."""
    from meshlab.core.hardware import combine_limit
    from meshlab.cost.collectives import combine_scatters

    image, text = scatter(256, 2048), scatter(32, 2048)  # 1,048,576 and 131,072 B over model
    (windowed_image, windowed_text) = (replace(c, kind="reduce-scatter") for c in (image, text))
    ops = [windowed_image, windowed_text, windowed_text]
    assert [c.operands for c in combine_scatters(ops, {"model": 4}, ((4, 1_179_648),))] == [2, 1]
    assert [c.operands for c in combine_scatters(ops, {"model": 4}, ((4, 1_310_720),))] == [3]
    assert [c.operands for c in combine_scatters(ops, {"model": 4}, ((2, 0),))] == [1, 1, 1]
    assert [c.operands for c in combine_scatters(ops, {"model": 4}, ())] == [3]
    # one already over the limit runs alone, and the ones after it combine (hunyuan-seq4-model2's pattern)
    assert [c.operands for c in combine_scatters([windowed_image, windowed_text, windowed_text], {"model": 4},
                                                 ((4, 500_000),))] == [1, 2]
    # the group is the collective's axes: the same ops over model 2 take the 2-chip limit
    assert [c.operands for c in combine_scatters(ops, {"model": 2}, ((2, 0), (4, 1_310_720)))] == [1, 1, 1]
    limits = ((2, 10), (4, 20), (16, 40))
    assert [combine_limit(limits, n) for n in (2, 3, 4, 8, 32)] == [10, 20, 20, 20, 40]
    assert combine_limit(((2, 10), (8, 30)), 4) == 10  # as near to 2 as to 8
    assert combine_limit((), 4) is None


@pytest.mark.parametrize("value, problem", [
    ([[1, 100]], "a group is 2 chips or more"), ([[4, 100], [2, 50]], "give each group size once, increasing"),
    ([[2, 100], [2, 50]], "give each group size once, increasing"),
    ([[2, -1]], "is not a byte count"), ("lots", "expected [[chips in the group, bytes], ...], the group sizes "
                                                  "increasing, or none"),
])
def test_a_bad_scatter_combine_override_is_one_line_naming_the_figure(value, problem):
    from meshlab.core.errors import InputError
    from meshlab.core.hardware import load_hardware

    with pytest.raises(InputError) as error:
        load_hardware("v6e-8", {"reduce_scatter_combine_bytes": value})
    assert "reduce_scatter_combine_bytes" in str(error.value) and problem in str(error.value)
    assert load_hardware("v6e-8", {"reduce_scatter_combine_bytes": [[2, "10MB"]]}).reduce_scatter_combine_bytes == (
        (2, 10**7),)


def test_each_chip_s_softmax_keys_price_as_many_score_buffers_as_its_record_saw():
    """The catalog's fused_softmax_keys, recomputed_softmax_keys and mask_broadcast_keys, per chip, price one float32
    score buffer a block at every recorded point where XLA:TPU's math attention held one (or none, the whole attention
    fused), two where it held two live at once, and the mask broadcast besides where it held that too
    (benchmarks/results/tpu_working_set*.json, python benchmarks/tpu_working_set.py: 2d's rules over Qwen-Image, whose
    attention is masked and where no head is gathered under a sequence split); a chip whose record saw two at every
    size has none of the figures; each figure's source names the record."""
    from meshlab.core.hardware import catalog

    blocks = 3  # each point compiles 3 blocks
    seen: dict[str, dict[int, int]] = {}  # chip: {keys a row: score buffers a block, 3 with the mask broadcast}
    for record in sorted((REPO / "benchmarks" / "results").glob("tpu_working_set*.json")):
        for point in json.loads(record.read_text())["points"]:
            if not Path(point["strategy"]).name.startswith("2d"):
                continue  # other rules and models: their predictions are held by the test below
            chip, keys, buffers = point["system"].split()[1].split(":")[0], point["tokens"], point["score_buffers"]
            if buffers["pairs_live_at_once"] == 0:
                assert buffers["count"] in (0, blocks), point  # one a block, or none
                seen.setdefault(chip, {})[keys] = 1
            else:
                assert buffers["count"] in (2 * blocks, 2 * blocks + 1) and buffers["pairs_live_at_once"] >= blocks
                seen.setdefault(chip, {})[keys] = 2 if buffers["count"] == 2 * blocks else 3
    assert {"v6e", "v5e"} <= set(seen) and {1, 2, 3} <= set(seen["v6e"].values())
    assert any(keys > 8192 and n == 1 for keys, n in seen["v6e"].items())  # the scores alone, past 8192
    for hw in catalog().values():
        chip = hw.chip.split()[1] if hw.kind == "tpu" else None
        if chip not in seen:
            continue
        fused, recomputed = hw.fused_softmax_keys or 0, hw.recomputed_softmax_keys or float("inf")
        broadcast = hw.mask_broadcast_keys or float("inf")
        for keys, held in seen[chip].items():
            two = 3 if broadcast < keys <= recomputed else 2
            assert held == (1 if keys <= fused or keys > recomputed else two), (chip, keys)
        for name in ("fused_softmax_keys", "recomputed_softmax_keys", "mask_broadcast_keys"):
            if getattr(hw, name) is not None:
                assert "tpu_working_set" in hw.sources[name], (chip, name)


def test_the_records_working_sets_are_what_meshlab_predicts_now():
    """Each working set meshlab predicted in the TPU records (the matrix at 256²,
    benchmarks/results/tpu_matrix_256_temporaries.json, with the options tpu_block_collectives.json keeps for each
    plan; the matrix at each workload's size, tpu_matrix_workload_temporaries.json, with its own; and every point of
    benchmarks/results/tpu_working_set*.json) is what the code predicts now, without
    compiling, and so are the workload matrix's fit verdicts: a change to the memory model recomputes the records
    it moves (benchmarks/tpu_matrix.py --repredict, benchmarks/tpu_working_set.py --repredict) or compiles them
    again (--only)."""
    from meshlab.check.against_tpu import compiled_memory, fits_every_chip, tpu_options

    def predicted(path, options: CheckOptions) -> int:
        return compiled_memory(check_setup(path, options), "torch-xla").most_loaded.denoise

    results = REPO / "benchmarks" / "results"
    kept = json.loads((REPO / "tests" / "cost" / "data" / "tpu_block_collectives.json").read_text())
    for name, row in json.loads((results / "tpu_matrix_256_temporaries.json").read_text()).items():
        if name.startswith("_"):  # "_repredicted": how the predictions were last recomputed
            continue
        options = {k: v for k, v in kept[name]["options"].items() if k != "seed"}
        assert predicted(REPO / name, CheckOptions(**options)) == row["predicted"], name
    # the matrix at each workload's own size: the options kept beside each plan give the forward XLA:TPU compiled
    for name, row in json.loads((results / "tpu_matrix_workload_temporaries.json").read_text()).items():
        if name.startswith("_"):
            continue
        options = CheckOptions(**{k: v for k, v in row["options"].items() if k != "seed"})
        setup = check_setup(REPO / name, options)
        geometry = setup.geometry
        assert (geometry.batch, geometry.image_tokens, geometry.text_tokens) == (
            row["forward"]["batch"], row["forward"]["image_tokens"], row["forward"]["text_tokens"]), name
        compiled, usable = compiled_memory(setup, "torch-xla"), setup.planned.hardware.usable_hbm_bytes
        assert compiled.most_loaded.denoise == row["predicted"], name
        # and both of meshlab's fit verdicts (the program compiled; the plan with its own attention)
        assert (fits_every_chip(compiled, usable), fits_every_chip(setup.memory, usable)) == (
            row["fits"]["predicted"], row["fits"]["predicted_as_planned"]), name
    points = 0
    for record in sorted(results.glob("tpu_working_set*.json")):
        for point in json.loads(record.read_text())["points"]:
            words = point["command"].split()
            text = int(words[words.index("--text-tokens") + 1]) if "--text-tokens" in words else None
            given = {"layers", "height", "width"} | ({"text_tokens"} if text else set())
            side, path = point["side"], REPO / point["strategy"]
            options = tpu_options(path, CheckOptions(layers=3, height=side, width=side, text_tokens=text), given)
            assert round(predicted(path, options) / 2**20, 1) == point["predicted_mib"], (record.name, point)
            points += 1
    assert points >= 30
