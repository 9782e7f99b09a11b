"""Floating-point operations of one training iteration (Megatron-Core's definition).

Source: `num_floating_point_operations` in NVIDIA/Megatron-LM `megatron/training/training.py`
@ d98e8a64ddf34856e74b24714e3bedb2f5a39553 (`transformer_flops`, BSHD). With T = B·s tokens,
c = 3 for SwiGLU (else 2), L = L_dense + L_moe layers (the MoE layer pattern:
`moe_layer_freq` and the first dense layers), f the dense MLP width, f_e one routed expert's,
k the routed experts per token and f_s the shared experts' total width,

    F = T·{6·h·c·[f·L_dense + (f_e·k + f_s)·L_moe] + A·L + 6·h·V} + 6·W·L·B·s²

where A is the attention projections' FLOPs per token, 6·[h·(q + 2κ) + q·h] with q = d·a,
κ = d·g, or for multi-latent attention 6·[r_q·(h + a·(d_n + d_r) + 1) + r_kv·(h + a·(d_n + d_v)
+ 1) + h·d_r + a·d_v·h] (latent ranks r, no-position, rotary and value head widths d); and
W·s is the attention scores and values with the causal mask halving them: W = q, or
a·(d_n + d_r + d_v)/2 with multi-latent attention. Routers are not counted there, nor is
recompute ("model FLOPs"); `hardware_flops` adds the recompute.
All functions take plain numbers or numpy arrays (for seq, batch and vocab) and compute in float64
(FLOPs of a large iteration overflow int64).
"""

from __future__ import annotations

from typing import Any

from autotune.specs import ModelSpec
from autotune.specs.params import Projection
from autotune.specs.params import projections


def _matmul(parts: tuple[Projection, ...]) -> int:
    """Multiply-adds of `parts` per token."""
    return sum(p.inputs * p.outputs for p in parts)


def attention_linear_flops_per_token(model: ModelSpec) -> int:
    """Attention projection FLOPs (forward + backward) per layer and token (Megatron counts one
    FLOP per latent-norm element of multi-latent attention too)."""
    shapes = projections(model)
    return 6 * (_matmul(shapes.attention) + shapes.latent_ranks)


def mlp_flops_per_token(model: ModelSpec, moe: bool) -> int:
    """MLP FLOPs (forward + backward) per token of one dense or one MoE layer: a MoE layer
    counts its top-k routed experts and its shared experts, not the router."""
    shapes = projections(model)
    if not moe:
        return 6 * _matmul(shapes.mlp)
    return 6 * (model.moe_router_topk * _matmul(shapes.expert) + _matmul(shapes.shared_experts))


def dense_flops_per_token_per_layer(model: ModelSpec) -> float:
    """Matrix-multiply FLOPs (forward + backward) per token of the mean layer (dense and MoE
    layers in the model's proportion), scores excluded."""
    moe_layers = sum(model.moe_layer_pattern)
    mlp = ((model.num_layers - moe_layers) * mlp_flops_per_token(model, moe=False)
           + moe_layers * mlp_flops_per_token(model, moe=True))
    return attention_linear_flops_per_token(model) + mlp / model.num_layers


def attention_width(model: ModelSpec) -> float:
    """W: score and value FLOPs per token and key are 6·W with the causal halving."""
    heads = model.num_attention_heads
    if model.multi_latent_attention:
        widths = (model.qk_head_dim or 0) + (model.qk_pos_emb_head_dim or 0)
        return heads * (widths + (model.v_head_dim or 0)) / 2
    return model.head_dim * heads


def attention_flops_per_token_per_layer(model: ModelSpec, seq: Any) -> Any:
    """Score and value FLOPs (forward + backward) per layer and token, causal-halved."""
    return 6.0 * attention_width(model) * seq


def logits_flops_per_token(model: ModelSpec, vocab: Any) -> Any:
    """Output-layer FLOPs (forward + backward) for one token."""
    return 6.0 * model.hidden_size * vocab


def model_flops(model: ModelSpec, seq: Any, batch: Any, vocab: Any) -> Any:
    """Megatron-Core's FLOPs for one iteration of `batch` sequences (no recompute)."""
    per_token = model.num_layers * (
        dense_flops_per_token_per_layer(model) + attention_flops_per_token_per_layer(model, seq)
    ) + logits_flops_per_token(model, vocab)
    return 1.0 * batch * seq * per_token


def recompute_flops_fraction(model: ModelSpec, seq: Any, recompute: Any) -> Any:
    """Extra layer FLOPs of recompute, as a fraction of the layers' model FLOPs.

    Full recompute repeats every layer's forward (one third of forward + backward); selective
    recompute repeats only the attention-score forward. `recompute` is 0/1/2 (none/selective/full).
    """
    dense = dense_flops_per_token_per_layer(model)
    scores = attention_flops_per_token_per_layer(model, seq)
    full = (recompute == 2) * (1 / 3)
    selective = (recompute == 1) * (scores / 3) / (dense + scores)
    return full + selective


def hardware_flops(model: ModelSpec, seq: Any, batch: Any, vocab: Any, recompute: Any) -> Any:
    """FLOPs the hardware executes in one iteration: model FLOPs plus recomputed forwards."""
    layers = (
        1.0
        * batch
        * seq
        * model.num_layers
        * (
            dense_flops_per_token_per_layer(model)
            + attention_flops_per_token_per_layer(model, seq)
        )
    )
    return model_flops(model, seq, batch, vocab) + layers * recompute_flops_fraction(
        model, seq, recompute
    )
