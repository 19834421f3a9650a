"""How `meshlab run` is asked to run a strategy (the command line's options, and an experiment's), as one value the
run, its record, the compile cache and the experiment expansion all read."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

RUN_BACKENDS = ("xla", "dtensor", "torch")


@dataclass(frozen=True)
class RunOptions:
    checkpoint: str  # a local pipeline folder, or "tiny" to build the tiny offline pipeline
    prompt: str = "a red cube on a blue table"
    negative_prompt: str | None = "blurry, low quality"
    steps: int | None = None  # None: the strategy's workload
    height: int | None = None
    width: int | None = None
    cfg_scale: float = 4.0
    seed: int = 0
    out_dir: Path = Path("out")
    results_dir: Path = Path("experiments/results")
    cache_dir: Path | None = None  # persistent XLA compile cache; None: none
    force: bool = False  # run a plan that does not fit
    verify: bool = False  # also run the stock pipeline on the CPU and record the largest pixel difference
    experiment: str | None = None
    timeout_s: float = 3600.0
    scan: bool | None = None  # block lists through torch_xla's scan; None: the strategy's compile.scan_blocks
    #: "xla": PyTorch/XLA SPMD; "dtensor": torch.distributed DTensor, one process per device; "torch": plain
    #: PyTorch on one device (eager, SDPA); "auto": torch (one device) or dtensor on a CUDA host, else xla
    backend: str = "auto"
    layers: int | None = None  # with checkpoint "random": blocks per list (and text-encoder layers) to build
    batch: int | None = None  # None: the strategy's workload (an experiment's workloads may set these two)
    cfg: bool | None = None
