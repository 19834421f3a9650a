"""torchax's attention as meshlab's TPU check replaces it (meshlab.workers.check_tpu.flash_sdpa), run on 8 virtual
CPU devices against torchax's own lowering (torch's reference math): ``python tests/check/flash_kernel_probe.py``
prints one JSON document. The Pallas TPU kernel runs on no CPU, so a stand-in with its signature takes its place: the
same attention in jnp, honouring segment ids, and checking the blocks divide what it is given. Everything around
the kernel is meshlab's: the layout under shard_map, the padding, the segment ids of a mask, the fallbacks, the
op table restored, the module names."""

import json
import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=8"
os.environ["JAX_PLATFORMS"] = "cpu"

import jax  # noqa: E402
import jax.experimental.pallas.ops.tpu.flash_attention as pallas_flash  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

kernel_calls = []


def stand_in(q, k, v, ab=None, segment_ids=None, *, causal=False, sm_scale=1.0, block_sizes=None, debug=False):
    assert q.shape[2] % block_sizes.block_q == 0 and k.shape[2] % block_sizes.block_k_major == 0
    kernel_calls.append([list(q.shape), list(k.shape), segment_ids is not None])
    s = jnp.einsum("bhqd,bhkd->bhqk", q.astype(jnp.float32), k.astype(jnp.float32)) * sm_scale
    if segment_ids is not None:
        same = segment_ids.q[:, None, :, None] == segment_ids.kv[:, None, None, :]
        s = jnp.where(same, s, -0.7 * float(np.finfo(np.float32).max))
    return jnp.einsum("bhqk,bhkd->bhqd", jax.nn.softmax(s, axis=-1), v.astype(jnp.float32)).astype(q.dtype)


pallas_flash.flash_attention = stand_in

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from collections import Counter  # noqa: E402
from jax.sharding import Mesh  # noqa: E402

from meshlab.plan.attention_kernel import KernelLayout  # noqa: E402
from meshlab.workers.check_tpu import flash_sdpa, jax_scopes  # noqa: E402
from meshlab.workers.libtpu import import_torchax, sdpa_replaced  # noqa: E402

torchax, interop = import_torchax()
env = torchax.default_env()
mesh = Mesh(np.array(jax.devices()).reshape(2, 2, 2), ("data", "model", "ring"))
own = env._ops[F.scaled_dot_product_attention]


def reference(*args):
    return own.func(*args, env=env)


rng = np.random.default_rng(0)
RING = KernelLayout(("data",), ("model",), ("ring",))


def case(layout, q_shape, k_len, mask=None, key_batch=None):
    """Max error against the reference math, and how the call ran."""
    batch, heads, queries, dim = q_shape
    tally, kernel_calls[:] = Counter(), []
    make = flash_sdpa(mesh, {"a": layout}, lambda: "a", interop, reference, tally)
    q = jnp.asarray(rng.standard_normal(q_shape), jnp.float32)
    k, v = (jnp.asarray(rng.standard_normal((key_batch or batch, heads, k_len, dim)), jnp.float32) for _ in "kv")
    with env:
        tq, tk, tv = (interop.torch_view(x) for x in (q, k, v))
        tm = interop.torch_view(jnp.asarray(mask)) if mask is not None else None
        out = interop.jax_view(make(tq, tk, tv, attn_mask=tm))
        truth = interop.jax_view(reference(tq, tk, tv, tm, 0.0, False, None, False))
    return {"error": float(jnp.max(jnp.abs(out - truth))), "calls": dict(tally), "kernel": list(kernel_calls)}


def keep(shape):
    kept = rng.random(shape) < 0.6
    kept[..., 0] = True  # every query keeps a key
    return kept


cases = {
    "blocks divide": case(RING, (2, 2, 256, 16), 256),
    "queries and keys padded": case(RING, (2, 2, 400, 16), 400),
    "queries padded": case(RING, (2, 2, 300, 16), 256),
    "keys padded": case(RING, (2, 2, 256, 16), 300),
    "boolean mask": case(RING, (2, 2, 256, 16), 256, keep((2, 1, 1, 256))),
    "boolean mask of one sample": case(RING, (2, 2, 256, 16), 256, keep((1, 1, 1, 256))),
    "boolean mask and padding": case(KernelLayout(("data",), ("model",), ()), (4, 4, 300, 16), 333,
                                     keep((1, 1, 1, 333))),
    "additive mask over heads": case(RING, (2, 2, 256, 16), 256,
                                     np.broadcast_to(np.where(keep((2, 1, 1, 256)), 0.0, -10000.0),
                                                     (2, 2, 1, 256)).astype(np.float32)),
    "a batch no axis divides": case(RING, (1, 2, 256, 16), 256, keep((1, 1, 1, 256))),
    "integer mask": case(RING, (2, 2, 256, 16), 256, keep((2, 1, 1, 256)).astype(np.int64)),
    "a mask per query": case(RING, (2, 2, 256, 16), 256, keep((2, 1, 256, 256))),
    "keys of another batch": case(RING, (2, 2, 256, 16), 256, key_batch=1),
    "a head dim of 192": case(RING, (2, 2, 256, 192), 256),
}


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.Identity()

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(self.norm(q), k, v)


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.attn, self.other = Attention(), Attention()

    def forward(self, q, k, v):
        return self.attn(q, k, v) + self.other(q, k, v)


model = Model()
scopes, tally = jax_scopes(model), Counter()


def run(q, k, v):
    with env, scopes:
        return interop.jax_view(model(*(interop.torch_view(x) for x in (q, k, v))))


x = jnp.ones((2, 2, 256, 16))
with sdpa_replaced(env, lambda ref: flash_sdpa(mesh, {"attn": RING}, scopes.current, interop, ref, tally)):
    jax.jit(run).lower(x, x, x)
print(json.dumps({"cases": cases, "planned_modules": dict(tally),
                  "restored": env._ops[F.scaled_dot_product_attention] is own, "names_left": scopes.names}))
