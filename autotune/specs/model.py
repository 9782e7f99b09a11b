"""The network to train: `ModelSpec` (dense and MoE, MLA, rope scaling) and its checks."""

from __future__ import annotations

from typing import Annotated
from typing import Literal

from pydantic import BaseModel
from pydantic import Field
from pydantic import model_validator

from autotune.specs.params import ParamCounts
from autotune.specs.params import count_params
from autotune.specs.types import FROZEN
from autotune.specs.types import Activation
from autotune.specs.types import ExpertCount
from autotune.specs.types import HeadCount
from autotune.specs.types import LayerBlock
from autotune.specs.types import LayerCount
from autotune.specs.types import LayerCountOrZero
from autotune.specs.types import LoadBalancing
from autotune.specs.types import PositionEmbedding
from autotune.specs.types import SeqLength
from autotune.specs.types import VocabSize
from autotune.specs.types import Width
from autotune.specs.types import _Flag
from autotune.specs.types import _Positive
from autotune.specs.types import _Probability


class RopeScaling(BaseModel):
    """Rotary frequency scaling for long context: Llama 3.x (`llama3`) or YaRN (`yarn`).

    Field names follow Hugging Face's `rope_scaling`; each docstring names the Megatron-LM flag.
    """

    model_config = FROZEN

    type: Literal["llama3", "yarn"]
    """Scaling method: `--use-rope-scaling` (llama3); `--position-embedding-type yarn`, or
    `--rope-type yarn` with multi-latent attention (yarn)."""
    factor: _Positive
    """Context extension factor: `--rope-scaling-factor` (llama3), `--rotary-scaling-factor`
    (yarn)."""
    original_max_position_embeddings: SeqLength
    """Context length the model was pretrained with. llama3: Megatron fixes 8192; yarn:
    `--yarn-original-max-position-embeddings` (multi-latent attention fixes 4096)."""
    low_freq_factor: _Positive = 1.0
    """llama3 only; Megatron fixes 1."""
    high_freq_factor: _Positive = 4.0
    """llama3 only; Megatron fixes 4."""
    beta_fast: _Positive = 32.0
    """yarn only: `--yarn-beta-fast` (multi-latent attention fixes 32)."""
    beta_slow: _Positive = 1.0
    """yarn only: `--yarn-beta-slow` (multi-latent attention fixes 1)."""
    mscale: _Positive = 1.0
    """yarn only: `--mscale`."""
    mscale_all_dim: Annotated[float, Field(strict=True, ge=0)] = 0.0
    """yarn only: `--mscale-all-dim`."""


class ModelSpec(BaseModel):
    """A decoder-only transformer, dense or Mixture-of-Experts, in Megatron-LM's argument names.

    Each field's docstring names the `pretrain_gpt.py` flag (or megatron-core field) it sets;
    `autotune.frameworks.megatron.model` turns a spec into them and refuses what Megatron
    cannot build.
    `param_counts()` (autotune/specs/params.py) is the one source of parameter counts.
    """

    model_config = FROZEN

    name: str = "custom"
    """Display name (a preset name, or the file it came from)."""

    # --- shape -------------------------------------------------------------------------------
    num_layers: LayerCount
    """Transformer layers L: `--num-layers`."""
    hidden_size: Width
    """Model width h: `--hidden-size`."""
    num_attention_heads: HeadCount
    """Query heads a: `--num-attention-heads`."""
    num_query_groups: HeadCount | None = None
    """Key/value heads g: `--group-query-attention --num-query-groups`; None means g = a."""
    kv_channels: Width | None = None
    """Channels per attention head d: `--kv-channels`; None means h / a (then a must divide
    h). Gemma, Qwen3 and Mistral-NeMo set it."""
    ffn_hidden_size: Width | None = None
    """Width f of the dense MLP (and default expert width): `--ffn-hidden-size`; None means 4h."""
    vocab_size: VocabSize
    """Tokenizer vocabulary V before any padding: `--vocab-size`."""
    max_position_embeddings: SeqLength = 2048
    """Longest sequence the model supports, in tokens: `--max-position-embeddings`."""

    # --- MLP ---------------------------------------------------------------------------------
    activation: Activation = "gelu"
    """MLP activation: gelu (erf, Megatron's default), gelu_tanh (GELU's tanh approximation:
    GPT-2, BLOOM), relu (OPT), swiglu (`--swiglu`), geglu (tanh-GELU-gated, Gemma). The gated
    ones have three weight matrices instead of two."""
    add_bias_linear: _Flag = True
    """Every linear layer has a bias (GPT-2, OPT, BLOOM); False: `--disable-bias-linear`."""
    add_qkv_bias: _Flag = False
    """Only the query/key/value projections have biases (Qwen2): `--add-qkv-bias`."""

    # --- norms -------------------------------------------------------------------------------
    normalization: Literal["layernorm", "rmsnorm"] = "layernorm"
    """Norm layers: `--normalization LayerNorm|RMSNorm` (RMSNorm has no bias)."""
    norm_epsilon: _Positive = 1e-5
    """Epsilon of every norm: `--norm-epsilon`."""
    layernorm_zero_centered_gamma: _Flag = False
    """Norms scale by 1 + weight (Gemma): `--apply-layernorm-1p`."""
    qk_layernorm: _Flag = False
    """Norms on each head's queries and keys (Qwen3), or on the query and key/value latents of
    multi-latent attention (DeepSeek): `--qk-layernorm`."""
    layer_block: LayerBlock = "pre_norm"
    """How a layer wires attention and MLP. pre_norm: x + attn(n1(x)), then + mlp(n2(·)) (GPT,
    Llama; Megatron's layer). parallel: x + attn(n1(x)) + mlp(n2(x)) (GPT-NeoX, Falcon-40B).
    parallel_shared_norm: one norm feeds both (GPT-J, Falcon-7B). sandwich: pre_norm plus a norm
    after attention and after the MLP (Gemma-2). Megatron-LM builds only pre_norm."""
    embedding_layernorm: _Flag = False
    """A norm right after the token embedding (BLOOM); Megatron-LM has none."""

    # --- embeddings and positions ------------------------------------------------------------
    tied_embeddings: _Flag = True
    """Input embedding and output layer share one weight; False:
    `--untie-embeddings-and-output-weights`."""
    scale_embeddings: _Flag = False
    """Token embeddings are multiplied by sqrt(h) (Gemma); Megatron-LM has no such option."""
    position_embedding: PositionEmbedding = "learned_absolute"
    """`--position-embedding-type learned_absolute|rope`; alibi (BLOOM, attention biases, no
    weights) has no Megatron-LM form."""
    learned_position_offset: LayerCountOrZero = 0
    """Rows of a learned position table before position 0 (OPT keeps 2); Megatron-LM has none."""
    rotary_base: _Positive = 10000.0
    """Rotary base theta: `--rotary-base` (an integer there)."""
    rotary_percent: Annotated[float, Field(strict=True, gt=0, le=1)] = 1.0
    """Fraction of each head's channels that rotate (GPT-NeoX: 0.25): `--rotary-percent`."""
    rope_scaling: RopeScaling | None = None
    """Long-context rotary scaling (Llama 3.1, DeepSeek); None: plain rotary."""

    # --- attention ---------------------------------------------------------------------------
    window_size: SeqLength | None = None
    """Sliding-window attention: keys before the query that it sees, Megatron's `--window-size
    W,0` (a Hugging Face `sliding_window` of w is W = w - 1); None: full attention."""
    window_attn_skip_freq: LayerCount | None = None
    """Every N-th layer (N, 2N, ...) attends fully and the others slide (Gemma-2: 2):
    `--window-attn-skip-freq`; None: every layer slides."""
    softmax_scale: _Positive | None = None
    """Attention logit scale (megatron-core `softmax_scale`, not a `pretrain_gpt.py` flag);
    None: 1/sqrt(d). Gemma-2 sets query_pre_attn_scalar**-0.5."""
    attention_softcap: _Positive | None = None
    """Attention logits capped as c·tanh(x/c) (Gemma-2); Megatron-LM has none."""
    final_logit_softcap: _Positive | None = None
    """Output logits capped as c·tanh(x/c) (Gemma-2); Megatron-LM has none."""
    hidden_dropout: _Probability = 0.1
    """Dropout on the embedding and each layer's outputs: `--hidden-dropout` (Megatron's
    default 0.1; 0 for families trained without it)."""
    attention_dropout: _Probability = 0.1
    """Dropout on attention probabilities: `--attention-dropout` (Megatron's default 0.1)."""

    # --- multi-latent attention (DeepSeek-V2/V3): `--multi-latent-attention` ------------------
    q_lora_rank: Width | None = None
    """Query latent width: `--q-lora-rank`; None: queries project directly from h."""
    kv_lora_rank: Width | None = None
    """Key/value latent width: `--kv-lora-rank`; set means multi-latent attention."""
    qk_head_dim: Width | None = None
    """Per-head query/key channels without rotary (DeepSeek's nope dim): `--qk-head-dim`."""
    qk_pos_emb_head_dim: Width | None = None
    """Per-head rotary query/key channels (DeepSeek's rope dim): `--qk-pos-emb-head-dim`."""
    v_head_dim: Width | None = None
    """Per-head value channels: `--v-head-dim`."""

    # --- Mixture of Experts ------------------------------------------------------------------
    num_experts: ExpertCount | None = None
    """Routed experts per MoE layer: `--num-experts`; None: dense model."""
    moe_router_topk: ExpertCount = 2
    """Routed experts each token uses: `--moe-router-topk`."""
    moe_ffn_hidden_size: Width | None = None
    """Width of one routed expert: `--moe-ffn-hidden-size`; None: ffn_hidden_size."""
    moe_shared_expert_intermediate_size: Width | None = None
    """Total width of the shared experts every token uses (DeepSeek: n_shared x expert width):
    `--moe-shared-expert-intermediate-size`."""
    moe_shared_expert_gate: _Flag = False
    """A sigmoid gate (one h-vector) scales the shared experts' output (Qwen2-MoE):
    `--moe-shared-expert-gate`."""
    moe_layer_freq: LayerCount = 1
    """Layer i is MoE when i % N == 0 (and i is past the dense first layers): with
    moe_first_dense_layers, `--moe-layer-freq` (an integer, or a 0/1 list pattern)."""
    moe_first_dense_layers: LayerCountOrZero = 0
    """Leading layers that keep a dense MLP (DeepSeek's first_k_dense_replace)."""
    moe_router_score_function: Literal["softmax", "sigmoid"] = "softmax"
    """Router scores: `--moe-router-score-function` (sigmoid renormalises the top-k)."""
    moe_router_pre_softmax: _Flag = False
    """Softmax over all experts before the top-k, without renormalising (Hugging Face's
    norm_topk_prob = false): `--moe-router-pre-softmax`."""
    moe_router_topk_scaling_factor: _Positive | None = None
    """Routing weights multiplied by this (DeepSeek's routed_scaling_factor):
    `--moe-router-topk-scaling-factor`."""
    moe_router_num_groups: ExpertCount | None = None
    """Expert groups for group-limited routing: `--moe-router-num-groups`."""
    moe_router_group_topk: ExpertCount | None = None
    """Groups each token may route to: `--moe-router-group-topk`."""
    moe_router_enable_expert_bias: _Flag = False
    """Aux-loss-free balancing bias added to scores for routing (DeepSeek-V3; a buffer, not a
    weight): `--moe-router-enable-expert-bias`."""
    moe_router_load_balancing_type: LoadBalancing = "aux_loss"
    """Load-balancing loss: `--moe-router-load-balancing-type`."""
    moe_aux_loss_coeff: Annotated[float, Field(strict=True, ge=0)] = 0.0
    """Weight of the load-balancing loss: `--moe-aux-loss-coeff`."""

    @model_validator(mode="after")
    def _check_shape(self) -> ModelSpec:
        problems = [problem for check in _CHECKS if (problem := check(self))]
        if problems:
            raise ValueError("; ".join(problems))
        return self

    @property
    def query_groups(self) -> int:
        """Key/value heads g (a when not grouped)."""
        return self.num_query_groups or self.num_attention_heads

    @property
    def ffn(self) -> int:
        """Dense MLP width f."""
        return self.ffn_hidden_size or 4 * self.hidden_size

    @property
    def moe_ffn(self) -> int:
        """Width of one routed expert."""
        return self.moe_ffn_hidden_size or self.ffn

    @property
    def head_dim(self) -> int:
        """Channels per attention head d (kv_channels, or h / a)."""
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def gated(self) -> bool:
        """True for gated MLPs (SwiGLU, GeGLU: three matrices)."""
        return self.activation in ("swiglu", "geglu")

    @property
    def norm_factor(self) -> int:
        """Weights per channel of a norm: 1 for RMSNorm, 2 for LayerNorm (weight and bias)."""
        return 1 if self.normalization == "rmsnorm" else 2

    @property
    def multi_latent_attention(self) -> bool:
        """DeepSeek's multi-latent attention (`--multi-latent-attention`)."""
        return self.kv_lora_rank is not None

    @property
    def moe(self) -> bool:
        """True for a Mixture-of-Experts model."""
        return self.num_experts is not None

    @property
    def moe_layer_pattern(self) -> tuple[bool, ...]:
        """Per layer, True where the MLP is a Mixture of Experts."""
        return tuple(
            self.moe and i >= self.moe_first_dense_layers and i % self.moe_layer_freq == 0
            for i in range(self.num_layers)
        )

    @property
    def moe_layer_share(self) -> float:
        """Fraction of the layers whose MLP is a Mixture of Experts (0 for a dense model)."""
        return sum(self.moe_layer_pattern) / self.num_layers

    def param_counts(self, vocab: int | None = None) -> ParamCounts:
        """Weights by part and layer kind (vocab: a padded vocabulary to count instead)."""
        return count_params(self, vocab)

    def layer_params(self) -> int:
        """Weights of one transformer layer, biases and norms included (the mean over layers
        when dense and MoE layers differ)."""
        counts = self.param_counts()
        return counts.layers_total // self.num_layers

    def num_params(self, vocab: int | None = None) -> int:
        """All weights, embedding and (untied) output layer included; tied weights count once."""
        return self.param_counts(vocab).total

    def active_params(self, vocab: int | None = None) -> int:
        """Weights one token uses: only its top-k routed experts (equals num_params if dense)."""
        return self.param_counts(vocab).active


def _divisible_heads(m: ModelSpec) -> str | None:
    if m.kv_channels is None and m.hidden_size % m.num_attention_heads:
        fix = "" if m.multi_latent_attention else ", or set kv_channels"
        return (f"hidden_size ({m.hidden_size}) must be divisible by num_attention_heads "
                f"({m.num_attention_heads}){fix}")
    if m.num_attention_heads % m.query_groups:
        return (f"num_attention_heads ({m.num_attention_heads}) must be divisible by "
                f"num_query_groups ({m.query_groups})")
    return None


def _rotary_fields(m: ModelSpec) -> str | None:
    if m.position_embedding == "rope":
        return None
    if m.rope_scaling is not None or m.rotary_percent != 1.0:
        return ("rope_scaling and rotary_percent need position_embedding rope, "
                f"not {m.position_embedding}")
    if m.multi_latent_attention:
        return "multi-latent attention (kv_lora_rank) needs position_embedding rope"
    return None


def _learned_offset(m: ModelSpec) -> str | None:
    if m.learned_position_offset and m.position_embedding != "learned_absolute":
        return "learned_position_offset needs position_embedding learned_absolute"
    return None


def _window(m: ModelSpec) -> str | None:
    if m.window_attn_skip_freq is not None and m.window_size is None:
        return "window_attn_skip_freq needs window_size"
    return None


def _mla_fields(m: ModelSpec) -> str | None:
    dims = {"qk_head_dim": m.qk_head_dim, "qk_pos_emb_head_dim": m.qk_pos_emb_head_dim,
            "v_head_dim": m.v_head_dim}
    if m.multi_latent_attention:
        missing = [name for name, value in dims.items() if value is None]
        if missing:
            return f"multi-latent attention (kv_lora_rank) needs {', '.join(missing)}"
        if m.num_query_groups not in (None, m.num_attention_heads) or m.kv_channels:
            return "multi-latent attention takes no num_query_groups or kv_channels"
        return None
    given = [name for name, value in {"q_lora_rank": m.q_lora_rank, **dims}.items() if value]
    if given:
        return f"{', '.join(given)} need kv_lora_rank (multi-latent attention)"
    return None


def _moe_fields(m: ModelSpec) -> str | None:
    if not m.moe:
        given = [name for name in ("moe_ffn_hidden_size", "moe_shared_expert_intermediate_size",
                                   "moe_router_num_groups", "moe_router_group_topk")
                 if getattr(m, name) is not None]
        given += [name for name in ("moe_shared_expert_gate", "moe_router_enable_expert_bias")
                  if getattr(m, name)]
        return f"{', '.join(given)} need num_experts" if given else None
    experts = m.num_experts or 0
    if m.moe_router_topk > experts:
        return f"moe_router_topk ({m.moe_router_topk}) exceeds num_experts ({experts})"
    if m.moe_shared_expert_gate and m.moe_shared_expert_intermediate_size is None:
        return "moe_shared_expert_gate needs moe_shared_expert_intermediate_size"
    if not any(m.moe_layer_pattern):
        return (f"no MoE layer: moe_first_dense_layers ({m.moe_first_dense_layers}) and "
                f"moe_layer_freq ({m.moe_layer_freq}) leave every one of {m.num_layers} dense")
    groups, group_topk = m.moe_router_num_groups, m.moe_router_group_topk
    if (groups is None) != (group_topk is None):
        return "moe_router_num_groups and moe_router_group_topk go together"
    if groups and group_topk and (experts % groups or group_topk > groups):
        return (f"group-limited routing needs num_experts ({experts}) divisible by "
                f"moe_router_num_groups ({groups}) >= moe_router_group_topk ({group_topk})")
    return None


_CHECKS = (_divisible_heads, _rotary_fields, _learned_offset, _window, _mla_fields, _moe_fields)
