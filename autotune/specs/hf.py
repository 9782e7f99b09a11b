"""Hugging Face `config.json` -> ModelSpec fields, read by `model_type`.

Each family reads the keys its transformers config class defines, with that class's defaults
(transformers 5.x) for keys a file leaves out; the shape keys (layers, width, heads, vocabulary,
MLP width) are required. Values must have their JSON type: a string "768" where an integer
belongs is an error naming the key, never coerced. Whatever a spec cannot express (a rope
scaling type, a bias layout, a layer pattern) raises AutotuneError naming the key.
"""

from __future__ import annotations

import builtins
from collections.abc import Callable
from typing import Any

from autotune.exceptions import AutotuneError

_REQUIRED = object()


class _Config:
    """Typed access to a config.json mapping; errors name the key and the file."""

    def __init__(self, data: dict[str, Any], source: str) -> None:
        self.data = data
        self.source = source

    def error(self, key: str, problem: str) -> AutotuneError:
        return AutotuneError(f"{self.source}: {key}: {problem}")

    def _get(self, keys: tuple[str, ...], default: Any) -> tuple[str, Any]:
        for key in keys:
            if self.data.get(key) is not None:
                return key, self.data[key]
        if default is _REQUIRED:
            raise self.error(" or ".join(keys), "required by a Hugging Face config of "
                             f"model_type {self.data.get('model_type')!r}; add it")
        return keys[0], default

    def int(self, *keys: str, default: Any = _REQUIRED, minimum: int = 1) -> Any:
        key, value = self._get(keys, default)
        if value is not None and (type(value) is not int or value < minimum):
            raise self.error(key, f"expected an integer >= {minimum}, got {value!r}")
        return value

    def float(self, *keys: str, default: Any = _REQUIRED) -> Any:
        key, value = self._get(keys, default)
        if value is not None and (type(value) not in (int, float) or value < 0):
            raise self.error(key, f"expected a non-negative number, got {value!r}")
        return value

    def bool(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if value is None:
            return default
        if type(value) is not bool:
            raise self.error(key, f"expected true or false, got {value!r}")
        return value

    def str(self, *keys: str, default: Any = _REQUIRED) -> Any:
        key, value = self._get(keys, default)
        if value is not None and not isinstance(value, str):
            raise self.error(key, f"expected a string, got {value!r}")
        return value

    def refuse_if(
        self, condition: builtins.bool, key: builtins.str, problem: builtins.str
    ) -> None:
        if condition:
            raise self.error(key, problem)

    def only(self, key: builtins.str, supported: builtins.bool) -> None:
        """Refuse the other value of a flag whose default is the supported one."""
        self.refuse_if(self.bool(key, supported) != supported, key,
                       f"{str(not supported).lower()} is not supported")


# --- pieces shared by families ------------------------------------------------------------------


def _heads(hidden: int, heads: int, head_dim: int | None) -> dict[str, Any]:
    """kv_channels only where a head is not h / a wide."""
    if head_dim is None or (hidden % heads == 0 and head_dim == hidden // heads):
        return {}
    return {"kv_channels": head_dim}


def _rope(c: _Config, theta_default: float = 10000.0) -> dict[str, Any]:
    """rotary_base, rotary_percent and rope_scaling, from transformers 5 `rope_parameters` or
    the older `rope_theta` / `rope_scaling` / `partial_rotary_factor` keys."""
    params = c.data.get("rope_parameters")
    if params is not None and not isinstance(params, dict):
        raise c.error("rope_parameters", f"expected a mapping, got {params!r}")
    scaling = params if params is not None else c.data.get("rope_scaling")
    if scaling is not None and not isinstance(scaling, dict):
        raise c.error("rope_scaling", f"expected a mapping or null, got {scaling!r}")
    merged = _Config({**c.data, **(params or {})}, c.source)
    fields: dict[str, Any] = {
        "rotary_base": float(merged.float("rope_theta", "rotary_emb_base", default=theta_default)),
        "rotary_percent": float(
            merged.float("partial_rotary_factor", "rotary_pct", default=1.0)
        ),
    }
    kind = (scaling or {}).get("rope_type") or (scaling or {}).get("type") or "default"
    key = "rope_parameters" if params is not None else "rope_scaling"
    if kind == "default":
        return fields
    rope = _Config(scaling or {}, f"{c.source}: {key}")
    if kind == "llama3":
        fields["rope_scaling"] = {
            "type": "llama3",
            "factor": rope.float("factor"),
            "low_freq_factor": rope.float("low_freq_factor"),
            "high_freq_factor": rope.float("high_freq_factor"),
            "original_max_position_embeddings": rope.int("original_max_position_embeddings"),
        }
    elif kind == "yarn":
        fields["rope_scaling"] = {
            "type": "yarn",
            "factor": rope.float("factor"),
            "original_max_position_embeddings": rope.int("original_max_position_embeddings"),
            "beta_fast": rope.float("beta_fast", default=32.0),
            "beta_slow": rope.float("beta_slow", default=1.0),
            "mscale": rope.float("mscale", default=1.0),
            "mscale_all_dim": rope.float("mscale_all_dim", default=0.0),
        }
    else:
        raise c.error(f"{key}.rope_type", f"{kind!r} is not supported (llama3 or yarn)")
    return fields


def _activation(c: _Config, key: str, default: str, gated: bool) -> str:
    name = c.str(key, default=default)
    if gated:
        table = {"silu": "swiglu", "swish": "swiglu", "gelu_pytorch_tanh": "geglu",
                 "gelu_new": "geglu"}
    else:
        table = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                 "relu": "relu"}
    if name not in table:
        kind = "a gated" if gated else "an ungated"
        raise c.error(key, f"{name!r} is not supported for {kind} MLP "
                      f"(supported: {', '.join(table)})")
    return table[name]


def _sliding(c: _Config, layers: int, period: int | None) -> dict[str, Any]:
    """window_size from `sliding_window`, on every layer (period None) or with every period-th
    layer attending fully; a `layer_types` list overrides the period if it has one."""
    window = c.int("sliding_window", default=None)
    types = c.data.get("layer_types")
    if types is not None:
        kinds = ("sliding_attention", "full_attention")
        if not isinstance(types, list) or len(types) != layers or set(types) - set(kinds):
            raise c.error("layer_types", f"expected {layers} of {' or '.join(kinds)}")
        sliding = [kind == kinds[0] for kind in types]
        if not any(sliding):
            return {}
        period = None if all(sliding) else _full_period(c, sliding)
    if window is None:
        return {}
    c.refuse_if(window < 2, "sliding_window", f"{window} leaves no earlier key to attend to")
    # transformers: a query sees keys q - w < k <= q, so w - 1 before it
    fields: dict[str, Any] = {"window_size": window - 1}
    if period is not None:
        fields["window_attn_skip_freq"] = period
    return fields


def _full_period(c: _Config, sliding: list[bool]) -> int:
    """N such that exactly the layers N, 2N, ... (1-based) attend fully."""
    period = sliding.index(False) + 1
    if sliding != [(i + 1) % period != 0 for i in range(len(sliding))]:
        raise c.error("layer_types", "only one full-attention layer every N layers can be "
                      "represented (Megatron's --window-attn-skip-freq)")
    return period


def _moe_layers(c: _Config, layers: int) -> dict[str, Any]:
    """Qwen-MoE layer kinds: MoE where (i + 1) % decoder_sparse_step == 0 and i is not in
    mlp_only_layers; representable when that is 'all but the first k'."""
    step = c.int("decoder_sparse_step", default=1)
    dense = c.data.get("mlp_only_layers") or []
    if not isinstance(dense, list) or not all(type(i) is int for i in dense):
        raise c.error("mlp_only_layers", f"expected a list of layer indices, got {dense!r}")
    c.refuse_if(step != 1, "decoder_sparse_step",
                f"{step} is not supported (MoE on every layer, 1, only)")
    c.refuse_if(sorted(dense) != list(range(len(dense))) or len(dense) >= layers,
                "mlp_only_layers", "only the first k layers may be dense")
    return {"moe_first_dense_layers": len(dense)} if dense else {}


# --- families -----------------------------------------------------------------------------------


def _decoder(c: _Config, *, tie: bool, max_positions: int, eps: float, sized: bool = True,
             act_key: str = "hidden_act", act_default: str = "silu",
             theta: float = 10000.0) -> dict[str, Any]:
    """The Llama-style decoder most families share: RMSNorm, rotary, gated MLP, no biases.

    `sized`: transformers defaults num_key_value_heads (and, for Qwen3 and Gemma, head_dim) to
    a fixed size rather than deriving it from the heads, so the file must give them.
    """
    layers = c.int("num_hidden_layers")
    hidden = c.int("hidden_size")
    heads = c.int("num_attention_heads")
    groups = c.int("num_key_value_heads", default=_REQUIRED if sized else heads)
    fixed_head_dim = c.data.get("model_type") in ("qwen3", "gemma", "gemma2")
    head_dim = c.int("head_dim", default=_REQUIRED if fixed_head_dim else None)
    return {
        "num_layers": layers,
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_query_groups": groups if groups != heads else None,
        **_heads(hidden, heads, head_dim),
        "ffn_hidden_size": c.int("intermediate_size"),
        "vocab_size": c.int("vocab_size"),
        "max_position_embeddings": c.int("max_position_embeddings", default=max_positions),
        "activation": _activation(c, act_key, act_default, gated=True),
        "tied_embeddings": c.bool("tie_word_embeddings", tie),
        "normalization": "rmsnorm",
        "norm_epsilon": float(c.float("rms_norm_eps", default=eps)),
        "position_embedding": "rope",
        **_rope(c, theta),
        "add_bias_linear": False,
        "hidden_dropout": 0.0,
        "attention_dropout": float(c.float("attention_dropout", default=0.0)),
    }


def _llama(c: _Config) -> dict[str, Any]:
    fields = _decoder(c, tie=False, max_positions=2048, eps=1e-6, sized=False)
    attention, mlp = c.bool("attention_bias", False), c.bool("mlp_bias", False)
    c.refuse_if(attention != mlp, "attention_bias", "biases on attention but not on the MLP "
                "(or the reverse, mlp_bias) cannot be represented")
    return {**fields, "add_bias_linear": attention}


def _mistral(c: _Config) -> dict[str, Any]:
    fields = _decoder(c, tie=False, max_positions=131072, eps=1e-6)
    return {**fields, **_sliding(c, fields["num_layers"], None)}


def _mixtral(c: _Config) -> dict[str, Any]:
    fields = _decoder(c, tie=False, max_positions=131072, eps=1e-5, theta=1e6)
    c.refuse_if(bool(c.float("router_jitter_noise", default=0.0)), "router_jitter_noise",
                "router jitter is not supported; set 0")
    return {
        **fields,
        **_sliding(c, fields["num_layers"], None),
        "num_experts": c.int("num_local_experts", "num_experts"),
        "moe_router_topk": c.int("num_experts_per_tok"),
        "moe_aux_loss_coeff": float(c.float("router_aux_loss_coef", default=0.001)),
    }


def _qwen_window(c: _Config) -> None:
    c.refuse_if(c.bool("use_sliding_window", False), "use_sliding_window",
                "Qwen's sliding window from max_window_layers on is not supported; set false")


def _qwen2(c: _Config) -> dict[str, Any]:
    _qwen_window(c)
    return {**_decoder(c, tie=False, max_positions=32768, eps=1e-6), "add_qkv_bias": True}


def _qwen3(c: _Config) -> dict[str, Any]:
    _qwen_window(c)
    c.only("attention_bias", False)  # biases on q, k, v and o but not the MLP
    return {**_decoder(c, tie=False, max_positions=32768, eps=1e-6), "qk_layernorm": True}


def _qwen_router(c: _Config, norm_default: bool) -> dict[str, Any]:
    return {
        "moe_router_topk": c.int("num_experts_per_tok"),
        "moe_router_pre_softmax": not c.bool("norm_topk_prob", norm_default),
        "moe_aux_loss_coeff": float(c.float("router_aux_loss_coef", default=0.001)),
    }


def _qwen2_moe(c: _Config) -> dict[str, Any]:
    fields = _qwen2(c)
    c.only("qkv_bias", True)
    return {
        **fields,
        **_moe_layers(c, fields["num_layers"]),
        **_qwen_router(c, norm_default=False),
        "num_experts": c.int("num_experts"),
        "moe_ffn_hidden_size": c.int("moe_intermediate_size"),
        "moe_shared_expert_intermediate_size": c.int("shared_expert_intermediate_size"),
        "moe_shared_expert_gate": True,
    }


def _qwen3_moe(c: _Config) -> dict[str, Any]:
    fields = _qwen3(c)
    return {
        **fields,
        **_moe_layers(c, fields["num_layers"]),
        **_qwen_router(c, norm_default=False),
        "num_experts": c.int("num_experts", "num_local_experts"),
        "moe_ffn_hidden_size": c.int("moe_intermediate_size"),
    }


def _gemma_decoder(c: _Config, act_key: str) -> dict[str, Any]:
    c.only("attention_bias", False)
    fields = _decoder(c, tie=True, max_positions=8192, eps=1e-6, act_key=act_key,
                      act_default="gelu_pytorch_tanh")
    return {**fields, "scale_embeddings": True, "layernorm_zero_centered_gamma": True}


def _gemma(c: _Config) -> dict[str, Any]:
    if c.data.get("hidden_act") == "gelu":
        # transformers reads Gemma's legacy "gelu" as the tanh approximation
        c = _Config({**c.data, "hidden_act": "gelu_pytorch_tanh"}, c.source)
    return _gemma_decoder(c, "hidden_act")


def _gemma2(c: _Config) -> dict[str, Any]:
    fields = _gemma_decoder(c, "hidden_activation")
    scalar = c.float("query_pre_attn_scalar", default=256)
    head_dim = fields.get("kv_channels") or fields["hidden_size"] // fields["num_attention_heads"]
    scale = float(scalar) ** -0.5
    return {
        **fields,
        **_sliding(c, fields["num_layers"], 2),
        "layer_block": "sandwich",
        "softmax_scale": None if scale == head_dim**-0.5 else scale,
        "attention_softcap": c.float("attn_logit_softcapping", default=None),
        "final_logit_softcap": c.float("final_logit_softcapping", default=None),
    }


def _phi3(c: _Config) -> dict[str, Any]:
    fields = _decoder(c, tie=False, max_positions=4096, eps=1e-5, sized=False)
    hidden = float(c.float("resid_pdrop", default=0.0))
    c.refuse_if(float(c.float("embd_pdrop", default=0.0)) != hidden, "embd_pdrop",
                "must equal resid_pdrop (Megatron's hidden_dropout covers both)")
    return {**fields, **_sliding(c, fields["num_layers"], None), "hidden_dropout": hidden}


def _deepseek(c: _Config, v3: bool) -> dict[str, Any]:
    fields = _decoder(c, tie=False, max_positions=4096 if v3 else 2048, eps=1e-6, sized=False)
    c.only("attention_bias", False)
    fields.pop("kv_channels", None)  # transformers 5 stores qk_rope_head_dim there
    c.refuse_if(c.int("moe_layer_freq", default=1) != 1, "moe_layer_freq",
                "only 1 is supported (transformers makes every layer past the dense ones MoE)")
    method = c.str("topk_method", default="noaux_tc" if v3 else "greedy")
    c.refuse_if(method not in ("greedy", "noaux_tc"), "topk_method",
                f"{method!r} is not supported (greedy or noaux_tc): DeepSeek-V2's group score "
                "(best expert) differs from Megatron's (sum of the top experts)")
    scoring = c.str("scoring_func", default="sigmoid" if v3 else "softmax")
    normalise = c.bool("norm_topk_prob", v3)
    c.refuse_if(scoring == "sigmoid" and not normalise, "norm_topk_prob",
                "sigmoid routing without renormalised top-k weights is not supported")
    groups = c.int("n_group", default=None)
    group_topk = c.int("topk_group", default=None)
    grouped = groups is not None and groups > 1
    scaling = float(c.float("routed_scaling_factor", default=1.0))
    shared = c.int("n_shared_experts", default=1 if v3 else 2, minimum=0)
    width = c.int("moe_intermediate_size")
    experts = c.int("n_routed_experts")
    return {
        **fields,
        "num_query_groups": None,
        "q_lora_rank": c.int("q_lora_rank", default=None),
        "kv_lora_rank": c.int("kv_lora_rank"),
        "qk_head_dim": c.int("qk_nope_head_dim"),
        "qk_pos_emb_head_dim": c.int("qk_rope_head_dim"),
        "v_head_dim": c.int("v_head_dim"),
        "qk_layernorm": True,
        "num_experts": experts,
        "moe_router_topk": c.int("num_experts_per_tok"),
        "moe_ffn_hidden_size": width,
        "moe_shared_expert_intermediate_size": shared * width if shared else None,
        "moe_first_dense_layers": c.int("first_k_dense_replace", default=0, minimum=0),
        "moe_router_score_function": scoring,
        "moe_router_pre_softmax": scoring == "softmax" and not normalise,
        "moe_router_topk_scaling_factor": None if scaling == 1.0 else scaling,
        "moe_router_num_groups": groups if grouped else None,
        "moe_router_group_topk": group_topk if grouped else None,
        "moe_router_enable_expert_bias": method == "noaux_tc",
        "moe_router_load_balancing_type":
            "seq_aux_loss" if c.bool("seq_aux", True) else "aux_loss",
        "moe_aux_loss_coeff": float(c.float("aux_loss_alpha", default=0.001)),
    }


def _deepseek_v2(c: _Config) -> dict[str, Any]:
    return _deepseek(c, v3=False)


def _deepseek_v3(c: _Config) -> dict[str, Any]:
    return _deepseek(c, v3=True)


def _gpt2(c: _Config) -> dict[str, Any]:
    hidden = c.int("n_embd", "hidden_size")
    dropout = float(c.float("resid_pdrop", default=0.1))
    c.refuse_if(float(c.float("embd_pdrop", default=0.1)) != dropout, "embd_pdrop",
                "must equal resid_pdrop (Megatron's hidden_dropout covers both)")
    c.only("scale_attn_weights", True)
    c.only("scale_attn_by_inverse_layer_idx", False)
    return {
        "num_layers": c.int("n_layer", "num_hidden_layers"),
        "hidden_size": hidden,
        "num_attention_heads": c.int("n_head", "num_attention_heads"),
        "ffn_hidden_size": c.int("n_inner", default=4 * hidden),
        "vocab_size": c.int("vocab_size"),
        "max_position_embeddings": c.int("n_positions", "max_position_embeddings"),
        "activation": _activation(c, "activation_function", "gelu_new", gated=False),
        "tied_embeddings": c.bool("tie_word_embeddings", True),
        "norm_epsilon": float(c.float("layer_norm_epsilon", default=1e-5)),
        "hidden_dropout": dropout,
        "attention_dropout": float(c.float("attn_pdrop", default=0.1)),
    }


def _gpt_neox(c: _Config) -> dict[str, Any]:
    c.refuse_if(not c.bool("attention_bias", True), "attention_bias",
                "false (with MLP biases) cannot be represented")
    return {
        "num_layers": c.int("num_hidden_layers"),
        "hidden_size": c.int("hidden_size"),
        "num_attention_heads": c.int("num_attention_heads"),
        "ffn_hidden_size": c.int("intermediate_size"),
        "vocab_size": c.int("vocab_size"),
        "max_position_embeddings": c.int("max_position_embeddings", default=2048),
        "activation": _activation(c, "hidden_act", "gelu", gated=False),
        "tied_embeddings": c.bool("tie_word_embeddings", False),
        "norm_epsilon": float(c.float("layer_norm_eps", default=1e-5)),
        "position_embedding": "rope",
        **_rope(c),
        "layer_block": "parallel" if c.bool("use_parallel_residual", True) else "pre_norm",
        "hidden_dropout": float(c.float("hidden_dropout", default=0.0)),
        "attention_dropout": float(c.float("attention_dropout", default=0.0)),
    }


def _falcon_block(c: _Config) -> str:
    parallel = c.bool("parallel_attn", True)
    new = c.bool("new_decoder_architecture", False)
    norms = c.int("num_ln_in_parallel_attn", default=2 if new else 1)
    c.refuse_if(new and not parallel, "parallel_attn",
                "false with new_decoder_architecture is not supported")
    c.refuse_if(parallel and not new and norms != 1, "num_ln_in_parallel_attn",
                "2 needs new_decoder_architecture")
    c.refuse_if(norms not in (1, 2), "num_ln_in_parallel_attn", "expected 1 or 2")
    if not parallel:
        return "pre_norm"
    return "parallel" if norms == 2 else "parallel_shared_norm"


def _falcon(c: _Config) -> dict[str, Any]:
    hidden = c.int("hidden_size", "n_embed")
    heads = c.int("num_attention_heads", "n_head")
    c.only("apply_residual_connection_post_layernorm", False)
    if c.bool("new_decoder_architecture", False):
        groups = c.int("num_kv_heads", default=heads)
    elif c.bool("multi_query", True):
        groups = 1
    else:
        groups = heads
    alibi = c.bool("alibi", False)
    return {
        "num_layers": c.int("num_hidden_layers", "n_layer"),
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_query_groups": groups if groups != heads else None,
        "ffn_hidden_size": c.int("ffn_hidden_size", default=4 * hidden),
        "vocab_size": c.int("vocab_size"),
        "max_position_embeddings": c.int("max_position_embeddings", default=2048),
        "activation": _activation(c, "activation", "gelu", gated=False),
        "add_bias_linear": c.bool("bias", False),
        "tied_embeddings": c.bool("tie_word_embeddings", True),
        "norm_epsilon": float(c.float("layer_norm_epsilon", default=1e-5)),
        "layer_block": _falcon_block(c),
        "position_embedding": "alibi" if alibi else "rope",
        **({} if alibi else _rope(c)),
        "hidden_dropout": float(c.float("hidden_dropout", default=0.0)),
        "attention_dropout": float(c.float("attention_dropout", default=0.0)),
    }


def _opt(c: _Config) -> dict[str, Any]:
    hidden = c.int("hidden_size")
    c.refuse_if(not c.bool("do_layer_norm_before", True), "do_layer_norm_before",
                "false (post-norm layers, as in OPT-350m) is not supported")
    c.refuse_if(c.int("word_embed_proj_dim", default=hidden) != hidden, "word_embed_proj_dim",
                f"must equal hidden_size ({hidden}); embedding projections are not supported")
    c.only("_remove_final_layer_norm", False)
    c.refuse_if(bool(c.float("activation_dropout", default=0.0)), "activation_dropout",
                "dropout after the activation is not supported; set 0")
    c.only("layer_norm_elementwise_affine", True)
    return {
        "num_layers": c.int("num_hidden_layers"),
        "hidden_size": hidden,
        "num_attention_heads": c.int("num_attention_heads"),
        "ffn_hidden_size": c.int("ffn_dim"),
        "vocab_size": c.int("vocab_size"),
        "max_position_embeddings": c.int("max_position_embeddings", default=2048),
        "learned_position_offset": 2,
        "activation": _activation(c, "activation_function", "relu", gated=False),
        "add_bias_linear": c.bool("enable_bias", True),
        "tied_embeddings": c.bool("tie_word_embeddings", True),
        "hidden_dropout": float(c.float("dropout", default=0.1)),
        "attention_dropout": float(c.float("attention_dropout", default=0.0)),
    }


def _bloom(c: _Config) -> dict[str, Any]:
    hidden = c.int("hidden_size", "n_embed")
    c.only("apply_residual_connection_post_layernorm", False)
    return {
        "num_layers": c.int("n_layer", "num_hidden_layers"),
        "hidden_size": hidden,
        "num_attention_heads": c.int("n_head", "num_attention_heads"),
        "ffn_hidden_size": 4 * hidden,
        "vocab_size": c.int("vocab_size"),
        "max_position_embeddings": c.int("seq_length", default=2048),
        "activation": "gelu_tanh",
        "tied_embeddings": c.bool("tie_word_embeddings", True),
        "norm_epsilon": float(c.float("layer_norm_epsilon", default=1e-5)),
        "embedding_layernorm": True,
        "position_embedding": "alibi",
        "hidden_dropout": float(c.float("hidden_dropout", default=0.0)),
        "attention_dropout": float(c.float("attention_dropout", default=0.0)),
    }


FAMILIES: dict[str, Callable[[_Config], dict[str, Any]]] = {
    "llama": _llama,
    "mistral": _mistral,
    "mixtral": _mixtral,
    "qwen2": _qwen2,
    "qwen2_moe": _qwen2_moe,
    "qwen3": _qwen3,
    "qwen3_moe": _qwen3_moe,
    "gemma": _gemma,
    "gemma2": _gemma2,
    "phi3": _phi3,
    "deepseek_v2": _deepseek_v2,
    "deepseek_v3": _deepseek_v3,
    "gpt2": _gpt2,
    "gpt_neox": _gpt_neox,
    "falcon": _falcon,
    "opt": _opt,
    "bloom": _bloom,
}
"""The Hugging Face `model_type`s this module reads."""


def hf_to_megatron(config: dict[str, Any], source: str) -> dict[str, Any]:
    """ModelSpec fields (Megatron-LM names) for a Hugging Face config.json.

    Args:
        config: The parsed config.json.
        source: Where it came from, for error messages.

    Returns:
        Keyword arguments of ModelSpec.

    Raises:
        AutotuneError: Unknown model_type, a missing or mistyped key, or a feature the spec
            cannot represent (the message names the key).
    """
    model_type = config.get("model_type")
    if model_type not in FAMILIES:
        raise AutotuneError(
            f"{source}: model_type: {model_type!r} is not supported; supported: "
            f"{', '.join(sorted(FAMILIES))}"
        )
    c = _Config(config, source)
    name = c.str("_name_or_path", default=None) or model_type
    return {"name": name, **FAMILIES[model_type](c)}
