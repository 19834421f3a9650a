"""What the parent asks of each torch worker (``meshlab.runtime.protocol``): one pydantic model per request.

The parent builds the model (so a request it writes is checked when it is made) and the worker reads the file back
through the same model (``protocol.serve``), so the two sides cannot disagree on a name or a type unnoticed. No
torch here: the parent side imports this.
"""

from __future__ import annotations

from typing import Any, Literal, Optional

from pydantic import BaseModel, ConfigDict, Field


class Request(BaseModel):
    """A worker request: closed and immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, ser_json_inf_nan="constants")  # inf stays inf, as json


class CheckJob(Request):
    """One strategy to check, with the check's options (``CheckOptions.to_json()``)."""

    strategy: str
    options: dict[str, Any]


class CheckRequest(Request):
    """`meshlab check` on XLA's CPU partitioner (``meshlab.workers.check_xla``): the jobs share one device count."""

    jobs: list[CheckJob]
    dump_dir: str


class DTensorCheckRequest(Request):
    """`meshlab check --backend dtensor` (``meshlab.workers.check_dtensor``) on `world` gloo ranks."""

    jobs: list[CheckJob]
    world: int = Field(ge=1)


class TpuCheckRequest(Request):
    """`meshlab check --backend tpu` (``meshlab.workers.check_tpu``): one strategy, compiled by each front end."""

    strategy: str
    options: dict[str, Any]
    front_ends: list[Literal["torch-xla", "torchax"]] = Field(min_length=1)
    topology: dict[str, Any]  # meshlab.workers.libtpu.Topology's fields
    scratch: str


class ProfileRequest(Request):
    """`meshlab profile` (``meshlab.workers.measure``): the shapes the plan gives each chip, to time."""

    strategy: str
    backend: Literal["xla", "torch"]
    devices: int = Field(ge=1)
    dtype: Literal["bfloat16", "float16", "float32"]
    seed: int
    text_tokens: list[int]
    workload: dict[str, int]  # height, width, batch
    call_batch: int = Field(ge=1)
    calls: int = Field(ge=1)
    depth: int = Field(ge=1)
    linear: list[list[int]]  # [tokens, in, out]
    attention: list[list[int]]  # [batch, heads, q, k, head dim]
    collectives: list[tuple[str, list[str], int]] = []  # [kind, mesh axes, bytes]
    mesh: dict[str, int]
    blocks: bool = False
    block_lists: int = Field(1, ge=1)
    vae: Optional[list[int]] = None  # [height, width] to time a decode at; None: none
    model: str
    model_dir: str
    host: Optional[dict[str, int]] = None  # the text encoder's tokens and width, for the host matmul; None: none


class RunWorkload(Request):
    """The workload a run uses (``meshlab.experiments.run._workload``)."""

    height: int
    width: int
    steps: int
    cfg: bool
    batch: int
    dtype: Literal["bfloat16", "float16", "float32"]
    cfg_scale: float


class PipelineRequest(Request):
    """A pipeline run: the checkpoint, the workload and the prompt."""

    strategy: str
    checkpoint: str  # a folder, "tiny"'s built folder, or "random"
    workload: RunWorkload
    layers: Optional[int] = None  # blocks per list of a random-weight model
    prompt: str
    negative_prompt: Optional[str] = None
    seed: int
    verify: bool = False
    load_dtype: Optional[str] = None  # None: the checkpoint's own (the tiny one stays float32)
    scratch: str


class XlaRunRequest(PipelineRequest):
    """`meshlab run --backend xla` (``meshlab.workers.run_xla``)."""

    joint_guidance: bool = False
    scan: bool = False
    cache_dir: str = ""  # "" : no persistent compile cache


class TorchRunRequest(PipelineRequest):
    """`meshlab run --backend dtensor|torch` (``meshlab.workers.run_dtensor``, ``meshlab.workers.run_torch``)."""

    world: int = Field(ge=1)


class BuildTinyRequest(Request):
    """Build the tiny offline Qwen-Image pipeline into a folder (``meshlab.workers.run_xla``)."""

    build_tiny: str


#: the requests a worker is started with, by class name (`meshlab schema worker-request` is their union)
WORKER_REQUESTS = ("CheckRequest", "DTensorCheckRequest", "TpuCheckRequest", "ProfileRequest", "XlaRunRequest",
                   "TorchRunRequest", "BuildTinyRequest")
