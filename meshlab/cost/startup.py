"""Time to first image: loading the weights, compiling the step, then the first call. Pure, no torch; predicted.

- **read_s**: every weight the pipeline loads (transformer, text encoders, VAE) in the workload's dtype, read by
  each host from its storage at ``checkpoint_read_bandwidth`` (hosts read in parallel, each the whole checkpoint,
  as ``from_pretrained`` does);
- **transfer_s**: what each chip holds of them over its host link (``host_link_bandwidth``; chips in parallel);
- **compile_s**: XLA:TPU's own compile of this plan at this size where `meshlab check --backend tpu` measured it
  (``Hardware.compile_measured``, meshlab.plan.compile_times); otherwise ``compile_seconds_base +
  compile_seconds_per_block x blocks`` (the catalog's figures: XLA:TPU compiles measured ahead of time on TPUs, 0 for
  eager PyTorch on GPUs), where a list run through scan compiles one block body, so it counts once, plus
  ``compile_seconds_per_scanned_block`` for each block it stacks (the program stacks every block's weights);
- **first_call_s**: the first pipeline call end to end, its images together (the steady state's seconds per image
  times the images of one call).

Dollars: the system's price for the whole wait; over N images in one session, the startup and the whole calls that
make them (the last call may be part empty) shared among them.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshlab.models.card import DTYPE_BYTES, ModelCard
from meshlab.models.truncate import block_lists
from meshlab.core.hardware import Hardware
from meshlab.plan.memory import encoder_resident
from meshlab.strategy.schema import Strategy


@dataclass(frozen=True)
class Startup:
    """Before the first image (seconds, predicted)."""

    read_s: float
    transfer_s: float
    compile_s: float
    compiled_blocks: int  # blocks the compile is priced for (a scanned list counts once)
    checkpoint_bytes: int
    compile_measured: bool = False  # XLA:TPU's own compile of this plan and size (else the catalog's model)
    stacked_blocks: int = 0  # the blocks of the scanned lists, whose weights the program stacks

    @property
    def total(self) -> float:
        return self.read_s + self.transfer_s + self.compile_s

    def to_json(self) -> dict:
        return {"read_s": self.read_s, "transfer_s": self.transfer_s, "compile_s": self.compile_s,
                "compiled_blocks": self.compiled_blocks, "stacked_blocks": self.stacked_blocks,
                "checkpoint_bytes": self.checkpoint_bytes,
                "compile": "measured" if self.compile_measured else "modelled", "startup_s": self.total}


def startup(card: ModelCard, strategy: Strategy, hardware: Hardware, weights_per_chip: int) -> Startup:
    """`weights_per_chip`: the transformer's bytes on the busiest chip (its shards, padded as allocated)."""
    itemsize = DTYPE_BYTES[strategy.workload.dtype]
    checkpoint = (card.total_params + sum(c.parameters for c in card.components)) * itemsize
    placement = strategy.placement
    on_chip = weights_per_chip + itemsize * (
        (card.component("vae").parameters if placement.vae == "device" and card.component("vae") else 0)
        + sum(encoder_resident(c, placement.encoder_place(c.name), hardware.chips) for c in card.encoders))
    lists = block_lists(card)
    scanned = strategy.compile.scan_blocks
    blocks = len(lists) if scanned else sum(lists.values())
    stacked = sum(lists.values()) if scanned else 0
    measured = hardware.compile_measured
    compile_s = measured.seconds if measured is not None else (
        hardware.compile_seconds_base + hardware.compile_seconds_per_block * blocks
        + hardware.compile_seconds_per_scanned_block * stacked)
    return Startup(checkpoint / hardware.checkpoint_read_bandwidth, on_chip / hardware.host_link_bandwidth,
                   compile_s, blocks, checkpoint, measured is not None, stacked)


def usd_per_image_over(images: int, startup_s: float, call_s: float, images_per_call: int,
                       usd_per_hour: float | None) -> float | None:
    """Dollars per image over `images` images in one session: the startup, then as many whole calls as make them
    (a call makes `images_per_call` together, in `call_s`), shared among them (None: no price)."""
    if usd_per_hour is None:
        return None
    return usd_per_hour * (startup_s + session_calls(images, images_per_call) * call_s) / 3600.0 / images


def session_calls(images: int, images_per_call: int) -> int:
    """Calls that make `images` images when each makes `images_per_call`: the last may be part empty."""
    return -(-images // max(images_per_call, 1))
