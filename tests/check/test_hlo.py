"""The HLO parser, on excerpts of a real dump (one full-width Qwen-Image block under 2d.yaml) and on small cases."""

from __future__ import annotations

from collections import Counter
import re
from pathlib import Path

import pytest

from meshlab.check import hlo

DATA = Path(__file__).parent / "data"
MESH = (("data", 2), ("model", 4))


@pytest.fixture(scope="module")
def collectives():
    return hlo.parse_collectives((DATA / "qwen_2d_partitioned_excerpt.txt").read_text())


def test_counts_every_collective_of_the_dump_by_kind(collectives):
    # what spmd-on-cpu.md saw for one layer under largest-dim sharding: 3 all-reduce, 19 all-gather, 28 permutes
    assert Counter(c.kind for c in collectives) == {"all-reduce": 3, "all-gather": 19, "collective-permute": 28}


def test_maps_replica_groups_back_to_mesh_axes(collectives):
    by_axes = Counter((c.kind, hlo.mesh_axes(c.groups, MESH)) for c in collectives)
    assert by_axes == {("collective-permute", ("model",)): 28, ("all-gather", ("model",)): 15,
                       ("all-gather", ("data",)): 4, ("all-reduce", ("model",)): 3}


def test_reads_shapes_and_bytes_from_results_and_operands(collectives):
    first = collectives[0]
    assert first.kind == "all-gather"
    assert [str(s) for s in first.result] == ["f32[1,64,3072]"]
    assert [str(s) for s in first.operands] == ["f32[1,64,768]"]
    assert first.bytes_per_device == 64 * 3072 * 4
    assert all(c.operands for c in collectives)


def test_attributes_collectives_to_the_layer_meshlab_scoped(collectives):
    layers = Counter(c.layer for c in collectives)
    assert layers["transformer_blocks.0"] == 24  # the block's own modulation chunks: the permutes
    assert layers["transformer_blocks.0.img_mod.1"] == 1
    assert layers["transformer_blocks.0.img_mlp.net.2"] == 1
    assert None not in layers


@pytest.mark.parametrize("op_name, layer", [
    ("transformer_blocks.0#.7/transformer_blocks.0.img_mod.1#.2/aten__addmm", "transformer_blocks.0.img_mod.1"),
    ("transformer_blocks.0#.7/aten__split", "transformer_blocks.0"),
    ("single_transformer_blocks.3#/aten__mm", "single_transformer_blocks.3"),
    ("aten__add.1/aten__add", None),  # XLA's own scope, not meshlab's
    (None, None),
    # an op XLA made of two (LTX-Video's modulation all-to-alls under 2d, XLA:TPU): the first name's scope
    ("transformer_blocks.1#.97/aten__add.5/aten__add;transformer_blocks.1#.97/aten__view", "transformer_blocks.1"),
    ("aten__add.1/aten__add;blocks.2#.4/aten__view", "blocks.2"),
])
def test_layer_of(op_name, layer):
    assert hlo.layer_of(op_name) == layer


def test_parses_the_buffer_assignment_by_kind():
    memory = hlo.parse_buffer_assignment((DATA / "qwen_2d_buffer_assignment_excerpt.txt").read_text())
    assert memory.total == 305_657_163
    assert memory.parameters + memory.temporaries + memory.outputs + memory.constants == memory.total
    assert memory.parameters == 150_213_016
    assert memory.outputs == 8_200


def test_buffer_assignment_without_a_total_sums_its_allocations():
    text = ("allocation 0: size 64, parameter 0, shape |f32[16]| at ShapeIndex {}:\n"
            "allocation 1: size 32, maybe-live-out:\nallocation 2: size 100, preallocated-temp:\n"
            "allocation 3: size 8, output shape is |(f32[2])|, maybe-live-out:\nallocation 4: size 4, constant:\n"
            "allocation 5: size 4, thread-local:\n")
    assert hlo.parse_buffer_assignment(text) == hlo.XlaMemory(64, 104, 40, 4, 212)


@pytest.mark.parametrize("text, tiles, replicas, devices", [
    ("{devices=[4,1,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}", (4, 1), 2, (0, 4, 1, 5, 2, 6, 3, 7)),
    ("{devices=[4,1,2]<=[2,4]T(1,0) last_tile_dim_replicate}", (4, 1), 2, (0, 4, 1, 5, 2, 6, 3, 7)),
    ("{devices=[8,1]0,1,2,3,4,5,6,7}", (8, 1), 1, tuple(range(8))),
    ("{devices=[2,4]<=[8]}", (2, 4), 1, tuple(range(8))),
    ("{replicated}", (1, 1), 8, tuple(range(8))),
    ("", (1, 1), 8, tuple(range(8))),
])
def test_parses_shardings(text, tiles, replicas, devices):
    sharding = hlo.parse_sharding(text, 2, 8)
    assert (sharding.tiles, sharding.replicas, sharding.devices) == (tiles, replicas, devices)


def test_shard_shapes_are_padded_as_xla_pads_them():
    sharding = hlo.parse_sharding("{devices=[4,1,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}", 2, 8)
    assert sharding.shard_shape((18432, 3072)) == (4608, 3072)
    assert sharding.shard_shape((10, 6)) == (3, 6)


def test_rejects_a_sharding_of_another_rank():
    with pytest.raises(ValueError, match="rank"):
        hlo.parse_sharding("{devices=[4,1,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}", 3, 8)


@pytest.mark.parametrize("line, groups", [
    ("replica_groups={{0,1,2,3},{4,5,6,7}}, dimensions={2}", ((0, 1, 2, 3), (4, 5, 6, 7))),
    ("replica_groups=[2,4]<=[8], dimensions={1}", ((0, 1, 2, 3), (4, 5, 6, 7))),
    ("replica_groups=[4,2]<=[2,4]T(1,0), dimensions={1}", ((0, 4), (1, 5), (2, 6), (3, 7))),
    ("source_target_pairs={{0,1},{1,2},{4,5}}", ((0, 1), (1, 2), (4, 5))),
    ("replica_groups={}, to_apply=%add", ()),
])
def test_reads_every_form_of_replica_groups(line, groups):
    text = f"  %x = f32[4]{{0}} parameter(0)\n  %ar = f32[4]{{0}} all-reduce(%x), {line}\n"
    (collective,) = hlo.parse_collectives(text)
    assert collective.groups == groups


@pytest.mark.parametrize("groups, axes", [
    (((0, 4), (1, 5), (2, 6), (3, 7)), ("data",)),
    (((0, 1, 2, 3), (4, 5, 6, 7)), ("model",)),
    (((0, 1), (1, 2), (4, 5), (5, 6)), ("model",)),
    ((), ("data", "model")),
])
def test_mesh_axes(groups, axes):
    assert hlo.mesh_axes(groups, MESH) == axes


def test_mesh_axes_follow_a_device_order_that_is_not_row_major():
    # a topology-ordered mesh: position p holds device ids[p]; devices 0 and 1 differ along "data" here
    ids = (0, 2, 4, 6, 1, 3, 5, 7)
    assert hlo.mesh_axes(((0, 1), (2, 3)), MESH, ids) == ("data",)


def test_async_collectives_are_counted_once_with_their_results():
    text = ("  %p = bf16[8,16]{1,0} parameter(0)\n"
            "  %ags = (bf16[8,16]{1,0}, bf16[32,16]{1,0}) all-gather-start(%p), replica_groups={{0,1,2,3}}, "
            "dimensions={0}\n"
            "  %agd = bf16[32,16]{1,0} all-gather-done(%ags)\n"
            "  %cps = (bf16[8,16]{1,0}, bf16[8,16]{1,0}, u32[], u32[]) collective-permute-start(%p), "
            "source_target_pairs={{0,1},{1,0}}\n")
    gather, permute = hlo.parse_collectives(text)
    assert (gather.kind, [str(s) for s in gather.result]) == ("all-gather", ["bf16[32,16]"])
    assert (permute.kind, [str(s) for s in permute.result]) == ("collective-permute", ["bf16[8,16]"])
    assert gather.bytes_per_device == 32 * 16 * 2


def test_tuple_shaped_collectives_sum_their_bytes():
    text = ("  %a = f32[4]{0} parameter(0)\n  %b = f32[8]{0} parameter(1)\n"
            "  %ar = (f32[4]{0}, f32[8]{0}) all-reduce(%a, %b), replica_groups={{0,1}}, to_apply=%add\n")
    (collective,) = hlo.parse_collectives(text)
    assert collective.bytes_per_device == 48


# --- XLA:TPU's optimized programs (compiled ahead of time for real topologies through libtpu, jax 0.10.2) -------


def test_an_async_collective_fusion_counts_once_and_is_async():
    """v5e:2x4, x [8,512,2048] over data, w [2048,2048] with its input dim over model, an all-gather of w's
    second dim over data: XLA:TPU copies the all-gather into the start and done computations of an async
    collective fusion (one channel_id); it is one all-gather, async, beside one synchronous all-reduce."""
    found = hlo.parse_collectives((DATA / "tpu_v5e_async_all_gather.txt").read_text())
    assert [(c.kind, c.asynchronous) for c in found] == [("all-gather", True), ("all-reduce", False)]
    gather, reduce = found
    assert gather.groups == ((0, 4), (1, 5), (2, 6), (3, 7)) and hlo.mesh_axes(gather.groups, MESH) == ("data",)
    assert gather.bytes_per_device == 1024 * 1024 * 2  # bf16[1024,1024] gathered
    assert hlo.mesh_axes(reduce.groups, MESH) == ("model",)


def test_reduce_scatter_fusions_mesh_groups_and_permutes_of_a_tpu_program():
    """v6e:2x4, x [8,512,2048] (batch over data, features over model) times w [2048,2048] (rows over model),
    the product constrained to tokens over model (a reduce-scatter), then to features over model (an
    all-to-all), then shifted one step around model (a collective-permute)."""
    found = hlo.parse_collectives((DATA / "tpu_v6e_reduce_scatter_all_to_all.txt").read_text())
    assert [(c.kind, c.asynchronous) for c in found] == [
        ("reduce-scatter", False), ("all-to-all", False), ("collective-permute", True)]
    scatter, to_all, permute = found
    per_device_in = 4 * 512 * 2048 * 2  # this chip's partial product, bf16
    assert [str(s) for s in scatter.result] == ["bf16[4,128,2048]"] and scatter.bytes_per_device == per_device_in
    assert to_all.groups == ((0, 1, 2, 3), (4, 5, 6, 7))  # written mesh['axis_0'=2,'axis_1'=4] {'axis_1'}
    assert {hlo.mesh_axes(c.groups, MESH) for c in found} == {("model",)}
    assert to_all.bytes_per_device == 4 * 128 * 2048 * 2 and permute.bytes_per_device == 4 * 512 * 512 * 2
    assert all(c.layer == "blk" for c in found)  # the reduce-scatter named by the fusion that calls it


def test_two_reduce_scatter_fusions_with_one_channel_id_are_two_collectives():
    """XLA:TPU numbered both blocks' fused MLP sums channel 1 (sd35-2d.yaml at 128 text tokens): each fusion is its
    own reduce-scatter, not an async fusion's copy of one."""
    found = hlo.parse_collectives((DATA / "tpu_sd35_two_reduce_scatter_fusions.txt").read_text())
    assert [(c.kind, c.layer) for c in found] == [("reduce-scatter", "transformer_blocks.0.ff.net.2"),
                                                  ("reduce-scatter", "transformer_blocks.1.ff.net.2")]
    assert {c.bytes_per_device for c in found} == {(256 + 128) * 2432 * 2}  # image and text sums, bf16, whole


def test_a_combined_collective_belongs_to_the_block_that_gives_it_most_of_its_bytes():
    """XLA:TPU's combiner named block 1's text MLP sum, combined with two modulation sums, after block 0's silu, its
    first operand (sd35-2d.yaml at its workload): the op is block 1's, whose fusion made 1,619,712 of its 1,629,440
    bytes; the moves before the modulation operands (async copies) name nothing."""
    (c,) = hlo.parse_collectives((DATA / "tpu_sd35_combined_across_blocks.txt").read_text())
    assert c.op_name.startswith("transformer_blocks.1#") and c.layer == "transformer_blocks.1.ff_context.net.2"
    assert c.bytes_per_device == (2 * 2432 + 333 * 2432) * 2


def test_a_combined_collective_of_equal_operands_or_an_unscoped_largest_keeps_its_own_name_and_none_is_given_one():
    own = 'metadata={op_name="a#.1/a.x#.2/aten__silu"}'
    made = ('%f = bf16[8]{0} fusion(%p), kind=kLoop, calls=%c, metadata={op_name="b#.1/b.y#.2/aten__mm"}\n'
            '%g = bf16[64]{0} fusion(%p), kind=kLoop, calls=%c\n'  # computes, unscoped: nothing to follow
            '%h = bf16[64]{0} bitcast(%g)\n')
    tie = made + f"%all-reduce.1 = (bf16[8]{{0}}, bf16[8]{{0}}) all-reduce(%e, %f), channel_id=1, {own}"
    unscoped = made + f"%all-reduce.2 = (bf16[8]{{0}}, bf16[64]{{0}}) all-reduce(%f, %h), channel_id=2, {own}"
    larger = made + f"%all-reduce.3 = (bf16[4]{{0}}, bf16[8]{{0}}) all-reduce(%e, %f), channel_id=3, {own}"
    shapes = "%e = bf16[8]{0} parameter(0)\n"
    assert hlo.parse_collectives(shapes + tie)[0].layer == "a.x"
    assert hlo.parse_collectives(shapes + unscoped)[0].layer == "a.x"
    assert hlo.parse_collectives(shapes.replace("[8]", "[4]") + larger)[0].layer == "b.y"
    # one XLA left unnamed (a multi-slice program's) stays unnamed, whoever made its operands
    assert hlo.parse_collectives(shapes.replace("[8]", "[4]") + larger.replace(own, ""))[0].layer is None


def test_a_combined_collective_is_named_through_tuples_and_fusion_parameters_but_not_a_fusion_s_other_outputs():
    """A multi-output fusion names its root, not each element: an unscoped element of one is named by no one (the
    collective keeps its own name). A tuple's element is its operand's; a fused computation's parameter is what its
    caller passes (an async collective fusion's all-reduce, which reads its operands as parameters)."""
    own = 'metadata={op_name="a#.1/a.x#.2/aten__silu"}'
    text = ('%e = bf16[4]{0} parameter(0)\n'
            '%m = (bf16[8]{0}, bf16[4]{0}) fusion(%e), kind=kLoop, calls=%c, '
            'metadata={op_name="c#.1/c.z#.2/aten__mm"}\n'
            '%g = bf16[8]{0} get-tuple-element(%m), index=0\n'
            '%f = bf16[8]{0} fusion(%e), kind=kLoop, calls=%d, metadata={op_name="b#.1/b.y#.2/aten__mm"}\n'
            '%t = (bf16[4]{0}, bf16[8]{0}) tuple(%e, %f)\n'
            '%u = bf16[8]{0} get-tuple-element(%t), index=1\n')
    element = text + f"%all-reduce.1 = (bf16[4]{{0}}, bf16[8]{{0}}) all-reduce(%e, %g), channel_id=1, {own}"
    tupled = text + f"%all-reduce.2 = (bf16[4]{{0}}, bf16[8]{{0}}) all-reduce(%e, %u), channel_id=2, {own}"
    fused = text + ("%s = (bf16[4]{0}, bf16[8]{0}) fusion(%e, %f), kind=kLoop, calls=%ar\n"
                    "%ar (p0: bf16[4], p1: bf16[8]) -> (bf16[4], bf16[8]) {\n"
                    "  %p0 = bf16[4]{0} parameter(0)\n  %p1 = bf16[8]{0} parameter(1)\n"
                    f"  ROOT %all-reduce.3 = (bf16[4]{{0}}, bf16[8]{{0}}) all-reduce(%p0, %p1), channel_id=3, {own}\n"
                    "}\n")
    assert hlo.parse_collectives(element)[0].layer == "a.x"
    assert hlo.parse_collectives(tupled)[0].layer == "b.y"
    assert hlo.parse_collectives(fused)[0].layer == "b.y"


def test_mesh_replica_groups_with_device_ids():
    line = ("%all-reduce.3 = bf16[1,64]{1,0} all-reduce(%x), channel_id=2, replica_groups=mesh['axis_0'=2,"
            "'axis_1'=4], device_ids=(0,1,2,3,7,6,5,4) {'axis_1'}, use_global_device_ids=true")
    (c,) = hlo.parse_collectives(line)
    assert c.groups == ((0, 1, 2, 3), (7, 6, 5, 4))
    assert hlo.mesh_axes(c.groups, MESH, (0, 1, 2, 3, 7, 6, 5, 4)) == ("model",)
    assert hlo.mesh_groups((("a", 2), ("b", 2), ("c", 2)), ("a", "c")) == ((0, 1, 4, 5), (2, 3, 6, 7))


def test_a_weight_gather_named_after_its_argument_belongs_to_the_weight_s_module():
    """jax names an FSDP gather of a weight argument ``params['<parameter>']`` (escaped in the HLO text)."""
    line = ("%all-gather.1 = bf16[18432,3072]{1,0} all-gather(%copy-done.2), channel_id=2, replica_groups=mesh["
            "'axis_0'=8] {'axis_0'}, dimensions={0}, metadata={op_name=\"params[\\'transformer_blocks.0.img_mod.1."
            "weight\\']\"}")
    (c,) = hlo.parse_collectives(line)
    assert c.layer == "transformer_blocks.0.img_mod.1" and c.groups == ((0, 1, 2, 3, 4, 5, 6, 7),)


def test_every_xla_element_type_is_sized_and_an_unknown_one_is_refused():
    shapes = hlo.array_shapes("(f8e4m3fn[2,3]{1,0}, s4[5], f4e2m1fn[3], f8e8m0fnu[4], f8e4m3b11fnuz[2], pred[7])")
    assert [s.bytes for s in shapes] == [6, 3, 2, 4, 2, 7]  # s4 and f4 pack two to a byte
    with pytest.raises(hlo.UnknownElementType, match="'f9e9'"):
        hlo.array_shapes("f9e9[3]")


def test_the_temporaries_live_at_once_count_overlapping_values_of_the_device_temp_buffer_only():
    """XLA's formats: a value's offset and size from the buffer assignment, its live range (inclusive) from the
    live-range dump, where a value that is not a tuple's element is written ``name{}``; values sharing bytes count
    once; other memory spaces (color N) and allocations that are not the temp buffer are left out."""
    from meshlab.check.hlo import temporaries_live_peak

    assignment = (
        "allocation 0: size 64, page 0, parameter 0, shape |f32[16]| at ShapeIndex {}:\n"
        " value: <1 param.0 @0> (size=64,offset=0): f32[16]{0}\n"
        "allocation 1: size 300, page 0, preallocated-temp:\n"
        " value: <2 scores @0> (size=200,offset=0): f32[50]{0}\n"
        " value: <3 exp{1} @0> (size=100,offset=200): f32[25]{0}\n"
        " value: <4 later @0> (size=150,offset=0): f32[37]{0}\n"
        " value: <6 in_place @0> (size=200,offset=0): f32[50]{0}\n"
        "allocation 2: size 999, color 1, page 0, preallocated-temp:\n"
        " value: <5 scratch @1> (size=999,offset=0): f32[249]{0}\n")
    live = ("HloLiveRange (max 9):\n  BufferLiveRange:\n    param.0{}:0-9\n    scores{}:1-3\n    exp{1}:3-5\n"
            "    later{}:4-8\n    scratch{}:0-9\n    in_place{}:2-3\n  Live ranges at 3 (peak):\n")
    # scores and exp at 3 (in_place shares the scores' bytes: counted once); exp and later at 4-5 is 250
    assert temporaries_live_peak(assignment, live) == 300
    assert temporaries_live_peak(assignment, "no ranges") is None


def test_xla_tpu_s_temp_buffer_holds_at_least_what_is_live_at_once():
    """SANA 2d's XLA:TPU program (two blocks, 256², v6e:2x4; its dumps, gzipped): 1.9 MB of its temporaries are
    live at once, in a 4.59 MB temp buffer (memory_analysis() reported 4,603,904 temp bytes)."""
    import gzip

    from meshlab.check.hlo import temporaries_live_peak

    data = Path(__file__).parent / "data"
    assignment = gzip.open(data / "tpu_sana-2d.buffer-assignment.txt.gz", "rt").read()
    live_range = gzip.open(data / "tpu_sana-2d.live-range.txt.gz", "rt").read()
    temp = re.search(r"^allocation \d+: size (\d+), page 0, preallocated-temp:\n((?: .*\n)*)", assignment, re.M)
    assert int(temp.group(1)) == 4_587_552  # memory_analysis()'s temp bytes add the small ones of other colors
    largest = max(int(s) for s in re.findall(r"size=(\d+)", temp.group(2)))
    peak = temporaries_live_peak(assignment, live_range)
    assert largest <= peak <= int(temp.group(1)) and peak == 1_903_968


def test_the_bytes_of_each_memory_space_are_read_from_xla_s_memory_usage_report():
    """2d's XLA:TPU program (3 blocks, 256², v6e:2x4; its memory-usage report, gzipped): HBM ('default') holds the
    arguments and a 7.6 MiB temp buffer, and 86.5 MiB sit in the TensorCore's VMEM, where its memory-space
    assignment kept the temporaries and streamed the weight slices (the HBM temporaries live at once: 18,752 B)."""
    import gzip

    from meshlab.check.hlo import memory_space_bytes, on_chip_colors

    report = gzip.open(Path(__file__).parent / "data" / "tpu_2d_256.memory-usage-report.txt.gz", "rt").read()
    assert memory_space_bytes(report) == {"default": 500_986_400, "vmem": 90_690_048, "smem": 80, "host": 2048,
                                          "color_6": 4096}
    assert memory_space_bytes("no report") == {}
    assert on_chip_colors(report) == {1} and on_chip_colors("no report") == frozenset()


def test_the_working_set_counts_vmem_s_temporaries_but_not_the_weights_prefetched_there():
    """XLA:TPU's memory-space assignment keeps a small working set in VMEM (color 1) and prefetches weights there,
    whole (copy-start/copy-done) or in slices it joins again (async slices and a ConcatBitcast custom-call): the
    working set counts HBM's temporaries and VMEM's, not a VMEM value that is only an argument moved, and not one
    in another memory space."""
    from meshlab.check.hlo import (PeakHolding, argument_copies, temporaries_live_peak, working_set_live_peak,
                                   working_set_peak)

    program = """HloModule m

%async_computation.1 (param_0.1: s8[64]) -> s8[32] {
  %param_0.1 = s8[64]{0} parameter(0)
  ROOT %slice.1 = s8[32]{0:S(1)} slice(s8[64]{0} %param_0.1), slice={[0:32]}
}

%fused (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  ROOT %e = f32[8]{0} exponential(f32[8]{0} %p)
}

ENTRY %main (param.0: bf16[4,8], param.1: f32[8]) -> f32[8] {
  %param.0 = bf16[4,8]{1,0} parameter(0)
  %param.1 = f32[8]{0} parameter(1)
  %copy-start.1 = (bf16[4,8]{1,0:S(1)}, bf16[4,8]{1,0}, u32[]{:S(2)}) copy-start(bf16[4,8]{1,0} %param.0)
  %copy-done.1 = bf16[4,8]{1,0:S(1)} copy-done((bf16[4,8]{1,0:S(1)}, bf16[4,8]{1,0}, u32[]{:S(2)}) %copy-start.1)
  %bitcast.1 = s8[64]{0} bitcast(bf16[4,8]{1,0} %param.0)
  %slice-start.1 = ((s8[64]{0}), s8[32]{0:S(1)}, s32[]{:S(2)}) async-start(%bitcast.1), calls=%async_computation.1
  %slice-done.1 = s8[32]{0:S(1)} async-done(((s8[64]{0}), s8[32]{0:S(1)}, s32[]{:S(2)}) %slice-start.1)
  %custom-call.1 = bf16[2,8]{1,0:S(1)} custom-call(s8[32]{0:S(1)} %slice-done.1), custom_call_target="ConcatBitcast"
  %fusion.1 = f32[8]{0:S(1)} fusion(f32[8]{0} %param.1), kind=kLoop, calls=%fused
  %copy-start.2 = (f32[8]{0}, f32[8]{0:S(1)}, u32[]{:S(2)}) copy-start(f32[8]{0:S(1)} %fusion.1)
  %copy-done.2 = f32[8]{0} copy-done((f32[8]{0}, f32[8]{0:S(1)}, u32[]{:S(2)}) %copy-start.2)
  ROOT %fusion.2 = f32[8]{0} fusion(f32[8]{0} %copy-done.2), kind=kLoop, calls=%fused
}
"""
    copies = argument_copies(program)
    assert {"param.0", "copy-start.1", "copy-done.1", "bitcast.1", "slice-start.1", "slice-done.1", "slice.1",
            "custom-call.1"} <= copies
    assert not copies & {"fusion.1", "copy-start.2", "copy-done.2", "fusion.2", "e"}  # computed, and its eviction
    assignment = (
        "allocation 0: size 40, page 0, preallocated-temp:\n"
        " value: <1 copy-done.2 @0> (size=32,offset=0): f32[8]{0}\n"
        "allocation 1: size 200, color 1, page 0, preallocated-temp:\n"
        " value: <2 copy-done.1 @1> (size=64,offset=0): bf16[4,8]{1,0:S(1)}\n"
        " value: <3 custom-call.1 @1> (size=32,offset=64): bf16[2,8]{1,0:S(1)}\n"
        " value: <4 slice.1 @1> (size=32,offset=96): s8[32]{0:S(1)}\n"
        " value: <5 fusion.1 @1> (size=32,offset=0): f32[8]{0:S(1)}\n"  # the same offset as HBM's: apart
        "allocation 2: size 512, color 2, page 0, preallocated-temp:\n"
        " value: <6 fusion.2 @2> (size=512,offset=0): f32[8]{0}\n")
    live = ("HloLiveRange (max 9):\n  BufferLiveRange:\n    copy-done.2{}:5-8\n    copy-done.1{}:1-9\n"
            "    custom-call.1{}:2-9\n    slice.1{}:1-2\n    fusion.1{}:3-6\n    fusion.2{}:8-9\n")
    assert temporaries_live_peak(assignment, live) == 32  # HBM's: the eviction
    assert working_set_live_peak(assignment, live, {1}, program) == 64  # and VMEM's computed value beside it, 5-6
    peak = working_set_peak(assignment, live, {1}, program)
    assert peak.bytes == 64 and set(peak.holdings) == {PeakHolding("hbm", "f32[8]", "copy of fusion", 1, 32),
                                                      PeakHolding("vmem", "f32[8]", "fusion", 1, 32)}
    assert working_set_peak(assignment, "no ranges", {1}, program) is None


def test_2d_s_small_working_set_sits_in_vmem_beside_the_weights_prefetched_there():
    """2d's XLA:TPU program (3 blocks, 256², v6e:2x4; its dumps, gzipped): HBM holds 18,752 B of temporaries at
    once, HBM and VMEM 7,011,200 B of them, less the weights prefetched into VMEM (copies of parameters, whole or
    sliced and joined by a ConcatBitcast), which are most of its 86.5 MiB there; a bias sliced per chip is a weight,
    a reduced gather is not."""
    import gzip

    from meshlab.check.hlo import (PeakHolding, argument_copies, temporaries_live_peak, working_set_live_peak,
                                   working_set_peak)

    data = Path(__file__).parent / "data"
    assignment, live_range, program = (gzip.open(data / f"tpu_2d_256.{what}.txt.gz", "rt").read()
                                       for what in ("buffer-assignment", "live-range", "after_optimizations"))
    copies = argument_copies(program)
    assert {"custom-call.24", "copy-start", "slice-start.66", "slice.377", "dynamic-slice.429"} <= copies
    assert "reduce.248" not in copies and "copy-start.6" not in copies  # a gather reduced, and its copy
    assert temporaries_live_peak(assignment, live_range) == 18_752
    assert working_set_live_peak(assignment, live_range, {1}, program) == 7_011_200
    # what it holds then, by kind: all of the peak's bytes, each named by its module and op, block number as "*"
    peak = working_set_peak(assignment, live_range, {1}, program, top=100)
    assert sum(h.bytes for h in peak.holdings) == peak.bytes == 7_011_200 and len(peak.holdings) == 37
    assert PeakHolding("vmem", "bf16[1,256,3072]", "transformer_blocks.*: all-gather", 1, 1_572_864) in peak.holdings
    assert PeakHolding("vmem", "f32[1,256,768]", "transformer_blocks.*.attn.to_q: mm", 2, 1_572_864) in peak.holdings
    assert len(working_set_peak(assignment, live_range, {1}, program).holdings) == 8  # the largest, by default


def test_the_working_set_is_read_module_by_module():
    """working_set_by_module on the same program: each module's own peak, where one of its ops runs, with what is
    held then; the largest is the program's peak (there, to_q's matmul), and the others are below it."""
    import gzip

    from meshlab.check.hlo import working_set_by_module, working_set_peak

    data = Path(__file__).parent / "data"
    assignment, live_range, program = (gzip.open(data / f"tpu_2d_256.{what}.txt.gz", "rt").read()
                                       for what in ("buffer-assignment", "live-range", "after_optimizations"))
    phases = working_set_by_module(assignment, live_range, {1}, program, top=100)
    peak = working_set_peak(assignment, live_range, {1}, program)
    assert list(phases)[:4] == ["transformer_blocks.*.attn.to_q", "transformer_blocks.*.img_mlp.net.0.proj",
                                "transformer_blocks.*.attn.norm_q", "transformer_blocks.*.attn"]
    assert phases["transformer_blocks.*.attn.to_q"] == working_set_peak(assignment, live_range, {1}, program, top=100)
    assert peak.bytes == 7_011_200
    assert phases["transformer_blocks.*.img_mlp.net.0.proj"].bytes == 6_277_248
    assert all(p.bytes == sum(h.bytes for h in p.holdings) <= peak.bytes for p in phases.values())
    assert len(phases) == 37 and all("copy of" not in module and ":" not in module for module in phases)


def test_v4_s_small_working_set_sits_in_its_cmem_which_xla_s_report_names_hbm():
    """2d's rules on v4-8 (3 blocks, 256², 32 text tokens; its dumps, gzipped): v4's buffer assignment has no VMEM
    color; its memory-space assignment fills color 3, which XLA's report names 'hbm' but which is v4's 128 MiB CMEM
    (127.95 MiB placed there; the arguments sit in 'default'). HBM holds 3.0 MiB of temporaries at once, HBM and
    CMEM 12.4 MiB, less the weights prefetched into CMEM (126.0 MiB of them at once). A color 3 under another name
    is not taken for CMEM."""
    import gzip

    from meshlab.check.hlo import (_live_peak, argument_copies, memory_space_bytes, on_chip_colors,
                                   temporaries_live_peak, working_set_live_peak, working_set_peak)

    data = Path(__file__).parent / "data"
    report, assignment, live_range, program = (
        gzip.open(data / f"tpu_v4_2d_256.{what}.txt.gz", "rt").read()
        for what in ("memory-usage-report", "buffer-assignment", "live-range", "after_optimizations"))
    spaces = memory_space_bytes(report)
    assert spaces["cmem"] == 134_160_896 <= 128 * 2**20 and "hbm" not in spaces and "vmem" not in spaces
    assert on_chip_colors(report) == {3}
    elsewhere = report.replace("Memory Space: hbm (color=3)", "Memory Space: pinned (color=3)")
    assert on_chip_colors(elsewhere) == frozenset() and "cmem" not in memory_space_bytes(elsewhere)
    assert temporaries_live_peak(assignment, live_range) == 3_158_528
    assert working_set_live_peak(assignment, live_range, {1}, program) == 3_158_528  # color 1 alone: none on v4
    assert working_set_live_peak(assignment, live_range, on_chip_colors(report), program) == 12_982_272
    scores = working_set_peak(assignment, live_range, on_chip_colors(report), program).holdings[:2]
    assert {(h.memory_space, h.shape, h.made_by) for h in scores} == {  # the scores and probabilities, in CMEM
        ("cmem", "f32[12,288,288]", "transformer_blocks.*.attn: matmul"),
        ("cmem", "f32[12,288,288]", "transformer_blocks.*.attn: softmax")}
    copies = argument_copies(program)
    assert {"slice.248", "slice.272"} <= copies  # weight slices prefetched into CMEM
    prefetched = _live_peak(assignment, live_range, lambda color, name: color == 3 and name.partition("{")[0] in copies)
    assert prefetched == 132_161_536  # 126.0 MiB of weights at once, not temporaries


def test_a_loop_s_state_passed_on_unchanged_and_an_async_dynamic_slice_of_a_weight_are_copies():
    """torch_xla's scan carries the stacked block weights in a while loop's state, which its body passes on
    unchanged (moved at most: here through a VMEM copy and back): their slices in VMEM, by a dynamic-slice or by a
    fusion that only slices, are not more temporaries (the state holds them), while the hidden state the body
    computes is. An async dynamic-slice of a weight, whose index is computed, is a copy of the weight."""
    from meshlab.check.hlo import argument_copies

    program = """HloModule m

%async_computation.1 (param_0.1: bf16[4,8], param_1.1: s32[]) -> bf16[1,8] {
  %param_0.1 = bf16[4,8]{1,0} parameter(0)
  %param_1.1 = s32[] parameter(1)
  ROOT %dynamic-slice.1 = bf16[1,8]{1,0:S(1)} dynamic-slice(bf16[4,8]{1,0} %param_0.1, s32[] %param_1.1)
}

%slicer (p0: bf16[3,8,8], p1: s32[]) -> bf16[8,8] {
  %p0 = bf16[3,8,8]{2,1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %zero = s32[] constant(0)
  %cut = bf16[1,8,8]{2,1,0} dynamic-slice(%p0, %p1, %zero, %zero), dynamic_slice_sizes={1,8,8}
  ROOT %flat = bf16[8,8]{1,0:S(1)} bitcast(%cut)
}

%body (state: (s32[], bf16[8], bf16[3,8,8])) -> (s32[], bf16[8], bf16[3,8,8]) {
  %state = (s32[], bf16[8], bf16[3,8,8]) parameter(0)
  %i = s32[] get-tuple-element((s32[], bf16[8], bf16[3,8,8]) %state), index=0
  %h = bf16[8]{0} get-tuple-element((s32[], bf16[8], bf16[3,8,8]) %state), index=1
  %w = bf16[3,8,8]{2,1,0} get-tuple-element((s32[], bf16[8], bf16[3,8,8]) %state), index=2
  %copy-start.9 = (bf16[3,8,8]{2,1,0:S(1)}, bf16[3,8,8]{2,1,0}, u32[]{:S(2)}) copy-start(bf16[3,8,8]{2,1,0} %w)
  %copy-done.9 = bf16[3,8,8]{2,1,0:S(1)} copy-done(%copy-start.9)
  %slice.9 = bf16[1,8,8]{2,1,0:S(1)} dynamic-slice(bf16[3,8,8]{2,1,0:S(1)} %copy-done.9, s32[] %i, s32[] %i, s32[] %i)
  %one = bf16[8,8]{1,0:S(1)} fusion(%w, %i), kind=kLoop, calls=%slicer
  %next = bf16[8]{0:S(1)} fusion(bf16[8]{0} %h, bf16[1,8,8]{2,1,0:S(1)} %slice.9), kind=kLoop, calls=%fused
  %back = bf16[3,8,8]{2,1,0} bitcast(bf16[3,8,8]{2,1,0:S(1)} %copy-done.9)
  %j = s32[] add(s32[] %i, s32[] %i)
  ROOT %out = (s32[], bf16[8], bf16[3,8,8]) tuple(s32[] %j, bf16[8]{0:S(1)} %next, bf16[3,8,8]{2,1,0} %back)
}

%fused (a: bf16[8], b: bf16[1,8,8]) -> bf16[8] {
  %a = bf16[8]{0} parameter(0)
  ROOT %r = bf16[8]{0} add(bf16[8]{0} %a, bf16[8]{0} %a)
}

ENTRY %main (param.0: bf16[4,8], param.1: bf16[8], param.2: s32[]) -> bf16[8] {
  %param.0 = bf16[4,8]{1,0} parameter(0)
  %param.1 = bf16[8]{0} parameter(1)
  %param.2 = s32[] parameter(2)
  %index = s32[] add(s32[] %param.2, s32[] %param.2)
  %slice-start.1 = ((bf16[4,8], s32[]), bf16[1,8]{1,0:S(1)}) async-start(%param.0, %index), calls=%async_computation.1
  %slice-done.1 = bf16[1,8]{1,0:S(1)} async-done(%slice-start.1)
  %stacked = bf16[3,8,8]{2,1,0} fusion(bf16[4,8]{1,0} %param.0), kind=kLoop, calls=%fused
  %init = (s32[], bf16[8], bf16[3,8,8]) tuple(s32[] %index, bf16[8]{0} %param.1, bf16[3,8,8]{2,1,0} %stacked)
  %loop = (s32[], bf16[8], bf16[3,8,8]) while((s32[], bf16[8], bf16[3,8,8]) %init), condition=%cond, body=%body
  ROOT %h.out = bf16[8]{0} get-tuple-element((s32[], bf16[8], bf16[3,8,8]) %loop), index=1
}
"""
    copies = argument_copies(program)
    assert {"slice-start.1", "slice-done.1", "dynamic-slice.1"} <= copies  # the weight's slice: its index computed
    assert {"w", "copy-start.9", "copy-done.9", "slice.9", "back", "one"} <= copies  # the state passed on, its copies
    assert not copies & {"index", "stacked", "h", "i", "next", "j", "loop", "h.out"}  # computed, or changed by the body


def test_what_is_held_at_the_peak_counts_each_byte_once_and_names_who_made_it():
    """The values live at the working set's peak, by kind: values that share bytes (a join spanning the slices it
    joins, in part) credit them to the largest, so the kinds sum to the peak; each kind is named by the module its
    op_name scopes, its block number (the number after the first name) as "*", and the op: a collective's kind, an
    all-reduce-scatter fusion's reduce-scatter, an unnamed copy's or an async computation's slice's "copy of" what
    it copies, an unnamed fusion by the op it fuses; a tuple's buffer has no array."""
    from meshlab.check.hlo import PeakHolding, working_set_peak

    program = """HloModule m

%all-reduce-scatter.1 (p: f32[8]) -> f32[4] {
  %p = f32[8]{0} parameter(0)
  %ar = f32[8]{0} all-reduce(f32[8]{0} %p), channel_id=1, replica_groups={{0,1}}, to_apply=%add
  ROOT %s = f32[4]{0} slice(f32[8]{0} %ar), slice={[0:4]}
}

%masked (q: f32[8]) -> f32[8] {
  %q = f32[8]{0} parameter(0)
  ROOT %isinf = f32[8]{0} negate(%q), metadata={op_name="blocks.3#/blocks.3.attn#/aten__isneginf"}
}

%async_computation.1 (p.1: f32[32]) -> f32[16] {
  %p.1 = f32[32]{0} parameter(0)
  ROOT %slice.1 = f32[16]{0:S(1)} slice(%p.1), slice={[0:16]}
}

ENTRY %main (param.0: f32[8]) -> f32[4] {
  %param.0 = f32[8]{0} parameter(0)
  %mm.1 = f32[64]{0} fusion(%param.0), calls=%f, metadata={op_name="blocks.3#.1/blocks.3.attn.to_out.0#.2/aten__mm"}
  %g.1 = f32[32]{0} all-gather(%param.0), channel_id=2, metadata={op_name="blocks.3.attn.to_q#.4/xla__custom_sharding"}
  %ff.1 = f32[16]{0} fusion(%param.0), calls=%f, metadata={op_name="embedder.ff.net.0.proj#.3/aten__mm"}
  %rs.1 = f32[4]{0} fusion(%mm.1), calls=%all-reduce-scatter.1, metadata={op_name="blocks.3#/blocks.3.mlp#/aten__mm"}
  %mask.1 = f32[8]{0} fusion(%param.0), kind=kLoop, calls=%masked
  %slice-start.1 = ((f32[32]{0}), f32[16]{0:S(1)}, s32[]{:S(2)}) async-start(%g.1), calls=%async_computation.1
  %copy-start.1 = (f32[64]{0:S(1)}, f32[64]{0}, u32[]{:S(2)}) copy-start(f32[64]{0} %mm.1)
  %copy-done.1 = f32[64]{0:S(1)} copy-done((f32[64]{0:S(1)}, f32[64]{0}, u32[]{:S(2)}) %copy-start.1)
  %t.1 = (f32[4]{0}, f32[4]{0}) tuple(%rs.1, %rs.1)
  ROOT %out = f32[4]{0} fusion(f32[4]{0} %rs.1), kind=kLoop, calls=%f
}
"""
    assignment = (
        "allocation 0: size 1024, page 0, preallocated-temp:\n"
        " value: <1 mm.1 @0> (size=256,offset=0): f32[64]{0}\n"
        " value: <2 g.1 @0> (size=128,offset=192): f32[32]{0}\n"  # shares 64 bytes with mm.1
        " value: <3 ff.1 @0> (size=64,offset=512): f32[16]{0}\n"
        " value: <4 rs.1 @0> (size=16,offset=600): f32[4]{0}\n"
        " value: <5 t.1{} @0> (size=16,offset=640): (f32[4]{0}, f32[4]{0})\n"
        " value: <6 out @0> (size=16,offset=700): f32[4]{0}\n"
        "allocation 1: size 352, color 1, page 0, preallocated-temp:\n"
        " value: <7 copy-done.1 @1> (size=256,offset=0): f32[64]{0:S(1)}\n"
        " value: <8 slice.1 @1> (size=64,offset=256): f32[16]{0:S(1)}\n"
        " value: <9 mask.1 @1> (size=32,offset=320): f32[8]{0}\n")
    live = ("HloLiveRange (max 9):\n  BufferLiveRange:\n    mm.1{}:1-5\n    g.1{}:2-4\n    ff.1{}:2-4\n"
            "    rs.1{}:3-8\n    t.1{}:3-4\n    out{}:8-9\n    copy-done.1{}:4-6\n    slice.1{}:3-4\n"
            "    mask.1{}:4-5\n")
    peak = working_set_peak(assignment, live, {1}, program)
    assert peak.bytes == 256 + 64 + 64 + 16 + 16 + 32 + 256 + 64  # at 4: mm.1 and g.1's union, ff, rs, t, the
    # mask, the copies
    assert set(peak.holdings) == {
        PeakHolding("hbm", "f32[64]", "blocks.*.attn.to_out.0: mm", 1, 256),
        PeakHolding("hbm", "f32[32]", "blocks.*.attn.to_q: all-gather", 1, 64),  # its own 64 bytes
        PeakHolding("hbm", "f32[16]", "embedder.ff.net.0.proj: mm", 1, 64),  # no block: its numbers stay
        PeakHolding("hbm", "f32[4]", "blocks.*.mlp: reduce-scatter", 1, 16),
        PeakHolding("hbm", "", "tuple", 1, 16),
        PeakHolding("vmem", "f32[8]", "blocks.*.attn: isneginf", 1, 32),  # an unnamed fusion: by what it fuses
        PeakHolding("vmem", "f32[64]", "copy of blocks.*.attn.to_out.0: mm", 1, 256),
        PeakHolding("vmem", "f32[16]", "copy of blocks.*.attn.to_q: all-gather", 1, 64)}  # an async slice's
    assert sum(h.bytes for h in peak.holdings) == peak.bytes
    assert [h.bytes for h in working_set_peak(assignment, live, {1}, program, top=2).holdings] == [256, 256]


def test_a_collective_fusion_names_the_collective_s_value_by_it_and_the_rest_by_the_fusion():
    """v5e's async collective fusion (its dump, jax's program) returns a matmul's output beside the weight it
    gathers: the gathered weight, and views of it, are the all-gather's (named by the gather's own op_name, here an
    unscoped argument name: no module), the matmul's output the fusion's op."""
    from meshlab.check.hlo import _Named, argument_copies

    program = (Path(__file__).parent / "data" / "tpu_v5e_async_all_gather.txt").read_text()
    named = _Named.of(program, argument_copies(program))
    assert named.made_by("fusion.22", "bf16[1024,1024]") == "all-gather"
    assert named.made_by("get-tuple-element.3", "bf16[1024,1024]") == "all-gather"  # an unnamed view of it
    assert named.made_by("fusion.22", "bf16[4,256,1024]") == "transformer_blocks.*.ff: dot_general"


def test_a_copy_of_a_collective_fusion_s_gather_is_the_gather_s_and_an_unnamed_fusion_its_last_named_op_s():
    """An async collective fusion that also computes (v5e's) returns the gathered weight beside the computation's
    value: a copy of the weight (memory-space assignment's, keeping its array) is a copy of the gather, the
    computation's value and the tuple's buffer are the fusion's op; a fusion XLA left unnamed, whose root has no
    op_name either, is named by the op nearest its output that a module scopes."""
    from meshlab.check.hlo import _Named, argument_copies

    program = """HloModule m

%gather (p: f32[8], x: f32[4]) -> (f32[4], f32[32]) {
  %p = f32[8]{0} parameter(0)
  %x = f32[4]{0} parameter(1)
  %g = f32[32]{0} all-gather(%p), channel_id=1, metadata={op_name="blocks.2.mlp.up#/xla__custom_sharding"}
  %y = f32[4]{0} negate(%x), metadata={op_name="blocks.1#/blocks.1.attn#/aten__mm"}
  ROOT %t = (f32[4]{0}, f32[32]{0}) tuple(%y, %g)
}

%scaled (q: f32[4]) -> f32[4] {
  %q = f32[4]{0} parameter(0)
  %m = f32[4]{0} negate(%q), metadata={op_name="blocks.1#/blocks.1.attn2.to_q#/aten__mm"}
  %s = f32[4]{0} multiply(%m, %m), metadata={op_name="blocks.1#/blocks.1.attn2#/aten__mul"}
  ROOT %r = f32[4]{0} negate(%s)
}

ENTRY %main (param.0: f32[8], param.1: f32[4]) -> f32[4] {
  %param.0 = f32[8]{0} parameter(0)
  %param.1 = f32[4]{0} parameter(1)
  %both = (f32[4]{0}, f32[32]{0}) fusion(%param.0, %param.1), calls=%gather,metadata={op_name="blocks.1.attn#/aten__mm"}
  %w = f32[32]{0} get-tuple-element(%both), index=1
  %copy-start.1 = (f32[32]{0:S(1)}, f32[32]{0}, u32[]{:S(2)}) copy-start(%w)
  %copy-done.1 = f32[32]{0:S(1)} copy-done(%copy-start.1)
  %y.1 = f32[4]{0} get-tuple-element(%both), index=0
  ROOT %out = f32[4]{0} fusion(%y.1), calls=%scaled
}
"""
    named = _Named.of(program, argument_copies(program))
    assert named.made_by("copy-done.1", "f32[32]") == "copy of blocks.*.mlp.up: all-gather"
    assert named.made_by("copy-start.1", "f32[32]") == "copy of blocks.*.mlp.up: all-gather"
    assert named.made_by("y.1", "f32[4]") == named.made_by("both", "") == "blocks.*.attn: mm"  # not the gather's
    assert named.made_by("out", "f32[4]") == "blocks.*.attn2: mul"
