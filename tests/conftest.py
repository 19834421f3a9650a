"""Shared fixtures: a small synthetic model card (pure, no torch) shaped like one Qwen-Image block."""

from __future__ import annotations

import contextlib
import ctypes
import gc
import os
import tempfile
import textwrap
from pathlib import Path

import pytest

from meshlab.models.card import Architecture, Attention, Component, Flow, ModelCard, Modulation, Parameter

REPO = Path(__file__).resolve().parents[1]
STRATEGIES = sorted((REPO / "strategies").glob("*.yaml"))

# XLA:TPU compile times a developer measured (meshlab.plan.compile_times) would change the time to first image of
# the shipped strategies: the tests (and every process they start) keep theirs in a file of their own.
os.environ["MESHLAB_COMPILE_TIMES"] = str(Path(tempfile.mkdtemp(prefix="meshlab-test-")) / "compile-times.json")
# meshlab's own cache (the tiny pipeline `run --checkpoint tiny` builds) is the tests' own too: nothing a developer's
# ~/.cache/meshlab holds from another version is read back.
os.environ["MESHLAB_CACHE"] = tempfile.mkdtemp(prefix="meshlab-test-cache-")
# A test's console is a fresh process's, not a terminal, whatever ran the tests: pytest-xdist's workers run with
# COLUMNS=80 and LINES=24 set, which made rich print at 80 columns. A test that wants a width sets its own.
for _name in ("COLUMNS", "LINES"):
    os.environ.pop(_name, None)


@pytest.fixture(autouse=True)
def _one_memory_test_at_a_time(request):
    """README.md's command runs the test files over two pytest-xdist workers; the tests marked ``memory``, which
    hold more than 5 GiB of host memory at their peak, take a lock the workers share first, so that no two run at
    once (a worker that reaches one while the other runs one waits). Measured alone (the machine's used memory,
    sampled every 0.5 s, less what it used before): tests/parallelisms/test_scan.py 11.8 GiB, the live checks of
    tests/cost/test_collectives_vs_xla.py 7.9 GiB, docs' ``check --backend dtensor`` 7.1 GiB (8 ranks, each building
    the full-width block), tests/cost/test_pipeline_time.py's VAE decodes 7.0 GiB; the next largest 3.7 GiB (a
    full-width block on 8 XLA devices, tests/check/test_apply_check.py). Unlocked, the suite took this 23 GiB machine
    to 19.1 GiB used. (pytest-xdist's ``--dist loadgroup`` would do it by scheduling, but its 3.8
    sets a test id pytest 9.2 no longer reads, and groups nothing.)"""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")  # the same in every worker of one run
    if request.node.get_closest_marker("memory") is None or run is None:
        yield
        return
    from filelock import FileLock

    with FileLock(Path(tempfile.gettempdir()) / f"meshlab-tests-{run}-memory.lock"):
        yield
        # what the test held in this process (the VAE decodes run in it) goes back to the system before the next
        # takes the lock: glibc keeps freed heap (after tests/cost/test_pipeline_time.py's decodes a process held
        # 3562 MiB, 930 MiB once trimmed; with it kept, a run reached 19.8 GiB used with the lock)
        gc.collect()
        with contextlib.suppress(OSError, AttributeError):  # not glibc: nothing to trim
            ctypes.CDLL("libc.so.6").malloc_trim(0)


def _linear(name: str, out: int, inp: int, stream: str, block: int | None) -> list[Parameter]:
    return [Parameter(f"{name}.weight", (out, inp), "bfloat16", "linear", stream, block),
            Parameter(f"{name}.bias", (out,), "bfloat16", "linear", stream, block)]


def small_card(width: int = 64, heads: int = 4, blocks: int = 2) -> ModelCard:
    """Two dual-stream blocks of width 64: modulation (6 chunks), q/k/v, out, MLP per stream, plus norms."""
    params = _linear("img_in", width, 16, "image", None) + _linear("txt_in", width, 16, "text", None)
    attention = []
    for b in range(blocks):
        p = f"transformer_blocks.{b}"
        for s, stream in (("img", "image"), ("txt", "text")):
            params += _linear(f"{p}.{s}_mod.1", 6 * width, width, "conditioning", b)
        for name in ("to_q", "to_k", "to_v"):
            params += _linear(f"{p}.attn.{name}", width, width, "image", b)
        for name in ("add_q_proj", "add_k_proj", "add_v_proj"):
            params += _linear(f"{p}.attn.{name}", width, width, "text", b)
        params.append(Parameter(f"{p}.attn.norm_q.weight", (width // heads,), "bfloat16", "norm", "image", b))
        params += _linear(f"{p}.attn.to_out.0", width, width, "image", b)
        params += _linear(f"{p}.attn.to_add_out", width, width, "text", b)
        for s, stream in (("img", "image"), ("txt", "text")):
            params += _linear(f"{p}.{s}_mlp.net.0.proj", 4 * width, width, stream, b)
            params += _linear(f"{p}.{s}_mlp.net.2", width, 4 * width, stream, b)
        attention.append(Attention(f"{p}.attn", heads, width // heads, ("text", "image"),
                                   tuple(f"{p}.attn.{n}" for n in ("to_q", "to_k", "to_v", "add_q_proj", "add_k_proj", "add_v_proj")),
                                   (f"{p}.attn.to_out.0", f"{p}.attn.to_add_out")))
    params += _linear("proj_out", 16, width, "image", None)
    arch = Architecture(hidden_size=width, num_layers=blocks, num_attention_heads=heads,
                        attention_head_dim=width // heads, patch_size=2, in_channels=16, text_dim=16,
                        vae_scale_factor=8, mlp_ratio=4.0)
    components = (Component("vae", "AutoencoderKL", 1000, "bfloat16", 10.0),
                  Component("text_encoder", "Encoder", 5000, "bfloat16"))
    return ModelCard("small", "SmallModel", {"preset": "test"}, arch, tuple(params), tuple(attention), components,
                     small_dataflow(width))


def small_dataflow(width: int) -> tuple[Flow, ...]:
    """The dataflow the importer traces from a Qwen-Image forward, for the small card's module names."""
    b = "transformer_blocks.*"
    flows = [Flow("img_in", ("input:hidden_states",), residual=True),
             Flow("txt_in", ("input:encoder_hidden_states",), residual=True)]
    for s, stream in (("img", "image"), ("txt", "text")):
        flows.append(Flow(f"{b}.{s}_mod.1", ("input:timestep",), residual=True, modulates=(
            Modulation(f"{b}.{s}_norm1", stream, width), Modulation(f"{b}.{s}_norm2", stream, width))))
    for s, names in (("img", ("to_q", "to_k", "to_v")), ("txt", ("add_q_proj", "add_k_proj", "add_v_proj"))):
        stream = "image" if s == "img" else "text"
        flows += [Flow(f"{b}.attn.{n}", (f"linear:{b}.{s}_mod.1", f"norm:{b}.{s}_norm1|{stream}"), f"{b}.attn")
                  for n in names]
    flows += [Flow(f"{b}.attn.{n}", (f"attention:{b}.attn",), residual=True) for n in ("to_out.0", "to_add_out")]
    for s, stream in (("img", "image"), ("txt", "text")):
        flows += [Flow(f"{b}.{s}_mlp.net.0.proj", (f"linear:{b}.{s}_mod.1", f"norm:{b}.{s}_norm2|{stream}")),
                  Flow(f"{b}.{s}_mlp.net.2", (f"linear:{b}.{s}_mlp.net.0.proj",), residual=True)]
    flows.append(Flow("proj_out", ("norm:norm_out.norm|image",), residual=True))
    return tuple(flows)


@pytest.fixture
def card() -> ModelCard:
    return small_card()


@pytest.fixture
def write_strategy(tmp_path):
    """Write a strategy YAML (dedented) and return its path."""

    def write(text: str, name: str = "s.yaml") -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(text), encoding="utf-8")
        return path

    return write
