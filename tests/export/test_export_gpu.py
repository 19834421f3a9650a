"""`meshlab export --format diffusers | xdit`: a plan as the GPU tools take it, or refused with the reason."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from meshlab.api import load_plan
from meshlab.core.errors import PlanError
from meshlab.export.gpu import DIFFUSERS_PLANS, XDIT_MODELS, degrees, diffusers_snippet, gpu_form, xdit_flags
from tests.conftest import REPO

CARDS = REPO / "meshlab" / "models" / "cards"

USP = REPO / "strategies" / "flux-usp-h100.yaml"


def usp_without_cfg(folder) -> Path:
    """flux-usp-h100.yaml as xDiT runs Flux: no CFG, the tokens over ring 2 x Ulysses 4 on the 8 GPUs."""
    doc = yaml.safe_load(USP.read_text())
    doc["mesh"] = {"ring": 2, "seq": 4}
    doc["workload"]["cfg"] = False
    for rule in doc["activations"]["rules"]:
        rule["spec"] = rule["spec"][1:]
    doc["activations"]["rules"] = [{**r, "spec": [None, *r["spec"]]} for r in doc["activations"]["rules"]]
    path = folder / "flux-usp-nocfg.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def form(render, planned, strategy=None) -> str:
    """The rendered form, or the refusal's line."""
    try:
        return render(planned.plan, strategy or planned.strategy)
    except PlanError as exc:
        return exc.one_line()


def test_the_flux_usp_plan_has_diffusers_form_and_xdit_refuses_its_cfg_axis():
    planned = load_plan(USP)
    d = degrees(planned.plan, planned.strategy)
    assert (d.cfg, d.data, d.ring, d.ulysses, d.tensor) == (2, 1, 2, 2, 1)
    snippet = diffusers_snippet(planned.plan, planned.strategy)
    compile(snippet, "snippet", "exec")  # it is Python
    assert "ContextParallelConfig(ring_degree=2, ulysses_degree=2, mesh=mesh['ring', 'ulysses'])" in snippet
    assert "mesh_dim_names=('cfg', 'ring', 'ulysses')" in snippet and "(2, 2, 2)" in snippet
    assert "priced as xdit runs it; diffusers joins the streams on the chip, and gathers a ring's k and v once" in snippet
    assert "split them over mesh['cfg']" in snippet
    assert "transformer.compile()" not in snippet  # priced eager
    with pytest.raises(PlanError, match="xDiT runs FLUX.1-dev without CFG parallelism"):
        xdit_flags(planned.plan, planned.strategy)
    with pytest.raises(PlanError, match=r"on the sequence or the batch, or export --format diffusers$"):
        gpu_form("xdit", planned.plan, planned.strategy)  # the refusal names the tool that takes the plan


def test_flux_usp_without_cfg_is_xdit_s_runner_line(tmp_path):
    planned = load_plan(usp_without_cfg(tmp_path))
    flags = xdit_flags(planned.plan, planned.strategy)
    assert "xdit --nproc_per_node 8 --model FLUX.1-dev --data_parallel_degree 1 --ulysses_degree 4 --ring_degree 2" \
        in flags
    assert "--use_cfg_parallel" not in flags and "--tensor_parallel_degree" not in flags
    assert "priced as" not in flags  # the plan's ring is xDiT's
    compiled = planned.strategy.model_copy(update={"compile": planned.strategy.compile.model_copy(
        update={"elementwise": "fused"})})
    assert xdit_flags(planned.plan, compiled).rstrip().endswith("--use_torch_compile")
    assert "transformer.compile()  # priced compiled" in diffusers_snippet(planned.plan, compiled)


def test_weight_splits_export_as_diffusers_tensor_parallel_and_xdit_refuses_them(tmp_path):
    planned = load_plan(REPO / "strategies" / "model.yaml")
    snippet = diffusers_snippet(planned.plan, planned.strategy)
    assert "TensorParallelConfig(mesh=mesh['tp'])" in snippet and "(8,)" in snippet
    # model.yaml splits each weight on its largest dim, on v6e-8: the snippet says neither is what diffusers was
    # priced as
    noted = diffusers_snippet(planned.plan, planned.strategy, planned.hardware)
    assert "# the plan was priced on v6e-8 (tpu); on GPUs its time is not that prediction" in noted
    assert "this plan's rules split weights on their largest dim, so the collectives run differ" in noted
    with pytest.raises(PlanError, match="xDiT's runner refuses --tensor_parallel_degree for every model"):
        xdit_flags(planned.plan, planned.strategy)
    doc = yaml.safe_load((REPO / "strategies" / "pairs.yaml").read_text())
    doc["mesh"] = {"data": 1, "model": 8}
    (tmp_path / "pairs8.yaml").write_text(yaml.safe_dump(doc))
    pairs = load_plan(tmp_path / "pairs8.yaml")  # column/row, as the tools split: only the system noted
    snippet = diffusers_snippet(pairs.plan, pairs.strategy, pairs.hardware)
    assert "largest" not in snippet and "priced on v6e-8" in snippet
    two_d = load_plan(REPO / "strategies" / "2d.yaml")
    with pytest.raises(PlanError, match="no data parallel degree"):
        diffusers_snippet(two_d.plan, two_d.strategy)


def test_diffusers_plans_are_the_installed_classes():
    """DIFFUSERS_PLANS is what the pinned diffusers defines: every shipped card's class, _cp_plan and _tp_plan."""
    diffusers = pytest.importorskip("diffusers")
    classes = {json.loads(path.read_text())["class_name"] for path in CARDS.glob("*.json")}
    assert classes == set(DIFFUSERS_PLANS)
    for name, (context, tensor) in DIFFUSERS_PLANS.items():
        cls = getattr(diffusers, name)
        assert (cls._cp_plan is not None, cls._tp_plan is not None) == (context, tensor), name


def test_every_shipped_card_has_an_xdit_entry_or_a_reason():
    names = {path.stem for path in CARDS.glob("*.json")}
    assert set(XDIT_MODELS) <= names
    assert names - set(XDIT_MODELS) == {"wan-2.1-t2v-1.3b", "ltx-video"}  # xDiT's runner has neither (its docstring)


@pytest.mark.parametrize("model, mesh, says", [
    ("hunyuan-video", "ring=2,seq=4", "HunyuanVideoTransformer3DModel defines no _cp_plan"),
    ("cogvideox-5b", "seq=2", "CogVideoXTransformer3DModel defines no _cp_plan"),
])
def test_a_class_without_a_cp_plan_is_refused_by_diffusers_and_runs_in_xdit(tmp_path, model, mesh, says):
    path = tmp_path / "p.yaml"
    done = subprocess.run([sys.executable, "-m", "meshlab", "try", "--model", model, "--hardware", "h100", "--mesh",
                           mesh, "--rules", "ulysses+ring" if "ring" in mesh else "ulysses", "--save", str(path)],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    planned = load_plan(path)
    refusal = form(diffusers_snippet, planned)
    assert says in refusal and refusal.endswith("pass your own cp_plan to enable_parallelism")
    with pytest.raises(PlanError, match="or export --format xdit$"):
        gpu_form("diffusers", planned.plan, planned.strategy)
    assert "--ulysses_degree" in xdit_flags(planned.plan, planned.strategy)


@pytest.mark.parametrize("strategy, fmt, says", [
    ("fsdp.yaml", "xdit", "(FSDP): diffusers' enable_parallelism has no such form"),
    ("hybrid.yaml", "diffusers", "diffusers' ParallelConfig refuses the two together"),
    ("2d.yaml", "xdit", "xDiT's runner refuses --tensor_parallel_degree"),
    ("ulysses.yaml", "xdit", "xDiT runs Qwen-Image without CFG parallelism"),
])
def test_a_plan_with_no_such_form_is_one_line_and_exit_2(strategy, fmt, says):
    done = subprocess.run([sys.executable, "-m", "meshlab", "export", f"strategies/{strategy}", "--format", fmt],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and f"strategies/{strategy}:" in done.stderr


@pytest.mark.parametrize("placement, xdit, diffusers", [
    ({"vae_decode": "tiled"}, "--enable_tiling", "pipe.vae.enable_tiling()"),
    ({"vae_decode": "parallel"}, "--use_parallel_vae", "diffusers has no parallel VAE"),
    ({"text_encoder": "sharded"}, "xDiT's runner has no such flag", "enable_parallelism does not do"),
])
def test_the_rest_of_the_pipeline_exports_where_the_tools_have_it_and_is_refused_where_not(placement, xdit,
                                                                                           diffusers, tmp_path):
    planned = load_plan(usp_without_cfg(tmp_path))
    strategy = planned.strategy.model_copy(update={"placement": planned.strategy.placement.model_copy(
        update=placement)})
    assert xdit in form(xdit_flags, planned, strategy) and diffusers in form(diffusers_snippet, planned, strategy)


def test_a_parallel_decode_xdit_does_not_list_for_the_model_is_refused(tmp_path):
    """SD3.5's runner capabilities leave out --use_parallel_vae; --enable_tiling tiles any model's decode."""
    path = tmp_path / "sd.yaml"
    done = subprocess.run([sys.executable, "-m", "meshlab", "try", "--model", "sd3.5-large", "--hardware", "h100",
                           "--mesh", "seq=2", "--rules", "ulysses", "--text-tokens", "334", "--save", str(path)],
                          capture_output=True, text=True, cwd=REPO)  # 38 heads: Ulysses 2
    assert done.returncode == 0, done.stderr
    planned = load_plan(path)
    strategy = planned.strategy.model_copy(update={"placement": planned.strategy.placement.model_copy(
        update={"vae_decode": "parallel"})})
    assert "not among its capabilities for SD3.5" in form(xdit_flags, planned, strategy)
    qwen = tmp_path / "qwen.yaml"  # its runner lists no tiling, and --enable_tiling tiles it all the same
    done = subprocess.run([sys.executable, "-m", "meshlab", "try", "--model", "qwen-image", "--hardware", "h100",
                           "--mesh", "seq=4", "--rules", "ulysses", "--save", str(qwen)], capture_output=True,
                          text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    planned = load_plan(qwen)
    tiled = planned.strategy.model_copy(update={"placement": planned.strategy.placement.model_copy(
        update={"vae_decode": "tiled"})})
    launch = xdit_flags(planned.plan, tiled).splitlines()[-1]
    assert launch.startswith("xdit --nproc_per_node 4 --model Qwen-Image") and launch.endswith("--enable_tiling")


def test_a_tpu_plan_exported_for_the_gpu_tools_asks_for_no_torch_compile():
    """model.yaml is fused because a TPU runs XLA: that is no torch.compile the GPU tools should be told to run."""
    planned = load_plan(REPO / "strategies" / "model.yaml")
    assert planned.strategy.compile.elementwise == "fused"
    assert "compile()" not in diffusers_snippet(planned.plan, planned.strategy, planned.hardware)


def test_a_missing_tp_plan_is_not_fixed_by_an_argument_diffusers_does_not_take(tmp_path):
    """enable_parallelism takes a caller's cp_plan but no tp_plan: Wan's missing _tp_plan is the class's to define."""
    path = tmp_path / "wan.yaml"
    done = subprocess.run([sys.executable, "-m", "meshlab", "try", "--model", "wan-2.1-t2v-14b", "--hardware", "h100",
                           "--mesh", "model=8", "--rules", "pairs", "--save", str(path)], capture_output=True,
                          text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    planned = load_plan(path)
    refusal = form(diffusers_snippet, planned)
    assert "WanTransformer3DModel defines no _tp_plan" in refusal
    assert refusal.endswith("define _tp_plan on the class, or split the sequence instead")  # Wan has a _cp_plan
    sd = tmp_path / "sd.yaml"
    done = subprocess.run([sys.executable, "-m", "meshlab", "try", "--model", "sd3.5-large", "--hardware", "h100",
                           "--mesh", "model=2", "--rules", "pairs", "--save", str(sd)], capture_output=True,
                          text=True, cwd=REPO)
    assert done.returncode == 0, done.stderr
    assert form(diffusers_snippet, load_plan(sd)).endswith("define _tp_plan on the class")  # and no _cp_plan either


@pytest.mark.parametrize("model, placement, says", [
    ("cogvideox-5b", {"text_encoder": "sharded"}, "--shard_t5_encoder"),
    ("sana-1600m", {"text_encoder": "sharded"}, "sharded splits text_encoder (Gemma2Model) over the GPUs, and xDiT's "
     "--shard_t5_encoder shards a T5 text encoder only; set placement.text_encoder: device or cpu"),
    ("flux-dev", {"text_encoder": "device", "encoders": {"text_encoder": "sharded"}},
     "placement.encoders.text_encoder: sharded splits text_encoder over the GPUs, and xDiT's runner has no "
     "such flag"),
    ("sana-1600m", {"text_encoder": "device"}, "--data_parallel_degree 2"),
])
def test_xdit_shards_a_t5_encoder_and_refuses_to_shard_another(tmp_path, model, placement, says):
    """xfuser's shard_t5_encoder wraps a T5's blocks in FSDP; the example scripts that take the flag (CogVideoX's
    and SANA's) shard nothing else, so a plan that prices SANA's Gemma2 sharded has no xDiT form."""
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"name": "p", "model": model, "hardware": "h100", "mesh": {"data": 2},
                                    "activations": {"batch": "data"}, "placement": placement,
                                    "workload": {"batch": 2}}))
    planned = load_plan(path)
    text = form(xdit_flags, planned)
    assert says in text
    refused = "sharded" in placement.values() or "sharded" in placement.get("encoders", {}).values()
    if model != "cogvideox-5b" and refused:
        assert len(text.splitlines()) == 1
    else:
        assert ("--shard_t5_encoder" in text.splitlines()[-1]) == (model == "cogvideox-5b")
