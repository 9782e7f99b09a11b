"""Parameter counts of a ModelSpec, by part and layer kind: the one source of these counts.

Every count is exact for the Hugging Face model of the same config (tests/specs_tests build
each family on the meta device with transformers) and for megatron-core's GPTModel of the same
spec (the parts Megatron can build). Each part includes its own biases.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from autotune.specs.model import ModelSpec

_NORMS_PER_LAYER = {"pre_norm": 2, "parallel": 2, "parallel_shared_norm": 1, "sandwich": 4}


@dataclasses.dataclass(frozen=True, slots=True)
class LayerParams:
    """Weights of one transformer layer of one kind (dense or MoE)."""

    attention: int
    """Query/key/value/output projections (or multi-latent attention), their biases and norms."""
    mlp: int
    """The dense MLP (0 in a MoE layer)."""
    expert: int
    """One routed expert (0 in a dense layer)."""
    experts: int
    """Routed experts in the layer (0 in a dense layer)."""
    topk: int
    """Routed experts each token uses (0 in a dense layer)."""
    shared_experts: int
    """Shared experts and their gate."""
    router: int
    """Router weights (expert-bias buffers are not weights)."""
    norms: int
    """The layer's own norms (before attention and MLP, and after them in a sandwich block)."""

    @property
    def total(self) -> int:
        """All weights of the layer."""
        return self._common + self.experts * self.expert

    @property
    def active(self) -> int:
        """Weights one token uses: its top-k routed experts only."""
        return self._common + self.topk * self.expert

    @property
    def _common(self) -> int:
        return self.attention + self.mlp + self.shared_experts + self.router + self.norms


@dataclasses.dataclass(frozen=True, slots=True)
class ParamCounts:
    """Weights of a whole model: layers by kind, embedding, output layer and final norm."""

    dense_layer: LayerParams
    """One layer with a dense MLP."""
    moe_layer: LayerParams | None
    """One Mixture-of-Experts layer (None for a dense model)."""
    dense_layers: int
    """How many dense layers."""
    moe_layers: int
    """How many MoE layers."""
    embedding: int
    """Token table, learned position table and embedding norm."""
    output: int
    """Untied output layer (0 when tied to the embedding)."""
    final_norm: int
    """The norm after the last layer."""

    @property
    def layers_total(self) -> int:
        """Weights of all transformer layers."""
        return self.dense_layers * self.dense_layer.total + self.moe_layers * self._moe("total")

    @property
    def layers_active(self) -> int:
        """Weights of all transformer layers that one token uses."""
        return self.dense_layers * self.dense_layer.active + self.moe_layers * self._moe("active")

    @property
    def total(self) -> int:
        """All weights; tied weights count once."""
        return self.layers_total + self.embedding + self.output + self.final_norm

    @property
    def active(self) -> int:
        """Weights one token uses (equals total for a dense model)."""
        return self.layers_active + self.embedding + self.output + self.final_norm

    def _moe(self, kind: str) -> int:
        return getattr(self.moe_layer, kind) if self.moe_layer is not None else 0


def _linear(m: ModelSpec, inputs: int, outputs: int, bias: bool | None = None) -> int:
    """Weights of a linear layer, with a bias when the model's linears have one."""
    has_bias = m.add_bias_linear if bias is None else bias
    return inputs * outputs + (outputs if has_bias else 0)


def _norm(m: ModelSpec, width: int) -> int:
    return width * m.norm_factor


def _mlp(m: ModelSpec, width: int) -> int:
    """A (gated) MLP h -> width -> h."""
    up = 2 * width if m.gated else width
    return _linear(m, m.hidden_size, up) + _linear(m, width, m.hidden_size)


def _attention(m: ModelSpec) -> int:
    h, heads = m.hidden_size, m.num_attention_heads
    if m.multi_latent_attention:
        return _latent_attention(m)
    d, g = m.head_dim, m.query_groups
    qkv = (heads + 2 * g) * d
    weights = h * qkv + _linear(m, heads * d, h)
    biases = qkv if (m.add_bias_linear or m.add_qkv_bias) else 0
    norms = 2 * _norm(m, d) if m.qk_layernorm else 0
    return weights + biases + norms


def _latent_attention(m: ModelSpec) -> int:
    """DeepSeek's multi-latent attention (megatron-core MLASelfAttention's projections)."""
    h, heads = m.hidden_size, m.num_attention_heads
    nope, rope, v = m.qk_head_dim or 0, m.qk_pos_emb_head_dim or 0, m.v_head_dim or 0
    kv_rank = m.kv_lora_rank or 0
    q_out = heads * (nope + rope)
    if m.q_lora_rank is None:
        query = _linear(m, h, q_out)
    else:
        query = _linear(m, h, m.q_lora_rank) + _linear(m, m.q_lora_rank, q_out)
        query += _norm(m, m.q_lora_rank) if m.qk_layernorm else 0
    key_value = _linear(m, h, kv_rank + rope) + _linear(m, kv_rank, heads * (nope + v))
    key_value += _norm(m, kv_rank) if m.qk_layernorm else 0
    return query + key_value + _linear(m, heads * v, h)


def _layer(m: ModelSpec, moe: bool) -> LayerParams:
    shared = 0
    if moe and m.moe_shared_expert_intermediate_size:
        shared = _mlp(m, m.moe_shared_expert_intermediate_size)
        shared += m.hidden_size if m.moe_shared_expert_gate else 0
    return LayerParams(
        attention=_attention(m),
        mlp=0 if moe else _mlp(m, m.ffn),
        expert=_mlp(m, m.moe_ffn) if moe else 0,
        experts=(m.num_experts or 0) if moe else 0,
        topk=m.moe_router_topk if moe else 0,
        shared_experts=shared,
        router=(m.num_experts or 0) * m.hidden_size if moe else 0,
        norms=_NORMS_PER_LAYER[m.layer_block] * _norm(m, m.hidden_size),
    )


def count_params(m: ModelSpec, vocab: int | None = None) -> ParamCounts:
    """Weights of `m` by part (vocab: count this, e.g. padded, vocabulary instead)."""
    v = vocab or m.vocab_size
    h = m.hidden_size
    positions = 0
    if m.position_embedding == "learned_absolute":
        positions = (m.max_position_embeddings + m.learned_position_offset) * h
    moe_layers = sum(m.moe_layer_pattern)
    return ParamCounts(
        dense_layer=_layer(m, moe=False),
        moe_layer=_layer(m, moe=True) if m.moe else None,
        dense_layers=m.num_layers - moe_layers,
        moe_layers=moe_layers,
        embedding=v * h + positions + (_norm(m, h) if m.embedding_layernorm else 0),
        output=0 if m.tied_embeddings else v * h,
        final_norm=_norm(m, h),
    )
