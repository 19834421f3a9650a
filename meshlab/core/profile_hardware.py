"""A profile as a hardware entry: what `hardware: FILE.json` in a strategy stands for. A GPU's or TPU's catalog entry
with the profile's measured host figures, or, for the CPU, an entry made of the profile's measured rates; the profile
rides along for the cost model (`meshlab.cost.profile` prices a call from it). Pure.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from meshlab.core.errors import InputError
from meshlab.core.hardware import Hardware, load_hardware, with_overrides
from meshlab.core.profile_file import FIX, load_profile
from meshlab.core.profile_points import Profile


def profile_hardware(path: str | Path, devices: int | None, overrides: dict | None = None):
    """The hardware entry a profile stands for: a GPU's or TPU's catalog entry with the profile's measured host
    figures, or (CPU) an entry made of the profile's measured rates; the profile rides along for the cost model.
    `devices`: what the strategy's mesh uses (None: not known yet)."""
    profile = load_profile(path)
    if devices is not None and devices != profile.devices:
        raise InputError(f"{path} was measured on {profile.devices} {profile.platform} device(s), and this mesh uses "
                         f"{devices}: devices sharing a host do not run at one device's rates",
                         f"profile a strategy with a {devices}-device mesh (meshlab profile STRATEGY -o FILE.json)")
    source = f"measured: meshlab profile {Path(path).name}"
    host = {}
    for op, figure in (("host_matmul", "host_flops"), ("host_transfer", "host_link_bandwidth")):
        if rate := profile.rate(op):
            host[figure] = rate
    dispatch = profile.single("dispatch")
    if dispatch is not None:
        host["step_overhead_s"] = dispatch.seconds
    if (dispatched := launch_seconds_per_op(profile)) is not None:
        host["eager_dispatch_s"] = dispatched
    if profile.platform != "cpu":
        if not profile.device.get("hardware"):
            raise InputError(f"{path} names no catalog entry for its {profile.platform} device",
                             "profile again with --hardware NAME (meshlab hardware lists them)")
        base = load_hardware(str(profile.device["hardware"])).using(profile.devices)
        hardware = replace(base, **host, sources={**base.sources, **{k: source for k in host}},
                           name=f"{base.name} (profile {Path(path).name})")
    else:
        hardware = _cpu_hardware(profile, host, source, Path(path).name)
    if overrides:
        hardware = with_overrides(hardware, overrides)
    return replace(hardware, profile=profile)


def launch_seconds_per_op(profile: Profile) -> float | None:
    """Eager PyTorch's host seconds per dispatched op from a profile's launch points (meshlab.workers.measure
    ._launches): the slope between the forwards of fewest and most ops (the blocks' ops alone: what the forward
    does outside them, a wait on the GPU too, falls out), or with one such forward its seconds over its ops; None
    where there is none, or the slope is not positive (noise above the blocks' own time)."""
    points = sorted((p for p in profile.of("launch") if p.shape and p.shape[0] > 0), key=lambda p: p.shape[0])
    if not points:
        return None
    few, many = points[0], points[-1]
    if many.shape[0] == few.shape[0]:
        return min(p.seconds for p in points) / few.shape[0]
    slope = (many.seconds - few.seconds) / (many.shape[0] - few.shape[0])
    return slope if slope > 0 else None


def _cpu_hardware(profile: Profile, host: dict, source: str, name: str):
    linear, copy = profile.rate("linear"), profile.rate("copy")
    if not linear or not copy:
        raise InputError(f"{profile.path} holds no linear or copy points, which a CPU entry is made of", FIX)
    memory = int(profile.device.get("memory_bytes") or 0) or 2**34
    n = profile.devices
    assumed = "assumption: not measured by meshlab profile"
    sources = {
        "interconnect": "the virtual devices share the host's memory: any reaches any (modelled as a switch)",
        "chips": source, "hosts": source, "ici_links": assumed, "topology": source, "wraparound": assumed,
        "hbm_bytes": "the host's memory shared by its virtual devices", "usable_hbm_bytes": "as hbm_bytes",
        "runtime_reserve_bytes": assumed, "host_memory_bytes": source,
        "hbm_bandwidth": f"{source} (copy)", "bf16_flops": f"{source} (linear curve's rate)",
        "ici_link_bandwidth": f"{assumed}; the copy rate", "dcn_bandwidth_per_host": "not applicable: one host",
        "host_link_bandwidth": host.get("host_link_bandwidth") and source or assumed,
        "host_flops": host.get("host_flops") and source or assumed,
        "compute_efficiency": "1: bf16_flops is already the rate reached", "hbm_efficiency": "1: as bf16_flops",
        "collective_latency_s": assumed, "step_overhead_s": source if "step_overhead_s" in host else assumed,
        "checkpoint_read_bandwidth": assumed, "compile_seconds_base": assumed, "compile_seconds_per_block": assumed,
        "compile_seconds_per_scanned_block": assumed,
    }
    return Hardware(
        name=f"cpu-{n} (profile {name})", kind="cpu", chip=str(profile.device.get("name") or "host CPU"),
        interconnect="nvswitch", chips=n, hosts=1, ici_links=1, topology=(n,), wraparound=(True,),
        hbm_bytes=memory // n, usable_hbm_bytes=memory // n, runtime_reserve_bytes=0, host_memory_bytes=memory,
        hbm_bandwidth=copy, bf16_flops=linear, ici_link_bandwidth=copy, dcn_bandwidth_per_host=1.0,
        host_link_bandwidth=host.get("host_link_bandwidth", copy), host_flops=host.get("host_flops", linear),
        compute_efficiency=1.0, hbm_efficiency=1.0, collective_latency_s=1e-5,
        step_overhead_s=host.get("step_overhead_s", 1e-3), checkpoint_read_bandwidth=1e9, compile_seconds_base=0.0,
        compile_seconds_per_block=0.0, compile_seconds_per_scanned_block=0.0, sources=sources)
