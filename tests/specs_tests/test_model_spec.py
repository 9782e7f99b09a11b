"""ModelSpec validation: strict sizes and the shape rules Megatron-LM applies."""

from __future__ import annotations

from typing import Any

import pytest
from helpers_models import published
from helpers_models import spec
from pydantic import ValidationError

from autotune.specs import ModelSpec
from autotune.specs.inputs import load_model

BASE = {"num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 100}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"hidden_size": True}, "hidden_size\n  must be a number, not true/false"),
        ({"hidden_size": "768"}, "hidden_size\n  Input should be a valid integer"),
        ({"vocab_size": 2**31}, "vocab_size\n  must be at most 16,777,216"),
        ({"num_layers": 0}, "num_layers\n  Input should be greater than or equal to 1"),
        ({"hidden_dropout": 1.0}, "hidden_dropout\n  Input should be less than 1"),
        ({"hidden_size": 66}, r"hidden_size \(66\) must be divisible by num_attention_heads"),
        ({"num_query_groups": 3}, r"num_attention_heads \(4\) must be divisible by "),
        ({"rotary_percent": 0.5}, "rope_scaling and rotary_percent need position_embedding rope"),
        ({"kv_lora_rank": 8, "position_embedding": "rope"},
         "needs qk_head_dim, qk_pos_emb_head_dim, v_head_dim"),
        ({"num_experts": 2, "moe_router_topk": 3}, r"moe_router_topk \(3\) exceeds"),
        ({"moe_shared_expert_intermediate_size": 8}, "need num_experts"),
        ({"num_experts": 4, "moe_first_dense_layers": 2}, "no MoE layer"),
        ({"num_experts": 6, "moe_router_num_groups": 4, "moe_router_group_topk": 2},
         "group-limited routing needs num_experts"),
        ({"window_attn_skip_freq": 2}, "window_attn_skip_freq needs window_size"),
    ],
)
def test_bad_specs_are_refused(changes: dict[str, Any], message: str) -> None:
    """Oracle: Megatron-LM's own shape asserts (arguments.py: hidden % heads without
    --kv-channels, heads % groups) and hand-picked invalid values."""
    with pytest.raises(ValidationError, match=message):
        ModelSpec(**{**BASE, **changes})


def test_kv_channels_lifts_the_divisibility_rule() -> None:
    """Oracle: Megatron-LM's arguments.py asserts hidden % heads only without --kv-channels."""
    model = ModelSpec(**{**BASE, "hidden_size": 66, "kv_channels": 32})
    assert model.head_dim == 32


def test_llama3_presets_build_the_published_model() -> None:
    """Oracle: Meta-Llama-3-8B's config.json (rope_theta 500000, rms_norm_eps 1e-5, no dropout)."""
    model = load_model("llama3-8b")
    assert (model.rotary_base, model.norm_epsilon) == (500000, 1e-5)
    assert (model.hidden_dropout, model.attention_dropout) == (0, 0)


PRESET_SOURCES = {
    "llama3-8b": "meta-llama/Meta-Llama-3-8B",
    "llama3-70b": "meta-llama/Meta-Llama-3-70B",
    "llama3-405b": "meta-llama/Llama-3.1-405B",
    "mixtral-8x7b": "mistralai/Mixtral-8x7B-v0.1",
    "mixtral-8x22b": "mistralai/Mixtral-8x22B-v0.1",
    "deepseek-v3": "deepseek-ai/DeepSeek-V3",
    "qwen2.5-72b": "Qwen/Qwen2.5-72B",
}


@pytest.mark.parametrize(("preset", "repo"), sorted(PRESET_SOURCES.items()))
def test_presets_are_the_published_models(preset: str, repo: str) -> None:
    """Oracle: the published config.json, read by the import that test_params checks against
    transformers; DeepSeek-V3's balance-loss weight is its report's (arXiv:2412.19437, §4.2:
    alpha = 0.0001), not config.json's 0.001."""
    expected = spec(published(repo)).model_dump(exclude={"name"})
    if preset == "deepseek-v3":
        expected["moe_aux_loss_coeff"] = 1e-4
    assert load_model(preset).model_dump(exclude={"name"}) == expected
