"""Where a MoE layer's routed tokens travel: bytes per token over the network and over NVLink.

Megatron-LM's token dispatchers (megatron/core/transformer/moe/README.md, "Token dispatcher",
and token_dispatcher.py, NVIDIA/Megatron-LM at d98e8a64):

- `alltoall` (`MoEAlltoAllTokenDispatcher`): the rank permutes its tokens into one row per
  (token, expert) pair and exchanges them with NCCL all-to-all: every top-k copy travels on its
  own, through the sender's NIC when the expert lives on another node.
- `flex` with the DeepEP backend (`MoEFlexTokenDispatcher`, `_DeepepManager` calling
  `fused_a2a.fused_dispatch`): DeepEP's normal kernels (deepseek-ai/DeepEP README) send a token
  over RDMA once per destination node, to the GPU with the sender's local rank there, which
  forwards it over NVLink to each GPU of that node holding one of its experts (once per GPU).
  This is the scheme of DeepSeek-V3 (arXiv:2412.19437 §3.2.2: "IB then NVLink", tokens
  deduplicated per node). The dispatcher ships 16-bit activations (Megatron passes the hidden
  states to DeepEP as they are; fp32 routing probabilities ride along, negligible beside 2h).

With uniform routing over E experts spread evenly over n bins (nodes or GPUs), a token's k
distinct experts land in `expected_bins` distinct bins. Group-limited routing
(`moe_router_num_groups` / `moe_router_group_topk`, megatron-core moe_utils.py
`group_limited_topk`; DeepSeek-V3's node-limited routing, "each token sent to at most M = 4
nodes") first picks group_topk of the groups of consecutive experts, then the top-k inside them.
Experts sit on ep ranks in order, so when the groups tile the nodes (whole groups per node, or
whole nodes per group) a token reaches at most group_topk·max(1, nodes/groups) nodes:
`reachable_nodes` caps the expectation there.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autotune.specs import AutotuneConfig
from autotune.specs import ModelSpec


def expected_bins(experts: int, bins: np.ndarray, topk: int) -> np.ndarray:
    """Expected distinct bins among a token's top-k experts, chosen uniformly without
    replacement from `experts` spread evenly over `bins`: n·(1 − C(E − E/n, k) / C(E, k))."""
    bins = np.asarray(bins, dtype=float)
    others = experts - experts / bins  # experts outside one bin
    missed = np.ones_like(bins)
    for i in range(topk):
        missed = missed * np.maximum(others - i, 0.0) / (experts - i)
    expected: np.ndarray = bins * (1.0 - missed)
    return expected


def reachable_nodes(m: ModelSpec, nodes: np.ndarray) -> np.ndarray:
    """The most nodes one token's experts may lie on: group_topk·max(1, nodes/groups) when
    group-limited routing's groups tile the ep group's nodes, else all of them."""
    nodes = np.asarray(nodes, dtype=float)
    groups, limit = m.moe_router_num_groups, m.moe_router_group_topk
    if groups is None or limit is None:
        return nodes
    tiled = (groups % nodes == 0) | (nodes % groups == 0)
    capped = limit * np.maximum(1.0, nodes / groups)
    reach: np.ndarray = np.where(tiled, np.minimum(nodes, capped), nodes)
    return reach


def remote_nodes(m: ModelSpec, nodes: np.ndarray) -> np.ndarray:
    """Expected distinct other nodes a token's top-k experts lie on (what DeepEP sends it to
    over the network): the expected distinct nodes, capped by `reachable_nodes`, less the
    sender's own node (hit with the same chance as any other, by symmetry)."""
    nodes = np.asarray(nodes, dtype=float)
    distinct = np.minimum(expected_bins(m.num_experts or 1, nodes, m.moe_router_topk),
                          reachable_nodes(m, nodes))
    remote: np.ndarray = distinct * (nodes - 1) / nodes
    return remote


def dispatch_bytes(m: ModelSpec, tokens: np.ndarray, ranks: np.ndarray, local: np.ndarray,
                   dedup: bool) -> tuple[np.ndarray, np.ndarray]:
    """(network, NVLink) bytes one rank sends in one dispatch (or combine) of `tokens` tokens
    over an ep group of `ranks` GPUs, `local` of them per node, 16-bit activations of h.

    Plain all-to-all: each of the k copies travels, to a uniformly chosen rank: (ranks − local)
    /ranks of them over the NIC, (local − 1)/ranks over NVLink. Deduplicated (DeepEP): once per
    other node over the NIC (`remote_nodes`); over NVLink, every token arriving at a node goes
    once to each of that node's GPUs holding one of its experts other than the receiver, which
    by symmetry is a rank's tokens times the expected distinct GPUs times (local − 1)/local.
    """
    ranks = np.asarray(ranks, dtype=float)
    token_bytes = 2 * m.hidden_size * tokens
    if not dedup:
        sent = token_bytes * m.moe_router_topk
        return (ranks - local) / ranks * sent, (local - 1) / ranks * sent
    nodes = np.maximum(np.ceil(ranks / local), 1)
    network = token_bytes * remote_nodes(m, nodes)
    gpus = expected_bins(m.num_experts or 1, ranks, m.moe_router_topk)
    nvlink = token_bytes * gpus * (local - 1) / np.maximum(local, 1)
    return network, nvlink


def a2a_overlap_runs(cfg: AutotuneConfig, ep: Any, pp: Any, vpp: Any,
                     full_recompute: Any) -> np.ndarray:
    """Whether Megatron's EP all-to-all overlap (`--overlap-moe-expert-parallel-comm`) runs on
    layouts (numpy columns or one layout's numbers): asked for (`TrainSpec.moe_a2a_overlap`) by
    a MoE model in bf16/fp16 (fp8 trains with bf16 too), with ep > 1, no full recompute and
    interleaving when pp > 1 (megatron-core 0.16.1 `TransformerConfig.__post_init__` asserts
    each of these)."""
    train = cfg.train
    asked = cfg.model.moe and train.moe_a2a_overlap and train.precision != "fp32"
    runs: np.ndarray = (asked & (np.asarray(ep) > 1) & np.logical_not(full_recompute)
                        & ((np.asarray(pp) == 1) | (np.asarray(vpp) > 1)))
    return runs
