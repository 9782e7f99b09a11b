"""What one rank holds: parameters of a pipeline stage on one rank, dense and expert apart.

Plain arithmetic over the model's shape, for many layouts at once; the vocabulary is passed in
as the framework pads it (`Framework.padded_vocab`).

Dense parts (attention, dense MLPs, shared experts, embedding, output layer) are split by tp and
replicated over dp·cp; norms and MoE routers are replicated on every tensor-parallel rank
(megatron-core's TopKRouter weight is not tensor-parallel). Routed experts follow the expert grid
world = etp·ep·pp·edp (Megatron's "MoE parallel folding"): a rank holds E/ep local experts, each
split by etp, replicated over the edp = world/(etp·ep·pp) expert data-parallel ranks. Source:
NVIDIA/Megatron-LM `megatron/training/theoretical_memory_usage.py` @
d98e8a64ddf34856e74b24714e3bedb2f5a39553 (tp-sharded, replicated and expert-sharded params on the
most loaded shard). Dense and MoE layers are mixed on a stage in the model's proportion (the
mean layer, as that formula's /pp does).
"""

from __future__ import annotations

import numpy as np

from autotune.layout import LayoutTable
from autotune.specs import AutotuneConfig
from autotune.specs import ModelSpec


def element_bytes(cfg: AutotuneConfig) -> int:
    """Bytes of one activation, weight or gradient element in the training dtype: 4 in fp32
    training, 2 otherwise (bf16/fp16, and fp8 training, whose activations and communication
    stay 16-bit)."""
    return 4 if cfg.train.precision == "fp32" else 2


def _mean_layer(model: ModelSpec) -> tuple[float, float, float]:
    """Weights of the mean transformer layer: (split by tp, replicated, routed experts)."""
    norms = 2 * model.hidden_size * model.norm_factor
    counts = model.param_counts()
    moe = counts.moe_layer
    if moe is None:
        return model.layer_params() - norms, norms, 0.0
    share = model.moe_layer_share
    experts = share * moe.experts * moe.expert
    replicated = norms + share * moe.router
    return counts.layers_total / model.num_layers - experts - replicated, replicated, experts


def params_on_rank(
    model: ModelSpec,
    t: LayoutTable,
    vocab: np.ndarray,
    layers: np.ndarray,
    embedding: np.ndarray,
    output: np.ndarray,
    experts: bool = True,
) -> np.ndarray:
    """Parameters held (before ZeRO sharding) by one rank of a stage; without the routed experts
    (`expert_params_on_rank`) when `experts` is False."""
    split, replicated, _ = _mean_layer(model)
    table = model.hidden_size * vocab / t.tp
    # a tied output layer still needs its own copy of the embedding on the last stage when pp > 1
    has_output_weight = output & ((~embedding) | (not model.tied_embeddings))
    params: np.ndarray = (
        layers * (split / t.tp + replicated)
        + embedding * table
        + has_output_weight * table
        + output * model.hidden_size * model.norm_factor
    )
    if experts and model.moe:
        params = params + expert_params_on_rank(model, t, layers)
    return params


def expert_params_on_rank(model: ModelSpec, t: LayoutTable, layers: np.ndarray) -> np.ndarray:
    """Routed-expert parameters held (before ZeRO) by one rank of a stage: E/ep experts / etp."""
    params: np.ndarray = layers * (_mean_layer(model)[2] / (t.ep * t.etp))
    return params


def layer_params_on_rank(model: ModelSpec, t: LayoutTable) -> np.ndarray:
    """Parameters of the mean transformer layer on one rank, before ZeRO sharding: the dense
    part split by tp, the replicated norms and routers, and its E/ep routed experts split by
    etp (what an FSDP unit over a transformer layer gathers)."""
    split, replicated, experts = _mean_layer(model)
    layer: np.ndarray = split / t.tp + replicated + experts / (t.ep * t.etp)
    return layer


def largest_module_params(model: ModelSpec, t: LayoutTable, vocab: np.ndarray) -> np.ndarray:
    """Parameters of the largest single module on a rank (what ZeRO-3 gathers at once)."""
    mlp = model.hidden_size * model.ffn * (2 if model.gated else 1)
    largest: np.ndarray = np.maximum(model.hidden_size * vocab, mlp) / t.tp
    return largest
