"""Activation rules reach the tensors they name in every built-in model's real diffusers class (built on ``meta``:
the hooks see shapes, and no weights are needed)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

from meshlab.core.spec import PartitionSpec  # noqa: E402
from meshlab.models.card import builtin_cards, load_card  # noqa: E402
from meshlab.models.families import Geometry, family  # noqa: E402
from meshlab.models.importer.build import depth_config, forward  # noqa: E402
from meshlab.models.importer.forward_inputs import forward_inputs  # noqa: E402
from meshlab.parallelisms.activation_hooks import install  # noqa: E402
from meshlab.plan.activations import activation_points  # noqa: E402
from meshlab.strategy.schema import ActivationRule  # noqa: E402


@pytest.mark.parametrize("name", builtin_cards())
def test_a_block_input_rule_marks_every_blocks_hidden_states_however_the_model_passes_them(name):
    """Wan, SANA and HunyuanVideo call ``block(hidden_states, ...)`` by position; Qwen-Image and Flux by keyword.
    Each block's image hidden states are marked once, at the tokens the block receives."""
    import diffusers

    card = load_card(name)
    fam = family(card.class_name)
    config = depth_config(card, 2)
    marked = []

    def mark(tensor, spec, label):
        marked.append((label, tuple(tensor.shape), spec))
        return tensor

    rule = ActivationRule(point="block.input", stream="image", spec=[None, "seq", None])
    points = [p for p in activation_points(card, [rule])  # the first two blocks of each list, as built
              if p.point == "block.input" and int(p.module.rsplit(".", 1)[1]) < 2]
    assert points, f"{name}: the rule resolves to no block"
    geo = Geometry(1, (4, 6), fam.text_tokens(config) or 7, 2 if fam.video else 1, fam.reference_tokens(config))
    with torch.device("meta"):
        model = getattr(diffusers, card.class_name).from_config(config).eval()
        inputs = forward_inputs(type(model), config, geo, torch.bfloat16, torch.Generator().manual_seed(0))
        install(model, tuple(points), mark)
        forward(model.to(torch.bfloat16), inputs)
    assert sorted(label for label, _, _ in marked) == sorted(f"block.input of {p.module} (image)" for p in points)
    assert all(spec == PartitionSpec(None, "seq", None) for _, _, spec in marked)
    assert {shape[1] for _, shape, _ in marked} <= {geo.image_tokens, geo.image_tokens + geo.text_tokens}


def test_a_block_input_rule_on_a_forward_without_that_argument_is_refused_not_silently_dropped():
    from meshlab.core.errors import BackendError
    from meshlab.plan.activations import ActivationPoint

    class Wrapped(torch.nn.Module):
        def forward(self, *args):
            return args[0]

    point = ActivationPoint("block", "argument:hidden_states", "block.input", "image", PartitionSpec(None, "seq", None),
                            0)
    model = torch.nn.Module()
    model.block = Wrapped()
    with pytest.raises(BackendError, match="takes no argument 'hidden_states'"):
        install(model, (point,), lambda tensor, spec, label: tensor)
