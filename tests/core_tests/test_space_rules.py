"""Rules and enumeration: each rule on cases worked out by hand, the space's size and order."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from autotune.constants import Constants
from autotune.exceptions import AutotuneError
from autotune.frameworks import framework_of
from autotune.frameworks.megatron_args import uneven_edge_layers
from autotune.inputs import load_config
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.rules import RULES
from autotune.rules import violations
from autotune.space import enumerate_layouts
from autotune.space import load_space

K = Constants()


def _broken(cfg, text: str) -> list[str]:
    layout = Layout.parse(text, cfg.world_size, cfg.train.global_batch_size, framework_of(cfg))
    return [name for name, _ in violations(cfg, layout, K)]


def test_every_rule_has_a_reason() -> None:
    """Oracle: the documented contract of a rule: a one-line reason to show the user."""
    for rule in RULES.values():
        assert rule.reason and "\n" not in rule.reason


@pytest.mark.parametrize(
    ("preset", "cluster", "framework", "text", "rule"),
    [
        ("gpt3-13b", "dgx-a100:2", "megatron", "tp=16", "tp_within_node"),
        ("gpt3-13b", "dgx-a100:4", "megatron", "tp=8,pp=4,vpp=3", "layers_divisible_by_pp_vpp"),
        ("llama2-7b", "dgx-a100:1", "megatron", "vpp=2", "vpp_needs_pp"),
        ("llama2-7b", "dgx-a100:1", "megatron", "tp=1,sp=on", "sp_needs_tp"),
        ("llama2-7b", "dgx-a100:1", "megatron", "zero=0,offload=optimizer", "offload_needs_zero"),
        (
            "llama2-7b",
            "dgx-a100:1",
            "megatron",
            "zero=2,offload=optimizer",
            "offload_needs_distributed_optimizer",
        ),
        (
            "llama2-7b",
            "dgx-a100:1",
            "megatron",
            "zero=3,offload=optimizer+params",
            "megatron_no_param_offload",
        ),
        ("llama2-7b", "dgx-a100:1", "megatron", "pp=2,zero=3", "megatron_fsdp_without_pp"),
        ("llama2-7b", "dgx-a100:1", "deepspeed", "pp=2,zero=2", "zero_ge2_with_pp"),
        (
            "llama2-7b",
            "dgx-a100:1",
            "deepspeed",
            "zero=2,offload=optimizer+params",
            "param_offload_needs_zero3",
        ),
        ("llama2-70b", "dgx-a100:2", "deepspeed", "tp=2,cp=8", "ulysses_heads_divisible_by_cp"),
        ("llama2-7b", "dgx-a100:1", "deepspeed", "pp=2,vpp=2", "deepspeed_no_virtual_pipeline"),
        ("llama2-7b", "dgx-a100:1", "deepspeed", "tp=2,sp=on", "deepspeed_no_megatron_sp"),
        ("gpt3-175b", "dgx-a100:1", "megatron", "tp=8,zero=0", "memory_fits"),
    ],
)
def test_rule_catches_its_case(preset, cluster, framework, text, rule) -> None:
    """Oracle: each case worked out by hand against the limit the rule's reason cites
    (Megatron-LM's arguments.py, megatron-core, DeepSpeed, a GPU's memory)."""
    cfg = load_config(preset, cluster, framework=framework)
    assert rule in _broken(cfg, text)


def test_heads_and_groups_divisibility() -> None:
    """Oracle: megatron-core's TransformerConfig, which accepts 4 query groups on tp=8 (tp % g ==
    0 replicates each group); DeepSpeed's AutoTP shards whole key/value heads, so it needs
    g % tp == 0."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.transformer.transformer_config import TransformerConfig

        TransformerConfig(num_layers=4, hidden_size=256, num_attention_heads=8,
                          num_query_groups=4, tensor_model_parallel_size=8)
    cfg = load_config("tiny-gpt", "dgx-a100:2", global_batch_size=16)  # 8 heads, 4 groups
    assert "query_groups_divisible_by_tp" not in _broken(cfg, "tp=8")
    ds = load_config("tiny-gpt", "dgx-a100:2", global_batch_size=16, framework="deepspeed")
    assert "query_groups_divisible_by_tp" in _broken(ds, "tp=8")


def test_llama3_405b_uneven_pipeline_is_legal() -> None:
    """Oracle: the Llama 3 paper (Dubey et al. 2024, section 3.3.2: one layer fewer on the first
    and last stage): 126 layers on pp=16 as 7 + 14·8 + 7, worked out by hand; no split over
    16·2 virtual chunks exists."""
    assert uneven_edge_layers(126, 16) == 7
    cfg = load_config("llama3-405b", "dgx-h100:2048")
    assert "layers_divisible_by_pp_vpp" not in _broken(cfg, "tp=8,pp=16,cp=1,zero=1")
    assert "layers_divisible_by_pp_vpp" in _broken(cfg, "tp=8,pp=16,vpp=2,cp=1,zero=1")


def test_batch_and_sequence_rules_on_raw_layouts() -> None:
    """Oracle: values worked out by hand: a batch of 512 is not a multiple of mbs 3 · dp 1;
    a sequence of 1000 is not a multiple of 2·cp = 16 (Megatron's context parallelism splits it
    into 2·cp chunks)."""
    cfg = load_config("llama3-8b", "dgx-h100:2", seq_length=1000)
    raw = Layout(tp=8, pp=2, dp=1, mbs=3, gas=1)
    assert "gbs_divisible_by_mbs_dp" in [n for n, _ in violations(cfg, raw, K)]
    cp = Layout(tp=1, cp=8, dp=2, mbs=1, gas=256)
    assert "seq_divisible_by_2cp" in [n for n, _ in violations(cfg, cp, K)]


def test_interleaving_needs_microbatches_divisible_by_pp() -> None:
    """Oracle: Megatron-LM's interleaved schedule needs micro-batches % pp == 0; worked out by
    hand below."""
    cfg = load_config("gpt3-175b", "dgx-a100:64", global_batch_size=96)
    # dp = 512 / 64 = 8, m = 96 / 8 = 12: not a multiple of pp = 8
    assert "interleave_microbatches_divisible_by_pp" in _broken(cfg, "tp=8,pp=8,vpp=2,zero=1")
    assert "interleave_microbatches_divisible_by_pp" not in _broken(cfg, "tp=8,pp=8,zero=1")


def test_good_layout_has_no_violation() -> None:
    """Oracle: worked out by hand: 64 GPUs / (tp 8 · pp 4) = dp 2; 80 layers = 4 stages · 5
    chunks · 4 layers; 64 heads and 8 query groups divide by tp 8."""
    cfg = load_config("llama3-70b", "dgx-h100:8")
    assert _broken(cfg, "tp=8,pp=4,vpp=5,zero=1,mbs=1,recompute=selective") == []


def test_enumeration_counts_add_up_and_rank() -> None:
    """Oracle: the space's size worked out by hand from search_spaces/megatron.yaml, every
    candidate either kept or charged to one rule, and the documented order (fastest first)."""
    cfg = load_config("gpt3-175b", "dgx-a100:128")
    result = enumerate_layouts(cfg, load_space(None, "megatron"), K)
    # 4 tp · 6 pp · 4 cp · 5 vpp · 4 zero · 2 offload · 4 mbs · 3 recompute · 2 sp
    assert result.total == 4 * 6 * 4 * 5 * 4 * 2 * 4 * 3 * 2
    assert result.total - sum(result.removed.values()) == len(result) > 0
    speeds = result.values["tokens_per_s"]
    assert np.all(np.diff(speeds) <= 0)


def test_space_validation_names_the_field(tmp_path) -> None:
    """Oracle: the documented error contract: a bad space file names the dimension."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("dims:\n  tp: [1, 0]\n")
    with pytest.raises(AutotuneError, match="tp"):
        load_space(str(bad), "megatron")
    bad.write_text("dims:\n  recompute: [sometimes]\n")
    with pytest.raises(AutotuneError, match="recompute"):
        load_space(str(bad), "megatron")
    with pytest.raises(AutotuneError, match="bundled"):
        load_space("no-such-space", "megatron")


LAYOUTS = st.builds(
    Layout, tp=st.sampled_from([1, 2, 4, 8]), pp=st.sampled_from([1, 2, 4, 16]),
    dp=st.integers(1, 4096), cp=st.sampled_from([1, 2, 8]), vpp=st.sampled_from([1, 2, 3]),
    zero=st.integers(0, 3), offload=st.sampled_from(["none", "optimizer", "optimizer+params"]),
    mbs=st.sampled_from([1, 2, 8]), gas=st.integers(1, 1024),
    recompute=st.sampled_from(["none", "selective", "full"]), sp=st.booleans())


@given(st.lists(LAYOUTS, min_size=1, max_size=5))
def test_table_holds_any_layout(layouts: list[Layout]) -> None:
    """Property: a LayoutTable gives back exactly the layouts it was built from."""
    assert LayoutTable.from_layouts(layouts).rows() == layouts
