"""`meshlab schema`: the strategy file's JSON Schema, which editors use to validate and complete strategy files."""

import json

import jsonschema
import pytest
import yaml
from typer.testing import CliRunner

from meshlab.cli.app import app

from tests.conftest import STRATEGIES

runner = CliRunner()


def schema() -> dict:
    result = runner.invoke(app, ["schema"])
    assert result.exit_code == 0
    return json.loads(result.stdout)


@pytest.mark.parametrize("strategy", STRATEGIES, ids=lambda p: p.stem)
def test_every_built_in_strategy_validates(strategy):
    jsonschema.validate(yaml.safe_load(strategy.read_text()), schema())


@pytest.mark.parametrize("change, message", [
    ({"mesh": {"model": "eight"}}, "is not of type 'integer'"),
    ({"rules": [{"match": "*", "shard": "diagonal"}]}, "'diagonal' is not one of"),
    ({"colour": "red"}, "Additional properties are not allowed"),
])
def test_a_broken_strategy_does_not(change, message):
    document = yaml.safe_load(STRATEGIES[0].read_text()) | change
    with pytest.raises(jsonschema.ValidationError, match=message):
        jsonschema.validate(document, schema())


def test_fields_carry_their_descriptions():
    properties = schema()["properties"]
    assert properties["mesh"]["description"].startswith("ordered mesh axes")
    assert schema()["title"] == "meshlab strategy"


def test_shell_completion_completes_commands():
    """What a shell asks the console script when the user presses tab (bash's protocol, which the script that
    `meshlab --install-completion` installs speaks): the commands that start with what was typed."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from tests.conftest import REPO

    script = Path(sys.executable).parent / "meshlab"

    def complete(typed: str) -> list[str]:
        env = {**os.environ, "_MESHLAB_COMPLETE": "complete_bash", "COMP_WORDS": typed,
               "COMP_CWORD": str(len(typed.split()) - 1)}
        done = subprocess.run([str(script)], capture_output=True, text=True, cwd=REPO, env=env)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    assert complete("meshlab tr") == ["try"]
    assert complete("meshlab c") == ["check", "compare", "calibrate"]


# ---- every file meshlab reads or writes: `meshlab schema NAME` ----

from meshlab.cli.schemas import SCHEMAS  # noqa: E402

from tests.conftest import REPO  # noqa: E402


def schema_of(name: str) -> dict:
    result = runner.invoke(app, ["schema", name])
    assert result.exit_code == 0, result.output
    found = json.loads(result.stdout)
    jsonschema.Draft202012Validator.check_schema(found)
    return found


def test_every_schema_is_a_json_schema_with_its_title():
    assert list(SCHEMAS) == ["strategy", "experiment", "hardware-overrides", "hardware-entry", "card", "run-record",
                             "profile", "cache-manifest", "compile-times", "worker-request", "worker-result", "worker-payload", "try", "compare",
                             "sweep", "explain", "check", "check-dtensor", "check-tpu", "spec-map", "hardware-list",
                             "models-list", "report", "calibration"]
    for name, (title, _) in SCHEMAS.items():
        assert schema_of(name)["title"] == title


def test_an_unknown_schema_is_a_one_line_error():
    result = runner.invoke(app, ["schema", "strategies"])
    assert result.exit_code == 2
    assert "no schema named 'strategies'; use one of: strategy, experiment" in result.output


def test_the_shipped_experiments_records_and_profiles_validate():
    experiment, record, profile = schema_of("experiment"), schema_of("run-record"), schema_of("profile")
    files = sorted((REPO / "experiments").glob("*.yaml"))
    for path in files:
        jsonschema.validate(yaml.safe_load(path.read_text()), experiment)
    lines = [line for path in sorted((REPO / "experiments" / "records").glob("*.jsonl"))
             for line in path.read_text().splitlines() if line.strip()]
    for line in lines:
        jsonschema.validate(json.loads(line), record)
    profiles = [json.loads(p.read_text()) for p in sorted((REPO / "experiments" / "profiles").glob("*.json"))]
    profiles = [p for p in profiles if isinstance(p, dict) and "meshlab_profile" in p]
    for document in profiles:
        jsonschema.validate(document, profile)
    assert len(files) == 2 and len(lines) >= 8 and len(profiles) >= 3  # as shipped today
    with pytest.raises(jsonschema.ValidationError, match="'seconds' is a required property"):
        broken = {**profiles[0], "points": [{k: v for k, v in profiles[0]["points"][0].items() if k != "seconds"}]}
        jsonschema.validate(broken, profile)


def test_every_catalog_system_validates_as_a_hardware_entry():
    hardware = yaml.safe_load((REPO / "meshlab" / "data" / "hardware.yaml").read_text())
    entry = schema_of("hardware-entry")
    for system in hardware["systems"].values():
        merged = hardware["accelerators"][system["accelerator"]] | {k: v for k, v in system.items()
                                                                    if k != "accelerator"}
        jsonschema.validate(merged, entry)
    with pytest.raises(jsonschema.ValidationError, match="'topology' is a required property"):
        jsonschema.validate({k: v for k, v in merged.items() if k != "topology"}, entry)


def test_overrides_are_checked_as_the_loader_reads_them():
    from meshlab.core.errors import InputError
    from meshlab.core.hardware import load_hardware

    overrides = schema_of("hardware-overrides")
    good = {"usable_hbm_bytes": "31.25GiB", "topology": "2x4", "usd_per_chip_hour": None, "matmul_rates": "none",
            "compute_efficiency": 0.5}
    jsonschema.validate(good, overrides)
    assert load_hardware("v6e-8", good).usable_hbm_bytes == int(31.25 * 2**30)
    for bad, message in (({"hbm_gb": 32}, "Additional properties"),
                         ({"chips": None}, "None is not valid under any of the given schemas")):
        with pytest.raises(jsonschema.ValidationError, match=message):
            jsonschema.validate(bad, overrides)
        with pytest.raises(InputError):
            load_hardware("v6e-8", bad)
    strategy = yaml.safe_load(STRATEGIES[0].read_text())
    jsonschema.validate(strategy | {"hardware": {"name": "v6e-8", "usable_hbm_bytes": "30GiB"}}, schema())
    with pytest.raises(jsonschema.ValidationError, match="Additional properties"):
        jsonschema.validate(strategy | {"hardware": {"name": "v6e-8", "hbm_gb": 32}}, schema())


def test_worker_requests_and_results_validate():
    from meshlab.runtime.protocol import WorkerError, WorkerResult
    from meshlab.runtime.requests import BuildTinyRequest, TorchRunRequest

    request, result = schema_of("worker-request"), schema_of("worker-result")
    jsonschema.validate(json.loads(BuildTinyRequest(build_tiny="/tmp/tiny").model_dump_json()), request)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"build_tiny": "/tmp/tiny", "colour": "red"}, request)
    assert {"$ref": "#/$defs/TorchRunRequest"} in request["anyOf"] and TorchRunRequest.__name__ in request["$defs"]
    failed = WorkerResult(error=WorkerError(type="InputError", status="refused", problem="p", fix="f"))
    jsonschema.validate(json.loads(failed.model_dump_json()), result)
    jsonschema.validate(json.loads(WorkerResult(ok={"seconds": 1.5}).model_dump_json()), result)


def test_every_built_in_card_and_test_card_validates_as_a_card():
    card = schema_of("card")
    files = sorted((REPO / "meshlab" / "models" / "cards").glob("*.json"))
    files += sorted((REPO / "tests" / "cost" / "data" / "cards").glob("*.json"))
    for path in files:
        jsonschema.validate(json.loads(path.read_text()), card)
    assert len(files) >= 7
    broken = json.loads(files[0].read_text())
    broken["parameters"][0]["kind"] = "lora"
    with pytest.raises(jsonschema.ValidationError, match="'lora' is not one of"):
        jsonschema.validate(broken, card)
