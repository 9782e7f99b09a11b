"""Fit the step-time model's physical constants to measured runs (published ones or trials).

A `Measured` point is a problem, one or more candidate layouts (several when the source leaves a
dimension unstated: the fastest by the model stands for the run) and the measured step time.
`fit_constants` runs a bounded least squares on log(predicted / measured) over a few named
constants, so one GPU type gets a handful of physical numbers, never one per row; it is the one
fit the published-runs calibration, the search's proposer and the refit report share.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import numpy as np
from scipy.optimize import brentq
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
"""Log-error scale of the robust (Cauchy) loss: a point off by more than about 10 % pulls the
fit less and less (`fit_constants`)."""
Loss = Literal["cauchy", "huber", "linear"]
PRIOR_LOG_SD = 0.25
"""Prior σ of a constant refitted to a study's trials, in log space (a fit with few trials
stays near the constants the study started from)."""
STEP_SD = 0.03
"""σ of the model's log step-time error on a study's own trials after the refit (weighs the
trials against the prior)."""


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
    return float(np.min(estimate_time(point.cfg, point.table, k).total))


def implied_constant(point: Measured, k: Constants, name: str, low: float, high: float,
                     xtol: float = 1e-4) -> float | None:
    """The value of constant `name` within [low, high] at which the model's step time equals the
    measured one, the other constants fixed (None when no value in the range does)."""
    def gap(x: float) -> float:
        return predicted_step_s(point, k.model_copy(update={name: x})) - point.step_time_s

    if gap(low) * gap(high) > 0:
        return None
    return float(brentq(gap, low, high, xtol=xtol))


def best_layout(point: Measured, k: Constants) -> Layout:
    """The candidate the model finds fastest."""
    return point.layouts[int(np.argmin(estimate_time(point.cfg, point.table, k).total))]


def errors(points: Sequence[Measured], k: Constants) -> np.ndarray:
    """Relative throughput errors (predicted / measured − 1) of each point."""
    return np.array([p.step_time_s / predicted_step_s(p, k) - 1 for p in points])


@dataclasses.dataclass(frozen=True)
class _Group:
    """The points of one problem as one table: rows `starts[i]`.. are point `members[i]`'s."""

    cfg: AutotuneConfig
    table: LayoutTable
    members: list[int]
    starts: np.ndarray


def _groups(points: Sequence[Measured]) -> list[_Group]:
    by_cfg: dict[int, list[int]] = {}
    for i, point in enumerate(points):
        by_cfg.setdefault(id(point.cfg), []).append(i)
    return [_Group(points[m[0]].cfg,
                   LayoutTable.from_layouts([lay for i in m for lay in points[i].layouts]), m,
                   np.cumsum([0] + [len(points[i].layouts) for i in m[:-1]]))
            for m in by_cfg.values()]


def _step_s(groups: Sequence[_Group], k: Constants, n: int) -> np.ndarray:
    """Each point's modelled step time (its fastest candidate)."""
    out = np.empty(n)
    for g in groups:
        out[g.members] = np.minimum.reduceat(estimate_time(g.cfg, g.table, k).total, g.starts)
    return out


def fit_constants(
    points: Sequence[Measured],
    base: Constants,
    names: Sequence[str] = ("gemm_efficiency", "comm_efficiency"),
    *,
    prior_sd: float | Mapping[str, float] | None = None,
    step_sd: float = 1.0,
    loss: Loss = "cauchy",
    robust_scale: float = ROBUST_SCALE,
    open_as_bound: bool = False,
    midpoint_start: bool = False,
) -> Constants:
    """The constants `names` that best explain the measured step times, starting from `base`.

    The one fit of the project: published runs (`benchmarks/accuracy.py`), the search's proposer
    (after every trial) and the refit report all call it. It is a bounded least squares over the
    logarithms of the constants (each stays positive, within `FIT_BOUNDS`, floored at 0.05) of
    the residuals log(predicted / measured step time) / `step_sd`, plus, with `prior_sd`, one
    residual (log k − log k_base) / `prior_sd` per constant: a log-normal prior around `base`
    (maximum a posteriori). `loss` is scipy's: "cauchy" (the default, scale `ROBUST_SCALE`)
    bounds the pull of a point the model cannot express, so a few odd runs do not drag every
    constant to a bound; "huber" is quadratic within `robust_scale` and linear beyond (Huber
    1964); "linear" is plain least squares (Gaussian errors).

    Args:
        points: Measured runs with their candidate layouts (the fastest candidate stands).
        base: The starting constants; every other constant is kept.
        names: The constants to fit (each must have fit bounds).
        prior_sd: Standard deviation of the log-normal prior around `base`, or None for none;
            a mapping gives each name its own (a name it lacks has no prior).
        step_sd: Standard deviation of the log step-time error (scales the data residuals).
        loss: "cauchy", "huber" or "linear".
        robust_scale: Log error where a robust loss stops being quadratic.
        open_as_bound: A point with several candidate layouts (its source left a setting
            open) bounds the model from one side only: the fastest candidate may run faster
            than the run that happened (whose settings may have been slower), never slower.
            Its residual counts only where the model predicts it slower than measured.
        midpoint_start: Also descend from the geometric midpoint of each constant's bounds
            and keep whichever end has the lower cost (the objective, prior included, is the
            same). A robust loss is flat where every residual is large, so a descent from
            `base` can stall in a plateau far from the minimum.

    Returns:
        `base` with `names` replaced by the fitted values (`base` itself without points).
    """
    if not points:
        return base
    low = np.log([max(FIT_BOUNDS[n][0], 0.05) for n in names])
    high = np.log([FIT_BOUNDS[n][1] for n in names])
    start = np.clip(np.log([getattr(base, n) for n in names]), low, high)
    measured = np.array([p.step_time_s for p in points], dtype=float)
    spread = None
    if isinstance(prior_sd, Mapping):
        spread = np.array([prior_sd.get(n, np.inf) for n in names])
    elif prior_sd is not None:
        spread = np.full(len(names), prior_sd)
    groups = _groups(points)
    bound = np.array([open_as_bound and len(p.layouts) > 1 for p in points])

    def constants(x: np.ndarray) -> Constants:
        return base.model_copy(update=dict(zip(names, map(float, np.exp(x)), strict=True)))

    def residuals(x: np.ndarray) -> np.ndarray:
        data: np.ndarray = np.log(_step_s(groups, constants(x), len(points)) / measured)
        data = np.where(bound, np.maximum(data, 0.0), data) / step_sd
        if spread is None:
            return data
        return np.concatenate([data, (x - start) / spread])

    scale = robust_scale / step_sd if loss != "linear" else 1.0
    starts = [start, (low + high) / 2] if midpoint_start else [start]
    results = [least_squares(residuals, x0, bounds=(low, high), x_scale="jac", loss=loss,
                             f_scale=scale) for x0 in starts]
    return constants(min(results, key=lambda r: float(r.cost)).x)


def fit_trials(
    cfg: AutotuneConfig,
    layouts: Sequence[Layout],
    step_time_s: Sequence[float],
    base: Constants,
    names: Sequence[str] = TRIAL_REFIT,
    step_sd: float = STEP_SD,
    clip: float | None = None,
) -> Constants:
    """`fit_constants` as a study applies it to its own measured trials: `names` under the
    log-normal prior `PRIOR_LOG_SD` around `base`, Gaussian errors of σ `step_sd` (`STEP_SD`;
    the search adds the model's discrepancy, so that one trial's miss is not all blamed on the
    constants); with `clip`, a residual beyond `clip` σ pulls no harder than one at `clip` σ
    (Huber loss), so a layout the constants cannot express (ZeRO-3 gathers over half-rate
    NICs, 6x slower) does not move every layout's constants by its whole miss. The search's
    proposer ranks with it after each trial, and the refit report shows the same fit."""
    points = [Measured(f"trial {i}", cfg, (layout,), float(step), cfg.cluster.gpu.name)
              for i, (layout, step) in enumerate(zip(layouts, step_time_s, strict=True))]
    return fit_constants(points, base, names, prior_sd=PRIOR_LOG_SD, step_sd=step_sd,
                         loss="linear" if clip is None else "huber",
                         robust_scale=(clip or 0.0) * step_sd)


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
