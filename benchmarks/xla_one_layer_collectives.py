"""Count the collectives in XLA's partitioned HLO for one Qwen-Image layer planned by a strategy (needs the xla extra).

    python benchmarks/xla_one_layer_collectives.py strategies/2d.yaml /tmp/dump-2d 256 32

Arguments: strategy file, dump folder, image side in pixels, text tokens. 8 virtual CPU devices; prints counts,
bytes (f32 on CPU) and replica groups per kind. A scratch cross-check for the cost model until `meshlab check`
reports per-block counts; the weights are random (collectives do not depend on values).
"""
import os, sys, glob, re, json, collections
strategy_file, outdir, height, text = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
os.environ["PJRT_DEVICE"] = "CPU"; os.environ["CPU_NUM_DEVICES"] = "8"
os.environ["XLA_FLAGS"] = f"--xla_dump_to={outdir} --xla_dump_hlo_as_text"
import numpy as np, torch, torch_xla, torch_xla.runtime as xr
import torch_xla.distributed.spmd as xs
xr.use_spmd()
from diffusers import QwenImageTransformer2DModel
from meshlab.plan.planned import plan_file
planned = plan_file(strategy_file)
plan, strategy = planned.plan, planned.strategy
mesh = xs.Mesh(np.arange(8), plan.mesh.shape, plan.mesh.names)
torch.manual_seed(0)
model = QwenImageTransformer2DModel(num_layers=1).to(torch.bfloat16).eval()
dev = torch_xla.device()
model = model.to(dev)
specs = plan.spec_map()
for name, p in model.named_parameters():
    spec = specs[name]
    if not spec.is_replicated:
        xs.mark_sharding(p, mesh, spec.to_torch_xla())
B = strategy.workload.batch
g = height // 16
hs = torch.randn(B, g * g, 64, dtype=torch.bfloat16).to(dev)
ehs = torch.randn(B, text, 3584, dtype=torch.bfloat16).to(dev)
mask = torch.ones(B, text, dtype=torch.long).to(dev)
t = torch.full((B,), 0.5, dtype=torch.bfloat16).to(dev)
batch_axis = strategy.activations.batch
if batch_axis and plan.mesh.size(batch_axis) > 1:
    xs.mark_sharding(hs, mesh, (batch_axis, None, None))
    xs.mark_sharding(ehs, mesh, (batch_axis, None, None))
with torch.no_grad():
    out = model(hidden_states=hs, encoder_hidden_states=ehs, encoder_hidden_states_mask=mask, timestep=t,
                img_shapes=[(1, g, g)] * B, return_dict=False)[0]
torch_xla._XLAC._xla_warm_up_cache([out], [])
files = sorted(glob.glob(f"{outdir}/*after_optimizations.txt"), key=os.path.getsize)
text_hlo = open(files[-1]).read()
sizes = {"bf16": 2, "f32": 4, "s32": 4, "f16": 2, "pred": 1, "s64": 8, "u32": 4}
found = collections.defaultdict(list)
for line in text_hlo.splitlines():
    m = re.search(r"=\s*(\(?[a-z0-9]+\[[^=]*?)\s+(all-reduce|all-gather|collective-permute|reduce-scatter|all-to-all)(-start)?\(", line)
    if not m:
        continue
    kind = m.group(2)
    shapes = re.findall(r"([a-z0-9]+)\[([0-9,]*)\]", m.group(1))
    nbytes = 0
    for dt, dims in shapes:
        n = 1
        for d in dims.split(","):
            if d: n *= int(d)
        nbytes += n * sizes.get(dt, 4)
    groups = re.search(r"replica_groups=(\{[^}]*\}[^ ,]*|\[[^ ]*)", line)
    found[kind].append((nbytes, groups.group(1)[:40] if groups else ""))
print(json.dumps({k: {"count": len(v), "bytes": [b for b, _ in v], "groups": sorted({g for _, g in v})} for k, v in found.items()}, indent=1))
print("file", files[-1])
