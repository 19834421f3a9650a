"""`meshlab export --format diffusers | xdit`: a plan as the GPU tools take it, or refused with the reason."""

from __future__ import annotations

import subprocess
import sys

import pytest

from meshlab.api import load_plan
from meshlab.core.errors import PlanError
from meshlab.export.gpu import degrees, diffusers_snippet, xdit_flags
from tests.conftest import REPO

USP = REPO / "strategies" / "flux-usp-h100.yaml"


def test_the_flux_usp_plan_has_both_forms():
    planned = load_plan(USP)
    d = degrees(planned.plan, planned.strategy)
    assert (d.cfg, d.data, d.ring, d.ulysses, d.tensor) == (2, 1, 2, 2, 1)
    flags = xdit_flags(planned.plan, planned.strategy)
    assert "--nproc_per_node 8" in flags and "--use_cfg_parallel" in flags
    assert "--ulysses_degree 2 --ring_degree 2" in flags and "--data_parallel_degree 1" in flags
    assert "priced as" not in flags  # the plan's ring is xDiT's
    snippet = diffusers_snippet(planned.plan, planned.strategy)
    compile(snippet, "snippet", "exec")  # it is Python
    assert "ContextParallelConfig(ring_degree=2, ulysses_degree=2, mesh=mesh['ring', 'ulysses'])" in snippet
    assert "mesh_dim_names=('cfg', 'ring', 'ulysses')" in snippet and "(2, 2, 2)" in snippet
    assert "priced as xdit runs it; diffusers joins the streams on the chip, and gathers a ring's k and v once" in snippet
    assert "split them over mesh['cfg']" in snippet


def test_weight_splits_export_as_tensor_parallel_where_the_tools_take_them():
    planned = load_plan(REPO / "strategies" / "2d.yaml")
    flags = xdit_flags(planned.plan, planned.strategy)
    assert "--data_parallel_degree 2" in flags and "--tensor_parallel_degree 4" in flags
    # 2d.yaml splits each weight on its largest dim, on v6e-8: the flags say neither is what xDiT's run was priced as
    noted = xdit_flags(planned.plan, planned.strategy, planned.hardware)
    assert "# the plan was priced on v6e-8 (tpu); on GPUs its time is not that prediction" in noted
    assert "this plan's rules split weights on their largest dim, so the collectives run differ" in noted
    pairs = load_plan(REPO / "strategies" / "pairs.yaml")  # column/row, as the tools split: only the system noted
    assert "largest" not in xdit_flags(pairs.plan, pairs.strategy, pairs.hardware)
    assert "priced on v6e-8" in xdit_flags(pairs.plan, pairs.strategy, pairs.hardware)
    usp = load_plan(USP)
    assert xdit_flags(usp.plan, usp.strategy, usp.hardware) == xdit_flags(usp.plan, usp.strategy)  # h100: none
    with pytest.raises(PlanError, match="no data parallel degree"):
        diffusers_snippet(planned.plan, planned.strategy)


@pytest.mark.parametrize("strategy, fmt, says", [
    ("fsdp.yaml", "xdit", "(FSDP): diffusers' enable_parallelism and xDiT's flags have no such form"),
    ("hybrid.yaml", "diffusers", "diffusers' ParallelConfig refuses the two together"),
])
def test_a_plan_with_no_such_form_is_one_line_and_exit_2(strategy, fmt, says):
    done = subprocess.run([sys.executable, "-m", "meshlab", "export", f"strategies/{strategy}", "--format", fmt],
                          capture_output=True, text=True, cwd=REPO)
    assert done.returncode == 2 and says in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1 and f"strategies/{strategy}:" in done.stderr


@pytest.mark.parametrize("placement, xdit, diffusers", [
    ({"vae_decode": "tiled"}, "--enable_tiling", "pipe.vae.enable_tiling()"),
    ({"vae_decode": "parallel"}, "--use_parallel_vae", "diffusers has no parallel VAE"),
    ({"text_encoder": "sharded"}, "--shard_t5_encoder", "enable_parallelism does not do"),
])
def test_the_rest_of_the_pipeline_exports_where_the_tools_have_it_and_is_refused_where_not(placement, xdit,
                                                                                           diffusers):
    planned = load_plan(USP)
    strategy = planned.strategy.model_copy(update={"placement": planned.strategy.placement.model_copy(
        update=placement)})

    def form(render):
        try:
            return render(planned.plan, strategy)
        except PlanError as exc:
            return exc.one_line()

    assert xdit in form(xdit_flags) and diffusers in form(diffusers_snippet)
