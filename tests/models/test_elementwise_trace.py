"""The elementwise trace against a hand count, and the shipped cards' traces (meshlab.models.importer.elementwise_trace)."""

from __future__ import annotations

import pytest

from meshlab.models.card import load_card

torch = pytest.importorskip("torch")

WIDTH, TOKENS, BATCH = 32, 15, 2


class Block(torch.nn.Module):
    """x -> x*2 -> fc1 -> relu -> fc2 -> + x: three gaps between its two matmuls."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(WIDTH, 4 * WIDTH)
        self.fc2 = torch.nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x * 2.0)))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([Block(), Block(), Block()])

    def forward(self, hidden_states):
        for block in self.blocks:
            hidden_states = block(hidden_states)
        return hidden_states


def stream_of(shape) -> str:
    from meshlab.models.importer.card_import import _stream_of

    return _stream_of(shape, {TOKENS: "image"})


def traced_block(index: int) -> dict:
    from meshlab.models.importer.elementwise_trace import trace_elementwise_both

    with torch.device("meta"):
        model = Model().to(torch.bfloat16)
        x = torch.empty(BATCH, TOKENS, WIDTH, dtype=torch.bfloat16)
    return trace_elementwise_both(model, {"hidden_states": x}, {"blocks": index}, stream_of)[0]  # the fused bytes


WIDTH_BYTES = BATCH * TOKENS * WIDTH * 2  # one pass over the width of every token in bf16


def total(traced: dict) -> float:
    return sum(traced.values()) / WIDTH_BYTES


def test_a_middle_block_moves_what_its_gaps_read_and_write_by_hand():
    """Block 1, by hand, in widths per token: its x*2 shares a pass with block 0's residual add, so it reads
    nothing new and writes x*2 for fc1 (1, fc1's input); relu reads fc1's output and writes fc2's input (4 + 4);
    the residual add reads fc2's output (1) and the block's input again (1, the residual stream) and writes the
    sum, which block 2's residual add reads in a later pass (1, the residual stream). 12."""
    traced = traced_block(1)
    assert {(side, linear): n / WIDTH_BYTES for (_, _, side, linear), n in traced.items()} == {
        ("in", "blocks.1.fc1"): 1, ("out", "blocks.1.fc1"): 4, ("in", "blocks.1.fc2"): 4,
        ("out", "blocks.1.fc2"): 1, ("", ""): 2}
    assert {(blocks, stream) for blocks, stream, _, _ in traced} == {("blocks", "image")}


def test_eager_a_middle_block_moves_what_each_op_reads_and_writes_by_hand():
    """Every op its own kernel, block 1 by hand: x*2 reads x and writes fc1's input (1 + 1); relu reads fc1's output
    and writes fc2's input (4 + 4); the residual add reads the block's input again, reads fc2's output and writes
    the sum (1 + 1 + 1), which takes the residual stream's side (the larger of its reads, the first among equals).
    13 widths, where one fused pass per gap moves 12."""
    from meshlab.models.importer.elementwise_trace import trace_elementwise_both

    with torch.device("meta"):
        model = Model().to(torch.bfloat16)
        x = torch.empty(BATCH, TOKENS, WIDTH, dtype=torch.bfloat16)
    fused, eager, _ = trace_elementwise_both(model, {"hidden_states": x}, {"blocks": 1}, stream_of)
    assert fused == traced_block(1)
    assert {(side, linear): n / WIDTH_BYTES for (_, _, side, linear), n in eager.items()} == {
        ("in", "blocks.1.fc1"): 1, ("out", "blocks.1.fc1"): 4, ("in", "blocks.1.fc2"): 4,
        ("out", "blocks.1.fc2"): 1, ("", ""): 3}


def test_a_block_dispatches_each_of_its_ops_once_by_hand():
    """Eager PyTorch launches x*2, fc1, relu, fc2 and the residual add: 5 per block; the two untraced blocks' 10
    count as the rest of the forward (the weights' transposes are the matmuls' business, not launches)."""
    from meshlab.models.importer.elementwise_trace import trace_elementwise_both

    with torch.device("meta"):
        model = Model().to(torch.bfloat16)
        x = torch.empty(BATCH, TOKENS, WIDTH, dtype=torch.bfloat16)
    *_, dispatches = trace_elementwise_both(model, {"hidden_states": x}, {"blocks": 1}, stream_of)
    assert dispatches == {"blocks": 5, None: 10}


def test_the_first_block_also_reads_the_model_input():
    """Block 0's first pass starts the forward: it reads the input (1 more than a middle block)."""
    assert total(traced_block(0)) == 13


def test_the_last_block_writes_the_output_nothing_reads():
    assert total(traced_block(2)) == 12


@pytest.mark.parametrize("name", ["qwen-image", "flux-dev", "wan-2.1-t2v-14b", "sd3.5-large", "flux2-dev"])
def test_shipped_cards_trace_every_block_list(name):
    card = load_card(name)
    lists = {p.name.split(".", 1)[0] for p in card.parameters if p.block is not None}
    assert {e.blocks for e in card.elementwise} == lists
    assert {e.blocks for e in card.elementwise if e.execution == "eager"} == lists
    width = card.architecture.hidden_size

    def per_token(blocks, stream, execution):
        return sum(e.bytes_per_token for e in card.elementwise if (e.blocks, e.stream, e.execution) == (
            blocks, stream, execution))

    for blocks, stream in {(e.blocks, e.stream) for e in card.elementwise}:
        fused, eager = per_token(blocks, stream, "fused"), per_token(blocks, stream, "eager")
        assert fused < 40 * width * 2  # at most a few dozen bf16 passes over the residual width
        assert fused <= eager < 250 * width * 2  # eager writes every intermediate (Wan's in float32: 190-odd)
    assert sum(e.bytes_per_token for e in card.elementwise if e.execution == "fused") > 0
    linears = {p.module for p in card.parameters if p.kind == "linear"}
    from meshlab.models.card import concrete_path

    for e in card.elementwise:  # every Linear named is one of the card's, in the same list
        assert e.side != "in" and e.side != "out" or concrete_path(e.linear, f"{e.blocks}.0.x") in linears
