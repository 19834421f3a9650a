"""The elementwise trace against a hand count, and the shipped cards' traces (meshlab.backend.elementwise_trace)."""

from __future__ import annotations

import pytest

from meshlab.cards.card import load_card

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
    from meshlab.backend.card_import import _stream_of

    return _stream_of(shape, {TOKENS: "image"})


def traced_block(index: int) -> dict:
    from meshlab.backend.elementwise_trace import trace_elementwise

    with torch.device("meta"):
        model = Model().to(torch.bfloat16)
        x = torch.empty(BATCH, TOKENS, WIDTH, dtype=torch.bfloat16)
    return trace_elementwise(model, {"hidden_states": x}, {"blocks": index}, stream_of)


def widths(n: int) -> dict:
    return {("blocks", "image"): BATCH * TOKENS * n * WIDTH * 2}  # n passes over the width in bf16


def test_a_middle_block_moves_what_its_gaps_read_and_write_by_hand():
    """Block 1, by hand, in widths per token: its x*2 shares a pass with block 0's residual add, so it reads
    nothing new and writes x*2 for fc1 (1); relu reads fc1's output and writes its own (4 + 4); the residual add
    reads fc2's output and the block's input again (2) and writes the sum, which block 2's residual add reads
    in a later pass (1). 12."""
    assert traced_block(1) == widths(12)


def test_the_first_block_also_reads_the_model_input():
    """Block 0's first pass starts the forward: it reads the input (1 more than a middle block)."""
    assert traced_block(0) == widths(13)


def test_the_last_block_writes_the_output_nothing_reads():
    assert traced_block(2) == widths(12)


@pytest.mark.parametrize("name", ["qwen-image", "flux-dev", "wan-2.1-t2v-14b", "sd3.5-large", "flux2-dev"])
def test_shipped_cards_trace_every_block_list(name):
    card = load_card(name)
    lists = {p.name.split(".", 1)[0] for p in card.parameters if p.block is not None}
    assert {e.blocks for e in card.elementwise} == lists
    width = card.architecture.hidden_size
    for e in card.elementwise:
        assert 0 < e.bytes_per_token < 40 * width * 2  # at most a few dozen bf16 passes over the residual width
