"""What one rank holds: parameters of a pipeline stage on one tensor-parallel rank.

Plain arithmetic over the model's shape, for many layouts at once; the vocabulary is passed in
as the framework pads it (`Framework.padded_vocab`).
"""

from __future__ import annotations

import numpy as np

from autotune.layout import LayoutTable
from autotune.specs import ModelSpec


def params_on_rank(
    model: ModelSpec,
    t: LayoutTable,
    vocab: np.ndarray,
    layers: np.ndarray,
    embedding: np.ndarray,
    output: np.ndarray,
) -> np.ndarray:
    """Parameters held (before ZeRO sharding) by one tensor-parallel rank of a stage."""
    norms = 2 * model.hidden_size * model.norm_factor
    sharded = (model.layer_params() - norms) / t.tp
    table = model.hidden_size * vocab / t.tp
    # a tied output layer still needs its own copy of the embedding on the last stage when pp > 1
    has_output_weight = output & ((~embedding) | (not model.tied_embeddings))
    return (
        layers * (sharded + norms)
        + embedding * table
        + has_output_weight * table
        + output * model.hidden_size * model.norm_factor
    )


def largest_module_params(model: ModelSpec, t: LayoutTable, vocab: np.ndarray) -> np.ndarray:
    """Parameters of the largest single module on a rank (what ZeRO-3 gathers at once)."""
    mlp = model.hidden_size * model.ffn * (2 if model.gated else 1)
    return np.maximum(model.hidden_size * vocab, mlp) / t.tp
