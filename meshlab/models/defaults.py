"""How each built-in model is run by default: its diffusers pipeline's own ``__call__`` defaults, with sources.

Read from ``meshlab/data/pipelines.yaml`` once; pure (yaml only). `meshlab sweep` and `meshlab try --model` take
a model's steps, guidance, text length and output size from here unless the command line gives them, and a strategy
file takes those it leaves out (meshlab.plan.planned.with_pipeline_workload), so that Flux.1-dev is priced
guidance-distilled at 28 steps, not with CFG at 50.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from importlib import resources

import yaml

FIELDS = ("steps", "cfg", "text_tokens", "height", "width", "frames")


@dataclass(frozen=True)
class PipelineDefaults:
    model: str
    pipeline: str
    steps: int
    cfg: bool
    text_tokens: int
    height: int
    width: int
    frames: int
    source: str
    vae_dtype: str | None = None  # the VAE's dtype where its documented use loads it otherwise (Wan: float32)

    def workload_fields(self) -> dict:
        return {name: getattr(self, name) for name in FIELDS}

    def describe(self) -> str:
        size = f"{self.width}x{self.height}" + (f" x {self.frames} frames" if self.frames > 1 else "")
        guidance = "true CFG (two calls a step)" if self.cfg else "no CFG (guidance-distilled: one call a step)"
        vae = f", the VAE held in {self.vae_dtype} (its documented example)" if self.vae_dtype else ""
        return (f"{self.pipeline}'s defaults: {self.steps} steps, {guidance}, {self.text_tokens} text tokens, "
                f"{size}{vae}")


@lru_cache(maxsize=1)
def _table() -> dict[str, PipelineDefaults]:
    text = (resources.files("meshlab") / "data" / "pipelines.yaml").read_text(encoding="utf-8")
    data = yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    return {name: PipelineDefaults(model=name, **row) for name, row in data.items()}


def pipeline_defaults(model: str) -> PipelineDefaults | None:
    """The defaults of a built-in card by name; None for a card file or a model the table does not know."""
    return _table().get(model)
