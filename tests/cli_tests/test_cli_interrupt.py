"""Ctrl-C in the middle of a study: exit 130 with the resume command, and that command finishes
the study with every completed trial kept."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import psutil
import sqlalchemy
from helpers_cli import REPO

TRIAL = "sleep 1; echo '{\"step_time_s\": 1.5}' # {trial_dir}"
"""A command-runner trial of about a second that measures 1.5 s per step."""


def _env() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def _trials(out: Path, *, live: bool = False) -> list[optuna.trial.FrozenTrial]:
    """The study's trials. `live`: the study process may still be creating the database, so
    read it without writing (a second writer would race its schema creation) and take an
    unfinished schema as no trials yet."""
    path = out / "study.db"
    storage = f"sqlite:///file:{path}?mode=ro&uri=true" if live else f"sqlite:///{path}"
    if not path.exists():
        return []
    try:
        names = optuna.get_all_study_names(storage)
        if not names:
            return []
        return optuna.load_study(study_name=names[0], storage=storage).get_trials(deepcopy=False)
    except (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError):
        if live:
            return []
        raise


def _ran(trials: list[optuna.trial.FrozenTrial]) -> list[optuna.trial.FrozenTrial]:
    done = optuna.trial.TrialState.COMPLETE
    return [t for t in trials if t.state == done and t.user_attrs.get("ran")]


def _leftovers(out: Path, wait_s: float) -> list[psutil.Process]:
    """Live processes whose command line names `out` (trial commands do), after up to wait_s."""
    deadline = time.monotonic() + wait_s
    while True:
        alive = [p for p in psutil.process_iter(["cmdline", "status"])
                 if p.info["status"] != psutil.STATUS_ZOMBIE
                 and str(out) in " ".join(p.info["cmdline"] or [])]
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.5)


def test_sigint_mid_study_then_resume(tmp_path: Path) -> None:
    """Oracle: a real `autotune tune` process, a real SIGINT (what Ctrl-C sends), the study's
    SQLite file read back with Optuna, and the process table (psutil) for leftovers."""
    out = tmp_path / "study"
    command = [sys.executable, "-m", "autotune.cli", "tune", "-m", "tiny-gpt", "-c",
               "dgx-h100:1", "--runner", "command", "--command", TRIAL, "--trials", "5",
               "--out", str(out)]
    process = subprocess.Popen(command, cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while len(_ran(_trials(out, live=True))) < 2 and process.poll() is None:
        assert time.monotonic() < deadline, "no two trials finished within 300 s"
        time.sleep(0.2)
    before = {t.number: (t.params, t.value) for t in _ran(_trials(out, live=True))}
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=60)

    assert process.returncode == 130, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    prefix = "interrupted: the study is resumable; continue it with: "
    assert lines[0].startswith(prefix), lines[0]
    resume = shlex.split(lines[0].removeprefix(prefix))
    assert resume[:2] == ["autotune", "tune"] and resume[-1] == "--resume"
    assert shlex.split(shlex.join(command[3:])) == resume[1:-1]  # the same command, plus --resume
    assert not _leftovers(out, wait_s=15), "a trial process outlived the interrupt"

    done = subprocess.run([sys.executable, "-m", "autotune.cli", *resume[1:]], cwd=tmp_path,
                          env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    after = _trials(out)
    kept = {t.number: (t.params, t.value) for t in after if t.number in before}
    assert kept == before, "a completed trial changed on resume"
    assert len(_ran(after)) == 5
    assert [t.value for t in _ran(after)] == [t.value for t in _ran(after)[:1]] * 5
