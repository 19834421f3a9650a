"""When does XLA:TPU run a matmul as a collective matmul? The source of the catalog's
`collective_matmul_flop_per_byte` (v6e).

    python benchmarks/collective_matmul_probe.py            # the brackets the catalog figure rests on (about 1 min)
    python benchmarks/collective_matmul_probe.py ag 4096 3072 12288        # over 4 chips
    python benchmarks/collective_matmul_probe.py ag 4096 3072 49152 2      # over 2 chips (a 4x2 mesh)
    python benchmarks/collective_matmul_probe.py --system v5e-8            # bisect where v5e switches (minutes)

Each probe compiles ONE bf16 matmul ahead of time for v6e:2x4 with libtpu's compile-only client (no TPU needed:
`pip install -e '.[tpu]'`) and counts the collectives of the compiled program:

- ag: x[2, M, K] split on K over `model` (4 chips, or the count given), w[K, N] split on N, output split on N (a
  column-parallel Linear whose input arrives split): an all-gather of x, or a collective matmul (permutes);
- rs: x split on K, w split on K, output split on N (a row-parallel Linear whose sum is wanted split): an all-reduce
  (reduce-scatter), or a collective matmul;
- fsdp: x[8, M, K] batch over 8 chips, w split 8 ways on N (an FSDP weight): an all-gather of w, or a collective
  matmul.

The decision is XLA's SPMD partitioner's (GetWindowedEinsumConfiguration, xla/service/spmd/dot_handler.cc) under
libtpu's own cost model, which is private: these probes measure where it switches. With I = the matmul's FLOPs per
chip per byte of the collective it would replace (ag: N / chips; rs: K / chips; fsdp: M, the tokens per chip), it
switched between I = 2432 and 2496 on 4 chips and between 1216 and 1280 on 8, for every M, K and N tried (the helper
notes of issue 25): a threshold of C x 2 / n with C in (4864, 4992]; the catalog takes 4928. Over 2 chips it never
switched, up to I = 24576 (5 times the threshold's extrapolation): meshlab runs no collective matmul over fewer
than 3 chips.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

#: (mode, M, K, N, chips, I, expected): each side of the switch on 4 and on 8 chips, and none on 2
BRACKETS = (("ag", 4096, 3072, 9728, 4, 2432, "all-gather"), ("ag", 4096, 3072, 9984, 4, 2496, "collective-permute"),
            ("rs", 4096, 9728, 3072, 4, 2432, "all-reduce"), ("rs", 4096, 9984, 3072, 4, 2496, "collective-permute"),
            ("fsdp", 1216, 3072, 3072, 8, 1216, "all-gather"),
            ("fsdp", 1280, 3072, 3072, 8, 1280, "collective-permute"),
            ("ag", 4096, 3072, 49152, 2, 24576, "all-gather"), ("rs", 4096, 49152, 3072, 2, 24576, "all-reduce"))


#: the systems probed: catalog name -> (libtpu topology, TPU_ACCELERATOR_TYPE, chips, chip config), as
#: meshlab.runtime.tpu_topology names them (v4 and v5p: megacore, one device a chip)
SYSTEMS = {"v6e-8": ("v6e:2x4", "v6e-8", 8, None), "v5e-8": ("v5e:2x4", "v5litepod-8", 8, None),
           "v5p-8": ("v5p:2x2x1", "v5p-8", 4, "megacore"), "v4-8": ("v4:2x2x1", "v4-8", 4, "megacore")}


def probe(mode: str, m: int, k: int, n: int, chips: int = 4, system: str = "v6e-8") -> dict[str, int]:
    topology, accelerator, total, chip_config = SYSTEMS[system]
    os.environ.update(TPU_ACCELERATOR_TYPE=accelerator, TPU_WORKER_HOSTNAMES="localhost",
                      ALLOW_MULTIPLE_LIBTPU_LOAD="1", TF_CPP_MIN_LOG_LEVEL="3")
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.experimental import topologies
    from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

    config = {"chip_config_name": chip_config} if chip_config else {}
    devices = sorted(topologies.get_topology_desc(platform="tpu", topology_name=topology, **config).devices,
                     key=lambda d: d.id)
    fsdp = mode == "fsdp"
    mesh = Mesh(np.array(devices).reshape((total, 1) if fsdp else (total // chips, chips)), ("data", "model"))

    def spec(*axes):
        return NamedSharding(mesh, P(*axes))

    x = jax.ShapeDtypeStruct((total if fsdp else total // chips, m, k), jnp.bfloat16,
                             sharding=spec("data", None, None if fsdp else "model"))
    w = jax.ShapeDtypeStruct((k, n), jnp.bfloat16, sharding={"ag": spec(None, "model"), "rs": spec("model", None),
                                                             "fsdp": spec(None, "data")}[mode])
    out = spec("data", None, None) if fsdp else spec("data", None, "model")

    def matmul(x, w):
        return jax.lax.with_sharding_constraint(jnp.einsum("bmk,kn->bmn", x, w), out)

    text = jax.jit(matmul).lower(x, w).compile().as_text()
    kinds = ("all-gather", "all-reduce", "reduce-scatter", "collective-permute", "all-to-all")
    return {kind: found for kind in kinds if (found := len(re.findall(rf"\s{kind}(-start)?\(", text)))}


def main(argv: list[str]) -> int:
    system = "v6e-8"
    if argv[:1] == ["--system"]:
        system, argv = argv[1], argv[2:]
    if argv:
        mode, m, k, n, *chips = argv[0], *map(int, argv[1:5])
        print(mode, m, k, n, probe(mode, m, k, n, *chips, system=system))
        return 0
    if system != "v6e-8":
        return bisect_all(system)
    for mode, m, k, n, chips, intensity, expected in BRACKETS:  # one process each: libtpu loads once per process
        done = subprocess.run([sys.executable, __file__, mode, str(m), str(k), str(n), str(chips)],
                              capture_output=True, text=True)
        found = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else done.stderr.strip()[-300:]
        print(f"{mode} on {chips} chips, I = {intensity}: {found} (catalog: {expected})")
    return 0


def _switches(system: str, mode: str, m: int, k: int, n: int, chips: int) -> bool:
    done = subprocess.run([sys.executable, __file__, "--system", system, mode, str(m), str(k), str(n), str(chips)],
                          capture_output=True, text=True)
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    if "{" not in last:
        raise SystemExit(f"{system} {mode} {m}x{k}x{n} over {chips}: {done.stderr.strip()[-300:]}")
    return "collective-permute" in last


def bisect_all(system: str) -> int:
    """On another system: where each mode switches to a collective matmul, over every group size its chips allow
    (4, and 8 where it has 8), as the FLOPs per byte I at the last size without and the first with (the v6e
    brackets' modes and M, K; the varied dim in steps of 128 per chip)."""
    total = SYSTEMS[system][2]
    for chips in [c for c in (4, 8) if c <= total]:
        for mode in ("ag", "rs", "fsdp"):
            if mode == "fsdp" and chips != total:
                continue
            size = {"ag": lambda d: (4096, 3072, d), "rs": lambda d: (4096, d, 3072),
                    "fsdp": lambda d: (d, 3072, 3072)}[mode]
            intensity = (lambda d: d // chips) if mode != "fsdp" else (lambda d: d)
            step = 128 * chips if mode != "fsdp" else 64
            low, high = step, step * 512  # I from 32 to 16384 (fsdp: M from 64 to 32768)
            if not _switches(system, mode, *size(high), chips):
                print(f"{system} {mode} over {chips} chips: no collective matmul up to I = {intensity(high)}")
                continue
            while high - low > step:
                mid = (low + high) // 2 // step * step
                low, high = (low, mid) if _switches(system, mode, *size(mid), chips) else (mid, high)
            print(f"{system} {mode} over {chips} chips: switches between I = {intensity(low)} and {intensity(high)}"
                  f" (threshold x 2 / n: C in ({intensity(low) * chips / 2:.0f}, {intensity(high) * chips / 2:.0f}])",
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
