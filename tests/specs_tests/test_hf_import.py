"""Hugging Face config.json import (autotune/specs/hf.py): what it reads, and what it refuses."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers_models import HF_CONFIGS
from helpers_models import hf_model
from helpers_models import hf_param_count
from helpers_models import published
from helpers_models import spec

from autotune.cli.app import _run
from autotune.cli.app import app
from autotune.exceptions import AutotuneError
from autotune.specs.inputs import load_model

pytest.importorskip("transformers")


def test_issue_findings_are_fixed() -> None:
    """Oracle: the published totals (Mixtral paper 46.7 B, DeepSeek-V2 paper 15.7 B, DeepSeek-V3
    report 671 B, Gemma-2 and Falcon model cards 9.24 B and 6.92 B) that the old import got
    wrong (7.24, 2.69, 38.6, 7.77, 8.52 B), and Mistral-NeMo's published head_dim of 128."""
    totals = {
        "mistralai/Mixtral-8x7B-v0.1": 46.7,
        "deepseek-ai/DeepSeek-V2-Lite": 15.7,
        "deepseek-ai/DeepSeek-V3": 671,
        "google/gemma-2-9b": 9.24,
        "tiiuae/falcon-7b": 6.92,
    }
    for repo, billions in totals.items():
        got = spec(published(repo)).num_params() / 1e9
        assert got == pytest.approx(billions, rel=0.001), repo
    nemo = spec(published("mistralai/Mistral-Nemo-Base-2407"))
    assert (nemo.head_dim, nemo.hidden_size // nemo.num_attention_heads) == (128, 160)


def test_sliding_window_matches_transformers_mask() -> None:
    """Oracle: transformers' sliding-window mask (masking_utils) counts the keys a query sees;
    Megatron's window (W, 0) lets a query see itself and W keys before it."""
    from transformers.masking_utils import causal_mask_function
    from transformers.masking_utils import sliding_window_overlay

    config = published("mistralai/Mistral-7B-v0.1")
    window = sliding_window_overlay(config["sliding_window"])
    query = 10_000
    seen = sum(causal_mask_function(0, 0, query, key) and window(0, 0, query, key)
               for key in range(query + 1))
    assert spec(config).window_size + 1 == seen


def test_gemma2_window_layers_match_megatron() -> None:
    """Oracle: transformers' Gemma2Config.layer_types (which layers slide) against megatron-core's
    is_layer_window_attention for the window and skip frequency we import."""
    from megatron.core.transformer.utils import is_layer_window_attention

    config = published("google/gemma-2-9b")
    layer_types = hf_model(config).config.layer_types
    model = spec(config)
    window = (model.window_size, 0)
    megatron = [is_layer_window_attention(window, model.window_attn_skip_freq, n + 1)
                for n in range(model.num_layers)]
    assert megatron == [kind == "sliding_attention" for kind in layer_types]


def test_moe_layers_match_transformers() -> None:
    """Oracle: which layers of transformers' DeepSeek-V3 model hold routed experts."""
    config = published("deepseek-ai/DeepSeek-V3")
    layers = hf_model(config).model.layers
    assert spec(config).moe_layer_pattern == tuple(hasattr(x.mlp, "experts") for x in layers)


def _llama(**changes: Any) -> dict[str, Any]:
    config = dict(published("meta-llama/Meta-Llama-3-8B"))
    config.update(changes)
    return {key: value for key, value in config.items() if value is not None}


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (_llama(vocab_size=None), "vocab_size: required"),
        ({**published("openai-community/gpt2"), "n_embd": "768"},
         "n_embd: expected an integer >= 1, got '768'"),
        (_llama(num_hidden_layers=True), "num_hidden_layers: expected an integer"),
        (_llama(tie_word_embeddings="false"), "tie_word_embeddings: expected true or false"),
        (_llama(model_type="t5"), "model_type: 't5' is not supported"),
        (_llama(rope_scaling={"rope_type": "dynamic", "factor": 2.0}),
         "rope_scaling.rope_type: 'dynamic' is not supported"),
        (_llama(attention_bias=True), "attention_bias: biases on attention but not on the MLP"),
        (_llama(hidden_act="gelu"), "hidden_act: 'gelu' is not supported for a gated MLP"),
        ({**published("Qwen/Qwen2.5-72B"), "use_sliding_window": True},
         "use_sliding_window: Qwen's sliding window"),
        ({**published("facebook/opt-1.3b"), "do_layer_norm_before": False},
         "do_layer_norm_before: false (post-norm layers"),
        ({**published("facebook/opt-1.3b"), "word_embed_proj_dim": 512},
         "word_embed_proj_dim: must equal hidden_size"),
        ({**published("google/gemma-2-9b"), "layer_types": ["full_attention"]
          + ["sliding_attention"] * 41}, "layer_types: only one full-attention layer every N"),
        ({**published("deepseek-ai/DeepSeek-V3"), "topk_method": "group_limited_greedy"},
         "topk_method: 'group_limited_greedy' is not supported"),
        ({**published("Qwen/Qwen3-30B-A3B"), "decoder_sparse_step": 2},
         "decoder_sparse_step: 2 is not supported"),
        ({**published("Qwen/Qwen3-8B"), "head_dim": None}, "head_dim: required"),
        ({**published("mistralai/Mixtral-8x7B-v0.1"), "num_key_value_heads": None},
         "num_key_value_heads: required"),
    ],
)
def test_unrepresentable_configs_name_the_key(config: dict[str, Any], message: str) -> None:
    """Oracle: the key at fault, named in one line (a string "768" for n_embd once became 14
    trillion parameters; a Llama config without vocab_size a KeyError)."""
    config = {key: value for key, value in config.items() if value is not None}
    with pytest.raises(AutotuneError, match=message.replace("(", r"\(").replace(".", r"\.")):
        spec(config)


def test_cli_exits_2_naming_the_key(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Oracle: the CLI's exit-code contract (2 for bad input) with the key in the message."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(_llama(vocab_size=None)))
    code = _run(app, ["space", "--model", str(path), "--cluster", "dgx-h100:1"])
    err = capsys.readouterr().err.replace("\n", " ")
    assert code == 2
    assert "vocab_size: required" in err and "Traceback" not in err


def test_load_model_reads_config_json(tmp_path: Path) -> None:
    """Oracle: transformers' Llama-3.1 model (meta device) for the count; the published
    rope_scaling for the fields."""
    path = tmp_path / "config.json"
    config = published("meta-llama/Llama-3.1-8B")
    path.write_text(json.dumps(config))
    model = load_model(str(path))
    assert model.rotary_base == config["rope_theta"] == 500000
    assert model.rope_scaling is not None
    assert (model.rope_scaling.type, model.rope_scaling.factor) == ("llama3", 8.0)
    assert model.num_params() == sum(p.numel() for p in hf_model(config).parameters())


def test_json_outputs_name_total_and_active_parameters(capsys: pytest.CaptureFixture[str]) -> None:
    """Oracle: transformers' Mixtral-8x7B (meta device) for the total; a hand count of what one
    token uses: 2 of 8 experts per layer, so total − 32 layers · 6 unused experts · 3 · 4096 ·
    14336 = 12,879,925,248 (Jiang et al. 2024: 12.9 B active)."""
    path = HF_CONFIGS / "mistralai--Mixtral-8x7B-v0.1.json"
    for command in (["estimate", "-l", "tp=8,pp=4"], ["space", "--top", "1"]):
        code = _run(app, [command[0], "-m", str(path), "-c", "dgx-h100:8", *command[1:], "--json"])
        assert code == 0, capsys.readouterr().err
        model = json.loads(capsys.readouterr().out)["model"]
        total = hf_param_count(published("mistralai/Mixtral-8x7B-v0.1"))
        assert model["params"] == total
        assert model["active_params"] == total - 32 * 6 * 3 * 4096 * 14336 == 12_879_925_248
