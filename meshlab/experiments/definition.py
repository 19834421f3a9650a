"""An experiment: which strategies to run, at which workloads, with which checkpoint and prompt."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

from pydantic import Field, ValidationError

from meshlab.core.errors import InputError
from meshlab.core.closed import Closed, Int
from meshlab.strategy.loader import validation_error
from meshlab.strategy.yaml_source import read_yaml
from meshlab.experiments.options import RunOptions


class WorkloadOverride(Closed):
    """Workload fields to set on every strategy of the experiment (unset fields keep the strategy's)."""

    height: Optional[Int] = Field(None, ge=16, le=16384)
    width: Optional[Int] = Field(None, ge=16, le=16384)
    steps: Optional[Int] = Field(None, ge=1, le=1000)
    batch: Optional[Int] = Field(None, ge=1, le=4096)
    cfg: Optional[bool] = Field(None)


class Experiment(Closed):
    """Strategies x workloads, run in sequence by `meshlab run experiments/<name>.yaml`."""

    EXAMPLE = "experiments/tiny-cpu.yaml"

    name: str = Field(min_length=1, max_length=200, description="names the experiment in reports")
    description: str = Field("", description="what it measures")
    strategies: list[str] = Field(min_length=1, description="strategy files, relative to this file")
    workloads: list[WorkloadOverride] = Field(default_factory=lambda: [WorkloadOverride()], min_length=1,
                                              description="each strategy runs once per workload")
    checkpoint: str = Field(description="a local pipeline folder (save_pretrained layout), or 'tiny' to build one")
    prompt: str = Field("a red cube on a blue table", description="the prompt")
    negative_prompt: Optional[str] = Field("blurry, low quality", description="with cfg, the negative prompt")
    seed: Int = Field(0, description="latents seed")


def is_experiment(path: Path) -> bool:
    """An experiment file lists `strategies:`; a strategy file has `mesh:`."""
    document = read_yaml(path)
    return isinstance(document.data, dict) and "strategies" in document.data


def load_experiment(path: Path) -> Experiment:
    document = read_yaml(path)
    try:
        experiment = Experiment.model_validate(document.data)
    except ValidationError as exc:
        raise validation_error(exc, document, Experiment) from None
    for index, strategy in enumerate(experiment.strategies):
        if not (path.parent / strategy).is_file():
            raise InputError(f"strategy file {strategy!r} not found", "paths are relative to the experiment file",
                             document.locate(("strategies", index)))
    return experiment


def experiment_runs(path: Path, options: RunOptions) -> list[tuple[Path, RunOptions]]:
    """The experiment's strategies x workloads, each with its run options (the experiment's checkpoint and
    prompt win over the command line's defaults)."""
    from dataclasses import replace

    experiment = load_experiment(path)
    runs = []
    for strategy in experiment.strategies:
        for workload in experiment.workloads:
            run_options = replace(options, checkpoint=experiment.checkpoint, prompt=experiment.prompt,
                                  negative_prompt=experiment.negative_prompt, seed=experiment.seed,
                                  experiment=experiment.name, steps=given(workload.steps, options.steps),
                                  height=given(workload.height, options.height),
                                  width=given(workload.width, options.width),
                                  batch=given(workload.batch, options.batch), cfg=given(workload.cfg, options.cfg))
            runs.append((Path(os.path.normpath(path.parent / strategy)), run_options))
    return runs


def given(value, default):
    """`value` where it is set (0 is a value), else `default`."""
    return default if value is None else value
