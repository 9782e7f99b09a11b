"""ZeRO-3's gathers and reduce-scatters (`autotune.costmodel.zero3`) against DeepSpeed's own
configuration object and against traffic worked out by hand from DeepSpeed's coordinator rules
(runtime/zero/partitioned_param_coordinator.py: one all-gather per weight, prefetch within
stage3_max_live_parameters, reuse within stage3_max_reuse_distance)."""

from __future__ import annotations

import numpy as np
import pytest
from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

from autotune.costmodel.constants import Constants
from autotune.costmodel.estimate import evaluate
from autotune.costmodel.terms import terms_for
from autotune.exceptions import AutotuneError
from autotune.frameworks import framework_of
from autotune.frameworks.deepspeed import config
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.specs.inputs import load_config

K = Constants()


def _zero3_s(cfg, text: str) -> float:
    layout = Layout.parse(text, cfg.world_size, cfg.train.global_batch_size, framework_of(cfg))
    values = evaluate(cfg, LayoutTable.from_layouts([layout]), K)
    return float(values.time.parts["zero3_gather"][0])


def _slow_network(cfg, gb_s: float = 0.001):
    cluster = cfg.cluster.model_copy(update={"inter_node_gb_s": gb_s})
    return cfg.model_copy(update={"cluster": cluster})


@pytest.mark.parametrize("overlap", [True, False])
def test_the_fetch_limits_are_those_deepspeed_reads_from_the_rendered_config(
        overlap: bool) -> None:
    """Oracle: DeepSpeed's DeepSpeedZeroConfig parsing the rendered ds_config.json: its
    overlap_comm, stage3_prefetch_bucket_size, stage3_max_live_parameters, default
    stage3_max_reuse_distance and reduce_bucket_size are what the model's coordinator uses."""
    cfg = load_config("llama3-70b", "dgx-h100:4", framework="deepspeed", seq_length=1024,
                      global_batch_size=32, overlap_grad_reduce=overlap)
    layout = Layout.parse("zero=3,mbs=1,recompute=full", 32, 32, framework_of(cfg))
    zero = DeepSpeedZeroConfig(**config(cfg, layout)["zero_optimization"])
    table = LayoutTable.from_layouts([layout])
    params = np.array([float(cfg.model.num_params())])
    fetch = terms_for(cfg).zero3_fetch(cfg, table, params)
    assert fetch.per_module
    assert fetch.overlap == zero.overlap_comm == overlap
    assert float(np.asarray(fetch.prefetch_numel).item()) == zero.prefetch_bucket_size
    assert fetch.max_live_numel == zero.max_live_parameters
    assert fetch.max_reuse_numel == zero.max_reuse_distance
    assert int(np.asarray(fetch.reduce_bucket_numel).item()) == zero.reduce_bucket_size


def test_wide_layers_run_past_the_live_limit_without_prefetch() -> None:
    """Oracle: DeepSpeed's prefetch room, min(stage3_max_live_parameters − available,
    prefetch bucket), is none after a module of 1e9 parameters or more. In a 530B-wide layer
    (h 20,480, MLP 81,920) up and down hold 1.68e9 each: down's gather and the next layer's q
    cannot start before the module that needs them, so each forward pass exposes at least
    their two gathers per layer (ring bytes over 8 NICs, NCCL's ring latency), however long
    the compute they would hide under."""
    cfg = load_config("gpt3-175b", "dgx-a100:8", framework="deepspeed", seq_length=2048,
                      global_batch_size=256)
    model = cfg.model.model_copy(update={"hidden_size": 20480, "num_attention_heads": 128,
                                         "ffn_hidden_size": 81920, "num_layers": 8})
    cfg = cfg.model_copy(update={"model": model})
    ranks, nodes, h = 64, 8, 20480
    latency = 8.4e-6 + (ranks - nodes) * 3.4e-6 + (nodes - 1) * 14e-6

    def gather(params: float) -> float:
        return latency + (ranks - 1) / ranks * 2 * params / (8 * 25e9 * K.comm_efficiency)

    unhidden = 8 * (gather(4 * h * h) + gather(h * h))  # down and the next q, every layer
    assert _zero3_s(cfg, "zero=3,mbs=4,recompute=none") >= unhidden


def _llama70b_moved(ranks: int) -> float:
    """Bytes one GPU moves per micro-batch under DeepSpeed's coordinator for Llama 3 70B with
    full recompute (see test_llama3_70b_moves_what_deepspeed_gathers_and_reuses)."""
    h, f, q, kv = 8192, 28672, 8192 * 64 * 128, 8192 * 8 * 128
    layer = 2 * q + 2 * kv + 3 * h * f
    gathered = 2 * layer + (2 * q + 2 * kv)
    edges = 2 * 128256 * h + 2 * 80 * h + h
    return 2 * (80 * (gathered + layer) + 2 * edges) * (ranks - 1) / ranks


def test_llama3_70b_moves_what_deepspeed_gathers_and_reuses() -> None:
    """Oracle: the bytes of DeepSpeed's coordinator worked out by hand for Llama 3 70B (h 8192,
    64 query and 8 key/value heads of 128, SwiGLU 28,672) with full recompute, one micro-batch,
    on 16 GPUs whose network runs 1 MB/s, so nothing hides and the bus bandwidth is 8 NICs ·
    1 MB/s · comm_efficiency. Per layer the forward and the recompute gather q, k, v, o, gate,
    up and down (8.557e8 parameters each); the backward gathers again only q, k, v and o: down,
    up and gate are used again within 2 · 4.70e8 < 1e9 parameters of the trace
    (stage3_max_reuse_distance) and stay, o is not (2 · 7.05e8 > 1e9). Gradients are
    reduce-scattered once, bf16. Embedding and output layer: one gather and one
    reduce-scatter each step."""
    cfg = _slow_network(load_config("llama3-70b", "dgx-h100:2", framework="deepspeed",
                                    seq_length=1024, global_batch_size=16))
    h, f, q, kv = 8192, 28672, 8192 * 64 * 128, 8192 * 8 * 128
    assert 2 * q + 2 * kv + 3 * h * f == pytest.approx(8.557e8, rel=1e-3)
    expected = _llama70b_moved(16) / (8 * 0.001e9 * K.comm_efficiency)
    assert _zero3_s(cfg, "zero=3,mbs=1,recompute=full") == pytest.approx(expected, rel=0.01)


def test_without_overlap_comm_nothing_hides() -> None:
    """Oracle: DeepSpeed's parameter_offload.py runs ZeRO-3's gathers on the default (compute)
    stream unless overlap_comm. On the DeepCompile benchmark's setup (Llama 3 70B, 32 H100 in
    4 nodes, 1,024 tokens, full recompute) the step then pays at least the traffic worked out
    by hand over the ring's bus bandwidth (8 NICs of 50 GB/s · comm_efficiency, below NVLink's
    450 · 0.8), on top of the compute; with overlap_comm part of it hides."""
    base = load_config("llama3-70b", "dgx-h100:4", framework="deepspeed", seq_length=1024,
                       global_batch_size=32)
    serial = base.model_copy(update={"train": base.train.model_copy(
        update={"overlap_grad_reduce": False})})
    layout = "zero=3,mbs=1,recompute=full"
    floor = _llama70b_moved(32) / (8 * 50e9 * K.comm_efficiency)
    assert _zero3_s(serial, layout) >= floor
    assert _zero3_s(base, layout) < _zero3_s(serial, layout)


def test_list_collectives_of_deepspeed_2021_pay_one_copy_per_rank() -> None:
    """Oracle: DeepSpeed v0.4.0's `partition_parameters.py` (`_allgather_param` gathers into a
    list of one view per rank; `_reduce_scatter_gradients` reduce-scatters each parameter from a
    list of one slice per rank) and PyTorch's `ProcessGroupNCCL`, which copies every rank's
    slice out of (all-gather) or into (reduce-scatter) its flat buffer. Worked out by hand for
    GPT-3 175B on 64 A100 without overlap_comm and without recompute, one micro-batch: each of
    the 96 layers gathers its 6 weight tensors (q, k, v, o, up, down) for the forward and again
    for the backward and reduce-scatters their 6 gradients, 18 list collectives, plus the
    embedding's gather and reduce-scatter: (96 · 18 + 2) · 64 ranks · eager_op_s (1e-5 s) =
    1.1072 s more than the same collectives without the copies. Today's DeepSpeed (the flag
    off) pays none of it; Megatron has no such release."""
    base = load_config("gpt3-175b", "dgx-a100:8", framework="deepspeed", seq_length=2048,
                       global_batch_size=64, overlap_grad_reduce=False)
    old = base.model_copy(update={"train": base.train.model_copy(
        update={"zero3_list_collectives": True})})
    layout = Layout.parse("zero=3,mbs=1,recompute=none", 64, 64, framework_of(base))
    table = LayoutTable.from_layouts([layout])

    def zero3(cfg, k: Constants) -> float:
        return float(evaluate(cfg, table, k).time.parts["zero3_gather"][0])

    free = K.model_copy(update={"eager_op_s": 0.0})
    assert zero3(old, K) - zero3(old, free) == pytest.approx((96 * 18 + 2) * 64 * 1e-5)
    assert zero3(base, K) == pytest.approx(zero3(base, free))
    with pytest.raises(AutotuneError, match="zero3_list_collectives True is DeepSpeed"):
        load_config("gpt3-175b", "dgx-a100:8", seq_length=2048, global_batch_size=64,
                    zero3_list_collectives=True)


def test_pytorch_fsdp_recompute_reuses_the_backward_gather() -> None:
    """Oracle: torchtitan applies activation checkpointing to each block before `fully_shard`
    wraps it, and LLM Foundry (Composer's `prepare_fsdp_module`) wraps FSDP units before
    checkpointing their blocks: the recompute runs inside the unit's pre-backward gather, so a
    full recompute gathers nothing more. Megatron-FSDP's hooks run again inside the layer's
    checkpoint: one more gather per layer. On a network slow enough that every gather is
    exposed, PyTorch FSDP's full recompute costs what no recompute costs, while Megatron-FSDP's
    costs a third more gathers (3 per layer against 2, with one reduce-scatter)."""
    base = load_config("llama3-8b", "dgx-h100:2", framework="megatron", seq_length=4096,
                       global_batch_size=16)

    def gathers(stack: str, recompute: str) -> float:
        train = base.train.model_copy(update={"stack": stack})
        cfg = _slow_network(base.model_copy(update={"train": train}))
        return _zero3_s(cfg, f"zero=3,mbs=1,recompute={recompute}")

    assert gathers("pytorch", "full") == pytest.approx(gathers("pytorch", "none"), rel=0.01)
    assert gathers("megatron-core", "full") > 1.2 * gathers("megatron-core", "none")
