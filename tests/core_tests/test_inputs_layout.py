"""Inputs (presets, YAML, Hugging Face configs) and the layout text form."""

from __future__ import annotations

import json

import pytest

from autotune.exceptions import AutotuneError
from autotune.frameworks import get_framework
from autotune.inputs import load_cluster
from autotune.inputs import load_config
from autotune.inputs import load_model
from autotune.inputs import model_presets
from autotune.layout import Layout

REQUIRED = [
    "gpt3-1.3b",
    "gpt3-6.7b",
    "gpt3-13b",
    "gpt3-175b",
    "llama2-7b",
    "llama2-13b",
    "llama2-70b",
    "llama3-8b",
    "llama3-70b",
    "llama3-405b",
]
PUBLISHED_PARAMS_B = {
    "gpt3-1.3b": 1.3,
    "gpt3-6.7b": 6.7,
    "gpt3-13b": 13,
    "gpt3-175b": 175,
    "llama2-7b": 6.7,
    "llama2-13b": 13.0,
    "llama2-70b": 69,
    "llama3-8b": 8.0,
    "llama3-70b": 70.6,
    "llama3-405b": 405,
}


@pytest.mark.parametrize("name", REQUIRED)
def test_presets_have_published_sizes(name: str) -> None:
    assert name in model_presets()
    model = load_model(name)
    assert model.num_params() / 1e9 == pytest.approx(PUBLISHED_PARAMS_B[name], rel=0.05)


@pytest.mark.parametrize(
    ("ref", "gpus", "memory"),
    [("dgx-a100:4", 32, 80), ("dgx-h100:2", 16, 80), ("hgx-h200:1", 8, 141)],
)
def test_cluster_presets(ref: str, gpus: int, memory: float) -> None:
    cluster = load_cluster(ref)
    assert cluster.world_size == gpus and cluster.gpu.memory_gb == memory


def test_local_cluster_without_gpu_uses_cpu_processes() -> None:
    cluster = load_cluster("local", processes=2)
    assert cluster.cpu_processes and cluster.gpus_per_node == 2


def test_huggingface_llama_config(tmp_path) -> None:
    path = tmp_path / "config.json"
    path.write_text(
        json.dumps(
            {
                "architectures": ["LlamaForCausalLM"],
                "model_type": "llama",
                "hidden_size": 4096,
                "intermediate_size": 14336,
                "num_attention_heads": 32,
                "num_hidden_layers": 32,
                "num_key_value_heads": 8,
                "vocab_size": 128256,
                "max_position_embeddings": 8192,
                "hidden_act": "silu",
                "tie_word_embeddings": False,
                "rope_theta": 500000.0,
                "rms_norm_eps": 1e-05,
            }
        )
    )
    model = load_model(str(path))
    assert model == load_model("llama3-8b").model_copy(update={"name": model.name})


@pytest.mark.parametrize(
    "config",
    [
        {
            "model_type": "gpt2",
            "n_layer": 12,
            "n_embd": 768,
            "n_head": 12,
            "vocab_size": 50257,
            "n_positions": 1024,
        },
        {
            "model_type": "gpt_neox",
            "num_hidden_layers": 6,
            "hidden_size": 512,
            "num_attention_heads": 8,
            "intermediate_size": 2048,
            "vocab_size": 50304,
            "hidden_act": "gelu",
            "tie_word_embeddings": False,
        },
        {
            "model_type": "qwen2",
            "num_hidden_layers": 24,
            "hidden_size": 896,
            "num_attention_heads": 14,
            "num_key_value_heads": 2,
            "intermediate_size": 4864,
            "vocab_size": 151936,
            "hidden_act": "silu",
            "tie_word_embeddings": True,
        },
        {
            "model_type": "mistral",
            "num_hidden_layers": 32,
            "hidden_size": 4096,
            "num_attention_heads": 32,
            "num_key_value_heads": 8,
            "intermediate_size": 14336,
            "vocab_size": 32000,
            "hidden_act": "silu",
        },
    ],
)
def test_huggingface_families(tmp_path, config) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    model = load_model(str(path))
    assert model.num_layers > 0 and model.vocab_size == config["vocab_size"]
    assert model.gated == (config.get("hidden_act") == "silu")


def test_yaml_model_and_cluster(tmp_path) -> None:
    model = tmp_path / "m.yaml"
    model.write_text("num_layers: 4\nhidden_size: 512\nnum_attention_heads: 8\nvocab_size: 1000\n")
    assert load_model(str(model)).ffn == 2048
    cluster = tmp_path / "c.yaml"
    cluster.write_text(
        "nodes: 2\ngpus_per_node: 4\ngpu: {memory_gb: 48, peak_tflops: {bf16: 362}, "
        "hbm_tb_s: 0.86}\nintra_node_gb_s: 32\ninter_node_gb_s: 12.5\n"
        "host_memory_gb: 512\npcie_gb_s: 32\n"
    )
    assert load_cluster(str(cluster)).world_size == 8


@pytest.mark.parametrize(
    ("text", "field"),
    [
        (
            "num_layers: 4\nhidden_size: 500\nnum_attention_heads: 8\nvocab_size: 10\n",
            "hidden_size",
        ),
        (
            "num_layers: -1\nhidden_size: 512\nnum_attention_heads: 8\nvocab_size: 10\n",
            "num_layers",
        ),
        (
            "num_layers: 4\nhidden_size: 512\nnum_attention_heads: 8\nvocab_size: 10\nbogus: 1\n",
            "bogus",
        ),
        ("num_layers: [4\n", "not valid"),
    ],
)
def test_bad_model_yaml_names_the_field(tmp_path, text: str, field: str) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(text)
    with pytest.raises(AutotuneError, match=field):
        load_model(str(path))


def test_bad_cluster_and_precision() -> None:
    with pytest.raises(AutotuneError, match="presets"):
        load_cluster("dgx-z100:2")
    with pytest.raises(AutotuneError, match="integer"):
        load_cluster("dgx-a100:two")
    with pytest.raises(AutotuneError, match="fp8"):
        load_config("llama2-7b", "dgx-a100:1", precision="fp8")


def test_layout_text_roundtrip_and_derivation() -> None:
    layout = Layout.parse(
        "tp=8,pp=4,cp=1,vpp=1,zero=1,offload=none,mbs=1,recompute=selective", 128, 1024,
            get_framework("megatron")
    )
    assert (layout.dp, layout.gas, layout.sp) == (4, 256, True)
    assert Layout.parse(layout.text, 128, 1024, get_framework("megatron")) == layout
    assert Layout.parse("tp=2", 8, 64, get_framework("deepspeed")).sp is False


def test_expert_degrees_in_text_and_id() -> None:
    """Worked by hand: ep and etp default to 1 and appear in the text and id only when experts
    are split, so a dense layout keeps the name it had before experts existed."""
    megatron = get_framework("megatron")
    dense = Layout.parse("tp=8,pp=4,zero=1,recompute=selective", 128, 1024, megatron)
    assert (dense.ep, dense.etp) == (1, 1)
    assert dense.id == "tp8-pp4-dp4-cp1-v1-z1-mb1-rs-sp"
    assert dense.text == ("tp=8,pp=4,cp=1,vpp=1,zero=1,offload=none,mbs=1,recompute=selective,"
                          "sp=on")
    moe = Layout.parse("tp=2,pp=2,ep=8,etp=1", 64, 1024, megatron)
    assert (moe.dp, moe.ep, moe.etp) == (16, 8, 1)
    assert moe.id == "tp2-pp2-dp16-cp1-v1-z1-mb1-rn-sp-ep8-etp1"
    assert moe.text.endswith(",sp=on,ep=8,etp=1")
    assert Layout.parse(moe.text, 64, 1024, megatron) == moe


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("tp=3", "does not divide"),
        ("mbs=5", "not divisible"),
        ("tp=two", "integer"),
        ("recompute=some", "one of"),
        ("foo=1", "key=value"),
        ("dp=3", "derived"),
        ("ep=0", "ep=0 must be positive"),
        ("etp=x", "etp='x' must be an integer"),
    ],
)
def test_layout_errors(text: str, message: str) -> None:
    with pytest.raises(AutotuneError, match=message):
        Layout.parse(text, 8, 64, get_framework("megatron"))
