"""README.md opens with the two commands; .ci/run must run exactly the README's test command."""

import shlex

from tests.conftest import REPO


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line and not line.startswith("#")]


def test_readme_opens_with_main_job_and_tests():
    main_job, tests = readme_commands()
    assert main_job.endswith("meshlab try strategies/2d.yaml")
    assert "pytest" in tests


def test_ci_runs_exactly_the_readme_test_command():
    ci_lines = (REPO / ".ci" / "run").read_text().splitlines()
    assert readme_commands()[1] in ci_lines


def test_the_test_command_runs_every_test_once():
    """The parallel pass leaves out exactly the tests the serial pass runs alone (marked `serial`)."""
    passes = [shlex.split(part.split("-m pytest", 1)[1]) for part in readme_commands()[1].split(" && ")
              if "-m pytest" in part]
    assert passes == [["-q", "-n", "auto", "--maxprocesses", "2", "--dist", "loadfile", "-m",
                       "not serial"], ["-q", "-m", "serial"]]
