"""Several tuner processes on one study: PostgreSQL (RDB heartbeat) and a journal file.

Two `tune` workers (subprocesses, study_worker.py) share one study and one output folder; worker
B is killed with SIGKILL in the middle of a trial. The study must still end with every layout
run exactly once: B's trial failed by the heartbeat and retried by A. The PostgreSQL and the
journal runs go side by side. After its first trial, A's trials hold until B has finished one
(marker files), so a slow start of B on a loaded machine cannot leave it no layout to run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import optuna
import pytest
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from autotune.search.storage import open_storage

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.slow
LAYOUTS = 8
"""Feasible layouts of space8.yaml: the study's whole space, so 'none lost' is exact."""


def _spawn(worker: str, storage: str, study: str, out: Path, resume: bool) -> subprocess.Popen:
    log = (out.parent / f"worker-{worker}.log").open("w")
    env = {**os.environ, "WORKER": worker, "TRIAL_SLEEP_S": "2",
           "MARK_DONE": str(out.parent / f"{worker}-finished-a-trial"),
           "HOLD_UNTIL": str(out.parent / "B-finished-a-trial")}
    argv = [sys.executable, str(HERE / "study_worker.py"), storage, study, str(out), str(LAYOUTS)]
    return subprocess.Popen([*argv, *(["--resume"] if resume else [])], env=env, stdout=log,
                            stderr=subprocess.STDOUT, cwd=out.parent)


def _trials(storage: str, study: str) -> list[FrozenTrial]:
    try:
        return optuna.load_study(study_name=study, storage=open_storage(storage)).get_trials()
    except KeyError:  # not created yet
        return []


def _wait(condition, timeout_s: float, what: str, procs: list[subprocess.Popen]) -> None:  # noqa: ANN001
    deadline = time.monotonic() + timeout_s
    while not condition():
        for proc in procs:
            assert proc.poll() is None or proc.returncode == 0, f"a worker failed: {proc.args}"
        assert any(proc.poll() is None for proc in procs), f"every worker ended before {what}"
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout_s:g} s waiting for {what}")
        time.sleep(0.2)


def _ran_by(trial: FrozenTrial) -> str | None:
    folder = trial.user_attrs.get("trial_dir")
    try:
        return (Path(folder) / "worker").read_text().strip() if folder else None
    except OSError:
        return None


def _share(storage: str, tmp_path: Path) -> tuple[list[FrozenTrial], int]:
    """Run A, add B once A finished a trial, kill B in its second trial, let A finish; returns
    the study's trials and the number of the killed one."""
    study = f"shared-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "out"
    out.mkdir()
    a = _spawn("A", storage, study, out, resume=False)
    procs = [a]
    try:
        _wait(lambda: any(t.state == TrialState.COMPLETE for t in _trials(storage, study)),
              120, "worker A's first trial", procs)
        b = _spawn("B", storage, study, out, resume=True)
        procs.append(b)

        def b_trials(state: TrialState) -> list[FrozenTrial]:
            return [t for t in _trials(storage, study) if t.state == state and _ran_by(t) == "B"]

        def b_busy_again() -> bool:  # B finished a trial and runs the next one
            return bool(b_trials(TrialState.COMPLETE) and b_trials(TrialState.RUNNING))

        _wait(b_busy_again, 300, "worker B's second trial", procs)
        killed = b_trials(TrialState.RUNNING)[0].number
        b.send_signal(signal.SIGKILL)  # mid-trial: no cleanup, the trial stays RUNNING
        b.wait(timeout=10)
        procs.remove(b)
        assert a.wait(timeout=240) == 0, (tmp_path / "worker-A.log").read_text()[-3000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return _trials(storage, study), killed


@pytest.fixture(scope="module")
def shared(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[dict[str, Future[tuple[list[FrozenTrial], int]]]]:
    """Both storages' runs, side by side: their waits (the trials' sleeps, the heartbeat's
    grace) overlap."""
    storages = {"postgresql": request.getfixturevalue("postgres_url"),
                "journal": f"journal:{tmp_path_factory.mktemp('journal') / 'study.journal'}"}
    with ThreadPoolExecutor(len(storages)) as pool:
        yield {name: pool.submit(_share, storage, tmp_path_factory.mktemp(name))
               for name, storage in storages.items()}


@pytest.mark.parametrize("storage", ["postgresql", "journal"])
def test_two_workers_share_a_study_and_survive_a_killed_one(
        shared: dict[str, Future[tuple[list[FrozenTrial], int]]], storage: str) -> None:
    """Oracle: the study's own records in the storage (Optuna's trial states, layouts and retry
    links) and the `worker` file each trial wrote; the space has exactly 8 layouts."""
    trials, killed = shared[storage].result(timeout=600)
    ran = [t for t in trials if t.state == TrialState.COMPLETE and t.user_attrs.get("ran")]
    layouts = [t.user_attrs["layout_id"] for t in ran]
    by_worker = {w: sum(1 for t in ran if _ran_by(t) == w) for w in ("A", "B")}
    states = {s.name: sum(1 for t in trials if t.state == s) for s in TrialState}
    print(f"\n{storage}: {len(trials)} trials {states}; ran {len(ran)} "
          f"({len(set(layouts))} layouts) by worker {by_worker}; killed trial {killed}")
    assert len(layouts) == len(set(layouts)), f"a layout ran twice: {sorted(layouts)}"
    assert len(set(layouts)) == LAYOUTS, f"lost layouts: {LAYOUTS - len(set(layouts))}"
    dead = next(t for t in trials if t.number == killed)
    assert dead.state == TrialState.FAIL, f"the killed trial is {dead.state.name}"
    retries = [t for t in trials if t.system_attrs.get("failed_trial") == killed]
    assert retries, "the killed trial was not retried"
    assert retries[-1].state == TrialState.COMPLETE and retries[-1].user_attrs.get("ran")
    assert retries[-1].user_attrs["layout_id"] == dead.user_attrs["layout_id"]
    assert by_worker["A"] and by_worker["B"], "both workers should have finished trials"
