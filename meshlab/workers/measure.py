"""The torch half of `meshlab profile`: ``python -m meshlab.workers.measure REQUEST RESULT``.

Times, on the local device, what the parent (meshlab.experiments.profiling) asks for, each op compiled and warmed first
and then the median of a few runs, the clock stopped only once the device is done (``xla.sync``: torch_xla's sync plus
``wait_device_ops``; ``torch.cuda.synchronize`` on a GPU):

- each Linear's shard GEMM and the attention at the shapes given (on several XLA devices every device runs it,
  as each does its shard under the plan);
- the transformer at one block per list and at ``depth`` blocks per list under the plan (meshlab.apply, the
  run's XLA fixes and attention backend), and the first block of each list alone on the inputs it got there, at
  each text length, each run as many times in one program as a step calls it;
- the VAE decoder at the workload's resolution, an empty program's trace and run (dispatch), a device copy,
  the host CPU's Linear at the text encoder's width, and a device-to-host transfer;
- on a CUDA GPU (eager PyTorch), the host's seconds to issue the one-block and the ``depth``-block forward, their
  kernels queued and not waited for, each with the ops the card traced for it (launch): what the host spends
  dispatching one op (the catalog's ``eager_dispatch_s``) is the slope between the two. The CPU runs each op as it is
  issued, so there it is not told apart from the work.

Backends: ``xla`` (torch_xla: CPU or TPU, SPMD) and ``torch`` (plain PyTorch on one CUDA GPU, or the CPU).
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from importlib import metadata
from pathlib import Path

from meshlab.runtime.protocol import report_progress, serve
from meshlab.runtime.requests import ProfileRequest
from meshlab.core.errors import InputError


class Device:
    """Where ops run and how to wait for them."""

    def __init__(self, backend: str):
        import torch

        self.backend = backend
        if backend == "xla":
            import torch_xla
            import torch_xla.runtime as xr

            from meshlab.parallelisms import xla

            xr.use_spmd()
            self.device, self.sync = torch_xla.device(), xla.sync
            self.platform = (xr.device_type() or "cpu").lower()
            self.count = xr.global_runtime_device_count()
        else:
            cuda = torch.cuda.is_available()
            self.device = torch.device("cuda" if cuda else "cpu")
            self.sync = torch.cuda.synchronize if cuda else (lambda: None)
            self.platform, self.count = ("cuda" if cuda else "cpu"), 1

    def name(self) -> str:
        import torch

        if self.platform == "cuda":
            return torch.cuda.get_device_name()
        return _cpu_model() + (f" (torch_xla, {self.count} virtual device{'s' * (self.count > 1)})"
                               if self.backend == "xla" and self.platform == "cpu" else "")


def timed(fn, sync, reps: int = 3, warm: int = 2) -> float:
    """Median wall seconds of `fn` with its output waited for; `warm` calls first (compile, caches)."""
    held = []
    start = time.perf_counter()
    for _ in range(warm):
        held[:] = [fn()]
        sync()
    once = (time.perf_counter() - start) / max(warm, 1)
    reps = reps if once < 2 else 1  # slow ops: one timed run after warm-up keeps the profile within its budget
    seconds = []
    for _ in range(reps):
        start = time.perf_counter()
        held[:] = [fn()]
        sync()
        seconds.append(time.perf_counter() - start)
    return statistics.median(seconds)


def issue_seconds(fn, sync, reps: int = 10) -> float:
    """The host's seconds to issue `fn`, its device work queued and not waited for: the least of `reps` calls, each
    started with the device idle (after a warm call). A forward of fewer kernels than the GPU's launch queue takes
    is the host's dispatching, and whatever GPU work it waits for where it synchronises (`_launches`)."""
    fn()
    sync()
    best = float("inf")
    for _ in range(reps):
        sync()
        start = time.perf_counter()
        held = fn()
        best = min(best, time.perf_counter() - start)
        sync()
        del held
    return best


def point(op: str, shape, flops: float, nbytes: float, seconds: float, label: str = "") -> dict:
    return {"op": op, "shape": [int(n) for n in shape], "flops": float(flops), "bytes": float(nbytes),
            "seconds": float(seconds), **({"label": label} if label else {})}


def handle(request: ProfileRequest) -> dict:
    import torch

    dev = Device(request.backend)
    if request.devices != dev.count:
        raise InputError(f"the strategy's mesh uses {request.devices} devices and this process sees {dev.count}",
                         "profile a strategy whose mesh matches the devices")
    dtype = getattr(torch, request.dtype)
    steps = _steps(request)
    done, points = 0, []

    def tick(what: str) -> None:
        nonlocal done
        done += 1
        report_progress(f"{done}/{steps} {what}")

    with torch.no_grad():
        points.append(point("dispatch", [1], 0, 0, _dispatch(dev)))
        tick("dispatch")
        points.append(_copy(dev, dtype))
        tick("device copy")
        for t, i, o in request.linear:
            x, w = _random((t, i), dtype, dev), _random((o, i), dtype, dev)
            seconds = timed(lambda: torch.nn.functional.linear(x, w), dev.sync)
            points.append(point("linear", (t, i, o), 2.0 * t * i * o, (t * i + o * i + t * o) * x.element_size(),
                                seconds))
            tick(f"linear {t}x{i}x{o}")
        for b, h, q, k, d in request.attention:
            qs, ks, vs = (_random((b, h, n, d), dtype, dev) for n in (q, k, k))
            seconds = timed(lambda: torch.nn.functional.scaled_dot_product_attention(qs, ks, vs), dev.sync)
            points.append(point("attention", (b, h, q, k, d), 4.0 * b * h * q * k * d,
                                2 * b * h * (q + k) * d * qs.element_size(), seconds))
            tick(f"attention {b}x{h}x{q}x{k}x{d}")
        for kind, axes, nbytes in request.collectives:
            points.append(_collective(request.mesh, dev, dtype, kind, tuple(axes), nbytes))
            tick(f"{kind} over {','.join(axes)}, {nbytes} B")
        if request.blocks:
            points += _blocks(request, dev, tick)
        if request.vae:
            points.append(_vae(request, dev))
            tick("VAE decode")
        if request.host:
            points += _host(request, dev, dtype)
            tick("host matmul and transfer")
    return {"device": {"platform": dev.platform, "devices": dev.count, "name": dev.name(),
                       "backend": request.backend, "host": platform.node(), "cores": os.cpu_count(),
                       "memory_bytes": _memory_bytes()},
            "versions": _versions(), "points": points}


def _steps(request: ProfileRequest) -> int:
    blocks = len(request.text_tokens) * (2 + request.block_lists) if request.blocks else 0
    return 2 + len(request.linear) + len(request.attention) + len(request.collectives) + blocks + \
        bool(request.vae) + bool(request.host)


def _random(shape, dtype, dev):
    import torch

    value = torch.randn(shape, dtype=dtype).to(dev.device)
    dev.sync()
    return value


def _dispatch(dev) -> float:
    """An empty program's trace, dispatch and wait: the per-step host cost every step pays at least."""
    x = _random((8,), __import__("torch").float32, dev)
    return timed(lambda: x + 1, dev.sync, reps=20)


def _copy(dev, dtype) -> dict:
    x = _random((64 * 2**20 // 2,), dtype, dev)  # 64 MiB
    seconds = timed(lambda: x * 2, dev.sync, reps=5)
    return point("copy", [x.numel()], 0, 2 * x.numel() * x.element_size(), seconds)


def _collective(mesh_axes: dict[str, int], dev, dtype, kind: str, axes: tuple[str, ...], nbytes: int) -> dict:
    """One collective of `kind` over the mesh `axes` on a per-chip buffer of `nbytes` (meshlab's
    `Collective.bytes`: all-gather the gathered buffer, all-reduce and reduce-scatter the reduced one, all-to-all
    and collective-permute the buffer each chip holds), made by marking an elementwise op's output with another
    sharding than its input's and letting XLA's partitioner insert the collective. A collective-permute's output
    has its input's spec on the mesh with the devices moved one step along the last of `axes`: each chip sends
    its whole buffer to its neighbour. XLA's CPU compiler moves bf16 collectives as f32 and keeps a reduce-scatter
    as the partitioner's all-reduce, as it does in a run (tests/runtime/test_profile_collectives.py)."""
    import math

    import torch

    from meshlab.parallelisms import xla
    from meshlab.core.mesh import AbstractMesh
    from meshlab.core.spec import PartitionSpec

    mesh = AbstractMesh(tuple(mesh_axes.items()))
    xla_mesh = xla.build_mesh(mesh)
    g = math.prod(mesh.size(a) for a in axes)
    itemsize = torch.tensor([], dtype=dtype).element_size()
    n = max(g, -(-nbytes // itemsize // g) * g)  # elements of the per-chip buffer, a multiple of the group
    over = axes
    if kind == "all-gather":
        shape, before, after = (n,), (over,), (None,)
    elif kind in ("all-reduce", "reduce-scatter"):
        shape, before, after = (g, n), (over, None), (None,) if kind == "all-reduce" else (over,)
    elif kind == "all-to-all":
        shape, before, after = (g, n), (over, None), (None, over)
    elif kind == "collective-permute":
        shape, before, after = (g * n,), (over,), (over,)
    else:
        raise InputError(f"meshlab profile cannot make a {kind}", "it is priced from the catalog")
    x = _random(shape, dtype, dev)
    xla.mark(x, xla_mesh, PartitionSpec(*before), "input")
    out_mesh = xla.shifted_mesh(xla_mesh, mesh, axes[-1]) if kind == "collective-permute" else xla_mesh

    def run():
        y = x.sum(0) if kind in ("all-reduce", "reduce-scatter") else x * 1
        xla.mark(y, out_mesh, PartitionSpec(*after), "output")
        return y

    seconds = timed(run, dev.sync, reps=5)
    return point("collective", (g, n * itemsize), 0, n * itemsize, seconds, f"{kind} over {','.join(axes)}")


def _blocks(request: ProfileRequest, dev, tick) -> list[dict]:
    """Per text length: the transformer at one block per list under the plan, and each list's first block alone,
    each run `calls` times in one program as a step runs them (both guidance branches, on inputs of their own so
    XLA cannot merge them): on the CPU, XLA runs independent calls side by side on the cores."""
    from meshlab.models.families import geometry
    from meshlab.models.importer.build import build_model, example_inputs
    from meshlab.models.truncate import block_lists
    from meshlab.plan.planned import at_depth, with_workload
    from meshlab.experiments.profiling import plan_for_profiling

    whole = plan_for_profiling(Path(request.strategy))
    w = request.workload
    whole = with_workload(whole, height=w["height"], width=w["width"], batch=w["batch"])
    planned = at_depth(whole, 1)
    card, calls, depth = planned.card, request.calls, request.depth
    model = build_model(card, 1, request.dtype, request.seed)
    to_device = _on_device(model, planned, dev)
    stacked = at_depth(whole, depth)
    deep = build_model(stacked.card, depth, request.dtype, request.seed)
    deep_to_device = _on_device(deep, stacked, dev)
    captured: dict[str, list] = {}
    lists = list(block_lists(card))
    for name in lists:
        getattr(model, name)[0].register_forward_pre_hook(
            lambda _m, args, kwargs, name=name: captured.setdefault(name, []).append((args, kwargs)),
            with_kwargs=True)
    points = []
    for text in request.text_tokens:
        geo = geometry(card, w["height"], w["width"], text, request.call_batch)
        inputs = [to_device(example_inputs(card, geo, request.dtype, request.seed + 10 * i))
                  for i in range(calls)]
        captured.clear()
        seconds = timed(lambda: [model(**x, return_dict=False)[0] for x in inputs], dev.sync)
        points.append(point("outer", (geo.image_tokens, text, calls), 0, 0, seconds))
        tick(f"transformer, one block, {text} text tokens, {calls} call(s)")
        one = inputs[0]
        for name in lists:
            held = captured[name][-calls:]
            block = getattr(model, name)[0]
            seconds = timed(lambda: [block(*args, **kwargs) for args, kwargs in held], dev.sync)
            points.append(point("block", (geo.image_tokens, text, calls), 0, 0, seconds, name))
            tick(f"{name}[0] alone, {text} text tokens, {calls} call(s)")
        deep_geo = geometry(stacked.card, w["height"], w["width"], text, request.call_batch)
        inputs = [deep_to_device(example_inputs(stacked.card, deep_geo, request.dtype, request.seed + 10 * i))
                  for i in range(calls)]
        seconds = timed(lambda: [deep(**x, return_dict=False)[0] for x in inputs], dev.sync)
        points.append(point("stack", (geo.image_tokens, text, calls, depth), 0, 0, seconds))
        tick(f"transformer, {depth} blocks, {text} text tokens, {calls} call(s)")
        if dev.backend == "torch" and dev.platform == "cuda" and text == request.text_tokens[0]:
            points += _launches(((model, one, card), (deep, inputs[0], stacked.card)), dev)
            captured.clear()  # the block hooks kept each issued forward's inputs
    return points


#: kernels a CUDA stream's launch queue takes before the host waits on the GPU (about a thousand): a forward of fewer
#: ops is issued without waiting
_LAUNCH_QUEUE = 900


def _launches(forwards, dev) -> list[dict]:
    """Per forward (the model, one call's inputs, its card): the host's seconds to issue it (`issue_seconds`), with
    the ops the card traced for it, as a launch point; none for a forward of more ops than the launch queue takes.
    The host's seconds per op is the slope between two forwards (meshlab.core.profile_hardware): a wait on the GPU
    outside the blocks (a copy from pageable host memory, an ``.item()``; diffusers caches Qwen-Image's RoPE tables
    on the device to avoid one) costs both alike and falls out of it."""
    from meshlab.cost.layout import eager_dispatches

    points = []
    for model, inputs, card in forwards:
        ops = eager_dispatches(card)
        if 0 < ops <= _LAUNCH_QUEUE:
            seconds = issue_seconds(lambda: model(**inputs, return_dict=False)[0], dev.sync)
            points.append(point("launch", (ops,), 0, 0, seconds))
    return points


def _on_device(model, planned, dev):
    """`model` on the device as the run puts it there (XLA: the run's fixes and the plan applied); returns what
    puts a forward's inputs there too (XLA: split as the plan's activations say)."""
    import torch

    if dev.backend != "xla":
        model.to(dev.device)
        return lambda inputs: {k: v.to(dev.device) if isinstance(v, torch.Tensor) else v for k, v in inputs.items()}
    from meshlab.api import apply, shard_inputs
    from meshlab.pipelines import xla_fixes

    xla_fixes.use_real_rope(model)
    model.set_attention_backend(xla_fixes.choose_attention_backend(dev.platform))
    model.to(dev.device)
    applied = apply(model, planned.plan, strategy=planned.strategy)
    return lambda inputs: shard_inputs(applied, planned, **inputs)


def _vae(request: ProfileRequest, dev) -> dict:
    """The decoder at the workload's resolution, on the device, as the run decodes (one image)."""
    import torch

    from meshlab.models.card import load_card
    from meshlab.pipelines.random_pipeline import _vae as build_vae

    card = load_card(request.model, request.model_dir)
    component = card.source["components"]["vae"]
    vae = build_vae(component, request.dtype, request.seed)
    if dev.backend == "xla":
        from meshlab.pipelines import xla_fixes

        xla_fixes.use_nearest_upsampling(vae)
    vae.to(dev.device)
    h, w = request.vae
    factor = card.architecture.vae_scale_factor
    latents = _random((1, vae.config.z_dim, 1, h // factor, w // factor), getattr(torch, request.dtype), dev)
    seconds = timed(lambda: vae.decode(latents, return_dict=False)[0], dev.sync, reps=1, warm=1)
    vae_flops = next((c.decode_flops_per_pixel for c in card.components if c.name == "vae"), 0.0)
    return point("vae_decode", (h, w), vae_flops * h * w, 0, seconds)


def _host(request: ProfileRequest, dev, dtype) -> list[dict]:
    """The host CPU's Linear at the text encoder's width (what `placement.text_encoder: cpu` runs at), and one
    decoded image's float32 pixels from the device to the host."""
    import torch

    tokens, width = request.host["tokens"], request.host["width"]
    x, w = torch.randn(tokens, width, dtype=dtype), torch.randn(width, width, dtype=dtype)
    seconds = timed(lambda: torch.nn.functional.linear(x, w), lambda: None)
    found = [point("host_matmul", (tokens, width, width), 2.0 * tokens * width * width, 0, seconds)]
    if dev.backend == "torch" and dev.platform == "cpu":
        return found  # the device is the host: nothing moves
    h, wd = request.vae or (512, 512)
    pixels = _random((1, 3, h, wd), torch.float32, dev)
    moved = timed(lambda: pixels.cpu(), dev.sync, reps=3, warm=1)
    return found + [point("host_transfer", (1, 3, h, wd), 0, pixels.numel() * 4, moved)]


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "host CPU"


def _memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def _versions() -> dict:
    found = {"python": platform.python_version()}
    for package in ("meshlab", "torch", "torch_xla", "diffusers"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = None
    return found


def main(argv: list[str]) -> int:
    return serve(handle, argv, "the profile", ProfileRequest)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
