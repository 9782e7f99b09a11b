"""A measurement that cannot be one is a crash, and every trial that ran holds its layout."""

from __future__ import annotations

import math
from pathlib import Path

import optuna
import pytest
from hypothesis import given
from hypothesis import strategies as st
from optuna.trial import TrialState

from autotune.measurement import Measurement
from autotune.measurement import validated
from autotune.runners.base import Runner
from autotune.runners.base import TrialPlan
from autotune.runners.command import CommandRunner
from autotune.search.settings import TuneSettings
from autotune.search.study import tune
from autotune.space.search_space import load_space
from autotune.specs.inputs import load_config

SMALL = load_config("gpt3-1.3b", "dgx-a100:1")
SPACE = load_space(None, "megatron").model_copy(
    update={"tp": [1], "pp": [1], "cp": [1], "vpp": [1], "zero": [1, 2, 3],
            "offload": ["none"], "mbs": [1, 2], "recompute": ["selective"], "sp": [False]}
)
"""Six layouts: ZeRO 1-3 × micro-batch 1, 2."""

BAD_OUTPUTS = {
    "nan": ('{"step_time_s": NaN}', "step_time_s = nan"),
    "string": ('{"step_time_s": "fast"}', "'fast'"),
    "zero": ('{"step_time_s": 0}', "step_time_s = 0 is not a positive finite number"),
    "negative": ('{"tokens_per_s": -5000}', "is not a positive finite number"),
    "infinite": ('{"tokens_per_s": Infinity}', "tokens_per_s = inf is not a positive finite"),
}
"""What a command prints, and a fragment of the reason its trial must carry."""


@pytest.mark.parametrize(("output", "reason"), BAD_OUTPUTS.values(), ids=list(BAD_OUTPUTS))
def test_a_command_printing_a_bad_figure_runs_each_layout_once(
    tmp_path: Path, output: str, reason: str
) -> None:
    """Oracle: a real subprocess prints the figure; Optuna's own storage holds the trials.

    Before, NaN made Optuna fail the trial, which freed the layout: the same layouts ran until
    the cap (37 trials for --trials 2), and a negative throughput was accepted as ok.
    """
    script = tmp_path / "trial.sh"
    script.write_text(f"echo '{output}'\n")
    runner = CommandRunner(f"bash {script} {{layout}}", timeout_s=30)

    result = tune(SMALL, SPACE, runner, TuneSettings(trials=2, render=False), tmp_path / "out")

    study = optuna.load_study(study_name=result.study_name, storage=result.storage)
    trials = study.get_trials()
    assert len(trials) == 2
    assert all(t.state == TrialState.COMPLETE and t.value == 0.0 for t in trials)
    assert [t.user_attrs["status"] for t in trials] == ["crash", "crash"]
    assert all(reason in t.user_attrs["reason"] for t in trials), trials[0].user_attrs["reason"]
    assert len({t.user_attrs["layout_id"] for t in trials}) == 2
    assert result.ranked == []


class _Raises(Runner):
    name = "raising"

    def check(self, cfg) -> None:
        """Every problem is fine (the failure comes at run time)."""

    def run(self, plan: TrialPlan) -> Measurement:
        raise RuntimeError(f"driver lost on {plan.layout.id}")


def test_a_runner_that_raises_makes_crash_trials_that_hold_their_layouts(tmp_path: Path) -> None:
    """Oracle: Optuna's storage (states, attributes) after a runner that always raises."""
    result = tune(SMALL, SPACE, _Raises(),
        TuneSettings(trials=3, storage="memory", render=False), tmp_path)
    ran = [r for r in result.records if r.get("ran")]
    assert len(result.records) == len(ran) == 3
    assert all(r["state"] == "COMPLETE" and r["status"] == "crash" for r in ran)
    assert all("RuntimeError: driver lost on" in r["reason"] for r in ran)
    assert len({r["layout_id"] for r in ran}) == 3


numbers = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True), st.integers(-10, 10), st.text(max_size=3),
    st.booleans(), st.none(),
)


@given(step=numbers, rate=numbers)
def test_an_ok_trial_stands_only_on_positive_finite_figures(step, rate) -> None:
    """Property (the contract of a measurement): an ok trial whose step time or throughput is
    given but not a positive finite number, or that gives neither, is a crash; otherwise ok."""

    def usable(x) -> bool:
        number = isinstance(x, int | float) and not isinstance(x, bool)
        return number and math.isfinite(x) and x > 0

    given_values = [x for x in (step, rate) if x is not None]
    expected_ok = bool(given_values) and all(usable(x) for x in given_values)

    result = validated(Measurement("ok", step_time_s=step, tokens_per_s=rate))

    assert result.status == ("ok" if expected_ok else "crash")
    if not expected_ok:
        assert result.reason.startswith("invalid measurement:")


def test_unusable_optional_figures_are_dropped_and_named() -> None:
    """Oracle: hand-written values; a NaN peak must not turn a good run into a crash."""
    m = Measurement("ok", step_time_s=2.0, tokens_per_s=100.0, peak_memory_bytes=math.nan,
                    mfu=-0.5, step_time_spread=0.1)
    result = validated(m)
    assert result.status == "ok" and result.step_time_s == 2.0
    assert result.peak_memory_bytes is None and result.mfu is None
    assert result.step_time_spread == 0.1
    assert result.extra["dropped"] == {"peak_memory_bytes": "nan", "mfu": "-0.5"}
    assert validated(Measurement("exploded")).reason == "unknown status 'exploded'"
