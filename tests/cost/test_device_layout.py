"""meshlab.cost.device_layout against torch_xla's own layout function and libtpu's device coordinates."""

from __future__ import annotations

import importlib.util
import itertools
import math

import pytest

from meshlab.cost.device_layout import mesh_coordinates
from meshlab.core.hardware import catalog


def tpu_topologies() -> list[tuple[int, ...]]:
    return sorted({tuple(hw.topology) for hw in catalog().values() if hw.kind == "tpu"})


def mesh_shapes(n: int, axes: int = 3) -> list[tuple[int, ...]]:
    """Every ordered way to write n as one to `axes` factors (ones included where a mesh names an idle axis)."""
    if axes == 1:
        return [(n,)]
    shapes = {(n,)}
    for a in (d for d in range(1, n + 1) if n % d == 0):
        shapes.update((a, *rest) for rest in mesh_shapes(n // a, axes - 1))
    return sorted(shapes)


@pytest.mark.skipif(importlib.util.find_spec("torch_xla") is None, reason="needs torch_xla")
@pytest.mark.parametrize("topology", tpu_topologies())
def test_the_port_lays_every_mesh_out_as_torch_xla_does(topology):
    import numpy as np
    from torch_xla.distributed.spmd.xla_sharding import _create_device_mesh_for_nd_torus

    physical = tuple(topology) + (1,) * (3 - len(topology))
    grid = list(itertools.product(*(range(n) for n in physical)))
    ids = np.arange(len(grid)).reshape(physical)  # entry = the row-major index of its own coordinates
    shapes = mesh_shapes(math.prod(topology), 4)  # up to cfg x data x seq x model
    for shape in shapes:
        laid, _ = _create_device_mesh_for_nd_torus(ids, shape, allow_split_physical_axes=True)
        want = [grid[i][:len(topology)] for i in np.asarray(laid).flatten()]
        assert list(mesh_coordinates(shape, topology)) == want, shape
    assert len(shapes) >= 4 or math.prod(topology) == 1


_LIBTPU_CHECK = """
import json, math, os, sys
from meshlab.runtime import tpu_topology
from meshlab.workers import libtpu
from meshlab.workers.check_tpu import hybrid_mesh_ordinals
from meshlab.cost.device_layout import mesh_coordinates
from meshlab.core.hardware import catalog
from tests.cost.test_device_layout import mesh_shapes

os.environ.update(tpu_topology.environment(tpu_topology.topology_of(catalog()["v6e-8"])))
compared, differ = 0, []
for name, hw in sorted(catalog().items()):
    if hw.kind != "tpu" or hw.slices != 1:
        continue
    devices = libtpu.devices(tpu_topology.topology_of(hw))
    for shape in mesh_shapes(hw.chips):
        names = tuple(f"a{i}" for i in range(len(shape)))
        real = [tuple(devices[o].coords)[:len(hw.topology)] for o in hybrid_mesh_ordinals(devices, shape, names, {})]
        compared += 1
        if real != list(mesh_coordinates(shape, tuple(hw.topology))):
            differ.append([name, list(shape)])
print(json.dumps({"compared": compared, "differ": differ}))
"""


@pytest.mark.tpu
@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None or importlib.util.find_spec("torch_xla") is None,
                    reason="needs the tpu and xla extras")
def test_the_port_places_each_mesh_position_on_the_chip_hybrid_mesh_gives_it_over_libtpus_coordinates():
    """libtpu's ahead-of-time devices carry their torus coordinates (and number chips x fastest, not row-major):
    HybridMesh's layout over them puts every mesh position of every single-slice catalog TPU system, in every
    mesh shape, on the chip the cost model's port says."""
    import json
    import subprocess
    import sys

    from tests.conftest import REPO

    done = subprocess.run([sys.executable, "-c", _LIBTPU_CHECK], capture_output=True, text=True, cwd=REPO,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["compared"] > 100 and result["differ"] == [], result


def test_a_mesh_smaller_than_its_slice_takes_the_first_chips_in_row_major_order():
    """A mesh that does not cover the slice (4 of a 2x4 v6e-8's chips) is laid out over the topology row-major:
    the first four positions of (2, 4) are the first row."""
    from meshlab.cost.topology import _layout

    assert _layout((2, 2), (2, 4)) == ((0, 0), (0, 1), (0, 2), (0, 3))
