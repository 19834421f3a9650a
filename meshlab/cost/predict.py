"""A plan's predicted cost: FLOPs, HBM bytes, collectives and time per step and per image. Pure, no torch."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

from meshlab.cost.collectives import Collective, derive, issued_on, windows_open
from meshlab.cost.flops import Work, chip_work, graph_flops
from meshlab.cost.graph import graph_of
from meshlab.cost.layout import Layout, layout_of
from meshlab.cost.pipeline_time import Terms, pipeline_terms
from meshlab.cost.ring import tool_issued
from meshlab.cost.startup import Startup, startup
from meshlab.cost.timing import Assumptions, CatalogPricing, StepTime, async_hidden_of, step_time
from meshlab.cost.topology import route
from meshlab.core.hardware import Hardware
from meshlab.plan.plan import Plan
from meshlab.strategy.schema import Strategy


@dataclass(frozen=True)
class Prediction:
    """Everything predicted about one plan on its hardware. All times in seconds, all figures predicted."""

    layout: Layout
    work: tuple[Work, ...]  # one chip, one transformer call
    collectives: tuple[Collective, ...]  # one chip, one transformer call (and the per-step ones)
    step: StepTime
    model_flops_per_call: float  # one sample, unsharded
    chips: int
    peak_flops: float  # one chip, 100%
    terms: Terms | None = None  # one image end to end, term by term (meshlab.cost.pipeline_time)
    measured: object = None  # meshlab.cost.profile.MeasuredCall when the hardware is a profile
    pricing: CatalogPricing | None = None  # what the catalog priced the ops from (None: a profile did)
    usd_per_chip_hour: float | None = None  # the hardware's price per chip-hour (None: not known)
    startup: Startup | None = None  # loading and compiling before the first image (meshlab.cost.startup)
    #: what the hardware's compiler issues of `collectives` (TPUs combine all-reduces; meshlab.cost.collectives
    #: .issued_on), and what the step is priced from; None: the same as `collectives`
    issued: tuple[Collective, ...] | None = None

    @property
    def issued_collectives(self) -> tuple[Collective, ...]:
        return self.collectives if self.issued is None else self.issued

    @property
    def seconds_per_image(self) -> float:
        """End to end: text encode, denoise, VAE decode, host transfers and per-step overhead."""
        return self.terms.total if self.terms is not None else self.denoise_seconds_per_image

    @property
    def denoise_seconds_per_image(self) -> float:
        """The denoising loop alone (its host overhead included), as it was before the other terms."""
        return self.layout.steps * self.step.total / self.layout.images

    @property
    def images_per_second(self) -> float:
        return 1.0 / self.seconds_per_image

    @property
    def usd_per_hour(self) -> float | None:
        """What the system's chips cost per hour while held (None: the hardware has no price)."""
        return None if self.usd_per_chip_hour is None else self.usd_per_chip_hour * self.chips

    @property
    def first_call_s(self) -> float:
        """The first pipeline call end to end, all its images together."""
        return self.seconds_per_image * self.layout.images

    @property
    def time_to_first_image(self) -> float:
        """Load, compile, then the first call (its images come out together)."""
        return (self.startup.total if self.startup is not None else 0.0) + self.first_call_s

    @property
    def usd_to_first_image(self) -> float | None:
        return None if self.usd_per_hour is None else self.usd_per_hour * self.time_to_first_image / 3600.0

    def usd_per_image_over(self, images: int) -> float | None:
        """Dollars per image over `images` images in one session, its startup shared among them."""
        from meshlab.cost.startup import usd_per_image_over

        return usd_per_image_over(images, self.startup.total if self.startup else 0.0, self.first_call_s,
                                  self.layout.images, self.usd_per_hour)

    def session_seconds(self, images: int) -> float:
        """Wall seconds of a session that makes `images` images: the startup, then whole calls."""
        from meshlab.cost.startup import session_calls

        return (self.startup.total if self.startup else 0.0) + session_calls(images, self.layout.images) * self.first_call_s

    @property
    def usd_per_image(self) -> float | None:
        """Dollars per image in the steady state: every chip held for `seconds_per_image` (which already shares
        the text encode and VAE decode of a call among its images) at the hardware's price per chip-hour."""
        return None if self.usd_per_hour is None else self.usd_per_hour * self.seconds_per_image / 3600.0

    @property
    def useful_flops_per_step(self) -> float:
        branches = 2 if self.layout.cfg else 1
        return self.model_flops_per_call * self.layout.images * branches

    @property
    def mfu(self) -> float:
        return self.useful_flops_per_step / (self.chips * self.peak_flops * self.step.total)

    @property
    def roofline_mfu(self) -> float:
        """The MFU the roofline step time would give: below 1 where chips repeat each other's work."""
        return self.useful_flops_per_step / (self.chips * self.peak_flops * self.step.roofline)

    @property
    def roofline_seconds_per_image(self) -> float:
        return self.layout.steps * self.step.roofline / self.layout.images

    def block_collectives(self, block: int | None = None, issued: bool = False) -> Counter:
        """Collectives of one block (the first one by default) by kind: as the partitioner makes them, or
        (`issued`) as the hardware's compiler issues them."""
        found = self.issued_collectives if issued else self.collectives
        blocks = sorted({c.block for c in found if c.block is not None})
        if block is None:
            block = blocks[0] if blocks else None
        # a middle block: not what only the first or last of the blocks it stands for issues
        return Counter(c.kind for c in found if c.block == block and block is not None and not c.only)


@dataclass(frozen=True)
class PlanWork:
    """What a plan asks of each chip, whatever the hardware: its layout, per-call work and collectives. A sweep
    over several systems of one chip count prices one `PlanWork` on each (`predict(..., work=)`)."""

    layout: Layout
    graph: object  # meshlab.cost.graph.Graph
    work: tuple[Work, ...]
    collectives: tuple[Collective, ...]
    weights_per_chip: int  # the busiest chip's transformer bytes, as allocated


def plan_work(plan: Plan, strategy: Strategy, xla: bool = False) -> PlanWork:
    """`xla`: the plan runs as XLA's program (TPU hardware; meshlab.plan.axes.heads_gathered)."""
    layout = layout_of(plan, strategy)
    graph = graph_of(plan)
    flash = strategy.workload.flash_attention
    work = chip_work(graph, layout, plan.mesh, flash, xla)
    weights = sum(p.bytes_per_device(plan.mesh) * n for p, n in plan.alike)
    return PlanWork(layout, graph, work, derive(graph, layout, plan.mesh, flash, xla), weights)


def predict(plan: Plan, strategy: Strategy, hardware: Hardware, assumptions: Assumptions = Assumptions(),
            work: PlanWork | None = None) -> Prediction:
    """The plan's time and cost on `hardware`; `work` is `plan_work(plan, strategy, xla=hardware.kind == "tpu")`
    when the caller has it."""
    hardware = hardware.at_dtype(strategy.workload.dtype)  # a float32 workload runs at the float32 peak
    done = work if work is not None else plan_work(plan, strategy, xla=hardware.kind == "tpu")
    layout, graph, work, collectives = done.layout, done.graph, done.work, done.collectives
    issued = tool_issued(issued_on(collectives, hardware.kind, hardware.collective_matmul_flop_per_byte,
                                   plan.mesh.as_dict(), strategy.dcn, strategy.compile.scan_blocks,
                                   windows_open(strategy.compile.libtpu_flags), hardware.reduce_scatter_combine_bytes),
                         layout)  # what the hardware and the ring's tool run
    ring = {layout.ring_axes} if layout.ring_axes else set()
    routes = {axes: route(axes, plan.mesh, hardware, strategy.dcn)
              for axes in {c.axes for c in collectives} | {c.axes for c in issued} | ring}
    measured = _measured_call(plan, strategy, hardware, layout, work) if hardware.profile is not None else None
    price = _collective_price(hardware.profile) if hardware.profile is not None else None
    if measured is not None and not measured.collectives_included:
        found = sum(price(c) is not None for c in collectives)
        measured = replace(measured, collectives_measured=found, collectives_assumed=len(collectives) - found)
    assumptions = replace(assumptions, async_hidden=async_hidden_of(strategy, hardware))
    step = step_time(work, issued, routes, layout, hardware, assumptions, measured, price)
    batch_split = plan.mesh.size(strategy.activations.batch) if strategy.activations.batch else 1
    terms = pipeline_terms(plan.card, strategy, hardware, layout.steps, step.total, step.overhead, layout.images,
                           batch_split)
    return Prediction(layout, work, collectives, step, graph_flops(graph, layout.tokens), hardware.chips,
                      hardware.bf16_flops, terms, measured,
                      CatalogPricing.of(work, hardware) if measured is None else None, hardware.usd_per_chip_hour,
                      startup(plan.card, strategy, hardware, done.weights_per_chip), issued)


def _measured_call(plan: Plan, strategy: Strategy, hardware: Hardware, layout: Layout, work: tuple[Work, ...]):
    """One call priced from the hardware's profile (meshlab.cost.profile), blocks or op by op."""
    from meshlab.models.truncate import block_lists
    from meshlab.cost.profile import price_call
    from meshlab.cost.timing import op_seconds

    key = profile_key(plan, strategy)
    return price_call(hardware.profile, key, block_lists(plan.card), layout.tokens.text, work,
                      lambda w: op_seconds(w, hardware), layout.calls)


def _collective_price(profile):
    def price(c: Collective) -> float | None:
        priced = profile.collective_seconds(c.kind, c.axes, c.bytes)
        return priced.seconds if priced is not None else None

    return price


def profile_key(plan: Plan, strategy: Strategy) -> str:
    """The identity of a plan's shard shapes at every text length (meshlab.cost.profile.plan_key)."""
    from meshlab.cost.profile import plan_key
    from meshlab.plan.axes import guidance_axis

    w = strategy.workload
    rules = [r.model_dump(mode="json") for r in strategy.rules]
    activations = strategy.activations.identity()
    layout = layout_of(plan, strategy)
    return plan_key(plan.card.config_digest, plan.mesh.as_dict(), rules, activations, layout.tokens.image,
                    w.batch, w.dtype, bool(guidance_axis(plan.mesh) and w.cfg))
