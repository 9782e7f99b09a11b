"""Every feasible Megatron layout: megatron-core builds its configs, and its pretrain_gpt.py
flags mean the same layout to Megatron-LM.

Property tests over `render_samples.feasible_cases("megatron")` (every feasible layout of every
problem), each run first on the examples of `render_samples.sample` (one per feature).
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
from hypothesis import given
from render_samples import PROPERTY
from render_samples import Case
from render_samples import feasible_cases
from render_samples import on_every_sample

from autotune.frameworks.megatron.args import megatron_args
from autotune.workloads.megatron_gpt import build_configs

with warnings.catch_warnings():  # megatron-core warns that Transformer Engine / Apex are absent
    warnings.simplefilter("ignore")
    from megatron.core.transformer.pipeline_parallel_layer_layout import (
        PipelineParallelLayerLayout,
    )
    from megatron.core.transformer.transformer_config import TransformerConfig

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

TRANSFORMER_FIELDS = {field.name for field in dataclasses.fields(TransformerConfig)}
FALSE_BY_DEFAULT = ("sequence_parallel", "bf16", "fp16")
"""TransformerConfig fields whose Megatron-LM flag is a store_true (absent: False)."""
SCRIPT_ONLY = {"moe_grouped_gemm"}
"""Flags of the launch script the megatron-core program leaves off on purpose: grouped GEMM
needs Transformer Engine or the grouped_gemm package (`autotune.frameworks.megatron.args`)."""
SHARDING = {2: "optim_grads", 3: "optim_grads_params"}
"""--data-parallel-sharding-strategy of Megatron-FSDP for ZeRO-2 and ZeRO-3 (arguments.py)."""


def moe_freq(value: str) -> int | list[int]:
    """`--moe-layer-freq` as Megatron-LM's `moe_freq_type` reads it (arguments.py): an int, or a
    Python list expression such as "([0]*3+[1]*58)" evaluated to the per-layer pattern."""
    return eval(value, {"__builtins__": {}}) if "[" in value else int(value)  # noqa: S307


def parse(argv: list[str]) -> dict[str, object]:
    """argv as argparse stores it: `--a-b V` as a_b = "V", a bare `--flag` as True."""
    args: dict[str, object] = {}
    dest = ""
    for arg in argv:
        if arg.startswith("--"):
            dest = arg[2:].replace("-", "_")
            args[dest] = True
        elif args[dest] is True:
            args[dest] = arg
        else:  # nargs='+' (none of the layout flags take several values)
            args[dest] = f"{args[dest]} {arg}"
    return args


@PROPERTY
@on_every_sample("megatron")
@given(case=feasible_cases("megatron"))
def test_megatron_core_builds_every_feasible_layout(case: Case) -> None:
    """Oracle: megatron-core's TransformerConfig, DistributedDataParallelConfig and
    OptimizerConfig (their __post_init__ checks: heads and query groups over tp, sp needs tp,
    uneven first/last stages, recompute settings), built as the megatron-core program builds
    them, hold the layout; the documented Megatron mapping of ZeRO holds: distributed optimizer
    for ZeRO >= 1, Megatron-FSDP for 2-3, and optimizer offload through the precision-aware
    optimizer, which needs the distributed optimizer (megatron/core/optimizer/__init__.py)."""
    cfg, layout = case.cfg, case.layout
    transformer, ddp, optimizer = build_configs(cfg, layout)
    assert (transformer.tensor_model_parallel_size, transformer.pipeline_model_parallel_size,
            transformer.context_parallel_size) == (layout.tp, layout.pp, layout.cp)
    assert transformer.sequence_parallel == layout.sp
    assert (transformer.virtual_pipeline_model_parallel_size or 1) == layout.vpp
    assert ddp.use_distributed_optimizer == (layout.zero >= 1)
    assert ddp.use_megatron_fsdp == (layout.zero >= 2)
    if layout.zero >= 2:
        assert ddp.data_parallel_sharding_strategy == SHARDING[layout.zero]
    assert optimizer.optimizer_cpu_offload == (layout.offload == "optimizer")
    if optimizer.optimizer_cpu_offload:
        assert optimizer.use_precision_aware_optimizer and optimizer.use_distributed_optimizer
    assert (optimizer.bf16, optimizer.fp16) == (transformer.bf16, transformer.fp16)


@PROPERTY
@on_every_sample("megatron")
@given(case=feasible_cases("megatron"))
def test_flags_mean_the_layout_to_megatron_lm(case: Case) -> None:
    """Oracle: Megatron-LM's reading of its flags (arguments.py, num_microbatches_calculator.py,
    core_transformer_config_from_args at NVIDIA/Megatron-LM d98e8a64): dp = world / (tp·pp·cp),
    gbs / (mbs·dp) micro-batches, vpp = layers / pp / --num-layers-per-virtual-pipeline-stage
    or the layout's chunks / pp (PipelineParallelLayerLayout.get_num_stages_from_str),
    --sequence-parallel only with tp > 1, --optimizer-cpu-offload needs
    --use-precision-aware-optimizer, --overlap-param-gather needs --overlap-grad-reduce and a
    sharded optimizer, Megatron-FSDP needs the fsdp_dtensor checkpoint format and no gradient
    accumulation fusion, full recompute needs a method and a layer count; and every flag whose
    name is a TransformerConfig field is copied into the TransformerConfig the megatron-core
    program builds for the same layout."""
    cfg, layout = case.cfg, case.layout
    args = parse(megatron_args(cfg, layout))
    tp, pp = int(args["tensor_model_parallel_size"]), int(args["pipeline_model_parallel_size"])
    cp = int(args.get("context_parallel_size", 1))
    assert (tp, pp, cp) == (layout.tp, layout.pp, layout.cp)
    assert cfg.world_size % (tp * pp * cp) == 0
    dp = cfg.world_size // (tp * pp * cp)
    gbs, mbs = int(args["global_batch_size"]), int(args["micro_batch_size"])
    assert gbs == cfg.train.global_batch_size and gbs % (mbs * dp) == 0
    assert (dp, mbs, gbs // (mbs * dp)) == (layout.dp, layout.mbs, layout.gas)
    layers = int(args["num_layers"])
    if "num_layers_per_virtual_pipeline_stage" in args:
        vpp = layers // pp // int(args["num_layers_per_virtual_pipeline_stage"])
    elif "pipeline_model_parallel_layout" in args:
        layout_text = str(args["pipeline_model_parallel_layout"])
        vpp = PipelineParallelLayerLayout.get_num_stages_from_str(layout_text) // pp
    else:
        vpp = int(args.get("num_virtual_stages_per_pipeline_rank", 1))
    assert vpp == layout.vpp
    assert args.get("sequence_parallel", False) == layout.sp and (tp > 1 or not layout.sp)
    assert args.get("use_distributed_optimizer", False) == (layout.zero >= 1)
    assert args.get("use_megatron_fsdp", False) == (layout.zero >= 2)
    if layout.zero >= 2:
        assert args["data_parallel_sharding_strategy"] == SHARDING[layout.zero]
        assert args["ckpt_format"] == "fsdp_dtensor" and args["no_gradient_accumulation_fusion"]
    assert args.get("optimizer_cpu_offload", False) == (layout.offload == "optimizer")
    if "optimizer_cpu_offload" in args:
        assert args["use_precision_aware_optimizer"]
    if "overlap_param_gather" in args:
        assert args["overlap_grad_reduce"] and layout.zero >= 1
    assert args.get("recompute_granularity") == (
        None if layout.recompute == "none" else layout.recompute)
    if layout.recompute == "full":
        assert {"recompute_method", "recompute_num_layers"} <= set(args)

    transformer = build_configs(cfg, layout)[0]
    for name in sorted(set(args) & TRANSFORMER_FIELDS - SCRIPT_ONLY):
        value = getattr(transformer, name)
        flag = moe_freq(str(args[name])) if name == "moe_layer_freq" else args[name]
        if isinstance(value, PipelineParallelLayerLayout):  # keeps the text it was parsed from
            value = repr(value)
        assert flag == value if isinstance(value, list) else (
            (flag is True and value is True) or type(value)(flag) == value), name
    for name in FALSE_BY_DEFAULT:
        assert getattr(transformer, name) == (name in args), name
    assert transformer.num_layers_in_first_pipeline_stage == (
        int(args["decoder_first_pipeline_num_layers"])
        if "decoder_first_pipeline_num_layers" in args else None)
    assert transformer.num_layers_in_last_pipeline_stage == (
        int(args["decoder_last_pipeline_num_layers"])
        if "decoder_last_pipeline_num_layers" in args else None)
