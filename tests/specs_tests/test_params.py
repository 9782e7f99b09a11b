"""Parameter counts (autotune/specs/params.py) against transformers' models and published
figures."""

from __future__ import annotations

from typing import Any

import pytest
from helpers_models import PUBLISHED
from helpers_models import hf_model
from helpers_models import hf_param_count
from helpers_models import published
from helpers_models import spec
from hypothesis import HealthCheck
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st

pytest.importorskip("transformers")

NO_SPECIAL_TOKENS = {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None}
FIXED_HEAD_DIM = ("qwen3", "gemma", "gemma2")  # transformers' head_dim default is a constant


def _maybe(draw: Any, config: dict[str, Any], key: str, value: Any) -> None:
    """Set `key` or leave it out (so transformers' default and ours are compared too)."""
    if draw(st.booleans()):
        config[key] = value


def _attention_shape(draw: Any) -> dict[str, int]:
    heads = draw(st.sampled_from([2, 4, 6]))
    head_dim = draw(st.sampled_from([8, 16]))
    return {"heads": heads, "head_dim": head_dim, "hidden": heads * head_dim,
            "groups": draw(st.sampled_from([g for g in (1, 2, heads) if heads % g == 0]))}


def _llama_like(draw: Any, model_type: str) -> dict[str, Any]:
    """llama, mistral, mixtral, qwen2/3(_moe), gemma/gemma2, phi3: the shared Llama keys."""
    shape = _attention_shape(draw)
    # a head is head_dim wide, h / a or not (transformers checks that a divides h)
    hidden = shape["heads"] * (shape["head_dim"] + draw(st.sampled_from([0, 4])))
    config: dict[str, Any] = {
        "model_type": model_type,
        "num_hidden_layers": draw(st.integers(1, 3)),
        "hidden_size": hidden,
        "num_attention_heads": shape["heads"],
        "intermediate_size": draw(st.sampled_from([24, 40])),
        "vocab_size": draw(st.integers(50, 120)),
        "head_dim": shape["head_dim"],
        **NO_SPECIAL_TOKENS,
    }
    if hidden == shape["hidden"] and model_type not in FIXED_HEAD_DIM and draw(st.booleans()):
        del config["head_dim"]  # transformers' default, h / a
    config["num_key_value_heads"] = shape["groups"]
    if model_type in ("llama", "phi3", "deepseek_v2") and draw(st.booleans()):
        del config["num_key_value_heads"]  # transformers' default there: the query heads
    _maybe(draw, config, "tie_word_embeddings", draw(st.booleans()))
    _maybe(draw, config, "max_position_embeddings", 64)
    return config


def _moe_keys(draw: Any, experts_key: str) -> dict[str, Any]:
    experts = draw(st.sampled_from([2, 4]))
    return {experts_key: experts, "num_experts_per_tok": draw(st.integers(1, experts)),
            "moe_intermediate_size": draw(st.sampled_from([8, 16]))}


@st.composite
def small_configs(draw: Any) -> dict[str, Any]:
    """A small config.json of any supported family, with its optional features drawn."""
    family = draw(st.sampled_from([
        "llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "gemma",
        "gemma2", "phi3", "deepseek_v2", "deepseek_v3", "gpt2", "gpt_neox", "falcon", "opt",
        "bloom"]))
    if family == "gpt2":
        shape = _attention_shape(draw)
        config = {"model_type": "gpt2", "n_layer": draw(st.integers(1, 3)),
                  "n_embd": shape["hidden"], "n_head": shape["heads"], "vocab_size": 90,
                  "n_positions": draw(st.sampled_from([16, 32])), **NO_SPECIAL_TOKENS}
        _maybe(draw, config, "n_inner", 24)
        _maybe(draw, config, "tie_word_embeddings", draw(st.booleans()))
        return config
    if family in ("gpt_neox", "falcon", "opt", "bloom"):
        return _bias_family(draw, family)
    config = _llama_like(draw, family)
    if family == "llama":
        bias = draw(st.booleans())
        config.update(attention_bias=bias, mlp_bias=bias)
    if family in ("mistral", "mixtral", "phi3"):
        _maybe(draw, config, "sliding_window", 16)
    if family == "mixtral":
        config.update(_moe_keys(draw, "num_local_experts"))
        config["intermediate_size"] = config.pop("moe_intermediate_size")
    if family in ("qwen2_moe", "qwen3_moe"):
        config.update(_moe_keys(draw, "num_experts"))
        if config["num_hidden_layers"] > 1:
            _maybe(draw, config, "mlp_only_layers", [0])
        if family == "qwen2_moe":
            config["shared_expert_intermediate_size"] = draw(st.sampled_from([8, 24]))
    if family == "gemma2":
        _maybe(draw, config, "query_pre_attn_scalar", 24)
    if family == "phi3":
        _maybe(draw, config, "partial_rotary_factor", 0.5)
    if family.startswith("deepseek"):
        _deepseek(draw, config, family == "deepseek_v3")
    return config


def _deepseek(draw: Any, config: dict[str, Any], v3: bool) -> None:
    experts = draw(st.sampled_from([4, 8]))
    config.update(
        n_routed_experts=experts, num_experts_per_tok=draw(st.integers(1, 4)),
        moe_intermediate_size=16, kv_lora_rank=draw(st.sampled_from([8, 16])),
        q_lora_rank=draw(st.sampled_from([None, 12])), qk_nope_head_dim=8, qk_rope_head_dim=4,
        v_head_dim=draw(st.sampled_from([8, 12])),
        first_k_dense_replace=draw(st.integers(0, config["num_hidden_layers"] - 1)))
    config.pop("head_dim", None)
    config["hidden_size"] = config["num_attention_heads"] * 8  # Megatron: heads divide h
    _maybe(draw, config, "n_shared_experts", draw(st.integers(1, 2)))
    if v3:
        config.update(n_group=2, topk_group=1)


def _bias_family(draw: Any, family: str) -> dict[str, Any]:
    """GPT-NeoX, Falcon, OPT, BLOOM: LayerNorm with biases, their own key names."""
    shape = _attention_shape(draw)
    config: dict[str, Any] = {"model_type": family, "hidden_size": shape["hidden"],
                              "num_attention_heads": shape["heads"], "vocab_size": 77,
                              **NO_SPECIAL_TOKENS}
    layers = draw(st.integers(1, 3))
    config["n_layer" if family == "bloom" else "num_hidden_layers"] = layers
    _maybe(draw, config, "tie_word_embeddings", draw(st.booleans()))
    if family == "gpt_neox":
        config.update(intermediate_size=40, rotary_pct=draw(st.sampled_from([0.25, 1.0])))
        _maybe(draw, config, "use_parallel_residual", draw(st.booleans()))
    elif family == "falcon":
        new = draw(st.booleans())
        config.update(new_decoder_architecture=new, bias=draw(st.booleans()),
                      alibi=draw(st.booleans()))
        if new:
            config["num_kv_heads"] = shape["groups"]
            _maybe(draw, config, "num_ln_in_parallel_attn", draw(st.sampled_from([1, 2])))
        else:
            config["multi_query"] = draw(st.booleans())
            _maybe(draw, config, "parallel_attn", draw(st.booleans()))
        _maybe(draw, config, "ffn_hidden_size", 24)
    elif family == "opt":
        config.update(ffn_dim=40, max_position_embeddings=32, word_embed_proj_dim=shape["hidden"])
        _maybe(draw, config, "enable_bias", draw(st.booleans()))
    return config


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=small_configs())
def test_small_configs_match_transformers(config: dict[str, Any]) -> None:
    """Oracle: transformers builds each family from the same config on the meta device; our
    count equals sum(p.numel() for p in model.parameters()) exactly (keys left out test that
    our defaults are transformers')."""
    assert spec(config).num_params() == hf_param_count(config)


# Published total parameters (model cards / technical reports, in billions, as they round them)
PUBLISHED_BILLIONS = {
    "mistralai/Mixtral-8x7B-v0.1": 46.7,  # Jiang et al. 2024, "Mixtral of Experts", §2
    "mistralai/Mixtral-8x22B-v0.1": 141,  # mistral.ai/news/mixtral-8x22b
    "deepseek-ai/DeepSeek-V2-Lite": 15.7,  # DeepSeek-V2 paper (arXiv:2405.04434), App. B
    "deepseek-ai/DeepSeek-V3": 671,  # DeepSeek-V3 technical report (arXiv:2412.19437), §1
    "google/gemma-2-9b": 9.24,  # model card's safetensors total
    "tiiuae/falcon-7b": 6.92,  # model card's safetensors total
    "facebook/opt-1.3b": 1.3,  # Zhang et al. 2022 (OPT), Table 1
    "bigscience/bloom-560m": 0.559,  # model card: 559,214,592 parameters
    "openai-community/gpt2": 0.124,  # model card's safetensors total
    "meta-llama/Meta-Llama-3-8B": 8.03,  # model card's safetensors total
    "meta-llama/Llama-3.1-405B": 406,  # model card's safetensors total
    "Qwen/Qwen2.5-72B": 72.7,  # model card: "Number of Parameters: 72.7B"
    "Qwen/Qwen3-30B-A3B": 30.5,  # model card: "30.5B in total and 3.3B activated"
    "mistralai/Mistral-Nemo-Base-2407": 12.2,  # model card's safetensors total
}


@pytest.mark.parametrize("repo", PUBLISHED)
def test_published_configs_match_transformers(repo: str) -> None:
    """Oracle: transformers' model of the published config.json (meta device), and the
    published total where the model card or paper gives one (at its rounding)."""
    config = published(repo)
    ours = spec(config).num_params()
    assert ours == hf_param_count(config)
    if repo in PUBLISHED_BILLIONS:
        figure = PUBLISHED_BILLIONS[repo]
        digits = len(str(figure).replace(".", "").lstrip("0"))
        assert float(f"{ours / 1e9:.{digits}g}") == figure


def test_mixtral_active_parameters_by_hand() -> None:
    """Oracle: a hand count, which rounds to the 12.9 B active parameters of Jiang et al. 2024
    ("Mixtral of Experts", §2: "uses only 13B active parameters", 12.9 B on the model card)."""
    h, f, vocab, layers = 4096, 14336, 32000, 32
    attention = h * h * 2 + h * 1024 * 2  # q, o: 32 heads of 128; k, v: 8 groups of 128
    two_experts = 2 * 3 * h * f
    router, norms = 8 * h, 2 * h
    per_layer = attention + two_experts + router + norms
    expected = layers * per_layer + 2 * vocab * h + h  # untied embedding and output, final norm
    assert spec(published("mistralai/Mixtral-8x7B-v0.1")).active_params() == expected
    assert round(expected / 1e9, 1) == 12.9


def test_deepseek_v3_active_parameters_by_hand() -> None:
    """Oracle: a hand count of DeepSeek-V3 (technical report arXiv:2412.19437, §2.1: MLA with
    q/kv ranks 1536/512, 128 heads of 128+64 (q, k) and 128 (v), 3 dense layers of width 18432,
    58 MoE layers of 1 shared + 8 of 256 routed experts of width 2048), which the report rounds
    to "37B activated for each token"."""
    h, heads, vocab = 7168, 128, 129280
    attention = (h * 1536 + 1536 + 1536 * heads * 192  # q down, q norm, q up
                 + h * (512 + 64) + 512 + 512 * heads * (128 + 128)  # kv down, norm, up
                 + heads * 128 * h)  # output projection
    norms = 2 * h
    dense = attention + 3 * h * 18432 + norms
    moe = attention + (8 + 1) * 3 * h * 2048 + 256 * h + norms  # top-8 + shared, router
    expected = 3 * dense + 58 * moe + 2 * vocab * h + h
    assert spec(published("deepseek-ai/DeepSeek-V3")).active_params() == expected
    assert round(expected / 1e9) in (37, 38)


def _linears(module: Any) -> list[tuple[int, int]]:
    import torch

    return sorted((m.in_features, m.out_features) for m in module.children()
                  if isinstance(m, torch.nn.Linear))


def _shapes(parts: Any) -> list[tuple[int, int]]:
    return sorted((p.inputs, p.outputs) for p in parts)


@pytest.mark.parametrize("repo", ["meta-llama/Llama-3.1-8B", "deepseek-ai/DeepSeek-V3"])
def test_projections_are_transformers_linear_shapes(repo: str) -> None:
    """Oracle: the nn.Linear shapes (and fused expert weights) of transformers' model of the
    published config, 4 layers of it on the meta device (DeepSeek-V3: 3 dense, then MoE).
    Multi-latent attention matches projection by projection; GQA's fused QKV is q, k and v
    side by side, the (gated) MLP up is gate and up side by side."""
    from autotune.specs.params import projections

    config = {**published(repo), "num_hidden_layers": 4}
    model, shapes = hf_model(config), projections(spec(config))
    dense, last = model.model.layers[0], model.model.layers[3]
    attention = _linears(dense.self_attn)
    if spec(config).multi_latent_attention:
        assert _shapes(shapes.attention) == attention
    else:
        qkv, out = shapes.attention
        q, k, v, o = (getattr(dense.self_attn, f"{n}_proj") for n in "qkvo")
        assert (out.inputs, out.outputs) == (o.in_features, o.out_features)
        assert (qkv.inputs, qkv.outputs) == (
            q.in_features, q.out_features + k.out_features + v.out_features)
    gate, _, down = (dense.mlp.gate_proj, dense.mlp.up_proj, dense.mlp.down_proj)
    assert _shapes(shapes.mlp) == sorted([(gate.in_features, 2 * gate.out_features),
                                          (down.in_features, down.out_features)])
    if spec(config).moe:
        shared = last.mlp.shared_experts
        assert _shapes(shapes.shared_experts) == sorted([
            (shared.gate_proj.in_features, 2 * shared.gate_proj.out_features),
            (shared.down_proj.in_features, shared.down_proj.out_features)])
        experts, h_out = last.mlp.experts.gate_up_proj.shape[1:], last.mlp.experts.down_proj
        up, down_expert = shapes.expert
        assert (up.outputs, up.inputs) == tuple(experts)
        assert (down_expert.outputs, down_expert.inputs) == tuple(h_out.shape[1:])
    splits = {p.name: p.split for p in (*shapes.attention, *shapes.mlp)}
    assert splits["out"] == splits["down"] == "inputs" and splits["up"] == "outputs"
