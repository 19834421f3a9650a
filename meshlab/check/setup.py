"""What `meshlab check` runs, planned without torch: the strategy at full depth (as `meshlab try` plans it), and
the same strategy over the card cut to the checked depth with the workload of the checked forward.

Both the CLI process and its torch worker call ``check_setup`` with the same arguments and get the same plan.
"""

from __future__ import annotations

import math
import dataclasses
from dataclasses import dataclass
from pathlib import Path

from meshlab.plan.inputs import batch_axes
from meshlab.models.families import Geometry, family, geometry
from meshlab.models.card import ModelCard
from meshlab.models.truncate import truncate_card
from meshlab.plan.axes import GUIDANCE_AXIS
from meshlab.core.errors import InputError, Location, MeshlabError
from meshlab.plan.memory import MemoryReport, memory_on
from meshlab.plan.plan import Plan
from meshlab.plan.planner import make_plan
from meshlab.plan.planned import PlannedStrategy, plan_file, workload_with
from meshlab.strategy.schema import Strategy


@dataclass(frozen=True)
class CheckOptions:
    """The checked model and forward: blocks per block list, image size, text tokens, seed."""

    layers: int = 2  # two blocks of each kind: the first is a middle block, which the prediction is held to
    height: int = 128
    width: int = 128
    text_tokens: int | None = None  # None: 32, or the count the model's forward requires (Wan I2V: 512)
    frames: int | None = None  # video frames; None: 1 for an image model, two latent frames for a video model
    seed: int = 0
    dump_dir: Path | None = None  # keep XLA's dump here; None: a temporary folder, removed afterwards
    scan: bool | None = None  # run block lists through torch_xla's scan; None: the strategy's compile.scan_blocks
    #: images per call; None: one sample per chip along every axis that splits the batch (the check on CPU)
    batch: int | None = None

    def to_json(self) -> dict:
        return {"layers": self.layers, "height": self.height, "width": self.width,
                "text_tokens": self.text_tokens, "frames": self.frames, "seed": self.seed, "scan": self.scan,
                **({"batch": self.batch} if self.batch is not None else {})}


@dataclass(frozen=True)
class CheckSetup:
    planned: PlannedStrategy  # the strategy file at full depth and its own workload
    card: ModelCard  # the card cut to the checked depth
    strategy: Strategy  # the strategy with the checked forward's workload
    plan: Plan  # the checked model's plan
    memory: MemoryReport  # meshlab's per-device estimate for the checked model and forward
    geometry: Geometry
    options: CheckOptions

    @property
    def full_blocks(self) -> dict[str, int]:
        """Blocks per list at full depth, by ModuleList name."""
        return self.card.source["truncated"]["of"]

    @property
    def scan(self) -> bool:
        """Block lists through torch_xla's scan: --scan, or the strategy's compile.scan_blocks."""
        return self.strategy.compile.scan_blocks

    @property
    def checked_blocks(self) -> dict[str, int]:
        return self.card.source["truncated"]["layers_per_list"]


def check_setup(path: str | Path, options: CheckOptions) -> CheckSetup:
    planned = plan_file(path)
    try:
        return _setup(planned, options)
    except MeshlabError as exc:
        raise planned.loaded.place(exc) from None


def _setup(planned: PlannedStrategy, options: CheckOptions) -> CheckSetup:
    _ = family(planned.card.class_name)  # a class meshlab cannot build is refused before any worker starts
    if options.text_tokens is None:
        options = dataclasses.replace(options, text_tokens=planned.card.architecture.text_tokens or 32)
    card = truncate_card(planned.card, options.layers)
    # one sample per chip along every axis that splits the batch (the guidance axis doubles it: both branches)
    axes = batch_axes(planned.strategy.activations, planned.plan.mesh)
    batch = math.prod(planned.plan.mesh.size(a) for a in axes)
    if options.batch is not None:  # the workload's images, both guidance branches in one call on a cfg axis
        batch = options.batch * (2 if GUIDANCE_AXIS in axes else 1)
    arch = card.architecture
    frames = options.frames if options.frames is not None else (arch.temporal_scale_factor + 1 if arch.is_video else 1)
    try:
        geo = geometry(card, options.height, options.width, options.text_tokens, batch, frames)
    except InputError as exc:  # --height, --width or --frames: the command line's, not a strategy line's
        raise exc.at(Location("command line")) from None
    images = batch // 2 if GUIDANCE_AXIS in axes else batch
    workload = workload_with(planned.strategy.workload, height=options.height, width=options.width,
                             text_tokens=options.text_tokens, batch=images, frames=frames)
    scan = options.scan if options.scan is not None else planned.strategy.compile.scan_blocks
    # the memory counts what --scan stacks, and the weights and VAE as the checked program holds them (at
    # workload.dtype: the memory-only weights_dtype and vae_dtype describe a PyTorch script's storage, not it)
    strategy = planned.strategy.model_copy(update={
        "workload": workload.model_copy(update={"weights_dtype": None}),
        "placement": planned.strategy.placement.model_copy(update={"vae_dtype": None}),
        "compile": planned.strategy.compile.model_copy(update={"scan_blocks": scan})})
    plan = make_plan(strategy, card, planned.plan.mesh.device_count)
    hardware = planned.hardware
    memory = memory_on(plan, strategy, hardware)
    setup = CheckSetup(planned, card, strategy, plan, memory, geo, options)
    if setup.scan:  # refuse here, before a worker starts, what scan cannot run
        from meshlab.parallelisms.scan import homogeneous_specs

        for name, count in setup.full_blocks.items():
            homogeneous_specs(planned.plan, name, count)
    return setup
