"""Collectives derived per layer from the plan."""

from collections import Counter

import pytest

from meshlab.core.errors import PlanError
from meshlab.core.hardware import load_hardware
from meshlab.cost.collectives import combine
from meshlab.cost.topology import collective_seconds, route
from meshlab.core.mesh import AbstractMesh

from tests.conftest import REPO, small_card
from tests.cost.helpers import PAIRS, predicted


def block_ops(p, block=0):
    return [c for c in p.collectives if c.block == block]


def norm_rows(ops):
    return [c for c in ops if c.phase.endswith(":rows")]


def test_column_row_pairs_need_one_all_reduce_each():
    p = predicted(rules=PAIRS)
    rows = norm_rows(block_ops(p))
    # the LayerNorms (2 per stream) gather their batch x tokens rows over data: 2 samples x 16 / 8 tokens x 64 x 2 B
    assert len(rows) == 4 and all(c.kind == "all-gather" and c.axes == ("data",) for c in rows)
    assert sorted(c.bytes for c in rows) == [2 * 8 * 64 * 2] * 2 + [2 * 16 * 64 * 2] * 2
    ops = [c for c in block_ops(p) if c not in rows]
    assert {c.kind for c in ops} == {"all-reduce"}
    # one per attention (image and text out-projections) and one per MLP, per stream: 4 in all
    assert len(ops) == 4 and all(c.axes == ("model",) for c in ops)
    # bytes: batch 1 per chip x tokens of the stream x width 64 x 2 bytes
    assert sorted(c.bytes for c in ops) == [8 * 64 * 2] * 2 + [16 * 64 * 2] * 2
    merged = combine(list(ops))  # a combiner would merge each stream pair at the same point
    assert len(merged) == 2 and sum(c.operands for c in merged) == 4
    assert [c.phase for c in p.collectives if c.block is None] == []  # no output norm in the small card


def test_identical_blocks_are_folded_but_counted():
    p = predicted(rules=PAIRS)
    assert {c.count for c in p.collectives} == {2}  # 2 blocks of the small card
    assert not block_ops(p, block=1)


def test_largest_keeps_chunks_split_and_gathers_at_every_consumer():
    p = predicted()
    kinds = Counter()
    for c in block_ops(p):
        kinds[c.kind] += c.operands
    # per stream: 2 LayerNorms x (features over model + rows over data); q, k, v, MLP-in gather their modulated
    # (model-split) input; the out-projection gathers the attention's head-split output. The out-projection's
    # model-split output joins a model-split residual: the next LayerNorm gathers it.
    assert kinds["all-gather"] == 2 * (2 * 2 + 3 + 1 + 1)
    assert kinds["all-reduce"] == 2  # MLP-out (largest dim is its input): row
    # modulation: 6 x 64 = 384 rows over 4 are 96-row shards; each 64-wide chunk wants 16 rows per chip, and
    # 18 of the 24 pieces are on another chip
    assert kinds["collective-permute"] == 2 * 18


def test_chunks_that_split_unevenly_are_gathered_whole():
    card = small_card(width=60, heads=4)  # 60-wide chunks over 8 chips: no even split
    p = predicted(card, mesh={"model": 8}, activations={},
                  rules=[{"match": "*_mod.1.weight", "shard": "largest", "axis": "model"}],
                  workload={"batch": 1, "height": 64, "width": 64, "text_tokens": 8})
    whole = [c for c in block_ops(p) if c.phase.startswith("img_mod.1:out") and c.kind == "all-gather"]
    assert len(whole) == 2 and not [c for c in p.collectives if c.kind == "collective-permute"]


def test_replicated_plan_gathers_only_layer_norm_rows():
    p = predicted(mesh={"data": 8}, rules=[], workload={"batch": 8, "height": 64, "width": 64, "text_tokens": 8})
    assert {(c.kind, c.axes, c.phase.split(":")[1]) for c in p.collectives} == {("all-gather", ("data",), "rows")}
    assert len(p.collectives) == 4  # 2 LayerNorms x 2 streams, in each (folded) block


def test_no_split_rows_no_collectives():
    assert predicted(mesh={"model": 8}, rules=[], activations={},
                     workload={"batch": 1, "height": 64, "width": 64, "text_tokens": 8}).collectives == ()


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
    # as 4x2, HybridMesh lays model's 2 along the 2-chip physical axis and data's 4 along the 4-chip one (a
    # row-major reshape of the device ids would make data strided)
    tall = AbstractMesh((("data", 4), ("model", 2)))
    assert (route(("data",), tall, hw).shape, route(("data",), tall, hw).hops) == ("line", 3)
    assert (route(("model",), tall, hw).shape, route(("model",), tall, hw).hops) == ("line", 1)


def test_a_mesh_axis_hybrid_mesh_lays_along_a_wrapped_physical_axis_is_a_ring():
    """v6e-128 is 8x16 with wraparound on its 16 side; a 16x8 mesh's 16 goes there (a row-major reshape would
    spread it over strided chips)."""
    hw = load_hardware("v6e-128")
    r = route(("data",), AbstractMesh((("data", 16), ("model", 8))), hw)
    assert (r.shape, r.hops, r.bandwidth) == ("ring", 8, 2 * hw.ici_link_bandwidth)


def test_all_reduce_costs_twice_an_all_gather():
    hw = load_hardware("v6e-8")
    r = route(("model",), AbstractMesh((("data", 2), ("model", 4))), hw)
    gather = collective_seconds("all-gather", 4e6, r, 0.0)
    assert gather == pytest.approx(3e6 / hw.ici_link_bandwidth)
    assert collective_seconds("all-reduce", 4e6, r, 0.0) == pytest.approx(2 * gather)


def test_flux_flops_and_pairs_collectives_against_hand_counts():
    """Flux-dev (19 dual-stream blocks, then 38 single-stream ones) against hand counts from its card's shapes."""
    from meshlab.models.card import load_card
    from meshlab.cost.predict import predict
    from meshlab.plan.planner import make_plan
    from tests.cost.helpers import strategy

    card = load_card("flux-dev")
    workload = {"batch": 2, "height": 1024, "width": 1024, "text_tokens": 512, "cfg": False}
    hw = load_hardware("v6e-8")

    # FLOPs of one call, one sample, by hand: w 3072, MLP 4w, 4096 image + 512 text tokens (J 4608 joint).
    # Dual block: per stream q, k, v, out (4 x 2w^2) and MLP (2 x 2 x 4w^2) per token; its two modulation
    # Linears w -> 6w once per sample; joint attention 4 J^2 w. Single block: q, k, v (3 x 2w^2), proj_mlp
    # (2 x 4w^2) and proj_out (2 x 5w x w) per joint token; modulation w -> 3w; attention 4 J^2 w. Outside:
    # timestep, guidance, text embedders (256, 256, 768 -> w, then w -> w), context_embedder 4096 -> w on the
    # text, x_embedder 64 -> w and proj_out w -> 64 on the image, norm_out w -> 2w.
    w, image, text = 3072, 4096, 512
    joint = image + text
    dual = 24 * w * w * joint + 2 * 2 * w * 6 * w + 4 * joint * joint * w
    single = 24 * w * w * joint + 2 * w * 3 * w + 4 * joint * joint * w
    outside = (2 * w * (256 + 256 + 768) + 3 * 2 * w * w + 2 * 4096 * w * text + 2 * 64 * w * image
               + 2 * w * 64 * image + 2 * w * 2 * w)
    forward = 19 * dual + 38 * single + outside
    assert forward == 74_384_653_418_496  # 74.4 TFLOP

    # largest dim over model (4), batch over data (2): every Linear and every attention's heads split 4 ways,
    # one sample per chip, one call per step (no guidance)
    s = strategy(workload=workload)
    p = predict(make_plan(s, card, 8), s, hw)
    assert p.model_flops_per_call == forward
    assert p.layout.calls == 1 and p.step.flops == forward / 4

    # column/row pairs: each attention and each MLP of a dual block ends in one all-reduce per stream (4); a
    # single block's attention and MLP meet in proj_out, one row Linear: 1. Each LayerNorm gathers its rows over
    # data: 2 per stream in a dual block, 1 in a single block. Modulation stays whole: no permutes.
    pairs = [
        {"match": "transformer_blocks.*.attn.to_[qkv].*", "shard": "column", "axis": "model"},
        {"match": "transformer_blocks.*.attn.add_[qkv]_proj.*", "shard": "column", "axis": "model"},
        {"match": "transformer_blocks.*.attn.to_out.0.*", "shard": "row", "axis": "model"},
        {"match": "transformer_blocks.*.attn.to_add_out.*", "shard": "row", "axis": "model"},
        {"match": "transformer_blocks.*.net.0.proj.*", "shard": "column", "axis": "model"},
        {"match": "transformer_blocks.*.net.2.*", "shard": "row", "axis": "model"},
        {"match": "single_transformer_blocks.*.attn.to_[qkv].*", "shard": "column", "axis": "model"},
        {"match": "single_transformer_blocks.*.proj_mlp.*", "shard": "column", "axis": "model"},
        {"match": "single_transformer_blocks.*.proj_out.*", "shard": "row", "axis": "model"},
    ]
    s = strategy(rules=pairs, workload=workload)
    p = predict(make_plan(s, card, 8), s, hw)
    first_single = 19
    reduces = {b: sorted(c.bytes for c in block_ops(p, b) if c.kind == "all-reduce") for b in (0, first_single)}
    # one sample per chip x the stream's tokens x w x 2 bytes, over model
    assert reduces == {0: [text * w * 2] * 2 + [image * w * 2] * 2, first_single: [joint * w * 2]}
    assert all(c.axes == ("model",) for c in p.collectives if c.kind == "all-reduce")
    assert [c.count for c in block_ops(p, 0) if c.kind == "all-reduce"] == [19] * 4
    assert [c.count for c in block_ops(p, first_single) if c.kind == "all-reduce"] == [38]
    assert sum(c.count for c in p.collectives if c.kind == "all-reduce") == 19 * 4 + 38 * 1
    rows = {b: sorted(c.bytes for c in norm_rows(block_ops(p, b))) for b in (0, first_single)}
    # both samples' rows: 2 x tokens x w x 2 bytes, over data
    assert rows == {0: [2 * text * w * 2] * 2 + [2 * image * w * 2] * 2, first_single: [2 * joint * w * 2]}
    assert not any(c.kind == "collective-permute" for c in p.collectives)


#: variants of matrix strategies whose residual splits differ between a block's gates, between blocks, or between
#: lists, each a rule put first: (strategy, rule)
RESIDUAL_VARIANTS = [
    ("cog-seq2-model4", "{match: 'transformer_blocks.*.norm1.linear.*', shard: replicate}"),  # norm2's decides
    ("cog-seq2-model4", "{match: 'transformer_blocks.*.norm2.linear.*', shard: replicate}"),
    ("hunyuan-seq2-model4", "{match: 'transformer_blocks.0.*', shard: replicate}"),  # the later blocks decide
    ("hunyuan-seq2-model4", "{match: 'single_transformer_blocks.0.*', shard: replicate}"),
    ("hunyuan-seq2-model4", "{match: 'single_transformer_blocks.*', shard: replicate}"),  # joint whole
    ("wan-2d", "{match: 'condition_embedder.time_proj.*', min_rank: 2, shard: largest, axis: data}"),  # gathered
    ("wan-2d", "{match: 'blocks.*', shard: replicate}"),  # time_proj outside the blocks decides
]


def test_planning_reads_the_residual_s_split_as_the_cost_model_derives_it(tmp_path):
    """The block.input rule planning adds keeps the image residual's feature split (meshlab.plan.planned
    residual_splits, from the gates' Linears), which the cost model derives from its graph (`_Deriver.residual`):
    the two agree on the image stream and the single blocks' joint one, and so on what the rule keeps, for every
    strategy of the repository and for variants where a block's two gates, two blocks, or the two lists differ."""
    import glob

    from meshlab.cost.collectives import residual_splits
    from meshlab.cost.graph import graph_of
    from meshlab.cost.layout import layout_of
    from meshlab.plan import planned
    from meshlab.plan.axes import activation_axes

    data = REPO / "tests" / "cost" / "data" / "strategies"
    files = sorted(glob.glob(str(REPO / "strategies" / "*.yaml")) + glob.glob(str(data / "*.yaml")))
    for i, (name, rule) in enumerate(RESIDUAL_VARIANTS):
        text = (data / f"{name}.yaml").read_text()
        (tmp_path / f"v{i}.yaml").write_text(text.replace("rules:\n", f"rules:\n  - {rule}\n", 1))
        files.append(str(tmp_path / f"v{i}.yaml"))
    kept = []
    for path in files:
        p = planned.plan_file(path)
        mesh = p.plan.mesh
        ours = planned.residual_splits(p.plan, activation_axes(p.strategy.activations, mesh))
        derived = residual_splits(graph_of(p.plan), layout_of(p.plan, p.strategy), mesh)
        real = {s: tuple(a for a in axes if mesh.size(a) > 1) for s, axes in derived.items()}
        assert (ours.get("image") or ()) == (real.get("image") or ()), path
        if "joint" in ours:
            assert ours["joint"] == (real.get("joint") or ()), path
        kept.append(planned.kept_residual_split(p.plan, p.strategy))
    assert sum(bool(k) for k in kept) >= 10  # largest-dim plans of several models among them
    assert kept[-len(RESIDUAL_VARIANTS):] == [("model",), (), ("model",), ("model",), (), (), ("model",)]
