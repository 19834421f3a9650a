"""`meshlab try` through the real CLI: tables, JSON, exit codes, one-line errors."""

import json
import re

import pytest
from typer.testing import CliRunner

from meshlab.cli.app import app
from meshlab.core.hardware import FIGURES

from tests.conftest import REPO, STRATEGIES

runner = CliRunner()
REQUIRED = {"strategy", "model", "hardware", "mesh", "total_params", "parameters", "per_chip", "fits"}


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda p: p.stem)
def test_tables_for_every_builtin_strategy(strategy):
    result = runner.invoke(app, ["try", str(strategy)], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    assert "Per-chip memory" in result.output and "Plan:" in result.output
    assert ("DOES NOT FIT" in result.output) == (strategy.stem == "data")


def test_json_is_complete_and_byte_identical():
    path = str(next(s for s in STRATEGIES if s.stem == "2d"))
    first = runner.invoke(app, ["try", path, "--json"])
    second = runner.invoke(app, ["try", path, "--json"])
    assert first.exit_code == 0 and first.stdout == second.stdout
    document = json.loads(first.stdout)
    assert REQUIRED <= set(document) and document["mesh"] == {"data": 2, "model": 4}
    assert document["fits"] is True and len(document["per_chip"]) == 8
    q = next(p for p in document["parameters"] if p["name"] == "transformer_blocks.0.attn.to_q.weight")
    assert q["spec"] == ["model", None] and q["shard_shape"] == [768, 3072] and q["bytes_per_device"] == 768 * 3072 * 2
    chip = document["per_chip"][0]
    assert chip["total_bytes"] == chip["weights_bytes"] + chip["activation_bytes"] + chip["other_bytes"]


@pytest.mark.parametrize(
    "text, message",
    [("name: t\nmodel: qwen-image\nhardware: v6e-8\nmesh: {data: 3, model: 4}\n", ":4:1: the mesh 3x4"),
     ("name: t\nmodel: nope\nhardware: v6e-8\nmesh: {model: 8}\n", ":2:1: unknown model 'nope'"),
     ("name: t\nmodel: qwen-image\nhardware: v9-8\nmesh: {model: 8}\n", ":3:1: unknown hardware"),
     ("name: t\nmodel: qwen-image\nhardware: v6e-8\nmesh: {model: 8}\nrules:\n  - {match: '*', shard: largest, axis: tp}\n",
      ":6:34: rule 0 (*) names unknown mesh axis 'tp'"),
     # checked while planning, before anything is printed (it was found while pricing, after the tables)
     ("name: t\nmodel: flux-dev\nhardware: h100\nmesh: {cfg: 2, seq: 4}\nactivations: {sequence: seq}\n"
      "workload: {cfg: false}\n", ":4:8: mesh axis 'cfg' has size 2 with workload.cfg False"),
     # a typo'd axis in the qkv rule is named as such, not as a sequence axis the rule leaves idle
     ("name: t\nmodel: flux-dev\nhardware: h100\nmesh: {seq: 8}\nactivations:\n  sequence: seq\n"
      "  sequence_parallel: xdit\n  rules:\n    - {point: attention.qkv, spec: [null, null, sqe]}\n",
      "activations.rules[0].spec names unknown mesh axis 'sqe'")],
)
def test_bad_input_is_one_line_exit_2(tmp_path, text, message):
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    result = runner.invoke(app, ["try", str(path)])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"meshlab: error: {path}") and message in lines[0], lines
    assert "Traceback" not in result.output and result.stdout == ""


def test_hardware_lists_catalog_with_sources():
    result = runner.invoke(app, ["hardware", "--json"])
    rows = {r["name"]: r for r in json.loads(result.stdout)}
    assert result.exit_code == 0 and "v6e-8" in rows
    assert set(FIGURES) <= set(rows["v6e-8"]["sources"]) and all(rows["v6e-8"]["sources"][f] for f in FIGURES)
    assert rows["v6e-8"]["figures"]["chips"] == 8


def test_a_workload_the_file_leaves_out_is_the_model_s_pipeline_s(tmp_path):
    """Flux.1-dev without a workload runs as FluxPipeline does (28 steps, no CFG), a Wan file that gives only its
    steps makes WanPipeline's 81 frames at 480x832 (it was one 1024x1024 frame), and try says where they came from."""
    from meshlab.plan.planned import plan_file

    head = "name: t\nhardware: h100\nmesh: {data: 1}\nrules: [{match: '*', shard: replicate}]\n"
    (tmp_path / "flux.yaml").write_text(head + "model: flux-dev\n")
    (tmp_path / "wan.yaml").write_text(head + "model: wan-2.1-t2v-1.3b\nworkload: {steps: 10}\n")
    flux, wan = plan_file(tmp_path / "flux.yaml").strategy.workload, plan_file(tmp_path / "wan.yaml").strategy.workload
    assert (flux.steps, flux.cfg, flux.text_tokens) == (28, False, 512)
    assert (wan.steps, wan.frames, wan.height, wan.width, wan.cfg) == (10, 81, 480, 832, True)
    result = runner.invoke(app, ["try", str(tmp_path / "flux.yaml")], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    assert "workload: FluxPipeline's defaults for what the file leaves out: steps 28, cfg False" in result.stdout
    assert "compile: eager, as PyTorch runs on a GPU unless told otherwise" in result.stdout
    full = runner.invoke(app, ["try", str(REPO / "strategies" / "2d.yaml")], env={"COLUMNS": "160"})
    assert "workload:" not in full.stdout and "compile:" not in full.stdout  # it gives both (a TPU: fused)
    # --json carries the same lines (it carried none)
    taken = json.loads(runner.invoke(app, ["try", str(tmp_path / "flux.yaml"), "--json"]).stdout)["taken"]
    assert [line.split(":")[0] for line in taken] == ["workload", "compile"] and "steps 28, cfg False" in taken[0]
    assert json.loads(runner.invoke(app, ["try", str(REPO / "strategies" / "2d.yaml"), "--json"]).stdout)["taken"] == []


def test_a_wan_file_decodes_in_float32_as_the_pipeline_s_example_loads_its_vae(tmp_path):
    """WanPipeline's documented example loads AutoencoderKLWan in float32: a Wan file that leaves
    placement.vae_dtype out is priced so (its decode was priced in bfloat16, half the bytes), and says so; a file that
    names a dtype keeps it, and sweep's Wan plans decode in float32 too."""
    from meshlab.plan.planned import pipeline_vae_dtype, plan_file
    from meshlab.search.sweep import _strategy
    from meshlab.core.hardware import load_hardware
    from meshlab.strategy.schema import Workload

    head = ("name: t\nhardware: h100\nmesh: {data: 1}\nrules: [{match: '*', shard: replicate}]\n"
            "model: wan-2.1-t2v-1.3b\n")
    (tmp_path / "wan.yaml").write_text(head)
    (tmp_path / "bf16.yaml").write_text(head + "placement: {vae_dtype: bfloat16}\n")
    (tmp_path / "flux.yaml").write_text(head.replace("wan-2.1-t2v-1.3b", "flux-dev"))
    wan, bf16, flux = (plan_file(tmp_path / f) for f in ("wan.yaml", "bf16.yaml", "flux.yaml"))
    assert (wan.strategy.placement.vae_dtype, bf16.strategy.placement.vae_dtype) == ("float32", "bfloat16")
    assert flux.strategy.placement.vae_dtype is None
    assert wan.memory.most_loaded.vae_decode == 2 * bf16.memory.most_loaded.vae_decode
    assert any(line.startswith("placement: the VAE held in float32") for line in wan.loaded.taken)
    assert not any(line.startswith("placement:") for line in bf16.loaded.taken)
    (tmp_path / "cpu.yaml").write_text(head + "placement: {vae: cpu}\n")  # no VAE on the chips: nothing to say
    assert not any(line.startswith("placement:") for line in plan_file(tmp_path / "cpu.yaml").loaded.taken)
    swept = _strategy("s", "data", {"data": 1}, [], "wan-2.1-t2v-1.3b", load_hardware("h100"), Workload(), 1)
    assert pipeline_vae_dtype("wan-2.1-t2v-1.3b", swept) == "float32"  # what the sweep's _evaluate applies
    assert pipeline_vae_dtype("flux-dev", swept) is None
    done = runner.invoke(app, ["sweep", "--model", "wan-2.1-t2v-1.3b", "--hardware", "h100:1", "--no-progress",
                               "--out", str(tmp_path / "best.yaml")])
    assert done.exit_code == 0, done.output
    assert "the VAE held in float32" in done.output and "vae_dtype: float32" in (tmp_path / "best.yaml").read_text()


def test_a_gpu_file_that_does_not_say_how_it_compiles_is_priced_eager(tmp_path):
    """ulysses.yaml says fused (torch.compile); without that line the same layout is priced as PyTorch runs it on a
    GPU, eager, as `try --model` prices it: slower, and its export asks for no --use_torch_compile."""
    from meshlab.cost.predict import predict
    from meshlab.plan.planned import plan_file

    text = (REPO / "strategies" / "ulysses.yaml").read_text()
    assert "  elementwise: fused" in text
    (tmp_path / "u.yaml").write_text(text.replace("  elementwise: fused", "  libtpu_flags: []"))
    fused, plain = plan_file(REPO / "strategies" / "ulysses.yaml"), plan_file(tmp_path / "u.yaml")
    assert (fused.strategy.compile.elementwise, plain.strategy.compile.elementwise) == ("fused", "eager")
    assert predict(plain.plan, plain.strategy, plain.hardware).seconds_per_image > \
        1.5 * predict(fused.plan, fused.strategy, fused.hardware).seconds_per_image


def test_a_cfg_axis_keeps_cfg_and_a_taken_value_that_fails_says_where_it_came_from(tmp_path):
    """Flux.1-dev's pipeline runs without CFG, but a file whose mesh has a cfg axis asks for the two branches: it
    keeps workload.cfg (it planned before pipeline defaults filled files). SD3.5's pipeline prompt is 333 tokens,
    which Ulysses 2 under diffusers cannot split: the error says the 333 came from the pipeline, not the file."""
    from meshlab.plan.planned import plan_file

    head = "hardware: h100\nrules: [{match: '*', shard: replicate}]\n"
    (tmp_path / "flux.yaml").write_text(head + "name: f\nmodel: flux-dev\nmesh: {cfg: 2, data: 4}\n"
                                        "activations: {batch: data}\nworkload: {batch: 4}\n")
    assert plan_file(tmp_path / "flux.yaml").strategy.workload.cfg is True
    (tmp_path / "sd.yaml").write_text(head + "name: s\nmodel: sd3.5-large\nmesh: {seq: 2}\nactivations:\n"
                                      "  sequence: seq\n  sequence_parallel: diffusers\n  rules:\n"
                                      "    - {point: attention.qkv, spec: [null, null, seq]}\n")
    result = runner.invoke(app, ["try", str(tmp_path / "sd.yaml")])
    assert result.exit_code == 2 and "split 333 text tokens 2 ways" in result.stderr
    assert "(workload: StableDiffusion3Pipeline's defaults for what the file leaves out: steps 28, text tokens 333)" \
        in result.stderr
    # an error the file's own workload meets alike names no taken value, though its numbers may look like one
    (tmp_path / "d.yaml").write_text(head + "name: d\nmodel: flux-dev\nmesh: {data: 28}\n")
    other = runner.invoke(app, ["try", str(tmp_path / "d.yaml")])
    assert other.exit_code == 2 and "28" in other.stderr and "defaults for what the file leaves out" not in other.stderr
    explained = runner.invoke(app, ["explain", str(tmp_path / "flux.yaml")], env={"COLUMNS": "160"})
    assert "\nworkload: FluxPipeline's defaults for what the file leaves out: steps 28\n" in explained.stdout
    assert "\ncompile: eager, as PyTorch runs on a GPU" in explained.stdout


def test_a_sequence_split_of_a_model_that_patchifies_inside_is_made_at_each_block_s_input(tmp_path):
    """Wan's (and SD3.5's, HunyuanVideo's, CogVideoX's, SANA's) latent reaches the model whole past the batch, so
    ``sequence: seq`` alone left every block's tokens whole in the programs checked and run while the cost model
    priced them split: planning adds the block.input rule that splits them, and says so. A model whose input is packed
    tokens (Qwen-Image), or a file that gives the rule, keeps its rules."""
    from meshlab.plan.planned import plan_file
    from meshlab.plan.activations import activation_points
    from meshlab.cost.predict import predict

    head = ("name: t\nhardware: v6e-8\nmesh: {seq: 2, model: 4}\nrules: [{match: '*', shard: replicate}]\n"
            "model: wan-2.1-t2v-1.3b\nactivations: {sequence: seq}\n")
    own = "activations:\n  sequence: seq\n  rules: [{point: block.input, spec: [null, seq, null]}]\n"
    (tmp_path / "wan.yaml").write_text(head)
    (tmp_path / "own.yaml").write_text(head.replace("activations: {sequence: seq}\n", own))
    (tmp_path / "qwen.yaml").write_text(head.replace("wan-2.1-t2v-1.3b", "qwen-image"))
    wan, given, qwen = (plan_file(tmp_path / f) for f in ("wan.yaml", "own.yaml", "qwen.yaml"))
    rules = wan.strategy.activations.rules
    assert [(r.point, r.stream, r.spec) for r in rules] == [("block.input", "image", [None, "seq", None])]
    assert {p.module for p in activation_points(wan.card, rules)} == {f"blocks.{i}" for i in range(30)}
    assert [line for line in wan.loaded.taken if line.startswith("activations:")] == [
        "activations: WanTransformer3DModel patchifies its latent inside the model, so its tokens are split over seq "
        "at each block's input (block.input, stream image, spec [null, seq, null]; the file gives no such rule)"]
    assert len(given.strategy.activations.rules) == 1 and given.strategy.activations.rules[0].stream is None
    assert qwen.strategy.activations.rules == [] and not any(t.startswith("activations:") for t in qwen.loaded.taken)
    as_written = wan.strategy.model_copy(update={"activations": wan.strategy.activations.model_copy(
        update={"rules": []})})
    priced = [predict(wan.plan, s, wan.hardware) for s in (wan.strategy, as_written)]
    assert priced[0].seconds_per_image == priced[1].seconds_per_image  # the rule makes real what was priced
    assert priced[0].collectives == priced[1].collectives
    shown = runner.invoke(app, ["try", str(tmp_path / "wan.yaml")])
    assert shown.exit_code == 0 and "patchifies its latent inside the model" in shown.output
    assert "spec [null, seq, null];" in " ".join(shown.output.split())  # rich read it as a markup tag and dropped it
    explained = runner.invoke(app, ["explain", str(tmp_path / "wan.yaml")])
    assert "spec [null, seq, null];" in " ".join(explained.output.split())
    exported = runner.invoke(app, ["export", str(tmp_path / "wan.yaml"), "--format", "dtensor"])  # not refused:
    assert exported.exit_code == 0 and "NOT APPLIED BY THIS SNIPPET" in exported.output  # the file gives no rule
    assert "the token split over seq at each block's input" in exported.output
    (tmp_path / "odd.yaml").write_text(head.replace("mesh: {seq: 2, model: 4}", "mesh: {seq: 8}")
                                       .replace("model: wan-2.1-t2v-1.3b", "model: sd3.5-large")
                                       + "workload: {height: 1008, width: 1008}\n")
    assert plan_file(tmp_path / "odd.yaml").plan.warnings == (
        "activations.sequence (the block.input rule planning adds for it) splits the image stream's 3969 tokens "
        "over 8 devices: XLA pads them to 3976 (7 padding tokens per sample)",)
    ulysses = ("activations: {sequence: seq, sequence_parallel: xdit, rules: [{point: attention.qkv, spec: [null, "
               "null, seq]}, {point: attention.output, spec: [null, seq, null]}]}")
    (tmp_path / "tool.yaml").write_text(head.replace("hardware: v6e-8", "hardware: h100").replace(
        "mesh: {seq: 2, model: 4}", "mesh: {seq: 2}").replace("activations: {sequence: seq}", ulysses))
    tool = plan_file(tmp_path / "tool.yaml")  # xDiT splits the sequence itself
    assert [r.point for r in tool.strategy.activations.rules] == ["attention.qkv", "attention.output"]
    from tests.conftest import small_card

    (tmp_path / "small.json").write_text(json.dumps(small_card().to_json()))  # a class meshlab cannot build
    (tmp_path / "own_card.yaml").write_text(head.replace("model: wan-2.1-t2v-1.3b", "model: small.json"))
    assert plan_file(tmp_path / "own_card.yaml").strategy.activations.rules == []


def write(folder, name: str, text: str):
    (folder / f"{name}.yaml").write_text(text)
    return folder / f"{name}.yaml"


def test_the_block_input_rule_planning_adds_keeps_the_residual_s_feature_split(tmp_path):
    """Beside largest-dim weights the residual stays split on model between blocks (its gates are): the rule
    planning adds keeps that split, where a spec with the features whole gathered the residual once a block
    (XLA:TPU, hunyuan-seq2-model4-whole-input.yaml against hunyuan-seq2-model4.yaml). Under weights that leave the
    residual whole (column/row pairs) the features stay whole."""
    from collections import Counter

    from meshlab.cost.predict import predict
    from meshlab.plan.planned import plan_file

    head = ("name: t\nhardware: v6e-8\nmesh: {seq: 2, model: 4}\nmodel: wan-2.1-t2v-1.3b\n"
            "rules: [{match: '*', min_rank: 2, shard: largest, axis: model}]\nactivations: {sequence: seq}\n")
    whole = head.replace("activations: {sequence: seq}\n", "activations:\n  sequence: seq\n  rules: [{point: "
                         "block.input, stream: image, spec: [null, seq, null]}]\n")
    pairs = head.replace("{match: '*', min_rank: 2, shard: largest, axis: model}",
                         "{match: 'blocks.*.ffn.net.0.proj.*', shard: column, axis: model}, "
                         "{match: 'blocks.*.ffn.net.2.*', shard: row, axis: model}")
    kept, given, paired = (plan_file(write(tmp_path, n, t)) for n, t in (("kept", head), ("whole", whole),
                                                                         ("pairs", pairs)))
    assert [r.spec for r in kept.strategy.activations.rules] == [[None, "seq", "model"]]
    assert [r.spec for r in paired.strategy.activations.rules] == [[None, "seq", None]]
    line = next(t for t in kept.loaded.taken if t.startswith("activations:"))
    assert "spec [null, seq, model]; the file gives no such rule; its features stay split on model" in line
    exported = runner.invoke(app, ["export", str(tmp_path / "kept.yaml"), "--format", "torch-xla"]).output
    assert "at each block's input, its features kept split on model (block.input" in " ".join(
        line.lstrip("# ") for line in exported.splitlines())

    def gathers(planned) -> Counter:
        return Counter(c.phase for c in predict(planned.plan, planned.strategy, planned.hardware).collectives
                       if c.kind == "all-gather" and c.block is not None)

    assert gathers(given)["block:input"] == 1 and gathers(kept)["block:input"] == 0
    # an axis of size 1 splits nothing: no rule keeps it, and nothing is gathered over it
    one = plan_file(write(tmp_path, "one", head.replace("{seq: 2, model: 4}", "{seq: 8, model: 1}")))
    assert [r.spec for r in one.strategy.activations.rules] == [[None, "seq", None]]
    assert not [c for c in predict(one.plan, one.strategy, one.hardware).collectives if "model" in c.axes]


def test_single_blocks_whose_joint_residual_is_split_otherwise_keep_only_the_shared_axes(tmp_path):
    """HunyuanVideo's single blocks carry a joint residual: where only they split it on model, the image rule (which
    every block reads) keeps the features whole, and their blocks' gather of it is priced."""
    from meshlab.cost.predict import predict
    from meshlab.plan.planned import plan_file

    text = ("name: t\nhardware: v6e-8\nmesh: {seq: 2, model: 4}\nmodel: hunyuan-video\n"
            "rules: [{match: 'single_transformer_blocks.*', min_rank: 2, shard: largest, axis: model}, "
            "{match: '*', shard: replicate}]\nactivations: {sequence: seq}\n")
    planned = plan_file(write(tmp_path, "single", text))
    assert [r.spec for r in planned.strategy.activations.rules] == [[None, "seq", None]]
    inputs = [c for c in predict(planned.plan, planned.strategy, planned.hardware).collectives
              if c.phase == "block:input"]
    assert [(c.kind, c.axes, c.count) for c in inputs] == [("all-gather", ("model",), 40)]


def test_explain_lists_the_collectives_of_every_block_list():
    """Flux's single blocks are a list of their own: explain's collective table shows them beside the double blocks
    (it once showed the first kept block only), each row under the kept block it was priced in."""
    path = REPO / "strategies" / "flux-usp-h100.yaml"
    output = runner.invoke(app, ["explain", str(path)], env={"COLUMNS": "400"}).output
    title = next(line for line in output.splitlines() if line.startswith("Collectives of one call"))
    assert "block 0 (transformer_blocks.0, stands for 19 identical blocks)" in title
    assert "block 19 (single_transformer_blocks.0, stands for 38 identical blocks)" in title
    document = json.loads(runner.invoke(app, ["explain", str(path), "--json"]).output)
    single = [c for c in document["collectives"] if c["block"] == 19]
    rows = [line for line in output.splitlines() if line.startswith("│ block 19 ")]
    assert single and len(rows) == len({(c["kind"], c["why"]) for c in single})


def test_explain_counts_the_blocks_a_kept_block_stands_for_from_the_graph(tmp_path):
    """A collective XLA:TPU issues once (a conditioning gathered once for every block) or in one block fewer (the
    modulation all-reduce merged into the previous block's) does not change how many blocks its kept block stands
    for; and a plan with nothing outside its blocks does not say it has."""
    path = tmp_path / "flux-mod.yaml"
    path.write_text("name: flux-mod\nmodel: flux-dev\nhardware: v6e-8\nmesh: {model: 8}\nrules:\n"
                    "  - {match: 'transformer_blocks.*.ff.net.0.proj.*', shard: column, axis: model}\n"
                    "  - {match: 'transformer_blocks.*.ff.net.2.*', shard: row, axis: model}\n"
                    "  - {match: 'transformer_blocks.*.norm1.linear.*', shard: row, axis: model}\n"
                    "  - {match: '*', shard: replicate}\n"
                    "workload: {height: 1024, width: 1024, batch: 1, steps: 50, cfg: false, text_tokens: 512}\n")
    document = json.loads(runner.invoke(app, ["explain", str(path), "--json"]).output)
    assert {c["blocks_like_it"] for c in document["collectives"]} == {1, 18}  # no collective of the block says 19
    assert not any(c["block"] is None for c in document["collectives"])
    output = runner.invoke(app, ["explain", str(path)], env={"COLUMNS": "400"}).output
    title = next(line for line in output.splitlines() if line.startswith("Collectives of one call"))
    assert "block 0 (transformer_blocks.0, stands for 19 identical blocks) (predicted)" in title


def test_sd35_holds_its_positional_table_whole_on_every_chip():
    """SD3.5 Large's 171 MiB positional table (a buffer from_pretrained loads in bfloat16) is a row of the memory
    table and part of the total, on every chip."""
    path = str(REPO / "tests" / "cost" / "data" / "strategies" / "sd35-2d.yaml")
    shown = runner.invoke(app, ["try", path], env={"COLUMNS": "160"})
    assert shown.exit_code == 0, shown.output
    assert re.search(r"transformer buffers \(whole on every chip\)\s*│\s*0\.17 GiB", shown.output)
    chips = json.loads(runner.invoke(app, ["try", path, "--json"]).stdout)["per_chip"]
    assert {c["breakdown"]["buffers"] for c in chips} == {179_306_496}
    parts = ("vae_weights", "text_encoder", "reserve", "buffers")  # what other_bytes holds
    assert all(c["other_bytes"] == sum(c["breakdown"][k] for k in parts) for c in chips)
    shown = runner.invoke(app, ["try", str(REPO / "strategies" / "2d.yaml")], env={"COLUMNS": "160"})
    assert "transformer buffers" not in shown.output  # Qwen-Image has none


def test_a_card_imported_before_buffers_were_recorded_says_they_are_not_counted(tmp_path):
    """A card file without the buffers field (imported by an older meshlab) plans as before, with a warning naming
    the command that regenerates it; a card that records none (Qwen-Image's) warns of nothing."""
    card = json.loads((REPO / "meshlab" / "models" / "cards" / "sd3.5-large.json").read_text())
    del card["buffers"]
    (tmp_path / "old-sd35.json").write_text(json.dumps(card))
    text = (REPO / "tests" / "cost" / "data" / "strategies" / "sd35-2d.yaml").read_text()
    (tmp_path / "old.yaml").write_text(re.sub(r"(?m)^model: .*$", "model: old-sd35.json", text))
    done = json.loads(runner.invoke(app, ["try", str(tmp_path / "old.yaml"), "--json"]).stdout)
    assert {c["breakdown"]["buffers"] for c in done["per_chip"]} == {0}
    assert any("records no buffers" in w and "meshlab models import sd3.5-large" in w for w in done["warnings"])
    shown = json.loads(runner.invoke(app, ["try", str(REPO / "strategies" / "2d.yaml"), "--json"]).stdout)
    assert not any("records no buffers" in w for w in shown["warnings"])
