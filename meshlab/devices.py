"""Where a torch_xla child process runs: the real accelerator when there is one, else N virtual CPU devices.

Decided without importing torch (the parent stays light). SPMD needs the environment set before torch_xla
starts, so meshlab runs its torch work in a child process with this environment.
"""

from __future__ import annotations

import os
from pathlib import Path


def accelerator_platform() -> str | None:
    """'TPU' or 'CUDA' when this host has one (or PJRT_DEVICE says so), else None."""
    chosen = os.environ.get("PJRT_DEVICE")
    if chosen:
        return None if chosen.upper() == "CPU" else chosen.upper()
    if any(Path("/dev").glob("accel*")) or Path("/dev/vfio").exists() and any(Path("/dev/vfio").iterdir()):
        return "TPU"
    if Path("/dev/nvidiactl").exists():
        return "CUDA"
    return None


def child_environment(device_count: int, extra_xla_flags: str = "") -> dict[str, str]:
    """The environment of a torch_xla child: the accelerator as found, or `device_count` virtual CPU devices."""
    env = dict(os.environ)
    platform = accelerator_platform()
    if platform is None:
        env["PJRT_DEVICE"] = "CPU"
        env["CPU_NUM_DEVICES"] = str(device_count)
    else:
        env["PJRT_DEVICE"] = platform
    if extra_xla_flags:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {extra_xla_flags}".strip()
    return env
