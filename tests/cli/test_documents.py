"""Every `--json` document a command prints matches its exported schema (`meshlab schema NAME`), checked here by
jsonschema, a validator independent of the pydantic model that wrote the schema; and a document that does not match
its model is refused at the write, in one line, with nothing printed. The check documents are held to theirs where
the check tests run them (tests/check)."""

import json

import jsonschema
import pytest
from typer.testing import CliRunner

from meshlab.cli.app import app

from tests.conftest import REPO, STRATEGIES

runner = CliRunner()


def schema_of(name: str) -> dict:
    done = runner.invoke(app, ["schema", name])
    assert done.exit_code == 0, done.output
    return json.loads(done.stdout)


def printed(*args: str) -> object:
    done = runner.invoke(app, list(args))
    assert done.exit_code == 0, done.output
    return json.loads(done.stdout)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda p: p.stem)
def test_try_and_explain_of_every_built_in_strategy_match_their_schemas(strategy):
    document = printed("try", str(strategy), "--json")
    jsonschema.validate(document, schema_of("try"))
    assert document["strategy"]["file"] == str(strategy) and len(document["per_chip"]) == document["hardware"]["chips"]
    jsonschema.validate(printed("explain", str(strategy), "--json"), schema_of("explain"))


def test_a_quick_question_s_document_matches_the_try_schema():
    document = printed("try", "--model", "flux-dev", "--hardware", "h100", "--mesh", "ring=2,seq=4", "--rules",
                       "ulysses+ring", "--json")
    jsonschema.validate(document, schema_of("try"))
    assert "text_encoder" in document  # the one key only a quick question's document has


def test_compare_and_sweep_match_their_schemas(tmp_path):
    comparison = printed("compare", *map(str, STRATEGIES), "--json")
    jsonschema.validate(comparison, schema_of("compare"))
    rings = [e for e in comparison["entries"] if e["predicted"]["ring"] is not None]
    assert rings, "flux-usp-h100 runs a ring: the ring's part of the schema is exercised"
    sweep = schema_of("sweep")
    for args in (["--model", "flux-dev", "--hardware", "v6e-8", "--images", "100", "--max-seconds-per-image", "0.01"],
                 ["--model", "qwen-image", "--hardware", "v6e-1,v6e-8"],  # v6e-1 fits nothing: no binding seconds
                 ["--model", "wan-2.1-t2v-1.3b", "--hardware", "v6e-8,h100"]):
        document = printed("sweep", *args, "--json", "--out", str(tmp_path / "best.yaml"))
        jsonschema.validate(document, sweep)
    assert document["hardware"] == ["v6e-8", "h100"] and isinstance(document["assumptions"], dict)


def test_the_catalog_the_cards_the_spec_map_and_the_records_match_their_schemas():
    jsonschema.validate(printed("hardware", "--json"), schema_of("hardware-list"))
    cards = printed("models", "list", "--json")
    jsonschema.validate(cards, schema_of("models-list"))
    assert {c["name"] for c in cards} >= {"qwen-image", "flux-dev", "wan-2.1-t2v-14b"}
    spec_map = printed("export", str(REPO / "strategies" / "2d.yaml"), "--format", "json")
    jsonschema.validate(spec_map, schema_of("spec-map"))
    records = sorted(str(p) for p in (REPO / "experiments" / "records").glob("*.jsonl"))
    rows = printed("report", *records, "--json")
    jsonschema.validate(rows, schema_of("report"))
    assert len(rows) >= 8


def test_a_calibration_matches_its_schema():
    from meshlab.experiments.calibrate import Calibration, calibration_document

    fitted = Calibration(hardware="h200", points=3, slowdown=1.2, overhead_s=0.002, compute_efficiency=0.5,
                         hbm_efficiency=0.6, error_before_pct=20.0, error_after_pct=4.0, attention_kernel="fa3",
                         attention_rates=((4096, 5e14),))
    document = calibration_document(fitted)
    jsonschema.validate(document, schema_of("calibration"))
    with pytest.raises(jsonschema.ValidationError, match="Additional properties"):
        jsonschema.validate({**document, "overrides": {**document["overrides"], "hbm_gb": 32}},
                            schema_of("calibration"))


def test_a_document_its_model_refuses_is_one_line_and_nothing_is_printed(monkeypatch):
    import meshlab.search.try_document as built

    real = built.try_document
    monkeypatch.setattr(built, "try_document", lambda planned: {**real(planned), "colour": "red"})
    done = runner.invoke(app, ["try", str(REPO / "strategies" / "2d.yaml"), "--json"])
    assert done.exit_code == 3
    assert done.stdout == ""  # nothing half-printed
    assert "meshlab: error: meshlab built a TryDocument that its own schema refuses (colour: Extra inputs are not " \
           "permitted); this is a bug in meshlab" in done.output
    monkeypatch.setattr(built, "try_document", lambda planned: {**real(planned), "total_params": "20B"})
    done = runner.invoke(app, ["try", str(REPO / "strategies" / "2d.yaml"), "--json"])
    assert done.exit_code == 3 and "(total_params: Input should be a valid integer)" in done.output
