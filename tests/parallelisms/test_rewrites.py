"""The layernorm-rows rewrite on real modules: equal values, same parameters, every LayerNorm of the model."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")

from meshlab.parallelisms.rewrites import RowLayerNorm, apply_rewrites  # noqa: E402


@pytest.mark.parametrize("affine", [False, True])
def test_row_layernorm_equals_layernorm(affine):
    torch.manual_seed(0)
    x = torch.randn(2, 7, 48) * 3 + 1
    stock = torch.nn.LayerNorm(48, eps=1e-6, elementwise_affine=affine)
    if affine:
        with torch.no_grad():
            stock.weight.normal_()
            stock.bias.normal_()
    rewritten = torch.nn.LayerNorm(48, eps=1e-6, elementwise_affine=affine)
    rewritten.load_state_dict(stock.state_dict())
    rewritten.__class__ = RowLayerNorm
    assert torch.allclose(rewritten(x), stock(x), atol=1e-5, rtol=0)
    bf16 = x.to(torch.bfloat16)
    stock_bf16, rewritten_bf16 = stock.to(torch.bfloat16), rewritten.to(torch.bfloat16)
    assert rewritten_bf16(bf16).dtype == torch.bfloat16
    assert (rewritten_bf16(bf16).float() - stock_bf16(bf16).float()).abs().max() <= 0.0625  # bf16: 8 bits


def test_rewrite_changes_every_layernorm_of_a_real_transformer_and_keeps_its_output():
    from diffusers import QwenImageTransformer2DModel

    torch.manual_seed(0)
    model = QwenImageTransformer2DModel(patch_size=2, in_channels=16, out_channels=4, num_layers=2,
                                        attention_head_dim=16, num_attention_heads=4, joint_attention_dim=16,
                                        axes_dims_rope=(8, 4, 4)).eval()
    inputs = dict(hidden_states=torch.randn(1, 16, 16), encoder_hidden_states=torch.randn(1, 5, 16),
                  encoder_hidden_states_mask=torch.ones(1, 5, dtype=torch.long), timestep=torch.tensor([0.5]),
                  img_shapes=[[(1, 4, 4)]], return_dict=False)
    names = [n for n, _ in model.named_parameters()]
    norms = sum(type(m) is torch.nn.LayerNorm for m in model.modules())
    with torch.no_grad():
        before = model(**inputs)[0]
        assert apply_rewrites(model, ["layernorm-rows"]) == {"layernorm-rows": norms}
        after = model(**inputs)[0]
    assert norms == 9  # 4 per block (2 streams x 2) and the output norm
    assert not any(type(m) is torch.nn.LayerNorm for m in model.modules())
    assert [n for n, _ in model.named_parameters()] == names
    assert torch.allclose(before, after, atol=1e-5, rtol=0)
