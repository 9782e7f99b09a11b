"""Rules and enumeration: each rule on cases worked out by hand, the space's size and order."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from autotune.costmodel.constants import Constants
from autotune.exceptions import AutotuneError
from autotune.frameworks import framework_of
from autotune.frameworks.megatron.args import edge_layers
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.search.sampler import distributions
from autotune.space.rules import RULES
from autotune.space.rules import violations
from autotune.space.search_space import SearchSpace
from autotune.space.search_space import candidates
from autotune.space.search_space import enumerate_layouts
from autotune.space.search_space import load_space
from autotune.space.search_space import narrowed
from autotune.specs.inputs import load_config

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
        ("gpt3-13b", "dgx-a100:4", "megatron", "tp=8,pp=4,vpp=11", "layers_divisible_by_pp_vpp"),
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
    and last stage): 126 layers on pp=16 as 7 + 14·8 + 7, worked out by hand; with the embedding
    and the loss counted as layers (Megatron's --account-for-*-in-pipeline-split) 128 = 16·8 also
    interleaves by 2, 4 or 8 (Megatron-Bridge's 405B recipe: pp 8, vpp 2); 16·3 = 48 chunks take
    2 or 3 layers each in a custom layout; 16·9 = 144 chunks cannot each hold one of 126 layers,
    127 and 128 are no multiples of 144, and explicit stages of multiples of 9 layers need
    at least 144."""
    assert edge_layers(126, 16) == (7, 7)
    cfg = load_config("llama3-405b", "dgx-h100:2048")
    for text in ("tp=8,pp=16,cp=1,zero=1", "tp=8,pp=16,vpp=2,cp=1,zero=1",
                 "tp=8,pp=8,vpp=2,cp=4,zero=1", "tp=8,pp=16,vpp=3,cp=1,zero=1"):
        assert "layers_divisible_by_pp_vpp" not in _broken(cfg, text)
    assert "layers_divisible_by_pp_vpp" in _broken(cfg, "tp=8,pp=16,vpp=9,cp=1,zero=1")


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
    # a dense model has ep = etp = 1 only: the resolved space's product
    assert result.total == load_space(None, "megatron").resolved(cfg).size
    assert result.total - sum(result.removed.values()) == len(result) > 0
    speeds = result.estimates.tokens_per_s
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


def test_table_roundtrip() -> None:
    layouts = [
        Layout(tp=2, pp=2, dp=2, zero=1, offload="optimizer", recompute="full", sp=True),
        Layout(mbs=4, gas=2),
    ]
    table = LayoutTable.from_layouts(layouts)
    assert table.rows() == layouts


def test_auto_expert_candidates_follow_the_expert_grid() -> None:
    """Worked by hand for Mixtral's 8 experts on 8 GPUs with tp=2: etp is 1 or tp, and ep
    takes the divisors of 8 that divide the expert data-parallel grid 8 / (pp·etp)."""
    cfg = load_config("mixtral-8x7b", "dgx-h100:1")
    space = SearchSpace(tp=[2], pp=[1, 2], cp=[1], vpp=[1], zero=[1], offload=["none"], mbs=[1],
                        recompute=["none"], sp=[True])
    table = candidates(cfg, space)
    combos = sorted(zip(table.pp.tolist(), table.etp.tolist(), table.ep.tolist(), strict=True))
    assert combos == sorted(
        [(1, 1, ep) for ep in (1, 2, 4, 8)] + [(1, 2, ep) for ep in (1, 2, 4)]
        + [(2, 1, ep) for ep in (1, 2, 4)] + [(2, 2, ep) for ep in (1, 2)])
    resolved = space.resolved(cfg)
    assert (resolved.ep, resolved.etp) == ([1, 2, 4, 8], [1, 2])
    # listed values multiply every row; the rules then judge them
    listed = candidates(cfg, space.model_copy(update={"ep": [1, 3], "etp": [1]}))
    assert sorted(set(listed.ep.tolist())) == [1, 3] and len(listed) == 2 * 2
    result = enumerate_layouts(cfg, space.model_copy(update={"ep": [1, 3], "etp": [1]}), K)
    assert result.removed["experts_divisible_by_ep"] == 2


def test_dense_models_get_no_expert_candidates() -> None:
    cfg = load_config("llama3-8b", "dgx-h100:1")
    table = candidates(cfg, load_space(None, "megatron"))
    assert set(table.ep.tolist()) == {1} and set(table.etp.tolist()) == {1}


def test_optuna_needs_a_resolved_space() -> None:
    with pytest.raises(AutotuneError, match="ep, etp still 'auto'"):
        distributions(SearchSpace())
    cfg = load_config("mixtral-8x7b", "dgx-h100:1")
    assert distributions(SearchSpace().resolved(cfg))["ep"].choices == (1, 2, 4, 8)


@pytest.mark.parametrize(
    ("model", "cluster", "seq", "dims"),
    [
        ("gpt3-175b", "dgx-a100:48", 2048, {"pp": 12, "tp": 8}),  # SC21 Table 2: tp8 pp12
        ("gpt3-175b", "dgx-a100:72", 2048, {"pp": 9}),
        ("llama3-405b", "dgx-h100:2048", 131072, {"cp": 16, "pp": 16, "vpp": 8}),  # Llama 3
        ("llama3-405b", "dgx-h100:32", 131072, {"cp": 32, "pp": 8, "vpp": 2}),  # Bridge recipe
    ],
)
def test_default_space_expresses_published_recipes(model, cluster, seq, dims) -> None:
    """Oracle: layouts experts ran (Narayanan et al. 2021 Table 2: GPT-3 175B as tp 8 × pp 12
    on 384 GPUs; Llama 3 Table 4: 405B at 128K tokens with cp 16 on pp 16; Megatron-Bridge's
    405B recipe: pp 8, vpp 2 with the embedding and loss counted as layers). The default space
    derives its candidates from the model and the cluster, so each published value is one."""
    cfg = load_config(model, cluster, seq_length=seq)
    space = narrowed(cfg, load_space(None, "megatron"))
    for dim, value in dims.items():
        assert value in getattr(space, dim), (dim, getattr(space, dim))
    assert max(space.cp) <= max(1, seq // 4096)


def test_a_space_file_may_derive_only_the_parallel_degrees(tmp_path) -> None:
    """Oracle: the space file format (autotune/space/search_space.py): `derived` stands for tp,
    pp, cp or vpp
    only; anything else is a clear one-line error naming the dimension."""
    bad = tmp_path / "bad.yaml"
    bad.write_text("dims:\n  mbs: derived\n")
    with pytest.raises(AutotuneError, match="mbs cannot be 'derived'"):
        load_space(str(bad), "megatron")


def test_a_space_made_for_another_framework_is_refused() -> None:
    """Oracle: the bundled files' own `framework:` keys (megatron.yaml says megatron)."""
    with pytest.raises(AutotuneError, match="a space for 'megatron', not 'deepspeed'"):
        load_space("megatron", "deepspeed")
    assert load_space("deepspeed", "deepspeed").name == "deepspeed"
