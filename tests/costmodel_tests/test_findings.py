"""Regression tests for the step-time findings: each reproduces a wrong prediction of the old
model against an oracle worked out by hand here (from the cited source), not by the model."""

from __future__ import annotations

import numpy as np
import pytest

from autotune.calibration.fit import published_points
from autotune.costmodel.collectives import bus_bandwidth
from autotune.costmodel.constants import Constants
from autotune.costmodel.constants import constants_for
from autotune.costmodel.estimate import Estimates
from autotune.costmodel.estimate import evaluate
from autotune.costmodel.flops import model_flops
from autotune.costmodel.kernels import layer_times
from autotune.frameworks import framework_of
from autotune.frameworks import get_framework
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.space.search_space import enumerate_layouts
from autotune.space.search_space import load_space
from autotune.specs.inputs import load_config

K = Constants()


def _evaluate(cfg, text: str, k: Constants | None = None) -> Estimates:
    layout = Layout.parse(text, cfg.world_size, cfg.train.global_batch_size, framework_of(cfg))
    return evaluate(cfg, LayoutTable.from_layouts([layout]), k)


def _part(values: Estimates, name: str) -> float:
    return float(values.time.parts[name][0])


@pytest.mark.parametrize("cp", [2, 4, 8])
def test_context_parallel_moves_attention_work(cp: int) -> None:
    """Oracle: Megatron-LM's FLOP count, whose attention term 6·q·L·B·s² does not depend on cp:
    at s = 65,536 it is 53 % of Llama 3 8B's FLOPs, which the old model divided by cp a second
    time (cp 8 computed 40 % less and showed MFU 68 %). Splitting the sequence over cp GPUs
    moves that work; the FLOPs executed per step stay those of cp 1, and no cp is faster."""
    cfg = load_config("llama3-8b", "dgx-h100:1", seq_length=65536, global_batch_size=8)
    one = _evaluate(cfg, "tp=1,pp=1,cp=1,zero=1,mbs=1,recompute=full")
    many = _evaluate(cfg, f"tp=1,pp=1,cp={cp},zero=1,mbs=1,recompute=full")
    m = cfg.model
    attention = 6 * m.head_dim * m.num_attention_heads * m.num_layers * 8 * 65536**2
    assert attention / model_flops(m, 65536, 8, 128256) == pytest.approx(0.53, abs=0.01)
    assert many.time.flops[0] == pytest.approx(one.time.flops[0], rel=1e-9)
    assert _part(many, "compute") >= 0.97 * _part(one, "compute")
    assert many.mfu[0] <= one.mfu[0] < 0.5


def _slow_network(cfg, gb_s: float = 0.001, gpus_per_node: int | None = None):
    update = {"inter_node_gb_s": gb_s}
    if gpus_per_node:
        update |= {"gpus_per_node": gpus_per_node,
                   "nodes": cfg.cluster.world_size // gpus_per_node}
    return cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update=update)})


def test_ring_attention_passes_kv_three_times_per_step() -> None:
    """Oracle: Megatron's load-balanced ring attention (Transformer Engine
    AttnFuncWithCPAndKVP2P): each of the cp−1 steps sends this rank's K and V forward, and K, V
    with their gradients backward: 3·(cp−1) blocks per layer, a block being s/cp tokens ·
    2 · 8 groups · 128 channels · 2 bytes for Llama 3 8B. On a 1 MB/s network nothing hides
    them, so cp_comm is that volume over the NIC rate (comm_efficiency of 1 MB/s)."""
    cfg = _slow_network(load_config("llama3-8b", "dgx-h100:2", seq_length=65536,
                                    global_batch_size=1))
    values = _evaluate(cfg, "tp=1,pp=1,cp=16,zero=1,mbs=1,recompute=none")
    block = 65536 / 16 * 2 * 8 * 128 * 2
    expected = 32 * 3 * 15 * block / (0.001e9 * K.comm_efficiency)
    assert _part(values, "cp_comm") == pytest.approx(expected, rel=0.01)


def test_ulysses_all_to_alls_move_qkv_and_output() -> None:
    """Oracle: DeepSpeed Ulysses (deepspeed/sequence/layer.py): per layer an all-to-all of q, k,
    v before attention and of the output after it, forward and backward; of each, the share
    (cp − local)/cp goes to other nodes through the GPU's NIC. Llama 3 8B, cp 8 over two
    4-GPU nodes: (32 + 8 + 8 + 32) heads · 128 · 2 B per token, s/cp tokens, half off-node."""
    cfg = _slow_network(load_config("llama3-8b", "dgx-h100:1", seq_length=32768,
                                    global_batch_size=1, framework="deepspeed"),
                        gpus_per_node=4)
    values = _evaluate(cfg, "tp=1,pp=1,cp=8,zero=1,mbs=1,recompute=none")
    per_call = 32768 / 8 * (32 + 8 + 8 + 32) * 128 * 2
    expected = 32 * 2 * (per_call * 4 / 8) / (0.001e9 * K.comm_efficiency)
    assert _part(values, "cp_comm") == pytest.approx(expected, rel=0.01)


def test_zero3_pays_layer_gathers_with_ring_latency_at_scale() -> None:
    """Oracle: NCCL's latency model (src/graph/tuning.cc: ring steps at 3.4 µs over NVLink and
    14 µs across nodes, 8.4 µs base) and the ring's bytes: GPT-3 175B with ZeRO-3 over 1,536
    A100s gathers each layer's 12h² + 13h bf16 weights forward, again for the recompute and
    the backward, and reduce-scatters its gradients: 4 ring collectives per layer and
    micro-batch, each at least its latency and its bytes over 8 NICs. The old model charged 0."""
    cfg = load_config("gpt3-175b", "dgx-a100:192", framework="deepspeed", seq_length=128,
                      global_batch_size=1536)
    values = _evaluate(cfg, "zero=3,mbs=1,recompute=full")
    ranks, nodes, h = 1536, 192, 12288
    latency = 8.4e-6 + (ranks - nodes) * 3.4e-6 + (nodes - 1) * 14e-6
    layer_bytes = 2 * (12 * h * h + 13 * h)
    transfer = (ranks - 1) / ranks * layer_bytes / (8 * 25e9)
    assert _part(values, "zero3_gather") >= 96 * 4 * (latency + transfer)
    assert _part(values, "zero3_gather") > _part(values, "compute")


def test_zero3_slows_with_ranks_at_fixed_work_per_gpu() -> None:
    """Oracle: LLM Foundry's H100 benchmark table (MPT-70B, FSDP FULL_SHARD, same micro-batch
    per GPU): 420, 411 and 400 tokens/s per GPU on 128, 256 and 512 GPUs. The old model gave
    the same 491 TFLOP/s at every size; the ring latency of each layer's gather grows with the
    ranks, so the predicted throughput per GPU must fall with them."""
    points = {p.name: p for p in published_points()}
    rates = []
    for gpus in (128, 256, 512):
        point = points[f"llmfoundry_h100_70b_2048_{gpus}"]
        values = evaluate(point.cfg, point.table, constants_for(point.cfg.cluster.gpu))
        rates.append(float(np.max(values.tokens_per_s)) / gpus)
    assert rates[0] > rates[1] > rates[2]



def test_zero3_rings_reach_the_node_nics_not_one_nic_per_gpu() -> None:
    """Oracle: DeepSpeed's DeepCompile benchmark (data/published_runs.csv, source
    `deepcompile`): eager ZeRO-3 trains Llama 3 70B on 32 H100s (4 nodes) at 395 tokens/s per
    GPU with batch 1 of 1,024 tokens, so a step lasts 1,024 / 395 = 2.59 s. In it each GPU
    gathers the bf16 weights twice (forward, backward) and reduce-scatters the gradients: at
    least 3 · 31/32 · 2 B · 70.55e9 = 410 GB, hence a bus bandwidth of at least 158 GB/s per
    GPU, over three times one 400 Gb/s NIC (50 GB/s). The collectives of a group with 8 GPUs
    on each node must reach that (NCCL's rings use every NIC of the node); one NIC per GPU
    would make the step over 8 s, and SC21's 2021 ZeRO-3 rates (16-21 GB/s per GPU) are not
    what today's DeepSpeed reaches."""
    point = {p.name: p for p in published_points()}["deepcompile_z3_l3_70b_seq1024"]
    k = constants_for(point.cfg.cluster.gpu)
    step = 1024 / 395
    needed = 3 * 31 / 32 * 2 * 70.55e9 / step
    assert needed > 3 * 50e9
    reached = bus_bandwidth(np.array([32]), np.array([8]), point.cfg, k)[0]
    assert reached >= needed
    values = evaluate(point.cfg, point.table, k)
    assert float(np.min(values.time.parts["zero3_gather"])) < step

def test_gradient_reduce_without_accumulation_is_exposed() -> None:
    """Oracle: megatron-core's DDP bucket of max(40M, 1M·dp) parameters (distributed_data_
    parallel.py) and the ring's bytes: Llama 3 8B on 1,024 H100s, one micro-batch per step,
    reduce-scatters 8 buckets of ~1.0e9 fp32 gradients; the last one runs after the backward
    with nothing to hide under: at least (1023/1024)·4.0 GB over 8 NICs of 50 GB/s = 10 ms.
    The old model charged 0 ms."""
    cfg = load_config("llama3-8b", "dgx-h100:128", global_batch_size=1024)
    values = _evaluate(cfg, "tp=1,pp=1,zero=1,mbs=1,recompute=none")
    params = cfg.model.num_params(128256)
    last_bucket = params / np.ceil(params / 1.024e9) * 4
    assert _part(values, "dp_comm") >= 1023 / 1024 * last_bucket / (8 * 50e9)


def test_fp8_speeds_up_only_the_linear_gemms() -> None:
    """Oracle: Transformer Engine's FP8 recipe runs only the Linear layers' GEMMs in FP8; fused
    attention and the memory-bound kernels stay 16-bit, and every GEMM input is cast (more
    bytes, not fewer). The old model ran attention at the FP8 peak too (1.59x on 70B). By
    Amdahl's law the step then gains at most the linear GEMMs' share of the BF16 layer."""
    bf16 = load_config("llama3-70b", "dgx-h100:8", precision="bf16")
    fp8 = load_config("llama3-70b", "dgx-h100:8", precision="fp8")
    text = "tp=8,pp=4,cp=1,zero=1,mbs=1,recompute=none"
    table = LayoutTable.from_layouts(
        [Layout.parse(text, bf16.world_size, bf16.train.global_batch_size,
                      get_framework("megatron"))])
    k = constants_for(bf16.cluster.gpu)
    low, high = layer_times(bf16, table, k), layer_times(fp8, table, k)
    assert high.attention_forward[0] == low.attention_forward[0]
    assert high.memory_forward[0] > low.memory_forward[0]
    share = low.linear_forward[0] / (low.total[0] / 3)
    speedup = _evaluate(bf16, text).step_time_s[0] / _evaluate(fp8, text).step_time_s[0]
    assert 1.0 < speedup < 1 / (1 - share / 2)
    assert speedup < 1.59


def test_no_top_layout_beats_the_best_published_runs() -> None:
    """Oracle: the best published dense bf16 runs on H100 reach 40-55 % MFU (Megatron-LM's H100
    table: 41-48 %; Llama 3: 38-43 %). The old model put a top-10 layout of Llama 3 8B at 64K
    tokens on one DGX H100 at 91.6 % (context parallelism removing work)."""
    cfg = load_config("llama3-8b", "dgx-h100:1", seq_length=65536, global_batch_size=8)
    result = enumerate_layouts(cfg, load_space(None, "megatron"))
    assert np.max(result.estimates.mfu[:10]) < 0.55


def test_megatron_fsdp_pays_for_unfused_gradient_accumulation() -> None:
    """Oracle: Megatron-LM's `validate_args` requires `--no-gradient-accumulation-fusion` with
    `--use-megatron-fsdp` (zero 2-3 here), so each micro-batch adds its 16-bit weight gradients
    into the fp32 main gradients in a separate kernel: worked by hand, 4 extra HBM bytes per
    parameter and micro-batch (2 written + 2 read + 8 read/written, against the fused GEMM's 8).
    Llama 3 8B on 8 H100 at tp1 pp1: every rank holds all 8.03 B parameters; 64 sequences over
    dp 8 at mbs 1 are 8 micro-batches."""
    cfg = load_config("llama3-8b", "dgx-h100:1", seq_length=4096, global_batch_size=64)
    k = constants_for(cfg.cluster.gpu, cfg.train.software_stack)
    fused = _evaluate(cfg, "tp=1,pp=1,cp=1,zero=1,mbs=1,recompute=none", k)
    unfused = _evaluate(cfg, "tp=1,pp=1,cp=1,zero=2,mbs=1,recompute=none", k)
    hbm = cfg.cluster.gpu.hbm_tb_s * 1e12 * k.hbm_efficiency
    extra = 8 * 4 * cfg.model.num_params() / hbm
    assert _part(unfused, "compute") - _part(fused, "compute") == pytest.approx(extra, rel=1e-6)
    deepspeed = cfg.model_copy(update={"train": cfg.train.model_copy(
        update={"framework": "deepspeed", "stack": "megatron-core"})})
    assert _part(_evaluate(deepspeed, "tp=1,pp=1,cp=1,zero=2,mbs=1,recompute=none", k),
                 "compute") == pytest.approx(_part(fused, "compute"))
