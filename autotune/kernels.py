"""Compute of one transformer layer on one GPU for one micro-batch, for many layouts at once.

A layer is its linear GEMMs (by shape: QKV, output projection, MLP up/gate and down, each split
by tensor parallelism), its attention core and its memory-bound kernels:

- GEMM: 2·M·N·K FLOPs forward, twice that backward (input and weight gradients), at
  `gemm_efficiency · x / (x + gemm_half_size)` of peak, x = (M·N·K)^(1/3) of that GEMM; FP8
  training runs these (only these) at the FP8 peak and `fp8_gemm_efficiency`.
- attention: fused (flash) attention at `attention_efficiency` of the 16-bit peak on the causal
  FLOPs; without flash, score and value GEMMs over the whole s×s square (no causal skipping)
  plus the score matrix's softmax/dropout traffic.
- memory-bound kernels at `hbm_efficiency` of HBM bandwidth: norms, residual adds (and dropout
  masks), rotary, the MLP activation and FP8 casts, each tensor read or written once per pass
  (`elementwise_bytes`), times `elementwise_passes`; backward moves twice the forward bytes.

Context parallelism gives each GPU s/cp queries against (causally, on average) half of all s
keys: its attention FLOPs are 1/cp of the sequence's. Recompute repeats the forward (full) or the
attention core (selective) inside the backward.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from autotune.constants import Constants
from autotune.flops import attention_flops_per_token_per_layer
from autotune.layout import LayoutTable
from autotune.specs import AutotuneConfig
from autotune.specs import ModelSpec

SCORE_BYTES_FORWARD = 13
"""Unfused attention, bytes per score element forward: write scores (2), fused scale-mask-
softmax read and write (4), dropout read, write and mask (5), values GEMM read (2)."""
LOSS_BYTES_PER_LOGIT = 32
"""Vocabulary-parallel cross entropy, bytes per logit element forward plus backward: fp32
upcast (2 + 4), max and exp-sum passes (8), softmax write (4), gradient (4 + 4), 16-bit
gradient write (2), the 16-bit logits re-read (4)."""
FP8_CAST_BYTES = 2
"""FP8 cast of one GEMM operand element: write the FP8 copy and its transpose (1 + 1); the
16-bit read is fused into the kernel that produced it (Transformer Engine's LayerNorm and
activation kernels emit FP8, cast_transpose fuses the rest)."""


def linear_shapes(model: ModelSpec, tp: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """(N, K) of each linear GEMM of a dense layer on one tensor-parallel rank (M = tokens):
    QKV and MLP up/gate split their outputs, projection and MLP down their inputs."""
    h, d = model.hidden_size, model.head_dim
    q, kv = d * model.num_attention_heads, d * model.query_groups
    up = model.ffn * (2 if model.gated else 1)
    ones = np.ones_like(tp, dtype=float)
    return [((q + 2 * kv) / tp, h * ones), (h * ones, q / tp), (up / tp, h * ones),
            (h * ones, model.ffn / tp)]


def gemm_efficiency(m: Any, n: Any, kk: Any, k: Constants, fp8: bool = False) -> Any:
    """Achieved fraction of peak for an M×N×K GEMM."""
    x = np.cbrt(m * n * kk)
    top = k.fp8_gemm_efficiency if fp8 else k.gemm_efficiency
    return top * x / (x + k.gemm_half_size)


def elementwise_bytes(cfg: AutotuneConfig, t: LayoutTable) -> np.ndarray:
    """HBM bytes the memory-bound kernels of one layer move forward, for one micro-batch.

    Per token of this GPU: two norms (read + write h), two residual adds (two reads and a write
    of h) and, with dropout, their 1-byte masks, on s/cp tokens (÷tp with sequence parallelism);
    rotary on q and k, the MLP activation (SwiGLU reads 2f, writes f), and with FP8 the cast of
    every GEMM input, on the tensor-parallel shard.
    """
    m = cfg.model
    n = t.mbs * cfg.train.seq_length / t.cp
    h, d = m.hidden_size, m.head_dim
    q, kv = d * m.num_attention_heads, d * m.query_groups
    replicated = 2 * (2 * h + 2 * h) + 2 * (3 * 2 * h) + (2 * h if m.hidden_dropout > 0 else 0)
    sharded = (6 if m.gated else 4) * m.ffn
    if m.position_embedding == "rope":
        sharded = sharded + 2 * 2 * (q + kv)
    if cfg.train.precision == "fp8":
        sharded = sharded + FP8_CAST_BYTES * (q + m.ffn)
        replicated = replicated + FP8_CAST_BYTES * 2 * h
    return n * (replicated / np.where(t.sp, t.tp, 1) + sharded / t.tp)


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
        return self.linear_forward + self.attention_forward + self.memory_forward

    @property
    def backward(self) -> np.ndarray:
        """Backward seconds, recompute included."""
        work = self.linear_forward + self.attention_forward + self.memory_forward
        return 2 * work + self.recompute

    @property
    def total(self) -> np.ndarray:
        """Forward plus backward seconds."""
        return self.forward + self.backward


def layer_times(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> LayerTimes:
    """One dense layer's compute for one micro-batch on one GPU of each layout."""
    m, train, gpu = cfg.model, cfg.train, cfg.cluster.gpu
    peak16 = gpu.peak_tflops.get("bf16", gpu.peak_tflops[train.precision]) * 1e12
    fp8 = train.precision == "fp8"
    peak = gpu.peak_tflops[train.precision] * 1e12
    hbm = gpu.hbm_tb_s * 1e12 * k.hbm_efficiency
    s = train.seq_length
    n = t.mbs * s / t.cp  # tokens of this GPU (all of them enter every tensor-parallel GEMM)

    linear = np.zeros(len(t))
    column = np.zeros(len(t))
    linear_flops = np.zeros(len(t))
    for index, (out, into) in enumerate(linear_shapes(m, t.tp)):
        flops = 2 * n * out * into
        seconds = flops / (peak * gemm_efficiency(n, out, into, k, fp8))
        linear, linear_flops = linear + seconds, linear_flops + flops
        if index in (0, 2):
            column = column + 2 * seconds

    # attention: causal FLOPs of s/cp queries over the sequence, split over tp
    fused = train.flash_attention
    causal = n * attention_flops_per_token_per_layer(m, s) / t.tp / 3  # forward
    heads = m.num_attention_heads / t.tp
    if fused:
        attention = causal / (peak16 * k.attention_efficiency)
        attention_flops = 3.5 * causal  # backward recomputes the scores: 2.5x forward
        scores = np.zeros(len(t))
    else:
        square = 2 * causal  # the whole s x s square, no causal skipping
        per_head = gemm_efficiency(s / t.cp, s, m.head_dim, k)
        attention = square / (peak16 * per_head)
        attention_flops = 3 * square
        scores = SCORE_BYTES_FORWARD * heads * n * s
    memory = k.elementwise_passes * (elementwise_bytes(cfg, t) + scores) / hbm

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


def head_times(cfg: AutotuneConfig, t: LayoutTable, vocab: np.ndarray,
               k: Constants) -> tuple[np.ndarray, np.ndarray]:
    """(seconds, FLOPs) of the output layer and the loss for one micro-batch on the last stage:
    the logits GEMM (forward and both gradients) and the cross entropy's memory traffic."""
    m, train, gpu = cfg.model, cfg.train, cfg.cluster.gpu
    fp8 = train.precision == "fp8"
    peak = gpu.peak_tflops[train.precision] * 1e12
    hbm = gpu.hbm_tb_s * 1e12 * k.hbm_efficiency
    n = t.mbs * train.seq_length / t.cp
    out = vocab / t.tp
    flops = 2 * n * out * m.hidden_size
    gemm = 3 * flops / (peak * gemm_efficiency(n, out, m.hidden_size, k, fp8))
    loss = k.elementwise_passes * LOSS_BYTES_PER_LOGIT * n * out / hbm
    return gemm + loss, 3 * flops
