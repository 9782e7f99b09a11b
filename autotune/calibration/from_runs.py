"""Calibrate from the user's own measured runs: a CSV/JSON of layouts and step times, or a
study folder, refitted with the one step-time fit (`autotune.calibration.fit.fit_constants`).

A runs file has one row per run: `layout` (as `--layout` takes it, e.g. `tp=2,pp=1,mbs=4`) and
`step_time_s` (measured, seconds per optimizer step). A study folder (`autotune tune --out`,
read by the CLI) gives its trials that ran through (`status` ok) with their measured step time.

Example:
    >>> from autotune.calibration.from_runs import calibrate_from_runs
    >>> # calibration = calibrate_from_runs(cfg, Path("runs.csv"))
"""

from __future__ import annotations

import csv
import datetime
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from autotune.calibration.file import Calibration
from autotune.calibration.file import FittedConstant
from autotune.calibration.file import Point
from autotune.calibration.file import software_stack
from autotune.calibration.fit import TRIAL_REFIT
from autotune.calibration.fit import Measured
from autotune.calibration.fit import at_bounds
from autotune.calibration.fit import fit_constants
from autotune.costmodel.constants import Constants
from autotune.costmodel.constants import constants_for
from autotune.costmodel.estimate import evaluate
from autotune.exceptions import AutotuneError
from autotune.frameworks import framework_of
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.specs import AutotuneConfig
from autotune.specs.inputs import read_structured


def _rows(path: Path) -> list[dict[str, Any]]:
    """The rows of a runs CSV or JSON (a list of objects, or {"runs": [...]})."""
    if path.suffix == ".csv":
        with path.open(newline="") as handle:
            return list(csv.DictReader(handle))
    data = read_structured(path)
    rows = data.get("runs") if isinstance(data, dict) else data
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        raise AutotuneError(f"--from-runs {path}: expected a list of {{layout, step_time_s}}")
    return rows


def runs_from_file(cfg: AutotuneConfig, path: Path) -> list[tuple[Layout, float]]:
    """(layout, measured step seconds) of each row.

    Raises:
        AutotuneError: a row without a parsable layout or a positive step time (row named).
    """
    runs = []
    for number, row in enumerate(_rows(path), 1):
        text, value = row.get("layout"), row.get("step_time_s")
        if not isinstance(text, str) or not text:
            raise AutotuneError(f"--from-runs {path}: row {number}: layout missing; write e.g. "
                                "tp=2,pp=1,mbs=4")
        try:
            step = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            step = float("nan")
        if not np.isfinite(step) or step <= 0:
            raise AutotuneError(f"--from-runs {path}: row {number}: step_time_s = {value!r} "
                                "must be a positive number of seconds")
        layout = Layout.parse(text, cfg.world_size, cfg.train.global_batch_size,
                              framework_of(cfg))
        runs.append((layout, step))
    return runs


UNIDENTIFIED = 0.1
"""A refitted constant whose relative standard error exceeds this is named in a warning: the
runs barely move it, so its value is mostly their noise."""


def relative_stderr(cfg: AutotuneConfig, table: LayoutTable, fitted: Constants,
                    names: Sequence[str], log_residuals: np.ndarray) -> np.ndarray:
    """1σ relative error of each fitted constant: J = d log(step) / d log(constant) by finite
    differences at the fit, σ² = Σ r² / (n − p) of the log residuals, cov = σ² (JᵀJ)⁻¹ (the
    Gauss-Newton covariance of least squares; with noise of σ it is the Cramér-Rao bound)."""
    step = 1e-3
    base = np.log(np.asarray(evaluate(cfg, table, fitted).step_time_s))
    columns = []
    for name in names:
        moved = fitted.model_copy(update={name: getattr(fitted, name) * np.exp(step)})
        columns.append((np.log(np.asarray(evaluate(cfg, table, moved).step_time_s)) - base)
                       / step)
    jacobian = np.stack(columns, axis=1)
    dof = max(len(log_residuals) - len(names), 1)
    variance = float(np.sum(log_residuals ** 2)) / dof
    covariance = variance * np.linalg.pinv(jacobian.T @ jacobian)
    stderr: np.ndarray = np.sqrt(np.maximum(np.diag(covariance), 0.0))
    return stderr


def calibrate_from_runs(cfg: AutotuneConfig, runs: Sequence[tuple[Layout, float]],
                        source: str, names: Sequence[str] = TRIAL_REFIT) -> Calibration:
    """Refit `names` to the runs (`fit_constants`, the search's fit) and write them with their
    residuals; a constant on its bound is named in `warnings`.

    Raises:
        AutotuneError: fewer runs than constants to fit.
    """
    if len(runs) < len(names):
        raise AutotuneError(
            f"--from-runs {source}: {len(runs)} measured runs cannot fit {len(names)} constants "
            f"({', '.join(names)}); measure at least {len(names)} layouts")
    gpu = cfg.cluster.gpu
    base = constants_for(gpu, cfg.train.software_stack)
    points = [Measured(f"run {i}", cfg, (layout,), step, gpu.name, source=source)
              for i, (layout, step) in enumerate(runs)]
    fitted = fit_constants(points, base, names)
    table = LayoutTable.from_layouts([layout for layout, _ in runs])
    predicted = np.asarray(evaluate(cfg, table, fitted).step_time_s)
    measured = np.array([step for _, step in runs])
    errors = np.abs(predicted / measured - 1)
    bounds = {name: side for name, side, _ in at_bounds(fitted, names)}
    stderr = relative_stderr(cfg, table, fitted, names, np.log(predicted / measured))
    constants = {
        name: FittedConstant(value=float(getattr(fitted, name)), before=float(getattr(base, name)),
                             points=len(runs), median_residual=float(np.median(errors)),
                             max_residual=float(np.max(errors)), at_bound=bounds.get(name),
                             stderr=float(se))
        for name, se in zip(names, stderr, strict=True)}
    tokens = cfg.train.global_batch_size * cfg.train.seq_length
    steps = [Point(kind="step", op=layout.text, seconds=step, rate=tokens / step,
                   predicted_s=float(p))
             for (layout, step), p in zip(runs, predicted, strict=True)]
    warnings = [f"{name} = {getattr(fitted, name):.4g} sits on its {side} bound: the model "
                "lacks a term these runs need" for name, side in bounds.items()]
    warnings += [f"{name} = {c.value:.4g} ± {c.stderr:.0%} (1σ): these runs barely move it; "
                 "add runs whose step time depends on it" for name, c in constants.items()
                 if c.stderr is not None and c.stderr > UNIDENTIFIED and not c.at_bound]
    return Calibration(
        created=datetime.datetime.now(datetime.UTC).replace(microsecond=0), source="runs",
        cluster=cfg.cluster.name, gpu=gpu.model_copy(update={"constants": {}, "calibration": ""}),
        software=software_stack(), framework=cfg.train.framework, points=steps,
        constants=constants, warnings=warnings)
