"""Dollars per image where a user reads them: try's line and --json, compare's column, explain's arithmetic,
and a price a strategy overrides."""

import json

from typer.testing import CliRunner

from meshlab.cli.app import app
from tests.conftest import REPO

runner = CliRunner()
STRATEGY = REPO / "strategies" / "2d.yaml"


def overridden(tmp_path, price) -> str:
    path = tmp_path / "own.yaml"
    path.write_text(STRATEGY.read_text().replace("hardware: v6e-8", f"hardware: {{name: v6e-8, usd_per_chip_hour: "
                                                                     f"{price}}}"))
    return str(path)


def test_try_prices_an_image_at_the_list_price_and_at_an_override(tmp_path):
    listed = json.loads(runner.invoke(app, ["try", str(STRATEGY), "--json"]).output)["predicted"]
    own = json.loads(runner.invoke(app, ["try", overridden(tmp_path, 0.27), "--json"]).output)["predicted"]
    assert listed["usd_per_chip_hour"] == 2.70 and own["usd_per_chip_hour"] == 0.27
    assert abs(listed["usd_per_image"] - 2.70 * 8 * listed["seconds_per_image"] / 3600) < 1e-12
    assert abs(own["usd_per_image"] * 10 - listed["usd_per_image"]) < 1e-12  # a tenth the price, a tenth the cost
    assert listed["latency_s"] == listed["seconds_per_image"] * listed["images_per_call"]
    line = runner.invoke(app, ["try", overridden(tmp_path, 0.27)]).output
    assert "per chip-hour x 8 chip(s) (your override)" in line and "at throughput" in line


def test_compare_and_explain_show_the_same_dollars(tmp_path):
    doc = json.loads(runner.invoke(app, ["compare", str(STRATEGY), "--json"]).output)
    usd = doc["entries"][0]["predicted"]["usd_per_image"]
    table = runner.invoke(app, ["compare", str(STRATEGY)], terminal_width=200).output
    assert f"${usd:.4f}" in table
    explained = runner.invoke(app, ["explain", str(STRATEGY)], terminal_width=200).output
    assert f"${usd:.4f}" in explained and "$2.70 per chip-hour" in explained and "time to first image" in explained


def test_explain_prices_a_float32_workload_at_the_float32_peak(tmp_path):
    path = tmp_path / "f32.yaml"
    path.write_text("name: f32\nmodel: qwen-image\nhardware: h100\nmesh: {data: 8}\nrules: [{match: '*', "
                    "shard: replicate}]\nworkload: {dtype: float32, batch: 8}\n")
    text = runner.invoke(app, ["explain", str(path)], terminal_width=200).output
    assert "at 67 TFLOP/s x 0.7" in text and "989 TFLOP/s" not in text and "measured GEMM rate" not in text


def test_try_says_how_much_of_the_call_an_assumed_host_rate_prices_and_prices_no_plan_that_does_not_fit():
    """2d.yaml's text encoder runs on the host at the catalog's assumed rate, and is most of a call: the headline
    says so and how to move it; data.yaml does not fit: its time is what it would take, and it has no price."""
    doc = json.loads(runner.invoke(app, ["try", str(STRATEGY), "--json"]).output)["predicted"]
    line = " ".join(runner.invoke(app, ["try", str(STRATEGY)], terminal_width=400).output.split())
    terms = json.loads(runner.invoke(app, ["explain", str(STRATEGY), "--json"]).output)["predicted"]["terms"]
    encode = terms["text_encode_s"] * doc["images_per_call"]
    assert encode > 0.5 * doc["latency_s"]  # most of the call
    assert f"a call of 2 images in {doc['latency_s']:.2f} s" in line
    assert (f"{encode:.2f} s of the call is the text encoder on the host at an assumed 1 TFLOP/s (not measured; "
            "`placement.text_encoder: device` puts it on the chips)") in line
    on_chips = runner.invoke(app, ["try", str(REPO / "strategies" / "ulysses.yaml")], terminal_width=400).output
    assert "Predicted (not measured): one image in" in on_chips and "text encoder on the host" not in on_chips
    unfit = " ".join(runner.invoke(app, ["try", str(REPO / "strategies" / "data.yaml")], terminal_width=400
                                   ).output.split())
    assert "Predicted were it to fit (not measured; it cannot run as planned)" in unfit
    assert unfit.endswith("no price: it does not fit") and "per chip-hour" not in unfit
    # the plan itself does not fit: the host-share clause names no other placement
    assert "text encoder on the host at an assumed 1 TFLOP/s (not measured); no price" in unfit


def test_the_host_share_names_only_a_placement_that_still_fits(tmp_path):
    """hybrid.yaml holds 19 GiB of weights a chip: the 16.6 GB encoder does not fit whole beside them, split over
    the chips it does; the quick form names the flag; a host rate the strategy gives is not called assumed."""
    def line(*args):
        return " ".join(runner.invoke(app, ["try", *args], terminal_width=400).output.split())

    assert ("(not measured; `placement.text_encoder: sharded` puts it on the chips (split over them: it does not fit "
            "whole beside the plan))") in line(str(REPO / "strategies" / "hybrid.yaml"))
    assert "(not measured; --text-encoder device puts it on the chips)" in line(
        "--model", "qwen-image", "--hardware", "v6e-8", "--rules", "2d", "--mesh", "data=2,model=4",
        "--text-encoder", "host", "--text-tokens", "512")
    own = tmp_path / "own.yaml"
    own.write_text(STRATEGY.read_text().replace("hardware: v6e-8", "hardware: {name: v6e-8, host_flops: 2.0e+12}"))
    assert "text encoder on the host" not in line(str(own)) and "FITS" in line(str(own))
