"""The torch half of `meshlab run --backend dtensor`: ``python -m meshlab.pipeline.dtensor_run REQUEST RESULT``.

No torch_xla. On one host it starts one gloo process per device (meshlab.backend.ranks); under ``torchrun``
(``RANK`` and ``WORLD_SIZE`` set) it is one of the ranks torchrun started, with nccl on CUDA. Every rank loads
the same pipeline, applies the plan to its transformer with ``meshlab.apply(..., backend="dtensor")`` and runs
the stock ``QwenImagePipeline.__call__`` unchanged: the transformer's forward takes plain tensors, splits them
as the strategy's ``activations`` say, runs sharded, and hands the whole output back to the stock loop, so the
scheduler, guidance and VAE are the stock ones. With ``verify`` the stock pipeline runs first on the unsharded
weights in this process, with the same arguments, and rank 0's pixels are compared with it.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from meshlab.backend.protocol import report_progress as progress

#: Steps before the steady state (the first step builds DTensor's sharding-propagation caches).
WARMUP_STEPS = 1


def handle(request: dict) -> dict:
    from meshlab.backend.ranks import joined, spawn, under_torchrun

    reference = None
    if request.get("verify"):
        progress("running the stock pipeline on the CPU (unsharded) for the pixel comparison")
        reference = _stock_pixels(request)
    if under_torchrun():
        joined()
        ranks = [_run_rank(request, Path(request["scratch"]))]
    else:
        progress(f"starting {request['world']} gloo processes; each loads the pipeline and applies the plan")
        ranks = spawn(_run_rank, request["world"], request)
    result = ranks[0]
    result["mismatches"] = sorted({name for rank in ranks for name in rank.pop("mismatches")})
    result["memory"] = {"source": "DTensor local shards of the transformer's parameters (weights only)",
                        "weight_bytes_per_rank": [rank.pop("weight_bytes") for rank in ranks]}
    if reference is not None:
        import numpy as np

        result["max_abs_error"] = float(np.abs(np.load(result.pop("pixels")) - reference).max())
    return result


def _stock_pixels(request: dict):
    import numpy as np

    from meshlab.pipeline.tiny import load_pipeline

    pipe = load_pipeline(Path(request["checkpoint"]), request.get("load_dtype"))
    return np.asarray(_call(pipe, request).images[0], dtype=np.float32)


def _call(pipe, request: dict, callback=None):
    import torch

    w = request["workload"]
    return pipe(prompt=request["prompt"], negative_prompt=request["negative_prompt"] if w["cfg"] else None,
                true_cfg_scale=w["cfg_scale"], num_inference_steps=w["steps"], height=w["height"], width=w["width"],
                num_images_per_prompt=w["batch"], generator=torch.Generator("cpu").manual_seed(request["seed"]),
                output_type="np", callback_on_step_end=callback)


def _run_rank(request: dict, _folder: Path) -> dict:
    import numpy as np
    import torch.distributed as dist

    from meshlab.api import apply
    from meshlab.backend import dtensor
    from meshlab.pipeline.run_worker import plan_for
    from meshlab.pipeline.tiny import load_pipeline

    rank, world = dist.get_rank(), dist.get_world_size()
    pipe = load_pipeline(Path(request["checkpoint"]), request.get("load_dtype"))
    strategy, card, plan = plan_for(request["strategy"], pipe.transformer, world)
    applied = apply(pipe.transformer, plan, strategy=strategy, backend="dtensor")
    _shard_forward(pipe.transformer, applied, strategy)
    clock = _Clock(pipe)
    if rank == 0:
        progress(f"running the pipeline on {world} ranks ({strategy.name})")
    with dtensor.forward_context():
        out = _call(pipe, request, clock.step)
    image = out.images[0]
    summary = clock.summary(applied, dist.get_backend())
    result = {"summary": summary, "mismatches": [p.name for p in applied.mismatches], "weight_bytes": dtensor.local_bytes(pipe.transformer),
              "is_writer": rank == 0,
              "hardware": {"device_type": dtensor.device_type(), "devices": world, "process_group": dist.get_backend()},
              "ran": {"model": card.name, "config_digest": card.config_digest, "batch": request["workload"]["batch"],
                      "dtype": str(pipe.transformer.dtype).removeprefix("torch."), "backend": "dtensor"}}
    if rank == 0:
        path = Path(request["scratch"]) / "image.png"
        pipe.image_processor.numpy_to_pil(np.asarray(image)[None])[0].save(path)
        result["image"] = str(path)
        result["pixels"] = str(Path(request["scratch"]) / "pixels.npy")
        np.save(result["pixels"], np.asarray(image, dtype=np.float32))
    return result


def _shard_forward(transformer, applied, strategy) -> None:
    """The transformer's forward takes the stock loop's plain tensors and returns its whole output."""
    import torch

    from meshlab.backend import dtensor
    from meshlab.backend.inputs import input_spec

    original, mesh = transformer.forward, applied.plan.mesh

    def forward(*args, **kwargs):
        sharded = {name: dtensor.distribute(value, applied.mesh, input_spec(name, tuple(value.shape),
                                                                            strategy.activations, mesh), mesh, name)
                   if isinstance(value, torch.Tensor) else value for name, value in kwargs.items()}
        out = original(*args, **sharded)
        return tuple(dtensor.whole(o) for o in out) if isinstance(out, tuple) else type(out)(
            sample=dtensor.whole(out.sample))

    transformer.forward = forward


class _Clock:
    """Wall time of the text encoder, each denoising step and the VAE decode, as the stock pipeline runs them."""

    def __init__(self, pipe):
        self.start = self.last = time.perf_counter()
        self.steps: list[float] = []
        self.encode_s = self.decode_s = 0.0
        encode, decode = pipe.encode_prompt, pipe.vae.decode

        def timed_encode(*args, **kwargs):
            started = time.perf_counter()
            value = encode(*args, **kwargs)
            self.encode_s += time.perf_counter() - started
            self.last = time.perf_counter()
            return value

        def timed_decode(*args, **kwargs):
            started = time.perf_counter()
            value = decode(*args, **kwargs)
            self.decode_s += time.perf_counter() - started
            return value

        pipe.encode_prompt, pipe.vae.decode = timed_encode, timed_decode

    def step(self, _pipe, _index, _timestep, _kwargs):
        now = time.perf_counter()
        self.steps.append(now - self.last)
        self.last = now
        return {}

    def summary(self, applied, process_group: str) -> dict:
        steady = self.steps[WARMUP_STEPS:]
        timings = {"text_encode_s": self.encode_s, "rope_warmup_s": 0.0, "step_s": self.steps,
                   "vae_decode_s": self.decode_s, "total_s": time.perf_counter() - self.start,
                   "first_step_s": self.steps[0] if self.steps else None,
                   "second_step_s": self.steps[1] if len(self.steps) > 1 else None,
                   "steady_step_median_s": statistics.median(steady) if steady else None}
        counters = {"compiles_total": 0, "compiles_steady": 0, "compile_s": None, "host_transfers": None,
                    "run_fallbacks": {}}
        return {"device": f"{process_group} x{applied.plan.mesh.device_count}", "attention_backend": "sdpa",
                "mesh_shape": list(applied.plan.mesh.shape), "mesh_axes": list(applied.plan.mesh.names),
                "timings": timings, "counters": counters, "warnings": []}


def main(argv: list[str]) -> int:
    from meshlab.backend.protocol import serve

    return serve(handle, argv, "the DTensor run")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
