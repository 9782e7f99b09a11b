"""The inputs: a model, a cluster and a training setup (validated pydantic values).

Every number a user can type is one of the bounded types below: integers are strict (a YAML
`true` or `4.5` is not a count), floats are finite, and each has an upper bound whose reason the
error message gives. Besides catching typos, the bounds keep the models' numpy int64 arithmetic
exact.
"""

from __future__ import annotations

from typing import Annotated
from typing import Any
from typing import Literal

from pydantic import AfterValidator
from pydantic import BaseModel
from pydantic import BeforeValidator
from pydantic import ConfigDict
from pydantic import Field
from pydantic import Strict
from pydantic import StrictBool
from pydantic import model_validator
from pydantic_core import PydanticCustomError

from autotune.params import ParamCounts
from autotune.params import count_params

Precision = Literal["bf16", "fp16", "fp8", "fp32"]
Framework = Literal["megatron", "deepspeed"]

_FROZEN = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


# --- bounded numbers --------------------------------------------------------------------------


def _not_bool(value: Any) -> Any:
    if isinstance(value, bool):
        raise PydanticCustomError("bool_not_number", "must be a number, not true/false")
    return value


def at_most(high: float, why: str) -> AfterValidator:
    """Annotated metadata: the value must be at most `high`; `why` goes into the message."""

    def check(value: Any) -> Any:
        if value > high:
            raise PydanticCustomError(
                "too_large", "must be at most {high} ({why})", {"high": f"{high:,}", "why": why}
            )
        return value

    return AfterValidator(check)


Integer = Annotated[int, BeforeValidator(_not_bool), Strict()]
"""An integer as written: no bool, no float, no numeric string."""
FiniteFloat = Annotated[float, BeforeValidator(_not_bool), Field(allow_inf_nan=False)]
"""A finite number (no bool, NaN or infinity)."""

SeqLength = Annotated[
    Integer, Field(ge=1), at_most(2**24, "beyond any trained context, 10M tokens of Llama 4 Scout")
]
"""Tokens per sequence."""
BatchSize = Annotated[
    Integer, Field(ge=1), at_most(2**20, "16x the largest published batch, 65,536 sequences")
]
"""Sequences per optimizer step (and per micro-batch)."""
NodeCount = Annotated[
    Integer, Field(ge=1), at_most(2**16, "more than the largest clusters, about 25,000 nodes")
]
"""Nodes of a cluster."""
DevicesPerNode = Annotated[
    Integer, Field(ge=1), at_most(2**10, "far above the 72 GPUs of an NVL72 rack")
]
"""Accelerators (or CPU worker processes) per node."""
MAX_LAYERS = 2**14
"""The most transformer layers (and virtual pipeline stages) a model may have."""
LayerCount = Annotated[
    Integer, Field(ge=1), at_most(MAX_LAYERS, "100x the deepest published transformer, 126 layers")
]
"""Transformer layers (also bounds virtual pipeline stages: each holds one layer at least)."""
Width = Annotated[
    Integer, Field(ge=1), at_most(2**20, "20x the widest published MLP, 53,248 of Llama 3 405B")
]
"""Channels: hidden size, MLP width, head dimension."""
HeadCount = Annotated[
    Integer, Field(ge=1), at_most(2**14, "100x the most attention heads published, 128")
]
"""Attention heads or key/value groups."""
VocabSize = Annotated[
    Integer, Field(ge=1), at_most(2**24, "60x the largest published vocabulary, 262,144")
]
"""Tokenizer entries."""
Seed = Annotated[Integer, Field(ge=0), at_most(2**32 - 1, "NumPy's RandomState seed range")]
"""Seed of a random generator."""

GpuMemoryGiB = Annotated[FiniteFloat, Field(gt=0), at_most(2**16, "400x the 141 GB of an H200")]
"""Device memory, GiB."""
TFlops = Annotated[
    FiniteFloat, Field(gt=0), at_most(1e5, "20x the highest dense peak, 4,500 of a B200 in FP8")
]
"""Peak throughput, TFLOP/s."""
MemoryTBs = Annotated[FiniteFloat, Field(gt=0), at_most(1e3, "100x the 8 TB/s of a B200")]
"""Memory bandwidth, TB/s."""
LinkGBs = Annotated[
    FiniteFloat, Field(gt=0), at_most(1e5, "100x NVLink 5, 900 GB/s per direction")
]
"""Link bandwidth per direction, GB/s."""
HostMemoryGB = Annotated[
    FiniteFloat, Field(gt=0), at_most(2**24, "16 PB per node, 500x the largest servers")
]
"""Host memory, GB."""


ExpertCount = Annotated[
    Integer, Field(ge=1), at_most(2**14, "64x the most routed experts published, 256")
]
"""Experts, routed experts per token, expert groups."""
LayerCountOrZero = Annotated[
    Integer, Field(ge=0), at_most(MAX_LAYERS, "100x the deepest published transformer")
]
"""A count of layers (or positions) that may be zero."""
_Flag = Annotated[bool, Field(strict=True)]
_Positive = Annotated[FiniteFloat, Field(gt=0)]
_Probability = Annotated[FiniteFloat, Field(ge=0, lt=1)]

Activation = Literal["gelu", "gelu_tanh", "relu", "swiglu", "geglu"]
LayerBlock = Literal["pre_norm", "parallel", "parallel_shared_norm", "sandwich"]
PositionEmbedding = Literal["learned_absolute", "rope", "alibi"]
LoadBalancing = Literal["aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none"]


class RopeScaling(BaseModel):
    """Rotary frequency scaling for long context: Llama 3.x (`llama3`) or YaRN (`yarn`).

    Field names follow Hugging Face's `rope_scaling`; each docstring names the Megatron-LM flag.
    """

    model_config = _FROZEN

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
    `autotune.frameworks.megatron_model` turns a spec into them and refuses what Megatron
    cannot build.
    `param_counts()` (autotune/params.py) is the one source of parameter counts.
    """

    model_config = _FROZEN

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


class GPUSpec(BaseModel):
    """One accelerator: memory, dense peak throughput per precision, memory bandwidth."""

    model_config = _FROZEN

    name: str = "custom-gpu"
    """Preset name or free text."""
    memory_gb: GpuMemoryGiB
    """Device memory as the datasheet states it ("80GB"); vendors' figures match what CUDA
    reports in GiB (A100 80GB: 81,920 MiB; H200 141GB: 143,771 MiB), so it is read as GiB."""
    peak_tflops: dict[Precision, TFlops] = Field(min_length=1)
    """Dense (no sparsity) peak in TFLOP/s per precision; a missing key means unsupported."""
    hbm_tb_s: MemoryTBs
    """Device memory bandwidth in TB/s."""

    @property
    def memory_bytes(self) -> float:
        """Device memory in bytes (memory_gb read as GiB, as CUDA reports it)."""
        return self.memory_gb * 2**30


class ClusterSpec(BaseModel):
    """Nodes of identical GPUs, their links and their hosts."""

    model_config = _FROZEN

    name: str = "custom"
    """Display name (preset:nodes, a file name, or local)."""
    nodes: NodeCount
    """Number of nodes."""
    gpus_per_node: DevicesPerNode
    """Accelerators (or CPU worker processes, for `local` without GPUs) per node."""
    gpu: GPUSpec
    """The accelerator."""
    intra_node_gb_s: LinkGBs
    """Per-GPU, per-direction bandwidth inside a node (NVLink), GB/s."""
    inter_node_gb_s: LinkGBs
    """Per-GPU, per-direction network bandwidth between nodes (InfiniBand), GB/s."""
    host_memory_gb: HostMemoryGB
    """CPU memory per node, GB."""
    pcie_gb_s: LinkGBs
    """Per-GPU host link bandwidth per direction, GB/s."""
    cpu_processes: StrictBool = False
    """True when the 'GPUs' are CPU processes on gloo (the `local` cluster without CUDA)."""

    @property
    def world_size(self) -> int:
        """All accelerators in the cluster."""
        return self.nodes * self.gpus_per_node


class TrainSpec(BaseModel):
    """The training setup a layout must serve."""

    model_config = _FROZEN

    seq_length: SeqLength
    """Tokens per sequence."""
    global_batch_size: BatchSize
    """Sequences per optimizer step, over all data-parallel replicas."""
    precision: Precision = "bf16"
    """Compute precision of the matrix multiplies (fp8 = fp8 GEMMs with bf16 elsewhere)."""
    framework: Framework = "megatron"
    """Framework whose rules and configs apply."""
    flash_attention: StrictBool = True
    """Fused attention that never stores the s×s score matrix (FlashAttention / cuDNN)."""
    overlap_grad_reduce: StrictBool = True
    """Data-parallel gradient reduction overlaps the last backward pass."""
    tp_comm_overlap: bool = False
    """Tensor-parallel collectives run in chunks under the GEMMs (Transformer Engine userbuffers:
    Megatron's `--tp-comm-overlap`, with sequence parallelism only)."""
    moe_token_dispatcher: Literal["alltoall", "flex"] = "alltoall"
    """How MoE layers with ep > 1 move tokens to their experts (Megatron's
    `--moe-token-dispatcher-type`): alltoall, NCCL all-to-all of every top-k copy (Megatron's
    guide's choice for ep > 1); flex, DeepEP (`--moe-flex-dispatcher-backend deepep`), one copy
    per destination node over the network, forwarded over NVLink, which needs DeepEP installed
    on GPUs. ep = 1 always gathers (allgather)."""
    moe_a2a_overlap: StrictBool = False
    """Megatron's EP all-to-all overlap (`--overlap-moe-expert-parallel-comm
    --delay-wgrad-compute`, off by default): a micro-batch's dispatch and combine run under
    another's forward and backward, on the layouts that allow it
    (`autotune.expert_dispatch.a2a_overlap_runs`)."""

    @model_validator(mode="after")
    def _check_moe_comm(self) -> TrainSpec:
        if self.framework != "megatron" and self.moe_token_dispatcher != "alltoall":
            raise ValueError(f"moe_token_dispatcher {self.moe_token_dispatcher!r} is Megatron's; "
                             f"use alltoall with {self.framework}")
        if self.framework != "megatron" and self.moe_a2a_overlap:
            raise ValueError(f"moe_a2a_overlap is Megatron's; set it false for {self.framework}")
        return self

    @property
    def tokens_per_step(self) -> int:
        """Tokens per optimizer step."""
        return self.seq_length * self.global_batch_size


class AutotuneConfig(BaseModel):
    """Everything that defines a tuning problem: model, cluster and training setup."""

    model_config = _FROZEN

    model: ModelSpec
    """The model to train."""
    cluster: ClusterSpec
    """Where it trains."""
    train: TrainSpec
    """How it trains."""

    @property
    def world_size(self) -> int:
        """Accelerators used by every layout."""
        return self.cluster.world_size

    def identity(self) -> dict[str, Any]:
        """What makes two problems the same: model, training, and the cluster's shape and GPU
        (not throughput figures measured on the spot, as for the local CPU cluster)."""
        cluster = self.cluster.model_dump(mode="json", exclude={"gpu"})
        cluster["gpu"] = {"name": self.cluster.gpu.name}
        if not self.cluster.cpu_processes:
            cluster["gpu"] = self.cluster.gpu.model_dump(mode="json")
        else:
            cluster.pop("host_memory_gb")
        return {"model": self.model.model_dump(mode="json"), "cluster": cluster,
                "train": self.train.model_dump(mode="json")}
