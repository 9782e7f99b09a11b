"""Floating-point operations of one training iteration (Megatron-Core's definition).

Source: `num_floating_point_operations` in Megatron-LM `megatron/training/training.py` (dense GPT
branch): with T = B·s tokens, q = d·a, κ = d·g and c = 3 for SwiGLU (else 2),

    F = T·{6·h·c·f·L + 6·[h·(q + 2κ) + q·h]·L + 6·h·V} + 6·q·L·B·s²

where the last term is attention scores and values with the causal mask halving them. Recompute
is not counted there ("model FLOPs"); `hardware_flops` adds it.
All functions take plain numbers or numpy arrays (for seq, batch and vocab) and compute in float64
(FLOPs of a large iteration overflow int64).
"""

from __future__ import annotations

from typing import Any

from autotune.specs import ModelSpec


def dense_flops_per_token_per_layer(model: ModelSpec) -> int:
    """Matrix-multiply FLOPs (forward + backward) per layer and token, scores excluded."""
    h, f, d = model.hidden_size, model.ffn, model.head_dim
    q, kv = d * model.num_attention_heads, d * model.query_groups
    mlp_matrices = 3 if model.gated else 2
    return 6 * h * mlp_matrices * f + 6 * (h * (q + 2 * kv) + q * h)


def attention_flops_per_token_per_layer(model: ModelSpec, seq: Any) -> Any:
    """Score and value FLOPs (forward + backward) per layer and token, causal-halved."""
    return 6.0 * model.head_dim * model.num_attention_heads * seq


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
