"""Predicted step time as named parts, for many layouts at once.

Per micro-batch, each pipeline stage runs its layers (`autotune.costmodel.kernels`: GEMMs by shape,
attention, memory-bound kernels, launch gaps) and, on the last stage, the output layer and loss.
Communication (`autotune.costmodel.collectives`, NCCL's α-β model) is charged where it is exposed:

- tensor parallel: per layer, forward all-reduces (or all-gathers and reduce-scatters with
  sequence parallelism) block the next GEMM; without overlap the backward all-reduces each
  column-parallel linear's input gradient (`tp_backward_all_reduces`: DeepSpeed's AutoTP
  wraps q, k, v, gate and up apart); in the backward, frameworks with asynchronous
  tensor-parallel communication (`Framework.tp_backward_overlaps`: not Megatron-FSDP) hide the
  input all-gather and the gradient reduce under the column-parallel GEMMs' backward, the rest
  is exposed. With
  `TrainSpec.tp_comm_overlap` (userbuffers) all of them run under the linear GEMMs. FP8
  delayed scaling adds, per model chunk and micro-batch, two blocking amax all-reduces over
  the stage's tp·dp·cp ranks (`fp8_amax_s`), charged with them.
- context parallel: Megatron's load-balanced ring passes K/V (forward) and K/V plus their
  gradients (backward) cp−1 times per layer, each pass under one block of attention; Ulysses
  all-to-alls (q, k and v in, output back: four calls each way) are exposed.
- expert parallel (`ep_comm`, MoE layers only): token dispatch and combine over the ep group,
  forward and backward, every top-k copy (alltoall) or once per destination node (flex/DeepEP,
  `autotune.costmodel.expert_dispatch`), and with etp > 1 the expert tensor-parallel gathers,
  sized by
  the slowest rank's routed tokens (`moe_load_imbalance`); exposed, except under Megatron's EP
  all-to-all overlap (`TrainSpec.moe_a2a_overlap`), where they run under the forward and
  backward of the layer's other micro-batch.
- pipeline: the 1F1B bubble of (p−1)/v micro-batch times of the slowest stage (p−1 times its
  heaviest chunk where a custom layout's chunks differ), and the
  activation sends (all on the critical path without interleaving; only the fill and drain
  with interleaving, whose sends overlap).
- data parallel: dense gradients over dp·cp, routed-expert gradients over edp; buckets are
  reduced while the last micro-batch's backward runs on the layers before them: the last
  bucket is always exposed; the distributed optimizer's parameter all-gather hides under the
  next forward where the framework overlaps it (`TrainSpec.param_gather_overlapped`).
- ZeRO-3 (`autotune.costmodel.zero3`): every micro-batch gathers the weights before the forward
  (prefetched), again for a recompute and the backward, and reduce-scatters the gradients,
  with ring latency over all dp·cp ranks, per layer or, under DeepSpeed, per weight tensor with
  its coordinator's prefetch and reuse limits; the first gather is never hidden.
- offload: PCIe traffic and the CPU Adam; the GPU optimizer step streams 38 B per parameter.
Overlapped communication still costs (1 − overlap_fraction) of its time (`exposed_s`); on CPU
workers, whose collectives block, all of it.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from autotune.costmodel.collectives import Kind
from autotune.costmodel.collectives import all_to_all_s
from autotune.costmodel.collectives import collective_s
from autotune.costmodel.collectives import exchange_s
from autotune.costmodel.collectives import exposed_s
from autotune.costmodel.collectives import nodes_spanned
from autotune.costmodel.collectives import send_s
from autotune.costmodel.constants import Constants
from autotune.costmodel.eager import eager_grad_accumulation_s
from autotune.costmodel.eager import eager_optimizer_s
from autotune.costmodel.eager import runs_eager
from autotune.costmodel.expert_dispatch import a2a_overlap_runs
from autotune.costmodel.expert_dispatch import dispatch_bytes
from autotune.costmodel.kernels import LayerTimes
from autotune.costmodel.kernels import head_times
from autotune.costmodel.kernels import layer_gemms
from autotune.costmodel.kernels import load_imbalance
from autotune.costmodel.kernels import mean_layer_times
from autotune.costmodel.kernels import routed_tokens
from autotune.costmodel.sharding import element_bytes
from autotune.costmodel.sharding import expert_params_on_rank
from autotune.costmodel.sharding import params_on_rank
from autotune.costmodel.terms import terms_for
from autotune.costmodel.zero3 import zero3_s
from autotune.layout import LayoutTable
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
    "ep_comm",
)
"""Named parts of the predicted step time, in report order (`ep_comm` last: it is 0 for dense
models, and the parts before it keep their report colours)."""


@dataclasses.dataclass(frozen=True, slots=True)
class TimeEstimate:
    """Predicted step time of many layouts (one entry per row): the parts and their sum."""

    parts: dict[str, np.ndarray]
    """Seconds per step, one array per name of TIME_PARTS."""
    total: np.ndarray
    """The sum of the parts: the step time (s)."""
    microbatch_s: np.ndarray
    """One micro-batch on the slowest stage (s)."""
    flops: np.ndarray
    """FLOPs all GPUs execute in one step, recompute included."""

OPTIMIZER_BYTES_PER_PARAM = 38
"""Adam step on the GPU, bytes per parameter: read fp32 master, m, v and gradient (16), write
master, m, v (12), write the 16-bit weight (2), gradient-norm read (4), gradient zeroing (4)."""

UNFUSED_GRAD_ACCUMULATION_BYTES = 4
"""Extra HBM bytes per parameter and micro-batch when weight-gradient accumulation is not
fused into the GEMM: the GEMM writes a 2-byte gradient and an add kernel reads it (2 + 2) and
reads and writes the fp32 main gradient (8), against the fused GEMM's read and write of the
main gradient (8): 12 − 8 = 4 B."""


def _tp_layer_s(cfg: AutotuneConfig, t: LayoutTable, linear_forward: np.ndarray,
                column_backward: np.ndarray, k: Constants) -> np.ndarray:
    """Exposed tensor-parallel communication of one layer and micro-batch."""
    gpn = cfg.cluster.gpus_per_node
    tokens = t.mbs * cfg.train.seq_length / t.cp
    volume = element_bytes(cfg) * tokens * cfg.model.hidden_size
    per_node = np.full(len(t), gpn)
    half = collective_s("all_gather", volume, t.tp, per_node, cfg, k)  # = reduce-scatter
    whole = collective_s("all_reduce", volume, t.tp, per_node, cfg, k)
    forward = np.where(t.sp, 4 * half, 2 * whole)
    framework = terms_for(cfg)
    # sp: two all-gathers exposed; input all-gathers and gradient reduce-scatters of the
    # column-parallel linears hide under their backward. No sp: the gradient all-reduces
    # hide under the column-parallel weight gradients.
    hidden = np.where(t.sp, 2 * half + exposed_s(4 * half, column_backward, k),
                      exposed_s(2 * whole, column_backward / 2, k))
    # without overlap: one input-gradient all-reduce per column-parallel linear (no sp)
    plain_backward = np.where(t.sp, forward, framework.tp_backward_all_reduces(cfg) * whole)
    backward = np.where(framework.tp_backward_overlaps(t), hidden, plain_backward)
    if framework.tp_comm_overlap and cfg.train.tp_comm_overlap:
        # userbuffers: every collective runs in chunks under the GEMM that consumes or produces
        # it, forward and backward (sequence parallelism only)
        every = forward + 6 * half + (t.recompute == 2) * forward
        overlapped = exposed_s(every, 3 * linear_forward, k)
        plain = forward + backward + (t.recompute == 2) * forward
        return np.where(t.sp, overlapped, plain)
    layer_s: np.ndarray = forward + backward + (t.recompute == 2) * forward
    return layer_s


def _cp_layer_s(cfg: AutotuneConfig, t: LayoutTable, attention_forward: np.ndarray,
                k: Constants) -> np.ndarray:
    """Exposed context-parallel communication of one layer and micro-batch."""
    m, gpn = cfg.model, cfg.cluster.gpus_per_node
    tokens = t.mbs * cfg.train.seq_length / t.cp
    kv_heads = np.maximum(m.query_groups / t.tp, 1)
    width = element_bytes(cfg)
    kv_bytes = 2 * tokens * width * kv_heads * m.head_dim  # this rank's K and V
    again = (t.recompute >= 1).astype(float)  # recompute repeats the attention forward
    if terms_for(cfg).context_parallel == "ring":
        send = send_s(kv_bytes, t.tp * t.cp > gpn, cfg, k)
        block = attention_forward / t.cp
        forward = (t.cp - 1) * exposed_s(send, block, k)
        backward = (t.cp - 1) * exposed_s(2 * send, 2 * block, k)
    else:  # Ulysses: q, k, v to head-sharded, output back to sequence-sharded
        q_bytes = width * tokens * m.num_attention_heads * m.head_dim / t.tp
        per_node = np.maximum(gpn // t.tp, 1)
        # one all-to-all each (DeepSpeed's DistributedAttention.forward: q, k, v, then the
        # output; the backward mirrors them)
        forward = (2 * all_to_all_s(q_bytes, t.cp, per_node, cfg, k)
                   + 2 * all_to_all_s(kv_bytes / 2, t.cp, per_node, cfg, k))
        backward = forward
    return np.where(t.cp > 1, forward * (1 + again) + backward, 0.0)


def _ep_layer_s(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> np.ndarray:
    """Expert-parallel communication of one MoE layer and micro-batch (0 at ep = etp = 1).

    Dispatch and combine over the ep group, forward and backward (4, 6 when full recompute
    repeats the forward); each moves the rank's s·b/(cp·tp) routed tokens times
    `kernels.load_imbalance` (the slowest rank receives the most and the group waits for it),
    16-bit, as `expert_dispatch.dispatch_bytes` counts them for `TrainSpec.moe_token_dispatcher`
    (alltoall: every top-k copy; flex/DeepEP: once per other node over the network). The ep
    group's ranks are consecutive after etp (Megatron's expert grid order tp-ep-dp-pp with
    tp = etp), so gpus_per_node / etp of them share a node. With etp > 1 the routed copies are
    all-gathered over etp after the dispatch and reduce-scattered before the combine (and the
    reverse in the backward). Exposed unless `TrainSpec.moe_a2a_overlap` (`estimate_time`).
    Each forward also runs the framework's capacity all-reduces (`moe_capacity_all_reduces`,
    one 8-byte count) over the ep group; fp32 training dispatches and gathers 4-byte
    activations.
    """
    m, gpn = cfg.model, cfg.cluster.gpus_per_node
    passes = 4 + 2 * (t.recompute == 2)
    copies = routed_tokens(cfg, t) * load_imbalance(cfg, t, k)
    ranks = t.ep.astype(float)
    local, nodes = nodes_spanned(ranks, np.maximum(gpn // t.etp, 1))
    tokens = copies / (m.moe_router_topk * t.etp)
    dedup = cfg.train.moe_token_dispatcher == "flex"
    network, nvlink = dispatch_bytes(m, tokens, ranks, local, dedup)
    width = element_bytes(cfg)
    wide = width / 2  # dispatch_bytes counts 16-bit activations
    dispatch = np.where(ranks > 1, exchange_s(wide * network, wide * nvlink, nodes, cfg, k), 0.0)
    gather = collective_s("all_gather", width * m.hidden_size * copies, t.etp,
                          np.full(len(t), gpn), cfg, k)
    forwards = 1 + (t.recompute == 2)
    capacity = forwards * terms_for(cfg).moe_capacity_all_reduces * collective_s(
        "all_reduce", np.full(len(t), 8.0), ranks, np.maximum(gpn // t.etp, 1), cfg, k)
    ep_s: np.ndarray = passes * (dispatch + gather) + capacity
    return ep_s


def _reduce_s(kind: Kind, nbytes_per_param: float, params: np.ndarray, bucket: np.ndarray,
              window: np.ndarray, overlap: bool, cfg: AutotuneConfig, t: LayoutTable,
              k: Constants, expert: bool = False) -> np.ndarray:
    """A bucketed collective over the dp·cp group (routed experts: the edp group, whose ranks
    are etp·ep apart) hidden under `window` seconds of compute that produce (or consume) the
    buckets in turn: the last bucket is never hidden."""
    if expert:
        ranks = t.expert_data_parallel
        per_node = np.maximum(cfg.cluster.gpus_per_node // (t.etp * t.ep), 1)
    else:
        ranks = t.shard_degree
        per_node = np.maximum(cfg.cluster.gpus_per_node // t.tp, 1)
    buckets = np.maximum(np.ceil(params / np.maximum(bucket, 1)), 1)
    one = collective_s(kind, nbytes_per_param * params / buckets, ranks, per_node, cfg, k)
    if not overlap:
        serial: np.ndarray = buckets * one
        return serial
    last: np.ndarray = one + exposed_s((buckets - 1) * one, window * (buckets - 1) / buckets, k)
    return last


def _dp_s(cfg: AutotuneConfig, t: LayoutTable, k: Constants, params: np.ndarray,
          forward_mb: np.ndarray, backward_mb: np.ndarray, expert: bool) -> np.ndarray:
    """Data-parallel gradient reduction (and the sharded optimizer's parameter gather) of
    `params` parameters per rank, over dp·cp or, for routed experts, over edp."""
    framework = terms_for(cfg)
    grad_bytes = framework.grad_reduce_bytes(cfg)
    bucket = framework.grad_bucket_params(cfg, t, params)
    overlap = cfg.train.overlap_grad_reduce
    all_reduce = _reduce_s("all_reduce", grad_bytes, params, bucket, backward_mb, overlap,
                           cfg, t, k, expert)
    scatter = _reduce_s("reduce_scatter", grad_bytes, params, bucket, backward_mb, overlap,
                        cfg, t, k, expert)
    grads = np.where(t.zero == 0, all_reduce, scatter)
    if framework.zero2_reduces_every_microbatch:
        grads = np.where(t.zero == 2, grads * t.micro_batches, grads)
    gather = _reduce_s("all_gather", element_bytes(cfg), params, bucket, forward_mb,
                       cfg.train.param_gather_overlapped
                       and framework.param_gather_overlaps_forward, cfg, t, k, expert)
    dp = grads + np.where((t.zero >= 1) & (t.zero < 3), gather, 0.0)
    ranks = t.expert_data_parallel if expert else t.shard_degree
    return np.where((ranks > 1) & (t.zero < 3), dp, 0.0)


def _stage_dp_s(cfg: AutotuneConfig, t: LayoutTable, k: Constants, vocab: np.ndarray,
                layers: np.ndarray, first: np.ndarray, holds_head: bool, layer: LayerTimes,
                head_s: np.ndarray) -> np.ndarray:
    """The exposed data-parallel time of a pipeline stage of `layers` layers (`first`: it holds
    the embedding; `holds_head`: the output layer and loss), routed experts included."""
    m = cfg.model
    head = np.full(len(t), holds_head)
    params = params_on_rank(m, t, vocab, layers, first, head, experts=False)
    forward_mb = layers * layer.forward
    backward_mb = layers * layer.backward + head * head_s * 2 / 3
    dp = _dp_s(cfg, t, k, params, forward_mb, backward_mb, expert=False)
    if m.moe_layer_share:
        dp = dp + _dp_s(cfg, t, k, expert_params_on_rank(m, t, layers), forward_mb,
                        backward_mb, expert=True)
    return dp


AMAXES_PER_FP8_GEMM = {"forward": 3, "backward": 2}
"""4-byte amaxes one FP8 GEMM adds to its chunk's reductions: input, weight and output forward,
the two gradients backward (Transformer Engine's `FP8FwdTensors` and `FP8BwdTensors`)."""


def fp8_amax_s(cfg: AutotuneConfig, t: LayoutTable, k: Constants,
               layers: np.ndarray) -> np.ndarray:
    """Seconds of FP8 delayed scaling's amax all-reduces per micro-batch on a pipeline stage of
    `layers` layers (0 without them).

    Megatron-Core (`TransformerBlock.forward` @ core_v0.7.0 to core_r0.11.0) runs a model
    chunk's layers under one Transformer Engine `fp8_autocast` with `fp8_group =
    get_amax_reduction_group(with_context_parallel=True)`, the tp·dp·cp ranks of the stage.
    Transformer Engine (`FP8GlobalStateManager.reduce_and_update_fp8_tensors`, from commit
    73f8d90fe of 2024-04-12, before v1.6, to v2.5; earlier releases read
    `NVTE_DP_AMAX_REDUCE_INTERVAL` and `NVTE_ASYNC_AMAX_REDUCTION`, later ones do not)
    all-reduces the region's amaxes with MAX and `async_op=False` on the compute stream when
    the forward leaves the region (`fp8_autocast_exit`) and when the backward of its first
    module ends: two latency-bound all-reduces per chunk and micro-batch that nothing hides.
    The current-scaling recipes keep no amax history and reduce nothing per region."""
    train = cfg.train
    zero = np.zeros(np.shape(layers))
    if not (train.precision == "fp8" and train.fp8_recipe == "delayed"
            and terms_for(cfg).fp8_amax_reduction):
        return zero
    gemms = sum(1 for gemm in layer_gemms(cfg, t, k, moe=False) if gemm.fp8)
    chunk = layers / t.vpp
    ranks = t.tp * t.dp * t.cp
    per_node = np.full(len(t), cfg.cluster.gpus_per_node)
    seconds = sum(collective_s("all_reduce", 4.0 * count * gemms * chunk, ranks, per_node,
                               cfg, k) for count in AMAXES_PER_FP8_GEMM.values())
    charged: np.ndarray = np.where(layers > 0, t.vpp * seconds, zero)
    return charged


def estimate_time(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> TimeEstimate:
    """Step-time parts (s) of many layouts, their sum, one micro-batch's time and the FLOPs."""
    if cfg.cluster.cpu_processes:
        # CPU workers: gloo collectives block the calling thread and DeepSpeed's CPU
        # accelerator has no streams (`cpu_accelerator.py`: Stream None, stream() a no-op
        # context), so no communication runs under compute
        k = k.model_copy(update={"overlap_fraction": 0.0})
    m, train, c = cfg.model, cfg.train, cfg.cluster
    gpn = c.gpus_per_node
    framework = terms_for(cfg)
    micro = t.micro_batches
    vocab = framework.padded_vocab(m.vocab_size, t.tp)
    split = framework.split_layers(cfg, t.pp, t.vpp)
    single = t.pp == 1

    layer = mean_layer_times(cfg, t, k)
    tp_layer = _tp_layer_s(cfg, t, layer.linear_forward, layer.column_backward, k)
    cp_layer = _cp_layer_s(cfg, t, layer.attention_forward, k)
    share = m.moe_layer_share
    ep_layer = share * _ep_layer_s(cfg, t, k) if share else np.zeros(len(t))
    if share and cfg.train.moe_a2a_overlap:
        # EP A2A overlap: one micro-batch's expert traffic under another's forward and backward
        overlaps = a2a_overlap_runs(cfg, t.ep, t.pp, t.vpp, t.recompute == 2)
        hidden = exposed_s(ep_layer, layer.forward + layer.backward, k)
        ep_layer = np.where(overlaps, hidden, ep_layer)
    head_s, head_flops = head_times(cfg, t, vocab, k)

    # the slowest stage: first, middle or last (the last also runs the output layer and loss)
    last_layers = np.where(single, split.first, split.last)
    stages = np.stack([split.first, np.where(t.pp > 2, split.middle, 0), last_layers])
    compute = stages * layer.total + np.array([[0.0], [0.0], [1.0]]) * head_s
    comm_tp = stages * tp_layer + fp8_amax_s(cfg, t, k, stages)
    comm_cp, comm_ep = stages * cp_layer, stages * ep_layer
    per_micro = compute + comm_tp + comm_cp + comm_ep
    # the slowest stage over the whole step: its micro-batches and its exposed gradient reduce
    # (the first stage holds the embedding, the last the output layer; an FP8 stage's amax
    # all-reduces grow with dp, so which stage is slowest can change with it)
    stage_dp = np.stack([
        _stage_dp_s(cfg, t, k, vocab, stages[s], single | (s == 0), s == 2, layer, head_s)
        for s in range(3)])
    slowest = np.argmax(micro * per_micro + stage_dp, axis=0)
    pick = np.arange(len(t))
    layers = stages[slowest, pick]
    compute_mb, tp_mb, cp_mb, ep_mb = (a[slowest, pick]
                                       for a in (compute, comm_tp, comm_cp, comm_ep))
    microbatch = per_micro[slowest, pick]
    holds_head = slowest == 2

    # pipeline: bubble and activation sends
    # interleaved 1F1B idles each stage for p−1 chunk times; a custom layout's chunks differ
    # within a stage and its heaviest chunk sets that time (equal chunks: 1/v of the stage)
    chunk_share = np.ones(len(t))
    if split.heaviest_chunk is not None:
        chunk_share = np.maximum(split.heaviest_chunk * t.vpp / np.maximum(split.most, 1), 1.0)
    bubble = np.where(single, 0.0, (t.pp - 1) / t.vpp * microbatch * chunk_share)
    # each tensor-parallel rank sends its 1/tp slice (sequence parallel, or the scatter/gather
    # optimization of Narayanan et al. 2021 §4.1) through its own NIC
    p2p_bytes = element_bytes(cfg) * t.mbs * train.seq_length / t.cp * m.hidden_size / t.tp
    send = send_s(p2p_bytes, t.tp * t.cp * t.dp >= gpn, cfg, k)
    sends = np.where(t.vpp > 1, 2 * (t.pp - 1), 2 * (micro + t.pp - 1))
    p2p = np.where(single, 0.0, sends * send)

    # data parallel over dp·cp (routed experts over edp): the slowest stage's gradient reduce
    # under its last backward and parameter gather (`_stage_dp_s`), on its parameters
    dp = stage_dp[slowest, pick]
    first = single | (slowest == 0)
    params = params_on_rank(m, t, vocab, layers, first, holds_head, experts=False)
    grad_bytes = framework.grad_reduce_bytes(cfg)
    shard = params / np.where(t.zero >= 1, t.shard_degree, 1)  # after ZeRO sharding
    if share:
        experts = expert_params_on_rank(m, t, layers)
        shard = shard + experts / np.where(t.zero >= 1, t.expert_data_parallel, 1)
        params = params + experts

    # ZeRO-3: every micro-batch gathers the weights and reduce-scatters the gradients
    zero3 = micro * zero3_s(cfg, t, k, params, layers, layer)

    # offload: gradients down and weights up over PCIe, Adam on the node's CPUs
    pcie = c.pcie_gb_s * 1e9
    offload = np.where(
        t.offload >= 1,
        (grad_bytes + 2) * shard / pcie + shard * gpn / k.cpu_adam_params_per_s,
        0.0,
    ) + np.where(t.offload == 2, micro * 2 * 2 * shard / pcie, 0.0)
    hbm = c.gpu.hbm_tb_s * 1e12 * k.hbm_efficiency
    optimizer = np.where(t.offload >= 1, 0.0, OPTIMIZER_BYTES_PER_PARAM * shard / hbm)
    accumulate = 0.0 * shard
    if runs_eager(cfg):  # torch's AdamW, unfused, on the CPU worker
        optimizer = np.where(t.offload >= 1, 0.0, eager_optimizer_s(t, k, shard, hbm))
        accumulate = eager_grad_accumulation_s(t, k, params, hbm)
    # gradient accumulation outside the weight-gradient GEMMs: one more pass per micro-batch
    unfused = framework.unfused_grad_accumulation(t) * (
        UNFUSED_GRAD_ACCUMULATION_BYTES * params / hbm)

    parts = {
        "compute": micro * (compute_mb + unfused) + accumulate,
        "tp_comm": micro * tp_mb,
        "cp_comm": micro * cp_mb,
        "pp_bubble": bubble,
        "pp_p2p": p2p,
        "dp_comm": dp,
        "zero3_gather": zero3,
        "offload": offload,
        "optimizer": optimizer,
        "ep_comm": micro * ep_mb,
    }
    replica = micro * (m.num_layers * layer.flops + head_flops)  # every split places all layers
    return TimeEstimate(
        parts=parts,
        total=sum(parts[name] for name in TIME_PARTS),
        microbatch_s=microbatch,
        flops=replica * t.tp * t.cp * t.dp,
    )
