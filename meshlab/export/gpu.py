"""A plan in the forms the GPU tools take: diffusers' ``enable_parallelism`` call and xDiT's (xfuser's) flags. Pure.

Both tools take degrees, not specs, so a plan has such a form only when each of its mesh axes is one of their
parallelisms:

- the guidance axis (``cfg``, 2): xDiT's ``--use_cfg_parallel``; diffusers runs both branches on each rank, so its
  snippet splits them over the ``cfg`` sub-mesh in the script (it says so);
- the batch axis: xDiT's ``--data_parallel_degree``; diffusers has none (one process group per replica);
- the sequence axes: Ulysses' (the ``attention.qkv`` rule puts them on the heads) and the ring's, the degrees of
  ``ContextParallelConfig(ulysses_degree, ring_degree)`` and ``--ulysses_degree`` / ``--ring_degree``;
- a ``model`` axis that splits weights: ``TensorParallelConfig(tp_degree)`` (diffusers refuses it beside context
  parallelism; xDiT's runner refuses ``--tensor_parallel_degree`` for every model).

The rest of the pipeline (``placement``): a tiled VAE decode is diffusers' ``pipe.vae.enable_tiling()`` and
xDiT's ``--enable_tiling``; a parallel one is xDiT's ``--use_parallel_vae`` (diffusers has none; xDiT lists it for
some models only); a text encoder sharded over the GPUs (FSDP) is ``--shard_t5_encoder`` of xDiT's example scripts
(a T5 encoder only; its runner and diffusers have none; Wan's own generate.py has ``--t5_fsdp``). A plan priced
compiled on a GPU (``compile.elementwise: fused``) asks for torch.compile.

Anything else (FSDP, a weight split over the batch axis; other axes; several slices) has no form in them, and is
refused with the reason. So is what a tool does not run for the model: diffusers' ``enable_parallelism`` needs the
class's ``_cp_plan`` (context parallel) or ``_tp_plan`` (tensor parallel), which only some classes define
(`DIFFUSERS_PLANS`); xDiT runs each model through its unified runner (``xdit --model NAME``), whose capabilities per
model leave out CFG parallelism for Flux and Qwen-Image among others, and tensor parallelism for every model
(`XDIT_MODELS`). Written by hand: neither tool reads a sharding plan, and these are their documented arguments
(diffusers 0.42 ``ContextParallelConfig`` / ``TensorParallelConfig``; xDiT's ``xdit`` runner).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from meshlab.core.errors import PlanError
from meshlab.plan.axes import GUIDANCE_AXIS, ring_axes, ulysses_axes
from meshlab.plan.plan import Plan
from meshlab.plan.planner import diffusers_cannot_split
from meshlab.strategy.schema import Strategy

#: Which plans diffusers' ``enable_parallelism`` takes for each class: (context parallel, tensor parallel), i.e.
#: whether the class defines ``_cp_plan`` and ``_tp_plan`` (diffusers 0.42.1, ``ModelMixin.enable_parallelism``
#: raises "`cp_plan` must be provided..." without the first, ``_check_tp_supported`` without the second; the
#: tests hold this table to the installed classes).
DIFFUSERS_PLANS: dict[str, tuple[bool, bool]] = {
    "QwenImageTransformer2DModel": (True, True),
    "FluxTransformer2DModel": (True, True),
    "Flux2Transformer2DModel": (True, True),
    "WanTransformer3DModel": (True, False),
    "LTXVideoTransformer3DModel": (True, False),
    "SD3Transformer2DModel": (False, False),
    "HunyuanVideoTransformer3DModel": (False, False),
    "CogVideoXTransformer3DModel": (False, False),
    "SanaTransformer2DModel": (False, False),
}


@dataclass(frozen=True)
class XditModel:
    """How xDiT runs a model: the unified runner's name for it (``xdit --model NAME``), or the example script that
    runs it, and which of the plan's flags it allows."""

    name: str
    cfg: bool  # --use_cfg_parallel
    parallel_vae: bool  # --use_parallel_vae
    runner: bool = True  # False: an example script (xFuserArgs.add_cli_args' flags, --shard_t5_encoder among them)


#: xdit-project/xDiT at 175e0bf (2026-07-14): the runner's registered models and their ``ModelCapabilities``
#: (xfuser/model_executor/models/runner_models/*.py). ``xFuserModel._validate_config`` raises "Model ... does not
#: support {key}" for a degree above 1 the model does not list, ``tensor_parallel_degree`` for every model; a boolean
#: flag it does not list slips through that check (``True > 1`` is false) and runs unsupported: Flux.1's pipeline
#: (xFuserFluxPipeline, ``check_model_parallel_state(cfg_parallel_available=False)``) then raises on
#: ``--use_cfg_parallel``, the others run a CFG split or parallel VAE their code does not make. ``--enable_tiling``
#: tiles any model's decode (``_enable_options``). SANA and CogVideoX are not registered; their example scripts run
#: them. The runner has no Wan 2.1 T2V 1.3B (only the 14B) and runs LTX-2, not LTX-Video: those cards have no
#: xDiT form.
XDIT_MODELS: dict[str, XditModel] = {
    "qwen-image": XditModel("Qwen-Image", cfg=False, parallel_vae=False),
    "flux-dev": XditModel("FLUX.1-dev", cfg=False, parallel_vae=True),
    "flux2-dev": XditModel("FLUX.2-dev", cfg=False, parallel_vae=True),
    "sd3.5-large": XditModel("SD3.5", cfg=True, parallel_vae=False),
    "hunyuan-video": XditModel("HunyuanVideo", cfg=False, parallel_vae=False),
    "wan-2.1-t2v-14b": XditModel("Wan2.1-T2V", cfg=False, parallel_vae=True),
    "wan-2.1-i2v-14b": XditModel("Wan2.1-I2V", cfg=True, parallel_vae=True),
    # CogVideoX's example asserts no parallel VAE; SANA's pipeline raises NotImplementedError on one
    "cogvideox-5b": XditModel("examples/cogvideox_usp_example.py", cfg=True, parallel_vae=False, runner=False),
    "sana-1600m": XditModel("examples/sana_example.py", cfg=True, parallel_vae=False, runner=False),
}


@dataclass(frozen=True)
class Degrees:
    """A plan's parallel degrees as the GPU tools count them."""

    cfg: int
    data: int
    ulysses: int
    ring: int
    tensor: int
    priced_as: str  # Activations.sequence_parallel: what the plan's sequence split was priced as running it


def degrees(plan: Plan, strategy: Strategy) -> Degrees:
    """The plan's degrees, or a PlanError naming what the GPU tools cannot express."""
    mesh, activations = plan.mesh, strategy.activations
    cross = next((i for i, r in enumerate(activations.rules) if r.attention == "cross"), None)
    if cross is not None:
        raise PlanError(f"activations.rules[{cross}] splits the cross-attention on its own: the GPU tools run their "
                        "sequence parallelism on self-attention and have no form for it",
                        "export --format torch-xla, or drop the cross-attention rule",
                        field=("activations", "rules", cross, "attention"))
    sequence = set(activations.sequence_axes)
    ulysses, ring = set(ulysses_axes(activations)), set(ring_axes(activations))
    idle = [a for a in activations.sequence_axes if a not in ulysses | ring and mesh.size(a) > 1]
    if idle:
        raise PlanError(f"sequence axis {idle[0]!r} splits the tokens between attentions, and the attention.qkv rule "
                        "neither keeps it on the tokens (a ring) nor moves it onto the heads (Ulysses): the GPU tools "
                        "have no such form", f"put {idle[0]!r} in the qkv rule's tokens or features entry",
                        field=("activations", "rules"))
    weights = {a for p in plan.parameters for a in p.spec.axes}
    size = lambda axes: math.prod(mesh.size(a) for a in axes)  # noqa: E731
    fsdp = weights & ({activations.batch} | sequence | {GUIDANCE_AXIS})
    if fsdp:
        raise PlanError(f"weights split over {'+'.join(sorted(fsdp))}, which also splits activations (FSDP): diffusers' "
                        "enable_parallelism has no such form, and meshlab does not map a plan onto xDiT's "
                        "--fully_shard_degree", "export --format torch-xla or dtensor, or keep the weights whole "
                        "on that axis", field=("rules",))
    known = sequence | {activations.batch, GUIDANCE_AXIS} | weights
    other = [a for a in mesh.names if a not in known and mesh.size(a) > 1]
    if other:
        raise PlanError(f"mesh axis {other[0]!r} is neither guidance, batch, sequence nor a weight split: the GPU "
                        "tools have no degree for it", "drop it from the mesh, or export --format torch-xla",
                        field=("mesh",))
    if strategy.dcn:
        raise PlanError("the plan spans several slices (dcn), which the GPU tools do not take",
                        "export --format torch-xla", field=("dcn",))
    cfg = mesh.size(GUIDANCE_AXIS) if GUIDANCE_AXIS in mesh.names else 1
    data = mesh.size(activations.batch) if activations.batch else 1
    return Degrees(cfg, data, size(ulysses), size(ring), size(weights), activations.sequence_parallel)


def priced_elsewhere(plan: Plan, strategy: Strategy, hardware=None) -> list[str]:
    """Comment lines for where what a GPU tool runs from these degrees differs from what meshlab priced: a plan
    priced on a TPU, and weights split on their largest dim, which is not how the tools' tensor parallelism splits
    them (each Linear by column, then by row, as Megatron does). An explicit spec may be either, and is not noted."""
    notes = []
    if hardware is not None and hardware.kind != "gpu":
        notes.append(f"# the plan was priced on {hardware.name} ({hardware.kind}); on GPUs its time is not that "
                     "prediction: name a GPU system as its hardware (h100, h200, ...) to price what these degrees run")
    if any(p.rule is not None and p.spec.axes and strategy.rules[p.rule].shard == "largest"
           for p in plan.parameters):
        notes.append("# the tools' tensor parallel degree splits each Linear by column, then by row; this plan's "
                     "rules split weights on their largest dim, so the collectives run differ from those priced "
                     "(price column/row rules, e.g. --rules pairs, for what the tools run)")
    return notes


def _priced_compiled(strategy: Strategy, hardware=None) -> bool:
    """Priced under torch.compile: fused elementwise work on a GPU (on a TPU, fused is XLA's own, no torch.compile)."""
    return strategy.compile.elementwise == "fused" and (hardware is None or hardware.kind == "gpu")


def diffusers_snippet(plan: Plan, strategy: Strategy, hardware=None) -> str:
    """The ``enable_parallelism`` call for a plan diffusers can express, as Python to paste into a script run with
    torchrun (one process per GPU). `hardware` (the strategy's system): a plan priced off GPUs says so."""
    d = degrees(plan, strategy)
    if d.tensor > 1 and d.ulysses * d.ring > 1:
        raise PlanError("the plan splits weights (tensor parallel) and the sequence (context parallel), and "
                        "diffusers' ParallelConfig refuses the two together",
                        "keep one of the two", field=("rules",))
    if d.data > 1:
        raise PlanError(f"the batch is split over {strategy.activations.batch} ({d.data}), and diffusers' "
                        "enable_parallelism has no data parallel degree", "run one process group per replica "
                        "(a plan with data 1)",
                        field=("activations", "batch"))
    if d.ulysses * d.ring == 1 and d.tensor == 1:
        raise PlanError("the plan splits neither the sequence nor the weights, and diffusers' enable_parallelism "
                        "takes only those (context and tensor parallel degrees)", "split the sequence",
                        field=("mesh",))
    refusal = diffusers_cannot_split(plan.card)
    if d.ulysses * d.ring > 1 and refusal:
        raise PlanError(refusal, "export --format torch-xla, or keep the sequence whole",
                        field=("activations", "sequence"))
    class_name = plan.card.class_name
    context, tensor = DIFFUSERS_PLANS.get(class_name, (True, True))
    refused = "so enable_parallelism refuses a {} for it (diffusers 0.42)"
    if d.ulysses * d.ring > 1 and not context:  # enable_parallelism takes a cp_plan of the caller's
        raise PlanError(f"diffusers' {class_name} defines no _cp_plan, " + refused.format("ContextParallelConfig"),
                        "pass your own cp_plan to enable_parallelism", field=("activations", "sequence"))
    if d.tensor > 1 and not tensor:  # but no tp_plan: only the class's
        raise PlanError(f"diffusers' {class_name} defines no _tp_plan, " + refused.format("TensorParallelConfig"),
                        "define _tp_plan on the class" + (", or split the sequence instead" if context else ""),
                        field=("rules",))
    names, shape = [], []
    for name, n in (("cfg", d.cfg), ("ring", d.ring), ("ulysses", d.ulysses), ("tp", d.tensor)):
        if n > 1 or name in ("ring", "ulysses") and d.tensor == 1:
            names.append(name)
            shape.append(n)
    lines = [f"# {plan.strategy_name}: {plan.card.class_name} on {plan.mesh.device_count} GPUs, from meshlab export "
             "--format diffusers", "# run under torchrun (one process per GPU), after the pipeline is built and "
             "moved to the rank's GPU: `transformer` is pipe.transformer", *priced_elsewhere(plan, strategy, hardware),
             *([f"# meshlab has not checked whether diffusers' {class_name} defines the _cp_plan / _tp_plan "
                "enable_parallelism needs"] if class_name not in DIFFUSERS_PLANS else []),
             "from torch.distributed.device_mesh import init_device_mesh"]
    if d.tensor > 1:
        lines += ["from diffusers import TensorParallelConfig", "",
                  f"mesh = init_device_mesh('cuda', {tuple(shape)!r}, mesh_dim_names={tuple(names)!r})",
                  "transformer.enable_parallelism(config=TensorParallelConfig(mesh=mesh['tp']))"]
    else:
        lines += ["from diffusers import ContextParallelConfig", "",
                  f"mesh = init_device_mesh('cuda', {tuple(shape)!r}, mesh_dim_names={tuple(names)!r})",
                  *(["# a ring's passes need the log-sum-exp, which the default (native) backend does not return: "
                     "torch's FlashAttention-2 (the catalog's default kernel; it takes no attention mask, so pad "
                     "prompts to one length or drop an all-ones mask)",
                     "transformer.set_attention_backend('_native_flash')"] if d.ring > 1 else []),
                  f"transformer.enable_parallelism(config=ContextParallelConfig(ring_degree={d.ring}, "
                  f"ulysses_degree={d.ulysses}, mesh=mesh['ring', 'ulysses']))"]
        if d.ulysses * d.ring > 1 and d.priced_as != "diffusers":
            ring = ", and gathers a ring's k and v once, then runs its passes" if d.ring > 1 else ""
            lines.append(f"# this plan was priced as {d.priced_as} runs it; diffusers joins the streams on the chip"
                         f"{ring}: set activations.sequence_parallel: diffusers to price what diffusers runs")
    sharded = _sharded(plan, strategy)
    if sharded:
        field = strategy.placement.field_of(sharded[0].name)
        raise PlanError(f"placement.{'.'.join(field[1:])}: sharded splits {sharded[0].name} over the GPUs (FSDP), "
                        "which diffusers' enable_parallelism does not do", "use device (replicated) or cpu",
                        field=field)
    if strategy.placement.vae_decode == "parallel":
        raise PlanError("placement.vae_decode: parallel splits the decode over the GPUs, and diffusers has no parallel "
                        "VAE", "use full or tiled",
                        field=("placement", "vae_decode"))
    if strategy.placement.vae_decode == "tiled":
        lines.append("pipe.vae.enable_tiling()  # placement.vae_decode: tiled")
    if _priced_compiled(strategy, hardware):
        lines.append("transformer.compile()  # priced compiled (compile.elementwise: fused); for an eager run, set "
                     "compile: {elementwise: eager} to price it")
    if d.cfg > 1:
        lines += ["# guidance: diffusers runs both branches on every rank; split them over mesh['cfg'] in the script "
                  "(rank group mesh['cfg'].get_local_rank() runs one branch; all-gather the two noise predictions "
                  "each step)"]
    return "\n".join(lines) + "\n"


def xdit_flags(plan: Plan, strategy: Strategy, hardware=None) -> str:
    """xDiT's launch line with the plan's flags (their product is the GPU count): its unified runner's
    ``xdit --model NAME``, or the example script that runs the model. `hardware` (the strategy's system): a plan priced
    off GPUs says so."""
    d = degrees(plan, strategy)
    model = XDIT_MODELS.get(plan.card.name)
    if model is None:
        raise PlanError(f"xDiT runs no {plan.card.name} ({plan.card.class_name}): its runner registers none and no "
                        "example script runs it (xDiT 175e0bf)", "export --format torch-xla",
                        field=("model",))
    if d.tensor > 1:
        raise PlanError(f"the plan splits weights over {d.tensor} GPUs (tensor parallel), and xDiT's runner refuses "
                        "--tensor_parallel_degree for every model it runs", "keep the weights whole (replicate) and "
                        "split the sequence", field=("rules",))
    if d.cfg > 1 and not model.cfg:
        raise PlanError(f"xDiT runs {model.name} without CFG parallelism (--use_cfg_parallel is not among its "
                        "capabilities for this model)", f"put the cfg axis's {d.cfg} ways on the sequence or the batch",
                        field=("mesh", GUIDANCE_AXIS))
    decode = strategy.placement.vae_decode
    if decode == "parallel" and not model.parallel_vae:
        raise PlanError(f"placement.vae_decode: parallel is xDiT's --use_parallel_vae, which is not among its "
                        f"capabilities for {model.name}", "use full or tiled", field=("placement", "vae_decode"))
    flags = [f"--data_parallel_degree {d.data}", f"--ulysses_degree {d.ulysses}", f"--ring_degree {d.ring}"]
    if d.cfg > 1:
        flags.append("--use_cfg_parallel")
    if decode == "parallel":
        flags.append("--use_parallel_vae")
    if decode == "tiled":
        flags.append("--enable_tiling")
    if _priced_compiled(strategy, hardware):
        flags.append("--use_torch_compile")
    note = "".join(f"{line}\n" for line in priced_elsewhere(plan, strategy, hardware))
    sharded = _sharded(plan, strategy)
    if sharded:
        if model.runner:
            field = strategy.placement.field_of(sharded[0].name)
            raise PlanError(f"placement.{'.'.join(field[1:])}: sharded splits {sharded[0].name} over the GPUs, and "
                            "xDiT's runner has no such flag (--shard_t5_encoder is its example scripts')",
                            "use device or cpu", field=field)
        other = next((c for c in sharded if "T5" not in c.class_name), None)
        if other is not None:  # xfuser.core.distributed.shard_t5_encoder wraps a T5's blocks in FSDP, no other
            field = strategy.placement.field_of(other.name)
            t5 = any("T5" in c.class_name for c in plan.card.encoders)
            fix = (f"place it whole: placement.encoders: {{{other.name}: device}}"
                   if t5 and field == ("placement", "text_encoder") else f"set placement.{'.'.join(field[1:])}: device "
                   "or cpu")
            raise PlanError(f"placement.{'.'.join(field[1:])}: sharded splits {other.name} ({other.class_name}) over "
                            "the GPUs, and xDiT's --shard_t5_encoder shards a T5 text encoder only", fix, field=field)
        flags.append("--shard_t5_encoder")
    if d.ulysses * d.ring > 1 and d.priced_as != "xdit":
        ring = ", and sends each ring block to the next rank during a pass" if d.ring > 1 else ""
        note += (f"# this plan was priced as {d.priced_as} runs it; xDiT joins the streams on the chip{ring}: set "
                f"activations.sequence_parallel: xdit to price what xDiT runs\n")
    gpus = plan.mesh.device_count
    launch = (f"xdit --nproc_per_node {gpus} --model {model.name}" if model.runner else
              f"torchrun --nproc_per_node {gpus} {model.name} --model <checkpoint>")
    return (f"# {plan.strategy_name}: {plan.card.class_name} on {gpus} GPUs, from meshlab export --format xdit\n"
            f"{note}{launch} " + " ".join(flags) + "\n")


def _sharded(plan: Plan, strategy: Strategy) -> list:
    """The encoders the placement shards (FSDP), in the card's order."""
    return [c for c in plan.card.encoders if strategy.placement.encoder_place(c.name) == "sharded"]


FORMS = {"diffusers": diffusers_snippet, "xdit": xdit_flags}


def gpu_form(fmt: str, plan: Plan, strategy: Strategy, hardware=None) -> str:
    """The plan in `fmt` ("diffusers" or "xdit"); where that refuses it and the other tool takes it, the refusal's
    fix says so."""
    try:
        return FORMS[fmt](plan, strategy, hardware)
    except PlanError as exc:
        other = next(name for name in FORMS if name != fmt)
        try:
            FORMS[other](plan, strategy, hardware)
        except PlanError:
            raise exc from None
        raise PlanError(exc.problem, f"{exc.fix}, or export --format {other}", field=exc.field) from None
