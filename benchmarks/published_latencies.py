"""Predict published, measured diffusion-transformer latencies with meshlab's cost model; print the ratios.

    python benchmarks/published_latencies.py [--json]

Each case names its source, what was measured, and how meshlab models it. Nothing here is tuned to these
figures: the hardware catalog's efficiency factors, published attention rates and measured GEMM rates are used as
they are; a case names the attention kernel only where its source shows which one ran (else the chip's default in
the catalog), and prices its elementwise work eager only where its source ran without torch.compile or XLA (an
eager column, diffusers, the official Wan2.1 code). Each measured figure is compared with the terms it covers:
the denoising loop alone (vllm-omni's `diffuse` stage) with meshlab's denoise-only figure, an end-to-end figure
with the end-to-end prediction (text encode, denoise, VAE decode, host transfers, overhead:
meshlab.cost.pipeline_time), with the text encoder where the source ran it.

Two more readings follow the cases. Kernel checks: a kernel time a source profiled inside a run, against meshlab's
time for that op in the same setup. Pairs: a source that timed one setup at two sizes, solved as a fixed cost per
transformer call plus a scale on the prediction (what the model misses, never a figure it uses). `--json` prints
{"cases": [...], "kernels": [...], "pairs": [...]}. A case outside 0.75..1.25 (`BAND`, issue 26's) says what its
source leaves unknown that would decide its figure (`UNKNOWNS`): a reason, never a correction.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass

from meshlab.models.card import load_card
from meshlab.cost.predict import predict
from meshlab.cost.timing import op_seconds
from meshlab.core.hardware import load_hardware
from meshlab.plan.planner import make_plan
from meshlab.strategy.schema import Strategy

REPLICATE = [{"match": "*", "shard": "replicate"}]
FSDP = [{"match": "*", "min_rank": 2, "shard": "largest", "axis": "data"}]
ONE_GPU = {"chips": 1, "topology": [1], "wraparound": [True]}


def gpus(n: int, **more) -> dict:
    """n GPUs of one node behind its switch."""
    return {"chips": n, "topology": [n], "wraparound": [True], **more}


def ulysses(batch_axis: str | None = None, runtime: str = "partitioner") -> dict:
    """Ulysses over `seq` (tokens split between attentions, heads inside them), as strategies/ulysses.yaml has it;
    `batch_axis` ("cfg") splits the guidance branches too; `runtime`: what runs it (a GPU tool joins the streams
    on the chip, where the partitioner re-splits them)."""
    return {"sequence": "seq", "sequence_parallel": runtime, "rules": [
        {"point": "block.input", "spec": [batch_axis, "seq", None]},
        {"point": "attention.qkv", "spec": [batch_axis, None, "seq"]},
        {"point": "attention.output", "spec": [batch_axis, "seq", None]}]}


def ulysses_self(runtime: str) -> dict:
    """Ulysses over `seq` for self-attention alone (strategies/wan-14b-v6e-8.yaml's rules): a video model's
    cross-attention keeps its query tokens split and reads every text token (Wan's and HunyuanVideo's USP replace the
    self-attention only)."""
    return {"sequence": "seq", "sequence_parallel": runtime, "rules": [
        {"point": "block.input", "stream": "image", "spec": [None, "seq", None]},
        {"point": "attention.qkv", "attention": "self", "spec": [None, None, "seq"]},
        {"point": "attention.output", "attention": "self", "spec": [None, "seq", None]}]}


#: FSDP of the blocks over the Ulysses axis (Wan's --dit_fsdp): every >=2-D block weight sharded at rest, gathered
#: before its block runs; embeddings and the head whole
FSDP_BLOCKS_OVER_SEQ = [{"match": "blocks.*", "min_rank": 2, "shard": "largest", "axis": "seq"},
                        {"match": "*", "shard": "replicate"}]


def ring(runtime: str) -> dict:
    """A ring over `seq` (no Ulysses rule: the tokens stay split at the kernel), run by `runtime` (xdit, diffusers)."""
    return {"sequence": "seq", "sequence_parallel": runtime}


def usp(runtime: str, batch_axis: str | None = None) -> dict:
    """USP: a ring over `ring` and Ulysses over `seq` (strategies/flux-usp-h100.yaml's layout), run by `runtime`."""
    return {"sequence": ["ring", "seq"], "sequence_parallel": runtime, "rules": [
        {"point": "block.input", "spec": [batch_axis, ["ring", "seq"], None]},
        {"point": "attention.qkv", "spec": [batch_axis, "ring", "seq"]},
        {"point": "attention.output", "spec": [batch_axis, ["ring", "seq"], None]}]}


#: xDiT times one pipeline call of examples/flux_example.py: FLUX.1-dev at 1024x1024, 28 steps, the prompt padded to
#: 256 tokens, no CFG (guidance embedded), T5 and CLIP on the GPU, decode included; its attention processor calls
#: flash_attn_func (FlashAttention-2) and yunchang's Ulysses attention (FA2) across GPUs
XDIT = "xdit-project/xDiT docs/performance/flux.md (commit 8275240c, 4xH100 table; script examples/flux_example.py)"
XDIT_FLUX = {"batch": 1, "steps": 28, "cfg": False, "text_tokens": 256}
#: vllm-omni's performance dashboard: Qwen-Image served on 4 x A100-SXM4-80GB with CFG parallel 2 x Ulysses 2, one
#: request at a time, timed at the client (end to end, plus HTTP and image encoding); torch.compile by default
VLLM_OMNI_A100 = ("vllm-project/vllm-omni benchmarks/diffusion/performance_dashboard/qwen_image_serving_performance.md "
                  "(commit d87348c0, A100-SXM4-80GB, CFG 2 x Usp 2, mean)")
#: Wan-Video/Wan2.1 (9737cba) has no torch.compile: its official runs are eager
WAN_OFFICIAL = "eager: the official Wan2.1 code runs without torch.compile"
#: vllm-omni's diffusion attention on Hopper is FlashAttention-3: its CUDA backend selector picks FLASH_ATTN on
#: compute capability 8.0-9.x and imports the fa3-fwd package first (vllm_omni/diffusion/attention, wheels 0.18.0
#: and 0.20.0rc1); issue #3266's H200 profile lists fa3_fwd::fwd, 360 calls for 3 steps x 2 branches x 60 blocks.
VLLM_OMNI_HOPPER = {**ONE_GPU, "attention_kernel": "fa3"}
#: vllm-omni's benchmarks (the CI perf tests of PR #2707 and issue #3266, and the A100 dashboard) use its `random`
#: dataset: the prompt is "Random prompt {idx} for benchmarking diffusion models" and the negative prompt "Negative
#: prompt {idx} ..." (benchmarks/diffusion/diffusion_benchmark_serving.py, RandomDataset, unchanged from #1657 on
#: 2026-03-20 through #2707). Its Qwen-Image pipeline pads only to the longest prompt of the batch and drops the
#: template's 34-token system prefix, so the text stream carries the prompt's 8-10 tokens (Qwen2's pre-tokenizer
#: splits a digit and the space before it into their own tokens) and the 5 of "<|im_end|>\n<|im_start|>assistant\n".
VLLM_OMNI_TEXT_TOKENS = 14


@dataclass(frozen=True)
class Case:
    name: str
    source: str
    measured_s: float  # what the source reports for the whole run (all images of the batch)
    scope: str  # what the measured figure covers
    model: str
    hardware: str
    overrides: dict
    mesh: dict
    rules: list
    workload: dict
    end_to_end: bool = True  # False: the source timed the denoising loop alone
    text_encoder: str = "device"  # where the source ran the text encoder ("cpu": the host)
    activations: dict | None = None  # None: the batch over `data`
    elementwise: str = "fused"  # how the source ran the elementwise ops: torch.compile or XLA, or eager PyTorch
    pair: str | None = None  # the same source and setup at another size: read the two together (read_pairs)
    rewrites: tuple = ()
    vae_decode: str = "full"  # how the source decodes ("tiled": the VAE's tiled decode)


CASES = [
    Case("Flux.1-dev, v6e-4, data parallel, batch 4, 28 steps, 1024x1024",
         "maxdiffusion docs, Flux inference benchmarks (mintlify.com/AI-Hypercomputer/maxdiffusion/inference/flux)",
         5.5, "generation time of the batch (end to end)", "flux-dev", "v6e-4", {}, {"data": 4}, REPLICATE,
         {"batch": 4, "steps": 28, "cfg": False, "text_tokens": 512}),
    Case("Flux.1-dev, v4-8, data parallel, batch 4, 28 steps, 1024x1024",
         "maxdiffusion docs, Flux inference benchmarks", 23.0, "generation time of the batch (end to end)",
         "flux-dev", "v4-8", {}, {"data": 4}, REPLICATE, {"batch": 4, "steps": 28, "cfg": False, "text_tokens": 512}),
    # The same table's v4-8 pair disagrees with itself: dev's 23 s / 28 steps is 0.82 s a step, schnell's 2.2 s / 4
    # steps at most 0.55 s a step (less its fixed text-encode and decode), for the same transformer at 4608 vs 4352
    # tokens; on v6e-4 the pair agrees (0.196 and 0.2 s a step)
    Case("Flux.1-schnell (as dev's card), v4-8, data parallel, batch 4, 4 steps",
         "maxdiffusion docs, Flux inference benchmarks", 2.2, "generation time of the batch (end to end)",
         "flux-dev", "v4-8", {}, {"data": 4}, REPLICATE, {"batch": 4, "steps": 4, "cfg": False, "text_tokens": 256}),
    Case("Flux.1-schnell (as dev's card), v6e-4, data parallel, batch 4, 4 steps",
         "maxdiffusion docs, Flux inference benchmarks", 0.8, "generation time of the batch (end to end)",
         "flux-dev", "v6e-4", {}, {"data": 4}, REPLICATE, {"batch": 4, "steps": 4, "cfg": False, "text_tokens": 256}),
    Case("Flux.1-schnell (as dev's card), v6e-4, FSDP, batch 4, 4 steps",
         "maxdiffusion docs, Flux inference benchmarks", 1.2, "generation time of the batch (end to end)",
         "flux-dev", "v6e-4", {}, {"data": 4}, FSDP, {"batch": 4, "steps": 4, "cfg": False, "text_tokens": 256}),
    Case("Qwen-Image, 1 x H100, 1536x1536, 35 steps, true CFG",
         "vllm-project/vllm-omni PR #2707 (test_qwen_image_single_device, diffuse p50)", 23.19,
         "denoising loop only (QwenImagePipeline.diffuse)", "qwen-image", "h100", VLLM_OMNI_HOPPER, {"data": 1},
         REPLICATE,
         {"batch": 1, "steps": 35, "cfg": True, "text_tokens": VLLM_OMNI_TEXT_TOKENS, "height": 1536, "width": 1536},
         end_to_end=False, pair="vllm-omni, 1 x H100, 512 and 1536"),
    Case("Qwen-Image, 1 x H100, 512x512, 20 steps, true CFG",
         "vllm-project/vllm-omni PR #2707 (test_qwen_image_single_device, diffuse p50)", 2.32,
         "denoising loop only (QwenImagePipeline.diffuse)", "qwen-image", "h100", VLLM_OMNI_HOPPER, {"data": 1},
         REPLICATE,
         {"batch": 1, "steps": 20, "cfg": True, "text_tokens": VLLM_OMNI_TEXT_TOKENS, "height": 512, "width": 512},
         end_to_end=False, pair="vllm-omni, 1 x H100, 512 and 1536"),
    Case("Qwen-Image, 1 x H200, 512x512, 20 steps, true CFG",
         "vllm-project/vllm-omni issue #3266 (single device on H200, version 0.19.1, diffuse mean)", 2.17,
         "denoising loop only (QwenImagePipeline.diffuse)", "qwen-image", "h200", VLLM_OMNI_HOPPER, {"data": 1},
         REPLICATE,
         {"batch": 1, "steps": 20, "cfg": True, "text_tokens": VLLM_OMNI_TEXT_TOKENS, "height": 512, "width": 512},
         end_to_end=False),
    Case("Wan 2.1 14B (I2V measured, T2V card), 1 x H200, 832x480 x 81 frames, 40 steps, CFG",
         "ModelTC/LightX2V docs, Benchmark, H200 480P 5s video: 'Wan2.1 Official (baseline)' inference time", 366.04,
         "inference of one video (end to end; I2V adds a CLIP image embedding to each cross-attention's keys, which "
         "the T2V card leaves out; " + WAN_OFFICIAL + ")", "wan-2.1-t2v-14b", "h200", ONE_GPU,  # kernel unknown:
         # Wan's attention.py runs FlashAttention-3 when flash_attn_interface is installed, else FlashAttention-2
         {"data": 1}, REPLICATE,
         {"batch": 1, "steps": 40, "cfg": True, "text_tokens": 512, "height": 480, "width": 832, "frames": 81},
         elementwise="eager", pair="LightX2V, Wan official, 1 x H200, 480P and 720P"),
    Case("Wan 2.1 14B (I2V measured, T2V card), 1 x H200, 1280x720 x 81 frames, 40 steps, CFG",
         "ModelTC/LightX2V docs, Benchmark, H200 720P 5s video: 'Wan2.1 Official (baseline)' inference time", 974.0,
         "inference of one video (end to end; as the 480P case)", "wan-2.1-t2v-14b", "h200", ONE_GPU,
         {"data": 1}, REPLICATE,
         {"batch": 1, "steps": 40, "cfg": True, "text_tokens": 512, "height": 720, "width": 1280, "frames": 81},
         elementwise="eager", pair="LightX2V, Wan official, 1 x H200, 480P and 720P"),
    Case("Wan 2.1 14B (I2V measured, T2V card), 1 x H100, 832x480 x 81 frames, 40 steps, CFG, diffusers",
         "ModelTC/LightX2V README, Performance Benchmarks (2025.12.01), Cross-Framework Performance Comparison (H100): "
         "'Diffusers | 1 | 9.77s/it', Wan2.1-I2V-14B-480P, 40 steps, 81 frames", 9.77 * 40,
         "40 denoising steps at 9.77 s each (per step, both CFG branches; the 480P size and the H100 SXM part are "
         "assumed: the README names neither; diffusers runs eager, SDPA)", "wan-2.1-t2v-14b", "h100", ONE_GPU,
         {"data": 1}, REPLICATE,
         {"batch": 1, "steps": 40, "cfg": True, "text_tokens": 512, "height": 480, "width": 832, "frames": 81},
         end_to_end=False, elementwise="eager"),
    # xDiT's FLUX.1-dev table: each configuration eager ("PyTorch") and under torch.compile
    *[Case(f"Flux.1-dev, {n} x H100, {layout}, 28 steps, 1024x1024, {'torch.compile' if compiled else 'eager'}",
           XDIT, measured, "one pipeline call (end to end)", "flux-dev", "h100", gpus(n, attention_kernel="fa2"),
           {"seq": n}, REPLICATE, XDIT_FLUX, activations=ulysses(runtime="xdit") if n > 1 else {"batch": None},
           elementwise="fused" if compiled else "eager", rewrites=("layernorm-rows",) if n > 1 else ())
      for n, layout, eager_s, compiled_s in ((1, "one GPU", 6.71, 4.30), (2, "Ulysses-2", 4.38, 2.68),
                                            (4, "Ulysses-4", 4.24, 1.63))
      for compiled, measured in ((False, eager_s), (True, compiled_s))],
    # the same xDiT table's ring and USP rows: xfuser runs its ring as ring-flash-attention does (FlashAttention-2 one
    # block at a time, each next block sent by async p2p during the pass): sequence_parallel xdit
    *[Case(f"Flux.1-dev, {n} x H100, {layout}, 28 steps, 1024x1024, {'torch.compile' if compiled else 'eager'}",
           XDIT, measured, "one pipeline call (end to end)", "flux-dev", "h100", gpus(n, attention_kernel="fa2"),
           mesh, REPLICATE, XDIT_FLUX, activations=activations, elementwise="fused" if compiled else "eager",
           rewrites=("layernorm-rows",))
      for n, layout, mesh, activations, eager_s, compiled_s in (
          (2, "ring-2", {"seq": 2}, ring("xdit"), 5.31, 2.60),
          (4, "ring-4", {"seq": 4}, ring("xdit"), 5.11, 1.98),
          (4, "Ulysses-2 x ring-2", {"ring": 2, "seq": 2}, usp("xdit"), 5.19, 1.80))
      for compiled, measured in ((False, eager_s), (True, compiled_s))],
    # ParaAttention's FLUX.1-dev table on A100s: its ring is PyTorch's templated ring attention (context parallel),
    # which rotates k and v by all-gather by default, as diffusers' ring does: priced as diffusers runs it (the rotate
    # method the run used is not stated; ParaAttention is neither tool, and joins the streams on the chip as both do);
    # the 4-GPU "ulysses + ring" row is Ulysses 2 x ring 2 (the README's example mesh at cf7ec43). Ulysses-2 is
    # from 669af0e (removed later, no reason given)
    *[Case(f"Flux.1-dev, {n} x A100, {layout}, 28 steps, 1024x1024, {'torch.compile' if compiled else 'eager'}",
           "chengzeyi/ParaAttention README, Performance, Context Parallelism (without First Block Cache), "
           f"A100-SXM4-80GB, FLUX.1-dev ({commit})", measured, "one pipeline call (end to end: 'the wall time "
           "includes the overhead of calling the text encoder and vae decoder')", "flux-dev", "a100-80gb", gpus(n),
           mesh, REPLICATE, {"batch": 1, "steps": 28, "cfg": False, "text_tokens": 512}, activations=activations,
           elementwise="fused" if compiled else "eager", rewrites=("layernorm-rows",))
      for n, layout, mesh, activations, commit, eager_s, compiled_s in (
          (2, "ring-2", {"seq": 2}, ring("diffusers"), "669af0e", 8.307, 5.775),
          (2, "Ulysses-2", {"seq": 2}, ulysses(runtime="diffusers"), "669af0e", 8.379, 5.915),
          (4, "Ulysses-2 x ring-2", {"ring": 2, "seq": 2}, usp("diffusers"), "cf7ec43", 6.157, 3.557))
      for compiled, measured in ((False, eager_s), (True, compiled_s))],
    # diffusers' unified attention table (4 x H100, FLUX.1-dev, 50 steps; 'Time / Iter' is one 50-step call, as
    # 50 / it equals its Steps/Sec column): its ring all-gathers k and v, then passes (rotate_method 'allgather',
    # convert_to_fp32): sequence_parallel diffusers; the size is not in the doc (the script's default, 1024x1024,
    # assumed), eager assumed
    *[Case(f"Flux.1-dev, 4 x H100, {layout}, 50 steps, 1024x1024 (assumed), diffusers",
           "huggingface/diffusers docs/source/en/training/distributed_inference.md (commit 03cb7250), Unified "
           "Attention table", measured, "one 50-step pipeline call ('Time / Iter'; whether the text encode and the "
           "decode are inside is not stated)", "flux-dev", "h100", gpus(4), mesh, REPLICATE,
           {"batch": 1, "steps": 50, "cfg": False, "text_tokens": 512}, activations=activations,
           elementwise="eager", rewrites=("layernorm-rows",))
      for layout, mesh, activations, measured in (
          ("Ulysses-4", {"seq": 4}, ulysses(runtime="diffusers"), 6.671),
          ("ring-4", {"seq": 4}, ring("diffusers"), 13.076),
          ("Ulysses-2 x ring-2", {"ring": 2, "seq": 2}, usp("diffusers"), 11.069))],
    *[Case(f"Qwen-Image, 4 x A100, CFG 2 x Ulysses 2, {size}x{size}, {steps} steps, true CFG", VLLM_OMNI_A100,
           measured, "one request at the client (end to end, plus HTTP and image encoding)", "qwen-image",
           "a100-80gb", gpus(4), {"cfg": 2, "seq": 2}, REPLICATE,
           {"batch": 1, "steps": steps, "cfg": True, "text_tokens": VLLM_OMNI_TEXT_TOKENS, "height": size,
            "width": size},
           activations=ulysses("cfg"), rewrites=("layernorm-rows",), pair="vllm-omni, 4 x A100, 512 and 1536")
      for size, steps, measured in ((512, 20, 2.2087), (1536, 35, 19.6739))],
    # Wan2.1's own multi-GPU table (README 9737cba, "Computational Efficiency on Different GPUs", an image,
    # assets/comp_effic.png: "Total time (s) / peak GPU memory (GB)"), run as its README's multi-GPU command:
    # `torchrun --nproc_per_node=N generate.py ... --dit_fsdp --t5_fsdp --ulysses_size N` (the 14B models; the
    # 1-GPU rows used --offload_model True and are left out): the DiT sharded over the N GPUs (FSDP) and its
    # self-attention run as xDiT's USP (Ulysses N, yunchang), T5 sharded too, both CFG branches one after the other,
    # eager, the decode whole on one rank. The GPU is named "H800/H100" and "A800/A100" (H800 and A800 have slower
    # NVLink than the H100 and A100 the catalog prices); what "total time" covers (loading?) is not stated
    *[Case(f"Wan 2.1 {model}, {n} x {gpu}, FSDP + Ulysses-{n}, {steps} steps, 1280x720 x 81 frames, CFG, eager",
           "Wan-Video/Wan2.1 README (9737cba), Computational Efficiency on Different GPUs (assets/comp_effic.png), "
           f"{'H800/H100' if gpu == 'H100' else 'A800/A100'} row, {model}, 720P", measured,
           "total time of one video (what it covers is not stated)", card, gpu.lower().replace("a100", "a100-80gb"),
           gpus(n), {"seq": n}, FSDP_BLOCKS_OVER_SEQ,
           {"batch": 1, "steps": steps, "cfg": True, "text_tokens": 512, "height": 720, "width": 1280, "frames": 81},
           text_encoder="sharded", activations=ulysses_self("xdit"), elementwise="eager",
           rewrites=("layernorm-rows",))
      for gpu, model, card, steps, times in (
          ("H100", "T2V-14B", "wan-2.1-t2v-14b", 50, (945.1, 497.0, 287.9)),
          ("H100", "I2V-14B", "wan-2.1-i2v-14b", 40, (753.9, 403.9, 238.8)),
          ("A100", "T2V-14B", "wan-2.1-t2v-14b", 50, (1722.0, 886.1, 469.9)),
          ("A100", "I2V-14B", "wan-2.1-i2v-14b", 40, (1371.7, 716.1, 389.7)))
      for n, measured in zip((2, 4, 8), times)],
    # HunyuanVideo's xDiT table (xdit-project/xDiT docs/performance/hunyuanvideo.md, 172905f, unchanged at 175e0bfe:
    # "The H100 and H20 performance benchmarks are done with the official HunyuanVideo repository"): 1280x720, 129
    # frames, 50 steps, Ulysses N, no CFG (embedded guidance, --cfg-scale 1.0), FlashAttention-2 (flash-attn 2.6.3
    # through xfuser 0.4.0), eager (the repository has no torch.compile), its LLaVA-Llama and CLIP-L encoders on every
    # GPU, the VAE decode tiled; hyvideo/inference.py times the pipeline call (not the loading). Tencent's README
    # gives the same row with 934.09 s at 2 GPUs (xDiT's 960x960 figure); xDiT's 925.04 is used. H100 SXM or PCIe is
    # not stated
    *[Case(f"HunyuanVideo, {n} x H100, Ulysses-{n}, 50 steps, 1280x720 x 129 frames, eager",
           "xdit-project/xDiT docs/performance/hunyuanvideo.md (172905f), 1280x720 129 frames 50 steps, Ulysses "
           "Latency (seconds), H100", measured, "one pipeline call (end to end, official HunyuanVideo code)",
           "hunyuan-video", "h100", gpus(n, attention_kernel="fa2"), {"seq": n}, REPLICATE,
           {"batch": 1, "steps": 50, "cfg": False, "text_tokens": 256, "height": 720, "width": 1280, "frames": 129},
           activations=ulysses(runtime="xdit") if n > 1 else {"batch": None}, elementwise="eager",
           rewrites=("layernorm-rows",) if n > 1 else (), vae_decode="tiled")
      for n, measured in ((1, 1904.08), (2, 925.04), (4, 514.08), (8, 337.58))],
    *[Case(f"Flux.1-dev, 1 x A100, 28 steps, 1024x1024, {'torch.compile' if compiled else 'eager'}",
           "chengzeyi/ParaAttention README, Performance, Context Parallelism (without First Block Cache), "
           "A100-SXM4-80GB, FLUX.1-dev", measured, "one pipeline call (end to end: 'the wall time includes the "
           "overhead of calling the text encoder and vae decoder')", "flux-dev", "a100-80gb", ONE_GPU, {"data": 1},
           REPLICATE, {"batch": 1, "steps": 28, "cfg": False, "text_tokens": 512},
           elementwise="fused" if compiled else "eager")
      for compiled, measured in ((False, 13.843), (True, 9.997))],
]


#: issue 26's band: a case outside it says what its source leaves unknown (`UNKNOWNS`)
BAND = (0.75, 1.25)
_MAXDIFFUSION = ("the flash attention block sizes of the run (the v6e-tuned ones are commented out in maxdiffusion's "
                 "configs, 256 ship), any measured TPU matmul or attention rate (meshlab assumes 0.8 of peak), and "
                 "what the one time per row covers (the T5-XXL and CLIP encodes, the decode, the host's work per "
                 "step); dev and schnell miss by the same x1.4 with no fixed cost per call: a rate")
_VLLM_OMNI = ("the host time per transformer call of vllm-omni's run (torch.compile without CUDA graphs): read with "
              "the 1536² case of the same setup the pair holds the predicted rates (scale 1.01) and leaves a fixed "
              "22 ms per call, which the source does not break down")
_XDIT_EAGER = ("the host that dispatched the eager ops (the rows imply 30-40 us per traced op, where meshlab's "
               "20.4 us was measured on the device tool's H200 host), whether yunchang's collectives block the host, "
               "and whether its ring merges ran through TorchScript's fuser (`_update_out_and_lse` is "
               "@torch.jit.script); one timed call each, host and H100 part not stated")
_DIFFUSERS_TABLE = ("the resolution, attention backend, compile and host (1024x1024, eager and the catalog's H100 "
                    "are assumed; the script is in a PR comment, not the doc), whether 'Time / Iter' is one call (a "
                    "later table of the same doc uses it per step), and for ring and USP which variant ran")
#: case -> what its source leaves unknown that decides its figure (read from each source; issue 26's notes, stops
#: 34 and 39). A reason, never a correction: nothing here changes a prediction.
UNKNOWNS = {
    "Flux.1-dev, v6e-4, data parallel, batch 4, 28 steps, 1024x1024": _MAXDIFFUSION,
    "Flux.1-dev, v4-8, data parallel, batch 4, 28 steps, 1024x1024":
        "the step count: the table says 28, but the README's command passes none and base_flux_dev.yml defaults to "
        "50 (at 50 the ratio would be about 0.85); the same table's schnell row on v4-8 implies at most 0.55 s a "
        "step against this row's 0.82 s for the same transformer",
    "Flux.1-schnell (as dev's card), v4-8, data parallel, batch 4, 4 steps": _MAXDIFFUSION,
    "Flux.1-schnell (as dev's card), v6e-4, data parallel, batch 4, 4 steps": _MAXDIFFUSION,
    "Flux.1-schnell (as dev's card), v6e-4, FSDP, batch 4, 4 steps":
        "as the data-parallel rows (" + _MAXDIFFUSION + "), and how maxdiffusion's program runs the FSDP weight "
        "gathers: meshlab runs them as XLA:TPU's collective matmuls beside 1/n of each matmul, as measured on v6e-8 "
        "(fsdp.yaml; pricing that moved this case from 0.80 to 0.62), and the table gives neither its sharding "
        "rules nor its XLA flags",
    "Qwen-Image, 1 x H100, 512x512, 20 steps, true CFG": _VLLM_OMNI,
    "Qwen-Image, 1 x H200, 512x512, 20 steps, true CFG":
        _VLLM_OMNI.replace("read with the 1536² case of the same setup", "on the H100 (the same code), read with "
                           "its 1536² case,") + "; this H200 row's gap is 22.9 ms per call",
    "Wan 2.1 14B (I2V measured, T2V card), 1 x H200, 1280x720 x 81 frames, 40 steps, CFG":
        "what the 'Wan2.1 Official' baseline ran at 720P: its attention kernel (Wan runs FlashAttention-3 where "
        "flash_attn_interface is installed; LightX2V's environment lists none), offload, and the I2V model's 720P "
        "checkpoint; its pair with the 480P row solves to no fixed cost per call (scale 0.62), so the two rows do "
        "not behave as one setup",
    "Flux.1-dev, 2 x H100, Ulysses-2, 28 steps, 1024x1024, eager": _XDIT_EAGER,
    "Flux.1-dev, 4 x H100, Ulysses-4, 28 steps, 1024x1024, eager": _XDIT_EAGER,
    "Flux.1-dev, 2 x H100, ring-2, 28 steps, 1024x1024, eager": _XDIT_EAGER,
    "Flux.1-dev, 4 x H100, ring-4, 28 steps, 1024x1024, eager": _XDIT_EAGER,
    "Flux.1-dev, 4 x H100, Ulysses-2 x ring-2, 28 steps, 1024x1024, eager": _XDIT_EAGER,
    "Flux.1-dev, 4 x A100, Ulysses-2 x ring-2, 28 steps, 1024x1024, eager":
        "the host that dispatched the eager ops (43.5 us per traced op implied) and the mesh (the README's example "
        "mesh, not stated for the row, at a later revision than the in-band 2-GPU rows); the ring's rotate method",
    "Flux.1-dev, 4 x H100, Ulysses-4, 50 steps, 1024x1024 (assumed), diffusers": _DIFFUSERS_TABLE,
    "Flux.1-dev, 4 x H100, ring-4, 50 steps, 1024x1024 (assumed), diffusers": _DIFFUSERS_TABLE,
    "Flux.1-dev, 4 x H100, Ulysses-2 x ring-2, 50 steps, 1024x1024 (assumed), diffusers": _DIFFUSERS_TABLE,
    "Qwen-Image, 4 x A100, CFG 2 x Ulysses 2, 512x512, 20 steps, true CFG":
        "the host time per transformer call and the serving costs: timed at the client (HTTP, image encoding), "
        "and read with the 1536² case of the same setup the pair holds the predicted rates (scale 1.03) and leaves "
        "a fixed 49 ms per call, which the source does not break down",
    "HunyuanVideo, 8 x H100, Ulysses-8, 50 steps, 1280x720 x 129 frames, eager":
        "what the time covers beyond the denoising loop: the text encode (an 8B LLaVA-Llama and CLIP on every GPU) "
        "and the tiled decode of 129 frames are fixed per video whatever the GPU count, and the source splits out "
        "neither (meshlab predicts 9.5 s of decode); 121 s of the gap at 8 GPUs would be such a term, which the "
        "shorter loop exposes (1, 2 and 4 GPUs are in the band); nor is the H100 part (SXM or PCIe) stated",
}


def in_band(ratio: float) -> bool:
    return BAND[0] <= ratio <= BAND[1]


def strategy_document(case: Case) -> dict:
    """The case as a strategy file's document (without the hardware overrides the catalog entry takes)."""
    return {"name": case.name, "model": case.model, "hardware": case.hardware, "mesh": case.mesh, "rules": case.rules,
            "activations": case.activations or {"batch": "data"}, "workload": case.workload,
            "placement": {"text_encoder": case.text_encoder, "vae_decode": case.vae_decode},
            "rewrites": list(case.rewrites), "compile": {"elementwise": case.elementwise}}


def prediction(case: Case):
    """meshlab's prediction for the case, and the hardware entry it priced on."""
    card = load_card(case.model)
    hardware = load_hardware(case.hardware, case.overrides)
    strategy = Strategy.model_validate(strategy_document(case))
    return predict(make_plan(strategy, card, hardware.chips), strategy, hardware), hardware


def predict_case(case: Case) -> dict:
    p, hardware = prediction(case)
    per_image = p.seconds_per_image if case.end_to_end else p.denoise_seconds_per_image
    predicted = per_image * p.layout.images
    terms = {k: round(v * p.layout.images, 3) for k, v in p.terms.to_json().items() if k != "unknown"}
    return {"case": case.name, "source": case.source, "scope": case.scope, "measured_s": case.measured_s,
            "compared_with": "end to end" if case.end_to_end else "denoising loop only",
            "predicted_s": round(predicted, 3), "predicted_terms_s": terms,
            "roofline_s": round(p.step.roofline * p.layout.steps, 3),
            "ratio_predicted_over_measured": round(predicted / case.measured_s, 3),
            "predicted_mfu": round(p.mfu, 3), "implied_measured_mfu": round(p.mfu * predicted / case.measured_s, 3),
            "transformer_calls": p.layout.steps * p.layout.calls, "pair": case.pair,
            "in_band": in_band(predicted / case.measured_s), "source_leaves_unknown": UNKNOWNS.get(case.name, ""),
            "assumed": "text tokens " + str(case.workload["text_tokens"]),
            "attention": _attention_note(case, hardware), "elementwise": case.elementwise,
            "linears": "at OpenXLA's measured sm_90 GEMM rates for their shapes" if hardware.matmul_rates is not None
            else f"at compute_efficiency {hardware.compute_efficiency} (no measured GEMM rates for this chip)"}


@dataclass(frozen=True)
class KernelCheck:
    """A kernel time a source measured inside a run (a profiler's total over its calls), against the time meshlab
    gives that op in the same setup."""

    name: str
    source: str
    case: Case  # the setup the kernel ran in
    kind: str  # the Work kind priced ("attention", "linear")
    measured_s: tuple[float, ...]  # seconds per call, one per measurement the source gives


#: vllm-omni issue #3266 (fhfuih, 2026-04-30, "deepened torch profiler"): Qwen-Image at 1536x1536 on one H200,
#: prompt "Random prompt 1 for benchmarking diffusion models" with its negative, 3 steps with true CFG, torch
#: profiler: `fa3_fwd::fwd` Self CUDA ~575.5 ms over 360 calls (3 steps x 2 branches x 60 blocks) on 0.19.1 +
#: cu129 and ~558.9 ms on 0.20.0 + cu130
KERNEL_CHECKS = [
    KernelCheck("FlashAttention-3 forward, Qwen-Image joint attention at 1536x1536 (9216 image + 14 text tokens, "
                "24 heads of 128), 1 x H200",
                "vllm-project/vllm-omni issue #3266 (torch profiler, fa3_fwd::fwd Self CUDA / 360 calls; 0.19.1 and "
                "0.20.0)",
                Case("Qwen-Image, 1 x H200, 1536x1536, 3 steps, true CFG", "vllm-omni issue #3266", 0.0, "",
                     "qwen-image", "h200", VLLM_OMNI_HOPPER, {"data": 1}, REPLICATE,
                     {"batch": 1, "steps": 3, "cfg": True, "text_tokens": VLLM_OMNI_TEXT_TOKENS, "height": 1536,
                      "width": 1536}, end_to_end=False),
                "attention", (575.5e-3 / 360, 558.9e-3 / 360)),
]


def check_kernel(check: KernelCheck) -> dict:
    p, hardware = prediction(check.case)
    ops = [w for w in p.work if w.kind == check.kind]
    predicted = op_seconds(ops[0], hardware)
    return {"check": check.name, "source": check.source, "shape": list(ops[0].shape),
            "measured_s_per_call": [round(m, 6) for m in check.measured_s], "predicted_s_per_call": round(predicted, 6),
            "ratio_predicted_over_measured": [round(predicted / m, 3) for m in check.measured_s]}


def read_pairs(rows: list[dict]) -> list[dict]:
    """Each pair of cases from one source and setup at two sizes, read as measured = calls x fixed + scale x
    predicted (two equations, two unknowns): `scale` near 1 says the predicted rates hold across the sizes, and
    `fixed` is then what each transformer call costs beyond them (host dispatch, launches, syncs: anything that
    does not grow with tokens). A diagnosis of what the model misses, never a figure it uses."""
    grouped: dict[str, list[dict]] = {}
    for row in rows:
        if row["pair"]:
            grouped.setdefault(row["pair"], []).append(row)
    out = []
    for name, (small, large) in grouped.items():
        c1, c2 = small["transformer_calls"], large["transformer_calls"]
        m1, m2, p1, p2 = small["measured_s"], large["measured_s"], small["predicted_s"], large["predicted_s"]
        det = c1 * p2 - c2 * p1
        fixed, scale = (m1 * p2 - m2 * p1) / det, (c1 * m2 - c2 * m1) / det
        holds = 0.9 <= scale <= 1.1 and fixed > 0
        out.append({"pair": name, "cases": [small["case"], large["case"]], "scale": round(scale, 3),
                    "fixed_per_call_s": round(fixed, 4),
                    "reading": "the predicted rates hold across the two sizes; the miss is a fixed cost per "
                    "transformer call" if holds else "no fixed cost per call explains the pair: the two sizes "
                    "scale differently from the predicted terms"})
    return out


def _attention_note(case: Case, hardware) -> str:
    if not hardware.attention_kernel:
        return "at compute_efficiency (no published rates for this chip)"
    named = "the source's" if "attention_kernel" in case.overrides else "the catalog default"
    return f"{hardware.attention_kernel} ({named})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true")
    rows = [predict_case(c) for c in CASES]
    pairs = read_pairs(rows)
    kernels = [check_kernel(k) for k in KERNEL_CHECKS]
    if parser.parse_args().json:
        print(json.dumps({"cases": rows, "kernels": kernels, "pairs": pairs}, indent=2))
        return
    for r in rows:
        terms = ", ".join(f"{k.removesuffix('_s')} {v:.2f}" for k, v in r["predicted_terms_s"].items())
        print(f"{r['case']}\n  measured {r['measured_s']:.2f} s ({r['scope']}); predicted {r['predicted_s']:.2f} s "
              f"({r['compared_with']}; terms: {terms}), "
              f"roofline {r['roofline_s']:.2f} s; predicted/measured {r['ratio_predicted_over_measured']:.2f}; "
              f"MFU predicted {100 * r['predicted_mfu']:.0f}%, implied by the measurement "
              f"{100 * r['implied_measured_mfu']:.0f}%; attention {r['attention']}; Linears {r['linears']}; "
              f"elementwise {r['elementwise']}\n"
              f"  source: {r['source']}")
        if not r["in_band"]:
            print(f"  outside {BAND[0]}..{BAND[1]}; the source leaves unknown: {r['source_leaves_unknown']}"
                  if r["source_leaves_unknown"] else f"  outside {BAND[0]}..{BAND[1]}, and no line says what the "
                  "source leaves unknown (add one to UNKNOWNS)")
    outside = [r for r in rows if not r["in_band"]]
    print(f"\n{len(rows) - len(outside)} of {len(rows)} cases within {BAND[0]}..{BAND[1]}; each of the other "
          f"{len(outside)} says what its source leaves unknown" if all(r["source_leaves_unknown"] for r in outside)
          else f"\n{len(rows) - len(outside)} of {len(rows)} cases within {BAND[0]}..{BAND[1]}; "
          f"{sum(not r['source_leaves_unknown'] for r in outside)} outside it say nothing of their source")

    print("\nKernels measured inside a run, against meshlab's time for the op:")
    for k in kernels:
        measured = " and ".join(f"{1000 * m:.3f}" for m in k["measured_s_per_call"])
        ratios = " and ".join(f"{r:.2f}" for r in k["ratio_predicted_over_measured"])
        print(f"  {k['check']}: measured {measured} ms per call, predicted {1000 * k['predicted_s_per_call']:.3f} "
              f"ms (shape {k['shape']}); predicted/measured {ratios}\n    source: {k['source']}")
    print("\nPairs (measured = calls x fixed + scale x predicted):")
    for pair in pairs:
        print(f"  {pair['pair']}: scale {pair['scale']:.2f}, fixed {1000 * pair['fixed_per_call_s']:.1f} ms per "
              f"transformer call: {pair['reading']}")


if __name__ == "__main__":
    main()
