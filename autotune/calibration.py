"""Fit the step-time model's physical constants to measured runs (published ones or trials).

A `Measured` point is a problem, one or more candidate layouts (several when the source leaves a
dimension unstated: the fastest by the model stands for the run) and the measured step time.
`fit_constants` runs a bounded least squares on log(predicted / measured) over a few named
constants, so one GPU type gets a handful of physical numbers, never one per row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from autotune.constants import Constants
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.perf import estimate_time
from autotune.published import PUBLISHED_RUNS
from autotune.published import PublishedRun
from autotune.published import published_runs
from autotune.specs import AutotuneConfig

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
    source: str = ""
    """The publication (or study) the point comes from: the unit of cross-validation."""


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


def at_bounds(k: Constants, names: Sequence[str]) -> list[tuple[str, str, float]]:
    """(name, "lower" or "upper", bound) of each fitted constant within 1 % of a FIT_BOUNDS
    limit (1 % of the range for a limit at zero): the fit is absorbing a missing term there."""
    hits = []
    for name in names:
        low, high = FIT_BOUNDS[name]
        value = getattr(k, name)
        for side, bound in (("lower", low), ("upper", high)):
            tolerance = 0.01 * (abs(bound) if bound else high - low)
            if abs(value - bound) <= tolerance:
                hits.append((name, side, bound))
    return hits


def leave_one_source_out(
    points: Sequence[Measured],
) -> Iterator[tuple[str, list[Measured], list[Measured]]]:
    """Cross-validation folds: (held-out source, the other sources' points, its points)."""
    for source in sorted({p.source for p in points}):
        train = [p for p in points if p.source != source]
        yield source, train, [p for p in points if p.source == source]


def as_point(run: PublishedRun) -> Measured:
    """A published run the model can express, with its measured step time, as a point."""
    return Measured(run.name, run.cfg, run.layouts, run.step_time_s, run.cfg.cluster.gpu.name,
                    float(run.row["tflops_per_gpu"] or 0.0), run.source)


def published_points(path: str | Path = PUBLISHED_RUNS) -> list[Measured]:
    """The measured rows of a published-runs CSV (data/published_runs.csv) that the model can
    express, as calibration points (candidates: see `autotune.published`)."""
    return [as_point(run) for run in published_runs(path)
            if run.skip is None and run.step_time_s is not None]
