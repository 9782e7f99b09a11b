"""Model and measurement meet: refit the model's constants to a study's trials and re-rank.

`refit_study` takes the records of a study (`autotune.search.study.TuneResult.records`), fits a few
physical constants (`autotune.calibration.fit.fit_constants`, least squares on log step time) to
the trials that measured a step time, reports the prediction error before and after the fit, ranks
the feasible layouts not tried yet under the fitted model, and flags trials whose memory outcome
contradicts the model (predicted to fit but out of memory, or predicted not to fit but ran).

Example:
    >>> from autotune.search.refit import refit_study
    >>> # report = refit_study(cfg, result.records, space=space); print(report.table())
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np

from autotune.calibration.fit import TRIAL_REFIT
from autotune.calibration.fit import Measured
from autotune.calibration.fit import fit_trials
from autotune.costmodel.constants import Constants
from autotune.costmodel.constants import constants_for
from autotune.costmodel.estimate import evaluate
from autotune.costmodel.memory import usable_gpu_bytes
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.search.proposal import Outcome
from autotune.search.proposal import Proposer
from autotune.search.record import measured_figure
from autotune.search.record import predicted_figure
from autotune.search.record import ran
from autotune.search.record import record_layout
from autotune.space.search_space import SearchSpace
from autotune.space.search_space import enumerate_layouts
from autotune.space.search_space import load_space
from autotune.specs import AutotuneConfig
from autotune.units import GIB


@dataclasses.dataclass(frozen=True)
class TrialFit:
    """One measured trial: its step time as measured, predicted, and predicted after the fit."""

    number: int
    layout: str
    measured_step_s: float
    predicted_step_s: float
    fitted_step_s: float
    measured_peak_bytes: float | None
    predicted_peak_bytes: float | None

    @property
    def error_before(self) -> float:
        """Relative step-time error of the prediction (predicted / measured - 1)."""
        return self.predicted_step_s / self.measured_step_s - 1

    @property
    def error_after(self) -> float:
        """Relative step-time error with the fitted constants."""
        return self.fitted_step_s / self.measured_step_s - 1


@dataclasses.dataclass(frozen=True)
class MemoryFlag:
    """A trial whose memory outcome contradicts the model."""

    number: int
    layout: str
    status: str
    predicted_peak_bytes: float
    usable_bytes: float
    message: str


@dataclasses.dataclass(frozen=True)
class Candidate:
    """An untried feasible layout, as the fitted model ranks it."""

    layout: Layout
    predicted_step_s: float
    """With the constants the study started from."""
    fitted_step_s: float
    fitted_tokens_per_s: float


@dataclasses.dataclass(frozen=True)
class RefitReport:
    """Prediction against measurement for one study, before and after refitting."""

    names: tuple[str, ...]
    before: Constants
    after: Constants
    trials: list[TrialFit]
    memory_flags: list[MemoryFlag]
    untried: list[Candidate]
    failures: dict[str, int]
    """How many trials ended in each status (ok and every failure class)."""

    @property
    def fitted(self) -> bool:
        """True when enough trials measured a step time for a fit (two or more)."""
        return len(self.trials) >= 2

    def error_stats(self) -> dict[str, float | None]:
        """Median and max |relative step-time error| before and after the fit."""
        before = [abs(t.error_before) for t in self.trials]
        after = [abs(t.error_after) for t in self.trials]
        return {
            "median_abs_error_before": statistics.median(before) if before else None,
            "max_abs_error_before": max(before) if before else None,
            "median_abs_error_after": statistics.median(after) if after else None,
            "max_abs_error_after": max(after) if after else None,
        }

    def to_dict(self) -> dict[str, Any]:
        """JSON form (for results files and the CLI's --json)."""
        return {
            "constants": list(self.names),
            "before": {n: getattr(self.before, n) for n in self.names},
            "after": {n: getattr(self.after, n) for n in self.names},
            "errors": self.error_stats(),
            "trials": [
                {
                    **dataclasses.asdict(t),
                    "error_before": t.error_before,
                    "error_after": t.error_after,
                }
                for t in self.trials
            ],
            "memory_flags": [dataclasses.asdict(f) for f in self.memory_flags],
            "untried": [
                {
                    "layout": c.layout.text,
                    "predicted_step_s": c.predicted_step_s,
                    "fitted_step_s": c.fitted_step_s,
                    "fitted_tokens_per_s": c.fitted_tokens_per_s,
                }
                for c in self.untried
            ],
            "failures": dict(self.failures),
        }

    def table(self) -> str:
        """A Markdown summary: trials, errors, constants, memory flags, next layouts."""
        lines = [
            "| trial | layout | measured step (s) | predicted (s) | fitted (s) | "
            "measured peak (GiB) | predicted peak (GiB) |",
            "|---|---|---|---|---|---|---|",
        ]
        for t in self.trials:
            lines.append(
                f"| {t.number} | {t.layout} | {t.measured_step_s:.3f} | {t.predicted_step_s:.3f}"
                f" | {t.fitted_step_s:.3f} | {_gib(t.measured_peak_bytes)} | "
                f"{_gib(t.predicted_peak_bytes)} |"
            )
        stats = self.error_stats()
        if stats["median_abs_error_before"] is not None:
            lines.append("")
            lines.append(
                f"step-time error |predicted/measured - 1|: median "
                f"{stats['median_abs_error_before']:.1%}, max {stats['max_abs_error_before']:.1%}"
                f" before the fit; median {stats['median_abs_error_after']:.1%}, max "
                f"{stats['max_abs_error_after']:.1%} after"
            )
        if self.fitted:
            fitted = ", ".join(
                f"{n} {getattr(self.before, n):.4g} -> {getattr(self.after, n):.4g}"
                for n in self.names
            )
            lines.append(f"fitted constants: {fitted}")
        if self.failures:
            lines.append(
                "trials by status: "
                + ", ".join(f"{status} {count}" for status, count in sorted(self.failures.items()))
            )
        for flag in self.memory_flags:
            lines.append(f"memory: trial {flag.number} ({flag.layout}): {flag.message}")
        if self.untried:
            lines.append("")
            lines.append("next untried layouts under the fitted model:")
            for c in self.untried:
                lines.append(
                    f"- {c.layout.text}: {c.fitted_step_s:.3f} s (was "
                    f"{c.predicted_step_s:.3f} s), {c.fitted_tokens_per_s:.0f} tok/s"
                )
        return "\n".join(lines)


def _gib(value: float | None) -> str:
    return f"{value / GIB:.2f}" if value else "-"




def _step_s(cfg: AutotuneConfig, layouts: Sequence[Layout], k: Constants) -> np.ndarray:
    return np.asarray(evaluate(cfg, LayoutTable.from_layouts(layouts), k).step_time_s)


def memory_flags(
    cfg: AutotuneConfig, records: Iterable[Mapping[str, Any]], k: Constants
) -> list[MemoryFlag]:
    """Trials that ran out of memory though predicted to fit, or ran though predicted not to."""
    usable = usable_gpu_bytes(cfg, k)
    flags = []
    for record in records:
        predicted = predicted_figure(record, "peak_memory_bytes")
        status = str(record.get("status"))
        if not ran(record) or predicted is None or status not in ("ok", "oom"):
            continue
        fits = float(predicted) <= usable
        if status == "oom" and fits:
            message = (
                f"predicted to fit ({predicted / GIB:.2f} of {usable / GIB:.2f} GiB) "
                "but ran out of memory"
            )
        elif status == "ok" and not fits:
            message = (
                f"predicted not to fit ({predicted / GIB:.2f} > {usable / GIB:.2f} GiB) but ran"
            )
        else:
            continue
        flags.append(
            MemoryFlag(
                int(record["number"]),
                str(record.get("layout", "")),
                status,
                float(predicted),
                usable,
                message,
            )
        )
    return flags


def refit_study(
    cfg: AutotuneConfig,
    records: Sequence[Mapping[str, Any]],
    *,
    space: SearchSpace | None = None,
    k: Constants | None = None,
    names: Sequence[str] = TRIAL_REFIT,
    top: int = 10,
) -> RefitReport:
    """Compare predicted with measured step times, refit `names`, and re-rank untried layouts.

    Args:
        cfg: The study's model, cluster and training setup.
        records: The study's trial records (`TuneResult.records` or `search.trial_records`).
        space: The study's search space (default: the framework's bundled one), for re-ranking.
        k: Constants the study started from (default: the GPU's calibrated ones).
        names: Constants to fit (bounds in `autotune.calibration.fit.FIT_BOUNDS`); the
            search's own (`TRIAL_REFIT`) are fitted as the search fitted them (`Proposer`:
            `fit_trials` with each trial's σ widened by the model's out-of-sample misses).
        top: How many untried layouts to list.

    Returns:
        The report; with fewer than two measured trials nothing is fitted (after == before).
    """
    base = k or constants_for(cfg.cluster.gpu, cfg.train.software_stack)
    measured = [
        r for r in records
        if ran(r) and r.get("status") == "ok" and measured_figure(r, "step_time_s")
    ]
    layouts = [record_layout(r) for r in measured]
    points = [
        Measured(
            f"trial {r['number']}",
            cfg,
            (lay,),
            float(r["measured_step_time_s"]),
            cfg.cluster.gpu.name,
        )
        for r, lay in zip(measured, layouts, strict=True)
        if lay is not None
    ]
    after = base
    if len(points) >= 2 and tuple(names) == TRIAL_REFIT:  # the fit the search ranked with
        searched = (space or load_space(None, cfg.train.framework)).resolved(cfg)
        proposer = Proposer(cfg, enumerate_layouts(cfg, searched, base).feasible, base)
        ordered = sorted(measured, key=lambda r: int(r["number"]))  # the order it saw them
        after = proposer.fitted([Outcome.from_record(r) for r in ordered])[0]
    elif len(points) >= 2:
        after = fit_trials(cfg, [p.layouts[0] for p in points],
                           [p.step_time_s for p in points], base, tuple(names))
    trials: list[TrialFit] = []
    if points:
        ok_layouts = [p.layouts[0] for p in points]
        before_s, after_s = _step_s(cfg, ok_layouts, base), _step_s(cfg, ok_layouts, after)
        for i, (record, point) in enumerate(zip(measured, points, strict=True)):
            predicted_peak = predicted_figure(record, "peak_memory_bytes")
            trials.append(
                TrialFit(
                    int(record["number"]),
                    point.layouts[0].text,
                    point.step_time_s,
                    float(before_s[i]),
                    float(after_s[i]),
                    measured_figure(record, "peak_memory_bytes"),
                    float(predicted_peak) if predicted_peak is not None else None,
                )
            )
    failures: dict[str, int] = {}
    for record in records:
        if ran(record):
            status = str(record.get("status"))
            failures[status] = failures.get(status, 0) + 1
    return RefitReport(
        names=tuple(names),
        before=base,
        after=after,
        trials=trials,
        memory_flags=memory_flags(cfg, records, base),
        untried=_untried(cfg, records, space, base, after, top),
        failures=failures,
    )


def _untried(
    cfg: AutotuneConfig,
    records: Sequence[Mapping[str, Any]],
    space: SearchSpace | None,
    base: Constants,
    after: Constants,
    top: int,
) -> list[Candidate]:
    """The fastest feasible layouts under the fitted model that no trial ran."""
    space = space or load_space(None, cfg.train.framework)
    feasible = enumerate_layouts(cfg, space, base).feasible
    if not len(feasible):
        return []
    tried = {str(r.get("layout_id")) for r in records if ran(r)}
    fitted = evaluate(cfg, feasible, after)
    original = evaluate(cfg, feasible, base).step_time_s
    order = np.argsort(fitted.step_time_s, kind="stable")
    result = []
    for index in order:
        layout = feasible.row(int(index))
        if layout.id in tried:
            continue
        result.append(
            Candidate(
                layout,
                float(original[index]),
                float(fitted.step_time_s[index]),
                float(fitted.tokens_per_s[index]),
            )
        )
        if len(result) >= top:
            break
    return result
