"""A middle block's collectives by XLA:TPU against meshlab's, over every TPU strategy the repository checks
(strategies/ and the agreement matrix in tests/cost/data/strategies/), at small size so that the whole matrix takes
minutes here (3 blocks of each list, 256x256, 32 text tokens, torch_xla's program, v6e-8).

    python benchmarks/tpu_matrix.py --out benchmarks/results/tpu_matrix_256.txt

Per strategy: "agrees" or the differences `meshlab check --backend tpu` reports for the kinds it holds (count and
bytes within 10% per kind; temporaries are left out here: see benchmarks/tpu_aot.py). Figures for the note; nothing
here asserts.

    python benchmarks/tpu_matrix.py --capture tests/cost/data/tpu_block_collectives.json

also keeps XLA:TPU's middle blocks, count and bytes per collective kind, with the command and the libtpu that made
them: tests/cost/test_tpu_issued.py holds meshlab's prediction to them without compiling.

    python benchmarks/tpu_matrix.py --only tests/cost/data/strategies/wan-seq2-model4.yaml \
        --out benchmarks/results/tpu_matrix_256.txt --capture tests/cost/data/tpu_block_collectives.json

compiles only the strategies named, and replaces their rows (and captured blocks) in the files given, keeping the
others.

    python benchmarks/tpu_matrix.py --temporaries benchmarks/results/tpu_matrix_256_temporaries.json

also keeps, per strategy, meshlab's working set against the temporaries XLA:TPU's program holds at once in HBM and
on chip (VMEM; v4: CMEM) (and in HBM alone), and whether they agree, and prints how many do.

    python benchmarks/tpu_matrix.py --workload-size --timeout 900 --out benchmarks/results/tpu_matrix_workload.txt \
        --temporaries benchmarks/results/tpu_matrix_workload_temporaries.json

compiles each plan at its workload's own size (image or video, batch and text tokens as the strategy has them), still 3
blocks of each list: where the fit question is asked. Each row adds both fit verdicts (meshlab's for the program
compiled, and for the plan as planned, with its own attention), and the JSON each plan's forward, fit and compile
seconds. A plan that takes longer than --timeout seconds is recorded as not compiled, with the time. Rows do not say
their size: keep each size's rows in files of their own.

    python benchmarks/tpu_matrix.py --repredict benchmarks/results/tpu_matrix_256_temporaries.json
    python benchmarks/tpu_matrix.py --repredict benchmarks/results/tpu_matrix_workload_temporaries.json \
        --workload-size --out benchmarks/results/tpu_matrix_workload.txt

compile nothing: they recompute meshlab's side of a --temporaries record with the code as it is (the working set;
at the workload's size both fit verdicts too, and every --out row from them), keep XLA:TPU's figures (its compiles
are deterministic for one libtpu; its fit verdict is held again to the catalog's usable HBM), and mark the record
(its "_repredicted" key). Collectives are not recomputed: tests/cost/test_tpu_issued.py holds them to the captured
blocks.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ARGS = ("--backend", "tpu", "--front-end", "torch-xla", "--layers", "3", "--height", "256", "--width", "256",
        "--text-tokens", "32", "--json")
#: --workload-size: the check's own size, the strategy's workload (3 blocks of each list still)
WORKLOAD_ARGS = ("--backend", "tpu", "--front-end", "torch-xla", "--layers", "3", "--json")


def text_tokens(path: Path) -> list[str]:
    """The --text-tokens a strategy's model takes: ARGS's 32, or the count its forward requires (Wan I2V's 512)."""
    import yaml

    from meshlab.models.card import load_card

    model = (yaml.safe_load(path.read_text()) or {}).get("model", "")
    try:
        required = load_card(model, path.parent).architecture.text_tokens
    except Exception:  # noqa: BLE001 - an unreadable model is the check's to report
        required = 0
    return ["--text-tokens", str(required)] if required else []


def batch(path: Path) -> list[str]:
    """--batch where the workload's images do not split over the axes that split the batch (2d-4x2.yaml: 2 images
    over data 4): the fewest that do, at least the workload's; none otherwise (the check compiles the workload's)."""
    import math

    from meshlab.plan.axes import GUIDANCE_AXIS
    from meshlab.plan.inputs import batch_axes
    from meshlab.plan.planned import plan_file

    try:
        planned = plan_file(path)
    except Exception:  # noqa: BLE001 - an unreadable strategy is the check's to report
        return []
    axes = batch_axes(planned.strategy.activations, planned.plan.mesh)
    split = math.prod(planned.plan.mesh.size(a) for a in axes) // (2 if GUIDANCE_AXIS in axes else 1)
    images = planned.strategy.workload.batch
    return [] if split <= 1 or images % split == 0 else ["--batch", str(split * -(-images // split))]


def check_args(path: Path, workload: bool) -> list[str]:
    """The `meshlab check` options a plan's row compiles with."""
    args = list(WORKLOAD_ARGS if workload else ARGS)
    if text_tokens(path) and not workload:
        at = args.index("--text-tokens")
        args[at:at + 2] = text_tokens(path)
    return args + batch(path)


def check_options(path: Path, workload: bool):
    """The check's options (meshlab.check.setup.CheckOptions) a row compiles with, resolved as the check resolves
    them (the workload's size where the row gives none)."""
    from meshlab.check.against_tpu import tpu_options
    from meshlab.check.setup import CheckOptions

    args = check_args(path, workload)
    given = {flag[2:].replace("-", "_"): int(args[i + 1]) for i, flag in enumerate(args)
             if flag in ("--layers", "--height", "--width", "--text-tokens", "--batch")}
    return tpu_options(path, CheckOptions(**given), set(given))


def predicted(path: Path, workload: bool) -> tuple[int, bool, bool, int]:
    """meshlab's side of a row, without compiling: the working set (`activations_as_compiled`) of the program the row
    compiles (torch_xla's), whether that program fits every chip (`fits.predicted`), whether the plan does with its
    own attention (`fits.predicted_as_planned`), and the chip's usable HBM they are held to."""
    from meshlab.check.against_tpu import compiled_memory, fits_every_chip
    from meshlab.check.setup import check_setup

    setup = check_setup(path, check_options(path, workload))
    compiled, usable = compiled_memory(setup, "torch-xla"), setup.planned.hardware.usable_hbm_bytes
    return (compiled.most_loaded.denoise, fits_every_chip(compiled, usable), fits_every_chip(setup.memory, usable),
            usable)


def repredict(record: Path, workload: bool, rows: Path | None = None) -> None:
    """meshlab's side of a --temporaries record again, from the code, XLA:TPU's kept (its compiles are deterministic
    for one libtpu): each plan's prediction and, where it moved, whether it agrees (the check's tolerance, against
    the figure the check holds: in HBM and on chip, else in HBM, else the temp buffer); in a --workload-size record
    meshlab's fit verdicts too (and XLA:TPU's, from the bytes it asked for, against the chip's usable HBM as the
    catalog has it now), and every row of `rows` (the matrix's --out) with the verdicts the record has and the fit
    difference where meshlab's is not XLA:TPU's. The record says so."""
    from meshlab.check.against_tpu import TEMPS_TOLERANCE

    data = json.loads(record.read_text())
    moved, verdicts = False, {}
    for name, t in data.items():
        if name.startswith("_"):
            continue
        working_set, fits, fits_as_planned, usable = predicted(REPO / name, workload)
        if workload and t.get("fits"):
            was = dict(t["fits"])
            required = t["fits"]["xla_required_bytes"]
            xla = t["fits"]["xla"] if t["fits"]["xla"] is None or required is None else (
                not t["fits"]["xla_refusal"] and required <= usable)
            t["fits"] |= {"predicted": fits, "predicted_as_planned": fits_as_planned, "xla": xla,
                          "usable_hbm_bytes": usable}
            verdicts[name] = t["fits"]
            if t["fits"] != was:
                moved = True
                print(f"{name}: fits by meshlab {_yes(fits)} (as planned {_yes(fits_as_planned)}), by XLA:TPU "
                      f"{_yes(xla)} (was {_yes(was['predicted'])}, {_yes(was['predicted_as_planned'])}, "
                      f"{_yes(was['xla'])})")
        if working_set == t["predicted"]:
            continue
        moved = True
        held = next((t[k] for k in ("xla_working_set_live_at_once", "xla_live_at_once", "xla_temp_buffer")
                     if t.get(k) is not None), None)
        was = t["agrees"]
        t["predicted"] = working_set
        if held is not None:
            t["agrees"] = abs(held - working_set) <= TEMPS_TOLERANCE * max(held, 1)
        print(f"{name}: predicted {working_set}" + (f" against {held}: {'agrees' if t['agrees'] else 'differs'}"
                                                     f"{'' if was == t['agrees'] else ' (moved)'}" if held else ""))
    if verdicts and rows is not None:
        lines = rows.read_text().splitlines()
        refitted = [_refit(line, verdicts.get(line.split(": ", 1)[0])) for line in lines]
        if refitted != lines:
            rows.write_text("".join(line + "\n" for line in refitted))
    elif verdicts and moved:
        print("the rows' fit verdicts are not rewritten: give the matrix's --out", file=sys.stderr)
    if not moved:
        return
    where = (lambda path: path.resolve().relative_to(REPO) if path.resolve().is_relative_to(REPO) else path)
    data["_repredicted"] = ("meshlab's side recomputed without compiling: python benchmarks/tpu_matrix.py "
                            f"--repredict {where(record)}" + (" --workload-size" if workload else "")
                            + (f" --out {where(rows)}" if rows is not None and verdicts else ""))
    record.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")


def _refit(line: str, fits: dict | None) -> str:
    """A workload row with meshlab's fit verdicts as `fits` has them now (the line as it is where None)."""
    if fits is None or "; fits: XLA:TPU " not in line:
        return line
    name, rest = line.split(": ", 1)
    listed = rest.rsplit("; fits: XLA:TPU ", 1)[0]
    differences = [d for d in ([] if listed == "agrees" else listed.split("; ")) if not d.startswith("fits: ")]
    return row_text(name, differences, fits, workload=True)


def row_text(name: str, differences: list[str], fits: dict, workload: bool) -> str:
    """One row of the matrix: the check's differences (or "agrees"), where meshlab's fit verdict is not XLA:TPU's
    the check's difference saying so, and at the workload's size both verdicts."""
    from meshlab.check.against_tpu import fits_difference

    mismatch = fits["xla"] is not None and fits["xla"] != fits["predicted"]
    differences = [d for d in differences if not d.startswith("fits: ")]
    differences = [fits_difference(fits["predicted"], fits["xla"])] * mismatch + differences
    verdict = (f"; fits: XLA:TPU {_yes(fits['xla'])}, meshlab {_yes(fits['predicted'])} (as planned, its own "
               f"attention: {_yes(fits['predicted_as_planned'])})") if workload else ""
    return f"{name}: " + ("agrees" if not differences else "; ".join(differences)) + verdict


def row(path: Path, captured: dict | None = None, temporaries: dict | None = None, workload: bool = False,
        timeout: float | None = None) -> str:
    args = check_args(path, workload)
    name = str(path.relative_to(REPO))
    done = _check([sys.executable, "-m", "meshlab", "check", name, *args], timeout)
    if not done.stdout.startswith("{"):
        for kept in (captured, temporaries):  # one kept from before would stand for a program that no longer compiles
            if kept is not None:
                kept.pop(name, None)
        return f"{name}: not compiled: {done.stderr.strip().splitlines()[-1] if done.stderr.strip() else '?'}"
    doc = json.loads(done.stdout)
    differences = [d for d in doc["differences"] if not d.startswith("temporaries")]
    if temporaries is not None:
        xla = doc["xla_memory_per_device"] or {}
        temporaries[name] = {
            "predicted": doc["meshlab_memory_per_device"]["activations_as_compiled"],
            "xla_live_at_once": xla.get("temporaries_live_peak"), "xla_temp_buffer": xla.get("temporaries"),
            "xla_working_set_live_at_once": xla.get("working_set_live_peak"), "vmem": xla.get("vmem"),
            "cmem": xla.get("cmem"), "agrees": not [d for d in doc["differences"] if d.startswith("temporaries")],
            "options": doc["options"],
            **({"forward": doc["forward"], "fits": doc["fits"], "compile_seconds": doc["compile_seconds"]}
               if workload else {})}
    if captured is not None:
        blocks = doc["middle_blocks"]
        captured[name] = {
            "command": " ".join(["meshlab", "check", name, *args]), "options": doc["options"],
            "front_end": doc["front_end"], "libtpu": version("libtpu"),
            "blocks": {b: {kind: [count, doc["collective_bytes_per_block"][b][kind]]
                           for kind, count in sorted(doc["collectives_per_block"].get(b, {}).items())}
                       for b in blocks}}
    return row_text(name, differences, doc["fits"], workload)


def _yes(verdict: bool | None) -> str:
    return "?" if verdict is None else "yes" if verdict else "no"


def _check(command: list[str], timeout: float | None) -> subprocess.CompletedProcess:
    """Run one check; past `timeout` seconds stop it and its worker (their own process group: SIGINT, which the
    check's worker protocol answers by killing the worker and removing its scratch folder; SIGKILL after 30 s).
    SIGINT is set back to its default in the check, which a shell's `&` starts with it ignored (so Python would
    install no handler for it)."""
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO,
                          start_new_session=True,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)) as check:
        try:
            out, err = check.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(check.pid, signal.SIGINT)
            try:
                check.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(check.pid, signal.SIGKILL)
                check.communicate()
            return subprocess.CompletedProcess(command, 124, "", f"not done in {timeout:g} s (--timeout)")
    return subprocess.CompletedProcess(command, check.returncode, out, err)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--capture", type=Path, help="keep XLA:TPU's middle blocks here (JSON)")
    parser.add_argument("--temporaries", type=Path, help="keep each plan's temporaries, by both, here (JSON)")
    parser.add_argument("--only", type=Path, nargs="+", help="compile these strategies alone, and replace their rows "
                        "and captured blocks in --out and --capture, keeping the others")
    parser.add_argument("--workload-size", action="store_true",
                        help="compile at each strategy's workload size, not 256x256 with 32 text tokens")
    parser.add_argument("--timeout", type=float, help="seconds one plan's check may take (default: no limit)")
    parser.add_argument("--repredict", type=Path, help="recompute meshlab's side of this --temporaries record "
                        "(with --workload-size where it was made so); compiles nothing")
    args = parser.parse_args()
    if args.repredict:
        repredict(args.repredict, args.workload_size, args.out)
        return 0
    files = sorted((REPO / "strategies").glob("*.yaml")) + sorted((REPO / "tests/cost/data/strategies").glob("*.yaml"))
    if args.only:
        files = [path.resolve() for path in args.only]
        outside = [str(path) for path in files if not path.is_relative_to(REPO)]
        if outside:
            parser.error(f"--only takes strategies inside the repository ({REPO}): {', '.join(outside)}")
    kept = json.loads(args.capture.read_text()) if args.only and args.capture and args.capture.exists() else {}
    captured = kept if args.capture else None
    temporaries = ({} if not (args.only and args.temporaries.exists()) else json.loads(args.temporaries.read_text())
                   ) if args.temporaries else None
    rows = {}
    for path in files:
        rows[str(path.relative_to(REPO))] = row(path, captured, temporaries, args.workload_size, args.timeout)
        print(rows[str(path.relative_to(REPO))], flush=True)
    if temporaries is not None:
        if not args.only:  # every plan compiled again: none is recomputed (with --only, the others may be)
            temporaries.pop("_repredicted", None)
        plans = [t for name, t in temporaries.items() if not name.startswith("_")]
        held = [t for t in plans if t["xla_working_set_live_at_once"] is not None]
        print(f"temporaries: {sum(t['agrees'] for t in held)} of {len(held)} agree (the check's tolerance); "
              f"{len(plans) - len(held)} not read")
        args.temporaries.write_text(json.dumps(temporaries, indent=1, sort_keys=True) + "\n")
    if args.out:
        old = args.out.read_text().splitlines() if args.only and args.out.exists() else []
        every = {line.split(": ", 1)[0]: line for line in old} | rows
        order = [str(p.relative_to(REPO)) for p in sorted((REPO / "strategies").glob("*.yaml"))
                 + sorted((REPO / "tests/cost/data/strategies").glob("*.yaml"))]
        lines = [every[name] for name in order if name in every] + [line for name, line in every.items()
                                                                    if name not in order]
        args.out.write_text("\n".join(lines) + "\n")
    if args.capture:
        args.capture.write_text(json.dumps(captured, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
