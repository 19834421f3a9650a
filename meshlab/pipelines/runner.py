"""Run a Qwen-Image pipeline with its transformer and VAE on an XLA device (sharded or not), and measure it.

The text encoder stays on the host CPU; transformer and VAE move to the XLA device, get the fixes of
``meshlab.pipelines.xla_fixes``, and, when a ``shard`` callable is given, their shardings are marked by it
(``shard(transformer, vae) -> mesh``, e.g. a wrapper around ``meshlab.apply``).

The denoising loop is driven here rather than through ``QwenImagePipeline.__call__``: the stock call puts the
scheduler's timesteps on the execution device (one compile per step), encodes prompts there (the text encoder
lives on the CPU), and offers no point to block on the device between steps and decode. The loop below is the
stock loop (same latents, CFG with norm rescale, scheduler step), checked against it to float rounding, with one
``torch_xla.sync()`` per step.

SPMD has to be switched on before the first XLA tensor exists, so sharded runs need a fresh process: from the
command line, ``meshlab.pipelines.runner_cli``; from meshlab, the run worker (``meshlab.workers.run_xla``).
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

from meshlab.parallelisms import xla
from meshlab.core.errors import BackendError
from meshlab.pipelines import xla_fixes

#: Denoising steps before the loop is steady: the first compiles; without ``warm_rope`` the second compiles
#: again, once diffusers' RoPE cache holds device data instead of the ops that produced it.
WARMUP_STEPS = 2

Shard = Callable[[Any, Any], Any]


@dataclass(frozen=True)
class Timings:
    """Wall seconds of one run; device work is waited for (``torch_xla.sync(wait=True)``) before each stop."""

    text_encode_s: float
    rope_warmup_s: float
    step_s: tuple[float, ...]
    vae_decode_s: float
    total_s: float

    @property
    def first_step_s(self) -> float | None:
        return self.step_s[0] if self.step_s else None

    @property
    def second_step_s(self) -> float | None:
        return self.step_s[1] if len(self.step_s) > 1 else None

    @property
    def steady_step_median_s(self) -> float | None:
        steady = self.step_s[WARMUP_STEPS:]
        return statistics.median(steady) if steady else None


@dataclass(frozen=True)
class Counters:
    """Graphs compiled (``CompileTime`` samples) and CPU fallbacks (``aten::*`` counters) during one run."""

    compiles_rope_warmup: int
    compiles_per_step: tuple[int, ...]
    compiles_decode: int
    compiles_total: int
    loop_fallbacks: tuple[tuple[str, int], ...]
    run_fallbacks: tuple[tuple[str, int], ...]
    #: Whether the first step's graph (HLO) has complex-typed values; the real-valued RoPE should leave none.
    complex_in_step: bool
    #: Per step: transfers between host and device, syncs, and the torch_xla counters that caused transfers
    #: (``xla.traffic_since``)
    traffic_per_step: tuple[dict, ...] = ()
    compile_s: float = 0.0  # XLA compile time of the whole run (torch_xla's CompileTime metric)

    @property
    def compiles_steady(self) -> int:
        return sum(self.compiles_per_step[WARMUP_STEPS:])

    def host_transfers(self) -> dict:
        """Transfers per step after warm-up, in the first step, and what caused those of the steady loop."""
        steady = self.traffic_per_step[WARMUP_STEPS:]
        moved = [t.get("from_device", 0) + t.get("to_device", 0) for t in steady]
        causes: dict[str, int] = {}
        for t, count_moved in zip(steady, moved):
            if not count_moved:
                continue  # copies on the device count too (xla::_copy_from); only steps that moved data say why
            for name, count in t.items():
                if name not in ("from_device", "to_device", "syncs"):
                    causes[name] = causes.get(name, 0) + count
        first = self.traffic_per_step[0] if self.traffic_per_step else {}
        return {"steady_per_step": max(moved) if moved else None,
                "first_step": first.get("from_device", 0) + first.get("to_device", 0) if first else None,
                "syncs_per_step": max((t.get("syncs", 0) for t in steady), default=None),
                "causes": {name: {"count": count, "what": xla.TRANSFER_CAUSES.get(name, "a CPU fallback op")}
                           for name, count in sorted(causes.items())}}


@dataclass(frozen=True)
class RunResult:
    """One pipeline run: the image, how long each phase took, and what XLA compiled or fell back on."""

    image: Any = field(repr=False)  # PIL.Image.Image
    pixels: Any = field(repr=False)  # numpy float32 [height, width, 3] in [0, 1], before 8-bit rounding
    timings: Timings
    counters: Counters
    device: str
    attention_backend: str
    mesh_shape: tuple[int, ...] | None
    mesh_axes: tuple[str, ...] | None
    warnings: tuple[str, ...]
    text_tokens: tuple[int, ...] = ()  # the text length of each transformer call of a step (after any padding)

    def summary(self) -> dict[str, Any]:
        """Everything but the image, JSON-ready (derived timings and counters included)."""
        timings = asdict(self.timings) | {
            "first_step_s": self.timings.first_step_s,
            "second_step_s": self.timings.second_step_s,
            "steady_step_median_s": self.timings.steady_step_median_s,
        }
        counters = asdict(self.counters) | {"compiles_steady": self.counters.compiles_steady}
        counters["loop_fallbacks"] = dict(self.counters.loop_fallbacks)
        counters["run_fallbacks"] = dict(self.counters.run_fallbacks)
        counters.pop("traffic_per_step")
        counters["host_transfers"] = self.counters.host_transfers()
        return {
            "device": self.device,
            "attention_backend": self.attention_backend,
            "mesh_shape": self.mesh_shape,
            "mesh_axes": self.mesh_axes,
            "text_tokens": list(self.text_tokens),
            "timings": timings,
            "counters": counters,
            "warnings": list(self.warnings),
        }


@dataclass(frozen=True)
class XlaSetup:
    """What ``prepare_for_xla`` did to a pipeline: its device, attention backend, shard function and mesh."""

    device: Any
    attention_backend: str
    shard: Shard | None
    mesh: Any


#: ``mark_input(name, tensor)`` marks a forward input's sharding (batch and sequence splits) on the device.
MarkInput = Callable[[str, Any], None]


def prepare_for_xla(pipe, shard: Shard | None = None) -> XlaSetup:
    """Apply the XLA fixes, move transformer and VAE to the XLA device, mark shardings. Once per pipeline.

    A second call returns the first call's setup; a different `shard` then is an error (shardings are marked).
    """
    import torch_xla
    import torch_xla.runtime as xr

    setup = getattr(pipe, "_meshlab_xla", None)
    if setup is not None:
        if shard is not None and shard is not setup.shard:
            raise BackendError("this pipeline is already on the device with other shardings", "load it again")
        return setup
    if shard is not None and not xr.is_spmd():
        raise BackendError(
            "a shard function was given but SPMD is off",
            "call torch_xla.runtime.use_spmd() before any XLA tensor exists (start a fresh process)",
        )
    device = torch_xla.device()
    backend = xla_fixes.choose_attention_backend(xr.device_type() or "cpu")
    xla_fixes.use_real_rope(pipe.transformer)
    xla_fixes.use_nearest_upsampling(pipe.vae)
    pipe.transformer.set_attention_backend(backend)
    pipe.transformer.to(device)
    pipe.vae.to(device)
    xla_fixes.move_inputs_to(pipe.transformer, device)
    mesh = shard(pipe.transformer, pipe.vae) if shard is not None else None
    pipe._meshlab_xla = XlaSetup(device, backend, shard, mesh)
    return pipe._meshlab_xla


def run_pipeline(
    pipe,
    prompt: str,
    negative_prompt: str | None,
    steps: int,
    height: int,
    width: int,
    cfg_scale: float,
    seed: int,
    shard: Shard | None = None,
    warm_rope: bool = True,
    batch: int = 1,
    mark_input: MarkInput | None = None,
    joint_guidance: bool = False,
) -> RunResult:
    """Run `pipe` once: text encoder on the CPU, transformer and VAE on the XLA device (sharded by `shard`).

    CFG runs when `negative_prompt` is given and `cfg_scale` > 1, as in the stock pipeline. `batch` images of the
    one prompt run together; image i's latents come from a CPU generator seeded with `seed + i`, so image 0 is
    the stock pipeline's image for `seed`. `mark_input` splits the latents and prompt embeddings on the device
    (e.g. the batch over the strategy's batch axis); the image and pixels returned are image 0's.
    `warm_rope` fills the RoPE cache before the loop (``xla_fixes.warm_rope_cache``), saving the second step's
    recompile; turn it off to measure the stock behaviour. `joint_guidance` runs both guidance branches as one
    call of twice the batch ([cond; uncond], prompts padded to one length and masked), as a strategy with a
    ``cfg`` axis splits it (see meshlab.cost.layout).
    """
    import torch

    setup = prepare_for_xla(pipe, shard)
    if mark_input is None and setup.mesh is not None:
        mark_input = _replicated(setup.mesh)
    start, compiles_at_start, compile_s_at_start = time.perf_counter(), xla.compile_count(), xla.compile_seconds()
    fallbacks_at_start = xla_fixes.fallback_counters()
    with torch.no_grad():
        embeds, encode_s, _ = _measured(lambda: _encode(pipe, prompt, negative_prompt, cfg_scale, setup, batch,
                                                        mark_input, joint_guidance))
        _, rope_s, rope_compiles = _measured(lambda: warm_rope and _warm_rope(pipe, embeds, height, width))
        # joint guidance splits the doubled call's batch; the latents of one branch stay whole between steps
        mark_latents = _replicated(setup.mesh) if embeds.joint and setup.mesh is not None else mark_input
        loop = _denoise(pipe, embeds, steps, height, width, cfg_scale, seed, mark_input, mark_latents)
        decoded, decode_s, decode_compiles = _measured(lambda: _decode(pipe, loop.latents, height, width))
        pixels = _to_pixels(pipe, decoded)
    counters = Counters(
        compiles_rope_warmup=rope_compiles,
        compiles_per_step=loop.compiles,
        compiles_decode=decode_compiles,
        compiles_total=xla.compile_count() - compiles_at_start,
        loop_fallbacks=loop.fallbacks,
        run_fallbacks=xla_fixes.counter_delta(fallbacks_at_start, xla_fixes.fallback_counters()),
        complex_in_step=loop.complex_in_first_step,
        traffic_per_step=loop.traffic,
        compile_s=xla.compile_seconds() - compile_s_at_start,
    )
    return RunResult(
        image=pipe.image_processor.numpy_to_pil(pixels[None])[0],
        pixels=pixels,
        timings=Timings(encode_s, rope_s, loop.seconds, decode_s, time.perf_counter() - start),
        counters=counters,
        device=str(setup.device),
        attention_backend=setup.attention_backend,
        mesh_shape=_mesh_attr(setup.mesh, "mesh_shape"),
        mesh_axes=_mesh_attr(setup.mesh, "axis_names"),
        warnings=_warn(counters),
        text_tokens=tuple(int(e.shape[1]) for e in (embeds.cond, embeds.uncond) if e is not None),
    )


def run_reference(pipe, prompt, negative_prompt, steps, height, width, cfg_scale, seed):
    """The stock ``QwenImagePipeline.__call__`` on the CPU: returns (pixels [H, W, 3] float32, wall seconds).

    The stock loop calls ``xm.mark_step()`` whenever torch_xla is importable, which starts the XLA runtime in
    this process (after which SPMD can no longer be switched on); it is turned off for this CPU-only call.
    """
    import torch
    from diffusers.pipelines.qwenimage import pipeline_qwenimage

    generator = torch.Generator("cpu").manual_seed(seed)
    start, xla_available = time.perf_counter(), pipeline_qwenimage.XLA_AVAILABLE
    pipeline_qwenimage.XLA_AVAILABLE = False
    try:
        out = pipe(
            prompt=prompt,
            negative_prompt=negative_prompt,
            true_cfg_scale=cfg_scale,
            num_inference_steps=steps,
            height=height,
            width=width,
            generator=generator,
            output_type="np",
        )
    finally:
        pipeline_qwenimage.XLA_AVAILABLE = xla_available
    return out.images[0], time.perf_counter() - start


@dataclass(frozen=True)
class _Embeds:
    cond: Any
    cond_mask: Any
    uncond: Any
    uncond_mask: Any
    joint: bool = False  # cond holds [cond; uncond] (twice the batch) and uncond is None: one call for both

    @property
    def images(self) -> int:
        return self.cond.shape[0] // 2 if self.joint else self.cond.shape[0]


def _encode(pipe, prompt, negative_prompt, cfg_scale, setup: XlaSetup, batch: int = 1,
            mark_input: MarkInput | None = None, joint: bool = False) -> _Embeds:
    """Encode on the CPU (once; repeated over the batch); embeddings and masks go to the device once, split as
    `mark_input` says."""
    import torch

    embeds, mask = pipe.encode_prompt(prompt, device="cpu", num_images_per_prompt=batch)
    neg = neg_mask = None
    masked = setup.attention_backend in xla_fixes.MASKED_BACKENDS
    if negative_prompt is not None and cfg_scale > 1:
        neg, neg_mask = pipe.encode_prompt(negative_prompt, device="cpu", num_images_per_prompt=batch)
        if masked:
            embeds, mask, neg, neg_mask = xla_fixes.pad_prompt_pair(embeds, mask, neg, neg_mask)
    if not masked:
        mask, neg_mask = xla_fixes.drop_full_masks(mask, neg_mask)
    joint = joint and neg is not None
    if joint:  # one call of twice the batch: the prompts are padded to one length above
        if embeds.shape[1] != neg.shape[1]:
            raise BackendError("one call for both guidance branches pads the shorter prompt, and the attention "
                               f"backend {setup.attention_backend} takes no mask", "use a mesh without a 'cfg' axis")
        both = torch.cat([embeds, neg])
        both_mask = None if mask is None else torch.cat([mask, neg_mask])
        embeds, mask, neg, neg_mask = both, both_mask, None, None

    def to_device(t, name: str):  # once: the loop then reads device tensors and copies nothing per step
        if t is None:
            return None
        t = t.to(setup.device)
        if mark_input is not None:
            mark_input(name, t)
        return t

    return _Embeds(to_device(embeds, "encoder_hidden_states"), to_device(mask, "encoder_hidden_states_mask"),
                   to_device(neg, "encoder_hidden_states"), to_device(neg_mask, "encoder_hidden_states_mask"),
                   joint=joint)


def _img_shapes(pipe, height, width, batch: int = 1):
    return [[(1, height // pipe.vae_scale_factor // 2, width // pipe.vae_scale_factor // 2)]] * batch


def _warm_rope(pipe, embeds: _Embeds, height, width) -> None:
    lengths = [e.shape[1] for e in (embeds.cond, embeds.uncond) if e is not None]
    shapes = _img_shapes(pipe, height, width, embeds.cond.shape[0])  # as the call passes them (joint: both halves)
    xla_fixes.warm_rope_cache(pipe.transformer, shapes, lengths, embeds.cond.device)


@dataclass(frozen=True)
class _Loop:
    latents: Any
    seconds: tuple[float, ...]
    compiles: tuple[int, ...]
    fallbacks: tuple[tuple[str, int], ...]
    complex_in_first_step: bool
    traffic: tuple[dict, ...] = ()


def _denoise(pipe, embeds: _Embeds, steps, height, width, cfg_scale, seed, mark_input: MarkInput | None = None,
             mark_latents: MarkInput | None = None) -> _Loop:
    """The stock denoising loop, its schedule on the device (``_DeviceSchedule``), one blocking sync per step."""
    batch = embeds.images
    latents = _initial_latents(pipe, height, width, embeds.cond.dtype, seed, batch).to(embeds.cond.device)
    mark_latents = mark_latents or mark_input
    if mark_latents is not None:
        mark_latents("hidden_states", latents)
    timesteps = _cpu_timesteps(pipe, steps, latents.shape[1])
    schedule = _DeviceSchedule.of(pipe.scheduler, timesteps, batch, latents.dtype, latents.device)
    shapes = _img_shapes(pipe, height, width, batch)
    seconds, compiles, fallbacks_before, has_complex = [], [], xla_fixes.fallback_counters(), False
    traffic = []
    for i, t in enumerate(timesteps):
        start, compiles_before, traffic_before = time.perf_counter(), xla.compile_count(), xla.traffic()
        timestep = schedule.timestep() if schedule else t.expand(latents.shape[0]).to(latents.dtype) / 1000
        noise = _predict(pipe, latents, timestep, shapes, embeds, cfg_scale, mark_input)
        if schedule:
            latents, schedule = schedule.step(noise, latents)
        else:
            latents = pipe.scheduler.step(noise, t, latents, return_dict=False)[0]
        if mark_latents is not None:  # the step's output keeps the input's split: every step runs one graph
            mark_latents("hidden_states", latents)
        has_complex = has_complex or (i == 0 and xla_fixes.has_complex_values(latents))
        xla.sync()
        seconds.append(time.perf_counter() - start)
        compiles.append(xla.compile_count() - compiles_before)
        traffic.append(xla.traffic_since(traffic_before))
    fallbacks = xla_fixes.counter_delta(fallbacks_before, xla_fixes.fallback_counters())
    return _Loop(latents, tuple(seconds), tuple(compiles), fallbacks, has_complex, tuple(traffic))


def _replicated(mesh) -> MarkInput:
    """Inputs marked whole on every device. Unmarked, an input XLA's propagation wants split is resharded by the
    first step and carries that sharding into the second, which then compiles a graph of its own."""
    from meshlab.core.spec import PartitionSpec

    def mark(name: str, tensor) -> None:
        xla.mark(tensor, mesh, PartitionSpec(*([None] * tensor.dim())), name)

    return mark


@dataclass(frozen=True)
class _DeviceSchedule:
    """The flow-match Euler schedule held on the device, read with a device step counter: the steady loop then
    copies nothing between host and device (the stock scheduler mixes a CPU sigma pair and a CPU timestep into
    every step: 3 host-to-device copies per step), and every step runs the same graph.

    ``step`` is ``FlowMatchEulerDiscreteScheduler.step`` without stochastic sampling or per-token timesteps:
    ``prev = sample.float() + (sigma_next - sigma) * model_output``, cast back to the model output's dtype."""

    timesteps: Any  # [steps, batch] in the latents' dtype, / 1000 as the transformer takes them
    dts: Any  # [steps] float32: sigma_next - sigma
    index: Any  # [1] int64 on the device: the step (measured: a 0-dim counter made the second step compile a
    #: graph of its own; torch_xla treats 0-dim 0 and 1 as constants of the graph)

    @staticmethod
    def of(scheduler, timesteps, batch: int, dtype, device) -> "_DeviceSchedule | None":
        import torch

        config = scheduler.config
        if type(scheduler).__name__ != "FlowMatchEulerDiscreteScheduler" or config.get("stochastic_sampling"):
            return None  # the stock step, with its transfers (the run warns and names them)
        sigmas = scheduler.sigmas.to(torch.float32)
        table = torch.stack([t.expand(batch).to(dtype) / 1000 for t in timesteps])
        return _DeviceSchedule(table.to(device), (sigmas[1:] - sigmas[:-1]).to(device),
                               torch.zeros(1, dtype=torch.long).to(device))

    def timestep(self):
        return self.timesteps.index_select(0, self.index).squeeze(0)

    def step(self, model_output, sample):
        from dataclasses import replace

        dt = self.dts.index_select(0, self.index).squeeze(0)  # 0-dim, as the stock CPU sigma pair
        prev = (sample.to(dt.dtype) + dt * model_output).to(model_output.dtype)
        return prev, replace(self, index=self.index + 1)


def _predict(pipe, latents, timestep, shapes, embeds: _Embeds, cfg_scale, mark_input: MarkInput | None = None):
    """Noise prediction, with true CFG and norm rescale as ``QwenImagePipeline.__call__`` does it (both branches
    in one call of twice the batch when `embeds` are joint)."""
    import torch

    def forward(context, hidden, mask, latents=latents, timestep=timestep, shapes=shapes):
        with pipe.transformer.cache_context(context):
            return pipe.transformer(
                hidden_states=latents,
                timestep=timestep,
                encoder_hidden_states=hidden,
                encoder_hidden_states_mask=mask,
                img_shapes=shapes,
                return_dict=False,
            )[0]

    if embeds.joint:
        both = torch.cat([latents, latents])
        if mark_input is not None:
            mark_input("hidden_states", both)
        out = forward("cfg", embeds.cond, embeds.cond_mask, both, torch.cat([timestep, timestep]), shapes * 2)
        cond, uncond = out.chunk(2)
    else:
        cond = forward("cond", embeds.cond, embeds.cond_mask)
        if embeds.uncond is None:
            return cond
        uncond = forward("uncond", embeds.uncond, embeds.uncond_mask)
    combined = uncond + cfg_scale * (cond - uncond)
    scale = torch.norm(cond, dim=-1, keepdim=True) / torch.norm(combined, dim=-1, keepdim=True)
    return combined * scale


def _initial_latents(pipe, height, width, dtype, seed, batch: int = 1):
    """Image i's latents from a generator seeded with seed + i: image 0 is the stock pipeline's for `seed`."""
    import torch

    channels = pipe.transformer.config.in_channels // 4
    return torch.cat([pipe.prepare_latents(1, channels, height, width, dtype, "cpu",
                                           torch.Generator("cpu").manual_seed(seed + i)) for i in range(batch)])


def _cpu_timesteps(pipe, steps: int, image_seq_len: int):
    """The stock sigmas and dynamic shift, with the scheduler's tensors left on the CPU."""
    import numpy as np
    from diffusers.pipelines.qwenimage.pipeline_qwenimage import calculate_shift, retrieve_timesteps

    config = pipe.scheduler.config
    mu = calculate_shift(
        image_seq_len,
        config.get("base_image_seq_len", 256),
        config.get("max_image_seq_len", 4096),
        config.get("base_shift", 0.5),
        config.get("max_shift", 1.15),
    )
    sigmas = np.linspace(1.0, 1 / steps, steps)
    timesteps, _ = retrieve_timesteps(pipe.scheduler, steps, "cpu", sigmas=sigmas, mu=mu)
    pipe.scheduler.set_begin_index(0)
    return timesteps


def _decode(pipe, latents, height, width):
    import torch

    latents = pipe._unpack_latents(latents, height, width, pipe.vae_scale_factor).to(pipe.vae.dtype)
    shape = (1, pipe.vae.config.z_dim, 1, 1, 1)
    mean = torch.tensor(pipe.vae.config.latents_mean).view(shape).to(latents.device, latents.dtype)
    std = torch.tensor(pipe.vae.config.latents_std).view(shape).to(latents.device, latents.dtype)
    image = pipe.vae.decode(latents * std + mean, return_dict=False)[0][:, :, 0]
    xla.sync()
    return image


def _to_pixels(pipe, image):
    """Device image in [-1, 1] -> float32 [H, W, 3] in [0, 1], on the CPU (no extra device graph)."""
    return pipe.image_processor.postprocess(image.cpu(), output_type="np")[0]


def _measured(fn):
    """(fn(), wall seconds, graphs compiled meanwhile)."""
    start, compiles = time.perf_counter(), xla.compile_count()
    value = fn()
    return value, time.perf_counter() - start, xla.compile_count() - compiles


def _mesh_attr(mesh, name: str):
    value = getattr(mesh, name, None)
    return tuple(value) if value is not None else None


def _warn(counters: Counters) -> tuple[str, ...]:
    found = []
    transfers = counters.host_transfers()
    if transfers["steady_per_step"]:
        causes = ", ".join(f"{name} ({c['what']})" for name, c in transfers["causes"].items()) or "no counter named it"
        found.append(f"the steady loop moves data between host and device {transfers['steady_per_step']} time(s) "
                     f"per step: {causes}")
    if counters.compiles_steady:
        found.append(f"the steady loop compiled {counters.compiles_steady} new graph(s) after warm-up")
    if counters.loop_fallbacks:
        found.append(f"CPU fallbacks in the denoising loop: {dict(counters.loop_fallbacks)}")
    for message in found:
        warnings.warn(message, RuntimeWarning, stacklevel=3)
    return tuple(found)
