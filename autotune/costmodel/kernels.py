"""Compute of one transformer layer on one GPU for one micro-batch, for many layouts at once.

A layer is its linear GEMMs (by shape: QKV, output projection, MLP up/gate and down, each split
by tensor parallelism), its attention core and its memory-bound kernels:

- GEMM: 2·M·N·K FLOPs forward, twice that backward (input and weight gradients), at
  `gemm_efficiency · x / (x + gemm_half_size)` of peak, x = (M·N·K)^(1/3) of that GEMM; FP8
  training runs these (only these) at the FP8 peak and `fp8_gemm_efficiency`.
- attention: fused (flash) attention at `attention_efficiency` of the 16-bit peak on the causal
  FLOPs (`flash_attention_efficiency` where Transformer Engine runs FlashAttention-2:
  `attention_rate`); without flash, score and value GEMMs over the whole s×s square (no causal
  skipping) plus the score matrix's softmax/dropout traffic.
- memory-bound kernels at `hbm_efficiency` of HBM bandwidth: norms, residual adds (and dropout
  masks), rotary, the MLP activation and FP8 casts, each tensor read or written once per pass
  (`elementwise_bytes`), times `elementwise_passes`; backward moves twice the forward bytes.
  CPU workers run these ops unfused and eager instead (`autotune.costmodel.eager`), and pay
  the first touch of GEMM outputs and logit-sized tensors of at least 32 MiB
  (`eager.first_touch_s`).

Context parallelism gives each GPU s/cp queries against (causally, on average) half of all s
keys: its attention FLOPs are 1/cp of the sequence's. Recompute repeats the forward (full) or the
attention core (selective) inside the backward.

Multi-latent attention runs its down projections replicated and its up and output projections
split by tp (megatron-core MLASelfAttention). A Mixture-of-Experts layer (`layer_gemms`) keeps
the attention, runs its shared experts as a tensor-parallel MLP, its router (h × E) on the
rank's own tokens, and its routed experts as grouped GEMMs: E/ep local experts, each an M×N×K
GEMM whose M is the token copies per local expert (`routed_tokens`·ep/E) and whose N or K is the
expert width split by etp. That M is small (a micro-batch of one 4k sequence: Mixtral at tp 1,
ep 8 gives 4k·2·8/8 = 8k; DeepSeek-V3 at tp 2, ep 64 gives 2k·8·64/256 = 4k; at ep 8, 512), so
`gemm_efficiency` at that size is the grouped GEMM's efficiency. The most loaded
expert-parallel rank gets `load_imbalance` times the mean copies; the layer waits for it, so
its expert GEMMs and routed memory traffic set the time (FLOPs executed stay the balanced
count). A stage runs dense and MoE layers in the model's proportion (`mean_layer_times`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from autotune.costmodel.constants import Constants
from autotune.costmodel.eager import HEAD_FRESH_TENSORS
from autotune.costmodel.eager import eager_seconds
from autotune.costmodel.eager import first_touch_s
from autotune.costmodel.eager import runs_eager
from autotune.costmodel.flops import attention_flops_per_token_per_layer
from autotune.costmodel.sharding import element_bytes
from autotune.costmodel.terms import terms_for
from autotune.layout import LayoutTable
from autotune.specs import AutotuneConfig
from autotune.specs import ModelSpec
from autotune.specs import TrainSpec
from autotune.specs.params import Projection
from autotune.specs.params import projections
from autotune.specs.types import Precision

SCORE_BYTES_FORWARD = 13
"""Unfused attention, bytes per score element forward: write scores (2), fused scale-mask-
softmax read and write (4), dropout read, write and mask (5), values GEMM read (2)."""
LOSS_BYTES_PER_LOGIT = 32
"""Vocabulary-parallel cross entropy, bytes per logit element forward plus backward: fp32
upcast (2 + 4), max and exp-sum passes (8), softmax write (4), gradient (4 + 4), 16-bit
gradient write (2), the 16-bit logits re-read (4)."""
FP8_CAST_BYTES = {"delayed": 2.0, "tensorwise": 6.0, "blockwise": 4.0 + 8 / 128,
                  "mxfp8": 4.0 + 2 / 32}
"""HBM bytes the FP8 cast of one GEMM operand element moves, per `TrainSpec.fp8_recipe`
(Transformer Engine's quantizers). delayed: write the FP8 copy and its transpose (1 + 1); where
TE's fused LayerNorm produced the input its scale is known in advance and the 16-bit read is
fused into the norm (other producers: `FP8_CAST_READ_BYTES`). tensorwise (current
scaling): the producer writes 16 bits, an amax pass reads them (2) before the cast reads them
again (2) and writes both copies (2). blockwise: the cast computes each block's scale as it
reads (2) and writes both copies (2) plus an fp32 scale per 128 elements in each direction.
mxfp8: the same with a 1-byte E8M0 scale per 32 elements in each direction."""
FP8_CAST_READ_BYTES = {"delayed": 2.0, "tensorwise": 0.0, "blockwise": 0.0, "mxfp8": 0.0}
"""Bytes the cast adds, per `TrainSpec.fp8_recipe`, where the GEMM input comes from a kernel
that emits 16 bits: the cast reads it. Transformer Engine's `Linear` (`_Linear.forward`) runs
`fp8_cast_transpose_fused` on its 16-bit input; only `LayerNormLinear` emits FP8 from its own
norm. On megatron-core that fuses the QKV and MLP-up inputs (`TELayerNormColumnParallelLinear`);
the attention output and megatron-core's own activation (`bias_gelu_impl`, `bias_swiglu_impl`)
feed `TERowParallelLinear` in 16 bits, and on the other stacks every GEMM input does (LLM
Foundry's `fc_type: te` makes each linear a `te.Linear` after torch's LayerNorm and GELU). The
other recipes already count their read (`FP8_CAST_BYTES`)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Gemm:
    """One linear GEMM of a layer on one GPU: M×N×K, run `count` times (a grouped GEMM's
    experts), M scaled by `slow` on the most loaded rank (routed experts)."""

    m: Any
    n: Any
    k: Any
    count: Any = 1
    column: bool = False
    """Column-parallel (QKV, MLP up): backward tensor-parallel collectives may hide under it."""
    fp8: bool = True
    """Runs in FP8 in FP8 training (routers stay 16-bit)."""
    slow: Any = 1.0
    routed: bool = False
    """A routed expert's grouped GEMM (M: token copies per local expert)."""


def _tp_gemms(parts: tuple[Projection, ...], n: Any, tp: np.ndarray) -> list[Gemm]:
    """The GEMMs of `parts` on n tokens of one GPU, each split by tp on its split side."""
    ones = np.ones_like(tp, dtype=float)
    return [Gemm(n, p.outputs / tp if p.split == "outputs" else p.outputs * ones,
                 p.inputs / tp if p.split == "inputs" else p.inputs * ones,
                 column=p.split == "outputs") for p in parts]


def load_imbalance(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> np.ndarray:
    """Routed copies of the most loaded expert-parallel rank over the mean: 1 under forced
    balancing (`TrainSpec.moe_force_balance`), else `moe_load_imbalance`. On CPU workers (the
    built-in workload's short trials, whose router is the one it was initialised with) that
    constant is a micro-batch of one sequence's, and the excess over 1 shrinks as
    1/sqrt(sequences): a sequence's tokens route alike (attention mixes them), sequences
    independently (`autotune.calibration.router_load` measures it)."""
    ones = np.ones(len(t))
    if cfg.train.moe_force_balance:
        return ones
    excess = (k.moe_load_imbalance - 1) * ones
    if cfg.cluster.cpu_processes:
        excess = excess / np.sqrt(t.mbs)
    imbalance: np.ndarray = 1 + excess
    return imbalance


def routed_tokens(cfg: AutotuneConfig, t: LayoutTable) -> np.ndarray:
    """Token copies one rank's experts process per MoE layer and micro-batch, balanced routing.

    Each GPU routes its own s·b/(cp·tp) tokens (sequence-parallel with tp; Megatron's MoE
    refuses tp without sp, DeepSpeed drops the tp duplicates) k times; the all-to-all over ep
    delivers, on average, as many copies as it sent (E/ep local experts of E), and etp > 1
    all-gathers the copies of the etp ranks that split the same experts."""
    m = cfg.model
    local = t.mbs * cfg.train.seq_length / (t.cp * t.tp)
    copies: np.ndarray = local * m.moe_router_topk * t.etp
    return copies


def layer_gemms(cfg: AutotuneConfig, t: LayoutTable, k: Constants, moe: bool) -> list[Gemm]:
    """The linear GEMMs of one dense or MoE layer on one GPU for one micro-batch.

    Dense: QKV, output projection, MLP up/gate and down on all s·b/cp tokens, split by tp.
    MoE: the same attention; shared experts as a tensor-parallel MLP; the router (h × E,
    replicated, on the rank's own tokens); the routed experts as grouped GEMMs over E/ep local
    experts whose M is the tokens per local expert, `routed_tokens`·ep/E, which
    `moe_load_imbalance` scales on the slowest rank (small M: low `gemm_efficiency`).
    """
    m = cfg.model
    n = t.mbs * cfg.train.seq_length / t.cp  # tokens of this GPU (all enter every tp GEMM)
    shapes = projections(m)
    gemms = _tp_gemms(shapes.attention, n, t.tp)
    if not moe:
        return gemms + _tp_gemms(shapes.mlp, n, t.tp)
    gemms += _tp_gemms(shapes.shared_experts, n, t.tp)
    experts = m.num_experts or 1
    h, ones = m.hidden_size, np.ones_like(t.tp, dtype=float)
    gemms.append(Gemm(n / t.tp, experts * ones, h * ones, fp8=False))
    per_expert = routed_tokens(cfg, t) * t.ep / experts
    local = experts / t.ep
    up, down = shapes.expert  # split by etp
    slow = load_imbalance(cfg, t, k)
    return gemms + [Gemm(per_expert, up.outputs / t.etp, up.inputs * ones, local, slow=slow,
                         routed=True),
                    Gemm(per_expert, down.outputs * ones, down.inputs / t.etp, local, slow=slow,
                         routed=True)]


def window_share(m: ModelSpec, seq: int) -> float:
    """Keys a query attends to, over the layers, relative to full causal attention: 1 without
    a sliding window. A window of W keys before the query (Megatron's `--window-size W,0`)
    attends to min(i + 1, W + 1) keys at position i, W + 1 − W(W + 1)/(2s) on average against
    (s + 1)/2 causally; it runs on the layers whose 1-based number is not a multiple of
    `window_attn_skip_freq` (megatron-core `is_layer_window_attention`), on all without it.
    Fused (cuDNN / flash) attention skips the blocks outside the window."""
    w = m.window_size
    if w is None or w + 1 >= seq:
        return 1.0
    freq = m.window_attn_skip_freq
    windowed = m.num_layers if freq is None else sum(
        1 for layer in range(1, m.num_layers + 1) if layer % freq != 0)
    ratio = (w + 1 - w * (w + 1) / (2 * seq)) / ((seq + 1) / 2)
    return 1.0 - windowed / m.num_layers * (1.0 - ratio)


def gemm_efficiency(m: Any, n: Any, kk: Any, k: Constants, fp8: bool = False) -> Any:
    """Achieved fraction of peak for an M×N×K GEMM."""
    x = np.cbrt(m * n * kk)
    top = k.fp8_gemm_efficiency if fp8 else k.gemm_efficiency
    return top * x / (x + k.gemm_half_size)


def gemm_seconds(cfg: AutotuneConfig, gemm: Gemm, k: Constants) -> tuple[Any, Any]:
    """(forward seconds on the slowest rank, balanced forward FLOPs) of one layer GEMM: FP8
    GEMMs at the FP8 peak in FP8 training, the rest at the 16-bit peak; a routed expert's
    grouped GEMM at `grouped_gemm_efficiency` (FP8: `fp8_grouped_gemm_efficiency`) of the rate
    one GEMM of its shape reaches."""
    train, gpu = cfg.train, cfg.cluster.gpu
    fp8 = train.precision == "fp8" and gemm.fp8
    name: Precision = "fp8" if fp8 else _sixteen(cfg)
    peak = gpu.peak_tflops[name] * 1e12
    flops = 2 * gemm.m * gemm.n * gemm.k * gemm.count
    rate = peak * gemm_efficiency(gemm.m * gemm.slow, gemm.n, gemm.k, k, fp8)
    if gemm.routed:
        rate = rate * (k.fp8_grouped_gemm_efficiency if fp8 else k.grouped_gemm_efficiency)
    return flops * gemm.slow / rate, flops


def _sixteen(cfg: AutotuneConfig) -> Precision:
    """The peak that what runs outside FP8 GEMMs uses: bf16 in FP8 training (where the GPU
    lists it), else the training precision's."""
    precision = cfg.train.precision
    if precision == "fp8" and "bf16" in cfg.cluster.gpu.peak_tflops:
        return "bf16"
    return precision


def elementwise_bytes(cfg: AutotuneConfig, t: LayoutTable, k: Constants,
                      moe: bool = False) -> np.ndarray:
    """HBM bytes the memory-bound kernels of one layer move forward, for one micro-batch.

    Per token of this GPU: two norms (read + write h), two residual adds (two reads and a write
    of h) and, with dropout, their 1-byte masks, on s/cp tokens (÷tp with sequence parallelism);
    rotary on q and k, the MLP activation (SwiGLU reads 2f, writes f), and with FP8 the cast of
    every GEMM input, on the tensor-parallel shard. A MoE layer runs the activation on its
    shared experts (tp shard) and on the routed copies of the slowest rank (expert width / etp),
    whose permutation and un-permutation each read and write 2h bytes per copy, and the router
    writes and reads fp32 scores over all E experts for the rank's own tokens.
    """
    m = cfg.model
    n = t.mbs * cfg.train.seq_length / t.cp
    h, d = m.hidden_size, m.head_dim
    q, kv = d * m.num_attention_heads, d * m.query_groups
    act = 6 if m.gated else 4
    replicated = 2.0 * (2 * h + 2 * h) + 2 * (3 * 2 * h) + (2 * h if m.hidden_dropout > 0 else 0)
    width = (m.moe_shared_expert_intermediate_size or 0) if moe else m.ffn
    sharded = 1.0 * act * width
    if m.position_embedding == "rope":
        sharded = sharded + 2 * 2 * (q + kv)
    fp8 = cfg.train.precision == "fp8"
    recipe = cfg.train.fp8_recipe
    cast = FP8_CAST_BYTES[recipe] + FP8_CAST_READ_BYTES[recipe]  # from a 16-bit producer
    normed = cast - FP8_CAST_READ_BYTES[recipe] * (cfg.train.software_stack == "megatron-core")
    if fp8:
        sharded = sharded + cast * (q + width)
        replicated = replicated + normed * 2 * h
    total: np.ndarray = n * (replicated / np.where(t.sp, t.tp, 1) + sharded / t.tp)
    if not moe:
        return total
    copies = routed_tokens(cfg, t) * load_imbalance(cfg, t, k)
    per_copy = act * m.moe_ffn / t.etp + 2 * (2 * 2 * h)
    if fp8:
        per_copy = per_copy + cast * (h + m.moe_ffn / t.etp)
    router = n / t.tp * 2 * 4 * (m.num_experts or 1)
    with_experts: np.ndarray = total + copies * per_copy + router
    return with_experts


@dataclasses.dataclass(slots=True)
class LayerTimes:
    """Seconds of one layer for one micro-batch on one GPU (arrays over layouts)."""

    linear_forward: np.ndarray
    """Linear GEMMs, forward (backward is twice this)."""
    column_backward: np.ndarray
    """Backward GEMMs of the column-parallel linears (QKV, MLP up): tensor-parallel
    collectives of the backward may hide under them."""
    attention_forward: np.ndarray
    """Attention core, forward (backward is twice this)."""
    memory_forward: np.ndarray
    """Memory-bound kernels, forward (backward is twice this)."""
    recompute: np.ndarray
    """Forward work repeated in the backward by activation recompute."""
    flops: np.ndarray
    """FLOPs executed (recompute and unfused full-square attention included)."""

    @property
    def forward(self) -> np.ndarray:
        """Forward seconds."""
        work: np.ndarray = self.linear_forward + self.attention_forward + self.memory_forward
        return work

    @property
    def backward(self) -> np.ndarray:
        """Backward seconds, recompute included."""
        work = self.linear_forward + self.attention_forward + self.memory_forward
        backward: np.ndarray = 2 * work + self.recompute
        return backward

    @property
    def total(self) -> np.ndarray:
        """Forward plus backward seconds."""
        total: np.ndarray = self.forward + self.backward
        return total


def attention_rate(train: TrainSpec, k: Constants) -> float:
    """Fraction of the 16-bit peak the fused attention kernel reaches: FlashAttention-2's
    where Transformer Engine is told to run it (`TrainSpec.attention_backend` flash), else the
    stack's fitted kernel."""
    if train.attention_backend == "flash":
        return k.flash_attention_efficiency
    return k.attention_efficiency


def layer_times(cfg: AutotuneConfig, t: LayoutTable, k: Constants,
                moe: bool = False) -> LayerTimes:
    """One dense (or MoE) layer's compute for one micro-batch on one GPU of each layout."""
    m, train, gpu = cfg.model, cfg.train, cfg.cluster.gpu
    # what runs outside FP8 GEMMs runs at 16 bits in FP8 training, else at the training precision
    peak16 = gpu.peak_tflops[_sixteen(cfg)] * 1e12
    hbm = gpu.hbm_tb_s * 1e12 * k.hbm_efficiency
    s = train.seq_length
    n = t.mbs * s / t.cp  # tokens of this GPU (all of them enter every tensor-parallel GEMM)

    linear = np.zeros(len(t))
    column = np.zeros(len(t))
    linear_flops = np.zeros(len(t))
    touched = np.zeros(len(t))  # CPU workers: GEMM outputs mapped afresh, both passes
    width = element_bytes(cfg)
    for gemm in layer_gemms(cfg, t, k, moe):
        seconds, flops = gemm_seconds(cfg, gemm, k)
        linear, linear_flops = linear + seconds, linear_flops + flops
        if gemm.column:
            column = column + 2 * seconds
        rows = gemm.m * gemm.slow
        touched = touched + gemm.count * sum(first_touch_s(width * a * b, k) for a, b in (
            (rows, gemm.n), (rows, gemm.k), (gemm.n, gemm.k)))

    # attention: causal FLOPs of s/cp queries over the sequence (or its windows), split over tp
    fused = train.flash_attention
    causal = n * attention_flops_per_token_per_layer(m, s) / t.tp / 3  # forward
    if fused:
        causal = causal * window_share(m, s)
    heads = m.num_attention_heads / t.tp
    if fused:
        attention = causal / (peak16 * attention_rate(train, k))
        attention_flops = 3.5 * causal  # backward recomputes the scores: 2.5x forward
        scores = np.zeros(len(t))
    else:
        square = 2 * causal  # the whole s x s square, no causal skipping
        per_head = gemm_efficiency(s / t.cp, s, m.head_dim, k)
        attention = square / (peak16 * per_head)
        attention_flops = 3 * square
        scores = SCORE_BYTES_FORWARD * heads * n * s
    memory = k.elementwise_passes * (elementwise_bytes(cfg, t, k, moe) + scores) / hbm
    if runs_eager(cfg):  # unfused ops: a third of their forward-plus-backward time forward
        copies = routed_tokens(cfg, t) * load_imbalance(cfg, t, k) if moe else None
        memory = (k.elementwise_passes * scores / hbm
                  + (eager_seconds(cfg, t, k, gpu.hbm_tb_s * 1e12 * k.hbm_efficiency, copies)
                     + touched) / 3)

    full = t.recompute == 2
    selective = t.recompute == 1
    recompute = np.where(full, linear + attention + memory, np.where(selective, attention, 0.0))
    attention_forward_flops = causal if fused else 2 * causal
    executed = (3 * linear_flops + attention_flops
                + full * linear_flops + (full | selective) * attention_forward_flops)
    return LayerTimes(
        linear_forward=linear,
        column_backward=column,
        attention_forward=attention,
        memory_forward=memory,
        recompute=recompute,
        flops=executed,
    )



def mean_layer_times(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> LayerTimes:
    """The mean layer of a stage: dense and MoE layers in the model's proportion (a pipeline
    stage is charged its layer count times this mean)."""
    dense = layer_times(cfg, t, k)
    share = cfg.model.moe_layer_share
    if share == 0:
        return dense
    moe = layer_times(cfg, t, k, moe=True)
    return LayerTimes(**{
        field.name: (1 - share) * getattr(dense, field.name) + share * getattr(moe, field.name)
        for field in dataclasses.fields(LayerTimes)
    })


def head_times(cfg: AutotuneConfig, t: LayoutTable, vocab: np.ndarray,
               k: Constants) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, FLOPs) of the output layer and the loss for one micro-batch on the last stage:
    the logits GEMM (forward and both gradients) and the cross entropy's memory traffic, on
    the rank's vocabulary shard (the whole vocabulary where the framework's tensor
    parallelism leaves the output layer whole, `tp_splits_output_layer`; its FLOPs are then
    the rank's 1/tp share, the model's FLOPs counted once). The logits GEMM runs at 16 bits
    in FP8 training too: no stack runs its output layer in FP8 (megatron-core's
    `output_layer` is a `tensor_parallel.ColumnParallelLinear`, not a Transformer Engine
    module, so `fp8_autocast` leaves it alone; LLM Foundry's tied head is a plain `F.linear`;
    torchtitan's float8 conversion skips `output`)."""
    m, train, gpu = cfg.model, cfg.train, cfg.cluster.gpu
    peak = gpu.peak_tflops[_sixteen(cfg)] * 1e12
    hbm = gpu.hbm_tb_s * 1e12 * k.hbm_efficiency
    n = t.mbs * train.seq_length / t.cp
    out = vocab / (t.tp if terms_for(cfg).tp_splits_output_layer else 1)
    flops = 2 * n * out * m.hidden_size
    gemm = 3 * flops / (peak * gemm_efficiency(n, out, m.hidden_size, k))
    loss = k.elementwise_passes * LOSS_BYTES_PER_LOGIT * n * out / hbm
    if runs_eager(cfg):  # CPU workers map the logit-sized tensors afresh at every use
        loss = loss + HEAD_FRESH_TENSORS * first_touch_s(4 * n * out, k)
    # the model's FLOPs: a whole output layer repeated on every tp rank counts once
    return gemm + loss, 3 * flops * (vocab / t.tp) / out
