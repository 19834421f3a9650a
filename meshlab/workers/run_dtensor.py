"""The torch half of `meshlab run --backend dtensor`: ``python -m meshlab.workers.run_dtensor REQUEST RESULT``.

No torch_xla. On one host it starts one gloo process per device (meshlab.workers.ranks); under ``torchrun``
(``RANK`` and ``WORLD_SIZE`` set) it is one of the ranks torchrun started, with nccl on CUDA. Every rank loads
the same pipeline, applies the plan to its transformer with ``meshlab.apply(..., backend="dtensor")`` and runs
the stock ``QwenImagePipeline.__call__`` unchanged: the transformer's forward takes plain tensors, splits them
as the strategy's ``activations`` say, runs sharded, and hands the whole output back to the stock loop, so the
scheduler, guidance and VAE are the stock ones. With ``verify`` the stock pipeline runs first on the unsharded
weights in this process, with the same arguments, and rank 0's pixels are compared with it.
"""

from __future__ import annotations

import sys
from pathlib import Path

from meshlab.runtime.protocol import report_progress as progress
from meshlab.runtime.requests import TorchRunRequest
from meshlab.runtime.results import DTensorRankRun
from meshlab.pipelines import stock


#: What every rank imports (the tiny or saved Qwen-Image pipeline's classes), imported once in the server the ranks
#: are forked from (meshlab.workers.ranks).
RANK_MODULES = ("meshlab.api", "meshlab.parallelisms.dtensor", "torch.distributed.tensor", "meshlab.workers.run_xla",
                "meshlab.pipelines.tiny", "diffusers.pipelines.qwenimage.pipeline_qwenimage",
                "diffusers.models.transformers", "diffusers.models.autoencoders",
                "transformers.models.qwen2_5_vl.modeling_qwen2_5_vl", "transformers.models.qwen2.tokenization_qwen2")


def handle(request: TorchRunRequest) -> dict:
    from meshlab.workers.ranks import joined, spawn, under_torchrun

    reference = None
    if request.verify:
        progress("running the stock pipeline on the CPU (unsharded) for the pixel comparison")
        reference = _stock_pixels(request)
    if under_torchrun():
        joined()
        ranks = [_run_rank(request, Path(request.scratch))]
    else:
        progress(f"starting {request.world} gloo processes; each loads the pipeline and applies the plan")
        ranks = spawn(_run_rank, request.world, request, DTensorRankRun, preload=RANK_MODULES)
    result = ranks[0]
    result["mismatches"] = sorted({name for rank in ranks for name in rank.pop("mismatches")})
    result["memory"] = {"source": "DTensor local shards of the transformer's parameters (weights only)",
                        "weight_bytes_per_rank": [rank.pop("weight_bytes") for rank in ranks]}
    pixels = result.pop("pixels", None)  # rank 0's; another rank under torchrun has none
    if reference is not None and pixels is not None:
        import numpy as np

        result["max_abs_error"] = float(np.abs(np.load(pixels) - reference).max())
    return result


def _stock_pixels(request: TorchRunRequest):
    import numpy as np

    pipe = stock.load_checkpoint(request)
    return np.asarray(stock.call(pipe, request).images[0], dtype=np.float32)


def _run_rank(request: TorchRunRequest, _folder: Path) -> dict:
    import numpy as np
    import torch.distributed as dist

    from meshlab.api import apply
    from meshlab.parallelisms import dtensor
    from meshlab.workers.run_xla import plan_for

    rank, world = dist.get_rank(), dist.get_world_size()
    pipe = stock.load_checkpoint(request)
    sync = lambda: None  # noqa: E731
    if dtensor.device_type() == "cuda":  # nccl: the whole pipeline on this rank's GPU, the transformer sharded
        import os

        import torch

        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count())))
        pipe.to("cuda")
        sync = torch.cuda.synchronize
    strategy, card, plan = plan_for(request.strategy, pipe.transformer, world)
    applied = apply(pipe.transformer, plan, strategy=strategy, backend="dtensor")
    _shard_forward(pipe.transformer, applied, strategy)
    clock = stock.Clock(pipe, sync)
    if rank == 0:
        progress(f"running the pipeline on {world} ranks ({strategy.name})")
    with dtensor.forward_context():
        out = stock.call(pipe, request, clock.step)
    image = out.images[0]
    summary = clock.summary(f"{dist.get_backend()} x{world}", applied.plan.mesh)
    result = {"summary": summary, "mismatches": [p.name for p in applied.mismatches],
              "weight_bytes": dtensor.local_bytes(pipe.transformer), "is_writer": rank == 0,
              "hardware": {"device_type": dtensor.device_type(), "devices": world, "process_group": dist.get_backend()},
              "ran": {"model": card.name, "config_digest": card.config_digest, "batch": request.workload.batch,
                      "dtype": str(pipe.transformer.dtype).removeprefix("torch."), "backend": "dtensor"}}
    if rank == 0:
        path = Path(request.scratch) / "image.png"
        pipe.image_processor.numpy_to_pil(np.asarray(image)[None])[0].save(path)
        result["image"] = str(path)
        result["pixels"] = str(Path(request.scratch) / "pixels.npy")
        np.save(result["pixels"], np.asarray(image, dtype=np.float32))
    return result


def _shard_forward(transformer, applied, strategy) -> None:
    """The transformer's forward takes the stock loop's plain tensors and returns its whole output."""
    from meshlab.parallelisms import dtensor

    original = transformer.forward

    def forward(*args, **kwargs):
        sharded = dtensor.distribute_inputs(kwargs, applied.mesh, applied.plan.mesh, strategy.activations)
        out = original(*args, **sharded)
        return tuple(dtensor.whole(o) for o in out) if isinstance(out, tuple) else type(out)(
            sample=dtensor.whole(out.sample))

    transformer.forward = forward


def main(argv: list[str]) -> int:
    from meshlab.runtime.protocol import serve

    return serve(handle, argv, "the DTensor run", TorchRunRequest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
