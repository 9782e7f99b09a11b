"""Expert-parallel rules against the frameworks themselves, on CPU.

Megatron: megatron-core's own setup (`megatron_core_oracle`: `initialize_model_parallel` on
torch's fake process group, `TransformerConfig`, a `MoELayer` and one training forward).
DeepSpeed 0.19.8: its MoE layer's constructor, its expert-group rank arithmetic
(`deepspeed/utils/groups.py`, `_get_expert_parallel_ranks`) and how it reads the Ulysses group.
"""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from megatron_core_oracle import megatron_core_refusal

from autotune.layout import Layout
from autotune.space.rules import structural_violations
from autotune.specs import AutotuneConfig
from autotune.specs import ModelSpec
from autotune.specs.inputs import load_config

MEGATRON_CHECKED = frozenset({
    "world_divisible_by_tp_pp_cp", "world_divisible_by_expert_grid", "experts_divisible_by_ep",
    "expert_parallel_needs_experts", "sp_needs_tp", "moe_tp_needs_sp", "moe_bias_needs_etp1",
})
"""Our Megatron rules for what megatron-core's setup checks (the rest it leaves to
Megatron-LM's arguments.py or never checks)."""
DEEPSPEED_CHECKED = frozenset({
    "world_divisible_by_tp_pp_cp", "world_divisible_by_expert_grid", "experts_divisible_by_ep",
})
"""Our DeepSpeed rules for what its MoE layer and expert groups check."""


def problem(world: int, framework: str, experts: int | None, bias: bool = False) -> AutotuneConfig:
    """A toy model (dense, or with `experts`) on `world` processes of one node."""
    cfg = load_config("tiny-moe", "local", processes=world, framework=framework,
                      global_batch_size=world * 64)
    model = ModelSpec(**{
        **cfg.model.model_dump(), "num_experts": experts, "moe_router_topk": min(2, experts or 2),
        "moe_aux_loss_coeff": 0.01 if experts else 0.0, "add_bias_linear": bias,
        "name": "toy-moe" if experts else "toy-dense"})
    return cfg.model_copy(update={"model": model})


def broken(cfg: AutotuneConfig, **dims: int | bool) -> set[str]:
    """Names of the structural rules the layout with these degrees breaks."""
    layout = Layout.derived(cfg.world_size, cfg.train.global_batch_size, **dims)
    return {name for name, _ in structural_violations(cfg, layout)}


@settings(max_examples=80, deadline=None)
@given(
    world=st.sampled_from([1, 2, 4, 6, 8, 12, 16, 24, 32]),
    tp=st.sampled_from([1, 2, 4, 8]),
    pp=st.sampled_from([1, 2, 3, 4]),
    cp=st.sampled_from([1, 2]),
    ep=st.sampled_from([1, 2, 3, 4, 6, 8, 16]),
    etp=st.sampled_from([1, 2, 4]),
    experts=st.sampled_from([None, 2, 4, 6, 8, 12, 16]),
    sp=st.booleans(),
    bias=st.booleans(),
)
def test_megatron_rules_agree_with_megatron_core(world, tp, pp, cp, ep, etp, experts, sp,
                                                 bias) -> None:
    """Oracle: megatron-core refuses exactly the layouts that break one of our Megatron rules
    for the checks it makes (grid, expert grid, experts % ep, ep without experts, sp without
    tp, MoE + tp without sp, biased experts with etp > 1)."""
    etp = etp if experts else 1  # etp of a dense model: our own stricter rule, tested below
    cfg = problem(world, "megatron", experts, bias)
    ours = broken(cfg, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, sp=sp) & MEGATRON_CHECKED
    theirs = megatron_core_refusal(world, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, sp=sp,
                                   experts=experts, bias=bias)
    assert (not ours) == (theirs is None), f"ours: {sorted(ours)}; megatron-core: {theirs}"


def test_dense_models_keep_expert_degrees_at_one() -> None:
    """Worked by hand: a dense model has no experts, so ep and etp other than 1 are refused
    (megatron-core rejects ep > 1 itself, and ignores etp: autotune keeps it 1 so that one
    dense layout has one name)."""
    cfg = problem(8, "megatron", None)
    assert "expert_parallel_needs_experts" in broken(cfg, tp=2, sp=True, etp=2)
    assert "expert_parallel_needs_experts" in broken(cfg, ep=2)
    assert "expert_parallel_needs_experts" not in broken(cfg, tp=2, sp=True)


def _deepspeed_refusal(world: int, pp: int, ep: int, experts: int) -> str | None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from deepspeed.moe.layer import MoE
        from deepspeed.utils import groups
    try:
        MoE(8, torch.nn.Linear(8, 8), num_experts=experts, ep_size=ep)
        # the rank arithmetic of the expert and expert-data-parallel groups (tp = 1)
        groups._get_expert_parallel_ranks(world, 1, ep, pp)
    except AssertionError as error:
        return str(error)
    return None


@settings(max_examples=80, deadline=None)
@given(
    world=st.sampled_from([1, 2, 4, 6, 8, 12, 16, 24, 32]),
    pp=st.sampled_from([1, 2, 3, 4]),
    ep=st.sampled_from([1, 2, 3, 4, 6, 8, 16]),
    experts=st.sampled_from([2, 4, 6, 8, 12, 16]),
)
def test_deepspeed_rules_agree_with_deepspeed(world, pp, ep, experts) -> None:
    """Oracle: DeepSpeed's MoE layer (num_experts % ep_size, moe/layer.py) and its expert
    groups (world/pp split into ep groups, utils/groups.py) refuse exactly the layouts our
    DeepSpeed rules reject."""
    cfg = problem(world, "deepspeed", experts)
    ours = broken(cfg, pp=pp, ep=ep) & DEEPSPEED_CHECKED
    theirs = _deepspeed_refusal(world, pp, ep, experts)
    assert (not ours) == (theirs is None), f"ours: {sorted(ours)}; DeepSpeed: {theirs}"


ULYSSES_AS_TP = """
import warnings; warnings.simplefilter("ignore")
import torch.distributed as dist
from torch.testing._internal.distributed.fake_pg import FakeStore
dist.init_process_group(backend="fake", store=FakeStore(), rank=0, world_size=4)
import deepspeed
deepspeed.init_distributed(dist_backend="gloo")
from deepspeed.runtime.sequence_parallel import parallel_state_sp
from deepspeed.utils.bwc import bwc_tensor_model_parallel_world_size
parallel_state_sp.initialize_sequence_parallel(2)
print("tensor-parallel size", bwc_tensor_model_parallel_world_size(parallel_state_sp))
"""


def test_deepspeed_moe_reads_the_ulysses_group_as_tensor_parallel() -> None:
    """Oracle: DeepSpeed itself. Its MoE layer drops the tokens it takes for tensor-parallel
    duplicates over `bwc_tensor_model_parallel_world_size(groups.mpu)` (moe/sharded_moe.py);
    with Ulysses the mpu is `parallel_state_sp`, whose cp ranks hold different tokens: so a MoE
    model with cp > 1 is refused (deepspeed_moe_without_ulysses)."""
    done = subprocess.run([sys.executable, "-c", ULYSSES_AS_TP], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "tensor-parallel size 2" in done.stdout
    cfg = problem(4, "deepspeed", 4)
    assert "deepspeed_moe_without_ulysses" in broken(cfg, cp=2)
    assert "deepspeed_moe_without_ulysses" not in broken(problem(4, "deepspeed", None), cp=2)


@pytest.mark.parametrize("framework", ["megatron", "deepspeed"])
def test_moe_rules_name_their_values(framework: str) -> None:
    """A refused expert layout explains itself with its own numbers."""
    from autotune.space.rules import violations

    cfg = problem(8, framework, 6)
    layout = Layout.derived(8, cfg.train.global_batch_size, ep=4)
    reasons = dict(violations(cfg, layout, memory=False))
    assert "num_experts (6) must be divisible by ep (4)" in reasons["experts_divisible_by_ep"]
