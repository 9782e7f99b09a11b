"""FP8 delayed scaling's amax all-reduces (`autotune.costmodel.step_time.fp8_amax_s`); oracle:
NCCL's tree all-reduce latency (`src/graph/tuning.cc`, the constants' 8.4 µs base, 3.4 µs per
NVLink hop, 14 µs per network hop) worked out by hand for two per chunk and micro-batch, as
Megatron-Core's `TransformerBlock` (one `fp8_autocast` per model chunk, amax group tp·dp·cp)
and Transformer Engine's `reduce_and_update_fp8_tensors` (`async_op=False`) run them."""

from __future__ import annotations

import numpy as np
import pytest

from autotune.costmodel.constants import Constants
from autotune.costmodel.step_time import fp8_amax_s
from autotune.frameworks import framework_of
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.specs.inputs import load_config

K = Constants()
LAYOUT = "tp=4,pp=8,vpp=12,zero=1,mbs=1,recompute=none,sp=on"


def _amax_s(gpus: int, framework: str = "megatron", **train: object) -> float:
    cfg = load_config("gpt3-175b", f"dgx-h100:{gpus // 8}", framework=framework,
                      seq_length=2048, global_batch_size=2 * gpus, **train)
    layout = Layout.parse(LAYOUT if framework == "megatron" else "zero=1,mbs=1",
                          cfg.world_size, cfg.train.global_batch_size, framework_of(cfg))
    table = LayoutTable.from_layouts([layout])
    return float(fp8_amax_s(cfg, table, K, np.array([12]))[0])


@pytest.mark.parametrize(("gpus", "latency_us"), [
    (128, 8.4 + 2 * (7 * 3.4 + 1 * 14)),   # tp·dp = 4·4 = 16 ranks on 2 nodes: 84.0 µs
    (2048, 8.4 + 2 * (7 * 3.4 + 5 * 14)),  # 4·64 = 256 ranks on 32 nodes: 196.0 µs
])
def test_two_tree_all_reduces_per_chunk_and_micro_batch(gpus: int, latency_us: float) -> None:
    """GPT-3 175B, 12 layers a stage in 12 chunks: 12 · 2 all-reduces of 48 B (forward: 3
    amaxes of 4 B for each of the 4 FP8 GEMMs of one layer) and 32 B (backward), latency-bound
    (the tree beats the ring's 2·15 steps at 16 ranks); the bytes add well under 0.01 %."""
    assert _amax_s(gpus, precision="fp8") == pytest.approx(12 * 2 * latency_us * 1e-6,
                                                           rel=1e-4)


def test_nothing_without_delayed_scaling() -> None:
    """bf16 training and FP8 current scaling (no amax history to reduce) pay nothing; nor does
    a framework that does not reduce amaxes per model chunk (DeepSpeed)."""
    assert _amax_s(128, precision="bf16") == 0.0
    assert _amax_s(128, precision="fp8", fp8_recipe="tensorwise") == 0.0
    assert _amax_s(128, framework="deepspeed", precision="fp8") == 0.0
