"""Megatron-LM flags and megatron-core kwargs for a ModelSpec (frameworks/megatron/model.py)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from helpers_models import PUBLISHED
from helpers_models import hf_model
from helpers_models import published
from helpers_models import spec

from autotune.exceptions import AutotuneError
from autotune.frameworks.megatron.model import gpt_model_kwargs
from autotune.frameworks.megatron.model import model_args
from autotune.frameworks.megatron.model import transformer_config_class
from autotune.frameworks.megatron.model import transformer_config_kwargs
from autotune.specs import ModelSpec
from autotune.specs.inputs import load_model
from autotune.specs.inputs import model_presets

FLAGS_FILE = Path(__file__).resolve().parents[1] / "render_tests" / "megatron_lm_flags.txt"
MEGATRON_FLAGS = {line.strip() for line in FLAGS_FILE.read_text().splitlines()
                  if line.startswith("--")}
# published models pretrain_gpt.py cannot build, and the feature the refusal names
REFUSED = {
    "EleutherAI/pythia-1b": "layer_block parallel",
    "bigscience/bloom-560m": "position_embedding alibi",
    "facebook/opt-1.3b": "learned_position_offset",
    "google/gemma-2-9b": "layer_block sandwich",
    "google/gemma-7b": "scale_embeddings",
    "openai-community/gpt2": "activation gelu_tanh",
    "tiiuae/falcon-7b": "layer_block parallel_shared_norm",
}
EXPORTABLE = [repo for repo in PUBLISHED if repo not in REFUSED]


def _models() -> list[ModelSpec]:
    return [spec(published(repo)) for repo in EXPORTABLE] + [
        load_model(name) for name in model_presets()]


def _flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_every_flag_is_a_megatron_lm_flag() -> None:
    """Oracle: the long options of pretrain_gpt.py's parser (megatron/training/arguments.py at
    NVIDIA/Megatron-LM d98e8a64, tests/render_tests/megatron_lm_flags.txt)."""
    for model in _models():
        seq = min(model.max_position_embeddings, 4096)
        used = {arg for arg in model_args(model, seq) if arg.startswith("--")}
        assert used <= MEGATRON_FLAGS, (model.name, used - MEGATRON_FLAGS)


def test_llama31_flags_carry_the_published_values() -> None:
    """Oracle: meta-llama/Llama-3.1-8B's config.json (Megatron's defaults differ: rotary base
    10000, dropout 0.1, no rope scaling)."""
    config = published("meta-llama/Llama-3.1-8B")
    args = model_args(spec(config), 8192)
    assert _flag(args, "--rotary-base") == "500000"
    assert _flag(args, "--rope-scaling-factor") == "8" and "--use-rope-scaling" in args
    assert float(_flag(args, "--norm-epsilon")) == config["rms_norm_eps"]
    assert float(_flag(args, "--hidden-dropout")) == float(_flag(args, "--attention-dropout")) == 0
    assert _flag(args, "--num-query-groups") == str(config["num_key_value_heads"])
    assert "--untie-embeddings-and-output-weights" in args and "--swiglu" in args


def test_mistral_nemo_sets_kv_channels() -> None:
    """Oracle: Mistral-Nemo-Base-2407's config.json head_dim (128, not 5120 / 32 = 160)."""
    args = model_args(spec(published("mistralai/Mistral-Nemo-Base-2407")), 4096)
    assert _flag(args, "--kv-channels") == "128"


def test_deepseek_v3_flags() -> None:
    """Oracle: deepseek-ai/DeepSeek-V3's config.json; the --moe-layer-freq pattern evaluated as
    Megatron-LM's moe_freq_type does (its _eval_pattern: those characters only, then eval)
    against the layers of transformers' model that hold routed experts."""
    config = published("deepseek-ai/DeepSeek-V3")
    args = model_args(spec(config), 4096)
    expected = {"--q-lora-rank": "1536", "--kv-lora-rank": "512", "--qk-head-dim": "128",
                "--qk-pos-emb-head-dim": "64", "--v-head-dim": "128", "--num-experts": "256",
                "--moe-router-topk": "8", "--moe-ffn-hidden-size": "2048",
                "--moe-shared-expert-intermediate-size": "2048",
                "--moe-router-score-function": "sigmoid", "--moe-router-num-groups": "8",
                "--moe-router-group-topk": "4", "--moe-router-topk-scaling-factor": "2.5",
                "--rope-type": "yarn", "--rotary-scaling-factor": "40"}
    assert {flag: _flag(args, flag) for flag in expected} == expected
    assert "--multi-latent-attention" in args and "--moe-router-enable-expert-bias" in args
    pattern = _flag(args, "--moe-layer-freq")
    assert not re.search(r"[^,\d\[\]\(\)\+\*]", pattern)
    experts = [int(hasattr(layer.mlp, "experts")) for layer in hf_model(config).model.layers]
    assert eval(pattern) == experts  # noqa: S307 - what Megatron-LM does with the flag


@pytest.mark.parametrize("repo", sorted(REFUSED))
def test_unbuildable_models_are_refused_by_name(repo: str) -> None:
    """Oracle: what pretrain_gpt.py can express (arguments.py at d98e8a64: no ALiBi, no parallel
    or sandwich blocks, no GELU-tanh/ReLU/GeGLU flag, no embedding scaling or offset)."""
    with pytest.raises(AutotuneError, match=re.escape(REFUSED[repo])):
        model_args(spec(published(repo)), 1024)


def test_sequence_beyond_learned_positions_is_refused() -> None:
    """Oracle: a learned position table of 2048 rows cannot serve 4096 tokens unchanged."""
    with pytest.raises(AutotuneError, match="seq_length 4096 exceeds its 2048 learned positions"):
        model_args(load_model("gpt3-1.3b"), 4096)


@pytest.mark.parametrize("model", _models(), ids=lambda model: model.name)
def test_megatron_core_accepts_the_kwargs(model: ModelSpec) -> None:
    """Oracle: megatron-core's TransformerConfig / MLATransformerConfig validation
    (__post_init__), which rejects inconsistent MoE, MLA and attention settings."""
    config = transformer_config_class(model)(**transformer_config_kwargs(model))
    assert (config.num_layers, config.hidden_size) == (model.num_layers, model.hidden_size)
    assert config.num_moe_experts == model.num_experts


CPU_RUN_FLAGS = [  # what a run needs besides the model; fusions off so no kernel is asked for
    "--micro-batch-size", "1", "--global-batch-size", "8", "--train-iters", "10", "--lr", "1e-4",
    "--mock-data", "--tokenizer-type", "NullTokenizer", "--bf16", "--transformer-impl", "local",
    "--no-rope-fusion", "--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion",
    "--no-bias-swiglu-fusion", "--no-bias-dropout-fusion", "--no-bias-gelu-fusion",
    "--no-persist-layer-norm",
]


def test_megatron_lm_reads_the_flags_as_our_kwargs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Oracle: Megatron-LM's own parse_args, validate_args and gpt_config_from_args (what
    pretrain_gpt.py runs) turn model_args into a GPTModelConfig and TransformerConfig whose
    architecture fields equal gpt_model_kwargs and transformer_config_kwargs. Needs Megatron-LM's
    training package (the megatron-core wheel has no megatron.training)."""
    arguments = pytest.importorskip(
        "megatron.training.arguments", reason="Megatron-LM's megatron.training is not installed")
    from megatron.training.argument_utils import gpt_config_from_args

    # --moe-grouped-gemm asks for the GPU generation (arguments.py); the model does not change
    monkeypatch.setattr("torch.cuda.get_device_capability", lambda *args: (9, 0))
    for name, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(name, value)
    for model in _models():
        flags = model_args(model, min(model.max_position_embeddings, 4096))
        monkeypatch.setattr(sys, "argv", ["pretrain_gpt.py", *flags, *CPU_RUN_FLAGS,
                                          "--vocab-size", str(model.vocab_size)])
        args = arguments.parse_args()
        arguments.validate_args(args)
        gpt = gpt_config_from_args(args)
        ours = gpt_model_kwargs(model, min(model.max_position_embeddings, 4096))
        ours["seq_length"] = ours.pop("max_sequence_length")
        del ours["vocab_size"]  # Megatron-LM pads it
        assert {field: getattr(gpt, field) for field in ours} == ours, model.name
        config = gpt.transformer
        for field, value in transformer_config_kwargs(model).items():
            got = getattr(config, field)
            if field == "window_size":
                got = tuple(got)
            if field == "activation_func":
                got, value = got.__name__, value.__name__
            assert got == value, (model.name, field)


def test_rope_scaling_factor_other_than_8_is_refused() -> None:
    """Oracle: Megatron-LM d98e8a64's gpt_config_from_args (argument_utils.py), which passes
    --use-rope-scaling to the model but not --rope-scaling-factor (GPTModelConfig keeps 8);
    megatron-core's GPTModel itself takes the factor (Llama 3.2 uses 32)."""
    config = dict(published("meta-llama/Llama-3.1-8B"))
    config["rope_scaling"] = {**config["rope_scaling"], "factor": 32.0}
    model = spec(config)
    with pytest.raises(AutotuneError, match=r"rope_scaling\.factor 32\.0 \(Megatron fixes 8\.0"):
        model_args(model, 8192)
    assert gpt_model_kwargs(model, 8192)["rope_scaling_factor"] == 32.0
