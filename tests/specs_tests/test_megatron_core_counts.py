"""megatron-core builds scaled-down copies of real families on CPU; its count equals ours.

Each copy is a published config.json read by our import, with every size shrunk and every
architecture choice (GQA, head width, biases, norms, activation, tying, experts, shared experts
and their gate, dense first layers, routing) kept. The model is megatron-core's GPTModel from
`transformer_config_kwargs` and `gpt_model_kwargs`, with the local (no Transformer Engine)
layer spec, on gloo with world size 1. GPTModel takes the vocabulary it is given; Megatron-LM
pads it first (`--make-vocab-size-divisible-by`, 128 per tensor-parallel rank), so GPTModel gets
the padded vocabulary (the copies' 100 becomes 128) and our count is asked for with it.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import pytest
import torch
from helpers_models import published
from helpers_models import spec

from autotune.frameworks.megatron.model import gpt_model_kwargs
from autotune.frameworks.megatron.model import transformer_config_class
from autotune.frameworks.megatron.model import transformer_config_kwargs
from autotune.specs import ModelSpec
from autotune.specs.inputs import load_model

SMALL = {"num_layers": 3, "hidden_size": 64, "num_attention_heads": 4, "ffn_hidden_size": 96,
         "vocab_size": 100, "max_position_embeddings": 64}
NO_TE_MLA = (
    "megatron-core 0.16.1 cannot build multi-latent attention without Transformer Engine: "
    "MLASelfAttention tests isinstance(linear_proj, TELinear) with TELinear None "
    "(multi_latent_attention.py:185), the local spec's DotProductAttention takes no k_channels, "
    "and its rotary embedding ignores use_cpu_initialization (built on torch.cuda)"
)


def _scaled(repo: str, **changes: Any) -> ModelSpec:
    """The published model's architecture at toy size."""
    fields = spec(published(repo)).model_dump()
    fields.update(SMALL)
    if fields["num_query_groups"] is not None:
        fields["num_query_groups"] = 2
    if fields["kv_channels"] is not None:
        fields["kv_channels"] = 32  # still not h / a = 16
    if fields["num_experts"] is not None:
        fields.update(num_experts=4, moe_ffn_hidden_size=32, moe_router_topk=2)
        if fields["moe_router_num_groups"] is not None:
            fields.update(moe_router_num_groups=2, moe_router_group_topk=1)
        if fields["moe_shared_expert_intermediate_size"] is not None:
            fields["moe_shared_expert_intermediate_size"] = 48
        if fields["moe_first_dense_layers"]:
            fields["moe_first_dense_layers"] = 1
    fields.update(changes)
    return ModelSpec(**fields)


CASES = {
    "llama3": lambda: _scaled("meta-llama/Llama-3.1-8B"),
    "mistral-nemo (kv_channels)": lambda: _scaled("mistralai/Mistral-Nemo-Base-2407"),
    "qwen2 (qkv bias, tied)": lambda: _scaled("Qwen/Qwen2.5-72B", tied_embeddings=True),
    "qwen3 (qk-norm)": lambda: _scaled("Qwen/Qwen3-8B"),
    "gpt2 (learned positions, biases, LayerNorm)": lambda: _scaled("openai-community/gpt2"),
    "mixtral": lambda: _scaled("mistralai/Mixtral-8x7B-v0.1"),
    "qwen2-moe (shared expert gate)": lambda: _scaled("Qwen/Qwen2-57B-A14B"),
    "gemma2-like (GeGLU)": lambda: _scaled(
        "google/gemma-2-9b", layer_block="pre_norm", scale_embeddings=False,
        layernorm_zero_centered_gamma=False, attention_softcap=None, final_logit_softcap=None,
        window_size=None, window_attn_skip_freq=None),
    # multi-latent attention needs Transformer Engine (see NO_TE_MLA); the router's expert bias
    # is a buffer that router.py allocates on torch.cuda.current_device(), and no parameter
    "deepseek-v3 MoE (GQA attention)": lambda: _scaled(
        "deepseek-ai/DeepSeek-V3", kv_lora_rank=None, q_lora_rank=None, qk_head_dim=None,
        qk_pos_emb_head_dim=None, v_head_dim=None, qk_layernorm=False, rope_scaling=None,
        num_query_groups=2, moe_router_enable_expert_bias=False),
    "tiny-moe preset": lambda: load_model("tiny-moe"),
}


def padded_vocab(model: ModelSpec) -> int:
    """Megatron-LM's vocabulary at tp=1: a multiple of --make-vocab-size-divisible-by 128."""
    return -(-model.vocab_size // 128) * 128


def _megatron_count(model: ModelSpec, use_te: bool = False) -> int:
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.models.gpt.gpt_model import GPTModel

    config = transformer_config_class(model)(
        **transformer_config_kwargs(model), use_cpu_initialization=not use_te,
        params_dtype=torch.float32)
    layers = get_gpt_decoder_block_spec(config, use_transformer_engine=use_te,
                                        normalization=config.normalization)
    kwargs = {**gpt_model_kwargs(model, model.max_position_embeddings),
              "vocab_size": padded_vocab(model)}
    gpt = GPTModel(config, layers, **kwargs)
    return sum(p.numel() for p in gpt.parameters())


@pytest.mark.parametrize("case", sorted(CASES))
def test_megatron_core_builds_our_count(case: str, model_parallel: None) -> None:
    """Oracle: megatron-core's GPTModel of the same architecture, on CPU, counts the same
    parameters (vocabulary padded as Megatron-LM pads it)."""
    model = CASES[case]()
    assert _megatron_count(model) == model.num_params(vocab=padded_vocab(model))


@pytest.mark.skipif(
    not torch.cuda.is_available() or importlib.util.find_spec("transformer_engine") is None,
    reason=NO_TE_MLA,
)
def test_megatron_core_builds_our_mla_count(model_parallel: None) -> None:
    """Oracle: megatron-core's GPTModel with multi-latent attention (Transformer Engine spec,
    on a machine with an NVIDIA GPU), DeepSeek-V3 at toy size."""
    model = _scaled("deepseek-ai/DeepSeek-V3", kv_lora_rank=16, q_lora_rank=24, qk_head_dim=16,
                    qk_pos_emb_head_dim=8, v_head_dim=16)
    assert _megatron_count(model, use_te=True) == model.num_params(vocab=padded_vocab(model))
