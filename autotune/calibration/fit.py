"""Fit the step-time model's physical constants to measured runs (published ones or trials).

A `Measured` point is a problem, one or more candidate layouts (several when the source leaves a
dimension unstated: the fastest by the model stands for the run) and the measured step time.
`fit_constants` runs a bounded least squares on log(predicted / measured) over a few named
constants, so one GPU type gets a handful of physical numbers, never one per row.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from scipy.optimize import least_squares

from autotune.calibration.published import PUBLISHED_RUNS
from autotune.calibration.published import PublishedRun
from autotune.calibration.published import published_runs
from autotune.costmodel.constants import FIT_BOUNDS
from autotune.costmodel.constants import Constants
from autotune.costmodel.step_time import estimate_time
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.specs import AutotuneConfig

TRIAL_REFIT = ("gemm_efficiency", "gemm_half_size", "elementwise_passes", "comm_efficiency")
"""Constants refitted to a study's own measured trials (GEMM speed and its size dependence,
memory-bound passes, collective bandwidth): each has fit bounds (`FIT_BOUNDS`)."""
ROBUST_SCALE = 0.1
"""Log-error scale beyond which the fit's loss grows linearly (soft-L1)."""


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

    @functools.cached_property
    def table(self) -> LayoutTable:
        """The candidate layouts as a table."""
        return LayoutTable.from_layouts(self.layouts)


def predicted_step_s(point: Measured, k: Constants) -> float:
    """The model's step time (the fastest candidate when the layout was not fully published)."""
    return float(np.min(estimate_time(point.cfg, point.table, k)["total"]))


def best_layout(point: Measured, k: Constants) -> Layout:
    """The candidate the model finds fastest."""
    return point.layouts[int(np.argmin(estimate_time(point.cfg, point.table, k)["total"]))]


def errors(points: Sequence[Measured], k: Constants) -> np.ndarray:
    """Relative throughput errors (predicted / measured − 1) of each point."""
    return np.array([p.step_time_s / predicted_step_s(p, k) - 1 for p in points])


def fit_constants(
    points: Sequence[Measured],
    base: Constants,
    names: Sequence[str] = ("gemm_efficiency", "comm_efficiency"),
    *,
    prior_sd: float | Mapping[str, float] | None = None,
) -> Constants:
    """Robust least-squares fit of `names` on the log error of step time, from `base`.

    The loss is Cauchy with a 10 % scale (`ROBUST_SCALE`): a point off by more than that counts
    less than quadratically, so a few runs the model cannot express do not drag every constant
    to a bound. With `prior_sd`, each constant also pays ROBUST_SCALE · log(value / base value) /
    prior_sd: moving a constant by a factor e^prior_sd from its physical value costs as much as
    one run predicted 10 % off, so a constant the points do not identify stays at its source's
    value instead of running to a bound. A mapping gives each name its own spread (names it
    lacks have no prior).
    """
    if not points:
        return base
    low = np.array([FIT_BOUNDS[n][0] for n in names])
    high = np.array([FIT_BOUNDS[n][1] for n in names])
    start = np.clip(np.array([getattr(base, n) for n in names], dtype=float), low, high)

    center = np.log(start)
    spread = None
    if isinstance(prior_sd, Mapping):
        spread = np.array([prior_sd.get(n, np.inf) for n in names])
    elif prior_sd is not None:
        spread = np.full(len(names), prior_sd)

    def residuals(x: np.ndarray) -> np.ndarray:
        k = base.model_copy(update=dict(zip(names, map(float, x), strict=True)))
        data = np.array([np.log(predicted_step_s(p, k) / p.step_time_s) for p in points])
        if spread is None:
            return data
        return np.concatenate([data, ROBUST_SCALE * (np.log(x) - center) / spread])

    result = least_squares(residuals, start, bounds=(low, high), x_scale="jac",
                           loss="cauchy", f_scale=ROBUST_SCALE)
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
    assert run.cfg is not None and run.step_time_s is not None, "an expressible, measured run"
    return Measured(run.name, run.cfg, run.layouts, run.step_time_s, run.cfg.cluster.gpu.name,
                    float(run.row["tflops_per_gpu"] or 0.0), run.source)


def published_points(path: str | Path = PUBLISHED_RUNS) -> list[Measured]:
    """The measured rows of a published-runs CSV (data/published_runs.csv) that the model can
    express, as calibration points (candidates: see `autotune.calibration.published`)."""
    return [as_point(run) for run in published_runs(path)
            if run.skip is None and run.step_time_s is not None]
