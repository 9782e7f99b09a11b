"""The eager stack: a layer's elementwise ops run unfused, one ATen kernel per op.

CPU workers (`ClusterSpec.cpu_processes`) run the built-in workloads' layers as plain PyTorch:
no Apex or Transformer Engine fusions and no compilation, so every norm, rotary, activation
and residual op is its own kernel that reads its inputs and writes its output, and each op
pays a dispatch cost. `autotune.costmodel.kernels.elementwise_bytes` counts fused-kernel
traffic instead (a norm reads and writes h once, in 16-bit): for tiny-gpt in fp32 about a
fifth of the bytes these layers move, and no cost per op.

`eager_elementwise` counts, per token of one layer, the elements the layer's non-GEMM,
non-view ops read and write, forward plus backward, and the number of those ops. The counts
are read off the ops PyTorch dispatches for `autotune.workloads.deepspeed_gpt.DecoderLayer`
(`torch.nn.RMSNorm` decomposes into pow, mean, add, rsqrt and two muls; `torch.nn.LayerNorm`
is one `native_layer_norm`; `rotary` is neg, cat, two muls and an add per tensor; SwiGLU is
silu and mul; biases are summed over tokens in the backward); `tests/costmodel_tests`
checks them against a `TorchDispatchMode` count of that layer at three shapes. The ops that
build the rotary tables and the per-token statistics of a norm (1/h of its traffic) are
left out. The time is `bytes / (bandwidth · eager_efficiency) + ops · eager_op_s`: both
constants come from `autotune calibrate`'s eager microbenchmark.

`saved_activation_bytes` counts the bytes autograd keeps for one such layer's backward
(checked against `torch.autograd.graph.saved_tensors_hooks`).

`first_touch_s` charges the tensors of at least 32 MiB that every use maps afresh (glibc
`malloc` serves them with `mmap` and unmaps them on free, PyTorch's CPU allocator keeps no
cache): their page faults and zeroing, at `first_touch_s_per_gb` (checked against the minor
page faults `getrusage` counts over the output layer and loss).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from autotune.costmodel.constants import Constants
from autotune.costmodel.sharding import element_bytes
from autotune.layout import LayoutTable
from autotune.specs import AutotuneConfig

RMSNORM = (7, 24, 6, 14)
"""torch.nn.RMSNorm unfused, per token in units of h: forward pow (2), mean (1), mul by the
reciprocal (2), mul by the weight (2); backward 24 (two 3h products, two 2h scalings, two
reductions, the pow/div/mul chain of the rsqrt's gradient, the sum of x's two paths);
then its ops forward (pow, mean, add, rsqrt, mul, mul) and backward (14)."""
LAYERNORM = (2, 3, 1, 1)
"""torch.nn.LayerNorm: `native_layer_norm` reads and writes h, its backward reads x and the
gradient and writes the input gradient; one op each way."""
ROPE = (10, 14, 15, 7)
"""`rotary` per rotated tensor, per token in units of its width w: forward neg (w), cat (2w),
two muls by cos and sin (2w each), add (3w); backward two muls (4w), two slice_backward
(3w), two adds (6w), neg (w); ops forward (15 with the table's arange, pow, cos, sin ...)
and backward (7)."""


MMAP_THRESHOLD_MAX = 32 * 2**20
"""glibc's largest dynamic mmap threshold on 64-bit (`DEFAULT_MMAP_THRESHOLD_MAX`,
4 MiB · sizeof(long), malloc/malloc.c): a request at least this large is always mapped anew."""
HEAD_FRESH_TENSORS = 4
"""Logit-sized tensors the output layer and its loss create per micro-batch: the logits, the
log-softmax (`F.cross_entropy`), and in the backward the loss's gradient into the
log-softmax and the log-softmax's gradient into the logits."""


def first_touch_s(nbytes: Any, k: Constants) -> Any:
    """Seconds of the first touch of fresh tensors of `nbytes` each: their bytes at
    `first_touch_s_per_gb` where at least MMAP_THRESHOLD_MAX (mapped anew), else 0 (the heap
    serves them again)."""
    return np.where(nbytes >= MMAP_THRESHOLD_MAX, nbytes, 0.0) * k.first_touch_s_per_gb / 1e9


def runs_eager(cfg: AutotuneConfig) -> bool:
    """Whether the layers run as unfused eager ops: the CPU workers of `--cluster local`."""
    return cfg.cluster.cpu_processes


def _widths(cfg: AutotuneConfig, t: LayoutTable) -> tuple[Any, Any, Any]:
    """Per-token widths on this rank: the hidden state (÷tp with sequence parallelism), the
    queries and the keys (or values), each ÷tp."""
    m = cfg.model
    return (m.hidden_size / np.where(t.sp, t.tp, 1), m.head_dim * m.num_attention_heads / t.tp,
            m.head_dim * m.query_groups / t.tp)


def _mlp(width: Any, gated: bool, bias: bool, hidden: Any) -> tuple[Any, int]:
    """(elements per token, ops) of an MLP's elementwise work of `width` (already split by
    tp): SwiGLU silu (2f) and mul (3f) forward, two muls and silu_backward (9f) and the sum of
    the gate and up input gradients (3h) backward; GELU 2f and 3f; with biases each linear's
    bias gradient reads its output gradient."""
    elements = (5 + 9) * width + 3 * hidden if gated else (2 + 3) * width
    ops = 2 + 3 + 1 if gated else 1 + 1
    if bias:
        elements = elements + (2 if gated else 1) * width + hidden
        ops += 3 if gated else 2
    return elements, ops


def eager_elementwise(cfg: AutotuneConfig, t: LayoutTable,
                      copies: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(bytes, ops) of one layer's elementwise ops, forward plus backward, one micro-batch.

    Per token of this rank (s·b/cp): two norms and two residual adds (forward 3h each,
    backward 3h each) on h (÷tp with sequence parallelism), the two sums of the q, k, v input
    gradients (3h each), rotary on q and k, the MLP's activation on its tp shard (a MoE layer:
    its shared experts on every token, its routed experts on `copies`, the token copies of
    the slowest rank, `kernels.routed_tokens` times `moe_load_imbalance`; None: a dense
    layer).
    """
    m = cfg.model
    n = t.mbs * cfg.train.seq_length / t.cp
    h, q, kv = _widths(cfg, t)
    norm = RMSNORM if m.normalization == "rmsnorm" else LAYERNORM
    bias = m.add_bias_linear
    elements = 2 * (norm[0] + norm[1]) * h + 2 * 6 * h + 2 * 3 * h
    ops = 2 * (norm[2] + norm[3]) + 2 * 2 + 2
    if m.position_embedding == "rope":
        elements = elements + (ROPE[0] + ROPE[1]) * (q + kv)
        ops += 2 * (ROPE[2] + ROPE[3])
    if bias:  # q, k, v and output-projection bias gradients
        elements = elements + q + 2 * kv + h
        ops += 4
    moe = copies is not None
    width = (m.moe_shared_expert_intermediate_size or 0) if moe else m.ffn
    mlp, mlp_ops = _mlp(width / t.tp, m.gated, bias, h)
    total = n * (elements + (mlp if width else 0))
    ops += mlp_ops if width else 0
    counted = np.full(len(t), float(ops))
    if copies is not None:
        # each local expert runs its MLP's ops on its share of the slowest rank's copies
        routed, routed_ops = _mlp(m.moe_ffn / t.etp, m.gated, bias, h)
        total = total + copies * routed
        counted = counted + routed_ops * (m.num_experts or 1) / t.ep
    moved: np.ndarray = total * element_bytes(cfg)
    return moved, counted


def eager_time(moved: Any, ops: Any, bandwidth: float, k: Constants) -> Any:
    """Seconds of eager ops that move `moved` bytes in `ops` dispatched ops: `bandwidth` (B/s,
    the device's streaming rate) at `eager_efficiency`, plus `eager_op_s` per op."""
    return moved / (bandwidth * k.eager_efficiency) + ops * k.eager_op_s


def eager_seconds(cfg: AutotuneConfig, t: LayoutTable, k: Constants, bandwidth: float,
                  copies: np.ndarray | None = None) -> np.ndarray:
    """Seconds of one layer's eager elementwise ops, forward plus backward, one micro-batch
    (`eager_time` of `eager_elementwise`)."""
    moved, ops = eager_elementwise(cfg, t, copies)
    seconds: np.ndarray = eager_time(moved, ops, bandwidth, k)
    return seconds


def _mlp_saved(width: Any, gated: bool) -> Any:
    """Elements an eager MLP keeps per token: SwiGLU the gate output (silu's input), silu's
    output, the up output and the down projection's input (4f); GELU its input and output."""
    return (4 if gated else 2) * width


def saved_activation_bytes(cfg: AutotuneConfig, t: LayoutTable,
                           copies: np.ndarray | None = None) -> np.ndarray:
    """Bytes autograd keeps for one eager layer's backward, one micro-batch, its input
    included (what `torch.autograd.graph.saved_tensors_hooks` sees for `DecoderLayer`).

    Per token: each norm keeps its input, its normalised input and its output (RMSNorm also
    its 1/rms; LayerNorm its mean and 1/σ): 3h + 1 or 2h + 2; attention keeps the rotated q
    and k, v (what SDPA saves, and what the QKV GEMMs' outputs become), its output (the
    output projection's input, a view) and the log-sum-exp per head: 2q + 2kv + heads; the
    MLP `_mlp_saved`. A multiply by a tensor that needs no gradient keeps only that tensor,
    so rotary keeps its cos and sin tables (4·s·d per micro-batch), not its inputs. Selective
    recompute drops the log-sum-exp (the checkpoint keeps q, k and v, the output projection
    the output). A MoE layer keeps its shared experts' MLP on every token and, per routed
    copy (`copies`, as `eager_elementwise` takes them), the expert input and output (2h) and
    the expert MLP (the router's probabilities are counted by the caller)."""
    m = cfg.model
    s = cfg.train.seq_length / t.cp
    n = s * t.mbs
    h, q, kv = _widths(cfg, t)
    heads = m.num_attention_heads / t.tp * (t.recompute == 0)
    norms = 2 * (3 * h + 1 if m.normalization == "rmsnorm" else 2 * h + 2)
    per_token = norms + 2 * q + 2 * kv + heads
    width = (m.moe_shared_expert_intermediate_size or 0) if copies is not None else m.ffn
    elements = n * (per_token + _mlp_saved(width / t.tp, m.gated))
    if m.position_embedding == "rope":
        elements = elements + 4 * s * m.head_dim
    if copies is not None:
        elements = elements + copies * (2 * m.hidden_size + _mlp_saved(m.moe_ffn / t.etp,
                                                                        m.gated))
    saved: np.ndarray = elements * element_bytes(cfg)
    return saved


EAGER_ADAM_BYTES = 84
"""torch's AdamW on CPU tensors (`_single_tensor_adam`, DeepSpeed's `torch_adam`), bytes per
fp32 parameter as its ops dispatch them: weight decay `param.mul_` (8), `exp_avg.lerp_(grad)`
(12), `exp_avg_sq.mul_` (8) and `addcmul_(grad, grad)` (16), the denominator's `sqrt`,
division and `add_(eps)` (8 each), `param.addcdiv_(exp_avg, denom)` (16)."""
CLIP_BYTES = 12
"""Gradient clipping: the norm reads the gradient (4), the scaling reads and writes it (8)
(the engine's `clip_grad_norm_`; `unscale_and_clip_grads` under ZeRO)."""
ZERO_STEP_BYTES = 36
"""What ZeRO 1-3's `step` adds per parameter of the partition, as a DeepSpeed engine's step
dispatches it: the gradients flattened into the fp32 partition's gradient (`cat`, 8), a
second norm pass (4), the fp32 partition cast and copied back into the 16-bit buffer and
the model's weights (`_to_copy` 12, `copy_` 12; `stage_1_and_2.py`'s `step`). The
partitions' all-gather is a collective, charged with the data-parallel traffic."""


def eager_optimizer_s(t: LayoutTable, k: Constants, shard: Any, bandwidth: float) -> Any:
    """Seconds of one optimizer step on a CPU worker for `shard` parameters: torch's
    AdamW and the gradient clipping as eager memory-bound passes, plus ZeRO's copies with
    ZeRO 1-3 (counted against a real DeepSpeed engine's `step` in `tests/costmodel_tests`)."""
    moved = (EAGER_ADAM_BYTES + CLIP_BYTES + np.where(t.zero >= 1, ZERO_STEP_BYTES, 0)) * shard
    return eager_time(moved, 0, bandwidth, k)


EAGER_GRAD_ACCUMULATION_BYTES = 12
"""Autograd's `AccumulateGrad` on micro-batches 2..gas: `.grad` += the new weight gradient,
reading both and writing the sum, fp32 bytes per parameter the rank holds."""


def eager_grad_accumulation_s(t: LayoutTable, k: Constants, params: Any,
                              bandwidth: float) -> Any:
    """Seconds per step of the weight-gradient additions after the first micro-batch."""
    extra = np.maximum(t.micro_batches - 1, 0)
    return eager_time(extra * EAGER_GRAD_ACCUMULATION_BYTES * params, 0, bandwidth, k)
