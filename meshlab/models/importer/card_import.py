"""Build a model card from the real diffusers class (needs the ``xla`` extra: torch, diffusers, transformers).

Every figure is measured from the classes, never written down:

- parameters: the full model is built on the ``meta`` device from its config and walked with
  ``named_parameters()``; ``kind`` is the class of the module that owns each parameter.
- stream: a copy with real widths but two blocks of each kind runs one forward on the ``meta`` device (shapes
  only: no weights in memory, no arithmetic; a 32B model traces in seconds) with distinct small token counts;
  a hook on every module that owns parameters reads the token dim of its input: image tokens -> "image", text
  tokens -> "text", their sum -> "joint", no token dim
  (a ``[batch, width]`` input such as the timestep embedding) -> "conditioning". Modules the forward never
  calls are "none". Block 0's streams are mapped onto every block of the full model.
- blocks: ``transformer_blocks.i`` is block i; Flux's ``single_transformer_blocks.j`` is numbered after the
  dual-stream blocks (block ``num_layers + j``), so ``block`` is unique and ``num_layers`` counts both kinds.
- components: built on ``meta`` to count parameters; a VAE's decode figures (FLOPs, bytes moved, ops, working
  set) come from real decodes on the CPU (meshlab.models.importer.decode_trace), and an encoder's working set from
  encodes on ``meta`` called as its pipeline calls it (meshlab.models.importer.encode_trace).

``python -m meshlab.models.importer.card_import --all`` regenerates the cards shipped in meshlab/models/cards/.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from meshlab.models.families import FAMILIES, Family, Geometry, family
from meshlab.models.importer.forward_inputs import forward_inputs
from meshlab.models.card import (
    BUILTIN_DIR, DTYPE_BYTES, ELEMENTWISE_EXECUTIONS, Architecture, Attention, Buffer, Component, Elementwise,
    ModelCard, Parameter, card_to_json, module_pattern,
)
from meshlab.models.importer.dataflow_trace import trace_dataflow
from meshlab.models.importer.decode_trace import Decode, trace_decode
from meshlab.models.importer.encode_trace import encode_working_bytes
from meshlab.models.importer.elementwise_trace import trace_elementwise_both
from meshlab.models.presets import PRESETS, ComponentSpec, Preset
from meshlab.core.errors import InputError, Location

__all__ = ["PRESETS", "import_card", "import_preset", "import_from_config_file", "write_card"]

#: The traced forward: batch 2, a 3x5 grid of image tokens (two token frames for a video model: 30), 7 text
#: tokens. 15 (30), 7 and 22 (37) differ from every width and head count of the supported models, so a dim of
#: one of these sizes can only be a token dim.
TRACE_BATCH, TRACE_GRID, TRACE_TEXT, TRACE_SEED, TRACE_VIDEO_FRAMES = 2, (3, 5), 7, 0, 2

_QKV = ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj")
_OUT = ("to_out.0", "to_add_out")


def import_card(
    class_name: str,
    config: Mapping[str, Any],
    name: str,
    components: Mapping[str, ComponentSpec | Mapping[str, Any]] | None = None,
    *,
    dtype: str = "bfloat16",
    preset: str | None = None,
) -> ModelCard:
    """The card of diffusers' ``class_name`` built from ``config``, its parameters stored as ``dtype``.

    ``components`` maps a pipeline component name (``vae``, ``text_encoder``) to a ``ComponentSpec`` or a
    dict with ``library``, ``class`` and ``config``.
    """
    diffusers, torch = _require("diffusers"), _require("torch")
    if dtype not in DTYPE_BYTES:
        raise InputError(f"unknown dtype {dtype!r}", f"use one of {', '.join(DTYPE_BYTES)}")
    tracer = family(class_name)
    cls = _resolve("diffusers", class_name)
    with torch.device("meta"):  # at the card's dtype as from_pretrained loads it: _keep_in_fp32_modules stay float32
        model = as_loaded(cls.from_config(dict(config)), getattr(torch, dtype))
    full_config = _jsonable({k: v for k, v in model.config.items() if not k.startswith("_")})
    offsets = _block_offsets(model, tracer)
    streams, (dataflow, joins, kernels, masked) = _trace(cls, full_config, tracer)
    specs = {n: _spec(s) for n, s in (components or {}).items()}
    built = {n: _measured_component(n, s, dtype, tracer.video) for n, s in specs.items()}
    vae_scale = built["vae"][1] if "vae" in built else tracer.vae_default
    return ModelCard(
        name=name,
        class_name=class_name,
        source=_source(diffusers.__version__, class_name, full_config, preset, specs),
        architecture=_architecture(model, full_config, tracer, streams, offsets, vae_scale),
        parameters=_parameters(model, streams, offsets),
        attention=_attention(model, streams, offsets, kernels, masked),
        components=tuple(component for component, _ in built.values()),
        dataflow=dataflow,
        joins=joins,
        **dict(zip(("elementwise", "dispatches"), _elementwise(cls, full_config, tracer, dtype))),
        buffers=_buffers(model),
    )


def _source(version: str, class_name: str, config: dict, preset: str | None, specs: dict[str, ComponentSpec]
            ) -> dict:
    """How the card was made: library versions, the full config, the preset, component inputs, the trace."""
    source = {"diffusers_version": version, "class": class_name, "config": config, "preset": preset}
    if any(s.library == "transformers" for s in specs.values()):
        source["transformers_version"] = _require("transformers").__version__
    source["components"] = {n: s.to_json() for n, s in specs.items()}
    source["trace"] = {"batch": TRACE_BATCH, "image_tokens": TRACE_GRID[0] * TRACE_GRID[1], "text_tokens": TRACE_TEXT,
                       "dtype": TRACE_DTYPE, "device": "meta"}
    tracer = FAMILIES[class_name]
    if tracer.text_tokens(config):
        source["trace"]["text_tokens"] = tracer.text_tokens(config)
    if tracer.reference_tokens(config):
        source["trace"]["reference_tokens"] = tracer.reference_tokens(config)
    return source


def import_preset(name: str, dtype: str = "bfloat16") -> ModelCard:
    """The card of a published model in ``PRESETS`` (``qwen-image``, ``flux-dev``)."""
    if name not in PRESETS:
        raise InputError(f"unknown preset {name!r}", f"use one of {', '.join(PRESETS)}")
    p: Preset = PRESETS[name]
    return import_card(p.class_name, p.config, p.name, p.components, dtype=dtype, preset=p.name)


def import_from_config_file(
    path: str | Path,
    class_name: str | None = None,
    name: str | None = None,
    components: Mapping[str, ComponentSpec | Mapping[str, Any]] | None = None,
    dtype: str = "bfloat16",
) -> ModelCard:
    """The card of a local diffusers ``config.json``; the class defaults to its ``_class_name``, the name to
    the folder holding it."""
    path = Path(path)
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"cannot read config: {exc}", "pass a diffusers config.json", Location(str(path))) from None
    if not isinstance(config, dict):
        raise InputError("config is not a JSON object", "pass a diffusers config.json", Location(str(path)))
    class_name = class_name or config.get("_class_name")
    if not class_name:
        raise InputError("config names no _class_name", f"pass the class, one of {', '.join(FAMILIES)}",
                         Location(str(path)))
    name = name or path.resolve().parent.name
    try:
        family(class_name)
    except InputError as exc:
        raise InputError(exc.problem, exc.fix, Location(str(path))) from None
    return import_card(class_name, config, name, components, dtype=dtype)


def write_card(card: ModelCard, path: str | Path, inputs: tuple | list = ()) -> Path:
    """Write the card's JSON to ``path`` whole or not at all, never over one of `inputs` (meshlab.core.files). The
    document is read back first as `load_card` reads it, so a card meshlab writes is one it reads (what it refuses
    is its one-line InputError, naming the file)."""
    from meshlab.core.files import write_atomic
    from meshlab.models.card import card_from_json

    document = card_to_json(card)
    card_from_json(document, str(path))
    write_atomic(path, json.dumps(document, indent=1, sort_keys=False) + "\n", inputs, "-o")
    return Path(path)


# --- the transformer -------------------------------------------------------------------------------------


def _require(module: str) -> Any:
    """Import a module of the ``xla`` extra; its absence is an InputError saying how to install it."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise InputError(f"importing model cards needs torch, diffusers and transformers ({exc.name} is missing)",
                         "install the extra: pip install -e '.[xla]'") from None


def _resolve(library: str, class_name: str) -> type:
    if library not in ("diffusers", "transformers"):
        raise InputError(f"unknown library {library!r}", "use diffusers or transformers")
    cls = getattr(_require(library), class_name, None)
    if not isinstance(cls, type):
        raise InputError(f"{library} has no class {class_name!r}", f"check the class name against {library}'s docs")
    return cls


def _block_offsets(model: Any, tracer: Family) -> dict[str, int]:
    """First global block index of each block list: dual-stream blocks first, single-stream after them."""
    offsets, start = {}, 0
    for attr, _ in tracer.blocks:
        offsets[attr] = start
        start += len(getattr(model, attr))
    return offsets


def _locate(module_path: str, offsets: dict[str, int]) -> tuple[int | None, str]:
    """(global block index or None, the module's path in the traced copy (block 0 stands for every block))."""
    for attr, offset in offsets.items():
        if module_path.startswith(attr + "."):
            index, _, rest = module_path[len(attr) + 1:].partition(".")
            return offset + int(index), f"{attr}.0.{rest}" if rest else f"{attr}.0"
    return None, module_path


#: the dataflow trace's dtype, whatever the card's: a piece the class computes in float32 (Wan's modulation) shows
TRACE_DTYPE = "bfloat16"


def _trace(cls: type, config: dict, tracer: Family) -> tuple[dict[str, str], tuple]:
    """Stream of each parameter-owning module of a two-blocks-per-kind copy, by module path, and its dataflow,
    joins and attention kernels written as matmuls (meshlab.models.importer.dataflow_trace), from one forward in
    `TRACE_DTYPE` (so that a modulation the class computes in float32 whatever its weights' dtype, as Wan's, says
    so, whatever the card's dtype)."""
    import torch

    with torch.device("meta"):  # shapes only: the streams and the dataflow need no values
        return _trace_on_this_device(cls, config, tracer, getattr(torch, TRACE_DTYPE))


def _trace_on_this_device(cls: type, config: dict, tracer: Family, torch_dtype):
    import torch

    torch.manual_seed(TRACE_SEED)
    # two blocks of each kind: the first is a middle block (the last one's text stream feeds nothing)
    model = as_loaded(cls.from_config({**config, **{key: 2 for _, key in tracer.blocks}}).eval(), torch_dtype)
    geometry = _trace_geometry(tracer, config)
    counts = {n: s for s, n in _trace_tokens(geometry).items()}
    seen: dict[str, set[str]] = {}
    inputs = forward_inputs(cls, config, geometry, torch_dtype, torch.Generator().manual_seed(TRACE_SEED))
    latent = tuple(inputs["hidden_states"].shape)  # an unpacked latent (SD3, Wan) is the image stream too,
    latents = {latent, (latent[0] * latent[1], *latent[2:])} if tracer.latent == "frames" else {latent}  # CogVideoX
    # patchifies its [batch, frames, ...] latent with the frames folded into the batch

    def recorder(path: str) -> Callable:
        def hook(module, args, kwargs):
            x = next((a for a in (*args, *kwargs.values()) if torch.is_tensor(a)), None)
            if x is not None:
                shape = tuple(x.shape)
                seen.setdefault(path, set()).add("image" if shape in latents else _stream_of(shape, counts))

        return hook

    for path, module in model.named_modules():
        if next(module.parameters(recurse=False), None) is not None:
            module.register_forward_pre_hook(recorder(path), with_kwargs=True)
    hidden = config["num_attention_heads"] * config["attention_head_dim"]
    # one forward: the stream hooks above record while the dataflow tracer runs it
    flows = trace_dataflow(model, inputs, {attr for attr, _ in tracer.blocks}, hidden,
                           lambda shape: _stream_of(shape, counts), torch_dtype)
    return {path: _merge(streams) for path, streams in seen.items()}, flows


def _trace_geometry(tracer: Family, config: dict) -> Geometry:
    """The traced forward's shapes: `TRACE_TEXT` text tokens unless the class requires its own count (Wan I2V's
    512), and the class's reference tokens (Wan I2V's 257: distinct from every width of the supported models)."""
    return Geometry(TRACE_BATCH, TRACE_GRID, tracer.text_tokens(config) or TRACE_TEXT,
                    TRACE_VIDEO_FRAMES if tracer.video else 1, tracer.reference_tokens(config))


def _trace_tokens(geometry: Geometry) -> dict[str, int]:
    """Tokens per sample of each stream of the traced forward (each a distinct count)."""
    image, text = geometry.image_tokens, geometry.text_tokens
    tokens = {"image": image, "text": text, "joint": image + text}
    if geometry.reference:
        tokens["reference"] = geometry.reference
    if len(set(tokens.values())) != len(tokens):
        raise InputError(f"the traced forward's token counts are not distinct: {tokens}",
                         "change meshlab.models.importer.card_import.TRACE_GRID or TRACE_TEXT")
    return tokens


def _elementwise(cls: type, config: dict, tracer: Family, dtype: str) -> tuple[tuple[Elementwise, ...], dict]:
    """Per block of each list, the bytes its elementwise work moves per token of each stream, fused (one pass per
    gap between matmuls) and eager (every op its own kernel) (meshlab.models.importer.elementwise_trace), from a forward
    of a three-blocks-per-kind copy at the card's dtype: the middle block of each list stands for all of them (the first
    reads the list's input in a pass of its own, which the others share with the block before them). Also the ops a
    block of each list dispatches, and the rest of the forward's ("outside": all but the three blocks of each list)."""
    import torch

    torch_dtype = getattr(torch, dtype)
    geometry = _trace_geometry(tracer, config)
    tokens = _trace_tokens(geometry)
    counts = {n: s for s, n in tokens.items()}
    with torch.device("meta"):
        model = as_loaded(cls.from_config({**config, **{key: 3 for _, key in tracer.blocks}}).eval(), torch_dtype)
        inputs = forward_inputs(cls, config, geometry, torch_dtype, torch.Generator().manual_seed(TRACE_SEED))
    lists = [attr for attr, _ in tracer.blocks]
    *traced, ops = trace_elementwise_both(model, inputs, {attr: 1 for attr in lists},
                                          lambda shape: _stream_of(shape, counts))
    dispatches = {attr: ops.get(attr, 0) for attr in lists}
    dispatches["outside"] = max(0, ops.get(None, 0) - 2 * sum(dispatches.values()))  # blocks 0 and 2 are untagged
    merged: dict[tuple[str, str, str, str, str], float] = {}
    for execution, found in zip(ELEMENTWISE_EXECUTIONS, traced):
        for (blocks, stream, side, linear), nbytes in found.items():
            key = (blocks, stream, side, module_pattern(linear, set(lists)) if linear else "", execution)
            merged[key] = merged.get(key, 0.0) + nbytes
    streams = list(tokens)

    def order(key: tuple[str, str, str, str, str]) -> tuple:
        blocks, stream, side, linear, execution = key
        return ELEMENTWISE_EXECUTIONS.index(execution), lists.index(blocks), streams.index(stream), side, linear

    return tuple(Elementwise(*key[:2], merged[key] / (TRACE_BATCH * tokens[key[1]]), *key[2:])
                 for key in sorted(merged, key=order)), dispatches


def as_loaded(model: Any, dtype: Any, parameters: bool = True) -> Any:
    """`model` in `dtype` as ``from_pretrained(torch_dtype=...)`` loads it: diffusers converts what the checkpoint
    holds (its parameters and persistent buffers) as it loads each into the model (``load_model_dict_into_meta``),
    those whose name has a part among the class's ``_keep_in_fp32_modules`` to float32 (Wan's time embedder, norm2
    and every block's ``scale_shift_table``: the list names parameters as well as modules), and casts no other
    tensor, so a non-persistent buffer (Wan's rotary tables) keeps the dtype the class made it in (here float32, the
    default; from_pretrained builds under torch_dtype as the default, which no shipped class's buffers follow).
    `parameters` false: the buffers alone (a model whose random weights are drawn in the workload's dtype)."""
    import torch

    keep = set(getattr(model, "_keep_in_fp32_modules", None) or ())
    loaded = set(model.state_dict())
    for name, tensor in (*(model.named_parameters() if parameters else ()), *model.named_buffers()):
        if name in loaded and tensor.is_floating_point():
            tensor.data = tensor.data.to(torch.float32 if keep & set(name.split(".")) else dtype)
    return model


def _stream_of(shape: tuple[int, ...], counts: dict[int, str]) -> str:
    if len(shape) == 4 and shape[2:] == TRACE_GRID and shape[1] not in counts:
        return "image"  # [batch, channels, height, width] on the token grid: SANA's convolutional MLP
    if len(shape) >= 3:  # [batch, tokens, ...]: diffusers keeps tokens at dim 1; look further only if not
        return next((counts[d] for d in (shape[1], *shape[2:-1]) if d in counts), "none")
    if len(shape) == 2 and shape[0] % TRACE_BATCH == 0 and shape[0] // TRACE_BATCH in counts:
        return counts[shape[0] // TRACE_BATCH]  # tokens flattened into the batch dim
    return "conditioning"  # [batch, width] or [batch]: once per sample


def _merge(streams: set[str]) -> str:
    """One stream for a module called more than once: token streams win over conditioning."""
    tokens = streams - {"conditioning", "none"}
    if not tokens:
        return "conditioning" if "conditioning" in streams else "none"
    return tokens.pop() if len(tokens) == 1 else "joint"


def _kind(module: Any) -> str:
    from torch import nn

    if isinstance(module, nn.Linear):
        return "linear"
    if isinstance(module, nn.modules.conv._ConvNd):  # every Conv and ConvTranspose
        return "conv"
    if isinstance(module, nn.Embedding):
        return "embedding"
    if isinstance(module, (nn.LayerNorm, nn.GroupNorm, nn.RMSNorm)) or type(module).__name__.endswith("Norm"):
        return "norm"  # diffusers' RMSNorm is its own class
    return "other"


def _parameters(model: Any, streams: dict[str, str], offsets: dict[str, int]) -> tuple[Parameter, ...]:
    modules = dict(model.named_modules())
    out = []
    for name, p in model.named_parameters():
        module_path = name.rpartition(".")[0]
        block, traced = _locate(module_path, offsets)
        kind = _kind(modules[module_path])
        # the card's dtype, or float32 where the class keeps it (the planner prices weights at the workload's)
        out.append(Parameter(name, tuple(p.shape), str(p.dtype).removeprefix("torch."), kind,
                             streams.get(traced, "none"), block))
    return tuple(out)


def _buffers(model: Any) -> tuple[Buffer, ...]:
    """The model's floating buffers as from_pretrained loads them at the card's dtype (`as_loaded`), each marked
    persistent where the checkpoint holds it. A buffer of a dtype a card has no name for (float64, complex) is left
    out: no shipped class has one."""
    loaded = set(model.state_dict())
    named = ((name, b, str(b.dtype).removeprefix("torch.")) for name, b in model.named_buffers())
    return tuple(Buffer(name, tuple(b.shape), dtype, name in loaded) for name, b, dtype in named
                 if b.is_floating_point() and dtype in DTYPE_BYTES)


def _attention(model: Any, streams: dict[str, str], offsets: dict[str, int],
               kernels: dict[str, tuple[frozenset[str], ...]], masked: frozenset[str]) -> tuple[Attention, ...]:
    """Every attention module: heads, head dim, streams, projections; its kind is "linear" where the traced
    forward computed it as matmuls of which the first read only its keys and values (SANA's ReLU linear attention:
    ``K^T V`` first, then the queries), else "softmax"; masked where the traced forward passed its
    ``F.scaled_dot_product_attention`` a mask (`masked`: patterns, meshlab.models.importer.dataflow_trace)."""
    from torch import nn

    modules = dict(model.named_modules())
    found = []
    for path, module in modules.items():
        heads = getattr(module, "heads", None)
        fused = getattr(module, "to_qkv_mlp_proj", None)
        pattern = module_pattern(_locate(path, offsets)[1], set(offsets))
        if isinstance(heads, int) and isinstance(fused, nn.Linear):  # Flux.2's single blocks: q, k, v and MLP-in
            stream = streams.get(_locate(f"{path}.to_qkv_mlp_proj", offsets)[1], "none")
            found.append(Attention(path, heads, module.head_dim, _sequence({stream}), (f"{path}.to_qkv_mlp_proj",),
                                   (), fused_width=3 * heads * module.head_dim, masked=pattern in masked))
            continue
        if not isinstance(heads, int) or not isinstance(getattr(module, "to_q", None), nn.Linear):
            continue
        qkv = tuple(f"{path}.{n}" for n in _QKV if isinstance(modules.get(f"{path}.{n}"), nn.Linear))
        out = tuple(f"{path}.{n}" for n in _OUT if isinstance(modules.get(f"{path}.{n}"), nn.Linear))
        stream = {q: streams.get(_locate(q, offsets)[1], "none") for q in qkv}
        queries = _sequence({stream[q] for q in qkv if q.rsplit(".", 1)[1] in ("to_q", "add_q_proj")})
        keys = _sequence({stream[q] for q in qkv if q.rsplit(".", 1)[1] in ("to_k", "add_k_proj")})
        cross = keys != queries
        first = (kernels.get(pattern) or (None,))[0]
        reads_first = {n.rsplit(".", 1)[1] for n in first} if first is not None else set()
        linear = first is not None and bool(reads_first) and reads_first <= {"to_k", "to_v", "add_k_proj", "add_v_proj"}
        found.append(Attention(path, heads, module.to_q.out_features // heads, queries, qkv, out,
                               keys if cross else (), kind="linear" if linear else "softmax",
                               masked=pattern in masked))
    return tuple(found)


def _sequence(streams: set[str]) -> tuple[str, ...]:
    """Streams in an attention's sequence, text first: Qwen-Image and Flux concatenate [text, image]."""
    parts = set().union(*({"text", "image"} if s == "joint" else {s} for s in streams))
    return tuple(s for s in ("text", "image", "reference", "conditioning", "none") if s in parts)


def _architecture(model: Any, config: dict, tracer: Family, streams: dict[str, str], offsets: dict[str, int],
                  vae_scale: tuple[int, int]) -> Architecture:
    hidden = config["num_attention_heads"] * config["attention_head_dim"]
    patch, temporal_patch = tracer.patch(config), tracer.temporal_patch(config)
    packed = 1 if tracer.latent == "tokens" else patch * patch * temporal_patch  # latent values per token
    return Architecture(
        hidden_size=hidden,
        num_layers=sum(len(getattr(model, attr)) for attr, _ in tracer.blocks),
        num_attention_heads=config["num_attention_heads"],
        attention_head_dim=config["attention_head_dim"],
        patch_size=patch,
        in_channels=config["in_channels"] * packed,
        text_dim=config[tracer.text_width],
        vae_scale_factor=vae_scale[0],
        mlp_ratio=_mlp_ratio(model, streams, offsets, hidden),
        temporal_scale_factor=vae_scale[1] if tracer.video else 1,
        temporal_patch=temporal_patch,
        reference_tokens=tracer.reference_tokens(config),
        text_tokens=tracer.text_tokens(config) or 0,
    )


def _mlp_ratio(model: Any, streams: dict[str, str], offsets: dict[str, int], hidden: int) -> float:
    """Widest expansion of a token Linear in the first block: the MLP's up-projection over the hidden width (a
    pointwise convolution counts as the Linear it is: SANA's GLUMBConv)."""
    from torch import nn

    from meshlab.models.importer.dataflow_trace import pointwise_conv

    first = next(iter(offsets)) + ".0."
    ratios = [m.out_features / hidden if isinstance(m, nn.Linear) else m.out_channels / hidden
              for path, m in model.named_modules()
              if path.startswith(first) and (isinstance(m, nn.Linear) and m.in_features == hidden
                                             or pointwise_conv(m) and m.in_channels == hidden)
              and streams.get(path) in ("image", "text", "joint")]
    return max(ratios, default=0.0)


def _jsonable(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


# --- components --------------------------------------------------------------------------------------------


def _spec(spec: ComponentSpec | Mapping[str, Any]) -> ComponentSpec:
    if isinstance(spec, ComponentSpec):
        return spec
    try:
        return ComponentSpec(spec["library"], spec["class"], dict(spec["config"]), spec.get("origin", ""),
                             int(spec.get("prompt_prefix_tokens", 0)), dict(spec.get("encode_kwargs", {})),
                             int(spec.get("prompt_tokens", 0)))
    except (KeyError, TypeError) as exc:
        raise InputError(f"bad component spec ({exc})", "give library, class and config") from None


def _build(spec: ComponentSpec, cls: type) -> Any:
    if spec.library == "diffusers":
        return cls.from_config(spec.config)
    return cls(cls.config_class(**spec.config))


def _measured_component(name: str, spec: ComponentSpec, dtype: str, video: bool) -> tuple[Component, tuple[int, int]]:
    """`_component`, measured once per process for each spec (the three Wan cards share a VAE and a text encoder:
    their decodes are traced once when every card is imported)."""
    key = (json.dumps(spec.to_json(), sort_keys=True), dtype, video)
    if key not in _MEASURED:
        _MEASURED[key] = _component("", spec, dtype, video)
    component, scales = _MEASURED[key]
    return dataclasses.replace(component, name=name), scales


_MEASURED: dict[tuple, tuple[Component, tuple[int, int]]] = {}


def _component(name: str, spec: ComponentSpec, dtype: str, video: bool = False) -> tuple[Component, tuple[int, int]]:
    """The component counted on ``meta``, and the VAE's (spatial, temporal) scale factors ((8, 1) when not a
    VAE)."""
    import torch

    cls = _resolve(spec.library, spec.class_name)
    with torch.device("meta"):
        model = _build(spec, cls)
    count = sum(p.numel() for p in model.parameters())
    is_vae = spec.library == "diffusers" and hasattr(model, "decode")
    decode = _traced_decode(spec, cls, video) if is_vae else None
    per_token = 0.0 if is_vae else 2.0 * _text_path_parameters(model)
    head = getattr(model, "lm_head", None)
    head_per_token = 2.0 * sum(p.numel() for p in head.parameters() if p.dim() >= 2) if head is not None else 0.0
    scales = _vae_scale_factor(_vae_figures(model)) if is_vae else (8, 1)
    figures = {} if decode is None else dict(
        working_bytes_per_pixel=decode.working_bytes_per_pixel, working_latent_frames=decode.working_latent_frames,
        working_bytes_per_pixel_per_latent_frame=decode.working_growth_per_latent_frame,
        output_copies=decode.output_copies,
        decode_flops_per_pixel=decode.flops_per_pixel,
        decode_bytes_per_pixel=decode.eager_bytes_per_pixel,
        decode_fused_bytes_per_pixel=decode.fused_bytes_per_pixel, decode_dispatches=decode.dispatches)
    if is_vae:
        figures.update(_tiles(model))
    elif spec.library == "transformers":  # an encoder: what one encode holds, traced at 2 bytes an element
        model = model.to(torch.bfloat16).eval()
        figures.update(encode_working_bytes=encode_working_bytes(model, spec.encode_kwargs, spec.prompt_tokens),
                       fixed_tokens=spec.prompt_tokens)
    return Component(name, spec.class_name, count, dtype, flops_per_token=per_token,
                     head_flops_per_token=head_per_token, prefix_tokens=spec.prompt_prefix_tokens,
                     largest_layer_parameters=_largest_layer(model), root_parameters=_root(model), **figures), scales


def _tiles(vae: Any) -> dict:
    """The tile and stride, in output pixels, of the VAE's tiled decode, as its class sets them up:
    ``tile_sample_min_height``/``_width`` and ``tile_sample_stride_*`` (Wan's, Qwen-Image's), or
    ``tile_sample_min_size`` with ``tile_overlap_factor`` (AutoencoderKL: stride = size x (1 - overlap)), or
    CogVideoX's per-side overlap factors over its latent tile (stride = int(latent tile x (1 - overlap)) latent
    pixels)."""
    if hasattr(vae, "tile_overlap_factor_height"):  # AutoencoderKLCogVideoX.tiled_decode
        scale = 2 ** (len(vae.config.block_out_channels) - 1)
        strides = (int(vae.tile_latent_min_height * (1 - vae.tile_overlap_factor_height)) * scale,
                   int(vae.tile_latent_min_width * (1 - vae.tile_overlap_factor_width)) * scale)
        return {"tile": (int(vae.tile_sample_min_height), int(vae.tile_sample_min_width)), "tile_stride": strides}
    if hasattr(vae, "tile_sample_min_height"):
        return {"tile": (int(vae.tile_sample_min_height), int(vae.tile_sample_min_width)),
                "tile_stride": (int(vae.tile_sample_stride_height), int(vae.tile_sample_stride_width))}
    if hasattr(vae, "tile_sample_min_size"):
        size = int(vae.tile_sample_min_size)
        stride = int(size * (1 - vae.tile_overlap_factor))
        return {"tile": (size, size), "tile_stride": (stride, stride)}
    return {}


def _root(model: Any) -> int:
    """Parameters of `model` outside every ``nn.ModuleList`` (what FSDP's root unit holds when each layer of the
    lists is wrapped on its own)."""
    from torch import nn

    inside = {id(p) for m in model.modules() if isinstance(m, nn.ModuleList) for p in m.parameters()}
    return sum(p.numel() for p in model.parameters() if id(p) not in inside)


def _largest_layer(model: Any) -> int:
    """Parameters of the largest element of any ``nn.ModuleList`` in `model` (a transformer layer)."""
    from torch import nn

    return max((sum(p.numel() for p in layer.parameters()) for m in model.modules() if isinstance(m, nn.ModuleList)
                for layer in m), default=0)


#: Parameter paths a prompt encode does not multiply with in its layers: token embeddings (a lookup), the LM head
#: (counted apart: `Component.head_flops_per_token`), a vision tower (no images go in), pooling projections of
#: CLIP-style encoders aside.
_NOT_PER_TOKEN = ("embed_tokens", "token_embedding", "shared", "lm_head", "visual", "vision", "vision_tower",
                  "multi_modal_projector", "position_embedding",
                  "embed_positions")


def _text_path_parameters(model) -> int:
    """Parameters a text encoder multiplies each prompt token by (counted on ``meta``)."""
    return sum(p.numel() for name, p in model.named_parameters()
               if not any(part in _NOT_PER_TOKEN for part in name.split(".")) and p.dim() >= 2)


def _vae_scale_factor(config: Mapping) -> tuple[int, int]:
    """Pixels per latent pixel along a side, and frames per latent frame past the first, computed as
    QwenImagePipeline, FluxPipeline, WanPipeline, HunyuanVideoPipeline, CogVideoXPipeline, LTXPipeline and
    SanaPipeline do (WanPipeline reads the VAE's ``scale_factor_*``; HunyuanVideoPipeline and LTXPipeline its
    ``*_compression_ratio``, which LTX-Video's VAE works out from its layers when its config leaves them null, see
    `_vae_figures`; CogVideoXPipeline its ``temporal_compression_ratio`` and its blocks)."""
    if config.get("scale_factor_spatial") and config.get("scale_factor_temporal"):
        return int(config["scale_factor_spatial"]), int(config["scale_factor_temporal"])
    if config.get("temporal_compression_ratio"):  # HunyuanVideo's, LTX-Video's and CogVideoX's video VAEs
        spatial = config.get("spatial_compression_ratio") or 2 ** (len(config["block_out_channels"]) - 1)
        return int(spatial), int(config["temporal_compression_ratio"])
    if "encoder_block_out_channels" in config:  # SANA's DC-AE (SanaPipeline: 2 ** (stages - 1))
        return 2 ** (len(config["encoder_block_out_channels"]) - 1), 1
    if "temperal_downsample" in config:
        return 2 ** len(config["temperal_downsample"]), 2 ** sum(bool(t) for t in config["temperal_downsample"])
    return 2 ** (len(config["block_out_channels"]) - 1), 1


def _vae_figures(vae: Any) -> dict:
    """The VAE's config with the compression ratios it works out itself (LTX-Video's, from its layers)."""
    ratios = {k: vars(vae)[k] for k in ("spatial_compression_ratio", "temporal_compression_ratio")
              if isinstance(vars(vae).get(k), int)}  # set in __init__, not read through the config
    return {**vae.config, **ratios}


def _traced_decode(spec: ComponentSpec, cls: type, video: bool) -> Decode:
    """The decode's figures (meshlab.models.importer.decode_trace), from the VAE and its latents on ``meta`` (the
    figures are the ops' and shapes', not the values'); a video model's VAE decodes frames after the first."""
    import torch

    with torch.device("meta"):
        vae = cls.from_config(spec.config).eval()
        return trace_decode(vae, lambda side, frames: _latent_shape(vae.config, side, frames), video)


def _latent_shape(config: Mapping, side: int, frames: int = 1) -> tuple[int, ...]:
    if "z_dim" in config:  # video VAE (AutoencoderKLQwenImage, Wan's): [batch, channels, frames, h, w]
        return (1, config["z_dim"], frames, side, side)
    if "temporal_compression_ratio" in config:  # HunyuanVideo's, LTX-Video's, CogVideoX's: the same layout
        return (1, config["latent_channels"], frames, side, side)
    if frames != 1:
        raise InputError("an image VAE decodes one frame", "use a video VAE (one with z_dim) for a video model")
    if "latent_channels" in config:
        return (1, config["latent_channels"], side, side)
    raise InputError("cannot tell the latent shape of this VAE", "its config needs z_dim or latent_channels")


# --- entry point -------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m meshlab.models.importer.card_import", description="Regenerate model cards.")
    parser.add_argument("presets", nargs="*", help=f"presets to import ({', '.join(PRESETS)})")
    parser.add_argument("--all", action="store_true", help="import every preset")
    parser.add_argument("--out", type=Path, default=BUILTIN_DIR, help="folder to write <name>.json into")
    args = parser.parse_args(argv)
    names = list(PRESETS) if args.all else args.presets
    if not names:
        parser.error("name a preset or pass --all")
    for name in names:
        start = time.perf_counter()
        path = write_card(import_preset(name), args.out / f"{name}.json")
        print(f"{path}  ({time.perf_counter() - start:.1f} s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
