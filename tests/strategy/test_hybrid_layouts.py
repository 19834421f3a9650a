"""Rewrites and activation rules in the strategy layer: resolution against the card, bad input, and what the
cost model makes of them (pure, no torch)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from typer.testing import CliRunner

from meshlab.cli.app import app
from meshlab.core.errors import PlanError
from meshlab.cost.predict import predict
from meshlab.plan.activations import activation_points
from meshlab.plan.planned import plan_file
from meshlab.strategy.schema import ActivationRule

from tests.conftest import REPO

runner = CliRunner()


def _variant(tmp_path: Path, base: str, old: str, new: str) -> Path:
    text = (REPO / "strategies" / f"{base}.yaml").read_text()
    assert old in text
    path = tmp_path / f"{base}-variant.yaml"
    path.write_text(text.replace(old, new, 1))
    return path


def _block0(planned) -> tuple[Counter, Counter]:
    prediction = predict(planned.plan, planned.strategy, planned.hardware)
    counts, nbytes = Counter(), Counter()
    for c in prediction.collectives:
        if c.block == 0:
            counts[c.kind] += 1
            nbytes[c.kind] += c.bytes
    return counts, nbytes


def test_rules_resolve_to_one_point_per_tensor():
    planned = plan_file(REPO / "strategies" / "ulysses.yaml")
    points = activation_points(planned.card, planned.strategy.activations.rules)
    where = Counter((p.point, p.where) for p in points)
    # 60 blocks: one attention kernel each, two output projections, two streams' block inputs
    assert where == {("attention.qkv", "kernel"): 60, ("attention.output", "input"): 120,
                     ("block.input", "argument:hidden_states"): 60,
                     ("block.input", "argument:encoder_hidden_states"): 60}
    only_image = activation_points(planned.card, [ActivationRule(point="attention.output", stream="image",
                                                                 spec=[None, "seq", None])])
    assert {p.module.rsplit(".", 1)[-1] for p in only_image} == {"0"} and len(only_image) == 60  # to_out.0


def test_layernorm_rows_removes_the_rows_gathers(tmp_path):
    with_rewrite = plan_file(REPO / "strategies" / "pairs.yaml")
    stock = plan_file(_variant(tmp_path, "pairs", "rewrites: [layernorm-rows]", "rewrites: []"))
    rewritten, _ = _block0(with_rewrite)
    before, _ = _block0(stock)
    assert before["all-gather"] == 4 and rewritten["all-gather"] == 0  # 2 LayerNorms x 2 streams, over data
    assert rewritten["all-reduce"] == before["all-reduce"]


def test_ulysses_moves_tokens_to_heads_with_all_to_alls():
    counts, nbytes = _block0(plan_file(REPO / "strategies" / "ulysses.yaml"))
    # q, k, v of two streams onto heads; the joint output back; cutting it into streams moves one joint shard
    # (4608 tokens / 4 = 1152, 3072 wide, bf16) between the two streams, whose own splits do not line up with it
    assert counts == {"all-to-all": 7, "collective-permute": 2}
    assert nbytes["collective-permute"] == 1152 * 3072 * 2
    assert "all-gather" not in counts  # no k/v gathers: the kernel reads whole sequences


def test_ring_without_rules_gathers_keys_and_values(tmp_path):
    text = (REPO / "strategies" / "ulysses.yaml").read_text()
    start, end = text.index("  rules:\n    - point: block.input"), text.index("rewrites:")
    path = tmp_path / "ring.yaml"
    path.write_text(text[:start] + text[end:])
    counts, _ = _block0(plan_file(path))
    assert counts["all-gather"] == 2  # k and v of the joint sequence


@pytest.mark.parametrize("old, new, message", [
    ("rewrites: [layernorm-rows]", "rewrites: [layernorm-rowz]", "unknown rewrite 'layernorm-rowz'"),
    ("point: attention.qkv", "point: attention.qkvv", "unknown activation point 'attention.qkvv'"),
    ("      spec: [cfg, null, seq]", "      stream: image\n      spec: [cfg, null, seq]", "leave `stream` out"),
    ("      spec: [cfg, seq, null]\n      note: tokens split", "      stream: audio\n      spec: [cfg, seq, null]\n"
     "      note: tokens split", "stream 'audio'"),
    ("spec: [cfg, null, seq]", "spec: [cfg, null, sequence]", "unknown mesh axis 'sequence'"),
    ("      spec: [cfg, seq, null]\n      note: tokens split", "      attention: self\n      spec: [cfg, seq, null]\n"
     "      note: tokens split", "names attention 'self' at block.input, which is no attention point"),
    ("      spec: [cfg, null, seq]", "      attention: cross\n      spec: [cfg, null, seq]",
     "is for cross-attention, and qwen-image has none"),
    ("      spec: [cfg, null, seq]", "      attention: both\n      spec: [cfg, null, seq]",
     "activations.rules[1].attention: Input should be 'self' or 'cross'"),
])
def test_bad_rules_are_one_line_errors(tmp_path, old, new, message):
    path = _variant(tmp_path, "ulysses", old, new)
    result = runner.invoke(app, ["try", str(path)])
    assert result.exit_code == 2, result.output
    line = result.output.strip()
    assert message in line and str(path) in line and "\n" not in line and "Traceback" not in line


def test_heads_that_do_not_divide_are_refused(tmp_path):
    path = _variant(tmp_path, "ulysses", "mesh:\n  cfg: 2\n  seq: 4", "mesh:\n  cfg: 1\n  seq: 16")
    path.write_text(path.read_text().replace("hardware: h100", "hardware: v6e-16"))
    result = runner.invoke(app, ["try", str(path)])
    assert result.exit_code == 2 and "24 heads, not divisible by 16" in result.output, result.output
    assert ":" in result.output.split("error:")[1].split(" ")[1]  # file:line:column
    assert "split heads 12 ways, the nearest degree that divides 24" in result.output  # 12 is 4 away, 24 is 8
    assert "split heads 8 ways (it divides 24 heads and 16 devices) and ring the other 2" in " ".join(
        result.output.split())  # first the layout that keeps all 16 busy


def test_a_ulysses_rule_for_self_attention_is_held_to_self_attention_heads_only():
    """SANA: 70 self-attention heads, 20 cross-attention heads. Ulysses 7 over the self-attention divides its 70; the
    cross-attention's 20 are not the rule's business (before, every attention was held to it)."""
    from meshlab.models.card import load_card
    from meshlab.plan.planner import make_plan
    from meshlab.strategy.schema import Strategy

    doc = {"name": "s", "model": "sana-1600m", "hardware": "h100", "mesh": {"seq": 7},
           "activations": {"sequence": "seq", "rules": [
               {"point": "attention.qkv", "attention": "self", "spec": [None, None, "seq"]}]},
           "workload": {"height": 7 * 32 * 4, "width": 1024, "text_tokens": 300, "steps": 20}}
    make_plan(Strategy.model_validate(doc), load_card("sana-1600m"), 7)
    doc["activations"]["rules"][0]["attention"] = None
    with pytest.raises(PlanError, match="attn2 has 20 heads, not divisible by 7.*split heads 5 ways"):
        make_plan(Strategy.model_validate(doc), load_card("sana-1600m"), 7)


def test_tokens_that_do_not_divide_warn_with_padding(tmp_path):
    path = _variant(tmp_path, "ulysses", "text_tokens: 512", "text_tokens: 510")
    planned = plan_file(path)
    assert any("510 tokens over 4 devices: XLA pads them to 512" in w for w in planned.plan.warnings)


def test_attention_rules_can_take_self_or_cross_attention_alone():
    """Wan's blocks have a self-attention (attn1) and a cross-attention over the text (attn2, keys from another
    stream): a rule can name either, and a rule that names neither takes both, as before."""
    planned = plan_file(REPO / "tests" / "cost" / "data" / "strategies" / "wan13-v6e-8.yaml")
    card = planned.card

    def marked(attention):
        rules = [ActivationRule(point=point, attention=attention, spec=spec) for point, spec in
                 (("attention.qkv", ["cfg", None, "seq"]), ("attention.output", ["cfg", "seq", None]))]
        return Counter(p.module.split(".")[2] for p in activation_points(card, rules))

    assert marked(None) == {"attn1": 60, "attn2": 60}  # 30 blocks: a kernel and an output projection each
    assert marked("self") == {"attn1": 60} and marked("cross") == {"attn2": 60}
    both, selfish = (plan_file(REPO / "tests" / "cost" / "data" / "strategies" / f"{s}.yaml")
                     for s in ("wan13-v6e-8", "wan13-v6e-8-self"))
    # a rule for every attention keeps the identity it had before rules could choose (profiles and caches key on it)
    assert all(set(r) == {"point", "stream", "spec", "note"} for r in both.strategy.activations.identity()["rules"])
    assert [r.get("attention") for r in selfish.strategy.activations.identity()["rules"]] == [None, "self", "self",
                                                                                            None]


def _wan_variant(tmp_path: Path, name: str, changes: list[tuple[str, str]]) -> Path:
    text = (REPO / "tests" / "cost" / "data" / "strategies" / "wan13-v6e-8.yaml").read_text()
    for old, new in changes:
        assert old in text, old
        text = text.replace(old, new)
    path = tmp_path / f"{name}.yaml"
    path.write_text(text)
    return path


def _kv_gathers(path: Path) -> Counter:
    """The axes of block 0's k/v all-gathers (every query needs every key), by how many there are."""
    planned = plan_file(path)
    prediction = predict(planned.plan, planned.strategy, planned.hardware)
    return Counter(c.axes for c in prediction.collectives if c.block == 0 and c.phase == "attention:kv")


def test_each_attention_reads_its_own_rule_for_the_axes_at_its_kernel(tmp_path):
    """The sequence axes still splitting an attention's tokens at its kernel come from the rule that marks it; an
    attention no rule marks keeps every sequence axis there, and XLA gathers its keys and values over them."""
    qkv, out = "- point: attention.qkv\n", "- point: attention.output\n"
    usp = _wan_variant(tmp_path, "usp-self", [
        ("mesh:\n  cfg: 2\n  seq: 4", "mesh:\n  cfg: 2\n  ring: 2\n  seq: 2"),
        ("sequence: seq", "sequence: [ring, seq]"),
        ("spec: [cfg, seq, null]", "spec: [cfg, [ring, seq], null]"),
        ("spec: [cfg, null, seq]", "spec: [cfg, ring, seq]"),
        (qkv, qkv + "      attention: self\n"), (out, out + "      attention: self\n"),
        ("axis: seq", "axis: ring")])
    # self-attention: a ring over `ring` (Ulysses over seq); the cross-attention, unmarked: text split over both
    assert _kv_gathers(usp) == {("ring",): 2, ("ring", "seq"): 2}
    cross_only = _wan_variant(tmp_path, "cross-only", [(qkv, qkv + "      attention: cross\n"),
                                                        (out, out + "      attention: cross\n")])
    # the cross-attention's Ulysses rule leaves no axis on its tokens: no gathers; the unmarked self-attention's
    # tokens are split over seq: its k and v are gathered
    assert _kv_gathers(cross_only) == {("seq",): 2}
    every = REPO / "tests" / "cost" / "data" / "strategies" / "wan13-v6e-8.yaml"
    assert _kv_gathers(every) == {}  # Ulysses everywhere: the all-to-alls move the tokens, nothing is gathered


def test_the_gpu_tools_have_no_form_for_a_cross_attention_rule(tmp_path):
    out = "- point: attention.output\n"
    path = _wan_variant(tmp_path, "cross", [(out, out + "      attention: cross\n")])
    for tool in ("diffusers", "xdit"):
        result = runner.invoke(app, ["export", str(path), "--format", tool])
        assert result.exit_code == 2, result.output
        assert "activations.rules[2] splits the cross-attention on its own" in result.output


def test_the_heads_fix_offers_usp_only_for_a_sequence_split_and_keeps_the_mesh_s_other_axes():
    from meshlab.plan.activations import heads_fix

    usp = heads_fix(12, 8, {"cfg": 2, "seq": 8}, ulysses=True)
    assert usp.startswith("split heads 4 ways (it divides 12 heads and 8 devices) and ring the other 2")
    assert "--mesh cfg=2,ring=2,seq=4 --rules ulysses+ring" in usp
    hybrid = heads_fix(12, 8, {"model": 2, "seq": 4}, ulysses=False)  # heads over model x seq: no ring to offer
    assert hybrid == "split heads 6 ways, the nearest degree that divides 12 (any of [1, 2, 3, 4, 6, 12])"
    assert heads_fix(7, 4, {"seq": 4}, ulysses=True).startswith("run the 4 devices as a ring")
