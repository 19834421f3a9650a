"""`meshlab try --model --hardware --mesh --rules`: a quick question, planned as a strategy file would be."""

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from meshlab.cli.app import app

runner = CliRunner()


@pytest.fixture(autouse=True)
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)


def ask(*args):
    return runner.invoke(app, ["try", *args])


def test_a_quick_question_plans_as_its_saved_file_does(tmp_path):
    asked = ask("--model", "qwen-image", "--hardware", "h100", "--mesh", "data=2,model=4", "--rules", "pairs", "--json")
    saved = ask("--model", "qwen-image", "--hardware", "h100", "--mesh", "data=2,model=4", "--rules", "pairs",
                "--save", str(tmp_path / "q.yaml"), "--json")
    again = ask(str(tmp_path / "q.yaml"), "--json")
    docs = [json.loads(done.output) for done in (asked, saved, again)]
    for doc in docs:
        doc["strategy"].pop("file")
    assert docs[0].pop("text_encoder") == docs[1].pop("text_encoder")  # a file says nothing of how it was chosen
    assert docs[0] == docs[1] == docs[2]
    doc = docs[0]
    assert doc["mesh"] == {"data": 2, "model": 4} and doc["hardware"]["name"] == "h100"
    q = next(p for p in doc["parameters"] if p["name"] == "transformer_blocks.0.attn.to_q.weight")
    assert q["spec"] == ["model", None]  # a column split: q's output over model


def test_defaults_are_the_model_s_pipeline_and_the_encoder_goes_where_it_fits():
    flux = json.loads(ask("--model", "flux-dev", "--hardware", "h100", "--mesh", "data=8", "--json").output)
    assert flux["workload"]["steps"] == 28 and flux["workload"]["cfg"] is False  # guidance-distilled
    one = json.loads(ask("--model", "qwen-image", "--hardware", "h200:1", "--json").output)
    assert one["hardware"]["chips"] == 1 and one["fits"]
    encoder = 8_292_166_656 * 2  # Qwen2.5-VL-7B in bf16, beside the transformer on the one H200
    assert one["per_chip"][0]["breakdown"]["text_encoder"] == encoder


@pytest.mark.parametrize("args, says", [
    (["--model", "qwen-image", "--hardware", "v6e-8", "--mesh", "data=2,bogus=4"], "command line: --mesh: axis 'bogus'"),
    (["--model", "qwen-image", "--hardware", "v6e-8", "--mesh", "data=2,model=3"],
     "command line: --mesh: data=2,model=3 uses 6 devices and v6e-8 has 8"),
    (["--model", "qwen-image", "--hardware", "v6e-8", "--mesh", "data=2,model=4", "--rules", "nope"],
     "command line: --rules: --rules 'nope' names no rule family"),
    (["--model", "qwen-image", "--hardware", "v6e-8", "--mesh", "data=8", "--rules", "pairs"],
     "splits weights over model, and --mesh has no model axis"),
    (["--model", "flux2-dev", "--hardware", "h100:1", "--text-encoder", "device"],
     "command line: --text-encoder: the text encoder (43.47 GiB) does not fit beside the plan"),
    (["--model", "flux-dev", "--hardware", "h100", "--mesh", "seq=8", "--rules", "ulysses+ring"],
     "command line: --rules: --rules ulysses+ring (USP) runs Ulysses over seq and a ring over ring, and --mesh has "
     "no ring axis larger than 1; add ring=N to --mesh"),
    (["--model", "flux-dev", "--hardware", "h100", "--mesh", "seq=8", "--rules", "ulysses+ulysses"],
     "names two families of one kind"),
    (["--model", "qwen-image", "--hardware", "h100", "--mesh", "ring=2,seq=4", "--rules", "ulysses"],
     "command line: --mesh: --mesh has a ring axis, which only USP uses"),
    (["--model", "qwen-image", "--hardware", "h100", "--mesh", "ring=8"], "--rules data would leave it idle"),
    (["--model", "flux-dev", "--hardware", "h100", "--mesh", "model=8", "--rules", "pairs+model"],
     "names two families of one kind"),
    (["--model", "flux-dev", "--hardware", "h100", "--rules", ""], "names no rule family ''"),
    (["--model", "flux-dev", "--hardware", "h100", "--mesh", "cfg=2,data=4"],
     "command line: --mesh: --mesh splits the guidance branches over cfg, and flux-dev runs without CFG"),
    (["--model", "qwen-image", "--hardware", "v6e-8", "--text-encoder", "gpu"], "is not auto, host or device"),
    (["--model", "qwen-image"], "a strategy file, or --model and --hardware, is needed"),
    (["--model", "nosuch", "--hardware", "v6e-8"], "command line: --model"),
    # tokens the sequence degree cannot split: the mesh's degree or the size is at fault, not --rules
    (["--model", "flux-dev", "--hardware", "h100:4", "--mesh", "seq=4", "--rules", "ring", "--height", "1040",
      "--width", "1040"], "command line: --mesh and --height/--width/--text-tokens: the sequence axes seq split 4225"),
])
def test_bad_flags_are_one_line_naming_the_flag(args, says):
    done = ask(*args)
    assert done.exit_code == 2 and says in done.output and "Traceback" not in done.output


def test_a_rule_that_matches_nothing_is_a_located_warning_or_with_strict_an_error(tmp_path):
    from tests.conftest import REPO

    path = tmp_path / "typo.yaml"
    path.write_text((REPO / "strategies" / "2d.yaml").read_text().replace('match: "*"', 'match: "transformer_block.*"'))
    assert 'match: "transformer_block.*"' in path.read_text()
    runner_err = CliRunner(mix_stderr=False) if "mix_stderr" in CliRunner.__init__.__code__.co_varnames else runner
    warned = runner_err.invoke(app, ["try", str(path)])
    assert warned.exit_code == 0
    line = next(n for n, text in enumerate(path.read_text().splitlines(), 1) if "transformer_block.*" in text)
    assert f"warning: {path}:{line}:" in warned.stderr and "matches no parameter of qwen-image" in warned.stderr
    refused = runner_err.invoke(app, ["try", str(path), "--strict"])
    assert refused.exit_code == 2 and f"error: {path}:{line}:" in refused.stderr
    clean = runner_err.invoke(app, ["try", str(REPO / "strategies" / "2d.yaml"), "--strict"])
    assert clean.exit_code == 0 and "warning" not in clean.stderr


def test_the_text_encoder_goes_where_it_fits_and_the_answer_says_where():
    """On a GPU the encoder sits on the device when the plan still fits with it (as diffusers places it), else on
    the host; on a TPU on the host (as a PyTorch/XLA pipeline runs it)."""
    two = json.loads(ask("--model", "flux2-dev", "--hardware", "h200:1", "--json").output)
    one = json.loads(ask("--model", "flux2-dev", "--hardware", "h100:1", "--json").output)
    assert two["per_chip"][0]["breakdown"]["text_encoder"] > 0 and "on the device" in two["text_encoder"]
    assert one["per_chip"][0]["breakdown"]["text_encoder"] == 0 and "no room" in one["text_encoder"]
    assert one["fits"] and two["fits"]
    tpu = json.loads(ask("--model", "qwen-image", "--hardware", "v6e-8", "--json").output)
    assert tpu["per_chip"][0]["breakdown"]["text_encoder"] == 0 and "on the host" in tpu["text_encoder"]
    refused = ask("--model", "flux2-dev", "--hardware", "h100:1", "--text-encoder", "device", "--save", "s.yaml")
    assert refused.exit_code == 2 and not (Path.cwd() / "s.yaml").exists()  # refused before anything is written


def test_a_saved_question_about_a_card_file_plans_from_its_own_folder_and_never_overwrites_the_card(tmp_path):
    from tests.conftest import REPO

    card = tmp_path / "wan.json"
    card.write_text((REPO / "meshlab" / "models" / "cards" / "wan-2.1-t2v-14b.json").read_text())
    (tmp_path / "sub").mkdir()
    saved = ask("--model", "wan.json", "--hardware", "v6e-8", "--mesh", "cfg=2,seq=4", "--save", "sub/s.yaml",
                "--json")
    assert saved.exit_code == 0, saved.output
    doc = json.loads(saved.output)
    assert doc["workload"]["frames"] == 81 and doc["workload"]["width"] == 832  # the Wan pipeline's defaults
    assert "model: ../wan.json" in (tmp_path / "sub" / "s.yaml").read_text()
    before = card.read_text()
    clobber = ask("--model", "wan.json", "--hardware", "v6e-8", "--save", "wan.json")
    assert clobber.exit_code == 2 and card.read_text() == before


def test_two_slices_put_data_across_them():
    doc = json.loads(ask("--model", "qwen-image", "--hardware", "v6e-8x2", "--mesh", "data=4,model=4",
                         "--json").output)
    assert doc["hardware"]["chips"] == 16 and doc["fits"]


def test_heads_a_ulysses_degree_does_not_divide_suggest_the_usp_that_uses_every_device():
    """Wan 2.1 1.3B's 12 heads over 8 GPUs: the fix suggests Ulysses 4 x ring 2 (every GPU busy) before the nearest
    divisor of 12 (6, which 8 GPUs cannot hold), and the suggested flags plan."""
    done = ask("--model", "wan-2.1-t2v-1.3b", "--hardware", "h100", "--mesh", "seq=8", "--rules", "ulysses")
    assert done.exit_code == 2, done.output
    line = " ".join(done.output.split())
    assert "12 heads, not divisible by 8; split heads 4 ways (it divides 12 heads and 8 devices) and ring the other " \
           "2: Ulysses 4 x ring 2" in line and line.endswith("or split heads 6 ways, the nearest degree that divides " \
                                                             "12 (any of [1, 2, 3, 4, 6, 12])")
    suggested = ask("--model", "wan-2.1-t2v-1.3b", "--hardware", "h100", "--mesh", "ring=2,seq=4", "--rules",
                    "ulysses+ring")
    assert suggested.exit_code == 0, suggested.output

