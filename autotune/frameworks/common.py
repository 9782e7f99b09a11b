"""Rules every framework shares: the grid, the batch, tensor-parallel shapes, pipeline splits,
and the expert grid of Mixture-of-Experts models.

Sources: Megatron-LM `megatron/training/arguments.py` (grid: world % (tp·pp·cp) == 0; batch:
`num_microbatches_calculator.py`, gbs % (mbs·dp) == 0; heads % tp, `transformer_config.py`),
DeepSpeed 0.19 (`runtime/config.py`: train_batch_size = micro · gas · dp; AutoTP shards
q/k/v/gate/up by rows). Experts (NVIDIA/Megatron-LM at d98e8a64 and DeepSpeed 0.19.8): the
expert grid world = etp·ep·pp·edp (megatron/core/parallel_state.py:880-884,
`initialize_model_parallel`; DeepSpeed utils/groups.py:417 splits world/pp into ep groups),
experts % ep (megatron/training/arguments.py:1657, megatron/core/transformer/moe/moe_layer.py:186;
deepspeed/moe/layer.py:59), expert parallelism only with experts (arguments.py:1656,
transformer_config.py:1595). Framework-specific rules live beside each framework.
"""

from __future__ import annotations

import numpy as np

import autotune.frameworks as frameworks
from autotune.costmodel.constants import Constants
from autotune.frameworks.base import Rule
from autotune.frameworks.base import RuleGroup
from autotune.frameworks.base import rule
from autotune.layout import BoolArray
from autotune.layout import LayoutTable
from autotune.specs import AutotuneConfig

COMMON_RULES: list[Rule] = []
"""The shared rules, in the order they are applied within their groups."""


@rule(
    COMMON_RULES,
    "world_divisible_by_tp_pp_cp",
    "world = tp·pp·cp·dp: tp·pp·cp = {l.tp}·{l.pp}·{l.cp} must divide the {world} GPUs",
    RuleGroup.GRID,
)
def _world(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    broken: BoolArray = (cfg.world_size % t.model_parallel != 0) | (t.dp < 1)
    return broken


@rule(
    COMMON_RULES,
    "tp_within_node",
    "tensor parallelism needs NVLink: tp={l.tp} must divide the {gpn} GPUs of one node",
    RuleGroup.GRID,
)
def _tp_node(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    broken: BoolArray = cfg.cluster.gpus_per_node % t.tp != 0
    return broken


@rule(
    COMMON_RULES,
    "gbs_divisible_by_mbs_dp",
    "global batch {t.global_batch_size} must be divisible by mbs·dp = {l.mbs}·{l.dp}",
    RuleGroup.GRID,
)
def _gbs(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    broken: BoolArray = cfg.train.global_batch_size % (t.mbs * t.dp) != 0
    return broken


@rule(
    COMMON_RULES,
    "heads_divisible_by_tp",
    "num_attention_heads ({m.num_attention_heads}) must be divisible by tp ({l.tp})",
    RuleGroup.TENSOR,
)
def _heads(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    broken: BoolArray = cfg.model.num_attention_heads % t.tp != 0
    return broken


@rule(
    COMMON_RULES,
    "query_groups_divisible_by_tp",
    "num_query_groups ({m.query_groups}) must be divisible by tp ({l.tp}) "
    "(Megatron also accepts tp divisible by the groups)",
    RuleGroup.TENSOR,
)
def _groups(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    g = cfg.model.query_groups
    broken: BoolArray = g % t.tp != 0
    if frameworks.framework_of(cfg).tp_may_exceed_query_groups:
        broken = broken & (t.tp % g != 0)
    return broken


@rule(
    COMMON_RULES,
    "ffn_divisible_by_tp",
    "ffn_hidden_size ({m.ffn}) must be divisible by tp ({l.tp})",
    RuleGroup.TENSOR,
)
def _ffn(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    broken: BoolArray = cfg.model.ffn % t.tp != 0
    return broken


@rule(
    COMMON_RULES,
    "hidden_divisible_by_tp",
    "hidden_size ({m.hidden_size}) must be divisible by tp ({l.tp})",
    RuleGroup.TENSOR,
)
def _hidden(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    broken: BoolArray = cfg.model.hidden_size % t.tp != 0
    return broken


@rule(
    COMMON_RULES,
    "layers_divisible_by_pp_vpp",
    "num_layers ({m.num_layers}) must split over pp·vpp = {l.pp}·{l.vpp} chunks: evenly, or as "
    "Megatron allows (the embedding/loss counted as layers, explicit first/last stages, or a "
    "layout giving each chunk at least one layer)",
    RuleGroup.PIPELINE,
)
def _layers(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    return ~frameworks.framework_of(cfg).split_layers(cfg, t.pp, t.vpp).legal


@rule(
    COMMON_RULES,
    "offload_needs_zero",
    "CPU offload moves ZeRO-partitioned states: offload needs zero >= 1",
    RuleGroup.ZERO,
)
def _offload_zero(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    broken: BoolArray = (t.offload >= 1) & (t.zero == 0)
    return broken


@rule(
    COMMON_RULES,
    "expert_parallel_needs_experts",
    "{m.name} is dense: with no experts to split, ep ({l.ep}) and etp ({l.etp}) must be 1",
    RuleGroup.EXPERT,
)
def _dense_experts(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    if cfg.model.moe:
        return np.zeros(len(t), dtype=bool)
    return (t.ep > 1) | (t.etp > 1)


@rule(
    COMMON_RULES,
    "experts_divisible_by_ep",
    "num_experts ({m.num_experts}) must be divisible by ep ({l.ep}): each expert-parallel rank "
    "holds the same number of experts",
    RuleGroup.EXPERT,
)
def _experts_ep(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    broken: BoolArray = cfg.model.moe & ((cfg.model.num_experts or 1) % t.ep != 0)
    return broken


@rule(
    COMMON_RULES,
    "world_divisible_by_expert_grid",
    "the MoE layers fold the world into etp·ep·pp·edp: etp·ep·pp = {l.etp}·{l.ep}·{l.pp} must "
    "divide the {world} GPUs",
    RuleGroup.EXPERT,
)
def _expert_grid(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    broken: BoolArray = cfg.world_size % t.expert_grid != 0
    return broken


@rule(
    COMMON_RULES,
    "etp_within_node",
    "expert tensor parallelism needs NVLink: etp={l.etp} must divide the {gpn} GPUs of one node",
    RuleGroup.EXPERT,
)
def _etp_node(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    broken: BoolArray = cfg.cluster.gpus_per_node % t.etp != 0
    return broken


@rule(
    COMMON_RULES,
    "moe_ffn_divisible_by_etp",
    "expert width moe_ffn_hidden_size ({m.moe_ffn}) must be divisible by etp ({l.etp})",
    RuleGroup.EXPERT,
)
def _moe_ffn(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    broken: BoolArray = cfg.model.moe_ffn % t.etp != 0
    return broken
