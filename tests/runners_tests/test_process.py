"""run_process and its guard: nothing a trial starts outlives it, not even when the tuner dies."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers_runners import leftovers

from autotune.runners.process import run_process

ESCAPER = textwrap.dedent(
    """
    import subprocess, sys, time
    # like torchrun's workers: a child in a session of its own, outside the trial's group
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "{marker}"],
                     start_new_session=True)
    print("started", flush=True)
    time.sleep(600)
    """
)


def _escaper(marker: Path) -> list[str]:
    return [sys.executable, "-c", ESCAPER.format(marker=marker), str(marker)]


def _wait_gone(marker: Path, timeout_s: float = 15.0) -> list[str]:
    deadline = time.monotonic() + timeout_s
    while leftovers(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    return leftovers(marker)


def test_hang_kills_children_in_other_sessions(tmp_path: Path) -> None:
    """Oracle: the real process table (psutil): a real child that escaped into a session of its
    own, as torchrun's workers do, is gone after the hang timeout."""
    marker = tmp_path / "escaper"
    outcome = run_process(_escaper(marker), cwd=tmp_path, hang_timeout_s=1.0, grace_s=1.0)
    assert outcome.hung and outcome.killed_by_us and outcome.stdout_tail == "started"
    assert leftovers(marker) == []


def test_progress_lines_and_startup_timeout(tmp_path: Path) -> None:
    """Oracle: a real process printing a line every 0.3 s: not hung with a 1 s limit; hung when
    only a line it never prints counts as progress and the startup allowance is 0.5 s."""
    ticker = [
        sys.executable,
        "-c",
        "import time\nfor i in range(6):\n print(i, flush=True)\n time.sleep(0.3)",
    ]
    # every line counts as progress by default: 0.3 s apart is within 1 s
    assert not run_process(ticker, cwd=tmp_path, hang_timeout_s=1.0).hung
    # when only a line that never comes counts, the startup allowance runs out
    stalled = run_process(
        ticker,
        cwd=tmp_path,
        hang_timeout_s=10.0,
        startup_timeout_s=0.5,
        is_progress=lambda line: line == "never",
    )
    assert stalled.hung


def test_exit_status_and_memory_limit_pass_through(tmp_path: Path) -> None:
    """Oracle: real processes: the kernel's RLIMIT_AS as the child reads it, a real SIGSEGV (-11)
    and a real exit status 3."""
    limit = 1 << 30
    check = "import resource; print(resource.getrlimit(resource.RLIMIT_AS)[0])"
    outcome = run_process([sys.executable, "-c", check], cwd=tmp_path, memory_limit_bytes=limit)
    assert outcome.returncode == 0 and outcome.stdout_tail == str(limit)
    segv = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
    assert run_process([sys.executable, "-c", segv], cwd=tmp_path).returncode == -signal.SIGSEGV
    assert run_process([sys.executable, "-c", "raise SystemExit(3)"], cwd=tmp_path).returncode == 3


@pytest.mark.slow
def test_the_guard_takes_the_trial_down_when_the_tuner_is_killed(tmp_path: Path) -> None:
    """Oracle: the real process table after a real SIGKILL of the tuner: tuner, guard, trial and
    the escaped child all gone."""
    marker = tmp_path / "escaper"
    tuner_code = textwrap.dedent(
        f"""
        from pathlib import Path
        from autotune.runners.process import run_process
        run_process({_escaper(marker)!r}, cwd=Path({str(tmp_path)!r}),
                    on_line=lambda line: print("ready", flush=True) and False)
        """
    )
    tuner = subprocess.Popen(
        [sys.executable, "-c", tuner_code],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )
    assert tuner.stdout is not None and tuner.stdout.readline().strip() == "ready"
    deadline = time.monotonic() + 10
    while len(leftovers(marker)) < 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(leftovers(marker)) == 4, leftovers(marker)  # tuner, guard, trial, escaper
    tuner.send_signal(signal.SIGKILL)
    tuner.wait()
    assert _wait_gone(marker) == []
