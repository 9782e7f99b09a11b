"""A reusable pytest suite every `Runner` must pass (the pattern of Optuna's StorageTestCase).

Subclass `RunnerContract` in a test module and provide four fixtures:

- `problem`: an `AutotuneConfig` the runner can run here;
- `runner`: a fresh runner for `problem` (the suite calls `prepare`/`cleanup` itself);
- `ok_layout`: a layout of `problem` whose trial measures a throughput;
- `failing`: `(runner, layout)` whose trial fails for a reason the runner can tell (a failure
  class other than ok), e.g. a program that exits with an error;
- `refused`: an `AutotuneConfig` that `runner.check` must refuse with AutotuneError.

Every trial runs through `autotune.trial.TrialPipeline`, as `tune` and `scale` run them.

Example:
    >>> class TestSimulate(RunnerContract):  # in tests/runners_tests/test_simulate.py
    ...     @pytest.fixture
    ...     def runner(self): return SimulateRunner()
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from autotune.exceptions import AutotuneError
from autotune.layout import Layout
from autotune.measurement import STATUSES
from autotune.runners.base import Runner
from autotune.specs import AutotuneConfig
from autotune.trial import TrialPipeline
from autotune.trial import TrialResult


def run_trial(runner: Runner, cfg: AutotuneConfig, layout: Layout, directory: Path,
              stop_after: int | None = None) -> TrialResult:
    """One trial through the pipeline; with `stop_after`, the pruner asks to stop once that
    many intermediate reports arrived."""
    reports: list[tuple[int, float]] = []

    def report(step: int, tokens_per_s: float) -> bool:
        reports.append((step, tokens_per_s))
        return stop_after is not None and len(reports) >= stop_after

    pipeline = TrialPipeline(cfg, runner)
    assert pipeline.violations(layout) == [], "the contract's layouts must pass the rules"
    runner.prepare()
    try:
        return pipeline.run(layout, number=0, directory=directory, report=report)
    finally:
        runner.cleanup()


class RunnerContract:
    """The runner contract (see the module docstring for the fixtures to provide)."""

    def test_check_accepts_what_it_can_run(self, runner: Runner, problem: AutotuneConfig) -> None:
        """check() is silent for a problem the runner can run."""
        runner.check(problem)

    def test_check_refuses_with_one_clear_error(self, runner: Runner,
                                                refused: AutotuneConfig) -> None:
        """check() refuses before any trial, with AutotuneError naming an option to change."""
        with pytest.raises(AutotuneError, match=r"--[a-z]"):
            runner.check(refused)

    def test_ok_trial_measures_consistent_figures(
        self, runner: Runner, problem: AutotuneConfig, ok_layout: Layout, tmp_path: Path
    ) -> None:
        """An ok trial: finite positive step time; tokens/s = tokens per step / step time;
        MFU = TFLOP/s per GPU / the GPU's peak; a non-negative step-time spread."""
        m = run_trial(runner, problem, ok_layout, tmp_path / "ok").measurement
        assert m.status == "ok", m.reason
        assert m.step_time_s is not None and math.isfinite(m.step_time_s) and m.step_time_s > 0
        assert m.tokens_per_s == pytest.approx(problem.train.tokens_per_step / m.step_time_s,
                                               rel=1e-6)
        peak = problem.cluster.gpu.peak_tflops[problem.train.precision]
        assert m.tflops_per_gpu is not None and m.mfu == pytest.approx(m.tflops_per_gpu / peak)
        assert m.step_time_spread is not None and m.step_time_spread >= 0

    def test_failed_trial_is_a_status_not_an_exception(
        self, failing: tuple[Runner, Layout], problem: AutotuneConfig, tmp_path: Path
    ) -> None:
        """A failing trial returns a failure class with a reason; it never raises."""
        runner, layout = failing
        m = run_trial(runner, problem, layout, tmp_path / "failed").measurement
        assert m.status in STATUSES and m.status not in ("ok", "pruned"), m
        assert m.reason and not m.ok

    def test_pruner_stops_the_trial(
        self, runner: Runner, problem: AutotuneConfig, ok_layout: Layout, tmp_path: Path
    ) -> None:
        """When the report callback asks to stop, the trial ends as `pruned`."""
        m = run_trial(runner, problem, ok_layout, tmp_path / "pruned", stop_after=1).measurement
        assert m.status == "pruned", m

    def test_lifecycle_hooks_are_repeatable(self, runner: Runner) -> None:
        """prepare() and cleanup() may run twice, and cleanup() without a trial."""
        for _ in range(2):
            runner.prepare()
            runner.cleanup()
