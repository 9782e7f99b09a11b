"""Parameter counts of a ModelSpec, by part and layer kind: the one source of these counts.

Every count is exact for the Hugging Face model of the same config (tests/specs_tests build
each family on the meta device with transformers) and for megatron-core's GPTModel of the same
spec (the parts Megatron can build). Each part includes its own biases.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING
from typing import Literal

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


@dataclasses.dataclass(frozen=True, slots=True)
class Projection:
    """One linear projection of a layer: `inputs` → `outputs` features, and which side tensor
    parallelism splits (etp for a routed expert)."""

    name: str
    inputs: int
    outputs: int
    split: Literal["outputs", "inputs"] | None
    """"outputs": column-parallel (QKV, MLP up); "inputs": row-parallel (output projection,
    MLP down); None: replicated (multi-latent attention's down projections)."""
    bias: bool
    """Whether it carries a bias (the model's linear bias; QKV also with add_qkv_bias)."""

    @property
    def weights(self) -> int:
        """Weights and bias."""
        return self.inputs * self.outputs + (self.outputs if self.bias else 0)


@dataclasses.dataclass(frozen=True, slots=True)
class LayerProjections:
    """The linear projections of a layer, by part (megatron-core's shapes): the one owner of
    these shapes, which parameter counts sum, `costmodel.flops` takes 6x (forward and backward)
    and `costmodel.kernels` splits into per-GPU GEMMs."""

    attention: tuple[Projection, ...]
    """GQA: QKV and the output projection; multi-latent attention: the KV down and up
    projections, the query (down and up with a query rank) and the output projection."""
    mlp: tuple[Projection, ...]
    """The dense MLP: up (and gate) and down."""
    shared_experts: tuple[Projection, ...]
    """A MoE layer's shared experts as one MLP (empty without)."""
    expert: tuple[Projection, ...]
    """One routed expert's up (and gate) and down (empty for a dense model)."""

    @property
    def latent_ranks(self) -> int:
        """Multi-latent attention's query and KV ranks (the inputs of its up projections): the
        widths of its latent norms (0 for GQA)."""
        return sum(p.inputs for p in self.attention if p.name.endswith("_up"))


def _norm(m: ModelSpec, width: int) -> int:
    return width * m.norm_factor


def _mlp_projections(m: ModelSpec, width: int) -> tuple[Projection, ...]:
    """A (gated) MLP h -> width -> h."""
    up = 2 * width if m.gated else width
    return (Projection("up", m.hidden_size, up, "outputs", m.add_bias_linear),
            Projection("down", width, m.hidden_size, "inputs", m.add_bias_linear))


def _attention_projections(m: ModelSpec) -> tuple[Projection, ...]:
    h, heads, bias = m.hidden_size, m.num_attention_heads, m.add_bias_linear
    if not m.multi_latent_attention:
        d, g = m.head_dim, m.query_groups
        qkv_bias = m.add_bias_linear or m.add_qkv_bias
        return (Projection("qkv", h, (heads + 2 * g) * d, "outputs", qkv_bias),
                Projection("out", heads * d, h, "inputs", bias))
    # DeepSeek's multi-latent attention (megatron-core MLASelfAttention): down projections
    # replicated, up projections and the output projection split by tp; the KV down projection
    # is the latent (kv rank) plus the shared rotary key
    nope, rope, v = m.qk_head_dim or 0, m.qk_pos_emb_head_dim or 0, m.v_head_dim or 0
    kv_rank = m.kv_lora_rank or 0
    q_out = heads * (nope + rope)
    kv = [Projection("kv_down", h, kv_rank + rope, None, bias),
          Projection("kv_up", kv_rank, heads * (nope + v), "outputs", bias)]
    if m.q_lora_rank is None:
        query = [Projection("q", h, q_out, "outputs", bias)]
    else:
        query = [Projection("q_down", h, m.q_lora_rank, None, bias),
                 Projection("q_up", m.q_lora_rank, q_out, "outputs", bias)]
    return (*kv, *query, Projection("out", heads * v, h, "inputs", bias))


def projections(m: ModelSpec) -> LayerProjections:
    """The linear projections of `m`'s layers (MoE parts empty for a dense model)."""
    shared = m.moe_shared_expert_intermediate_size
    return LayerProjections(
        attention=_attention_projections(m),
        mlp=_mlp_projections(m, m.ffn),
        shared_experts=_mlp_projections(m, shared) if shared else (),
        expert=_mlp_projections(m, m.moe_ffn) if m.moe else (),
    )


def _weights(parts: tuple[Projection, ...]) -> int:
    return sum(p.weights for p in parts)


def _attention(m: ModelSpec, shapes: LayerProjections) -> int:
    """The attention projections plus their own norms (qk norms; MLA's latent norms)."""
    norms = 0
    if m.qk_layernorm and m.multi_latent_attention:
        norms = _norm(m, m.kv_lora_rank or 0) + _norm(m, m.q_lora_rank or 0)
    elif m.qk_layernorm:
        norms = 2 * _norm(m, m.head_dim)
    return _weights(shapes.attention) + norms


def _layer(m: ModelSpec, moe: bool) -> LayerParams:
    shapes = projections(m)
    shared = 0
    if moe and m.moe_shared_expert_intermediate_size:
        shared = _weights(shapes.shared_experts)
        shared += m.hidden_size if m.moe_shared_expert_gate else 0
    return LayerParams(
        attention=_attention(m, shapes),
        mlp=0 if moe else _weights(shapes.mlp),
        expert=_weights(shapes.expert) if moe else 0,
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
