"""The derived per-block collectives held against XLA's partitioned HLO, for every built-in strategy.

The measured side is `meshlab check --json` trimmed to its collectives (tests/cost/data/xla_collectives_*.json,
each naming the command that made it); the derived side is `predict` over the very plan and workload the check
ran. Per block and per kind, the count and the bytes must agree within 10%, or match a difference listed in
meshlab/data/known_differences.yaml (held here at its measured numbers, so that a change shows).

Two sets of cases: the built-in strategies, which the derivation rules were first read from, and an
out-of-sample matrix (tests/cost/data/strategies/: a guidance axis, a sequence axis, another mesh shape, three
axes, Flux under 2d and pairs), compared on block 0 of every block list at depth two (a middle block).
Bytes: XLA's CPU backend moves f32 where the plan's dtype is bf16; they are compared per element, as bf16.
"""

from __future__ import annotations

import importlib.util
import json
from collections import Counter
from pathlib import Path

import pytest

from meshlab.check.setup import CheckOptions, check_setup
from meshlab.models.card import DTYPE_BYTES
from meshlab.cost.collectives import known_differences
from meshlab.cost.predict import predict

from tests.conftest import REPO

DATA = Path(__file__).parent / "data"
BUILT_IN = ("data", "model", "2d", "pairs", "ulysses", "hybrid", "fsdp")
#: The built-in strategies as they were before they took the layernorm-rows rewrite (the LayerNorm rows gathers)
STOCK = ("data-stock", "2d-stock", "pairs-stock")
#: Cards beyond Qwen-Image and Flux: Wan 2.1 (video, cross-attention, modulation from outside the blocks; its
#: built-in cfg x Ulysses + FSDP layout on the 1.3B card, with its Ulysses rules on every attention and on
#: self-attention alone), SD3.5 Large (an MMDiT with 38 heads) and FLUX.2 (packed
#: Linears, at 16 heads), each under largest-dim and column/row rules
#: The video DiTs of issue 26 under 2d: Wan 2.1 I2V (the image context's k and v), HunyuanVideo (dual and single blocks
#: over video), LTX-Video and CogVideoX-5b (which differ: see known_differences.yaml)
#: SANA 1600M (a linear self-attention, a convolutional MLP) under 2d and with its tokens over seq (held out: see
#: known_differences.yaml); CogVideoX-5b with its tokens over seq (its attention's and its FFN's joins of the
#: streams, at the residuals' split, read from XLA:TPU's program and held here on the CPU partitioner's)
OTHER_MODELS = ("wan-2d", "wan-pairs", "wan13-v6e-8", "wan13-v6e-8-self", "sd35-2d", "sd35-pairs", "flux2-2d",
                "flux2-pairs", "wani2v-2d", "hunyuan-2d", "ltx-2d", "cog-2d", "sana-2d", "sana-seq2-model2",
                "cog-seq2-model4")
MATRIX = ("cfg2-model4", "seq2-model4", "2d-4x2", "data2-cfg2-model2", "flux-2d", "flux-pairs",
          "flux-seq2-model4", "seq2-data2-model2", "usp-ring2-seq2-model2") + OTHER_MODELS
TOLERANCE = 0.10
BLOCK = "transformer_blocks.0"
#: (strategy, kind[, block list]) -> ((XLA count, bytes), (derived count, bytes)): see known_differences.yaml.
DOCUMENTED = {
    ("2d", "collective-permute"): ((36, 107_520), (36, 55_296)),
    ("2d-stock", "collective-permute"): ((36, 107_520), (36, 55_296)),
    ("ulysses", "collective-permute"): ((1, 147_456), (2, 147_456)),
    ("hybrid", "collective-permute"): ((2, 147_456), (2, 147_456)),  # agrees; its last block cuts in 1 permute
    ("model", "collective-permute"): ((44, 72_192), (84, 64_512)),
    ("2d-4x2", "collective-permute"): ((12, 86_016), (12, 36_864)),
    ("flux-2d", "collective-permute"): ((34, 64_512), (36, 55_296)),
    ("flux-2d", "collective-permute", "single_transformer_blocks"): ((7, 15_360), (8, 12_288)),
    ("seq2-data2-model2", "all-gather"): ((24, 5_812_224), (22, 5_025_792)),
    ("seq2-data2-model2", "all-to-all"): ((6, 589_824), (9, 884_736)),
    ("seq2-data2-model2", "collective-permute"): ((18, 436_224), (14, 184_320)),
    ("usp-ring2-seq2-model2", "collective-permute"): ((9, 368_640), (4, 147_456)),
    ("wan-2d", "all-to-all", "blocks"): ((6, 30_720), (0, 0)),
    ("wan-2d", "collective-permute", "blocks"): ((9, 56_320), (0, 0)),
    ("flux2-2d", "collective-permute"): ((42, 1_517_568), (4, 589_824)),
    ("flux2-2d", "collective-permute", "single_transformer_blocks"): ((21, 4_237_312), (0, 0)),
    ("flux2-pairs", "collective-permute"): ((8, 1_474_560), (4, 589_824)),
    ("flux2-pairs", "collective-permute", "single_transformer_blocks"): ((14, 4_227_072), (0, 0)),
    ("wani2v-2d", "all-to-all", "blocks"): ((6, 30_720), (0, 0)),
    ("wani2v-2d", "all-gather", "blocks"): ((12, 24_985_600), (10, 19_722_240)),
    ("wani2v-2d", "collective-permute", "blocks"): ((9, 56_320), (0, 0)),
    ("hunyuan-2d", "collective-permute"): ((34, 64_512), (36, 55_296)),
    ("hunyuan-2d", "collective-permute", "single_transformer_blocks"): ((7, 15_360), (8, 12_288)),
    ("cog-2d", "collective-permute"): ((34, 64_512), (36, 55_296)),
    ("ltx-2d", "all-to-all"): ((12, 61_440), (0, 0)),
    ("ltx-2d", "collective-permute"): ((9, 22_528), (0, 0)),
    ("sana-2d", "all-gather"): ((9, 788_480), (10, 815_360)),
    ("sana-2d", "all-to-all"): ((7, 40_320), (0, 0)),
    ("sana-2d", "collective-permute"): ((5, 197_120), (2, 179_200)),
    ("sana-seq2-model2", "all-gather"): ((5, 179_200), (13, 600_320)),
    ("sana-seq2-model2", "all-reduce"): ((9, 266_592), (6, 183_808)),
    ("sana-seq2-model2", "all-to-all"): ((4, 26_880), (0, 0)),
    ("sana-seq2-model2", "collective-permute"): ((9, 340_480), (4, 179_200)),
    ("cog-seq2-model4", "collective-permute"): ((44, 285_696), (38, 178_176)),
}
#: strategy -> (XLA's dot FLOPs per device, derived): see known_differences.yaml (XLA gathers the text stream back over
#: the sequence axis after attention and runs its Linears on every text token: 14% more FLOPs than the split; SANA's
#: cross-attention makes its keys and values from the whole text: 10% more)
DOCUMENTED_FLOPS = {"seq2-data2-model2": (11_676_155_904.0, 10_013_638_656.0),
                    "sana-seq2-model2": (1_769_635_840.0, 1_609_287_680.0)}
#: In a checked depth of one, the block is the last: XLA drops its text stream after the attention.
LAST_BLOCK_DROPS = ("to_add_out", "txt_mlp", "text stream's LayerNorm 2")


def xla_block(collectives: list[dict], itemsize: int, block: str = BLOCK) -> dict[str, tuple[int, int]]:
    """(count, bytes as the plan's dtype) per kind of one block's collectives."""
    counts, nbytes = Counter(), Counter()
    for c in collectives:
        layer = c["layer"] or ""
        if layer == block or layer.startswith(block + "."):
            element = 4 if c["dtype"] == "f32" else DTYPE_BYTES.get(c["dtype"], itemsize)
            counts[c["kind"]] += 1
            nbytes[c["kind"]] += c["bytes_per_device"] // element * itemsize
    return {kind: (counts[kind], nbytes[kind]) for kind in counts}


def strategy_path(strategy: str) -> Path:
    return REPO / "strategies" / f"{strategy}.yaml" if strategy in BUILT_IN else DATA / "strategies" / f"{strategy}.yaml"


def relative(strategy: str) -> str:
    return strategy_path(strategy).relative_to(REPO).as_posix()


def derived_block(strategy: str, options: dict, last: bool = False, block: str = BLOCK,
                  ) -> tuple[dict[str, tuple[int, int]], int]:
    """(count, bytes) per kind the cost model derives for one block (named as XLA's layers are)."""
    setup = check_setup(strategy_path(strategy), CheckOptions(**options))
    prediction = predict(setup.plan, setup.strategy, setup.planned.hardware)
    index = next(p.parameter.block for p in setup.plan.parameters if p.name.startswith(block + "."))
    ops = [c for c in prediction.collectives if c.block == index]
    if last:
        ops = [c for c in ops if not any(marker in c.why for marker in LAST_BLOCK_DROPS)]
    counts, nbytes = Counter(c.kind for c in ops), Counter()
    for c in ops:
        nbytes[c.kind] += c.bytes
    return {kind: (counts[kind], nbytes[kind]) for kind in counts}, DTYPE_BYTES[setup.strategy.workload.dtype]


def assert_agrees(strategy: str, xla: dict, derived: dict, block_list: str = "transformer_blocks") -> None:
    for kind in sorted(set(xla) | set(derived)):
        measured, ours = xla.get(kind, (0, 0)), derived.get(kind, (0, 0))
        key = (strategy, kind) if block_list == "transformer_blocks" else (strategy, kind, block_list)
        if key in DOCUMENTED:
            assert (measured, ours) == DOCUMENTED[key], f"{strategy} {kind}: the documented difference moved"
            continue
        for what, x, d in (("count", measured[0], ours[0]), ("bytes", measured[1], ours[1])):
            assert abs(d - x) <= TOLERANCE * x, f"{strategy} {block_list} {kind} {what}: XLA {x}, derived {d}"


def check_options(document: dict) -> dict:
    """The checked forward's options as the measurement recorded them (frames: video models, newer files)."""
    return {k: document["options"][k] for k in ("layers", "height", "width", "text_tokens", "frames")
            if k in document["options"]}


def load(strategy: str) -> dict:
    return json.loads((DATA / f"xla_collectives_{strategy}.json").read_text())


@pytest.mark.parametrize("strategy", BUILT_IN + STOCK)
def test_derived_block_collectives_agree_with_xla(strategy):
    document = load(strategy)
    assert document["command"].startswith(f"meshlab check {relative(strategy)}")
    options = {k: document["options"][k] for k in ("layers", "height", "width", "text_tokens")}
    derived, itemsize = derived_block(strategy, options, last=options["layers"] == 1)
    assert_agrees(strategy, xla_block(document["collectives"], itemsize), derived)


@pytest.mark.parametrize("strategy", [s for s in BUILT_IN + STOCK if load(s)["options"]["layers"] == 2])
def test_the_last_block_drops_the_text_tail_as_xla_does(strategy):
    """Checked at depth two, the second block is the last: the same block less its text stream's tail."""
    document = load(strategy)
    options = {k: document["options"][k] for k in ("layers", "height", "width", "text_tokens")}
    derived, itemsize = derived_block(strategy, options, last=True)
    xla = xla_block(document["collectives"], itemsize, block="transformer_blocks.1")
    documented = {key[1] for key in DOCUMENTED if key[0] == strategy}  # permutes: see known_differences.yaml
    assert_agrees(strategy, {k: v for k, v in xla.items() if k not in documented},
                  {k: v for k, v in derived.items() if k not in documented})


def block_lists(document: dict) -> list[str]:
    return sorted({c["layer"].split(".", 1)[0] for c in document["collectives"]
                   if c["layer"] and c["layer"].split(".")[1:2] == ["0"]})


@pytest.mark.parametrize("strategy", MATRIX)
def test_out_of_sample_matrix_agrees_with_xla_on_a_middle_block(strategy):
    document = load(strategy)
    assert document["command"].startswith(f"meshlab check tests/cost/data/strategies/{strategy}.yaml --layers 2")
    options = check_options(document)
    assert options["layers"] == 2  # block 0 is a middle block
    for block_list in block_lists(document):
        derived, itemsize = derived_block(strategy, options, block=f"{block_list}.0")
        assert_agrees(strategy, xla_block(document["collectives"], itemsize, block=f"{block_list}.0"), derived,
                      block_list)


def test_the_matrix_covers_what_the_rules_were_not_read_from():
    """A guidance axis, a sequence axis (with all-to-alls), three axes, another mesh shape, and Flux's two block
    kinds, each with collectives measured in its block 0."""
    kinds = {s: set(xla_block(load(s)["collectives"], 2)) for s in MATRIX}
    single = set(xla_block(load("flux-pairs")["collectives"], 2, block="single_transformer_blocks.0"))
    assert "all-to-all" in kinds["seq2-model4"] and "all-to-all" in single
    assert block_lists(load("flux-2d")) == ["single_transformer_blocks", "transformer_blocks"]
    axes = {s: {a for c in load(s)["collectives"] for a in c["mesh_axes"]} for s in MATRIX}
    assert "cfg" in axes["cfg2-model4"] and {"data", "cfg", "model"} <= axes["data2-cfg2-model2"]


@pytest.mark.parametrize("strategy", [s for s in BUILT_IN + STOCK + MATRIX if "flops_per_device" in load(s)])
def test_flops_per_device_agree_with_the_dots_of_xlas_program(strategy):
    """One forward on one device: meshlab's Linears and attention against every dot of XLA's partitioned
    program (2 x result elements x contracted elements, as HloCostAnalysis counts a dot), within 2%."""
    from meshlab.check.verdict import predicted_flops

    document = load(strategy)
    setup = check_setup(strategy_path(strategy), CheckOptions(**check_options(document)))
    xla = document["flops_per_device"]["xla_dots"]
    if strategy in DOCUMENTED_FLOPS:
        assert (xla, predicted_flops(setup)) == DOCUMENTED_FLOPS[strategy], "the documented difference moved"
        return
    assert abs(predicted_flops(setup) - xla) <= 0.02 * xla


def test_the_other_models_are_in_the_matrix_with_their_flops():
    for strategy in OTHER_MODELS:
        document = load(strategy)
        assert "flops_per_device" in document and document["command"].endswith("--layers 2 --json")
    assert load("wan-2d")["forward"]["image_tokens"] == 2 * 8 * 8  # 5 frames: two latent frames of 8 x 8 tokens


def test_every_documented_difference_is_listed():
    listed = " ".join(known_differences())
    for strategy, kind, *_ in DOCUMENTED:
        assert f"{strategy}.yaml" in listed and kind in listed


def test_each_known_difference_names_measurements_that_are_checked_in():
    """Each entry of meshlab/data/known_differences.yaml cites XLA captures under tests/cost/data, and each
    documented difference's capture is among those its entry cites."""
    import yaml

    entries = yaml.safe_load((REPO / "meshlab" / "data" / "known_differences.yaml").read_text())
    assert [e["difference"] for e in entries] == list(known_differences())
    for entry in entries:
        assert entry["measured"], entry["difference"][:60]
        for name in entry["measured"]:
            assert (DATA / name).is_file(), name
    for strategy, kind, *_ in DOCUMENTED:
        citing = [e for e in entries if f"{strategy}.yaml" in e["difference"] and kind in e["difference"]]
        assert any(f"xla_collectives_{strategy}.json" in e["measured"] for e in citing), (strategy, kind)


def test_each_known_difference_names_the_model_classes_it_was_measured_on():
    """An entry's `classes` are the diffusers classes of the cards its captures checked, or `all` for what holds
    whatever the model; explain lists a plan's class's entries and the general ones, so a Wan 2.1 1.3B plan gets
    the 14B's entry (one class) and a FLUX.2 plan the entry read from its narrow card."""
    import json

    import yaml

    from meshlab.core.hardware import load_hardware
    from meshlab.cost.timing import Assumptions
    from meshlab.models.card import load_card

    captured = json.loads((DATA / "tpu_block_collectives.json").read_text())
    for entry in yaml.safe_load((REPO / "meshlab" / "data" / "known_differences.yaml").read_text()):
        classes = set()
        if entry.get("truth", "xla-cpu") == "xla-tpu":  # XLA:TPU's program: the captured cases it names
            assert entry["measured"] == ["tpu_block_collectives.json"] and entry["cases"], entry["difference"][:60]
            paths = [REPO / captured[case]["command"].split()[2] for case in entry["cases"]]
        else:
            paths = [REPO / json.loads((DATA / name).read_text())["command"].split()[2] for name in entry["measured"]]
        for path in paths:
            classes.add(load_card(yaml.safe_load(path.read_text())["model"], path.parent).class_name)
        assert entry["classes"] == "all" or set(entry["classes"]) == classes, entry["difference"][:60]
    wan = known_differences("WanTransformer3DModel")
    assert any("Wan's modulation" in d for d in wan) and not any("SANA" in d for d in wan)
    assert any("on CPU, XLA's collectives carry f32" in d for d in wan) and set(wan) < set(known_differences())
    assert not any("on CPU" in d for d in known_differences("WanTransformer3DModel", general=False))

    def listed(model_class, system="h100"):
        return next(a["source"] for a in Assumptions().describe(load_hardware(system), model_class)
                    if a["name"] == "collectives vs XLA")

    cpu = "Held against XLA's partitioner on CPU devices (`meshlab check`)"
    assert "FLUX.2's packed Linears" in listed("Flux2Transformer2DModel")
    assert listed("NoSuchTransformer").startswith(f"{cpu}: none measured on NoSuchTransformer; on CPU, XLA's")
    assert "more, measured on other model classes" in listed("WanTransformer3DModel")
    assert "XLA:TPU" not in listed("QwenImageTransformer2DModel")  # a GPU plan is held to the partitioner only
    # on a TPU, XLA:TPU's program first (it wins), then the partitioner's entries, each said held against which
    tpu = listed("QwenImageTransformer2DModel", "v6e-8")
    assert tpu.startswith("Held against XLA:TPU's own program (`meshlab check --backend tpu`), which a TPU runs")
    assert tpu.index("seq8-model2.yaml") < tpu.index(cpu) < tpu.index("2d-stock.yaml")
    assert "SANA 1600M with its tokens over seq on XLA:TPU" not in tpu and "3 more" in tpu


@pytest.mark.xla
@pytest.mark.slow
@pytest.mark.skipif(any(importlib.util.find_spec(m) is None for m in ("torch_xla", "diffusers")),
                    reason="needs the xla extra: pip install -e '.[xla]'")
@pytest.mark.memory  # more than 5 GiB of host memory at once: one at a time (tests/conftest.py)
@pytest.mark.parametrize("strategy", ["pairs", "seq2-model4"])
def test_agrees_with_a_live_check(strategy):
    """Through `meshlab check`'s own API (a torch worker on 8 virtual CPU devices, about 2 minutes each): a
    built-in strategy, and the sequence-axis case of the matrix (all-to-alls, permutes, joint k/v gathers)."""
    from meshlab.check.against_xla import run_check

    options = {"layers": 2, "height": 128, "width": 128, "text_tokens": 32}
    report = run_check(strategy_path(strategy), CheckOptions(**options))
    collectives = [{"kind": c.hlo.kind, "layer": c.hlo.layer, "bytes_per_device": c.hlo.bytes_per_device,
                    "dtype": c.hlo.result[0].dtype if c.hlo.result else None} for c in report.collectives]
    derived, itemsize = derived_block(strategy, options)
    xla = xla_block(collectives, itemsize)
    assert_agrees(strategy, xla, derived)
    assert xla == xla_block(load(strategy)["collectives"], itemsize)  # the checked-in measurement still holds
