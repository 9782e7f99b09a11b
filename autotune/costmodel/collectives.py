"""Time of NCCL collectives and point-to-point sends, for many layouts at once (α-β model).

Bandwidth: a collective over `ranks` GPUs, `per_node` of them on each node, runs as rings (one
channel per NIC) whose node-crossing hops each use one GPU's NIC, so across nodes the bus
bandwidth per GPU is per_node · NIC (NVLink-bound inside a node). All-reduce moves
2·(n−1)/n of the buffer per GPU, all-gather and reduce-scatter (n−1)/n (nccl-tests'
bus-bandwidth convention). Latency: NCCL's own model (`src/graph/tuning.cc`): a ring pays one
step latency per rank (NVLink steps and network steps apart), a tree (all-reduce only) one per
level, log2(nodes) across nodes; all-reduce takes the faster of the two, as NCCL's tuner does.
The other ops' bus bandwidth relative to the all-reduce's (`Constants.all_gather_bandwidth`
and the like) is 1 for NCCL and what `autotune calibrate` measures for gloo.
"""

from __future__ import annotations

from typing import Literal

import numpy as np

from autotune.costmodel.constants import Constants
from autotune.specs import AutotuneConfig

Kind = Literal["all_reduce", "all_gather", "reduce_scatter"]

TREE_BANDWIDTH = 0.92
"""NCCL's tree all-reduce bus bandwidth relative to the ring's (`tuning.cc`: busBw · .92)."""


def nodes_spanned(ranks: np.ndarray, per_node: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(ranks on one node, nodes) of a group of `ranks` GPUs placed `per_node` to a node."""
    local = np.maximum(np.minimum(per_node, ranks), 1)
    return local, np.maximum(np.ceil(ranks / local), 1)


def bus_bandwidth(
    ranks: np.ndarray, per_node: np.ndarray, cfg: AutotuneConfig, k: Constants
) -> np.ndarray:
    """Achieved bus bandwidth per GPU (bytes/s) of a large collective over the group."""
    c = cfg.cluster
    local, nodes = nodes_spanned(ranks, per_node)
    nvlink = c.intra_node_gb_s * 1e9 * k.nvlink_efficiency
    network = local * c.inter_node_gb_s * 1e9 * k.comm_efficiency
    return np.where(nodes > 1, np.minimum(nvlink, network), nvlink)


def ring_latency_s(kind: Kind, ranks: np.ndarray, nodes: np.ndarray, k: Constants) -> np.ndarray:
    """NCCL's ring latency: base + NVLink steps · intra + network steps · inter."""
    double = 2 if kind == "all_reduce" else 1
    steps = double * (ranks - 1)
    inter = np.where(nodes > 1, double * (nodes - 1), 0)
    return k.latency_base_s + (steps - inter) * k.latency_intra_s + inter * k.latency_inter_s


def tree_latency_s(ranks: np.ndarray, nodes: np.ndarray, k: Constants) -> np.ndarray:
    """NCCL's tree all-reduce latency: up and down a chain inside the node and log2(nodes)."""
    local = ranks / nodes
    depth = (local - 1) * k.latency_intra_s + np.floor(np.log2(nodes)) * k.latency_inter_s
    latency: np.ndarray = k.latency_base_s + 2 * depth
    return latency


def collective_s(
    kind: Kind,
    nbytes: np.ndarray,
    ranks: np.ndarray,
    per_node: np.ndarray,
    cfg: AutotuneConfig,
    k: Constants,
) -> np.ndarray:
    """Time of one collective whose full buffer is `nbytes` (0 for a group of one)."""
    ranks = np.asarray(ranks, dtype=float)
    local, nodes = nodes_spanned(ranks, per_node)
    moved = (2.0 if kind == "all_reduce" else 1.0) * (ranks - 1) / np.maximum(ranks, 1) * nbytes
    share = {"all_reduce": 1.0, "all_gather": k.all_gather_bandwidth,
             "reduce_scatter": k.reduce_scatter_bandwidth}[kind]
    transfer = moved / (bus_bandwidth(ranks, per_node, cfg, k) * share)
    time = ring_latency_s(kind, ranks, nodes, k) + transfer
    if kind == "all_reduce":
        time = np.minimum(time, tree_latency_s(ranks, nodes, k) + transfer / TREE_BANDWIDTH)
    return np.where(ranks > 1, time, 0.0)


def exchange_s(network_bytes: np.ndarray, nvlink_bytes: np.ndarray, nodes: np.ndarray,
               cfg: AutotuneConfig, k: Constants) -> np.ndarray:
    """Time of one exchange in which each GPU sends `network_bytes` through its own NIC and
    `nvlink_bytes` over NVLink at once (an all-to-all over `nodes` nodes, or DeepEP's dispatch):
    the slower of the two, plus one network (or NVLink) step of latency."""
    c = cfg.cluster
    share = k.all_to_all_bandwidth
    nvlink = nvlink_bytes / (c.intra_node_gb_s * 1e9 * k.nvlink_efficiency * share)
    network = network_bytes / (c.inter_node_gb_s * 1e9 * k.comm_efficiency * share)
    latency = k.latency_base_s + np.where(nodes > 1, k.latency_inter_s, k.latency_intra_s)
    time: np.ndarray = latency + np.maximum(nvlink, network)
    return time


def all_to_all_s(
    nbytes: np.ndarray,
    ranks: np.ndarray,
    per_node: np.ndarray,
    cfg: AutotuneConfig,
    k: Constants,
) -> np.ndarray:
    """Time of one all-to-all of a `nbytes` buffer per GPU: (n−1)/n of it leaves each GPU, the
    part bound for other nodes through the GPU's own NIC, the rest over NVLink."""
    ranks = np.asarray(ranks, dtype=float)
    local, nodes = nodes_spanned(ranks, per_node)
    inside = (local - 1) / np.maximum(ranks, 1) * nbytes
    outside = (ranks - local) / np.maximum(ranks, 1) * nbytes
    return np.where(ranks > 1, exchange_s(outside, inside, nodes, cfg, k), 0.0)


def send_s(
    nbytes: np.ndarray, crosses_node: np.ndarray, cfg: AutotuneConfig, k: Constants
) -> np.ndarray:
    """Time of one point-to-point send between two GPUs (NVLink, or the sender's NIC)."""
    c = cfg.cluster
    nvlink = c.intra_node_gb_s * 1e9 * k.nvlink_efficiency
    network = c.inter_node_gb_s * 1e9 * k.comm_efficiency
    bandwidth = np.where(crosses_node, network, nvlink) * k.all_to_all_bandwidth
    latency = k.latency_base_s + np.where(crosses_node, k.latency_inter_s, k.latency_intra_s)
    return latency + nbytes / bandwidth


def exposed_s(comm: np.ndarray, window: np.ndarray, k: Constants) -> np.ndarray:
    """Communication time left on the critical path when it may run under `window` seconds of
    compute: what exceeds the window, plus the share of the overlapped part that slows the
    compute (1 − overlap_fraction)."""
    hidden = np.minimum(comm, np.maximum(window, 0.0))
    exposed: np.ndarray = comm - hidden + (1 - k.overlap_fraction) * hidden
    return exposed
