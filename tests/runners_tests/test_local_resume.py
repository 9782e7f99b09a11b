"""SIGKILL the tuner in the middle of a local study, then resume it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import optuna
import pytest
from helpers_runners import SPACE
from helpers_runners import leftovers
from helpers_runners import pin_trials

from autotune.layout import Layout
from autotune.runners.local import LocalRunner
from autotune.search.settings import TuneSettings
from autotune.search.storage import default_storage_url
from autotune.search.study import default_study_name
from autotune.search.study import tune
from autotune.specs import AutotuneConfig

LAYOUTS = [
    Layout(dp=2, zero=0, mbs=4, gas=1),
    Layout(dp=2, zero=1, mbs=4, gas=1),
    Layout(dp=2, zero=2, mbs=4, gas=1),
]
RUNNER = dict(steps=4, warmup=1, hang_timeout_s=120, startup_timeout_s=600)

DRIVER = """
import sys
from pathlib import Path
from helpers_runners import SPACE, tiny_config
from autotune.runners.local import LocalRunner
from autotune.search.settings import TuneSettings
from autotune.search.study import tune

out = Path(sys.argv[1])
tune(tiny_config(), SPACE, LocalRunner(**{runner!r}),
     TuneSettings(trials=3, resume=True, top_k=0, pruner_tolerance=1.0), out)
"""


def _wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def _trials(out: Path, cfg: AutotuneConfig) -> list[optuna.trial.FrozenTrial]:
    try:
        study = optuna.load_study(
            study_name=default_study_name(cfg), storage=default_storage_url(out)
        )
        return study.get_trials(deepcopy=False)
    except Exception:  # the driver may hold the SQLite write lock for a moment
        return []


def _second_trial_is_training(out: Path, cfg: AutotuneConfig) -> bool:
    trials = _trials(out, cfg)
    if len(trials) < 2 or trials[0].state != optuna.trial.TrialState.COMPLETE:
        return False
    folder = trials[1].user_attrs.get("trial_dir")
    metrics = Path(folder) / "metrics.jsonl" if folder else None
    return bool(metrics and metrics.exists() and '"step"' in metrics.read_text())


@pytest.mark.slow
def test_sigkill_mid_study_then_resume(tmp_path: Path, cfg: AutotuneConfig) -> None:
    """Oracle: a real SIGKILL of a real tuner process in the middle of a real DeepSpeed trial, then
    Optuna's stored study: the finished trial is kept as it was, the interrupted one failed and
    ran again, and no process is left."""
    out = tmp_path / "study"
    pin_trials(out, cfg, SPACE, LAYOUTS)
    driver = tmp_path / "driver.py"
    driver.write_text(textwrap.dedent(DRIVER.format(runner=RUNNER)))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]
        ),
    }
    tuner = subprocess.Popen(
        [sys.executable, str(driver), str(out)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_for(lambda: _second_trial_is_training(out, cfg), 300, "trial 1 to train")
        assert leftovers(out), "trial 1's processes should be running"
        tuner.send_signal(signal.SIGKILL)
        tuner.wait()
    finally:
        if tuner.poll() is None:
            tuner.kill()
            tuner.wait()
    # the trial's guard notices its tuner is gone and takes the whole trial down
    _wait_for(lambda: not leftovers(out), 30, "the interrupted trial's processes to go")
    first = _trials(out, cfg)[0]

    result = tune(
        cfg,
        SPACE,
        LocalRunner(**RUNNER),
        TuneSettings(trials=3, resume=True, top_k=0, pruner_tolerance=1.0), out,
    )

    records = {r["number"]: r for r in result.records}
    assert records[0]["state"] == "COMPLETE"
    assert records[0]["measured_step_time_s"] == first.user_attrs["measured_step_time_s"]
    assert records[1]["state"] == "FAIL"  # interrupted: failed, then retried
    retries = [
        r for r in result.records if r["number"] > 1 and r.get("layout_id") == LAYOUTS[1].id
    ]
    assert [r["status"] for r in retries] == ["ok"]
    ran = [r for r in result.records if r.get("ran") and r["state"] == "COMPLETE"]
    assert sorted(r["layout_id"] for r in ran) == sorted(lay.id for lay in LAYOUTS)
    assert all(r["status"] == "ok" for r in ran)
    assert leftovers(out) == []
