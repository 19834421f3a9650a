"""Pricing a plan's transformer call from a measured profile (`meshlab profile`). Pure. The profile's values and
fitted curves are ``meshlab.core.profile_points``; its file format ``meshlab.core.profile_file``;
the hardware entry a profile stands for ``meshlab.core.profile_hardware``.

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
from dataclasses import dataclass

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
