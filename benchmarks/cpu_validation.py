"""Hold meshlab's time model against a run it measured itself, on this machine's CPU (issue 8).

    python benchmarks/cpu_validation.py [--devices 1|8] [--profile FILE.json] [--steps 5] [--json]

1. Profile the CPU (``meshlab profile``) at the plan's shapes, unless ``--profile`` names one already measured for
   the same plan on this machine.
2. Run ``meshlab run --checkpoint random --layers 2`` at 256x256, classifier-free guidance, on 1 device (every
   weight whole) or 8 virtual devices (``strategies/model.yaml``'s rules), with that profile as the hardware.
3. Print the measured steady step against the prediction the run recorded (blocks: the 1- and 3-block calls),
   and against the other two ways a profile can compose a step (each block timed alone; op by op).

With 8 virtual devices, the 8 share this machine's 2 cores: every device's shard runs, so a step costs about as
much as the whole model on one device plus the collectives (memory copies here), and the profile measured the
same sharing, which is why it stays comparable.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
ONE = ROOT / "experiments" / "strategies" / "qwen-image-one-cpu.yaml"
MODEL = ROOT / "strategies" / "model.yaml"


def strategy_text(devices: int, profile: Path, steps: int) -> str:
    """The validation strategy for `devices`, naming `profile` as its hardware."""
    import yaml

    source = ONE if devices == 1 else MODEL
    data = yaml.safe_load(source.read_text())
    data.update(name=f"cpu-validation-{devices}", hardware=str(profile.resolve()))
    data["workload"] = {"height": 256, "width": 256, "batch": 1, "steps": steps, "cfg": True, "text_tokens": 32,
                        "dtype": "bfloat16"}
    return yaml.safe_dump(data, sort_keys=False)


def validate(devices: int, profile: Path | None, steps: int, folder: Path, progress=print) -> dict:
    from meshlab.experiments.profiling import ProfileOptions, profile_strategy
    from meshlab.experiments.options import RunOptions
    from meshlab.experiments.run import run_strategy

    strategy = folder / f"cpu-validation-{devices}.yaml"
    measured_profile = profile is None
    profile = profile or folder / f"cpu-{devices}.json"
    strategy.write_text(strategy_text(devices, profile, steps))
    profile_s = None
    if measured_profile:
        outcome = profile_strategy(strategy, ProfileOptions(out=profile, backend="xla", vae=False),
                                   lambda m: progress(f"profile: {m}"))
        profile_s = outcome.seconds
    progress("run: --checkpoint random --layers 2")
    run = run_strategy(strategy, RunOptions(checkpoint="random", layers=2, backend="xla", results_dir=folder,
                                            out_dir=folder / "out"))
    record = run.record
    measured = record["timings"]["steady_step_median_s"]
    predicted = record["prediction"]["step_s"]
    return {"devices": devices, "profile": str(profile), "profile_seconds": profile_s,
            "text_tokens": record["prediction"].get("text_tokens"), "measured_steady_step_s": measured,
            "predicted_step_s": predicted, "error_pct": 100 * (predicted - measured) / measured,
            "compositions": compositions(strategy, record["prediction"].get("text_tokens"), measured)}


def compositions(strategy: Path, text_tokens: int | None, measured: float) -> dict:
    """The step as each way of composing it from the profile prices it, and its error against `measured`."""
    from meshlab.models.truncate import block_lists
    from meshlab.cost.predict import predict
    from meshlab.cost.profile import by_blocks, by_ops
    from meshlab.cost.timing import op_seconds
    from meshlab.plan.planned import at_depth, plan_file, with_workload

    planned = at_depth(plan_file(strategy), 2)
    if text_tokens:
        planned = with_workload(planned, text_tokens=text_tokens)
    p = predict(planned.plan, planned.strategy, planned.hardware)
    profile, hw = planned.hardware.profile, planned.hardware
    lists = block_lists(planned.card)  # every list at the run's 2 blocks
    alone = replace(profile, points=tuple(pt for pt in profile.points if pt.op != "stack"))
    ways = {"blocks (1- and 3-block calls)": by_blocks(profile, lists, p.layout.tokens.text, p.layout.calls),
            "blocks (each block timed alone)": by_blocks(alone, lists, p.layout.tokens.text, p.layout.calls),
            "ops (each op timed alone)": by_ops(profile, p.work, lambda w: op_seconds(w, hw))}
    out = {}
    for name, way in ways.items():
        if way is None:
            continue
        collectives = 0.0 if way.collectives_included else p.step.collective
        step = p.layout.calls * way.seconds + collectives + p.step.overhead
        out[name] = {"step_s": step, "error_pct": 100 * (step - measured) / measured}
    return out


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", type=int, choices=(1, 8), default=1)
    parser.add_argument("--profile", type=Path, help="a profile already measured for this plan on this machine")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="meshlab-validation-") as folder:
        result = validate(args.devices, args.profile, args.steps, Path(folder),
                          (lambda m: None) if args.json else (lambda m: print(m, file=sys.stderr)))
    if args.json:
        print(json.dumps(result, indent=1))
        return 0
    print(f"{args.devices} device(s), text tokens {result['text_tokens']}: measured steady step "
          f"{result['measured_steady_step_s']:.3f} s, predicted {result['predicted_step_s']:.3f} s "
          f"({result['error_pct']:+.1f}%)" + (f"; profile took {result['profile_seconds']:.0f} s"
                                               if result["profile_seconds"] else ""))
    for name, way in result["compositions"].items():
        print(f"  {name:34s} {way['step_s']:.3f} s ({way['error_pct']:+.1f}%)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
