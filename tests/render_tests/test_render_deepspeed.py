"""ds_config.json is judged by DeepSpeed itself; every key is one DeepSpeed reads."""

from __future__ import annotations

import inspect
import re
from typing import Any
from unittest import mock

import deepspeed
import deepspeed.comm as ds_comm
import pytest
from deepspeed.launcher.runner import _parse_hostfile
from deepspeed.runtime import config as ds_config_module
from deepspeed.runtime import constants as ds_constants
from deepspeed.runtime import precision_config
from deepspeed.runtime.config import DeepSpeedConfig
from deepspeed.runtime.config import get_pipeline_config
from deepspeed.runtime.tensor_parallel import config as tp_config_module
from hypothesis import given
from render_samples import FEATURES
from render_samples import PROPERTY
from render_samples import Case
from render_samples import feasible_cases
from render_samples import on_every_sample
from render_samples import problem
from render_samples import sample

from autotune import AutotuneError
from autotune import Layout
from autotune.render import deepspeed_config
from autotune.render import hostfile
from autotune.render import render_artifacts


class _DataParallel:
    """The part of an mpu DeepSpeedConfig asks: the data-parallel size."""

    def __init__(self, size: int) -> None:
        self.size = size

    def get_data_parallel_world_size(self) -> int:
        return self.size


def judge(config: dict[str, Any], layout: Layout, *, mpu: bool = True) -> DeepSpeedConfig:
    """DeepSpeedConfig as a rank of the layout's world would build it (with an mpu that gives the
    data-parallel size, as AutoTP and PipelineModule do; without one DeepSpeed divides the world
    by sequence_parallel_size itself)."""
    with (
        mock.patch.object(ds_comm, "get_rank", lambda *a, **k: 0),
        mock.patch.object(ds_comm, "get_world_size", lambda *a, **k: layout.world_size),
    ):
        return DeepSpeedConfig(config, mpu=_DataParallel(layout.dp) if mpu else None)


def _keys_deepspeed_reads() -> set[str]:
    """Top-level names DeepSpeed 0.19 looks up in a config dict, read off its source."""
    names = {value for name, value in vars(ds_constants).items()
             if name.isupper() and isinstance(value, str)}
    names |= {precision_config.BFLOAT16, precision_config.FP16}
    lookups = re.compile(
        r"""(?:param_dict|config|ds_config)(?:\.get\(|\[)\s*['"](\w+)['"]"""
        r"""|['"](\w+)['"]\s+in\s+(?:param_dict|config|ds_config)\b"""
    )
    for module in (ds_config_module, tp_config_module, deepspeed):
        for match in lookups.finditer(inspect.getsource(module)):
            names.add(match.group(1) or match.group(2))
    return names


KNOWN_KEYS = _keys_deepspeed_reads()


def test_known_keys_come_from_the_source() -> None:
    """Oracle: DeepSpeed's source: the lookups this renderer relies on are found by the regexes
    (else the key check below would pass on an empty set)."""
    for key in ("zero_optimization", "pipeline", "tensor_parallel", "sequence_parallel_size",
                "train_batch_size", "bf16", "fp16", "optimizer", "gradient_clipping"):
        assert key in KNOWN_KEYS


@PROPERTY
@on_every_sample("deepspeed")
@given(case=feasible_cases("deepspeed"))
def test_deepspeed_accepts_every_feasible_layout(case: Case) -> None:
    """Oracle: DeepSpeed's DeepSpeedConfig at the layout's world size (it refuses a batch that
    is not micro-batch x accumulation x data-parallel size, and bad ZeRO, offload, precision or
    AutoTP values) reads back the layout's batch, ZeRO stage, offload, precision and degrees;
    DeepSpeed's documented limits hold: offload_param only with stage 3, a pipeline only with
    ZeRO 0-1 and checkpointing every layer under full recompute, Ulysses only when the heads
    divide over the sequence-parallel group."""
    cfg, layout = case.cfg, case.layout
    config = deepspeed_config(cfg, layout)
    judged = judge(config, layout)
    assert judged.train_batch_size == cfg.train.global_batch_size == (
        judged.train_micro_batch_size_per_gpu * judged.gradient_accumulation_steps * layout.dp)
    assert (judged.train_micro_batch_size_per_gpu, judged.gradient_accumulation_steps) == (
        layout.mbs, layout.gas)
    assert judged.zero_optimization_stage == layout.zero
    zero = judged.zero_config
    assert (zero.offload_optimizer is not None) == (layout.offload != "none")
    assert (zero.offload_param is not None) == (layout.offload == "optimizer+params")
    assert zero.offload_param is None or layout.zero == 3
    precision = cfg.train.precision
    assert judged.bfloat16_config.enabled == (precision in ("bf16", "fp8"))
    assert judged.float16_config.enabled == (precision == "fp16")
    assert judged.tensor_parallel_config.autotp_size == (layout.tp if layout.tp > 1 else 0)
    assert config.get("sequence_parallel_size", 1) == layout.cp
    assert cfg.model.num_attention_heads % layout.cp == 0
    if layout.tp == layout.pp == 1:  # no mpu needed: DeepSpeed finds dp = world / cp itself
        assert judge(config, layout, mpu=False).train_batch_size == cfg.train.global_batch_size
    assert judged.optimizer_name == "adamw" and judged.gradient_clipping == 1.0
    assert ("pipeline" in config) == (layout.pp > 1)
    if layout.pp > 1:  # PipelineModule: a checkpoint interval of 0 turns checkpointing off
        assert config["pipeline"]["stages"] == layout.pp and layout.zero <= 1
        interval = config["pipeline"]["activation_checkpoint_interval"]
        assert interval == (1 if layout.recompute == "full" else 0)


@PROPERTY
@on_every_sample("deepspeed")
@given(case=feasible_cases("deepspeed"))
def test_every_key_is_read_by_deepspeed(case: Case) -> None:
    """Oracle: DeepSpeed's source (config.py and the AutoTP config read these top-level keys;
    get_pipeline_config's defaults name the pipeline keys): DeepSpeed silently ignores any
    other key, so a misspelt one would never be caught by DeepSpeedConfig."""
    config = deepspeed_config(case.cfg, case.layout)
    unknown = set(config) - KNOWN_KEYS
    assert not unknown, f"DeepSpeed ignores these top-level keys: {sorted(unknown)}"
    if "pipeline" in config:
        assert set(config["pipeline"]) <= set(get_pipeline_config({}))


def test_pipeline_section_and_buckets_of_tiny_gpt() -> None:
    """Oracle: values worked out by hand for tiny-gpt (h 256, 4 layers, 8 heads in 4 groups,
    SwiGLU ffn 768, vocab 8192 untied, RMSNorm, no biases). A layer holds 256·256 (q) +
    2·256·128 (k, v) + 256·256 (o) + 3·256·768 (MLP) + 2·256 (norms) = 786,944 parameters; the
    model 4 layers + 2·8192·256 (embedding, output) + 256 (final norm) = 7,342,336, the ZeRO
    bucket of an unsplit model. On pp=2 the uniform split gives each stage 2 layers; the last
    stage (2 layers, final norm, output layer: 3,671,296) outweighs the first (3,671,040).
    Full recompute checkpoints every layer (activation_checkpoint_interval 1)."""
    cfg = problem("tiny-gpt", "local", "deepspeed", None)
    whole = deepspeed_config(cfg, Layout(dp=2, zero=3, mbs=1, gas=8))
    assert whole["zero_optimization"]["reduce_bucket_size"] == 7_342_336
    assert whole["zero_optimization"]["allgather_bucket_size"] == 7_342_336
    staged = deepspeed_config(cfg, Layout(pp=2, dp=1, zero=1, mbs=1, gas=16, recompute="full"))
    assert staged["pipeline"] == {"stages": 2, "partition": "uniform",
                                  "activation_checkpoint_interval": 1}
    assert staged["zero_optimization"]["reduce_bucket_size"] == 3_671_296
    assert deepspeed_config(cfg, Layout(dp=2, zero=0, mbs=1, gas=8))["zero_optimization"] == {
        "stage": 0}


def test_sample_covers_every_deepspeed_feature() -> None:
    """Oracle: the features a DeepSpeed layout can have, listed by hand: the problems' candidates
    still show each, so the examples do."""
    cases = sample("deepspeed")
    covered = {name for name, check in FEATURES.items()
               if any(check(case.cfg, case.layout) for case in cases)}
    wanted = {"zero0", "zero1", "zero2", "zero3", "offload-optimizer", "offload-params", "tp",
              "pp", "cp", "full", "pp-full", "moe", "ep", "ep-pp"}
    assert wanted <= covered


@pytest.mark.parametrize("cluster", ["dgx-h100:1", "dgx-h100:4"])
def test_hostfile_parses(cluster: str) -> None:
    """Oracle: the deepspeed launcher's own hostfile parser (_parse_hostfile): one host per node
    with 8 slots."""
    cfg = problem("llama2-7b", cluster, "deepspeed", None)
    pool = _parse_hostfile(hostfile(cfg).splitlines())
    assert list(pool.values()) == [8] * cfg.cluster.nodes
    assert len(pool) == cfg.cluster.nodes


@pytest.mark.parametrize(
    ("layout", "rule"),
    [(Layout(pp=2, dp=4, vpp=2, gas=256), "deepspeed_no_virtual_pipeline"),
     (Layout(tp=2, dp=4, sp=True, gas=256), "deepspeed_no_megatron_sp"),
     (Layout(dp=8, zero=2, offload="optimizer+params", gas=128), "param_offload_needs_zero3"),
     (Layout(dp=8, zero=0, offload="optimizer", gas=128), "offload_needs_zero")],
    ids=["vpp", "megatron-sp", "param-offload-zero2", "offload-zero0"],
)
def test_unrepresentable_layouts_raise(layout: Layout, rule: str) -> None:
    """Oracle: each layout was refused by DeepSpeed itself (see the rule's reason)."""
    cfg = problem("llama2-7b", "dgx-h100:1", "deepspeed", None)
    with pytest.raises(AutotuneError, match=rule):
        render_artifacts(cfg, layout)
