"""Fit the step-time model's physical constants to measured runs (published ones or trials).

A `Measured` point is a problem, one or more candidate layouts (several when the source leaves a
dimension unstated: the fastest by the model stands for the run) and the measured step time.
`fit_constants` runs a bounded least squares on log(predicted / measured) over a few named
constants, so one GPU type gets a handful of physical numbers, never one per row.
"""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from autotune.constants import Constants
from autotune.frameworks import framework_of
from autotune.inputs import load_cluster
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.perf import estimate_time
from autotune.specs import AutotuneConfig
from autotune.specs import ModelSpec
from autotune.specs import TrainSpec

FIT_BOUNDS: dict[str, tuple[float, float]] = {
    "gemm_efficiency": (0.3, 1.0),
    "gemm_half_size": (1.0, 20000.0),
    "comm_efficiency": (0.3, 0.9),  # NCCL bus bandwidth rarely passes 90 % of a link
    "elementwise_passes": (0.0, 12.0),
    "overlap_fraction": (0.0, 1.0),
    "hbm_efficiency": (0.2, 1.0),
}
"""Constants the fit may move, with physical bounds."""


@dataclasses.dataclass(frozen=True)
class Measured:
    """A measured run: the problem, its candidate layouts and the measured step time."""

    name: str
    cfg: AutotuneConfig
    layouts: tuple[Layout, ...]
    step_time_s: float
    gpu: str
    reported_tflops: float = 0.0
    """TFLOP/s per GPU as the source reported it (in its own FLOPs convention), if any."""


def predicted_step_s(point: Measured, k: Constants) -> float:
    """The model's step time (the fastest candidate when the layout was not fully published)."""
    table = LayoutTable.from_layouts(point.layouts)
    return float(np.min(estimate_time(point.cfg, table, k)["total"]))


def best_layout(point: Measured, k: Constants) -> Layout:
    """The candidate the model finds fastest."""
    table = LayoutTable.from_layouts(point.layouts)
    return point.layouts[int(np.argmin(estimate_time(point.cfg, table, k)["total"]))]


def errors(points: Sequence[Measured], k: Constants) -> np.ndarray:
    """Relative throughput errors (predicted / measured − 1) of each point."""
    return np.array([p.step_time_s / predicted_step_s(p, k) - 1 for p in points])


def fit_constants(
    points: Sequence[Measured],
    base: Constants,
    names: Sequence[str] = ("gemm_efficiency", "comm_efficiency"),
) -> Constants:
    """Least-squares fit of `names` (log error of step time), starting from `base`."""
    if not points:
        return base
    low = np.array([FIT_BOUNDS[n][0] for n in names])
    high = np.array([FIT_BOUNDS[n][1] for n in names])
    start = np.clip(np.array([getattr(base, n) for n in names], dtype=float), low, high)

    def residuals(x: np.ndarray) -> np.ndarray:
        k = base.model_copy(update=dict(zip(names, map(float, x), strict=True)))
        return np.array([np.log(predicted_step_s(p, k) / p.step_time_s) for p in points])

    result = least_squares(residuals, start, bounds=(low, high), x_scale="jac")
    return base.model_copy(update=dict(zip(names, map(float, result.x), strict=True)))


# --- published runs (../shared/data/published_runs_calibration.csv) ---------------------------

_GPU_CLUSTER = {"A100-SXM": "dgx-a100", "H100": "dgx-h100"}


def _vpp(text: str, layers_per_stage: int) -> int:
    """'5 layers/virtual stage' → vpp = layers per stage / 5."""
    head = text.split(" ")[0]
    return layers_per_stage // int(head) if head.isdigit() else 1


def published_flops(row: dict[str, str]) -> float:
    """FLOPs per iteration in the row's own convention (`flops_definition`)."""
    b, s = float(row["global_batch_size_seqs"]), float(row["seq_length"])
    layers, h, v = float(row["num_layers"]), float(row["hidden_size"]), float(row["vocab_size"])
    if row["flops_definition"].startswith("SC21_EQ3"):
        return 96 * b * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))
    if row["flops_definition"].startswith("MCORE_R080"):
        return 72 * b * s * layers * h * h * (1 + s / (6 * h) + v / (12 * layers * h))
    raise ValueError(f"unknown flops_definition {row['flops_definition']!r}")


def _row_point(row: dict[str, str]) -> Measured:
    h = int(row["hidden_size"])
    model = ModelSpec(
        name=row["model"],
        num_layers=int(row["num_layers"]),
        hidden_size=h,
        num_attention_heads=int(row["num_attention_heads"]),
        num_query_groups=int(row["num_kv_heads"] or row["num_attention_heads"]),
        ffn_hidden_size=int(row["ffn_hidden_size"] or 4 * h),
        vocab_size=int(row["vocab_size"]),
        max_position_embeddings=int(row["seq_length"]),
    )
    gpus = int(row["num_gpus"])
    cluster = load_cluster(f"{_GPU_CLUSTER[row['gpu_type']]}:{max(gpus // 8, 1)}")
    if gpus < 8:
        cluster = cluster.model_copy(update={"gpus_per_node": gpus})
    sc21 = row["row_id"].startswith("sc21")
    precision = "fp16" if row["precision"] == "fp16" else "bf16"
    train = TrainSpec(
        seq_length=int(row["seq_length"]),
        global_batch_size=int(row["global_batch_size_seqs"]),
        precision=precision,
        framework="megatron",
        flash_attention=not sc21,  # 2021 Megatron materialised the scores (fused softmax)
        overlap_grad_reduce="impl=torch" in row["zero_or_optimizer_sharding"] or not sc21,
    )
    cfg = AutotuneConfig(model=model, cluster=cluster, train=train)
    tp, pp, dp = int(row["tp"]), int(row["pp"]), int(row["dp"])
    zero = 1 if "distributed optimizer" in row["zero_or_optimizer_sharding"] else 0
    sp = tp > 1 and row["sequence_parallel"].startswith("yes")
    per_stage = model.num_layers // pp
    if row["micro_batch_size"]:
        mbs_options = [int(row["micro_batch_size"])]
    else:
        mbs_options = [m for m in (1, 2, 4) if train.global_batch_size % (m * dp) == 0]
    recompute_options = (
        ["full"] if row["recompute"].startswith("full") else ["none", "selective", "full"]
    )
    if row["virtual_pipeline"] and not row["virtual_pipeline"].startswith("not"):
        vpp_options = [_vpp(row["virtual_pipeline"], per_stage)]
    elif row["virtual_pipeline"] == "" and pp > 1 and not sc21:
        vpp_options = [v for v in range(1, per_stage + 1) if per_stage % v == 0]
    else:
        vpp_options = [1]
    layouts = [
        Layout(
            tp=tp,
            pp=pp,
            dp=dp,
            cp=1,
            vpp=v,
            zero=zero,
            mbs=mb,
            gas=train.global_batch_size // (mb * dp),
            recompute=rc,
            sp=sp,
        )
        for mb in mbs_options
        for rc in recompute_options
        for v in vpp_options
    ]
    legal = framework_of(cfg).split_layers(
        cfg, np.array([lay.pp for lay in layouts]), np.array([lay.vpp for lay in layouts])
    ).legal
    layouts = [lay for lay, ok in zip(layouts, legal, strict=True) if ok]
    reported = float(row["tflops_per_gpu"])
    step = published_flops(row) / (reported * 1e12 * gpus)
    return Measured(row["row_id"], cfg, tuple(layouts), step, cluster.gpu.name, reported)


def published_points(path: str | Path) -> list[Measured]:
    """Every row of a published-runs CSV (the format of ../shared/data) as a measured point."""
    with open(path, newline="") as handle:
        return [_row_point(row) for row in csv.DictReader(handle)]
