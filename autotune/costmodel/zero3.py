"""ZeRO-3 parameter gathers and gradient reduce-scatters of one micro-batch, many layouts at once.

Fully sharded data parallelism all-gathers every weight over the dp·cp ranks before the module
that uses it runs, again for the recompute forward and the backward (unless it was kept), and
reduce-scatters its gradient in buckets during the backward. How finely and how far ahead a
framework gathers is its `Zero3Fetch` (`FrameworkTerms.zero3_fetch`):

- **per layer** (PyTorch FSDP's transformer-block units, Megatron-FSDP's per-layer buckets): a
  layer's weights are one all-gather, prefetched under the previous layer's forward; the
  backward gathers them again (and once more for a recompute forward, except under PyTorch FSDP
  whose checkpointed blocks recompute inside the backward's gather) and reduce-scatters the
  gradients, all under the layer's backward.
- **per weight tensor** (DeepSpeed's `PartitionedParameterCoordinator`, deepspeed 0.19
  `runtime/zero/partitioned_param_coordinator.py`): every linear's weight is its own
  all-gather, each paying the ring's latency; `fetch_sub_module` waits for the module's own
  weight, then prefetches the next ones in the recorded trace up to
  `min(stage3_max_live_parameters − available, stage3_prefetch_bucket_size)` parameters, at
  least one weight when that is positive and none when the weights already gathered reach
  `stage3_max_live_parameters`: a weight hides only under the modules since the one whose
  prefetch issued it, and not at all after a module of at least `stage3_max_live_parameters`.
  After a module runs, `__params_to_release` keeps a weight used again within
  `stage3_max_reuse_distance` parameters of the trace: under activation recompute, a weight whose
  later modules in the layer hold less than half that (the recompute and the backward of each
  come between its two uses) is not gathered again for its backward. Biases and norms below
  `stage3_param_persistence_threshold` stay whole on every rank (never gathered). Gradients are
  reduce-scattered in `reduce_bucket_size` buckets on the reduction stream (`overlap_comm`),
  sharing the network with the backward's gathers. Without `overlap_comm` the gathers run on
  the compute stream (`parameter_offload.py`), one after the other with the compute.

The weight tensors of a layer are those of the built-in DeepSpeed workload and of Hugging Face's
Llama and Mistral layers: q, k, v and o projections, then gate (gated MLPs), up and down
(`autotune.workloads.deepspeed_gpt`); a fused QKV weight (GPT-2, Megatron) is one gather, not
three (two ring latencies fewer). Each module's compute is its share of the layer's GEMM
parameters. Overlapped communication still costs (1 − overlap_fraction) of its time
(`collectives.exposed_s`).

DeepSpeed v0.3.x-v0.5.5 (`TrainSpec.zero3_list_collectives`) gathered into, and
reduce-scattered from, a list of one tensor per rank, and reduce-scattered each weight's
gradient on its own (`partition_parameters.py` `_reduce_scatter_gradients` loops over the
bucket's parameters); `ProcessGroupNCCL` copies every rank's slice out of or into its flat
buffer, one host-dispatched copy per rank (`list_copies_s`).
"""

from __future__ import annotations

import numpy as np

from autotune.costmodel.collectives import collective_s
from autotune.costmodel.collectives import exposed_s
from autotune.costmodel.constants import Constants
from autotune.costmodel.kernels import LayerTimes
from autotune.costmodel.sharding import element_bytes
from autotune.costmodel.terms import Zero3Fetch
from autotune.costmodel.terms import terms_for
from autotune.layout import LayoutTable
from autotune.specs import AutotuneConfig


def weight_tensors(cfg: AutotuneConfig, t: LayoutTable) -> list[np.ndarray]:
    """Parameters of each weight matrix of one dense layer on one tensor-parallel rank, in
    forward order: q, k, v, o, (gate,) up, down."""
    m = cfg.model
    h, d = m.hidden_size, m.head_dim
    q = h * m.num_attention_heads * d / t.tp
    kv = h * m.query_groups * d / t.tp
    mlp = h * m.ffn / t.tp
    return [q, kv, kv, q] + [mlp] * (3 if m.gated else 2)


def list_copies_s(fetch: Zero3Fetch, ranks: np.ndarray, k: Constants) -> np.ndarray:
    """Host time one list collective spends on its per-rank copies: `ranks` eager ops
    (`eager_op_s` each) under DeepSpeed v0.3-v0.5.5, else nothing."""
    copies: np.ndarray = ranks * k.eager_op_s * float(fetch.list_collectives)
    return copies


def _pass_s(gathers: list[np.ndarray], sizes: list[np.ndarray], compute: list[np.ndarray],
            fetch: Zero3Fetch, k: Constants, extra: np.ndarray | float = 0.0) -> np.ndarray:
    """Exposed seconds of one pass over a layer's modules in order (the previous layer's
    modules precede the first): a weight's gather hides under the modules from the one whose
    prefetch issued it (`fetch_sub_module` prefetches, after waiting for a module below
    `max_live_numel`, the next weights until `prefetch_numel` parameters), else it runs exposed;
    all the pass's traffic (with `extra` seconds of reduce-scatters) shares the network, so
    the pass exposes at least what exceeds its compute."""
    traffic = np.asarray(np.sum(gathers, axis=0) + extra)
    if not fetch.overlap:
        return traffic
    chain = np.zeros_like(compute[0])
    count = len(sizes)
    for j, gather in enumerate(gathers):
        window = np.zeros_like(chain)
        between = np.zeros_like(chain)
        reach = np.ones(chain.shape, dtype=bool)
        for back in range(1, count):
            i = (j - back) % count
            reach = reach & (sizes[i] < fetch.max_live_numel)
            window = window + np.where(reach, compute[i], 0.0)
            between = between + sizes[i]
            reach = reach & (between < fetch.prefetch_numel)
        chain = chain + np.where(window > 0, exposed_s(gather, window, k), gather)
    volume = exposed_s(traffic, np.sum(compute, axis=0), k)
    exposed: np.ndarray = np.maximum(chain, volume)
    return exposed


def _per_module_s(cfg: AutotuneConfig, t: LayoutTable, k: Constants, layer: LayerTimes,
                  fetch: Zero3Fetch, grad_bytes: int, model_numel: np.ndarray) -> np.ndarray:
    """One layer and micro-batch under DeepSpeed's coordinator: forward, recompute and backward
    gathers by module, the gradient reduce-scatter in buckets (of the `model_numel` gathered
    weights) under the backward."""
    sizes = weight_tensors(cfg, t)
    total = sum(sizes)
    width = element_bytes(cfg)
    ranks, per_node = t.shard_degree, np.maximum(cfg.cluster.gpus_per_node // t.tp, 1)
    copies = list_copies_s(fetch, ranks, k)
    gathers = [collective_s("all_gather", width * n, ranks, per_node, cfg, k) + copies
               for n in sizes]
    forward = [layer.forward * n / total for n in sizes]
    backward = [(layer.backward - layer.recompute) * n / total for n in sizes]
    recompute = t.recompute == 2
    ahead = _pass_s(gathers, sizes, forward, fetch, k)
    again = np.where(recompute, ahead, 0.0)
    # backward order is the reverse; after a recompute the weights used again within
    # max_reuse_numel of the trace (the later modules, each used twice in between) are kept
    refetch = []
    for j, gather in enumerate(gathers):
        later = sum(sizes[j + 1:], np.zeros_like(total))
        refetch.append(np.where(recompute & (2 * later < fetch.max_reuse_numel), 0.0, gather))
    # a bucket fills across layers when it holds more than one (at most the whole model's
    # gathered weights): each layer pays its share of one bucket's reduce-scatter
    bucket = np.maximum(np.minimum(fetch.reduce_bucket_numel, model_numel), 1)
    scatter = total / bucket * collective_s("reduce_scatter", grad_bytes * bucket, ranks,
                                            per_node, cfg, k)
    if fetch.list_collectives:  # one reduce-scatter per weight tensor, each with its copies
        scatter = sum(collective_s("reduce_scatter", grad_bytes * n, ranks, per_node, cfg, k)
                      + copies for n in sizes)
    behind = _pass_s(refetch[::-1], sizes[::-1], backward[::-1], fetch, k, scatter)
    layer_s: np.ndarray = ahead + again + behind
    return layer_s


def zero3_s(cfg: AutotuneConfig, t: LayoutTable, k: Constants, params: np.ndarray,
            layers: np.ndarray, layer: LayerTimes) -> np.ndarray:
    """ZeRO-3 gathers and reduce-scatters of one micro-batch on a rank holding `params`
    parameters (before sharding) in `layers` layers, exposed under its compute (0 without
    ZeRO-3 or on one rank). The first gather of a micro-batch is never hidden."""
    framework = terms_for(cfg)
    fetch = framework.zero3_fetch(cfg, t, params)
    grad_bytes = framework.grad_reduce_bytes(cfg)
    width = element_bytes(cfg)
    ranks, per_node = t.shard_degree, np.maximum(cfg.cluster.gpus_per_node // t.tp, 1)
    if fetch.per_module and not (cfg.model.moe or cfg.model.multi_latent_attention):
        gathered = layers * sum(weight_tensors(cfg, t))
        # embedding and output layer (and the norms and biases, which persist): exposed
        rest = np.maximum(params - gathered, 0.0)
        edges = collective_s("all_gather", width * rest, ranks, per_node, cfg, k)
        edges = edges + collective_s("reduce_scatter", grad_bytes * rest, ranks, per_node,
                                     cfg, k) + 2 * list_copies_s(fetch, ranks, k)
        micro = edges + layers * _per_module_s(cfg, t, k, layer, fetch, grad_bytes, gathered)
    else:
        per_layer = params / np.maximum(layers, 1)
        ag = collective_s("all_gather", width * per_layer, ranks, per_node, cfg, k)
        rs = collective_s("reduce_scatter", grad_bytes * per_layer, ranks, per_node, cfg, k)
        # the recomputed forward gathers once more, unless it runs inside the unit's gather
        again = (t.recompute == 2) * ag * float(fetch.recompute_gathers)
        micro = ag + layers * (exposed_s(ag, layer.forward, k)
                               + exposed_s(ag + rs + again, layer.backward, k))
    return np.where((t.zero >= 3) & (ranks > 1), micro, 0.0)
