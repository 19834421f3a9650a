"""How XLA:TPU lays arrays out, and what it allocates for them: the measurements behind meshlab.core.tpu_tiles.

    python benchmarks/tpu_tile_layouts.py > tests/core/data/tpu_layouts.jsonl     # ~35 s here, needs '.[tpu]'

Compiles small jax functions ahead of time for v6e:2x4 (libtpu's compile-only client, no TPU): arrays of 1 to
12,288 elements, 1-D to 5-D, bf16 and f32, each alone (summed), under a dot (a Linear's [out, in] weight), a 1x1
convolution and a depthwise 3x3 one. One JSON line per compile: what the array was used for, the entry
arguments' layouts as the optimized program writes them, and ``memory_analysis().argument_size_in_bytes``.
tests/core/test_tpu_tiles.py holds meshlab's layout reading and its rule to every line.
"""

from __future__ import annotations

import json
import os
import re

os.environ.setdefault("TPU_ACCELERATOR_TYPE", "v6e-8")
os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def main() -> None:
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import topologies
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    devices = sorted(topologies.get_topology_desc(platform="tpu", topology_name="v6e:2x4").devices,
                     key=lambda d: d.id)
    mesh = Mesh(np.array(devices).reshape(1, len(devices)), ("data", "model"))

    def compiled(usage, function, *arrays):
        args = [jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, PartitionSpec()))
                for shape, dtype in arrays]
        c = jax.jit(function).lower(*args).compile()
        text = c.as_text()
        entry = text[text.index("\nENTRY"):]
        layouts = re.findall(r"= (\S+) parameter\(\d+\)", entry[:entry.index("\n}")])
        print(json.dumps({"usage": usage, "arguments": layouts,
                          "argument_bytes": c.memory_analysis().argument_size_in_bytes}), flush=True)

    total = lambda x: jnp.sum(x.astype(jnp.float32))  # noqa: E731
    for dtype in (jnp.bfloat16, jnp.float32):
        for n in (1, 7, 100, 128, 129, 200, 256, 257, 300, 512, 513, 700, 999, 1000, 1024, 1025, 2240, 3072, 9216,
                  12288):
            compiled("alone", total, ((n,), dtype))
        for shape in ((1, 1), (7, 3), (8, 128), (9, 128), (16, 128), (17, 128), (8, 129), (2240, 2240),
                      (3072, 2240), (2240, 3072), (3, 4, 5), (2, 3, 8, 128), (1152, 64), (64, 1152), (1, 2240),
                      (2, 2240), (4, 2240), (16, 2240), (1, 13, 16, 32, 32)):
            compiled("alone", total, (shape, dtype))
    bf16 = jnp.bfloat16
    for out, inner in ((3072, 2240), (2240, 3072), (2240, 2240), (11200, 2240), (2240, 5600), (100, 3072),
                       (3072, 100)):
        compiled("linear", lambda x, w: x @ w.T, ((64, inner), bf16), ((out, inner), bf16))
    for out, inner in ((2240, 2240), (11200, 2240), (2240, 5600)):
        conv = lambda x, w: jax.lax.conv_general_dilated(  # noqa: E731
            x, w, (1, 1), "VALID", dimension_numbers=("NCHW", "OIHW", "NCHW"))
        compiled("conv1x1", conv, ((2, inner, 32, 32), bf16), ((out, inner, 1, 1), bf16))
    for channels in (11200, 2240):
        depthwise = lambda x, w, c=channels: jax.lax.conv_general_dilated(  # noqa: E731
            x, w, (1, 1), "SAME", dimension_numbers=("NCHW", "OIHW", "NCHW"), feature_group_count=c)
        compiled("depthwise3x3", depthwise, ((2, channels, 32, 32), bf16), ((channels, 1, 3, 3), bf16))


if __name__ == "__main__":
    main()
