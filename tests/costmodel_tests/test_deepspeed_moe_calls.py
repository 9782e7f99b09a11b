"""DeepSpeed's dropless MoE layer: the collectives one layer runs over its ep group, counted in
real processes, against what the step-time model charges.

Oracle: two real gloo processes running `deepspeed.moe.layer.MoE` (4 experts, top-2, ep 2,
drop_tokens off as the built-in workload builds it) forward and backward, every
`deepspeed.comm` call counted; and the model's ep time of one layer worked out by hand from
the collective formulas' latency and bandwidth constants.
"""

from __future__ import annotations

import collections
import os
from typing import Any

import numpy as np
import pytest
import torch
import torch.multiprocessing as mp

from autotune.costmodel.constants import constants_for
from autotune.costmodel.step_time import estimate_time
from autotune.frameworks.deepspeed import DeepSpeed
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.runners.local import free_port
from autotune.specs.inputs import load_config

CALLS = ("all_reduce", "all_to_all_single", "all_gather_into_tensor", "broadcast", "reduce")


def _count(rank: int, port: int, queue: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE="2", LOCAL_RANK=str(rank))
    torch.set_num_threads(1)
    import deepspeed
    import deepspeed.comm as comm
    from deepspeed.moe.layer import MoE

    deepspeed.init_distributed(dist_backend="gloo")
    counts: collections.Counter[str] = collections.Counter()
    def counting(name: str, call: Any) -> Any:
        def counted(*args: Any, **kwargs: Any) -> Any:
            counts[name] += 1
            return call(*args, **kwargs)

        return counted

    for name in CALLS:
        setattr(comm, name, counting(name, getattr(comm, name)))
    expert = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(),
                                 torch.nn.Linear(32, 16))
    moe = MoE(16, expert, num_experts=4, ep_size=2, k=2, drop_tokens=False, use_rts=False,
              top2_2nd_expert_sampling=False)
    moe.set_deepspeed_parallelism()
    counts.clear()
    out, aux, _ = moe(torch.randn(2, 8, 16, requires_grad=True))
    forward = dict(counts)
    (out.sum() + aux).backward()  # type: ignore[no-untyped-call]
    queue.put((forward, dict(counts)))


@pytest.fixture(scope="module")
def counted() -> list[tuple[dict[str, int], dict[str, int]]]:
    queue = mp.get_context("spawn").SimpleQueue()
    mp.spawn(_count, args=(free_port(), queue), nprocs=2)
    return [queue.get(), queue.get()]


def test_one_layer_runs_one_capacity_all_reduce_and_four_all_to_alls(counted: Any) -> None:
    """Every rank: forward one all-reduce (the capacity, `moe_capacity_all_reduces`) and two
    all-to-alls (dispatch, combine), the backward two more all-to-alls and nothing else."""
    for forward, step in counted:
        assert forward == {"all_reduce": DeepSpeed.moe_capacity_all_reduces,
                           "all_to_all_single": 2}
        assert step == {"all_reduce": DeepSpeed.moe_capacity_all_reduces,
                        "all_to_all_single": 4}


def test_ep_time_charges_the_calls_deepspeed_makes() -> None:
    """tiny-moe (4 layers, h 256, fp32) on 2 CPU workers, ep 2, mbs 1, 256 tokens, balanced
    routing: per layer and micro-batch, 4 exchanges of the 2 top-2 copies of the tokens'
    fp32 activations, half of them to the other rank (latency base + one step, bytes at the
    all-to-all's bandwidth), and one all-reduce of an 8-byte count (ring: base + 2 steps)."""
    cfg = load_config("tiny-moe", "local", framework="deepspeed", processes=2)
    k = constants_for(cfg.cluster.gpu).model_copy(update={
        "moe_load_imbalance": 1.0, "latency_base_s": 1e-3, "latency_intra_s": 4e-4,
        "all_to_all_bandwidth": 1.5})
    layout = Layout.derived(2, cfg.train.global_batch_size, ep=2, mbs=1)
    table = LayoutTable.from_layouts([layout])
    bandwidth = cfg.cluster.intra_node_gb_s * 1e9 * k.nvlink_efficiency
    sent = 0.5 * 2 * 256 * 256 * 4  # half of the top-2 copies, fp32
    exchange = 1e-3 + 4e-4 + sent / (bandwidth * 1.5)
    capacity = 1e-3 + 2 * 4e-4 + 8 / bandwidth
    per_layer = 4 * exchange + DeepSpeed.moe_capacity_all_reduces * capacity
    micro = int(table.micro_batches[0])
    parts = estimate_time(cfg, table, k).parts
    assert parts["ep_comm"][0] == pytest.approx(4 * micro * per_layer, rel=1e-6)
    assert np.isfinite(parts["compute"][0])
