"""The check's verdict and its rendering: XLA's side from checked-in real dump excerpts (no torch).

The parameters' side comes from the per-device program's argument list in qwen_2d_partitioned_excerpt.txt (one
full-width Qwen-Image block under 2d.yaml, as XLA's CPU backend partitioned it): each weight's per-device shard
shape, as XLA allocated it. The dump names no parameter, so each planned parameter is given the dump shape that
is its planned shard when one is left, else one that tiles its shape; a planned shard XLA never allocated
disagrees. The collectives and the memory come from the same dump; a 2-block check's measured collectives from
tests/cost/data/xla_collectives_2d.json.
"""

from __future__ import annotations

import io
import json
import re
from collections import Counter
from pathlib import Path

from rich.console import Console

from meshlab.check import hlo
from meshlab.check.hlo import ArrayShape, HloCollective
from meshlab.check.verdict import (OUTSIDE, CheckReport, MeasuredCollective, check_document, collectives_of,
                                    predicted_full_depth, predicted_per_block)
from meshlab.check.readback import compare_parameter
from meshlab.check.setup import CheckOptions, check_setup
from meshlab.cli.render_check import render_check

from tests.conftest import REPO

DATA = Path(__file__).parent / "data"
PARTITIONED = (DATA / "qwen_2d_partitioned_excerpt.txt").read_text()
BUFFERS = (DATA / "qwen_2d_buffer_assignment_excerpt.txt").read_text()
STOCK_2D = REPO / "tests" / "cost" / "data" / "strategies" / "2d-stock.yaml"  # 2d.yaml as the excerpts were measured (before layernorm-rows)
MEASURED_2D = json.loads((REPO / "tests" / "cost" / "data" / "xla_collectives_2d-stock.json").read_text())

#: The dump's model groups are {0,1,2,3} and {4,5,6,7}: device d sits at data d // 4, model d % 4. A dim tiled
#: 4 ways is tiled over model, the other axis replicating, in torch_xla's device order for a (data, model) mesh.
MODEL_TILED = {
    (4,): "{devices=[4,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}",
    (4, 1): "{devices=[4,1,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}",
    (1, 4): "{devices=[1,4,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}",
}
#: What the last checked block computes for a text stream nothing reads: XLA drops it, and its weights
TEXT_TAIL = {f"transformer_blocks.0.{n}" for n in (
    "attn.to_add_out.weight", "attn.to_add_out.bias", "txt_mlp.net.0.proj.weight", "txt_mlp.net.0.proj.bias",
    "txt_mlp.net.2.weight", "txt_mlp.net.2.bias")}
#: their bf16 shards under 2d.yaml: to_add_out [768, 3072] + [3072], the text MLP [3072, 3072] + [12288] and
#: [3072, 3072] + [3072]
TEXT_TAIL_BYTES = 2 * (768 * 3072 + 3072 + 3072 * 3072 + 12288 + 3072 * 3072 + 3072)


def dump_weight_shards(partitioned: str) -> list[tuple[int, ...]]:
    """The per-device shapes of the weights among the program's arguments: bf16 vectors and matrices (the
    inputs are rank 0 or 3, a bf16[1] timestep, s64 masks and c64 RoPE tables)."""
    header = partitioned.splitlines()[0]
    arguments = header.split("entry_computation_layout={(", 1)[1].split(")->", 1)[0]
    shapes = [(dtype, tuple(int(d) for d in dims.split(",") if d))
              for dtype, dims in re.findall(r"\b([a-z]+\d*)\[([\d,]*)\]", arguments)]
    return [dims for dtype, dims in shapes if dtype == "bf16" and len(dims) in (1, 2) and dims != (1,)]


def xla_side(planned, shards: list[tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Each planned parameter's shard as XLA allocated it: the dump shape equal to its planned shard while one
    is left, else a dump shape that tiles its shape; none when XLA allocated none (it dropped the parameter)."""
    left = Counter(shards)
    mesh = planned.mesh
    found = {}
    for p in planned.parameters:
        if left[p.shard_shape(mesh)]:
            left[p.shard_shape(mesh)] -= 1
            found[p.name] = p.shard_shape(mesh)
    for p in planned.parameters:
        if p.name in found:
            continue
        fits = [s for s in left.elements()
                if len(s) == len(p.shape) and all(n % k == 0 for n, k in zip(p.shape, s))]
        if fits:
            left[fits[0]] -= 1
            found[p.name] = fits[0]
    assert not +left, f"dump shards no planned parameter fits: {+left}"
    return found


def held_slices(shape: tuple[int, ...], shard: tuple[int, ...]) -> list[list[tuple[int, int]]]:
    """The real data each of the 8 devices holds under XLA's tiling: a tiled dim split over model (d % 4)."""
    return [[(0, n) if s == n else ((d % 4) * s, (d % 4 + 1) * s) for n, s in zip(shape, shard)]
            for d in range(8)]


def fabricated(misplace: str | None = None, partitioned: str = PARTITIONED) -> CheckReport:
    """One Qwen-Image block under 2d.yaml, XLA's side from the dump (optionally one parameter's data swapped
    between devices 0 and 1); the predicted collectives are meshlab's cost model's."""
    setup = check_setup(STOCK_2D, CheckOptions(layers=1))
    mesh, ids = setup.plan.mesh, tuple(range(8))
    xla = xla_side(setup.plan, dump_weight_shards(partitioned))
    parameters = []
    for p in setup.plan.parameters:
        if p.name not in xla:
            continue
        shard = xla[p.name]
        tiles = tuple(n // s for n, s in zip(p.shape, shard))
        sharding = "{replicated}" if set(tiles) == {1} else MODEL_TILED[tiles]
        slices = held_slices(p.shape, shard)
        if p.name == misplace:
            slices[0], slices[1] = slices[1], slices[0]
        parameters.append(compare_parameter(p, mesh, ids, sharding, slices))
    collectives = collectives_of(hlo.parse_collectives(partitioned), setup, ids)
    memory = hlo.parse_buffer_assignment(BUFFERS)
    return CheckReport(setup, tuple(parameters), collectives, memory, 0.02, 3.7, "CPU", 8,
                       ({"compiles": 2, "seconds": 8.0}, {"compiles": 2, "seconds": 7.0}),
                       {"build": 3.0, "reference": 2.0, "apply": 1.5}, "module_0050.txt",
                       predicted_per_block(setup), predicted_full_depth(setup))


def test_per_block_and_full_depth_collectives():
    report = fabricated()
    blocks = report.per_block()
    assert blocks["transformer_blocks.0"] == {"all-reduce": 1, "all-gather": 15, "collective-permute": 24}
    assert blocks[OUTSIDE] == {"all-reduce": 2, "all-gather": 4, "collective-permute": 4}
    # one checked block of 60: outside once, the block 60 times
    assert report.full_depth_collectives() == {"all-reduce": 62, "all-gather": 904, "collective-permute": 1444}


#: 2d.yaml's bf16 shards of one Qwen-Image block, by hand: img_mod.1 and txt_mod.1 [4608, 3072]; q, k, v,
#: add_q/k/v, to_out.0 and to_add_out [768, 3072]; the MLPs' [3072, 3072] in and out; vectors whole: 2 x 18432,
#: 8 x 3072, 2 x 12288, 2 x 3072, 4 norms of 128
BLOCK_BYTES = 2 * (2 * 4608 * 3072 + 8 * 768 * 3072 + 4 * 3072 * 3072 + 2 * 18432 + 8 * 3072 + 2 * 12288
                   + 2 * 3072 + 4 * 128)
#: and outside the blocks: timestep linear_1 [768, 256], linear_2 [768, 3072], txt_norm, img_in [768, 64],
#: txt_in [3072, 896], norm_out.linear [1536, 3072], proj_out [64, 768], and the biases whole
OUTSIDE_BYTES = 2 * (768 * 256 + 3072 + 768 * 3072 + 3072 + 3584 + 768 * 64 + 3072 + 3072 * 896 + 3072
                     + 1536 * 3072 + 6144 + 64 * 768 + 64)


def test_every_weight_xla_allocated_is_a_planned_shard():
    report = fabricated()
    assert len(report.parameters) == 39 and not report.mismatches and report.agrees
    # the 6 planned parameters XLA allocated no buffer for: the last block's unread text tail (by shape: the
    # dump cannot tell one replicated [3072] bias from another)
    mesh = report.setup.plan.mesh
    matched = {p.name for p in report.parameters}
    unmatched = [p for p in report.setup.plan.parameters if p.name not in matched]
    tail = [p for p in report.setup.plan.parameters if p.name in TEXT_TAIL]
    assert Counter(p.shard_shape(mesh) for p in unmatched) == Counter(p.shard_shape(mesh) for p in tail) == {
        (768, 3072): 1, (3072,): 2, (3072, 3072): 2, (12288,): 1}
    assert {p.name for p in unmatched} >= TEXT_TAIL - {"transformer_blocks.0.attn.to_add_out.bias"}
    predicted, xla = report.weights()
    # XLA's weights, summed over the dump's buffer assignment (its bf16 vector and matrix arguments): the hand
    # count of the block and the rest, less the text tail
    allocated = sum(int(size) for size, dtype, dims in re.findall(
        r"allocation \d+: size (\d+), parameter \d+, shape \|(\w+)\[([\d,]*)\]\|", BUFFERS)
        if dtype == "bf16" and len(dims.split(",")) in (1, 2) and dims not in ("", "1"))
    assert xla == allocated == BLOCK_BYTES + OUTSIDE_BYTES - TEXT_TAIL_BYTES == 147_845_248
    planned = sum(p.bytes_per_device(report.setup.plan.mesh) for p in report.setup.plan.parameters)
    assert planned == BLOCK_BYTES + OUTSIDE_BYTES == 190_349_440
    assert planned - xla == TEXT_TAIL_BYTES == 42_504_192


def test_full_depth_weights_against_the_dump_extrapolated():
    report = fabricated()
    predicted, xla = report.full_depth_weights()
    assert predicted == 60 * BLOCK_BYTES + OUTSIDE_BYTES == 10_223_574_144  # the plan, 60 whole blocks
    # XLA's one checked block is a last block and stands for all 60: each of them short of the text tail
    assert xla == 60 * (BLOCK_BYTES - TEXT_TAIL_BYTES) + OUTSIDE_BYTES == 7_673_322_624


def test_a_shard_moved_in_the_dump_is_the_one_disagreement():
    # txt_in [3072, 3584]: planned on its largest dim (1), [3072, 896] per device; moved to dim 0 in the dump
    moved = PARTITIONED.replace("bf16[3072,896]", "bf16[768,3584]", 1)
    assert moved != PARTITIONED
    report = fabricated(partitioned=moved)
    assert [p.name for p in report.mismatches] == ["txt_in.weight"]
    wrong = report.mismatches[0]
    assert (wrong.predicted_shard_shape, wrong.xla_shard_shape) == ((3072, 896), (768, 3584))
    assert wrong.xla_sharding == "{devices=[4,1,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}"
    assert wrong.predicted_sharding == "{devices=[1,4,2]0,4,1,5,2,6,3,7 last_tile_dim_replicate}"
    assert not wrong.same_tiling and wrong.misplaced == tuple(range(8))  # every device holds other data
    assert report.weights() == (147_845_248, 147_845_248)  # a moved shard keeps its bytes: only the shapes tell
    assert not report.agrees


def test_agreement_and_a_misplaced_shard():
    assert fabricated().agrees
    report = fabricated(misplace="transformer_blocks.0.attn.to_q.weight")
    assert [p.name for p in report.mismatches] == ["transformer_blocks.0.attn.to_q.weight"]
    assert report.mismatches[0].misplaced == (0, 1)
    assert not report.agrees


def test_predicted_collectives_against_the_dump():
    report = fabricated()
    # meshlab's cost model counts every block alike; XLA's only checked block is a last block, which drops the
    # text tail: one all-reduce, 5 all-gathers and 12 permutes fewer
    predicted = {"all-reduce": 2, "all-gather": 20, "collective-permute": 36}
    assert report.predicted_per_block == {"transformer_blocks.0": predicted}
    xla = report.per_block()["transformer_blocks.0"]
    assert Counter(predicted) - xla == {"all-reduce": 1, "all-gather": 5, "collective-permute": 12}
    # outside the blocks the cost model's all-reduces and all-gathers are the dump's; it counts 2 more permutes
    outside = report.predicted_full_depth - Counter({k: 60 * n for k, n in predicted.items()})
    assert report.per_block()[OUTSIDE] == {"all-reduce": 2, "all-gather": 4, "collective-permute": 4}
    assert outside == {"all-reduce": 2, "all-gather": 4, "collective-permute": 6}


def measured_report(measured: dict) -> CheckReport:
    """A 2-block check of 2d.yaml whose collectives are those `meshlab check --json` measured."""
    setup = check_setup(STOCK_2D, CheckOptions(layers=2))
    collectives = tuple(
        MeasuredCollective(HloCollective(f"c{i}", c["kind"], (ArrayShape(c["dtype"], tuple(c["shape"])),), (), (),
                                 f"{c['layer']}#/aten" if c["layer"] else None), tuple(c["mesh_axes"]))
        for i, c in enumerate(measured["collectives"]))
    return CheckReport(setup, (), collectives, None, 0.0, 1.0, "CPU", 8, (), {}, None,
                       predicted_per_block(setup), predicted_full_depth(setup))


def test_a_middle_block_agrees_with_the_measured_check():
    report = measured_report(MEASURED_2D)
    assert report.per_block() == MEASURED_2D["collectives_per_block"]
    predicted = {"all-reduce": 2, "all-gather": 20, "collective-permute": 36}
    assert report.predicted_per_block == {"transformer_blocks.0": predicted, "transformer_blocks.1": predicted}
    assert report.per_block()["transformer_blocks.0"] == predicted  # the middle block: XLA agrees
    # the last block: XLA drops the text tail
    assert Counter(predicted) - report.per_block()["transformer_blocks.1"] == {
        "all-reduce": 1, "all-gather": 4, "collective-permute": 12}
    # one all-reduce taken out of the measured middle block is found
    perturbed = dict(MEASURED_2D, collectives=list(MEASURED_2D["collectives"]))
    first = next(i for i, c in enumerate(perturbed["collectives"])
                 if c["kind"] == "all-reduce" and (c["layer"] or "").startswith("transformer_blocks.0"))
    del perturbed["collectives"][first]
    assert Counter(predicted) - measured_report(perturbed).per_block()["transformer_blocks.0"] == {"all-reduce": 1}


def test_the_verdict_holds_the_middle_block_to_the_prediction_not_the_last():
    """The default check (two blocks) agrees on 2d.yaml's middle block although its last block differs; an
    all-reduce missing from the middle block (1 of 2: beyond 10%) makes it disagree, exit 1."""
    report = measured_report(MEASURED_2D)
    assert report.middle_blocks_checked and report.collective_differences() == ()
    perturbed = dict(MEASURED_2D, collectives=list(MEASURED_2D["collectives"]))
    first = next(i for i, c in enumerate(perturbed["collectives"])
                 if c["kind"] == "all-reduce" and (c["layer"] or "").startswith("transformer_blocks.0"))
    del perturbed["collectives"][first]
    report = measured_report(perturbed)
    assert report.collective_differences() == ("transformer_blocks.0: all-reduce predicted 2, XLA 1",)
    assert not report.agrees
    assert check_document(report)["collective_differences"] == ["transformer_blocks.0: all-reduce predicted 2, XLA 1"]


def test_an_output_beyond_the_tolerance_disagrees():
    report = fabricated()
    object.__setattr__(report, "max_abs_error", 1.0)
    assert not report.output_agrees and not report.agrees


def test_json_document_has_what_the_issue_asks_for():
    from meshlab.check.documents import CheckDocument

    document = check_document(fabricated())
    CheckDocument.model_validate_json(json.dumps(document))  # the model the CLI reads it back through
    # the dump's own "Total bytes used: 305657163" line, and the sums of its allocation lines by kind
    assert document["xla_memory_per_device"] == {"parameters": 150_213_016, "temporaries": 155_435_650,
                                                 "outputs": 8_200, "constants": 297, "total": 305_657_163}
    assert 150_213_016 + 155_435_650 + 8_200 + 297 == 305_657_163
    first = document["parameters"][0]  # a [3072, 256] weight split 4 ways over model: 3072 / 4 = 768 rows
    assert first["name"] == "time_text_embed.timestep_embedder.linear_1.weight"
    assert first["predicted_shard_shape"] == first["xla_shard_shape"] == [768, 256]
    gather = document["collectives"][0]  # f32[1, 64, 3072] per device: 1 x 64 x 3072 x 4 bytes
    assert (gather["kind"], gather["shape"], gather["dtype"], gather["bytes_per_device"]) == (
        "all-gather", [1, 64, 3072], "f32", 786_432)
    assert document["max_abs_error"] == 0.02
    assert document["collectives"][0]["mesh_axes"] == ["model"]
    assert "temporaries" in document["caveats"]
    assert document["weights_per_device"] == {"predicted": 147_845_248, "xla": 147_845_248,
                                              "full_depth_predicted": 10_223_574_144, "full_depth_xla": 7_673_322_624}
    assert document["predicted_collectives_per_block"] == {
        "transformer_blocks.0": {"all-reduce": 2, "all-gather": 20, "collective-permute": 36}}


def test_render_prints_plan_vs_xla_with_the_caveats_beside_the_numbers():
    buffer = io.StringIO()
    render_check(fabricated(misplace="img_in.weight"), Console(file=buffer, width=200, highlight=False))
    text = buffer.getvalue()
    assert "38 of 39" in text and "img_in.weight" in text
    assert "Plan vs XLA" in text and "141.0 MiB" in text  # 147,845,248 B
    assert "9.52 GiB" in text and "7.15 GiB" in text  # 10,223,574,144 B planned, 7,673,322,624 B extrapolated
    assert "2 all-reduce, 20 all-gather, 36" in text  # meshlab's block
    assert "1 all-reduce, 15 all-gather, 24" in text  # XLA's
    assert "never emits reduce-scatter" in text and "converted to f32" in text
    assert "the plan and XLA disagree" in text
