"""Inputs (presets, YAML, Hugging Face configs) and the layout text form."""

from __future__ import annotations

import json

import pytest

from autotune.exceptions import AutotuneError
from autotune.frameworks import get_framework
from autotune.layout import Layout
from autotune.specs.inputs import load_cluster
from autotune.specs.inputs import load_config
from autotune.specs.inputs import load_model
from autotune.specs.inputs import model_presets

RELEASED_PARAMS = {
    "llama2-7b": 6_738_415_616,
    "llama2-13b": 13_015_864_320,
    "llama2-70b": 68_976_648_192,
    "llama3-8b": 8_030_261_248,
    "llama3-70b": 70_553_706_496,
    "llama3-405b": 405_853_388_800,
}
"""Parameters of Meta's released checkpoints (the safetensors totals of the Hugging Face repos
meta-llama/Llama-2-*-hf and meta-llama/Meta-Llama-3(.1)-*)."""
GPT3_PARAMS_B = {"gpt3-1.3b": 1.3, "gpt3-6.7b": 6.7, "gpt3-13b": 13.0, "gpt3-175b": 175.0}
"""GPT-3 paper (Brown et al. 2020, Table 2.1): nominal sizes, rounded by the authors."""


@pytest.mark.parametrize("name", RELEASED_PARAMS)
def test_llama_presets_have_the_released_parameter_count(name: str) -> None:
    """Oracle: the parameter count of Meta's released checkpoint, exactly."""
    assert name in model_presets()
    assert load_model(name).num_params() == RELEASED_PARAMS[name]


@pytest.mark.parametrize("name", GPT3_PARAMS_B)
def test_gpt3_presets_have_the_paper_sizes(name: str) -> None:
    """Oracle: the GPT-3 paper's Table 2.1 (its shapes give 1.32, 6.66, 12.85 and 174.6 B, within
    2 % of the rounded sizes it prints)."""
    assert load_model(name).num_params() / 1e9 == pytest.approx(GPT3_PARAMS_B[name], rel=0.02)


@pytest.mark.parametrize(
    ("ref", "gpus", "memory"),
    [("dgx-a100:4", 32, 80), ("dgx-h100:2", 16, 80), ("hgx-h200:1", 8, 141)],
)
def test_cluster_presets(ref: str, gpus: int, memory: float) -> None:
    """Oracle: NVIDIA's published specifications: 8 GPUs per DGX/HGX node, 80 GB on A100 and
    H100 SXM, 141 GB on H200."""
    cluster = load_cluster(ref)
    assert cluster.world_size == gpus and cluster.gpu.memory_gb == memory


def test_local_cluster_without_gpu_uses_cpu_processes() -> None:
    """Oracle: the documented contract of `--cluster local` on a machine without a GPU."""
    cluster = load_cluster("local", processes=2)
    assert cluster.cpu_processes and cluster.gpus_per_node == 2


def test_huggingface_llama_config(tmp_path) -> None:
    """Oracle: meta-llama/Meta-Llama-3-8B's published config.json reads as the llama3-8b
    preset."""
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


def test_yaml_model_and_cluster(tmp_path) -> None:
    """Oracle: values worked out by hand: ffn defaults to 4·hidden (2048), 2 nodes of 4 GPUs."""
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
    """Oracle: the documented error contract: one AutotuneError naming the field."""
    path = tmp_path / "m.yaml"
    path.write_text(text)
    with pytest.raises(AutotuneError, match=field):
        load_model(str(path))


def test_bad_cluster_and_precision() -> None:
    """Oracle: the documented error contract, and NVIDIA's A100 specification (no FP8 tensor
    cores, so no fp8 training)."""
    with pytest.raises(AutotuneError, match="dgx-z100.*presets"):
        load_cluster("dgx-z100:2")
    with pytest.raises(AutotuneError, match="two.*integer"):
        load_cluster("dgx-a100:two")
    with pytest.raises(AutotuneError, match="a100-sxm-80gb has no fp8 support"):
        load_config("llama2-7b", "dgx-a100:1", precision="fp8")


def test_layout_text_roundtrip_and_derivation() -> None:
    """Oracle: values worked out by hand: 128 GPUs / (tp 8 · pp 4) = dp 4, 1024 / (4 · mbs 1) =
    256 micro-batches; sp defaults on with tp > 1 for Megatron, off for DeepSpeed (no Megatron
    sequence parallelism there)."""
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
    """Oracle: the documented error contract of --layout on 8 GPUs and a batch of 64."""
    with pytest.raises(AutotuneError, match=message):
        Layout.parse(text, 8, 64, get_framework("megatron"))
