"""A TPU system as libtpu names it, and what the process that compiles for it needs (no jax here: the parent of
``meshlab check --backend tpu`` asks these before it starts the worker that loads libtpu,
meshlab.workers.libtpu)."""

from __future__ import annotations

from dataclasses import dataclass

from meshlab.core.errors import InputError, MissingExtra
from meshlab.core.hardware import Hardware

INSTALL_FIX = "pip install -e '.[tpu]' (jax, jaxlib, libtpu and torchax from the package index)"
#: Catalog accelerators and the names libtpu gives them in a topology (``<name>:<topology>``).
GENERATIONS = {"v4": "v4", "v5e": "v5e", "v5p": "v5p", "v6e": "v6e"}


@dataclass(frozen=True)
class Topology:
    """A TPU system as libtpu names it."""

    name: str  # e.g. "v6e:2x4"
    slices: int
    chip_config: str | None  # "megacore" for v4 and v5p (two TensorCores act as one device per chip)
    chips: int

    def to_json(self) -> dict:
        return {"name": self.name, "slices": self.slices, "chip_config": self.chip_config, "chips": self.chips}


def topology_of(hardware: Hardware) -> Topology:
    """The libtpu topology of a catalog TPU system; an InputError for a GPU, a CPU profile or an unknown chip."""
    if hardware.kind != "tpu":
        raise InputError(f"--backend tpu compiles for a TPU system, and {hardware.name} is a {hardware.kind}",
                         "name a TPU system as the strategy's hardware (v6e-8, v5e-8, v5p-8, v4-8, ...), or check "
                         "with --backend xla or dtensor")
    generation = hardware.name.split("-")[0]
    if generation not in GENERATIONS:
        raise InputError(f"libtpu knows no topology for {hardware.name}",
                         f"use one of the catalog's TPU generations: {', '.join(GENERATIONS)}")
    name = f"{GENERATIONS[generation]}:{'x'.join(map(str, hardware.topology))}"
    megacore = "megacore" if generation in ("v4", "v5p") else None
    return Topology(name, hardware.slices, megacore, hardware.chips)


def environment(topology: Topology) -> dict[str, str]:
    """What libtpu wants in the environment of the process that loads it."""
    chips = topology.chips // topology.slices
    accelerator = topology.name.split(":")[0] + f"-{chips * (2 if topology.chip_config else 1)}"
    return {"TPU_ACCELERATOR_TYPE": accelerator, "TPU_WORKER_HOSTNAMES": "localhost",
            "ALLOW_MULTIPLE_LIBTPU_LOAD": "1", "TF_CPP_MIN_LOG_LEVEL": "3"}


def require(torchax: bool = False) -> None:
    import importlib.util

    missing = [m for m in ("jax", "libtpu", *(["torchax"] if torchax else [])) if importlib.util.find_spec(m) is None]
    if missing:
        raise MissingExtra(f"{', '.join(missing)} {'is' if len(missing) == 1 else 'are'} not installed, and "
                           "XLA:TPU compiles through them", INSTALL_FIX)
