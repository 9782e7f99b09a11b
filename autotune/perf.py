"""Predicted step time as named parts, for many layouts at once.

Per micro-batch the slowest pipeline stage runs its GEMMs at a size-dependent fraction of peak
(`gemm_efficiency · x / (x + gemm_half_size)`, x = cube root of the MLP GEMM's M·N·K on one GPU),
memory-bound kernels at HBM speed, and tensor-parallel collectives that are not overlapped.
Context parallelism exchanges K/V around a ring overlapped with attention (Megatron) or
re-partitions heads with all-to-alls (DeepSpeed Ulysses). The 1F1B pipeline adds a bubble of
(p−1)/v micro-batch times and point-to-point sends. Data-parallel gradient reduction is an α-β
hierarchical ring (intra-node, then inter-node on each GPU's NIC) overlapped with the last
backward; ZeRO-3 gathers parameters every micro-batch; offload adds PCIe traffic and the CPU Adam.
"""

from __future__ import annotations

import numpy as np

from autotune.constants import Constants
from autotune.flops import attention_flops_per_token_per_layer
from autotune.flops import dense_flops_per_token_per_layer
from autotune.flops import logits_flops_per_token
from autotune.flops import recompute_flops_fraction
from autotune.frameworks import framework_of
from autotune.layout import LayoutTable
from autotune.memory import layer_activation_bytes
from autotune.sharding import params_on_rank
from autotune.specs import AutotuneConfig

TIME_PARTS = (
    "compute",
    "tp_comm",
    "cp_comm",
    "pp_bubble",
    "pp_p2p",
    "dp_comm",
    "zero3_gather",
    "offload",
    "optimizer",
)
"""Named parts of the predicted step time, in report order."""


def gemm_efficiency(x: np.ndarray, k: Constants) -> np.ndarray:
    """Achieved fraction of peak for a GEMM whose cube-root size is x elements."""
    return k.gemm_efficiency * x / (x + k.gemm_half_size)


def collective_s(
    nbytes: np.ndarray,
    ranks: np.ndarray,
    per_node: np.ndarray,
    factor: float,
    cfg: AutotuneConfig,
    k: Constants,
) -> np.ndarray:
    """Time of a ring collective over `ranks` GPUs, `per_node` of them sharing a node.

    factor is 2 for all-reduce and 1 for reduce-scatter or all-gather; bytes are the full buffer.
    Hierarchical: a ring inside each node, then a ring across nodes on each GPU's own NIC over
    1/per_node of the data; latency α per hop (tree depth across nodes).
    """
    c = cfg.cluster
    local = np.maximum(np.minimum(per_node, ranks), 1)
    nodes = np.maximum(ranks / local, 1)
    intra = factor * (local - 1) / local * nbytes / (c.intra_node_gb_s * 1e9 * k.comm_efficiency)
    inter = (
        factor
        * (nodes - 1)
        / nodes
        * (nbytes / local)
        / (c.inter_node_gb_s * 1e9 * k.comm_efficiency)
    )
    latency = factor * (
        (local - 1) * k.latency_intra_s + np.ceil(np.log2(nodes)) * k.latency_inter_s
    )
    return np.where(ranks > 1, intra + inter + latency, 0.0)


def _link_gb_s(cfg: AutotuneConfig, crosses_node: np.ndarray) -> np.ndarray:
    return np.where(crosses_node, cfg.cluster.inter_node_gb_s, cfg.cluster.intra_node_gb_s) * 1e9


def estimate_time(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> dict[str, np.ndarray]:
    """Step-time parts (s) and `total`, plus `microbatch_s` (one micro-batch, slowest stage)."""
    m, train, c = cfg.model, cfg.train, cfg.cluster
    gpn = c.gpus_per_node
    peak = c.gpu.peak_tflops[train.precision] * 1e12
    hbm = c.gpu.hbm_tb_s * 1e12 * k.hbm_efficiency
    framework = framework_of(cfg)
    micro = t.micro_batches
    s_local = train.seq_length / t.cp
    tokens = t.mbs * s_local  # tokens of one micro-batch on one GPU (before tp splits widths)
    vocab = framework.padded_vocab(m.vocab_size, t.tp)
    split = framework.split_layers(cfg, t.pp, t.vpp)
    layers = split.most

    # compute of one micro-batch on the slowest stage
    x = np.cbrt(tokens * m.hidden_size * (m.ffn / t.tp))
    eff = gemm_efficiency(x, k)
    dense = dense_flops_per_token_per_layer(m)
    attention = attention_flops_per_token_per_layer(m, train.seq_length) / t.cp
    extra = recompute_flops_fraction(m, train.seq_length, t.recompute)
    layer_flops = tokens * (dense + attention) * (1 + extra) / t.tp
    head_flops = tokens * logits_flops_per_token(m, vocab) / t.tp
    on_last = np.where(t.pp == 1, layers, split.last)
    stage_flops = np.maximum(layers * layer_flops, on_last * layer_flops + head_flops)
    elementwise = (
        k.elementwise_passes
        * layer_activation_bytes(cfg, t, traffic=True)
        * (1 + (t.recompute == 2) / 2)
    )
    # the last stage also moves the logits: 16-bit output, fp32 softmax and its gradient
    logits_traffic = k.elementwise_passes * 6 * tokens * vocab / t.tp
    stage_traffic = np.maximum(layers * elementwise, on_last * elementwise + logits_traffic)
    compute_mb = stage_flops / (peak * eff) + stage_traffic / hbm
    backward_mb = compute_mb * 2 / 3

    # tensor parallel: 2 all-reduces (or all-gather + reduce-scatter with sp) forward, 2 backward
    tp_bytes = 2 * tokens * m.hidden_size
    collectives = 4 + 2 * (t.recompute == 2)
    tp_one = collective_s(tp_bytes, t.tp, np.full(len(t), gpn), 2.0, cfg, k)
    tp_mb = layers * collectives * tp_one

    # context parallel
    kv_bytes = (
        2 * t.mbs * s_local * m.head_dim * m.query_groups * 2 / np.minimum(t.tp, m.query_groups)
    )
    cp_link = _link_gb_s(cfg, t.tp * t.cp > gpn) * k.comm_efficiency
    attn_s = tokens * attention / t.tp / (peak * eff)
    if framework.context_parallel == "ring":  # (cp-1) K/V passes forward, twice that backward
        ring = 3 * (t.cp - 1) * kv_bytes / cp_link
        cp_mb = layers * np.maximum(ring - attn_s, 0.0)
    else:  # Ulysses: all-to-all of q, k, v and output, forward and backward
        a2a_bytes = (2 * tokens * m.hidden_size * 2 + 2 * kv_bytes) / t.tp
        cp_mb = layers * 2 * (t.cp - 1) / t.cp * a2a_bytes / cp_link
    cp_mb = np.where(t.cp > 1, cp_mb, 0.0)

    microbatch = compute_mb + tp_mb + cp_mb

    # pipeline: bubble and point-to-point activations
    bubble = np.where(t.pp > 1, (t.pp - 1) / t.vpp * microbatch, 0.0)
    p2p_bytes = 2 * tokens * m.hidden_size / np.where(t.sp, t.tp, 1)
    p2p_link = _link_gb_s(cfg, t.tp * t.cp * t.dp >= gpn) * k.comm_efficiency
    p2p = np.where(t.pp > 1, 2 * micro * t.vpp * (p2p_bytes / p2p_link + k.latency_inter_s), 0.0)

    # data parallel / ZeRO communication over dp (·cp for Megatron) ranks
    params = params_on_rank(m, t, vocab, layers, t.pp == 1, t.pp == 1)
    ranks = t.shard_degree
    per_node = np.maximum(gpn // t.tp, 1)  # the dp·cp group's ranks on one node
    grad_bytes = framework.grad_reduce_bytes(cfg)
    allreduce = collective_s(grad_bytes * params, ranks, per_node, 2.0, cfg, k)
    scatter = collective_s(grad_bytes * params, ranks, per_node, 1.0, cfg, k)
    gather = collective_s(2 * params, ranks, per_node, 1.0, cfg, k)
    hide = k.overlap_fraction * backward_mb if train.overlap_grad_reduce else 0.0
    if framework.zero2_reduces_every_microbatch:
        per_micro = np.where(t.zero == 2, np.maximum(scatter - hide, 0) * (micro - 1), 0.0)
    else:
        per_micro = np.zeros(len(t))
    boundary = np.where(t.zero == 0, allreduce, scatter)
    dp = per_micro + np.maximum(boundary - hide, 0.0)
    dp = dp + np.where((t.zero >= 1) & (t.zero < 3), np.maximum(gather - hide, 0.0), 0.0)
    dp = np.where(ranks > 1, dp, 0.0)

    # ZeRO-3: gather weights forward and backward, reduce-scatter grads, every micro-batch
    zero3 = np.maximum(2 * gather + scatter - k.overlap_fraction * compute_mb, 0.0) * micro
    zero3 = np.where((t.zero >= 3) & (ranks > 1), zero3, 0.0)

    # offload: grads down and weights up over PCIe, Adam on the CPU (all ranks of a node share it)
    shard = params / np.where(t.zero >= 1, ranks, 1)
    pcie = c.pcie_gb_s * 1e9
    offload = np.where(
        t.offload >= 1,
        (grad_bytes + 2) * shard / pcie + shard * gpn / k.cpu_adam_params_per_s,
        0.0,
    ) + np.where(t.offload == 2, micro * 2 * 2 * shard / pcie, 0.0)

    # GPU optimizer: read/write fp32 master, m, v (24 B), read grads (4), write 16-bit weights (2)
    optimizer = np.where(t.offload >= 1, 0.0, 30 * shard / hbm)

    parts = {
        "compute": micro * compute_mb,
        "tp_comm": micro * tp_mb,
        "cp_comm": micro * cp_mb,
        "pp_bubble": bubble,
        "pp_p2p": p2p,
        "dp_comm": dp,
        "zero3_gather": zero3,
        "offload": offload,
        "optimizer": optimizer,
    }
    parts["total"] = sum(parts[name] for name in TIME_PARTS)
    parts["microbatch_s"] = microbatch
    return parts
