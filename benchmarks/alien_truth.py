"""A GPU cluster that autotune's model does not know: step time and memory from other formulas.

Written without `autotune.costmodel.step_time`, `autotune.costmodel.memory`,
`autotune.costmodel.estimate` or `autotune.costmodel.flops`:
only the inputs (model, cluster, layout) are shared. Each seed draws one
hidden cluster (kernel efficiencies, NCCL constants, overlap, allocator behaviour). Functional
forms, from the literature:

- GEMMs: roofline (compute or memory bound) with tile and wave quantisation and a short-K
  penalty (NVIDIA, "Matrix Multiplication Background User's Guide", Deep Learning Performance
  documentation), forward and both backward GEMMs with their own shapes; FlashAttention at its
  own fraction of peak (Dao 2023, FlashAttention-2: 50-73 % of peak on A100; Shah et al. 2024,
  FlashAttention-3: FA2 reaches about 35 % on H100); memory-bound kernels at HBM speed plus a
  launch overhead per kernel.
- Collectives: α-β costs (Thakur, Rabenseifner and Gropp 2005, "Optimization of collective
  communication operations in MPICH") with NCCL's algorithms: all-reduce takes the faster of a
  flat ring (2(n-1) latency hops) and a double binary tree across nodes (2·log2 nodes hops;
  Sanders, Speck and Träff 2009); reduce-scatter and all-gather are rings; bandwidth falls for
  small per-step chunks; across nodes a group's rings use the NIC of each of its GPUs in a node
  (one channel per rail). Bus bandwidth follows nccl-tests' definition (PERFORMANCE.md).
- Experts: grouped GEMMs of the local experts on their routed tokens; the dispatch and combine
  all-to-alls over ep, and with etp > 1 the routed tokens all-gathered over etp after the
  dispatch and reduce-scattered before the combine (Megatron-core's alltoall token dispatcher),
  which replace the dense MLP's tensor-parallel all-reduce in a MoE layer.
- Pipeline: interleaved 1F1B takes (v·m + p − 1) chunk times (Narayanan et al. 2021, SC21,
  bubble (p−1)/(v·m)), each with its point-to-point sends, plus a synchronisation per chunk.
- Data parallel: bucketed gradient reduction overlapped with the last backward up to a hidden
  overlap fraction; ZeRO-3 / FSDP gathers each layer with a prefetch depth of one layer
  (Rajbhandari et al. 2020, ZeRO; PyTorch FSDP paper, Zhao et al. 2023).
- Memory: model states as in ZeRO (2 + 2 + 12 bytes per parameter, DeepSpeed's fp32 gradient
  accumulation, Megatron's fp32 main gradients); activations counted tensor by tensor for a
  pre-norm decoder with flash attention, times a hidden autograd/allocator overhead of 10-20 %;
  fp32 cross-entropy buffers of the logits; a runtime reserve (CUDA context, cuBLAS and NCCL
  buffers per process group) that `max_memory_allocated` does not show; and allocator
  fragmentation (PyTorch caching allocator: reserved exceeds allocated) growing with pipeline
  and recompute. A layout whose reserved memory plus the reserve exceeds the device is an OOM.
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.measurement import Measurement
from autotune.runners.base import Runner
from autotune.runners.base import TrialPlan
from autotune.specs import AutotuneConfig
from autotune.units import GIB

MOE_IMBALANCE = 1.15
"""Routed tokens on the busiest expert-parallel rank over the mean (dropless routing)."""
NOISE = 0.015
"""σ of the multiplicative (log-normal) noise on every measured step time."""


@dataclasses.dataclass(frozen=True)
class Device:
    """What the truth knows about a GPU type (SM count from NVIDIA's A100/H100 whitepapers)."""

    sms: int
    gemm: float
    """Fraction of dense peak of a large, well-shaped bf16 GEMM."""
    attention: float
    """Fraction of dense peak of FlashAttention-2, forward and backward."""
    context_gib: float
    """CUDA context and library handles per process."""


DEVICES = {
    "a100-sxm-80gb": Device(sms=108, gemm=0.80, attention=0.60, context_gib=0.55),
    "h100-sxm-80gb": Device(sms=132, gemm=0.74, attention=0.40, context_gib=0.65),
    "h200-sxm-141gb": Device(sms=132, gemm=0.76, attention=0.40, context_gib=0.65),
}
TILE = (128, 256)
"""Thread-block tile of a bf16 tensor-core GEMM (M × N)."""


@dataclasses.dataclass(frozen=True)
class Hidden:
    """One seed's cluster: the constants the tuner never sees."""

    gemm: float
    attention: float
    hbm: float
    nvlink: float
    nic: float
    alpha_nvlink_s: float
    alpha_ib_s: float
    launch_s: float
    overlap: float
    activation_overhead: float
    fragmentation: float
    nccl_gib_per_group: float

    @classmethod
    def draw(cls, seed: int) -> Hidden:
        """The hidden constants of cluster `seed`."""
        rng = np.random.default_rng(seed)

        def jitter(sigma: float) -> float:
            return float(np.exp(rng.normal(0.0, sigma)))

        return cls(
            gemm=jitter(0.06),
            attention=jitter(0.12),
            hbm=0.80 * jitter(0.08),
            nvlink=0.78 * jitter(0.10),
            nic=0.85 * jitter(0.12),
            alpha_nvlink_s=6e-6 * jitter(0.3),
            alpha_ib_s=14e-6 * jitter(0.3),
            launch_s=4e-6 * jitter(0.3),
            overlap=float(rng.uniform(0.5, 0.8)),
            activation_overhead=float(rng.uniform(1.10, 1.20)),
            fragmentation=float(rng.uniform(0.04, 0.08)),
            nccl_gib_per_group=float(rng.uniform(0.15, 0.30)),
        )


@dataclasses.dataclass(frozen=True)
class Distortion:
    """Where a scenario's cluster departs from what any model assumes (1 / 0 = no change):
    factors on the time of flash attention, of the pipeline's fill and drain slots and of the
    ZeRO-3 parameter gathers, on the NICs' rate, on activation memory, and extra runtime reserve
    (GiB outside the allocator). These move the true best away from the model's ranking."""

    attention: float = 1.0
    bubble: float = 1.0
    nic: float = 1.0
    zero3_gather: float = 1.0
    activation: float = 1.0
    reserve_gib: float = 0.0

    def describe(self) -> str:
        """A short label, e.g. 'attention x2, NIC x0.5'."""
        labels = [("attention", self.attention, 1.0), ("bubble", self.bubble, 1.0),
                  ("NIC", self.nic, 1.0), ("ZeRO-3 gather", self.zero3_gather, 1.0),
                  ("activations", self.activation, 1.0)]
        text = [f"{name} x{value:g}" for name, value, same in labels if value != same]
        if self.reserve_gib:
            text.append(f"reserve +{self.reserve_gib:g} GiB")
        return ", ".join(text) or "none"


class AlienTruth:
    """Step time and memory of layouts of one problem on one hidden cluster."""

    def __init__(self, cfg: AutotuneConfig, seed: int,
                 distortion: Distortion | None = None) -> None:
        self.cfg = cfg
        self.seed = seed
        self.hidden = Hidden.draw(seed)
        self.device = DEVICES[cfg.cluster.gpu.name]
        self.distortion = distortion or Distortion()

    @property
    def nic_bytes_s(self) -> float:
        """The NIC rate one GPU's traffic across nodes reaches (B/s)."""
        c = self.cfg.cluster
        return c.inter_node_gb_s * 1e9 * self.hidden.nic * self.distortion.nic

    # --- building blocks ---------------------------------------------------------------------

    def _gemm_s(self, m: np.ndarray, n: np.ndarray, k: np.ndarray) -> np.ndarray:
        """One GEMM (M×K by K×N): the slower of compute (quantised) and memory traffic."""
        c, hid, dev = self.cfg.cluster, self.hidden, self.device
        peak = c.gpu.peak_tflops[self.cfg.train.precision] * 1e12
        tiles = np.ceil(m / TILE[0]) * np.ceil(n / TILE[1])
        waves = np.ceil(tiles / dev.sms)
        quantised = tiles / (waves * dev.sms)
        short_k = k / (k + 128.0)
        compute = 2 * m * n * k / (peak * dev.gemm * hid.gemm * quantised * short_k)
        traffic = 2 * (m * k + k * n + m * n) / (c.gpu.hbm_tb_s * 1e12 * hid.hbm)
        return np.maximum(compute, traffic)

    def _gemm_train_s(self, m: np.ndarray, n: np.ndarray, k: np.ndarray) -> np.ndarray:
        """Forward, input-gradient and weight-gradient GEMMs of one linear layer."""
        return self._gemm_s(m, n, k), self._gemm_s(m, k, n) + self._gemm_s(k, n, m)

    def _chunk_bw(self, link: np.ndarray, chunk: np.ndarray) -> np.ndarray:
        """Bandwidth (B/s) NCCL reaches for a per-step chunk of `chunk` bytes."""
        return link * chunk / (chunk + 256 * 1024)

    def _links(self, per_node: np.ndarray, ranks: np.ndarray):
        c, hid = self.cfg.cluster, self.hidden
        local = np.maximum(np.minimum(per_node, ranks), 1)
        nodes = np.maximum(ranks / local, 1)
        nvlink = c.intra_node_gb_s * 1e9 * hid.nvlink
        return local, nodes, nvlink, self.nic_bytes_s

    def ring_s(self, nbytes, ranks, per_node, passes: float) -> np.ndarray:
        """Ring reduce-scatter / all-gather (passes=1) or all-reduce (passes=2) of `nbytes`."""
        hid = self.hidden
        local, nodes, nvlink, nic = self._links(per_node, ranks)
        link = np.where(nodes > 1, np.minimum(nvlink, local * nic), nvlink)
        alpha = np.where(nodes > 1, hid.alpha_ib_s, hid.alpha_nvlink_s)
        chunk = nbytes / np.maximum(ranks, 1)
        steps = passes * (ranks - 1)
        t = steps * chunk / self._chunk_bw(link, chunk) + steps * alpha
        return np.where(ranks > 1, t, 0.0)

    def allreduce_s(self, nbytes, ranks, per_node) -> np.ndarray:
        """NCCL all-reduce: the faster of the flat ring and the tree across nodes."""
        hid = self.hidden
        local, nodes, nvlink, nic = self._links(per_node, ranks)
        ring = self.ring_s(nbytes, ranks, per_node, 2.0)
        intra = 2 * (local - 1) / local * nbytes / self._chunk_bw(nvlink, nbytes / local)
        tree = (
            intra
            + 2 * (local - 1) * hid.alpha_nvlink_s
            + nbytes / self._chunk_bw(0.5 * local * nic, nbytes / 2)
            + 2 * np.ceil(np.log2(nodes)) * hid.alpha_ib_s
        )
        return np.where(nodes > 1, np.minimum(ring, tree), ring)

    # --- the model's shapes ------------------------------------------------------------------

    def _layer_params(self) -> float:
        """Weights of a layer that tensor parallelism splits (attention, norms and, averaged
        over the layers, the dense MLPs); routed experts are `_expert_params`."""
        m = self.cfg.model
        d, a, g, h = m.head_dim, m.num_attention_heads, m.query_groups, m.hidden_size
        dense_mlp = (1 - m.moe_layer_share) * (3 if m.gated else 2) * h * m.ffn
        return h * (a + 2 * g) * d + a * d * h + dense_mlp + 4 * h

    def _expert_params(self, t: LayoutTable) -> np.ndarray:
        """Routed-expert weights one rank holds per layer (averaged over the layers): E/ep
        experts, each split over etp."""
        m = self.cfg.model
        if not m.moe:
            return np.zeros(len(t))
        one = (3 if m.gated else 2) * m.hidden_size * m.moe_ffn
        return m.moe_layer_share * (m.num_experts or 1) / t.ep * one / t.etp

    def _expert_group(self, t: LayoutTable) -> np.ndarray:
        """Ranks that reduce an expert's gradients: world / (pp·ep·etp)."""
        return np.maximum(self.cfg.world_size // (t.pp * t.ep * t.etp), 1)

    def _routed(self, t: LayoutTable) -> np.ndarray:
        """Routed tokens per token a rank holds (top-k copies, the busiest rank's excess
        MOE_IMBALANCE, shared by the tp/etp ranks that see the same tokens)."""
        m = self.cfg.model
        return m.moe_router_topk * MOE_IMBALANCE * t.etp / t.tp

    def _stage_layers(self, t: LayoutTable) -> np.ndarray:
        return np.ceil(self.cfg.model.num_layers / t.pp)

    def _vocab(self, t: LayoutTable) -> np.ndarray:
        v = self.cfg.model.vocab_size
        if self.cfg.train.framework == "megatron":
            return np.ceil(v / (128 * t.tp)) * 128 * t.tp
        return np.full(len(t), float(v))

    def _grad_group(self, t: LayoutTable):
        """Ranks of the gradient-reduction group and how many share a node."""
        gpn = self.cfg.cluster.gpus_per_node
        ranks = t.dp * t.cp  # Megatron's dp-cp group; DeepSpeed's seq-data-parallel group
        per_node = np.maximum(gpn // t.tp, 1)
        return ranks, per_node

    # --- step time ---------------------------------------------------------------------------

    def step_time_s(self, t: LayoutTable) -> np.ndarray:
        """Seconds per optimizer step (noise-free) of every row."""
        cfg, hid = self.cfg, self.hidden
        m, c = cfg.model, cfg.cluster
        gpn = c.gpus_per_node
        h, d, a, g, f = m.hidden_size, m.head_dim, m.num_attention_heads, m.query_groups, m.ffn
        s = cfg.train.seq_length
        tp, cp, pp, v = t.tp.astype(float), t.cp.astype(float), t.pp.astype(float), t.vpp
        micro = np.maximum(t.gas, 1).astype(float)
        tokens = t.mbs * s / cp
        peak = c.gpu.peak_tflops[cfg.train.precision] * 1e12
        hbm = c.gpu.hbm_tb_s * 1e12 * hid.hbm

        # one layer, one micro-batch: GEMMs
        share = m.moe_layer_share
        shapes = [
            (1.0, tokens, (a + 2 * g) * d / tp, h),  # QKV
            (1.0, tokens, h, a * d / tp),  # attention output projection
            (1 - share, tokens, (2 if m.gated else 1) * f / tp, h),  # MLP up (and gate)
            (1 - share, tokens, h, f / tp),  # MLP down
        ]
        if m.moe:  # grouped GEMMs of the E/ep local experts, each on its routed tokens
            local = (m.num_experts or 1) / t.ep
            routed = tokens * tp * self._routed(t) / local
            e, up = m.moe_ffn / t.etp, 2 if m.gated else 1
            shapes += [(share * local, routed, up * e, h), (share * local, routed, h, e)]
        fwd = np.zeros(len(t))
        bwd = np.zeros(len(t))
        for weight, rows, n, k in shapes:
            one_f, one_b = self._gemm_train_s(np.broadcast_to(rows, tokens.shape),
                                              np.broadcast_to(n, tokens.shape),
                                              np.broadcast_to(k, tokens.shape))
            fwd, bwd = fwd + weight * one_f, bwd + weight * one_b
        # flash attention: causal scores and values
        attn_flops = 2 * 2 * tokens * s * d * a / tp * 0.5
        attn = attn_flops / (peak * self.device.attention * hid.attention)
        attn = attn * self.distortion.attention
        fwd, bwd = fwd + attn, bwd + 2.5 * attn
        # memory-bound kernels (norms, rope, activation, residuals) and kernel launches
        sp_div = np.where(t.sp, tp, 1.0)
        ew_bytes = 2 * tokens * (14 * h / sp_div + 6 * f / tp + 4 * (a + 2 * g) * d / tp)
        fwd = fwd + ew_bytes / hbm + 14 * hid.launch_s
        bwd = bwd + 2 * ew_bytes / hbm + 28 * hid.launch_s
        # tensor-parallel collectives (all-reduce, or all-gather + reduce-scatter with sp)
        # attention's and the dense MLP's; a MoE layer's experts gather over etp instead (below)
        tp_one = self.allreduce_s(2 * tokens * h, tp, np.full(len(t), gpn))
        fwd_comm = bwd_comm = (2 - share) * tp_one
        # context parallelism
        kv_bytes = 2 * 2 * tokens * g * d / np.minimum(tp, g)
        cross = tp * cp > gpn
        cp_link = np.where(cross, self.nic_bytes_s, c.intra_node_gb_s * 1e9 * hid.nvlink)
        if cfg.train.framework == "megatron":  # ring attention: K/V hop overlapped with a block
            hop = kv_bytes / cp_link + np.where(cross, hid.alpha_ib_s, hid.alpha_nvlink_s)
            cp_fwd = (cp - 1) * np.maximum(hop - attn / cp, 0.0) + hop
            cp_bwd = (cp - 1) * np.maximum(2 * hop - 2.5 * attn / cp, 0.0) + 2 * hop
        else:  # Ulysses: four all-to-alls forward, four backward
            a2a_bytes = 2 * tokens * (2 * a * d + 2 * g * d) / tp
            alpha = np.where(cross, hid.alpha_ib_s, hid.alpha_nvlink_s)
            a2a = (cp - 1) / cp * a2a_bytes / cp_link + (cp - 1) * alpha
            cp_fwd, cp_bwd = a2a, a2a
        cp_fwd, cp_bwd = np.where(cp > 1, cp_fwd, 0.0), np.where(cp > 1, cp_bwd, 0.0)
        # expert parallelism: dispatch and combine all-to-alls, forward and backward
        ep_comm = np.zeros(len(t))
        if m.moe:
            a2a_bytes = 2 * tokens * self._routed(t) * tp * h * (t.ep - 1) / t.ep
            ep_cross = t.ep * t.etp > gpn
            ep_link = np.where(ep_cross, self.nic_bytes_s, c.intra_node_gb_s * 1e9 * hid.nvlink)
            alpha = np.where(ep_cross, hid.alpha_ib_s, hid.alpha_nvlink_s)
            one = a2a_bytes / ep_link + (t.ep - 1) * alpha
            # expert tensor parallelism: the routed tokens are all-gathered over etp after the
            # dispatch and reduce-scattered before the combine (Megatron's alltoall dispatcher),
            # the reverse in the backward
            gathered = 2 * tokens * self._routed(t) * tp * h
            etp_one = self.ring_s(gathered, t.etp.astype(float), np.full(len(t), gpn), 1.0)
            ep_comm = share * (np.where(t.ep > 1, 2 * one, 0.0) + 2 * etp_one)
        layer_fwd = fwd + fwd_comm + cp_fwd + ep_comm
        layer_bwd = bwd + bwd_comm + cp_bwd + ep_comm
        # recompute: full repeats the layer's forward, selective the attention core
        layer_bwd = layer_bwd + np.select([t.recompute == 2, t.recompute == 1], [layer_fwd, attn])

        # the stages: embedding on the first, the output layer and loss on the last
        layers = self._stage_layers(t)
        vocab = self._vocab(t)
        head_f, head_b = self._gemm_train_s(tokens, vocab / tp, np.full(len(t), float(h)))
        loss = 4 * 4 * tokens * vocab / tp / hbm
        stage = layers * (layer_fwd + layer_bwd)
        last = np.where(pp > 1, (m.num_layers - (pp - 1) * layers).clip(min=1), layers)
        last_stage = last * (layer_fwd + layer_bwd) + head_f + head_b + loss
        stage_mb = np.maximum(stage, last_stage) + 0.6e-3  # + schedule bookkeeping

        # pipeline: (v·m + p − 1) chunk slots, each with its sends and a synchronisation
        p2p_bytes = 2 * tokens * h / sp_div
        pp_cross = tp * cp * t.dp >= gpn
        p2p_link = np.where(pp_cross, self.nic_bytes_s, c.intra_node_gb_s * 1e9 * hid.nvlink)
        send = p2p_bytes / p2p_link + np.where(pp_cross, hid.alpha_ib_s, 20e-6)
        chunk = stage_mb / v + 2 * send + 30e-6
        slots = v * micro + self.distortion.bubble * (pp - 1)
        pipeline = np.where(pp > 1, slots * chunk, micro * stage_mb)

        # data parallel: gradients, parameters, optimizer
        ranks, per_node = self._grad_group(t)
        params = layers * self._layer_params() / tp + h * vocab / tp
        deepspeed = cfg.train.framework == "deepspeed"
        grad_bytes = 2.0 if deepspeed else 4.0
        buckets = np.maximum(np.ceil(params / 40e6), 1)
        bwd_mb = layers * layer_bwd
        fwd_mb = layers * layer_fwd
        hide = hid.overlap * bwd_mb if cfg.train.overlap_grad_reduce else 0.0

        def exposed(total: np.ndarray, window) -> np.ndarray:
            return np.maximum(total / buckets, total - window)

        allreduce = self.allreduce_s(grad_bytes * params, ranks, per_node)
        scatter = self.ring_s(grad_bytes * params, ranks, per_node, 1.0)
        gather = self.ring_s(2 * params, ranks, per_node, 1.0)
        z = t.zero
        dp_comm = np.where(z == 0, exposed(allreduce, hide), exposed(scatter, hide))
        if deepspeed:  # ZeRO-2 reduce-scatters every micro-batch; gathers after the step
            dp_comm = dp_comm + np.where(z == 2, (micro - 1) * exposed(scatter, hide), 0.0)
            dp_comm = dp_comm + np.where((z == 1) | (z == 2), gather, 0.0)
        else:  # distributed optimizer: parameter gather overlapped with the next forward
            dp_comm = dp_comm + np.where(
                (z == 1) | (z == 2), exposed(gather, hid.overlap * fwd_mb), 0.0
            )
        # ZeRO-3 / FSDP: per micro-batch and layer, gathers prefetched one layer ahead
        layer_params = self._layer_params() / tp
        ag = self.ring_s(2 * layer_params, ranks, per_node, 1.0) * self.distortion.zero3_gather
        rs = self.ring_s(grad_bytes * layer_params, ranks, per_node, 1.0)
        z3_mb = (
            ag
            + (layers - 1) * np.maximum(ag - layer_fwd, 0.0)
            + (ag + rs)
            + (layers - 1) * np.maximum(ag + rs - layer_bwd, 0.0)
        )
        dp_comm = np.where(z >= 3, micro * z3_mb, dp_comm)
        dp_comm = np.where(ranks > 1, dp_comm, 0.0)
        # routed experts: their gradients reduce over the expert data-parallel group
        experts = layers * self._expert_params(t)
        edp = self._expert_group(t)
        if m.moe:
            e_node = np.maximum(gpn // (t.ep * t.etp), 1)
            e_reduce = np.where(z == 0, self.allreduce_s(grad_bytes * experts, edp, e_node),
                                self.ring_s(grad_bytes * experts, edp, e_node, 1.0)
                                + self.ring_s(2 * experts, edp, e_node, 1.0))
            e_reduce = e_reduce * np.where(z >= 3, micro * self.distortion.zero3_gather, 1.0)
            dp_comm = dp_comm + np.where(edp > 1, exposed(e_reduce, hide), 0.0)

        shard = params / np.where(z >= 1, ranks, 1) + experts / np.where(z >= 1, edp, 1)
        pcie = c.pcie_gb_s * 1e9 * 0.75
        cpu_adam = 0.8e9 / gpn  # parameters per second, one node's CPUs shared by its GPUs
        offload = np.where(t.offload >= 1, 4 * shard / pcie + shard / cpu_adam, 0.0)
        offload = offload + np.where(t.offload == 2, micro * 2 * 2 * shard / pcie, 0.0)
        optimizer = np.where(t.offload >= 1, 0.0, 36 * shard / hbm + 3e-3)
        return pipeline + dp_comm + offload + optimizer + 25e-3

    def tokens_per_s(self, t: LayoutTable) -> np.ndarray:
        """Noise-free tokens per second (each row's own global batch)."""
        tokens = t.mbs * t.dp * np.maximum(t.gas, 1) * self.cfg.train.seq_length
        return tokens / self.step_time_s(t)

    # --- memory ------------------------------------------------------------------------------

    def layer_activation_bytes(self, t: LayoutTable) -> np.ndarray:
        """Bytes one layer saves for backward, one micro-batch, tensor by tensor."""
        m = self.cfg.model
        h, d, a, g, f = m.hidden_size, m.head_dim, m.num_attention_heads, m.query_groups, m.ffn
        tokens = t.mbs * self.cfg.train.seq_length / t.cp
        sp_div = np.where(t.sp, t.tp, 1)
        replicated = 2 * (4 * h) + 4 * 2  # two norm inputs and outputs, fp32 norm statistics
        if m.add_bias_linear:  # GPT: two dropout masks (bytes) on the residual stream
            replicated = replicated + 2 * h
        mlp = 2 * (2 if m.gated else 1) + 2  # up (and gate) outputs, activation output
        sharded = (
            2 * (a + 2 * g) * d  # q, k, v after rotary / bias
            + 2 * a * d + 4 * a  # attention output (the projection's input), log-sum-exp
            + (1 - m.moe_layer_share) * mlp * f
        )
        if m.moe:  # the experts' inputs and intermediates, per routed copy
            sharded = sharded + m.moe_layer_share * self._routed(t) * t.tp * (
                2 * h + mlp * m.moe_ffn / t.etp)
        overhead = self.hidden.activation_overhead * self.distortion.activation
        return tokens * (replicated / sp_div + sharded / t.tp) * overhead

    def peak_allocated_bytes(self, t: LayoutTable) -> np.ndarray:
        """What `torch.cuda.max_memory_allocated` would report on the most loaded rank."""
        cfg = self.cfg
        m = cfg.model
        h = m.hidden_size
        tp, pp, v = t.tp.astype(float), t.pp.astype(float), t.vpp.astype(float)
        micro = np.maximum(t.gas, 1)
        tokens = t.mbs * cfg.train.seq_length / t.cp
        layers = self._stage_layers(t)
        table = h * self._vocab(t) / tp
        per_layer = self._layer_params() / tp
        sp_div = np.where(t.sp, t.tp, 1)

        layer = self.layer_activation_bytes(t)
        full = t.recompute == 2
        checkpoint = 2 * tokens * h / sp_div * self.hidden.activation_overhead
        checkpoint = checkpoint * self.distortion.activation
        stored = np.where(full, checkpoint, layer)
        rematerialised = full * 2 * layer  # a recomputed layer and its gradients
        logits = 8 * tokens * self._vocab(t) / tp  # bf16 logits, fp32 softmax, its gradient
        embedding_out = 2 * tokens * h / sp_div
        # micro-batches in flight (interleaved 1F1B warm-up, in units of whole stages)
        interleaved = v > 1
        first_flight = np.where(
            interleaved, np.minimum(micro * v, 2 * (pp - 1) + (v - 1) * pp + 1) / v,
            np.minimum(micro, pp),
        )
        last_flight = np.where(interleaved, np.minimum(micro * v, (v - 1) * pp + 1) / v, 1.0)

        untied = 0.0 if m.tied_embeddings else 1.0
        experts = layers * self._expert_params(t)
        single = self._states(t, layers * per_layer + (1 + untied) * table, experts) + (
            layers * stored + rematerialised + embedding_out + logits
        )
        first = self._states(t, layers * per_layer + table, experts) + (
            first_flight * (layers * stored + embedding_out) + rematerialised
        )
        last = self._states(t, layers * per_layer + table, experts) + (
            last_flight * layers * stored + rematerialised + logits
        )
        return np.where(pp > 1, np.maximum(first, last), single)

    def _states(self, t: LayoutTable, params: np.ndarray, experts: np.ndarray) -> np.ndarray:
        """Weights, gradients, optimizer states and communication buckets of `params` (sharded
        over dp·cp) and routed `experts` (over the expert data-parallel group)."""
        ranks, _ = self._grad_group(t)
        dense = self._sharded(t, params, ranks, self._layer_params() / t.tp)
        if not self.cfg.model.moe:
            return dense
        return dense + self._sharded(t, experts, self._expert_group(t), self._expert_params(t))

    def _sharded(self, t: LayoutTable, params: np.ndarray, ranks: np.ndarray,
                 layer: np.ndarray | float) -> np.ndarray:
        """States of `params` sharded over `ranks` (`layer`: one layer's share, gathered)."""
        n = np.maximum(ranks, 1)
        z, off = t.zero, t.offload
        live = 2 * 2 * layer  # two gathered layers (prefetch)
        weights = np.where(z >= 3, 2 * params / n + live, 2 * params)
        optimizer = np.where(off >= 1, 0.0, np.where(z >= 1, 12 * params / n, 12 * params))
        if self.cfg.train.framework == "deepspeed":
            # bf16 gradients plus fp32 accumulation, partitioned from ZeRO-1 / ZeRO-2 on
            grads = np.select(
                [z == 0, z == 1], [6 * params, 2 * params + 4 * params / n], 6 * params / n
            )
            grads = np.where(off >= 1, np.where(z >= 3, live, 2 * params / n), grads)
            # reduce bucket double-buffered (overlap_comm) as the rendered ds_config sets it
            bucket = np.minimum(2e8, np.maximum(params, 1e6))
            buffers = np.where(z >= 1, 2 * 2 * 1.1 * bucket, 0.0) + np.where(z >= 3, bucket, 0.0)
        else:  # fp32 main gradients; Megatron-FSDP shards them
            grads = np.where(z >= 2, 4 * params / n + 4 * live / 2, 4 * params)
            buffers = np.zeros(len(t))
        weights = np.where(off == 2, live, weights)
        return weights + grads + optimizer + buffers

    def reserve_bytes(self, t: LayoutTable) -> np.ndarray:
        """Memory outside the allocator: CUDA context, workspaces, NCCL buffers per group."""
        groups = (t.tp > 1) + (t.cp > 1) + (t.pp > 1) + (t.dp * t.cp > 1) + (t.pp > 1)
        gib = self.device.context_gib + 0.35 + self.hidden.nccl_gib_per_group * groups
        gib = gib + self.distortion.reserve_gib
        return gib * GIB

    def fragmentation(self, t: LayoutTable) -> np.ndarray:
        """Reserved / allocated − 1 of the caching allocator."""
        return (
            self.hidden.fragmentation
            + 0.02 * (t.pp > 1)
            + 0.015 * (t.recompute == 2)
            + 0.01 * (t.zero >= 3)
        )

    def oom(self, t: LayoutTable) -> np.ndarray:
        """True where the layout runs out of device memory."""
        need = self.peak_allocated_bytes(t) * (1 + self.fragmentation(t)) + self.reserve_bytes(t)
        return need > self.cfg.cluster.gpu.memory_bytes

    def forward_activation_bytes(self, t: LayoutTable) -> np.ndarray:
        """Activation memory one forward adds (what DeepSpeed's autotuner profiles)."""
        layers = self._stage_layers(t)
        full = t.recompute == 2
        tokens = t.mbs * self.cfg.train.seq_length / t.cp
        sp_div = np.where(t.sp, t.tp, 1)
        checkpoint = 2 * tokens * self.cfg.model.hidden_size / sp_div
        stored = np.where(full, checkpoint, self.layer_activation_bytes(t))
        return layers * stored + 8 * tokens * self._vocab(t) / t.tp

    # --- measuring ---------------------------------------------------------------------------

    def measure(self, layout: Layout, repetition: int = 0) -> Measurement:
        """One trial of `layout`: OOM, or the step time with 1.5 % noise and the peak."""
        table = LayoutTable.from_layouts([layout])
        peak = float(self.peak_allocated_bytes(table)[0])
        if bool(self.oom(table)[0]):
            return Measurement("oom", reason="CUDA out of memory (alien truth)")
        digest = hashlib.sha256(f"{self.seed}:{layout.id}:{repetition}".encode()).digest()
        rng = np.random.default_rng(int.from_bytes(digest[:8], "little"))
        step = float(self.step_time_s(table)[0]) * float(np.exp(rng.normal(0.0, NOISE)))
        tokens = layout.global_batch_size * self.cfg.train.seq_length
        return Measurement(
            "ok",
            step_time_s=step,
            tokens_per_s=tokens / step,
            peak_memory_bytes=peak,
            step_time_spread=NOISE,
        )


class TruthRunner(Runner):
    """Measures trials on an `AlienTruth` (a runner for `autotune.search.study.tune`)."""

    name = "alien-truth"

    def __init__(self, truth: AlienTruth) -> None:
        self.truth = truth
        self.runs: dict[str, int] = {}

    def check(self, cfg) -> None:
        """Runs any problem."""

    def run(self, plan: TrialPlan) -> Measurement:
        repetition = self.runs.get(plan.layout.id, 0)
        self.runs[plan.layout.id] = repetition + 1
        result = self.truth.measure(plan.layout, repetition)
        if result.ok:
            plan.report(1, float(result.tokens_per_s))
        return result
