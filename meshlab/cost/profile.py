"""Pricing a plan's transformer call from a measured profile (`meshlab profile`). Pure. The profile's values and
fitted curves are ``meshlab.core.profile_points``; its file format ``meshlab.core.profile_file``.

A profile is a JSON file of points measured on one device, each an op class at a shape with its FLOPs, bytes and
seconds, plus one fitted curve per op class (seconds = latency + size / rate over the sizes measured). It names
its device (platform, device count, the catalog entry for a GPU or TPU, the host's cores and memory) and the
plan it was measured for (model config, mesh, rules, image tokens, dtype), so its points are that plan's shard
shapes.

Two ways to price one transformer call from it:

- **blocks**: the transformer under the plan at one block per list (the "outer" point: embeddings, one block,
  output) and at three ("stack"), each compiled and timed whole, as many calls in one program as a step makes, at
  a few text lengths. A call of depth L costs outer + (L - 1) x the slope between the two, interpolated between
  text lengths (each block timed alone stands in when there is no stack point). On an XLA device a fused program
  is not the sum of its ops, and collectives inside the blocks are measured with them. Used when the plan, image
  tokens and dtype are the profile's.
- **ops**: each Linear and attention priced from its measured point at that shape, else interpolated along
  tokens between points of the same weight shape, else from its class's curve; the rest of the call's work
  (norm weights) at the measured copy bandwidth; each collective from its measured points over its axes, else
  as the topology model times it.

Measured on this machine's CPU (torch_xla, 1 device, benchmarks/cpu_validation.py): blocks composes within 5% of
a full run, each block timed alone about 19% over, and op by op about 35% over (each op alone pays its own dtype
conversions and dispatch, which XLA fuses away in a whole program), so blocks is used wherever it applies.

Anything priced outside the measured range says how far it extrapolates (`Priced.stretch`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from meshlab.core.errors import InputError
from meshlab.core.profile_file import FIX, load_profile
from meshlab.core.profile_points import Priced, Profile

def plan_key(model_digest: str, mesh: dict, rules: list, activations: dict, image_tokens: int, batch: int,
             dtype: str, cfg_axis: bool) -> str:
    """What makes a profile's outer and block points this plan's: the same shard shapes at every text length."""
    import hashlib

    identity = json.dumps([model_digest, mesh, rules, activations, image_tokens, batch, dtype, cfg_axis],
                          sort_keys=True, default=str)
    return hashlib.sha256(identity.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class MeasuredCall:
    """One transformer call on one chip, priced from a profile."""

    basis: str  # "blocks" (the call compiled and timed whole) or "ops" (op by op)
    seconds: float
    collectives_included: bool  # blocks on several devices: the collectives ran inside what was timed
    measured: tuple[str, ...]  # what the figure rests on that was measured
    assumed: tuple[str, ...]  # what fell back to the catalog's assumed efficiencies
    stretch: float = 1.0  # the largest extrapolation beyond the measured sizes (1: none)
    note: str = ""
    #: collectives of a call and step priced from measured points, and those priced by the topology model (when
    #: they are not inside the timed call)
    collectives_measured: int = 0
    collectives_assumed: int = 0


def price_call(profile: Profile, key: str, blocks: dict[str, int], text_tokens: float, work: tuple,
               fallback, calls: int = 1) -> MeasuredCall:
    """A call of `blocks` (list -> blocks) at `text_tokens`, by blocks when the profile measured this plan (`key`),
    else op by op; `fallback(work)` gives an op's seconds from the catalog's assumptions."""
    if profile.plan.get("key") == key and profile.of("outer"):
        priced = by_blocks(profile, blocks, text_tokens, calls)
        if priced is not None:
            return priced
    note = ("" if profile.plan.get("key") == key else
            f"the profile was measured for {profile.plan.get('strategy')!r} at {profile.plan.get('image_tokens')} "
            "image tokens; this plan's call is priced op by op")
    return by_ops(profile, work, fallback, note)


def by_blocks(profile: Profile, blocks: dict[str, int], text_tokens: float, calls: int = 1) -> MeasuredCall | None:
    """Seconds per call: the one-block call plus each further block at the slope between it and the deeper call
    (shared among block lists as their blocks alone compare), else at a block alone's time."""
    outer = profile.sequence("outer", text_tokens, calls=calls)
    if outer is None:
        return None
    seconds, stretch, measured = outer.seconds, outer.stretch, [f"one-block call ({outer.how})"]
    alone = {name: profile.sequence("block", text_tokens, name, calls) for name in blocks}
    stack = profile.sequence("stack", text_tokens, calls=calls)
    if stack is not None:
        depth = max(p.shape[3] for p in profile.of("stack"))
        slope = (stack.seconds - outer.seconds) / (depth - 1)
        known = {n: a.seconds for n, a in alone.items() if a is not None}
        share = {n: known[n] / sum(known.values()) if len(known) == len(blocks) and sum(known.values()) else
                 1 / len(blocks) for n in blocks}
        stretch = max(stretch, stack.stretch)
        per_block = {n: slope * share[n] for n in blocks}  # the slope adds one block to every list
        measured.append(f"{depth}-block call ({stack.how})")
        how = f"a block at the slope between the 1- and {depth}-block calls"
    elif all(a is not None for a in alone.values()):
        per_block = {n: a.seconds for n, a in alone.items()}
        stretch = max([stretch] + [a.stretch for a in alone.values()])
        how = "each further block timed alone"
    else:
        return None
    for name, count in blocks.items():
        if count > 1:
            seconds += (count - 1) * per_block[name]
            measured.append(f"{name} x {count - 1}")
    return MeasuredCall("blocks", seconds, profile.devices > 1, tuple(measured), (), stretch,
                        f"the call at one block per list, plus {how}, at the plan's shapes")


def by_ops(profile: Profile, work: tuple, fallback, note: str = "") -> MeasuredCall:
    seconds, stretch, measured, assumed = 0.0, 1.0, [], []
    copy = profile.rate("copy")
    for w in work:
        priced = profile.op_seconds(w.kind, w.shape, w.flops) if w.kind in ("linear", "attention") else None
        if priced is None and w.kind in ("other", "elementwise") and copy:
            priced = Priced(w.hbm_bytes / copy, "fitted")
        if priced is None:
            seconds += w.count * fallback(w)
            assumed.append(w.name)
            continue
        seconds += w.count * priced.seconds
        stretch = max(stretch, priced.stretch)
        measured.append(w.name)
    return MeasuredCall("ops", seconds, False, tuple(measured), tuple(assumed), stretch, note)


# ---- a profile as a hardware entry ----


def profile_hardware(path: str | Path, devices: int | None, overrides: dict | None = None):
    """The hardware entry a profile stands for: a GPU's or TPU's catalog entry with the profile's measured host
    figures, or (CPU) an entry made of the profile's measured rates; the profile rides along for the cost model.
    `devices`: what the strategy's mesh uses (None: not known yet)."""
    from meshlab.core.hardware import load_hardware

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
        from meshlab.core.hardware import with_overrides

        hardware = with_overrides(hardware, overrides)
    return replace(hardware, profile=profile)


def _cpu_hardware(profile: Profile, host: dict, source: str, name: str):
    from meshlab.core.hardware import Hardware

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
    }
    return Hardware(
        name=f"cpu-{n} (profile {name})", kind="cpu", chip=str(profile.device.get("name") or "host CPU"),
        interconnect="nvswitch", chips=n, hosts=1, ici_links=1, topology=(n,), wraparound=(True,),
        hbm_bytes=memory // n, usable_hbm_bytes=memory // n, runtime_reserve_bytes=0, host_memory_bytes=memory,
        hbm_bandwidth=copy, bf16_flops=linear, ici_link_bandwidth=copy, dcn_bandwidth_per_host=1.0,
        host_link_bandwidth=host.get("host_link_bandwidth", copy), host_flops=host.get("host_flops", linear),
        compute_efficiency=1.0, hbm_efficiency=1.0, collective_latency_s=1e-5,
        step_overhead_s=host.get("step_overhead_s", 1e-3), checkpoint_read_bandwidth=1e9, compile_seconds_base=0.0,
        compile_seconds_per_block=0.0, sources=sources)
