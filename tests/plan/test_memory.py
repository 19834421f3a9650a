"""Per-chip memory on the small synthetic card: every term checked against a hand count."""

import dataclasses
import math

from meshlab.plan.memory import ScoreBuffers, block_activation_bytes, memory_report
from meshlab.plan.planner import make_plan
from meshlab.strategy.schema import Strategy
from meshlab.plan.tokens import token_counts

from tests.conftest import REPO, small_card


def strategy(**overrides) -> Strategy:
    base = {"name": "t", "model": "small", "hardware": "v6e-8", "mesh": {"data": 2, "model": 4},
            "rules": [{"match": "*", "min_rank": 2, "shard": "largest", "axis": "model"}],
            "activations": {"batch": "data"},
            "workload": {"batch": 2, "height": 64, "width": 64, "text_tokens": 8}}
    base.update(overrides)
    return Strategy.model_validate(base)


def test_weights_split_into_sharded_replicated_padding():
    card, s = small_card(), strategy()
    report = memory_report(make_plan(s, card, 8), s, usable_hbm=10**9, reserve=100)
    chip = report.chips[0]
    two_d = sum(p.bytes for p in card.parameters if p.rank >= 2)
    one_d = sum(p.bytes for p in card.parameters if p.rank < 2)
    assert chip.weights_sharded == two_d // 4 and chip.weights_replicated == one_d and chip.padding == 0
    assert report.uniform and report.fits and chip.reserve == 100


def test_token_counts_follow_vae_and_patch():
    tokens = token_counts(strategy().workload, small_card().architecture)
    assert (tokens.image, tokens.text, tokens.joint) == (16, 8, 24)  # 64 px / 8 / 2 = 4 -> 4 x 4


def test_activations_hand_count():
    card, s = small_card(), strategy()
    plan = make_plan(s, card, 8)
    tokens = token_counts(s.workload, card.architecture)
    # per sample, elements: residual 2*24*64; attention: q,k,v of 16 image + 8 text tokens, each 64/4 wide,
    # plus the output 24 tokens x 1 head x 16; MLP: 2 x 16 image tokens x 256/4
    residual = 2 * 24 * 64
    attention = 3 * 24 * 16 + 24 * 16
    mlp = 2 * 16 * 64
    expected = (residual + max(attention, mlp)) * 1 * 2  # one sample per chip (batch 2 over data 2), bf16
    assert block_activation_bytes(plan, s, tokens) == expected


def test_scores_count_without_flash_attention():
    card = small_card()
    s = strategy(workload={"batch": 2, "height": 64, "width": 64, "text_tokens": 8, "flash_attention": False})
    plan = make_plan(s, card, 8)
    with_scores = block_activation_bytes(plan, s, token_counts(s.workload, card.architecture))
    # torch's math attention in float32 (two bf16 elements each): q, k, v copied, then the scores and probabilities
    upcast, scores = 2 * (24 + 2 * 24) * 1 * 16, 2 * (2 * 1 * 24 * 24)
    residual, attention = 2 * 24 * 64, 3 * 24 * 16 + 24 * 16 + upcast + scores
    assert with_scores == (residual + attention) * 2
    # XLA:TPU fuses each convert into the matmul that reads it: no float32 copies of q, k and v in its program
    tpu = block_activation_bytes(plan, s, token_counts(s.workload, card.architecture), xla=True)
    assert tpu == (residual + attention - upcast) * 2


#: math attention over a 64 x 64 image (16 tokens) and 8 text tokens: 24 keys a row, one head a chip of 8
MATH = {"height": 64, "width": 64, "text_tokens": 8, "flash_attention": False}
#: one float32 (two bf16 elements) buffer of a block's scores there: 1 head x 24 queries x 24 keys, in bytes
BUFFER = 2 * 1 * 24 * 24 * 2


def _split(mesh: dict, batch: int, rules: list | None = None) -> Strategy:
    """MATH with its tokens split over the mesh's seq axis (and `rules`, e.g. Ulysses' attention.qkv)."""
    return strategy(mesh=mesh, activations={"batch": None, "sequence": "seq", "rules": rules or []},
                    workload={"batch": batch, **MATH})


def _held(s: Strategy, card, xla: bool = False, fused=0, recomputed=math.inf, mask_broadcast=math.inf) -> int:
    """`block_activation_bytes` of `card` planned by `s` on its mesh's chips, with the chip's score-buffer keys."""
    plan = make_plan(s, card, math.prod(s.mesh.values()))
    return block_activation_bytes(plan, s, token_counts(s.workload, card.architecture), xla=xla,
                                  score_buffers=ScoreBuffers(fused, recomputed, mask_broadcast))


def _masked(card, masked: bool = True, **changes):
    """`card` with every attention called with a mask (Attention.masked), or not, and `changes` besides."""
    return dataclasses.replace(card, attention=tuple(dataclasses.replace(a, masked=masked, **changes)
                                                     for a in card.attention))


def test_a_tpu_that_fuses_the_softmax_holds_one_score_buffer_up_to_its_keys():
    """Hardware.fused_softmax_keys: XLA:TPU's math attention holds one float32 score buffer where a row has at most
    that many keys (v6e: 4096, measured), the scores and the probabilities above it or where every head is gathered
    under a sequence split, and on a chip without the figure (v5e, measured holding two; a GPU's eager attention)
    whatever the keys."""
    from meshlab.core.hardware import load_hardware
    from meshlab.plan.memory import memory_on

    card = small_card()
    s = strategy(workload={"batch": 2, **MATH})
    plan = make_plan(s, card, 8)
    two = _held(s, card)
    assert _held(s, card, fused=24) == two - BUFFER  # 24 keys a row: fused
    assert _held(s, card, fused=23) == two
    assert load_hardware("v6e-8").fused_softmax_keys == 4096 and load_hardware("v5e-8").fused_softmax_keys is None
    on = {name: memory_on(plan, s, load_hardware(name)).most_loaded.activations for name in ("v6e-8", "v5e-8")}
    assert on["v6e-8"] == on["v5e-8"] - BUFFER
    # under a sequence split with every head gathered (two samples a chip, on a TPU) both buffers, as XLA:TPU's
    # program of CogVideoX over seq 2 x model 4 holds them at 3360 keys (cog-seq2-model4.yaml); with one sample a chip
    # (the heads split) one
    for batch, fused in ((2, False), (1, True)):
        split = _split({"seq": 2, "model": 4}, batch)
        assert (_held(split, card, xla=True, fused=4096) < _held(split, card, xla=True)) is fused, batch


def test_past_its_recomputed_softmax_keys_a_tpu_holds_the_scores_alone():
    """Hardware.recomputed_softmax_keys: with more keys a row than that (8192 on v6e, v5e, v5p and v4, measured)
    XLA:TPU's math attention holds one float32 buffer again, the scores, whose readers recompute the probabilities;
    so under a sequence split with every head gathered too (HunyuanVideo over seq 4 x model 2 at 8480 keys), where
    below it holds two, but not where the probabilities meet values left split (meshlab.plan.axes.values_summed: seq
    2 x model 4). v6e alone holds a masked attention's mask broadcast (v5e, v5p and v4 none at 5244 keys)."""
    from meshlab.core.hardware import load_hardware
    from meshlab.plan.memory import memory_on

    card = small_card()
    s = strategy(workload={"batch": 2, **MATH})
    plan = make_plan(s, card, 8)
    two = _held(s, card)
    assert _held(s, card, fused=4, recomputed=23) == two - BUFFER
    assert _held(s, card, fused=4, recomputed=24) == two
    assert all(load_hardware(name).recomputed_softmax_keys == 8192 for name in ("v6e-8", "v5e-8", "v5p-8", "v4-8"))
    assert all(load_hardware(name).mask_broadcast_keys is None for name in ("v5e-8", "v5p-8", "v4-8"))
    v6e = load_hardware("v6e-8", {"fused_softmax_keys": 4, "recomputed_softmax_keys": 23,  # the catalog's figures
                                  "mask_broadcast_keys": "none"})
    v5e = load_hardware("v5e-8")  # reach memory_on; v5e's 8192 far past these 24 keys: two buffers
    assert memory_on(plan, s, v6e).most_loaded.activations == memory_on(plan, s, v5e).most_loaded.activations - BUFFER
    for mesh, alone in (({"seq": 4, "model": 2}, True), ({"seq": 2, "model": 4}, False)):  # values gathered, summed
        split = _split(mesh, 2)
        both = _held(split, card, xla=True, fused=4096)
        assert (_held(split, card, xla=True, fused=4, recomputed=8) < both) is alone, mesh


def test_a_masked_attention_holding_two_score_buffers_holds_its_mask_broadcast_besides():
    """Hardware.mask_broadcast_keys: an attention called with a mask (Attention.masked: Qwen-Image's, HunyuanVideo's)
    holds its mask broadcast to every head and query, one more float32 buffer of a block's scores, where XLA:TPU holds
    two and a row has more keys than that (v6e: 5240, measured); not where it holds one (fused, or the scores alone
    past recomputed_softmax_keys), and not for an attention called without a mask."""
    from meshlab.core.hardware import load_hardware

    card = small_card()
    masked = _masked(card)
    s = strategy(workload={"batch": 2, **MATH})
    two = _held(s, card)
    assert _held(s, masked, mask_broadcast=23) == two + BUFFER  # 24 keys a row: the mask broadcast besides
    assert _held(s, masked, mask_broadcast=24) == _held(s, card, mask_broadcast=23) == two
    assert _held(s, masked, mask_broadcast=23, fused=24) == two - BUFFER  # fused: one buffer
    assert _held(s, masked, mask_broadcast=23, recomputed=23) == two - BUFFER  # the scores alone
    assert load_hardware("v6e-8").mask_broadcast_keys == 5240 and load_hardware("v5e-8").mask_broadcast_keys is None
    cross = {m: _masked(card, m, keys=("text",)) for m in (False, True)}
    assert _held(s, cross[True], mask_broadcast=4) == _held(s, cross[False], mask_broadcast=4)  # text keys: none
    # under Ulysses (the sequence axis moved onto the heads at the kernel) it is held, as ulysses-largest-seq2-model4
    # holds it at 5244 keys; under a ring with one sample a chip, not measured, not priced
    for rules, extra in (([{"point": "attention.qkv", "spec": [None, None, ["model", "seq"]]}], BUFFER), ([], 0)):
        split = _split({"seq": 2, "model": 2}, 1, rules)
        assert _held(split, masked, xla=True, mask_broadcast=4) == _held(split, masked, xla=True) + extra, rules
    # under a sequence split (every head gathered, two buffers) none: seq2-model4.yaml at 5244 keys
    split = _split({"seq": 2, "model": 4}, 2)
    for c in (card, masked):
        assert _held(split, c, xla=True, mask_broadcast=4) == _held(split, c, xla=True), c.attention[0].masked


def test_math_attention_with_two_samples_a_chip_holds_every_head_on_a_tpu():
    """torch_xla's math attention gathers the heads of more than one sample a chip (meshlab.plan.axes.heads_gathered):
    on a TPU each sample's attention then holds q, k and v of all 4 heads of 16, not the chip's 1 (and not the
    chip's projections, which the gathers consume), and no float32 copies of them (XLA:TPU fuses the converts into
    the matmuls that read them); eager DTensor on a GPU keeps the chip's head, its projections, and its float32
    copies of q, k and v."""
    card = small_card()
    s = strategy(workload={"batch": 4, "height": 64, "width": 64, "text_tokens": 8, "flash_attention": False})
    plan = make_plan(s, card, 8)
    tokens = token_counts(s.workload, card.architecture)

    def expected(heads: int, gathered: int, upcast: bool) -> int:
        copies, scores = 2 * (24 + 2 * 24) * heads * 16 * upcast, 2 * (2 * heads * 24 * 24)
        projections = 0 if gathered else 3 * 24 * 16
        attention = projections + 24 * heads * 16 + copies + scores + gathered
        return (2 * 24 * 64 + attention) * 2 * 2  # 2 samples a chip (batch 4 over data 2), bf16

    assert block_activation_bytes(plan, s, tokens, xla=True) == expected(4, (24 + 2 * 24) * 4 * 16, upcast=False)
    assert block_activation_bytes(plan, s, tokens) == expected(1, 0, upcast=True)


def test_a_linear_attention_on_a_tpu_holds_no_float32_copies_of_q_k_and_v():
    """SANA's linear attention under XLA:TPU: the converts to float32 and v's padding row fuse into the matmuls, so a
    chip holds q, k and v in bf16 (gathered where two samples a chip gather every head: the padded v then) and the
    float32 output of head_dim + 1 rows a head; eager PyTorch holds float32 copies of q, k and v besides. Hand
    counts on the small card (24 joint tokens, heads of 16, 4 heads split over model 4, width 64)."""
    card = small_card()
    card = dataclasses.replace(card, attention=tuple(dataclasses.replace(a, kind="linear") for a in card.attention))
    residual = 2 * 24 * 64
    # one sample a chip, its head split, 16 text tokens (32 joint, so that the attention outgrows the MLPs' 2 x 16
    # x 64): q, k, v (3 x 32 x 16) and the float32 output (2 x 32 x 17)
    s = strategy(workload={"batch": 2, "height": 64, "width": 64, "text_tokens": 16})
    plan, tokens = make_plan(s, card, 8), token_counts(s.workload, card.architecture)
    assert block_activation_bytes(plan, s, tokens, xla=True) == (2 * 32 * 64 + 1536 + 1088) * 2
    assert block_activation_bytes(plan, s, tokens) == (2 * 32 * 64 + 1536 + 2 * (1536 + 32) + 1088) * 2
    # two samples a chip, every head gathered: q, k and the padded v of 4 heads (24 x 4 x 49) and the output
    s = strategy(workload={"batch": 4, "height": 64, "width": 64, "text_tokens": 8})
    plan, tokens = make_plan(s, card, 8), token_counts(s.workload, card.architecture)
    gathered, output = 24 * 4 * (3 * 16 + 1), 2 * 24 * 4 * 17
    assert block_activation_bytes(plan, s, tokens, xla=True) == (residual + gathered + output) * 2 * 2
    # eager (DTensor on a GPU) gathers no head: the one-sample count for each sample
    assert block_activation_bytes(plan, s, tokens) == (residual + 1152 + 2 * (1152 + 24) + 816) * 2 * 2


def test_components_and_placement():
    card = small_card()
    s = strategy(placement={"text_encoder": "device", "vae": "device"})
    chip = memory_report(make_plan(s, card, 8), s, usable_hbm=10**9, reserve=0).chips[0]
    assert chip.text_encoder == 5000 * 2 and chip.vae_weights == 1000 * 2
    # bytes/pixel x pixels x one image per chip, plus the decoded image (3 channels at the dtype)
    assert chip.vae_decode == int(10.0 * 64 * 64 * 1) + 3 * 64 * 64 * 2
    # weights 157,024 + the decode (65,536, larger than the block's 10,240 of activations) + text encoder 10,000
    # + VAE weights 2,000
    assert chip.total == 157_024 + 65_536 + 10_000 + 2_000
    s = strategy(placement={"text_encoder": "cpu", "vae": "cpu"})
    chip = memory_report(make_plan(s, card, 8), s, usable_hbm=10**9, reserve=0).chips[0]
    assert chip.text_encoder == chip.vae_weights == chip.vae_decode == 0


def test_does_not_fit_when_hbm_is_small():
    s = strategy()
    report = memory_report(make_plan(s, small_card(), 8), s, usable_hbm=1000, reserve=0)
    assert not report.fits and report.most_loaded.headroom < 0


def test_sequence_split_holds_the_gathered_keys_and_values():
    """seq 2 x model 4: each chip holds 8 of 16 image tokens and 4 of 8 text tokens (the joint attention's split
    reaches the text stream), and attention holds k/v of all 24 joint tokens (hand count)."""
    card = small_card()
    s = strategy(mesh={"seq": 2, "model": 4}, activations={"batch": None, "sequence": "seq"},
                 workload={"batch": 1, "height": 64, "width": 64, "text_tokens": 8})
    got = block_activation_bytes(make_plan(s, card, 8), s, token_counts(s.workload, card.architecture))
    local = 8 + 4  # image + text tokens on this chip
    residual = 2 * local * 64
    attention = 3 * local * 16 + 2 * 12 * 16 + local * 16  # q/k/v local; k/v of the other 12 joint tokens; output
    assert got == (residual + max(attention, 2 * 8 * 64)) * 2 == 5376


def test_fsdp_weights_are_gathered_so_activations_are_not_divided_by_their_split():
    """data 8, every weight's largest dim over data, one sample per chip: each chip computes whole outputs."""
    card = small_card()
    fsdp = strategy(mesh={"data": 8}, rules=[{"match": "*", "min_rank": 2, "shard": "largest", "axis": "data"}],
                    workload={"batch": 8, "height": 64, "width": 64, "text_tokens": 8})
    replicated = strategy(mesh={"data": 8}, rules=[], workload={"batch": 8, "height": 64, "width": 64, "text_tokens": 8})
    tokens = token_counts(fsdp.workload, card.architecture)
    got = block_activation_bytes(make_plan(fsdp, card, 8), fsdp, tokens)
    assert got == block_activation_bytes(make_plan(replicated, card, 8), replicated, tokens)
    residual, attention, mlp = 2 * 24 * 64, 3 * 24 * 64 + 24 * 64, 2 * 16 * 256  # 4 heads, whole widths
    assert got == (residual + max(attention, mlp)) * 2


def test_uniform_compares_every_component_not_totals():
    s = strategy()
    report = memory_report(make_plan(s, small_card(), 8), s, usable_hbm=10**9, reserve=0)
    first = report.chips[0]
    moved = dataclasses.replace(report.chips[1], weights_sharded=first.weights_sharded + 2,
                                weights_replicated=first.weights_replicated - 2)  # same total, other split
    assert moved.total == first.total
    assert not dataclasses.replace(report, chips=(first, moved) + report.chips[2:]).uniform


def test_a_scanned_plan_holds_its_block_weights_stacked_while_denoising():
    """torch_xla's scan stacks every block's weights each forward (meshlab.parallelisms.scan): the denoise phase
    holds a second copy of the block weights, split as each block's copy is; nothing outside the blocks is stacked."""
    card = small_card()
    unrolled, scanned = strategy(), strategy(compile={"scan_blocks": True})
    plain = memory_report(make_plan(unrolled, card, 8), unrolled, usable_hbm=10**9, reserve=0).chips[0]
    chip = memory_report(make_plan(scanned, card, 8), scanned, usable_hbm=10**9, reserve=0).chips[0]
    in_blocks = sum(p.bytes // 4 if p.rank >= 2 else p.bytes for p in card.parameters
                    if p.name.startswith("transformer_blocks."))  # 2-D weights split 4 ways over model
    assert plain.scan_stacked == 0 and chip.scan_stacked == in_blocks > 0
    assert in_blocks < chip.weights  # the embedders and the output layers are not stacked
    assert chip.denoise == chip.activations + in_blocks == plain.activations + in_blocks
    assert chip.peak_phase == "denoise" and chip.total == plain.total - plain.activation_peak + chip.denoise


def test_fsdp_is_priced_holding_a_block_s_weights_gathered():
    """fsdp.yaml splits every block weight over the batch axis: a block gathers them before they are used, and the
    denoise phase is priced holding the block's gathered weights beside the activations (a stand-in for what XLA:TPU
    holds: meshlab.plan.memory.gathered_block_bytes, tests/check/test_tpu_check.py); 2d.yaml gathers none."""
    from meshlab.models.card import DTYPE_BYTES
    from meshlab.plan.planned import plan_file

    fsdp = plan_file(REPO / "strategies" / "fsdp.yaml")
    block = [p for p in fsdp.plan.parameters if p.parameter.block == 1]
    split = [p for p in block if p.spec.axes == ("data",)]  # its matrices; the biases and norms stay whole
    assert len(split) == 14 and all(p.parameter.rank == 2 for p in split)
    chip = fsdp.memory.most_loaded
    assert chip.gathered_weights == sum(p.parameter.numel for p in split) * DTYPE_BYTES["bfloat16"]
    assert chip.denoise == chip.activations + chip.gathered_weights
    assert plan_file(REPO / "strategies" / "2d.yaml").memory.most_loaded.gathered_weights == 0


def test_a_chip_that_gathers_weights_async_is_priced_holding_two_blocks_gathered(tmp_path):
    """v5e runs FSDP's weight gathers async with libtpu's defaults, and its schedule starts them early: XLA:TPU's
    compile of fsdp.yaml for v5e:2x4 (3 blocks, 256², torch_xla's program) holds 2.19 blocks' gathered weights at
    once (every modulation weight, 23 of 24 attention projections, 5 of 12 MLP weights), 1,550,086,144 B of
    temporaries in HBM, against v6e's 679,828,576 B (every block's modulation weights). Priced as two blocks there,
    one where the plan turns XLA's async all-gathers off or scans its blocks (not measured), and one on v6e, whose
    gathers are synchronous."""
    import yaml

    from meshlab.plan.planned import plan_file

    def gathered(system: str, flags: list[str], scan: bool = False) -> int:
        data = yaml.safe_load((REPO / "strategies" / "fsdp.yaml").read_text())
        data["hardware"], data["compile"] = system, {"libtpu_flags": flags, "scan_blocks": scan}
        path = tmp_path / f"{system}-{len(flags)}-{scan}.yaml"
        path.write_text(yaml.safe_dump(data))
        return plan_file(path).memory.most_loaded.gathered_weights

    one = gathered("v6e-8", [])
    assert one > 0 and gathered("v5e-8", []) == 2 * one
    assert gathered("v5e-8", ["--xla_enable_async_all_gather=false"]) == one == gathered("v5e-8", [], scan=True)


def test_a_weight_split_over_an_axis_of_one_chip_is_not_gathered():
    """fsdp.yaml's rules on a mesh whose batch axis has one chip: the block weights are whole, nothing is gathered."""
    import yaml

    from meshlab.core.hardware import load_hardware
    from meshlab.models.card import load_card
    from meshlab.plan.memory import memory_on

    doc = yaml.safe_load((REPO / "strategies" / "fsdp.yaml").read_text())
    doc.update(mesh={"data": 1, "model": 8}, hardware="h200")
    strategy = Strategy.model_validate(doc)
    chip = memory_on(make_plan(strategy, load_card("qwen-image"), 8), strategy,
                     load_hardware("h200").using(8)).most_loaded
    assert chip.gathered_weights == 0 and chip.weights_sharded > 37 * 2**30  # every block weight whole


def test_buffers_are_whole_on_every_chip_in_the_dtype_a_pipeline_loads_them_in():
    """A persistent buffer (in the checkpoint) is priced in the workload's dtype, as from_pretrained converts it; a
    non-persistent one in the dtype its class made it; both whole on every chip, counted in the total and in what
    the transformer's program holds (the fit XLA:TPU's is held to)."""
    from meshlab.check.against_tpu import fits_every_chip
    from meshlab.models.card import Buffer

    table = Buffer("pos_embed.pos_embed", (1, 64, 64), "bfloat16", persistent=True)  # 4,096 elements
    rotary = Buffer("rope.freqs_cos", (16, 8), "float32", persistent=False)  # 128 elements
    card = dataclasses.replace(small_card(), buffers=(table, rotary))
    # the dtype the weights are held in: workload.dtype, or weights_dtype where they are held in another
    for held, expected in (({"dtype": "bfloat16"}, 4096 * 2 + 128 * 4), ({"dtype": "float32"}, 4096 * 4 + 128 * 4),
                           ({"dtype": "bfloat16", "weights_dtype": "float32"}, 4096 * 4 + 128 * 4)):
        s = strategy(workload={"batch": 2, "height": 64, "width": 64, "text_tokens": 8, **held})
        without = memory_report(make_plan(s, small_card(), 8), s, usable_hbm=10**9, reserve=0).chips
        chips = memory_report(make_plan(s, card, 8), s, usable_hbm=10**9, reserve=0).chips
        assert {c.buffers for c in chips} == {expected} and {c.buffers for c in without} == {0}
        assert all(c.total - w.total == c.other - w.other == c.resident - w.resident == expected
                   for c, w in zip(chips, without))
        needed = without[0].resident + without[0].denoise
        tight = memory_report(make_plan(s, card, 8), s, usable_hbm=needed, reserve=0)
        assert fits_every_chip(tight, needed) is False
        assert fits_every_chip(memory_report(make_plan(s, small_card(), 8), s, usable_hbm=needed, reserve=0), needed)
