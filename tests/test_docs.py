"""The documentation site builds with `mkdocs build --strict` (a broken link or a page left out of the nav fails), and
every command it or the README shows in a ```console block runs as shown.

A console block holds ``$ meshlab ...`` lines, each followed by what it prints (possibly nothing, or its first line
and ``...``). A command whose shown output starts with ``meshlab: error:`` must exit 2 with exactly that line on
stderr; a command ending in a shell comment ``# exits N: why`` must exit N; any other must exit 0 and, when output
is shown, print that first line. Paths under /tmp/ in a command go to
the test's own temporary folder. Commands that build models (check, run, profile, models import) need torch_xla and
take minutes: they are marked like the rest of such tests.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass

import pytest

from tests.conftest import REPO

PAGES = sorted((REPO / "docs").glob("*.md")) + [REPO / "README.md"]
HEAVY = ("check", "run", "profile", "models import")
TPU = "--backend tpu"
DTENSOR = "--backend dtensor"  # every rank builds the full-width block


@dataclass(frozen=True)
class Shown:
    page: str
    command: str  # after "$ "
    output: tuple[str, ...]  # the lines shown under it, "..." included

    @property
    def id(self) -> str:
        return f"{self.page}: {self.command}"


def shown_commands() -> list[Shown]:
    found = []
    for page in PAGES:
        name = page.relative_to(REPO).as_posix()
        for block in re.findall(r"```console\n(.*?)```", page.read_text(), flags=re.S):
            for chunk in re.split(r"^\$ ", block, flags=re.M)[1:]:
                command, *output = chunk.rstrip("\n").split("\n")
                found.append(Shown(name, command, tuple(output)))
    return found


COMMANDS = shown_commands()


def marks(shown: Shown) -> list:
    words = shown.command.split()
    heavy = len(words) > 1 and (words[1] in HEAVY or " ".join(words[1:3]) in HEAVY)
    if not heavy:
        return []
    return [pytest.mark.xla, pytest.mark.slow] + ([pytest.mark.tpu] if TPU in shown.command else []) + (
        [pytest.mark.memory] if DTENSOR in shown.command else [])  # 8 ranks: tests/conftest.py


def test_the_pages_show_commands_and_every_one_is_meshlab():
    assert len(COMMANDS) >= 15
    assert all(c.command.startswith("meshlab ") for c in COMMANDS), [c.id for c in COMMANDS]
    assert any(c.page == "README.md" and c.command == "meshlab try strategies/2d.yaml" for c in COMMANDS)


@pytest.mark.parametrize("shown", [pytest.param(c, marks=marks(c), id=c.id) for c in COMMANDS])
def test_a_shown_command_runs_as_shown(shown: Shown, tmp_path):
    command, _, comment = shown.command.partition("#")
    said = re.match(r"\s*exits (\d+):", comment)
    args = [a.replace("/tmp/", f"{tmp_path}/") for a in command.split()[1:]]
    env = {**os.environ, "COLUMNS": "140", "PJRT_DEVICE": "CPU"}
    done = subprocess.run([sys.executable, "-m", "meshlab", *args], capture_output=True, text=True, cwd=REPO,
                          env=env, timeout=1200)
    first = shown.output[0].rstrip() if shown.output and shown.output[0] != "..." else None
    if first is not None and first.startswith("meshlab: error:"):
        assert done.returncode == 2 and done.stderr.rstrip() == first, done.stderr
        return
    assert done.returncode == (int(said.group(1)) if said else 0), done.stderr[-3000:]
    if first is not None:
        assert done.stdout.splitlines()[0].rstrip() == first


def test_the_site_builds_strictly(tmp_path):
    """mkdocs --strict: every page in the nav, every link and anchor resolves, the API page's module imports."""
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          capture_output=True, text=True, cwd=REPO, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    strategies = (site / "strategies" / "index.html").read_text()
    assert "sequence_parallel" in strategies and "flash_attention" in strategies  # the generated field reference
    assert "load_plan" in (site / "api" / "index.html").read_text()


def test_the_field_reference_covers_every_field_of_the_schema():
    """The hook writes one row per field of every record the strategy holds (nothing hand-copied to drift)."""
    sys.path.insert(0, str(REPO / "docs" / "hooks"))
    try:
        import reference
    finally:
        sys.path.pop(0)
    from meshlab.strategy.schema import Activations, ActivationRule, Compile, Placement, Rule, Strategy, Workload

    text = reference.on_page_markdown("<!-- strategy-fields -->")
    for model in (Strategy, Rule, Activations, ActivationRule, Workload, Placement, Compile):
        assert f"### {model.__name__}" in text
        for name in model.model_fields:
            assert f"| `{name}` |" in text, (model.__name__, name)


def test_the_readme_is_a_front_page():
    assert len((REPO / "README.md").read_text().splitlines()) <= 120
