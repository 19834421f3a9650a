"""The collectives `meshlab profile` times are the ones XLA's partitioner emits (8 virtual CPU devices).

Each kind is made by resharding an elementwise op's output (meshlab.workers.measure._collective); this
reads the per-device program XLA compiled for it and checks that it holds exactly that collective, over the
intended mesh axis, on the per-chip buffer meshlab's `Collective.bytes` names. Two things XLA's CPU compiler does
that a TPU's does not: it moves bf16 collectives as f32 (so the elements are counted, not the bytes), and it
leaves a reduce-scatter as the partitioner's all-reduce (plus a slice), so a CPU profile's reduce-scatter points
time an all-reduce of the same buffer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

pytestmark = [pytest.mark.xla, pytest.mark.slow]

KINDS = ("all-gather", "all-reduce", "reduce-scatter", "all-to-all", "collective-permute")
ELEMENTS = 2048  # per chip
NBYTES = 2 * ELEMENTS  # in bf16

SCRIPT = r"""
import glob, json, os, sys
import torch
from meshlab.check.hlo import parse_collectives
from meshlab.workers.measure import Device, _collective

dump = sys.argv[1]
mesh = {"data": 2, "model": 4}
dev = Device("xla")
seen, out = set(), {}
for kind in %(kinds)r:
    _collective(mesh, dev, torch.bfloat16, kind, ("model",), %(nbytes)d)
    found = []
    for path in sorted(glob.glob(os.path.join(dump, "*SyncTensorsGraph*after_optimizations.txt"))):
        if path not in seen:
            seen.add(path)
            found += [[c.kind, c.bytes_per_device, [len(g) for g in c.groups], c.result[0].dtype]
                      for c in parse_collectives(open(path).read())]
    out[kind] = found
print(json.dumps(out))
""" % {"kinds": KINDS, "nbytes": NBYTES}


@pytest.fixture(scope="module")
def emitted(tmp_path_factory) -> dict:
    dump = tmp_path_factory.mktemp("hlo")
    env = {**os.environ, "PJRT_DEVICE": "CPU", "CPU_NUM_DEVICES": "8",
           "XLA_FLAGS": f"--xla_dump_to={dump} --xla_dump_hlo_as_text"}
    run = subprocess.run([sys.executable, "-c", SCRIPT, str(dump)], env=env, capture_output=True, text=True,
                         timeout=600, cwd=REPO)
    assert run.returncode == 0, run.stderr[-2000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("kind", KINDS)
def test_the_profile_times_exactly_the_collective_it_names(emitted, kind):
    """One collective of that kind in the program XLA compiled, moving the per-chip buffer asked for, in groups
    of the model axis (4 devices; a permute's source-target pairs are pairs)."""
    from meshlab.check.hlo import ELEMENT_BYTES

    (found,) = emitted[kind]
    assert found[0] == (kind if kind != "reduce-scatter" else "all-reduce")  # XLA CPU: see the module docstring
    assert found[1] == ELEMENTS * ELEMENT_BYTES[found[3]]
    assert set(found[2]) == ({2} if kind == "collective-permute" else {4})
