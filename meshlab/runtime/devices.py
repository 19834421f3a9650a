"""Where a torch_xla child process runs: the real accelerator when there is one, else N virtual CPU devices.

Decided without importing torch (the parent stays light). SPMD needs the environment set before torch_xla
starts, so meshlab runs its torch work in a child process with this environment.
"""

from __future__ import annotations

import glob
import importlib.util
import os


def accelerator_platform() -> str | None:
    """The PJRT platform of this host's accelerator: PJRT_DEVICE when set, "TPU" when one is attached, else None."""
    chosen = os.environ.get("PJRT_DEVICE")
    if chosen:
        return None if chosen.upper() == "CPU" else chosen.upper()
    tpu_devices = glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*")
    if tpu_devices and importlib.util.find_spec("libtpu") is not None:
        return "TPU"
    return None  # a GPU needs a CUDA build of torch_xla and an explicit PJRT_DEVICE=CUDA


def child_environment(device_count: int, extra_xla_flags: str = "", libtpu_flags: list[str] | tuple[str, ...] = ()
                      ) -> dict[str, str]:
    """The environment of a torch_xla child: the accelerator as found, or `device_count` virtual CPU devices;
    `libtpu_flags` (a strategy's compile.libtpu_flags) after any LIBTPU_INIT_ARGS the environment sets (libtpu reads
    them on a TPU host, or in an ahead-of-time compile; nothing else does)."""
    env = dict(os.environ)
    platform = accelerator_platform()
    if platform is None:
        env["PJRT_DEVICE"] = "CPU"
        env["CPU_NUM_DEVICES"] = str(device_count)
    else:
        env["PJRT_DEVICE"] = platform
    if extra_xla_flags:
        env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {extra_xla_flags}".strip()
    if libtpu_flags:
        env["LIBTPU_INIT_ARGS"] = " ".join([env.get("LIBTPU_INIT_ARGS", ""), *libtpu_flags]).strip()
    return env


def torch_environment() -> dict[str, str]:
    """The environment of a child that runs plain torch or torch.distributed (no SPMD): diffusers imports torch_xla
    whenever it is installed, and torch_xla then warns that it picks the CPU; saying so keeps it quiet."""
    env = dict(os.environ)
    env.setdefault("PJRT_DEVICE", "CPU")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    return env
