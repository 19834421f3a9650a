"""Do the planning commands print the same bytes as at another commit? For refactors that must change no behaviour.

    python benchmarks/same_outputs.py 31f2e0c          # this tree against commit 31f2e0c

Checks out REF into a temporary git worktree and runs, in both trees, on every built-in strategy: `try`,
`try --json`, `explain`; then `compare` and `compare --json` over all of them, `sweep --json` for three models (the
best plan it writes too), `hardware --json` and `models list`. Each tree runs its own code (PYTHONPATH), from this
environment. Prints each output that differs, with the first differing lines; the wall-clock field `sweep_seconds`
is masked. Exit 0 when all agree. Nothing here is a test: it is evidence for a note, and it takes about 2 minutes.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SWEEPS = (("qwen-image", "v6e-8"), ("flux-dev", "h100"), ("wan-2.1-t2v-14b", "v6e-8,h100"))
MASKED = re.compile(r'"sweep_seconds": [0-9.e+-]+')


def commands(tree: Path, scratch: Path) -> dict[str, list[str]]:
    strategies = sorted(str(p.relative_to(tree)) for p in (tree / "strategies").glob("*.yaml"))
    found = {}
    for s in strategies:
        stem = Path(s).stem
        found |= {f"try {stem}": ["try", s], f"try --json {stem}": ["try", s, "--json"],
                  f"explain {stem}": ["explain", s]}
    found |= {"compare": ["compare", *strategies], "compare --json": ["compare", *strategies, "--json"]}
    for model, hardware in SWEEPS:
        found[f"sweep {model}"] = ["sweep", "--model", model, "--hardware", hardware, "--json",
                                   "--out", str(scratch / f"{model}.yaml")]
    return found | {"hardware --json": ["hardware", "--json"], "models list": ["models", "list"]}


def outputs(tree: Path, scratch: Path) -> dict[str, str]:
    # no compile times a check measured here (meshlab.plan.compile_times): both trees price the compile alike
    env = {**os.environ, "PYTHONPATH": str(tree), "COLUMNS": "140", "MESHLAB_COMPILE_TIMES": os.devnull + ".none"}
    found = {}
    for name, args in commands(tree, scratch).items():
        done = subprocess.run([sys.executable, "-m", "meshlab", *args], capture_output=True, text=True, cwd=tree,
                              env=env)
        found[name] = MASKED.sub('"sweep_seconds": <masked>', done.stdout + done.stderr) + f"\nexit {done.returncode}"
        if name.startswith("sweep "):
            best = scratch / f"{args[2]}.yaml"
            found[f"{name} best plan"] = best.read_text() if best.exists() else "(none written)"
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ref", help="the commit to compare this tree against")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="meshlab-same-") as scratch:
        other = Path(scratch) / "other"
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(other), args.ref], check=True)
        try:
            (Path(scratch) / "a").mkdir()
            (Path(scratch) / "b").mkdir()
            before, after = outputs(other, Path(scratch) / "a"), outputs(REPO, Path(scratch) / "b")
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(other)], check=False)
    differ = [name for name in after if before.get(name) != after[name]]
    for name in differ:
        diff = list(difflib.unified_diff(before.get(name, "").splitlines(), after[name].splitlines(), args.ref,
                                         "this tree", lineterm="", n=0))
        print(f"DIFFERS: {name}\n" + "\n".join(diff[:12]))
    print(f"{len(after) - len(differ)} of {len(after)} outputs identical to {args.ref}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
