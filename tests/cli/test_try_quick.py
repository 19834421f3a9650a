"""`meshlab try --model --hardware --mesh --rules`: a quick question, planned as a strategy file would be."""

import json

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
    (["--model", "qwen-image", "--hardware", "v6e-8", "--mesh", "data=2,bogus=4"], "--mesh axis 'bogus'"),
    (["--model", "qwen-image", "--hardware", "v6e-8", "--mesh", "data=2,model=3"],
     "command line: --mesh: data=2,model=3 uses 6 devices and v6e-8 has 8"),
    (["--model", "qwen-image", "--hardware", "v6e-8", "--mesh", "data=2,model=4", "--rules", "nope"],
     "command line: --rules: --rules 'nope' names no rule family"),
    (["--model", "qwen-image", "--hardware", "v6e-8", "--mesh", "data=8", "--rules", "pairs"],
     "splits weights over model, and --mesh has no model axis"),
    (["--model", "qwen-image", "--hardware", "v5e-8", "--mesh", "data=8", "--text-encoder", "device"],
     "command line: --text-encoder: the text encoder (15.45 GiB) does not fit beside the plan"),
    (["--model", "qwen-image"], "a strategy file, or --model and --hardware, is needed"),
    (["--model", "nosuch", "--hardware", "v6e-8"], "command line: --model"),
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
