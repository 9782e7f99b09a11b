"""Megatron flags and megatron-core configs: real flag names, built configs, the zero mapping."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
import torch.distributed
from hypothesis import assume
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from megatron_core_oracle import megatron_core_refusal
from render_samples import FEATURES
from render_samples import Case
from render_samples import problem
from render_samples import sample

from autotune import AutotuneError
from autotune import Layout
from autotune.costmodel.constants import constants_for
from autotune.frameworks import get_framework
from autotune.frameworks.megatron.args import megatron_args
from autotune.frameworks.megatron.args import pipeline_plan
from autotune.frameworks.megatron.args import transformer_config_kwargs
from autotune.frameworks.megatron.model import transformer_config_class
from autotune.render import megatron_launch_script
from autotune.render import render_artifacts
from autotune.space.rules import violations
from autotune.specs import AutotuneConfig

with warnings.catch_warnings():  # megatron-core warns that Transformer Engine / Apex are absent
    warnings.simplefilter("ignore")
    from megatron.core import parallel_state
    from megatron.core.transformer.pipeline_parallel_layer_layout import (
        PipelineParallelLayerLayout,
    )
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_config import TransformerConfig

pytestmark = pytest.mark.filterwarnings(
    "ignore::UserWarning:megatron.core.transformer.transformer_config"
)

MEGATRON_LM_FLAGS = frozenset(
    line.strip()
    for line in (Path(__file__).parent / "megatron_lm_flags.txt").read_text().splitlines()
    if line.startswith("--")
)


def flag_values(args: list[str]) -> dict[str, list[str]]:
    """Each flag with the values that follow it."""
    parsed: dict[str, list[str]] = {}
    current = ""
    for arg in args:
        if arg.startswith("--"):
            current = arg
            parsed[current] = []
        else:
            parsed[current].append(arg)
    return parsed


def test_flags_exist_in_megatron_lm(megatron_case: Case) -> None:
    args = megatron_args(megatron_case.cfg, megatron_case.layout)
    unknown = {arg for arg in args if arg.startswith("--")} - MEGATRON_LM_FLAGS
    assert not unknown, f"not Megatron-LM flags: {sorted(unknown)}"
    assert len(flag_values(args)) == len([a for a in args if a.startswith("--")]), "duplicates"


def test_transformer_config_builds_on_cpu(megatron_case: Case) -> None:
    """Oracle: megatron-core's TransformerConfig (MLATransformerConfig for multi-latent
    attention) accepts every sampled layout, MoE ones included, with the same degrees."""
    cfg, layout = megatron_case.cfg, megatron_case.layout
    assert not torch.distributed.is_initialized()
    config = transformer_config_class(cfg.model)(**transformer_config_kwargs(cfg, layout))
    assert config.tensor_model_parallel_size == layout.tp
    assert config.pipeline_model_parallel_size == layout.pp
    assert config.context_parallel_size == layout.cp
    assert config.sequence_parallel == layout.sp
    assert config.virtual_pipeline_model_parallel_size == (layout.vpp if layout.vpp > 1 else None)
    if not cfg.model.multi_latent_attention:
        assert config.num_query_groups == cfg.model.query_groups
    assert config.num_moe_experts == cfg.model.num_experts
    assert config.expert_model_parallel_size == layout.ep
    # megatron-core's default for a dense model is etp = tp; MoE layouts always set it
    assert config.expert_tensor_parallel_size == (layout.etp if cfg.model.moe else layout.tp)


def test_moe_layouts_pass_megatron_core_setup(megatron_moe_case: Case) -> None:
    """Oracle: megatron-core's own setup (megatron_core_oracle: initialize_model_parallel at the
    cluster's world size, TransformerConfig, a MoELayer with the model's experts and a training
    forward) accepts every sampled MoE layout."""
    cfg, layout = megatron_moe_case.cfg, megatron_moe_case.layout
    refusal = megatron_core_refusal(
        cfg.world_size, tp=layout.tp, pp=layout.pp, cp=layout.cp, ep=layout.ep, etp=layout.etp,
        sp=layout.sp, experts=cfg.model.num_experts, bias=cfg.model.add_bias_linear)
    assert refusal is None


def test_moe_flags(megatron_case: Case) -> None:
    """Expert flags of a MoE layout (Megatron-LM names, in megatron_lm_flags.txt): ep and etp
    always explicit (etp would default to tp), alltoall with ep > 1 and allgather without, as
    Megatron's MoE guide recommends, and grouped GEMM; a dense layout has none of them."""
    cfg, layout = megatron_case.cfg, megatron_case.layout
    flags = flag_values(megatron_args(cfg, layout))
    expert_flags = {"--expert-model-parallel-size", "--expert-tensor-parallel-size",
                    "--moe-token-dispatcher-type", "--moe-grouped-gemm"}
    if not cfg.model.moe:
        assert not expert_flags & set(flags)
        return
    assert expert_flags <= MEGATRON_LM_FLAGS
    assert flags["--expert-model-parallel-size"] == [str(layout.ep)]
    assert flags["--expert-tensor-parallel-size"] == [str(layout.etp)]
    assert flags["--moe-token-dispatcher-type"] == ["alltoall" if layout.ep > 1 else "allgather"]
    assert flags["--moe-grouped-gemm"] == []
    kwargs = transformer_config_kwargs(cfg, layout)
    assert kwargs["moe_token_dispatcher_type"] == flags["--moe-token-dispatcher-type"][0]








def test_device_connections_env(megatron_case: Case) -> None:
    layout = megatron_case.layout
    script = megatron_launch_script(megatron_case.cfg, layout)
    fsdp = layout.zero >= 2
    assert ("export CUDA_DEVICE_MAX_CONNECTIONS=1" in script) == (
        (layout.tp > 1 or layout.cp > 1) and not fsdp)
    assert ("unset CUDA_DEVICE_MAX_CONNECTIONS" in script) == fsdp
    assert "export TORCH_NCCL_ASYNC_ERROR_HANDLING=1" in script
    assert "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in script


def test_sample_covers_every_megatron_feature() -> None:
    cases = sample("megatron")
    covered = {name for name, check in FEATURES.items()
               if any(check(case.cfg, case.layout) for case in cases)}
    wanted = {"zero0", "zero1", "zero2", "zero3", "offload-optimizer", "tp", "pp", "vpp", "cp",
              "sp", "selective", "full", "accounted", "accounted-vpp", "uneven-apart",
              "custom-layout", "fsdp-tp", "moe", "ep", "etp", "ep-pp", "ep-cp", "ep-beyond-dp",
              "ep-fsdp"}
    assert wanted <= covered


def _megatron_chunk_layers(config: TransformerConfig) -> list[list[int]]:
    """Transformer layers megatron-core builds in each model chunk, [pp rank][virtual stage]
    (`get_num_layers_to_build`; a custom layout reads the rank from parallel_state, set here
    as a run sets it)."""
    pp = config.pipeline_model_parallel_size
    vpp = config.virtual_pipeline_model_parallel_size or 1
    parallel_state.set_virtual_pipeline_model_parallel_world_size(vpp if vpp > 1 else None)
    try:
        chunks = []
        for rank in range(pp):
            parallel_state.set_pipeline_model_parallel_rank(rank)
            chunks.append([get_num_layers_to_build(config, vp_stage=v if vpp > 1 else None,
                                                   pp_rank=rank) for v in range(vpp)])
        return chunks
    finally:
        parallel_state.set_pipeline_model_parallel_rank(None)
        parallel_state.set_virtual_pipeline_model_parallel_world_size(None)


def _megatron_stage_layers(kwargs: dict) -> list[int]:
    """Transformer layers megatron-core builds on each pipeline rank (all its virtual stages)."""
    return [sum(chunks) for chunks in _megatron_chunk_layers(TransformerConfig(**kwargs))]


@pytest.mark.parametrize(("pp", "vpp"), [(16, 1), (16, 2), (8, 2), (16, 8)])
def test_llama3_405b_counts_embedding_and_loss_as_layers(pp: int, vpp: int) -> None:
    """Oracle: megatron-core's own `get_num_layers_to_build` on the rendered TransformerConfig.
    126 layers plus the embedding and the loss make 128 = pp·vpp·k, as Megatron-Bridge's
    Llama 3.1 405B recipe runs (pp 8, vpp 2); every vpp > 1 was rejected before."""
    cfg = problem("llama3-405b", "dgx-h100:2048", "megatron", None)
    cp = 16384 // (8 * pp * 16)
    layout = Layout(tp=8, pp=pp, cp=cp, dp=16, vpp=vpp, zero=1, gas=128, sp=True)
    flags = flag_values(megatron_args(cfg, layout))
    assert "--account-for-embedding-in-pipeline-split" in flags
    assert "--account-for-loss-in-pipeline-split" in flags
    assert "--decoder-first-pipeline-num-layers" not in flags
    if vpp > 1:
        assert flags["--num-virtual-stages-per-pipeline-rank"] == [str(vpp)]
    stages = _megatron_stage_layers(transformer_config_kwargs(cfg, layout))
    split = get_framework("megatron").split_layers(cfg, np.array([pp]), np.array([vpp]))
    assert stages[0] == split.first[0] == 128 // pp - 1
    assert stages[-1] == split.last[0] == 128 // pp - 1
    assert set(stages[1:-1]) == {split.middle[0]}
    assert sum(stages) == 126


def _config(layers: int, pp: int, vpp: int, **split: object) -> TransformerConfig:
    return TransformerConfig(num_layers=layers, hidden_size=64, num_attention_heads=4,
                             pipeline_model_parallel_size=pp, pipeline_dtype=torch.float32,
                             virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
                             **split)


def _flag_splits(layers: int, pp: int, vpp: int) -> set[tuple[int, ...]]:
    """Layers per pipeline stage of every split Megatron's split flags give (none, the
    embedding/loss accounted, any first and/or last stage count), as megatron-core accepts
    and builds them: TransformerConfig's checks, then non-negative counts in every chunk that
    add up to the layers."""
    counts = (None, *range(1, layers + 1))
    options: list[dict[str, object]] = [{}]
    options += [{"account_for_embedding_in_pipeline_split": embedding,
                 "account_for_loss_in_pipeline_split": loss}
                for embedding, loss in ((True, False), (False, True), (True, True))]
    options += [{"num_layers_in_first_pipeline_stage": first,
                 "num_layers_in_last_pipeline_stage": last}
                for first in counts for last in counts if (first, last) != (None, None)]
    splits = set()
    for option in options:
        try:
            chunks = _megatron_chunk_layers(_config(layers, pp, vpp, **option))
        except (ValueError, AssertionError):
            continue
        if min(map(min, chunks)) >= 0 and sum(map(sum, chunks)) == layers:
            splits.add(tuple(sum(stage) for stage in chunks))
    return splits


@settings(max_examples=300, deadline=None)
@given(layers=st.integers(2, 130), pp=st.integers(2, 24), vpp=st.integers(1, 6))
def test_pipeline_plan_matches_megatron_core(layers: int, pp: int, vpp: int) -> None:
    """Oracle: megatron-core's TransformerConfig validation and `get_num_layers_to_build`: for
    every split autotune accepts (even, embedding/loss accounted, explicit first/last stages, a
    custom layout), Megatron builds exactly the layers autotune counts on the first, the most
    loaded middle and the last stage; a custom layout gives every chunk q or q+1 layers."""
    plan = pipeline_plan(layers, pp, vpp)
    if plan is None:
        return
    cfg = problem("tiny-gpt", "local", "megatron", None)
    cfg = cfg.model_copy(update={"model": cfg.model.model_copy(update={"num_layers": layers})})
    layout = Layout(pp=pp, vpp=vpp, dp=1, gas=pp)
    chunks = _megatron_chunk_layers(TransformerConfig(**transformer_config_kwargs(cfg, layout)))
    stages = [sum(stage) for stage in chunks]
    assert (stages[0], stages[-1]) == (plan.first, plan.last)
    if pp > 2:
        assert max(stages[1:-1]) == plan.middle
    assert sum(stages) == layers
    if plan.chunks:
        assert max(map(max, chunks)) - min(map(min, chunks)) == 1 <= min(map(min, chunks))


@settings(max_examples=150, deadline=None)
@given(layers=st.integers(1, 36), pp=st.integers(2, 8), vpp=st.integers(1, 4))
def test_pipeline_plan_rejects_only_what_megatron_cannot_split(
    layers: int, pp: int, vpp: int
) -> None:
    """Oracle: every split megatron-core accepts from the split flags, enumerated
    (`_flag_splits`). autotune rejects exactly when no flag splits the layers and a custom layout
    cannot give each of the pp·vpp chunks a layer; its flag plan is one megatron-core builds;
    it writes a layout only where every flag split loads some stage more heavily."""
    plan = pipeline_plan(layers, pp, vpp)
    splits = _flag_splits(layers, pp, vpp)
    assert (plan is None) == (not splits and layers < pp * vpp)
    if plan is None:
        return
    if plan.chunks:
        assert all(max(split) > plan.most for split in splits)
    else:
        assert any((split[0], split[-1]) == (plan.first, plan.last)
                   and (pp == 2 or max(split[1:-1]) == plan.middle) for split in splits)


def test_deepseek_v3_runs_on_a_custom_layout() -> None:
    """Oracle: megatron-core's `PipelineParallelLayerLayout` and `get_num_layers_to_build`
    (MLATransformerConfig), and Megatron-LM's arguments.py (the layout excludes the other
    virtual-stage flags). DeepSeek-V3's 61 layers on pp 8 x vpp 4, as Megatron-Bridge ran it
    (published_runs.csv mbridge_2509_h100_deepseekv3_1024): no split flag fits (explicit
    stages need multiples of 4 layers; 62 and 63 accounted layers are no multiples of 32), so
    the layout gives 29 chunks 2 layers and 3 chunks 1, worked out by hand: 7 layers on the
    first and the last stage, at most 8 elsewhere."""
    cfg = problem("deepseek-v3", "dgx-h100:1024", "megatron", None)
    layout = Layout(tp=2, pp=8, dp=64, vpp=4, zero=1, ep=64, etp=1, sp=True, gas=240)
    assert violations(cfg, layout, constants_for(cfg.cluster.gpu), memory=False) == []
    flags = flag_values(megatron_args(cfg, layout))
    text = flags["--pipeline-model-parallel-layout"][0]
    excluded = {"--num-virtual-stages-per-pipeline-rank", "--decoder-first-pipeline-num-layers",
                "--num-layers-per-virtual-pipeline-stage",
                "--account-for-embedding-in-pipeline-split"}
    assert not excluded & set(flags)
    parsed = PipelineParallelLayerLayout(text, 8)
    assert parsed.virtual_pipeline_model_parallel_size == 4
    config = transformer_config_class(cfg.model)(**transformer_config_kwargs(cfg, layout))
    chunks = _megatron_chunk_layers(config)
    assert sorted(sum(chunks, [])) == [1] * 3 + [2] * 29
    assert [sum(stage) for stage in chunks] == [7, 8, 8, 8, 8, 8, 7, 7]
    split = get_framework("megatron").split_layers(cfg, np.array([8]), np.array([4]))
    assert (split.first[0], split.middle[0], split.last[0]) == (7, 8, 7)


def test_uneven_with_virtual_stages_uses_stages_per_rank() -> None:
    # arguments.py rejects --num-layers-per-virtual-pipeline-stage together with uneven stages
    cfg = problem("llama3-405b", "dgx-h100:2048", "megatron", None)
    layout = Layout(tp=8, pp=8, cp=4, dp=64, vpp=3, zero=1, gas=32, sp=True)
    flags = flag_values(megatron_args(cfg, layout))
    assert flags["--num-virtual-stages-per-pipeline-rank"] == ["3"]
    assert flags["--decoder-first-pipeline-num-layers"] == ["9"]
    assert "--num-layers-per-virtual-pipeline-stage" not in flags


def test_even_virtual_stages() -> None:
    cfg = problem("gpt3-175b", "dgx-a100:128", "megatron", None)
    layout = Layout(tp=8, pp=8, dp=16, vpp=4, zero=1, gas=96, sp=True)
    flags = flag_values(megatron_args(cfg, layout))
    assert flags["--num-layers-per-virtual-pipeline-stage"] == ["3"]  # 96 / 8 / 4
    assert "--decoder-first-pipeline-num-layers" not in flags


@pytest.mark.parametrize(
    ("layout", "rule"),
    [(Layout(dp=8, zero=3, offload="optimizer+params", gas=64), "megatron_no_param_offload"),
     (Layout(dp=8, zero=2, offload="optimizer", gas=64), "offload_needs_distributed_optimizer"),
     (Layout(dp=2, pp=4, vpp=9, zero=1, gas=128), "layers_divisible_by_pp_vpp")],
    ids=["param-offload", "offload-without-distributed-optimizer", "layers-do-not-split"],
)
def test_unrepresentable_layouts_raise(layout: Layout, rule: str) -> None:
    """Oracle: Megatron-LM's arguments.py refuses the offloads (see the rules' reasons); 32
    layers cannot give each of 4·9 = 36 chunks a layer, and no split flag fits them (worked
    out by hand: 32 is no multiple of 9, 33 and 34 no multiples of 36)."""
    cfg = problem("llama3-8b", "dgx-h100:1", "megatron", None)
    with pytest.raises(AutotuneError, match=rule):
        render_artifacts(cfg, layout)


def _with_moe_comm(cfg: AutotuneConfig) -> AutotuneConfig:
    train = cfg.train.model_copy(update={"moe_token_dispatcher": "flex", "moe_a2a_overlap": True})
    return cfg.model_copy(update={"train": train})


def test_flex_dispatcher_and_a2a_overlap_render_consistently(megatron_moe_case: Case) -> None:
    """Oracle: Megatron-LM's flag list and megatron-core 0.16.1's TransformerConfig. With the
    flex dispatcher and the EP overlap asked for, a layout with ep > 1 renders flex with the
    DeepEP backend and fp32 router, the overlap flags exactly where the config accepts them
    (`test_a2a_overlap_where_megatron_core_accepts_it`), the same choices as config kwargs, and
    leaves CUDA_DEVICE_MAX_CONNECTIONS unset under the overlap, as Megatron-Bridge does."""
    cfg, layout = _with_moe_comm(megatron_moe_case.cfg), megatron_moe_case.layout
    args = megatron_args(cfg, layout)
    flags = flag_values(args)
    assert {arg for arg in args if arg.startswith("--")} <= MEGATRON_LM_FLAGS
    flex = layout.ep > 1
    assert flags["--moe-token-dispatcher-type"] == ["flex" if flex else "allgather"]
    assert flags.get("--moe-flex-dispatcher-backend") == (["deepep"] if flex else None)
    assert flags.get("--moe-router-dtype") == (["fp32"] if flex else None)
    kwargs = transformer_config_kwargs(cfg, layout)
    config = transformer_config_class(cfg.model)(**kwargs)
    assert config.moe_token_dispatcher_type == flags["--moe-token-dispatcher-type"][0]
    overlap = "--overlap-moe-expert-parallel-comm" in flags
    assert overlap == ("--delay-wgrad-compute" in flags) == config.overlap_moe_expert_parallel_comm
    script = megatron_launch_script(cfg, layout)
    single = (layout.tp > 1 or layout.cp > 1) and layout.zero < 2 and not overlap
    assert ("export CUDA_DEVICE_MAX_CONNECTIONS=1" in script) == single


@settings(max_examples=40, deadline=None)
@given(pp=st.sampled_from([1, 2, 4]), vpp=st.sampled_from([1, 2]), ep=st.sampled_from([1, 8]),
       recompute=st.sampled_from(["none", "selective", "full"]),
       precision=st.sampled_from(["bf16", "fp32"]))
def test_a2a_overlap_where_megatron_core_accepts_it(pp: int, vpp: int, ep: int, recompute: str,
                                                    precision: str) -> None:
    """Oracle: megatron-core 0.16.1's TransformerConfig, given the overlap flags on Mixtral
    layouts of every pipeline, recompute, ep and precision: it accepts them exactly on the
    layouts where autotune renders them (and models the overlap)."""
    assume(pp > 1 or vpp == 1)
    cfg = _with_moe_comm(problem("mixtral-8x7b", "dgx-h100:8", "megatron", precision))
    layout = Layout.derived(cfg.world_size, cfg.train.global_batch_size, pp=pp, vpp=vpp, ep=ep,
                            recompute=recompute, zero=1)
    kwargs = transformer_config_kwargs(cfg, layout)
    rendered = "--overlap-moe-expert-parallel-comm" in megatron_args(cfg, layout)
    forced = kwargs | {"overlap_moe_expert_parallel_comm": True, "delay_wgrad_compute": True}
    try:
        TransformerConfig(**forced)
    except (AssertionError, ValueError):
        accepted = False
    else:
        accepted = True
    assert rendered == accepted
