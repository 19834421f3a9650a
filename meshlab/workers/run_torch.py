"""The torch half of `meshlab run --backend torch`: ``python -m meshlab.workers.run_torch REQUEST RESULT``.

Plain PyTorch on one device, eager with SDPA: a CUDA GPU when there is one, else the CPU. No torch_xla (torch_xla's
CUDA build is not on PyPI, and GPU hosts often carry a newer torch than meshlab pins): it imports only torch,
diffusers and transformers, and runs on torch 2.9 to 2.11. The stock ``QwenImagePipeline.__call__`` runs
unchanged on a one-device plan; the clock waits for the GPU before every reading.
"""

from __future__ import annotations

import sys
from pathlib import Path

from meshlab.runtime.protocol import report_progress as progress
from meshlab.runtime.requests import TorchRunRequest
from meshlab.pipelines import stock


def handle(request: TorchRunRequest) -> dict:
    import numpy as np
    import torch

    from meshlab.workers.run_xla import plan_for

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    progress(f"building the pipeline ({request.checkpoint}) on the {device}")
    pipe = stock.load_checkpoint(request).to(device)
    _strategy, card, plan = plan_for(request.strategy, pipe.transformer, 1)
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    clock = stock.Clock(pipe, torch.cuda.synchronize if cuda else (lambda: None))
    progress(f"running the pipeline on one {device} device")
    with torch.no_grad():
        out = stock.call(pipe, request, clock.step)
    name = torch.cuda.get_device_name() if cuda else "cpu"
    path = Path(request.scratch) / "image.png"
    pipe.image_processor.numpy_to_pil(np.asarray(out.images[0])[None])[0].save(path)
    memory = ({"source": "torch.cuda.max_memory_allocated (the whole pipeline on one GPU)",
               "peak_bytes_per_device": int(torch.cuda.max_memory_allocated())} if cuda else None)
    return {"summary": clock.summary(f"{device} ({name})", plan.mesh), "image": str(path), "mismatches": [],
            "memory": memory, "is_writer": True,
            "hardware": {"device_type": device, "devices": 1, "name": name, "torch": torch.__version__},
            "ran": {"model": card.name, "config_digest": card.config_digest, "batch": request.workload.batch,
                    "dtype": str(pipe.transformer.dtype).removeprefix("torch."), "backend": "torch",
                    "layers": request.layers}}


def main(argv: list[str]) -> int:
    from meshlab.runtime.protocol import serve

    return serve(handle, argv, "the PyTorch run", TorchRunRequest)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
