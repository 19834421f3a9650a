"""The checkpoint a run's request names (every backend loads it here), and the stock ``QwenImagePipeline.__call__``
as the plain-PyTorch and DTensor runs drive it: the call with the request's workload and a clock over its phases.
No torch_xla."""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Callable

from meshlab.runtime.requests import PipelineRequest

#: Steps before the steady state (the first step warms caches: DTensor's sharding propagation, cuDNN/cuBLAS).
WARMUP_STEPS = 1


def load_checkpoint(request: PipelineRequest):
    """The request's pipeline: a saved folder (the tiny one included) in its load dtype, or ``random``: the
    strategy's card at ``request.layers`` with random weights in the workload's dtype."""
    if request.checkpoint == "random":
        from meshlab.pipelines.random_pipeline import build_random_pipeline
        from meshlab.plan.planned import plan_file

        card = plan_file(request.strategy).card
        return build_random_pipeline(card, request.layers, request.workload.dtype, request.seed)
    from meshlab.pipelines.tiny import load_pipeline

    return load_pipeline(Path(request.checkpoint), request.load_dtype)


def call(pipe, request: PipelineRequest, callback=None):
    import torch

    w = request.workload
    return pipe(prompt=request.prompt, negative_prompt=request.negative_prompt if w.cfg else None,
                true_cfg_scale=w.cfg_scale, num_inference_steps=w.steps, height=w.height, width=w.width,
                num_images_per_prompt=w.batch, generator=torch.Generator("cpu").manual_seed(request.seed),
                output_type="np", callback_on_step_end=callback)


class Clock:
    """Wall time of the text encoder, each denoising step and the VAE decode, as the stock pipeline runs them.
    `sync` waits for the device's queued work before each reading (``torch.cuda.synchronize`` on a GPU)."""

    def __init__(self, pipe, sync: Callable[[], None] = lambda: None):
        self.sync = sync
        self.start = self.last = time.perf_counter()
        self.steps: list[float] = []
        self.encode_s = self.decode_s = 0.0
        self.text_tokens: list[int] = []  # each encoded prompt's length, as the transformer gets it
        encode, decode = pipe.encode_prompt, pipe.vae.decode

        def timed_encode(*args, **kwargs):
            started = time.perf_counter()
            value = encode(*args, **kwargs)
            self.sync()
            self.text_tokens.append(int(value[0].shape[1]))
            self.encode_s += time.perf_counter() - started
            self.last = time.perf_counter()
            return value

        def timed_decode(*args, **kwargs):
            started = time.perf_counter()
            value = decode(*args, **kwargs)
            self.sync()
            self.decode_s += time.perf_counter() - started
            return value

        pipe.encode_prompt, pipe.vae.decode = timed_encode, timed_decode

    def step(self, _pipe, _index, _timestep, _kwargs):
        self.sync()
        now = time.perf_counter()
        self.steps.append(now - self.last)
        self.last = now
        return {}

    def summary(self, device: str, mesh) -> dict:
        steady = self.steps[WARMUP_STEPS:]
        timings = {"text_encode_s": self.encode_s, "rope_warmup_s": 0.0, "step_s": self.steps,
                   "vae_decode_s": self.decode_s, "total_s": time.perf_counter() - self.start,
                   "first_step_s": self.steps[0] if self.steps else None,
                   "second_step_s": self.steps[1] if len(self.steps) > 1 else None,
                   "steady_step_median_s": statistics.median(steady) if steady else None}
        counters = {"compiles_total": 0, "compiles_steady": 0, "compile_s": None, "host_transfers": None,
                    "run_fallbacks": {}}
        return {"device": device, "attention_backend": "sdpa", "mesh_shape": list(mesh.shape),
                "mesh_axes": list(mesh.names), "text_tokens": self.text_tokens,
                "timings": timings, "counters": counters, "warnings": []}


