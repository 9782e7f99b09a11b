"""The Megatron-LM flags and megatron-core kwargs that build exactly a ModelSpec's model.

`model_args` gives `pretrain_gpt.py`'s architecture flags (names checked against
megatron/training/arguments.py of NVIDIA/Megatron-LM at d98e8a64); `transformer_config_kwargs`
and `gpt_model_kwargs` give the same model to megatron-core's `TransformerConfig` (or
`MLATransformerConfig`) and `GPTModel`. A feature Megatron cannot build raises AutotuneError
naming it, rather than training a different model:

- both: ALiBi (BLOOM), an embedding norm (BLOOM), parallel attention+MLP blocks (GPT-NeoX,
  Falcon), sandwich norms (Gemma-2), sqrt(h)-scaled embeddings (Gemma; megatron-core scales only
  under MuP), logit soft-capping (Gemma-2), OPT's offset position table;
- pretrain_gpt.py: GELU's tanh approximation and ReLU (`--openai-gelu` is parsed but unused by
  megatron-core; there is no plain ReLU), a GELU-gated MLP (`--quick-geglu` is x·σ(1.702x),
  not GELU), a softmax scale other than 1/sqrt(d), a non-integer rotary base, Llama-3 rope
  scaling other than factor 8 (`--rope-scaling-factor` is parsed but not passed to the model)
  with Megatron's fixed 1/4/8192 frequency factors, and YaRN constants that
  multi-latent attention fixes (original 4096 positions, beta 32/1); megatron-core builds these;
- the megatron-core kwargs: YaRN without multi-latent attention (GPTModel reads yarn_*
  attributes that Megatron-LM sets on the config after building it).
"""

from __future__ import annotations

from typing import Any

from autotune.exceptions import AutotuneError
from autotune.specs import ModelSpec

# Llama-3 rope scaling constants megatron-core fixes (RotaryEmbedding._apply_scaling), and the
# factor pretrain_gpt.py builds: gpt_config_from_args (megatron/training/argument_utils.py) passes
# --use-rope-scaling but drops --rope-scaling-factor, so GPTModelConfig keeps its default 8
_LLAMA3_FIXED = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                 "original_max_position_embeddings": 8192}
# YaRN constants MLATransformerConfig fixes (no pretrain_gpt.py flag reaches them)
_MLA_YARN_FIXED = {"original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0}


def _unbuildable(m: ModelSpec) -> list[str]:
    """Features of `m` that neither Megatron-LM nor megatron-core can build."""
    found = []
    if m.position_embedding == "alibi":
        found.append("position_embedding alibi (Megatron has learned_absolute, rope, none)")
    if m.embedding_layernorm:
        found.append("embedding_layernorm (no norm after the embedding in Megatron)")
    if m.layer_block != "pre_norm":
        found.append(f"layer_block {m.layer_block} (Megatron's layer is pre_norm)")
    if m.scale_embeddings:
        found.append("scale_embeddings (megatron-core scales embeddings only under MuP)")
    if m.attention_softcap or m.final_logit_softcap:
        found.append("attention_softcap/final_logit_softcap (Megatron has no soft-capping)")
    if m.learned_position_offset:
        found.append("learned_position_offset (Megatron's position table starts at 0)")
    return found


def _core_only_gaps(m: ModelSpec) -> list[str]:
    """Features pretrain_gpt.py builds but the megatron-core kwargs here cannot pass."""
    scaling = m.rope_scaling
    if scaling is not None and scaling.type == "yarn" and not m.multi_latent_attention:
        # GPTModel reads yarn_* attributes that Megatron-LM sets on the config after building it
        return ["rope_scaling yarn without multi-latent attention (use pretrain_gpt.py flags)"]
    return []


def _cli_only_gaps(m: ModelSpec) -> list[str]:
    """Features megatron-core builds but pretrain_gpt.py's flags cannot ask for."""
    found = []
    if m.activation in ("gelu_tanh", "relu", "geglu"):
        found.append(f"activation {m.activation} (pretrain_gpt.py has --swiglu, --quick-geglu "
                     "and --squared-relu; --openai-gelu is unused by megatron-core)")
    if m.softmax_scale is not None:
        found.append("softmax_scale (a TransformerConfig field with no pretrain_gpt.py flag)")
    if m.position_embedding == "rope" and m.rotary_base != int(m.rotary_base):
        found.append(f"rotary_base {m.rotary_base} (--rotary-base takes an integer)")
    scaling = m.rope_scaling
    if scaling is not None:
        fixed = _LLAMA3_FIXED if scaling.type == "llama3" else (
            _MLA_YARN_FIXED if m.multi_latent_attention else {})
        for name, value in fixed.items():
            if getattr(scaling, name) != value:
                found.append(f"rope_scaling.{name} {getattr(scaling, name)} (Megatron fixes "
                             f"{value} for {scaling.type})")
    return found


def _refuse(m: ModelSpec, gaps: list[str], what: str) -> None:
    if gaps:
        raise AutotuneError(f"model {m.name}: {what} cannot build " + "; ".join(gaps))


def _number(value: float) -> str:
    return str(int(value)) if value == int(value) else repr(value)


def moe_layer_freq(m: ModelSpec) -> int | list[int]:
    """Megatron's `moe_layer_freq`: an integer N, or the 0/1 pattern with dense first layers."""
    if not m.moe_first_dense_layers:
        return m.moe_layer_freq
    return [int(moe) for moe in m.moe_layer_pattern]


def _moe_layer_freq_flag(m: ModelSpec) -> str:
    freq = moe_layer_freq(m)
    if isinstance(freq, int):
        return str(freq)
    dense, rest = m.moe_first_dense_layers, m.num_layers - m.moe_first_dense_layers
    if m.moe_layer_freq == 1:
        return f"([0]*{dense}+[1]*{rest})"  # the form Megatron's own DeepSeek recipes use
    return "[" + ",".join(str(bit) for bit in freq) + "]"


def _rope_args(m: ModelSpec) -> list[str]:
    if m.position_embedding != "rope":
        return ["--position-embedding-type", "learned_absolute"]
    scaling = m.rope_scaling
    yarn = scaling is not None and scaling.type == "yarn"
    kind = "yarn" if yarn and not m.multi_latent_attention else "rope"
    args = ["--position-embedding-type", kind, "--rotary-base", _number(m.rotary_base)]
    if m.rotary_percent != 1.0:
        args += ["--rotary-percent", _number(m.rotary_percent)]
    if m.multi_latent_attention:  # MLATransformerConfig defaults to yarn
        args += ["--rope-type", "yarn" if yarn else "rope"]
    if scaling is None:
        return args
    if scaling.type == "llama3":
        return args + ["--use-rope-scaling", "--rope-scaling-factor", _number(scaling.factor)]
    args += ["--rotary-scaling-factor", _number(scaling.factor),
             "--mscale", _number(scaling.mscale),
             "--mscale-all-dim", _number(scaling.mscale_all_dim)]
    if m.multi_latent_attention:
        return args
    return args + [
        "--yarn-original-max-position-embeddings", str(scaling.original_max_position_embeddings),
        "--yarn-beta-fast", _number(scaling.beta_fast),
        "--yarn-beta-slow", _number(scaling.beta_slow),
    ]


def _attention_args(m: ModelSpec) -> list[str]:
    args: list[str] = []
    if m.multi_latent_attention:
        args.append("--multi-latent-attention")
        if m.q_lora_rank is not None:
            args += ["--q-lora-rank", str(m.q_lora_rank)]
        args += ["--kv-lora-rank", str(m.kv_lora_rank),
                 "--qk-head-dim", str(m.qk_head_dim),
                 "--qk-pos-emb-head-dim", str(m.qk_pos_emb_head_dim),
                 "--v-head-dim", str(m.v_head_dim)]
    else:
        if m.kv_channels is not None:
            args += ["--kv-channels", str(m.kv_channels)]
        if m.query_groups != m.num_attention_heads:
            args += ["--group-query-attention", "--num-query-groups", str(m.query_groups)]
    if m.qk_layernorm:
        args.append("--qk-layernorm")
    if m.add_qkv_bias and not m.add_bias_linear:
        args.append("--add-qkv-bias")
    if m.window_size is not None:
        args += ["--window-size", f"{m.window_size},0"]
        if m.window_attn_skip_freq is not None:
            args += ["--window-attn-skip-freq", str(m.window_attn_skip_freq)]
    return args


def _moe_args(m: ModelSpec) -> list[str]:
    if not m.moe:
        return []
    args = ["--num-experts", str(m.num_experts),
            "--moe-router-topk", str(m.moe_router_topk),
            "--moe-ffn-hidden-size", str(m.moe_ffn),
            "--moe-layer-freq", _moe_layer_freq_flag(m),
            "--moe-router-score-function", m.moe_router_score_function,
            "--moe-router-load-balancing-type", m.moe_router_load_balancing_type,
            "--moe-aux-loss-coeff", _number(m.moe_aux_loss_coeff)]
    if m.moe_shared_expert_intermediate_size is not None:
        args += ["--moe-shared-expert-intermediate-size",
                 str(m.moe_shared_expert_intermediate_size)]
    if m.moe_shared_expert_gate:
        args.append("--moe-shared-expert-gate")
    if m.moe_router_pre_softmax:
        args.append("--moe-router-pre-softmax")
    if m.moe_router_topk_scaling_factor is not None:
        args += ["--moe-router-topk-scaling-factor", _number(m.moe_router_topk_scaling_factor)]
    if m.moe_router_num_groups is not None:
        args += ["--moe-router-num-groups", str(m.moe_router_num_groups),
                 "--moe-router-group-topk", str(m.moe_router_group_topk)]
    if m.moe_router_enable_expert_bias:
        args.append("--moe-router-enable-expert-bias")
    return args


def model_args(model: ModelSpec, seq_length: int) -> list[str]:
    """`pretrain_gpt.py` architecture flags that build exactly `model`, as argv items.

    Args:
        model: The model.
        seq_length: Training sequence length (`--seq-length`).

    Returns:
        Flags and values in a fixed order; every value a separate item (quote when rendering).

    Raises:
        AutotuneError: The model has a feature pretrain_gpt.py cannot build (named in the
            message), or seq_length exceeds a learned position table.
    """
    m = model
    _refuse(m, _unbuildable(m) + _cli_only_gaps(m), "Megatron-LM's pretrain_gpt.py")
    positions = m.max_position_embeddings
    if seq_length > positions:
        if m.position_embedding == "learned_absolute":
            raise AutotuneError(f"model {m.name}: seq_length {seq_length} exceeds its "
                                f"{positions} learned positions; lower the sequence length")
        positions = seq_length  # rotary: Megatron only asserts max positions >= seq length
    args = [
        "--num-layers", str(m.num_layers),
        "--hidden-size", str(m.hidden_size),
        "--num-attention-heads", str(m.num_attention_heads),
        "--ffn-hidden-size", str(m.ffn),
        "--seq-length", str(seq_length),
        "--max-position-embeddings", str(positions),
        "--normalization", "RMSNorm" if m.normalization == "rmsnorm" else "LayerNorm",
        "--norm-epsilon", _number(m.norm_epsilon),
        "--hidden-dropout", _number(m.hidden_dropout),
        "--attention-dropout", _number(m.attention_dropout),
    ]
    if m.activation == "swiglu":
        args.append("--swiglu")
    if not m.add_bias_linear:
        args.append("--disable-bias-linear")
    if not m.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    if m.layernorm_zero_centered_gamma:
        args.append("--apply-layernorm-1p")
    return args + _attention_args(m) + _rope_args(m) + _moe_args(m)


def _activation_func(m: ModelSpec) -> Any:
    import torch.nn.functional as F
    from megatron.core.transformer.utils import openai_gelu

    return {"gelu": F.gelu, "gelu_tanh": openai_gelu, "relu": F.relu, "swiglu": F.silu,
            "geglu": openai_gelu}[m.activation]


def transformer_config_kwargs(model: ModelSpec) -> dict[str, Any]:
    """Architecture kwargs of megatron-core's `TransformerConfig` for `model`.

    With multi-latent attention they are `MLATransformerConfig` kwargs (see
    `transformer_config_class`). Parallelism, precision and recompute are the caller's.

    Raises:
        AutotuneError: The model has a feature megatron-core cannot build (named).
    """
    m = model
    _refuse(m, _unbuildable(m) + _core_only_gaps(m), "megatron-core")
    kwargs: dict[str, Any] = {
        "num_layers": m.num_layers,
        "hidden_size": m.hidden_size,
        "num_attention_heads": m.num_attention_heads,
        "ffn_hidden_size": m.ffn,
        "gated_linear_unit": m.gated,
        "activation_func": _activation_func(m),
        "normalization": "RMSNorm" if m.normalization == "rmsnorm" else "LayerNorm",
        "layernorm_epsilon": m.norm_epsilon,
        "layernorm_zero_centered_gamma": m.layernorm_zero_centered_gamma,
        "add_bias_linear": m.add_bias_linear,
        "add_qkv_bias": m.add_qkv_bias or m.add_bias_linear,  # as Megatron-LM sets it
        "qk_layernorm": m.qk_layernorm,
        "hidden_dropout": m.hidden_dropout,
        "attention_dropout": m.attention_dropout,
    }
    if m.softmax_scale is not None:
        kwargs["softmax_scale"] = m.softmax_scale
    if m.window_size is not None:
        kwargs["window_size"] = (m.window_size, 0)
        kwargs["window_attn_skip_freq"] = m.window_attn_skip_freq
    if m.multi_latent_attention:
        kwargs.update(_mla_kwargs(m))
    else:
        kwargs.update(num_query_groups=m.query_groups, kv_channels=m.head_dim)
    if m.moe:
        kwargs.update(_moe_kwargs(m))
    return kwargs


def _mla_kwargs(m: ModelSpec) -> dict[str, Any]:
    kwargs: dict[str, Any] = {
        "q_lora_rank": m.q_lora_rank,
        "kv_lora_rank": m.kv_lora_rank,
        "qk_head_dim": m.qk_head_dim,
        "qk_pos_emb_head_dim": m.qk_pos_emb_head_dim,
        "v_head_dim": m.v_head_dim,
        "rotary_base": m.rotary_base,
        "rotary_percent": m.rotary_percent,
        "rope_type": "rope",
    }
    scaling = m.rope_scaling
    if scaling is not None and scaling.type == "yarn":
        kwargs.update(rope_type="yarn", rotary_scaling_factor=scaling.factor,
                      original_max_position_embeddings=scaling.original_max_position_embeddings,
                      beta_fast=scaling.beta_fast, beta_slow=scaling.beta_slow,
                      mscale=scaling.mscale, mscale_all_dim=scaling.mscale_all_dim)
    return kwargs


def _moe_kwargs(m: ModelSpec) -> dict[str, Any]:
    return {
        "num_moe_experts": m.num_experts,
        "moe_router_topk": m.moe_router_topk,
        "moe_ffn_hidden_size": m.moe_ffn,
        "moe_shared_expert_intermediate_size": m.moe_shared_expert_intermediate_size,
        "moe_shared_expert_gate": m.moe_shared_expert_gate,
        "moe_layer_freq": moe_layer_freq(m),
        "moe_router_score_function": m.moe_router_score_function,
        "moe_router_pre_softmax": m.moe_router_pre_softmax,
        "moe_router_topk_scaling_factor": m.moe_router_topk_scaling_factor,
        "moe_router_num_groups": m.moe_router_num_groups,
        "moe_router_group_topk": m.moe_router_group_topk,
        "moe_router_enable_expert_bias": m.moe_router_enable_expert_bias,
        "moe_router_load_balancing_type": m.moe_router_load_balancing_type,
        "moe_aux_loss_coeff": m.moe_aux_loss_coeff,
    }


def transformer_config_class(model: ModelSpec) -> type:
    """megatron-core's config class for `model`: MLATransformerConfig or TransformerConfig."""
    from megatron.core.transformer.transformer_config import MLATransformerConfig
    from megatron.core.transformer.transformer_config import TransformerConfig

    config_class: type = (
        MLATransformerConfig if model.multi_latent_attention else TransformerConfig
    )
    return config_class


def gpt_model_kwargs(model: ModelSpec, seq_length: int) -> dict[str, Any]:
    """Architecture kwargs of megatron-core's `GPTModel` (embeddings, positions, rotary).

    vocab_size is the model's own; Megatron-LM pads it (`--make-vocab-size-divisible-by`) before
    building, which adds rows to the embedding and output layer.
    """
    m = model
    _refuse(m, _unbuildable(m) + _core_only_gaps(m), "megatron-core")
    scaling = m.rope_scaling
    kwargs: dict[str, Any] = {
        "vocab_size": m.vocab_size,
        "max_sequence_length": max(m.max_position_embeddings, seq_length),
        "share_embeddings_and_output_weights": m.tied_embeddings,
        "position_embedding_type": m.position_embedding,
    }
    if m.position_embedding == "rope" and not m.multi_latent_attention:
        kwargs.update(rotary_base=int(m.rotary_base), rotary_percent=m.rotary_percent)
        if scaling is not None:
            kwargs.update(rope_scaling=True, rope_scaling_factor=scaling.factor)
    return kwargs
