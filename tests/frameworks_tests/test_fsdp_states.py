"""Model states of PyTorch FSDP's full sharding against a real FSDP2 run: two gloo ranks
(torchrun) `fully_shard` a two-layer model under bf16 mixed precision with fp32 reduction (as
torchtitan and LLM Foundry train) and take one AdamW step; each rank's parameter, gradient and
optimizer-state storage is what the framework's `state_bytes` charges per GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from autotune.costmodel.terms import Zero3Live
from autotune.costmodel.terms import terms_for
from autotune.frameworks import framework_of
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.specs import AutotuneConfig
from autotune.specs import TrainSpec
from autotune.specs.inputs import load_cluster
from autotune.specs.inputs import load_model

WORKER = """
import json, os, sys, torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
dist.init_process_group("gloo")
mesh = init_device_mesh("cpu", (dist.get_world_size(),))
model = torch.nn.Sequential(*(torch.nn.Linear(256, 256, bias=False) for _ in range(2)))
policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
for layer in model:
    fully_shard(layer, mesh=mesh, mp_policy=policy)
fully_shard(model, mesh=mesh, mp_policy=policy)
optimizer = torch.optim.AdamW(model.parameters())
model(torch.randn(8, 256)).float().sum().backward()
optimizer.step()
local = lambda t: t.to_local().untyped_storage().nbytes()
out = {"numel": sum(p.numel() for p in model.parameters()),
       "weights": sum(local(p) for p in model.parameters()),
       "gradients": sum(local(p.grad) for p in model.parameters()),
       "optimizer": sum(local(v) for s in optimizer.state.values() for v in s.values()
                        if torch.is_tensor(v) and v.dim() > 0)}
if dist.get_rank() == 0:
    print("STATES " + json.dumps(out))
dist.destroy_process_group()
"""


def _fsdp2_states(tmp_path: Path) -> dict[str, int]:
    script = tmp_path / "fsdp2_states.py"
    script.write_text(WORKER)
    run = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc_per_node", "2", str(script)],
                         capture_output=True, text=True, timeout=300, check=False)
    lines = [line for line in run.stdout.splitlines() if line.startswith("STATES ")]
    assert run.returncode == 0 and lines, run.stderr[-2000:]
    states: dict[str, int] = json.loads(lines[0].removeprefix("STATES "))
    return states


def test_fully_sharded_fsdp_holds_what_fsdp2_allocates(tmp_path: Path) -> None:
    """Each rank holds its fp32 parameter shard (the optimizer steps it: no master copy), its
    fp32 gradient shard and AdamW's two fp32 moments: 16 B per parameter over the 2 ranks,
    where DeepSpeed's ZeRO-3 holds 18 (a 16-bit shard beside the fp32 master)."""
    measured = _fsdp2_states(tmp_path)
    cfg = AutotuneConfig(model=load_model("llama3-8b"), cluster=load_cluster("dgx-h100:1"),
                         train=TrainSpec(seq_length=1024, global_batch_size=16,
                                         framework="deepspeed", stack="pytorch"))
    layout = Layout.parse("zero=3,mbs=1,recompute=none", 8, 16, framework_of(cfg))
    table = LayoutTable.from_layouts([layout])
    params = np.array([float(measured["numel"])])
    states = terms_for(cfg).state_bytes(cfg, table, params, Zero3Live.none(1), shard=np.array([2]))
    for part in ("weights", "gradients", "optimizer"):
        assert float(states[part][0]) == pytest.approx(measured[part]), part
    deepspeed = cfg.model_copy(update={"train": cfg.train.model_copy(update={"stack": None})})
    ds = terms_for(deepspeed).state_bytes(deepspeed, table, params, Zero3Live.none(1),
                                          shard=np.array([2]))
    assert sum(float(ds[p][0]) for p in ("weights", "gradients", "optimizer")) == (
        pytest.approx(18 * measured["numel"] / 2))
