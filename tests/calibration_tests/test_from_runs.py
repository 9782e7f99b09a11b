"""Calibrate from own runs: the refit reproduces the constants that made the step times."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np
import pytest

from autotune.calibration.fit import TRIAL_REFIT
from autotune.calibration.from_runs import calibrate_from_runs
from autotune.calibration.from_runs import runs_from_file
from autotune.costmodel.constants import constants_for
from autotune.costmodel.estimate import evaluate
from autotune.exceptions import AutotuneError
from autotune.layout import LayoutTable
from autotune.space.search_space import enumerate_layouts
from autotune.space.search_space import load_space
from autotune.specs.inputs import load_config

TRUTH = {"gemm_efficiency": 0.62, "gemm_half_size": 1500.0, "elementwise_passes": 2.2,
         "comm_efficiency": 0.7}
"""The constants the test's 'cluster' runs with (all inside FIT_BOUNDS, away from the preset)."""


def _runs(noise: float, count: int = 120, seed: int = 2, skip: int = 0
          ) -> tuple[list, np.ndarray, np.ndarray]:
    """`count` layouts (after the first `skip` of a fixed shuffle), their step times with TRUTH
    (the oracle) and those times times (1 + N(0, noise))."""
    cfg = load_config("llama3-8b", "dgx-h100:4")
    feasible = enumerate_layouts(cfg, load_space(None, cfg.train.framework)).feasible
    rows = np.random.default_rng(1).permutation(len(feasible))[skip:skip + count]
    layouts = [feasible.row(int(i)) for i in rows]
    truth = constants_for(cfg.cluster.gpu, cfg.train.software_stack).model_copy(update=TRUTH)
    steps = evaluate(cfg, LayoutTable.from_layouts(layouts), truth).step_time_s
    noisy = steps * (1 + np.random.default_rng(seed).normal(0, noise, len(steps)))
    return layouts, steps, noisy


def _write_runs(path: Path, noise: float, count: int = 120) -> None:
    layouts, _, noisy = _runs(noise, count)
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["layout", "step_time_s"])
        writer.writerows([lay.text, f"{s:.6g}"] for lay, s in zip(layouts, noisy, strict=True))


def test_refit_reproduces_known_constants(tmp_path: Path) -> None:
    """Oracle: 120 layouts' step times generated with TRUTH, written to a runs file; the refit
    of the four trial constants recovers them (0.1 %) and says each is well identified."""
    path = tmp_path / "runs.csv"
    _write_runs(path, noise=0.0)
    cfg = load_config("llama3-8b", "dgx-h100:4")
    calibration = calibrate_from_runs(cfg, runs_from_file(cfg, path), str(path))
    for name in TRIAL_REFIT:
        assert calibration.constants[name].value == pytest.approx(TRUTH[name], rel=1e-3)
        assert calibration.constants[name].stderr < 1e-3
    assert calibration.framework == cfg.train.framework and calibration.source == "runs"
    assert calibration.constants["gemm_efficiency"].median_residual <= 1e-4
    assert not calibration.warnings


def test_noisy_refit_is_as_close_as_its_runs_identify_and_predicts_new_layouts() -> None:
    """Oracle: step times generated with TRUTH times 1 + N(0, 2 %). How close a constant can
    come is set by how much the runs' step times depend on it (the Cramér-Rao bound): on these
    120 random layouts of llama3-8b on 4 H100 nodes it is about 1.4 % (1σ) for gemm_efficiency,
    2.1 % for elementwise_passes, 1.9 % for comm_efficiency and 6.2 % for gemm_half_size (with
    the H100 + Megatron-Core constants fitted on NVIDIA's stated runs), so no fit reproduces all
    four within 2 %, and gemm_efficiency itself lands 2.0 % off with this noise draw. Each
    refitted constant lies within 3 of its reported standard errors of the truth, the errors
    are that bound (not 0, not many times it), and the refit predicts 60 layouts it never saw
    within 0.5 % median, 2 % max, of their true step time (0.16 % and 0.66 % measured):
    the constants trade off, the predictions do not."""
    cfg = load_config("llama3-8b", "dgx-h100:4")
    layouts, _, noisy = _runs(0.02)
    calibration = calibrate_from_runs(cfg, list(zip(layouts, noisy, strict=True)), "noisy")
    for name in TRIAL_REFIT:
        fitted = calibration.constants[name]
        assert 0.005 < fitted.stderr < 0.15, name
        assert abs(np.log(fitted.value / TRUTH[name])) < 3 * fitted.stderr, name
    assert calibration.constants["gemm_efficiency"].stderr < 0.02  # identified within 2 % (1σ)
    unseen, truth_s, _ = _runs(0.0, count=60, skip=120)
    k = constants_for(cfg.cluster.gpu, cfg.train.software_stack).model_copy(
        update=calibration.values())
    predicted = evaluate(cfg, LayoutTable.from_layouts(unseen), k).step_time_s
    errors = np.abs(predicted / truth_s - 1)
    assert np.median(errors) < 0.005 and np.max(errors) < 0.02


def test_constant_on_bound_is_warned(tmp_path: Path) -> None:
    """Step times 3x the preset model's: GEMMs cannot be that slow within the physical bounds,
    so gemm_efficiency lands on its lower bound and the file says so."""
    cfg = load_config("llama3-8b", "dgx-h100:4")
    feasible = enumerate_layouts(cfg, load_space(None, cfg.train.framework)).feasible
    layouts = [feasible.row(i) for i in range(0, len(feasible), max(1, len(feasible) // 8))][:8]
    steps = 3 * evaluate(cfg, LayoutTable.from_layouts(layouts)).step_time_s
    calibration = calibrate_from_runs(cfg, list(zip(layouts, steps, strict=True)), "slow")
    assert calibration.constants["gemm_efficiency"].at_bound == "lower"
    assert any(w.startswith("gemm_efficiency") and "lower bound" in w
               for w in calibration.warnings)


def test_bad_row_is_one_line(tmp_path: Path) -> None:
    """A row without a positive step time names the row, the value and the fix."""
    path = tmp_path / "runs.csv"
    path.write_text("layout,step_time_s\ntp=1,1.5\ntp=2,-1\n")
    cfg = load_config("llama3-8b", "dgx-h100:4")
    with pytest.raises(AutotuneError, match="row 2: step_time_s = '-1'"):
        runs_from_file(cfg, path)
