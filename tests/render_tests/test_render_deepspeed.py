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
from render_samples import FEATURES
from render_samples import Case
from render_samples import problem
from render_samples import sample

from autotune import AutotuneError
from autotune import Layout
from autotune.frameworks.deepspeed import bucket_elements as deepspeed_bucket_elements
from autotune.render import deepspeed_config
from autotune.render import hostfile
from autotune.render import render_artifacts


class _DataParallel:
    """The part of an mpu DeepSpeedConfig asks: the data-parallel size."""

    def __init__(self, size: int) -> None:
        self.size = size

    def get_data_parallel_world_size(self) -> int:
        return self.size


def judge(config: dict[str, Any], layout: Layout) -> DeepSpeedConfig:
    """DeepSpeedConfig as a rank of the layout's world would build it."""
    with (
        mock.patch.object(ds_comm, "get_rank", lambda *a, **k: 0),
        mock.patch.object(ds_comm, "get_world_size", lambda *a, **k: layout.world_size),
    ):
        return DeepSpeedConfig(config, mpu=_DataParallel(layout.dp))


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
    # the regexes must really find the lookups this renderer relies on
    for key in ("zero_optimization", "pipeline", "tensor_parallel", "sequence_parallel_size",
                "train_batch_size", "bf16", "fp16", "optimizer", "gradient_clipping"):
        assert key in KNOWN_KEYS


def test_deepspeed_accepts_config(deepspeed_case: Case) -> None:
    cfg, layout = deepspeed_case.cfg, deepspeed_case.layout
    config = deepspeed_config(cfg, layout)
    judged = judge(config, layout)
    assert judged.train_batch_size == cfg.train.global_batch_size == layout.global_batch_size
    assert judged.train_micro_batch_size_per_gpu == layout.mbs
    assert judged.gradient_accumulation_steps == layout.gas
    assert judged.zero_optimization_stage == layout.zero
    zero = judged.zero_config
    assert (zero.offload_optimizer is not None) == (layout.offload != "none")
    assert (zero.offload_param is not None) == (layout.offload == "optimizer+params")
    precision = cfg.train.precision
    assert judged.bfloat16_config.enabled == (precision in ("bf16", "fp8"))
    assert judged.float16_config.enabled == (precision == "fp16")
    assert judged.tensor_parallel_config.autotp_size == (layout.tp if layout.tp > 1 else 0)
    assert judged.optimizer_name == "adamw"
    assert judged.gradient_clipping == 1.0


def test_every_key_is_read_by_deepspeed(deepspeed_case: Case) -> None:
    config = deepspeed_config(deepspeed_case.cfg, deepspeed_case.layout)
    unknown = set(config) - KNOWN_KEYS
    assert not unknown, f"DeepSpeed ignores these top-level keys: {sorted(unknown)}"
    if "pipeline" in config:
        assert set(config["pipeline"]) <= set(get_pipeline_config({}))


def test_pipeline_section(deepspeed_case: Case) -> None:
    layout = deepspeed_case.layout
    config = deepspeed_config(deepspeed_case.cfg, layout)
    assert ("pipeline" in config) == (layout.pp > 1)
    if layout.pp > 1:
        assert config["pipeline"]["stages"] == layout.pp
        assert config["pipeline"]["partition"] == "uniform"
        interval = config["pipeline"]["activation_checkpoint_interval"]
        assert interval == (1 if layout.recompute == "full" else 0)
    assert config.get("sequence_parallel_size", 1) == layout.cp


def test_buckets_follow_the_memory_model(deepspeed_case: Case) -> None:
    zero = deepspeed_config(deepspeed_case.cfg, deepspeed_case.layout)["zero_optimization"]
    if deepspeed_case.layout.zero == 0:
        assert zero == {"stage": 0}
        return
    bucket = zero["reduce_bucket_size"]
    assert bucket == zero["allgather_bucket_size"]
    assert int(deepspeed_bucket_elements(bucket)) == bucket  # inside the clamp
    if deepspeed_case.layout.zero == 3:
        assert zero["stage3_prefetch_bucket_size"] == bucket // 4


def test_sample_covers_every_deepspeed_feature() -> None:
    cases = sample("deepspeed")
    covered = {name for name, check in FEATURES.items()
               if any(check(case.cfg, case.layout) for case in cases)}
    wanted = {"zero0", "zero1", "zero2", "zero3", "offload-optimizer", "offload-params", "tp",
              "pp", "cp", "full", "pp-full", "moe", "ep", "ep-pp"}
    assert wanted <= covered


@pytest.mark.parametrize("cluster", ["dgx-h100:1", "dgx-h100:4"])
def test_hostfile_parses(cluster: str) -> None:
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
