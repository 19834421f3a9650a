"""Where a flash attention kernel under shard_map runs each attention (meshlab.plan.attention_kernel). Pure."""

import pytest

from meshlab.plan.attention_kernel import KernelLayout, fitted, kernel_block, kernel_layouts
from meshlab.plan.planned import plan_file
from tests.conftest import REPO

DATA = REPO / "tests" / "cost" / "data" / "strategies"


def layouts(path):
    planned = plan_file(path)
    return kernel_layouts(planned.plan, planned.strategy.activations)


@pytest.mark.parametrize("path, module, expected", [
    # heads as q's output features, samples over the batch axis
    (REPO / "strategies" / "2d.yaml", "transformer_blocks.7.attn", KernelLayout(("data",), ("model",), ())),
    # FSDP: q's weight is split over the batch axis, which splits samples, not heads: every head on every chip
    (REPO / "strategies" / "fsdp.yaml", "transformer_blocks.7.attn", KernelLayout(("data",), (), ())),
    # Ulysses: the qkv rule moves the sequence axis onto the heads; the guidance branch splits the samples
    (REPO / "strategies" / "ulysses.yaml", "transformer_blocks.7.attn", KernelLayout(("cfg",), ("seq",), ())),
    # USP: the ring axis stays on the queries, the Ulysses axis joins model on the heads
    (DATA / "usp-ring2-seq2-model2.yaml", "transformer_blocks.7.attn",
     KernelLayout(("data",), ("model", "seq"), ("ring",))),
    # no qkv rule: every sequence axis is a ring's at the kernel
    (DATA / "seq2-model4.yaml", "transformer_blocks.7.attn", KernelLayout((), ("model",), ("seq",))),
    # Wan: the self-attention's rule leaves the cross-attention (text keys) to the weights, its queries split
    (REPO / "strategies" / "wan-14b-v6e-8.yaml", "blocks.3.attn1", KernelLayout(("cfg",), ("seq",), ())),
    (REPO / "strategies" / "wan-14b-v6e-8.yaml", "blocks.3.attn2", KernelLayout(("cfg",), (), ("seq",))),
])
def test_each_attention_runs_its_kernel_as_the_plan_lays_it_out(path, module, expected):
    assert layouts(path)[module] == expected


def test_a_linear_attention_runs_no_kernel():
    """SANA: its self-attention is linear (no kernel), its cross-attention a softmax one."""
    assert {module.rsplit(".", 1)[-1] for module in layouts(DATA / "sana-2d.yaml")} == {"attn2"}


def test_specs_and_the_entries_a_dim_cannot_take():
    layout = KernelLayout(("data",), ("model", "seq"), ("ring",))
    assert layout.q_entries() == ("data", ("model", "seq"), "ring", None)
    assert layout.kv_entries() == ("data", ("model", "seq"), None, None)  # every key on every chip
    sizes = {"data": 2, "model": 2, "seq": 2, "ring": 2}
    assert fitted(layout.q_entries(), (2, 24, 4608, 128), sizes) == layout.q_entries()
    assert fitted(layout.q_entries(), (1, 24, 4607, 128), sizes) == (None, ("model", "seq"), None, None)
    assert fitted(layout.q_entries(), (2, 6, 4608, 128), sizes) == ("data", None, "ring", None)


@pytest.mark.parametrize("tokens, expected", [
    (4608, (512, 4608)),  # Flux at 1024²: 4096 image + 512 text tokens
    (1152, (128, 1152)),  # a quarter of them
    (288, (128, 384)),  # 256² and 32 text tokens: padded to whole 128-token blocks
    (32760, (512, 32768)),  # Wan 2.1 at 480p, 81 frames
    (100, (128, 128)),
])
def test_the_kernel_s_blocks_divide_the_tokens_padded_where_none_does(tokens, expected):
    assert kernel_block(tokens) == expected
