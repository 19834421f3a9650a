"""meshlab compare: globs, ranking, reasons, notes; the CLI through CliRunner."""

import json
import math
import os
import re
import subprocess
import sys

import pytest
import typer
import yaml
from typer.testing import CliRunner

from meshlab.cli.commands_cost import register
from meshlab.search.compare import compare, expand
from meshlab.core.errors import InputError
from meshlab.strategy.schema import Strategy

from tests.conftest import REPO, STRATEGIES

GLOB = str(REPO / "strategies" / "*.yaml")


def cli() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def main() -> None:
        """meshlab (test app)"""

    register(app)
    return app


def test_globs_that_match_nothing_are_bad_input(tmp_path):
    with pytest.raises(InputError, match="no file matches"):
        expand([str(tmp_path / "*.yaml")])
    with pytest.raises(InputError, match="no such strategy file"):
        expand([str(tmp_path / "missing.yaml")])
    assert expand([GLOB, str(STRATEGIES[0])]) == STRATEGIES


def test_ranks_fitting_plans_first_and_says_why_losers_lose():
    result = compare([GLOB])
    qwen = [e for e in result.entries if e.planned.card.name == "qwen-image"]
    ranked = [e.planned.strategy.name for e in qwen]
    assert ranked[-1] == "data" and not qwen[-1].fits
    assert "does not fit" in qwen[-1].why and "replicated" in qwen[-1].why
    assert result.best_per_model["qwen-image"] is qwen[0] and qwen[0].why == ""
    assert all(e.why for e in qwen[1:])
    assert result.notes == (  # wan-14b-v6e-8.yaml: a video model; flux-usp-h100.yaml: Flux; ulysses.yaml: 8 GPUs
        "these strategies are for different models (flux-dev, qwen-image, wan-2.1-t2v-14b): each is ranked among its "
        "own model's plans of the same workload (their times are for different work)", "these strategies run on "
        "different hardware (h100, v6e-8): plans of one model and workload are ranked together by seconds per "
        "output, whatever their system, so compare $/output too")  # images and videos: their tables' word
    assert qwen[0].planned.strategy.name == "ulysses"  # 8 H100s, its text encoder on them
    two_d = next(e for e in qwen if e.planned.strategy.name == "2d")  # on v6e-8, against the h100 best
    # most of the gap is 2d's text encoder on the host (ulysses holds its own on each GPU)
    assert two_d.why.startswith("on v6e-8 against ulysses on h100: its text encoder on the host: 7.72 s/image vs "
                                "0.02 on each chip")


def test_different_models_are_allowed_but_noted(write_strategy):
    text = (REPO / "strategies" / "2d.yaml").read_text().replace("model: qwen-image", "model: flux-dev")
    text = text.replace("cfg: true", "cfg: false")
    flux = write_strategy(text, "flux.yaml")
    result = compare([str(REPO / "strategies" / "2d.yaml"), str(flux)])
    assert any("different models" in note for note in result.notes)


def test_cli_compare_json_labels_predictions():
    result = CliRunner().invoke(cli(), ["compare", GLOB, "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["label"] == "predicted" and document["best"] is None  # two models: no best of all
    assert document["best_per_model"]["qwen-image"] == document["entries"][0]["name"]
    assert all(e["predicted"]["label"] == "predicted" for e in document["entries"])
    catalog = yaml.safe_load((REPO / "meshlab" / "data" / "hardware.yaml").read_text())["accelerators"]["v6e"]
    assumed = {a["name"]: a["value"] for a in document["assumptions"]["v6e-8"]}
    for name in ("compute_efficiency", "hbm_efficiency", "collective_latency_s", "step_overhead_s"):
        assert assumed[name] == catalog[name]["value"], name  # the catalog's figure, as the catalog gives it


def test_cli_compare_bad_glob_exits_2(tmp_path):
    result = CliRunner().invoke(cli(), ["compare", str(tmp_path / "*.yaml")])
    assert result.exit_code == 2 and "no file matches" in result.stderr


def test_cli_explain_lists_assumptions():
    result = CliRunner().invoke(cli(), ["explain", str(REPO / "strategies" / "pairs.yaml"), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assumed = {a["name"]: a["value"] for a in document["assumptions"]}
    assert (assumed["compute_efficiency"], assumed["hbm_efficiency"], assumed["step_overhead_s"]) == (0.8, 0.85, 0.001)
    assert assumed["overlap"] == 0.0  # collectives do not overlap compute (meshlab.cost.timing.Assumptions)
    # pairs: all-reduces over model for the row-split Linears; layernorm-rows keeps the LayerNorms' rows split
    # over data (no all-gather, where pairs-stock.yaml gathers them)
    assert {(c["kind"], tuple(c["axes"])) for c in document["collectives"]} == {("all-reduce", ("model",))}


def test_cli_explain_on_a_hopper_gpu_names_its_measured_gemm_rates():
    strategy = REPO / "experiments" / "strategies" / "qwen-image-one-h200.yaml"
    result = CliRunner().invoke(cli(), ["explain", str(strategy), "--json"])
    assert result.exit_code == 0, result.output
    assumptions = {a["name"]: a["source"] for a in json.loads(result.stdout)["assumptions"]}
    assert "sm_90" in assumptions["matmul_rates"] and "every op but Linears and attention" in assumptions[
        "compute_efficiency"]
    text = CliRunner().invoke(cli(), ["explain", str(strategy)])
    assert text.exit_code == 0 and "Priced from the catalog: 846 Linears at measured GEMM rates (256..4096 a dim), " \
        "the farthest 256.0x below them (their trend continued) and 3.0x above them" in " ".join(text.stdout.split())


def test_cli_sweep_writes_yaml_and_reports(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(cli(), ["sweep", "--model", "qwen-image", "--hardware", "v6e-8", "--no-progress"])
    assert result.exit_code == 0, result.output
    assert "Pareto front" in result.stdout
    best = Strategy.model_validate(yaml.safe_load((tmp_path / "best.yaml").read_text()))
    assert (best.model, best.hardware, math.prod(best.mesh.values())) == ("qwen-image", "v6e-8", 8)


def test_cli_sweep_without_valid_factorization_exits_2(tmp_path):
    result = CliRunner().invoke(cli(), ["sweep", "--model", "qwen-image", "--hardware", "v6e-8", "--devices", "1",
                                        "--out", str(tmp_path / "best.yaml"), "--no-progress"])
    assert result.exit_code == 2 and "no factorization of 1 devices" in result.stderr
    assert not (tmp_path / "best.yaml").exists()


def test_cli_plot_writes_png(tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "compare.png"
    result = CliRunner().invoke(cli(), ["compare", GLOB, "--plot", str(out)])
    assert result.exit_code == 0, result.output
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plans_for_different_models_are_ranked_apart(tmp_path):
    """A Wan plan is never held to a Qwen-Image one (different work): each model has its own best and ranks."""
    from meshlab.search.compare import compare

    result = compare([str(REPO / "strategies" / "2d.yaml"), str(REPO / "strategies" / "pairs.yaml"),
                      str(REPO / "strategies" / "wan-14b-v6e-8.yaml")])
    assert result.best is None and set(result.best_per_model) == {"qwen-image", "wan-2.1-t2v-14b"}
    wan = [e for e in result.entries if e.planned.card.name == "wan-2.1-t2v-14b"]
    assert [e.rank for e in wan] == [1] and wan[0].why == ""
    qwen = [e for e in result.entries if e.planned.card.name == "qwen-image"]
    assert sorted(e.rank for e in qwen) == [1, 2] and all("TFLOP" not in e.why for e in qwen)
    assert any("different models" in note for note in result.notes)


def test_a_plan_that_waits_on_eager_launches_says_so(tmp_path):
    """Eight images a call over data 8 against one image split 8 ways by Ulysses, eager on 8 H100s at 512x512:
    both wait on the host's launches, and the Ulysses plan waits for each of its images alone."""
    base = ("model: qwen-image\nhardware: h100\nrules: []\ncompile: {elementwise: eager}\n"
            "placement: {text_encoder: device}\n"
            "workload: {height: 512, width: 512, steps: 20, cfg: true, batch: %d}\n")
    (tmp_path / "data.yaml").write_text("name: data\nmesh: {data: 8}\nactivations: {batch: data}\n" + base % 8)
    (tmp_path / "ulysses.yaml").write_text("name: ulysses\nmesh: {sp: 8}\nactivations: {sequence: sp}\n"
                                           + base % 1)
    result = compare([str(tmp_path / "*.yaml")])
    best, loser = result.entries
    assert best.planned.strategy.name == "data"
    assert loser.prediction.step.launch_wait > loser.prediction.step.local
    assert loser.why.startswith("waits on eager PyTorch's launches")


def test_plans_that_ask_for_different_work_are_ranked_apart(tmp_path):
    """hybrid.yaml at 32 text tokens against hybrid.yaml and 2d.yaml at 512: the 32-token plan is the best of its
    own workload, never the yardstick of the 512-token ones (a loser's reason would blame collectives for the
    shorter prompt), and a note names the field that differs."""
    short = tmp_path / "short.yaml"
    short.write_text((REPO / "strategies" / "hybrid.yaml").read_text().replace("text_tokens: 512", "text_tokens: 32")
                     .replace("name: hybrid", "name: short"))
    result = compare([str(short), str(REPO / "strategies" / "hybrid.yaml"), str(REPO / "strategies" / "2d.yaml")])
    by_name = {e.planned.strategy.name: e for e in result.entries}
    assert by_name["short"].rank == 1 and by_name["short"].why == "" and result.is_best(by_name["short"])
    assert by_name["short"].prediction.seconds_per_image < by_name["2d"].prediction.seconds_per_image
    assert by_name["2d"].rank == 1 and result.is_best(by_name["2d"])  # the best of the 512-token plans
    assert by_name["hybrid"].rank == 2  # against 2d: one image a call, where 2d's two share one prompt's encode
    assert by_name["hybrid"].why.startswith("its text encoder on the host: 15.44 s/image vs 7.72 on the host")
    assert result.best is None and result.best_per_model == {}  # qwen-image's plans do not share one workload
    assert "the qwen-image strategies ask for different work (text_tokens 32 vs 512)" in " ".join(result.notes)
    document = CliRunner().invoke(cli(), ["compare", str(short), str(REPO / "strategies" / "2d.yaml"), "--json"])
    groups = json.loads(document.stdout)["best_per_workload"]
    assert sorted((g["text_tokens"], g["best"]) for g in groups) == [(32, "short"), (512, "2d")]


def test_the_table_names_each_plan_s_system_and_prices_no_plan_that_does_not_fit():
    """Mixed systems: each row names its model and system under the strategy, the mesh names its axes, the usable
    HBM is shown beside the peak, and data.yaml (does not fit) has no price."""
    result = CliRunner().invoke(cli(), ["compare", str(REPO / "strategies" / "data.yaml"),
                                        str(REPO / "strategies" / "ulysses.yaml")], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if line.startswith("│")}
    assert "qwen-image on h100" in rows and "qwen-image on v6e-8" in rows
    data = [c.strip() for c in rows["data"].split("│")]
    assert data[2] == "data8" and data[5:7] == ["31.25", "no"] and data[13] == "-"  # usable, fits, $/image
    ulysses = [c.strip() for c in rows["ulysses best"].split("│")]
    assert ulysses[2] == "cfg2 x seq4" and ulysses[5] == "79.15" and ulysses[13].startswith("$")


def test_piped_the_table_keeps_every_column_whole():
    """Not a terminal and no COLUMNS: rich cut the columns that did not fit 140 characters (MFU, collective GiB)
    and cropped $/image to two decimals without a mark; the table is printed at its own width instead."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    done = subprocess.run([sys.executable, "-m", "meshlab", "compare", *map(str, STRATEGIES)], capture_output=True,
                          text=True, cwd=REPO, env=env)
    assert done.returncode == 0, done.stderr
    header = next(line for line in done.stdout.splitlines() if line.startswith("┃ strategy"))
    assert header.rstrip().endswith("┃ MFU ┃ GiB/step ┃")
    row = next(line for line in done.stdout.splitlines() if line.startswith("│ flux-usp"))
    assert re.search(r"│ +\$0\.\d{4} │", row), row


def test_explain_puts_alike_collectives_on_one_row():
    """2d.yaml's img_mod.1 realigns its chunks in 18 alike permutes: one row with 18 ops, not 18 rows."""
    text = CliRunner().invoke(cli(), ["explain", str(REPO / "strategies" / "2d.yaml")], env={"COLUMNS": "240"}).stdout
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in text.splitlines()
            if line.startswith("│ block 0")]
    modulation = [r for r in rows if r[2] == "collective-permute" and r[7].startswith("img_mod.1:")]
    assert len(modulation) == 1 and modulation[0][1] == "18"
    matmul = [r for r in rows if r[7].startswith("img_mlp.net.0.proj:")]
    assert [r[1] for r in matmul] == ["1"] * len(matmul) and len(matmul) == 3  # shards 1, 2, 3 of 3 differ


def test_explain_lists_the_known_differences_of_its_plan_s_model_class():
    """explain (table and JSON) lists the differences from XLA measured on Qwen-Image's class and those for every
    class, and counts the rest (SANA's, Wan's, ...); compare's document, over several models, keeps every one."""
    from meshlab.cost.collectives import known_differences

    document = json.loads(CliRunner().invoke(cli(), ["explain", str(REPO / "strategies" / "2d.yaml"), "--json"]).stdout)
    listed = next(a["source"] for a in document["assumptions"] if a["name"] == "collectives vs XLA")
    assert "collective-permutes of split modulation chunks" in listed and "SANA" not in listed
    for truth in ("xla-tpu", "xla-cpu"):  # a TPU plan: XLA:TPU's program first, then the CPU partitioner's
        others = len(known_differences(truth=truth)) - len(known_differences("QwenImageTransformer2DModel",
                                                                             truth=truth))
        assert f"({others} more, measured on other model classes: meshlab/data/known_differences.yaml)" in listed
    assert listed.endswith(f"({others} more, measured on other model classes: meshlab/data/known_differences.yaml).")
    text = " ".join(CliRunner().invoke(cli(), ["explain", str(REPO / "strategies" / "2d.yaml")]).stdout.split())
    assert "SANA" not in text and f"({others} more, measured on other model classes" in text
    compared = json.loads(CliRunner().invoke(cli(), ["compare", GLOB, "--json"]).stdout)["assumptions"]["v6e-8"]
    assert "SANA" in next(a["source"] for a in compared if a["name"] == "collectives vs XLA")


def test_a_loser_on_another_system_is_not_blamed_on_images_per_call(tmp_path):
    """Wan at 720p, Ulysses on 8 H100s against wan-14b-v6e-8.yaml: both make one video a call, so 'fewer images per
    call' cannot be why it is slower; and the two systems' times rest on different figures, which compare says."""
    path = tmp_path / "wan.yaml"
    done = subprocess.run([sys.executable, "-m", "meshlab", "try", "--model", "wan-2.1-t2v-14b", "--hardware", "h100",
                           "--mesh", "seq=8", "--rules", "ulysses", "--height", "720", "--width", "1280", "--save",
                           str(path)], capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    result = CliRunner().invoke(cli(), ["compare", str(path), str(REPO / "strategies" / "wan-14b-v6e-8.yaml")],
                                env={"COLUMNS": "250"})
    loses = next(line for line in result.stdout.splitlines() if " loses: " in line)
    assert "slower compute/HBM per video" in loses and "videos per call" not in loses
    assert "times priced from: " in result.stdout and "h100: GEMMs measured" in result.stdout


@pytest.mark.parametrize("files, noun", [(["wan-14b-v6e-8.yaml"], "video"), (["2d.yaml"], "image"),
                                         (["wan-14b-v6e-8.yaml", "2d.yaml"], "output")])
def test_the_tables_name_what_the_plans_make(files, noun, tmp_path):
    """Wan's plans make videos: compare and explain price them per video, a table that mixes videos and images
    per output (it read "s/image" and "$/image" for a video)."""
    done = CliRunner().invoke(cli(), ["compare", *(str(REPO / "strategies" / f) for f in files)])
    assert done.exit_code == 0, done.output
    header = next(line for line in done.output.splitlines() if line.startswith("┃ strat"))
    assert f"s/{noun}" in header and f"$/{noun}" in header and f"Time to first {noun} " in done.output
    assert not {"image", "video", "output"} - {noun} & set(re.findall(r"s/(\w+)", header))
    if files == ["wan-14b-v6e-8.yaml"]:  # a loser's reason says video too
        text = (REPO / "strategies" / files[0]).read_text()
        other = tmp_path / "wan-c.yaml"
        other.write_text(text.replace("name: wan-14b-v6e-8", "name: wan-c").replace("  cfg: 2\n  seq: 4",
                                                                                     "  cfg: 1\n  seq: 8"))
        lost = CliRunner().invoke(cli(), ["compare", str(REPO / "strategies" / files[0]), str(other)])
        reason = next(line for line in lost.output.splitlines() if "loses:" in line)
        assert "s/video" in reason and "image" not in lost.output.replace("image tokens", "")
    explained = CliRunner().invoke(cli(), ["explain", str(REPO / "strategies" / files[0])])
    made = "video" if files[0].startswith("wan") else "image"
    assert explained.exit_code == 0 and f"cost per {made}" in explained.output
    assert f"time to first {made}" in explained.output and f"denoise per {made}" in explained.output
