"""Prediction intervals (autotune.costmodel.uncertainty) and constants per (GPU, stack)."""

from __future__ import annotations

import pytest
import yaml

from autotune.costmodel.constants import Constants
from autotune.costmodel.constants import constants_for
from autotune.costmodel.uncertainty import UNCALIBRATED
from autotune.costmodel.uncertainty import Interval
from autotune.costmodel.uncertainty import interval_text
from autotune.costmodel.uncertainty import prediction_interval
from autotune.costmodel.uncertainty import regime
from autotune.costmodel.uncertainty import residual_summary
from autotune.resources import resource_dir
from autotune.specs import AutotuneConfig
from autotune.specs import TrainSpec
from autotune.specs.inputs import load_cluster
from autotune.specs.inputs import load_model

STORED = yaml.safe_load((resource_dir("presets") / "constants.yaml").read_text())


def config(cluster: str = "dgx-h100:1", **train: object) -> AutotuneConfig:
    """Llama 3 8B on `cluster` with the given training setup."""
    spec = TrainSpec(seq_length=4096, global_batch_size=64, **train)  # type: ignore[arg-type]
    return AutotuneConfig(model=load_model("llama3-8b"), cluster=load_cluster(cluster),
                          train=spec)


def test_interval_arithmetic_by_hand() -> None:
    """low 0.9, high 1.2 around a 10 s step: 9-12 s; a 100 tokens/s rate: 83.3-111.1 (100/1.2,
    100/0.9); 10 s and 12.5 s overlap (9-12 vs 11.25-15), 10 s and 14 s do not (12.6-16.8)."""
    band = Interval(0.9, 1.2, rows=5, sources=2, key="x")
    assert band.step_s(10.0) == pytest.approx((9.0, 12.0))
    assert band.throughput(100.0) == pytest.approx((100 / 1.2, 100 / 0.9))
    assert band.overlaps(10.0, 12.5) and band.overlaps(12.5, 10.0)
    assert not band.overlaps(10.0, 14.0)
    assert band.text() == "-10%/+20% step time"


def test_residual_summary_contains_one() -> None:
    """Ratios 1.05 and 1.1 (always slower than predicted): the range is widened down to 1;
    ratios 0.8 and 1.3 keep their extremes."""
    assert residual_summary([1.05, 1.1], 1) == {"low": 1.0, "high": 1.1, "rows": 2, "sources": 1}
    assert residual_summary([0.8, 1.3, 1.0], 2) == {"low": 0.8, "high": 1.3, "rows": 3,
                                                    "sources": 2}


def test_regimes() -> None:
    """Precision class plus -moe for expert models."""
    assert regime(config()) == "bf16"
    assert regime(config(precision="fp8")) == "fp8"
    moe = config().model_copy(update={"model": load_model("mixtral-8x7b")})
    assert regime(moe) == "bf16-moe"


def test_stack_defaults_per_framework() -> None:
    """megatron runs on megatron-core, deepspeed on deepspeed, unless the setup names a stack."""
    assert config().train.software_stack == "megatron-core"
    assert config(framework="deepspeed").train.software_stack == "deepspeed"
    assert config(framework="deepspeed", stack="pytorch").train.software_stack == "pytorch"


def test_constants_per_stack_come_from_the_stored_fit() -> None:
    """A preset run by a fitted stack gets that stack's stored constants; a stack without a fit
    on that GPU keeps the GPU's own values; a custom GPU gets the defaults."""
    cfg = config()
    fitted = STORED["h100-sxm-80gb"]["stacks"]["megatron-core"]
    k = constants_for(cfg.cluster.gpu, "megatron-core")
    assert k.attention_efficiency == fitted["attention_efficiency"]
    assert k.fp8_gemm_efficiency == fitted["fp8_gemm_efficiency"]
    own = constants_for(cfg.cluster.gpu)
    assert own.gemm_efficiency == STORED["h100-sxm-80gb"]["gemm_efficiency"]
    custom = cfg.cluster.gpu.model_copy(update={"name": "my-gpu"})
    assert constants_for(custom, "megatron-core") == Constants()


def test_interval_of_a_preset_and_uncalibrated_custom_gpu() -> None:
    """H100 + megatron-core in fp8 reads its stored fp8 residual range; the same GPU renamed
    (a custom mapping) is uncalibrated, unless it is `like` the preset."""
    cfg = config(precision="fp8")
    stored = STORED["h100-sxm-80gb"]["stacks"]["megatron-core"]["intervals"]["fp8"]
    band = prediction_interval(cfg)
    assert band is not None
    assert (band.low, band.high) == (stored["low"], stored["high"])
    assert band.key == "h100-sxm-80gb/megatron-core/fp8"
    custom_gpu = cfg.cluster.gpu.model_copy(update={"name": "my-gpu"})
    custom = cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update={"gpu": custom_gpu})})
    assert prediction_interval(custom) is None
    assert interval_text(custom) == UNCALIBRATED
    like_gpu = custom_gpu.model_copy(update={"like": "h100-sxm-80gb"})
    like = cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update={"gpu": like_gpu})})
    assert prediction_interval(like) == band


def test_missing_regime_falls_back_to_the_pooled_dense_range() -> None:
    """A bf16 MoE setup on H100 + pytorch has no bf16-moe residuals: the pair's `all` range."""
    cfg = config(framework="deepspeed", stack="pytorch")
    moe = cfg.model_copy(update={"model": load_model("mixtral-8x7b")})
    stored = STORED["h100-sxm-80gb"]["stacks"]["pytorch"]["intervals"]
    assert "bf16-moe" not in stored
    band = prediction_interval(moe)
    assert band is not None and band.key.endswith("/all")
    assert (band.low, band.high) == (stored["all"]["low"], stored["all"]["high"])


def test_moe_intervals_say_how_their_runs_were_held_out() -> None:
    """Oracle: the stored table: each MoE regime records that its runs were also predicted
    with their model left out, the interval of an MoE setup says so, and a dense one keeps
    'its source left out'."""
    stacks = STORED["h100-sxm-80gb"]["stacks"]["megatron-core"]["intervals"]
    assert all("model left out" in stacks[k]["left_out"] for k in stacks if k.endswith("-moe"))
    assert all("left_out" not in stacks[k] for k in stacks if not k.endswith("-moe"))
    moe = AutotuneConfig(model=load_model("mixtral-8x7b"), cluster=load_cluster("dgx-h100:1"),
                         train=TrainSpec(seq_length=4096, global_batch_size=64))
    band = prediction_interval(moe)
    assert band is not None and band.key.endswith("bf16-moe")
    assert "model left out" in band.origin()
    dense = prediction_interval(config())
    assert dense is not None and dense.origin().endswith("each predicted with its source left out")
