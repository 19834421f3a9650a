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
