"""Run one trial's command in its own process group, stream its output, and always reap it."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path

LineHandler = Callable[[str], bool]
"""Called for every stdout line; returns True when the run should be stopped (pruned)."""


@dataclasses.dataclass(frozen=True)
class ProcessOutcome:
    """How a trial process ended."""

    returncode: int | None
    duration_s: float
    timed_out: bool = False
    hung: bool = False
    stopped: bool = False
    stdout_tail: str = ""
    stderr_tail: str = ""

    @property
    def tail(self) -> str:
        """The last lines of stderr then stdout, for the trial record."""
        return "\n".join(part for part in (self.stderr_tail, self.stdout_tail) if part)


def _kill_group(process: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM the whole process group, then SIGKILL what is left, and reap the leader."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            break
        try:
            process.wait(timeout=grace_s)
            # the leader is gone; make sure no child of the group survives it
            os.killpg(process.pid, signal.SIGKILL)
        except (subprocess.TimeoutExpired, ProcessLookupError):
            continue
        break
    process.wait()


def group_alive(pgid: int) -> bool:
    """True while any process of the group exists."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_process(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 3600.0,
    hang_timeout_s: float | None = None,
    on_line: LineHandler | None = None,
    stdout_path: Path | None = None,
    stderr_path: Path | None = None,
    tail_lines: int = 40,
) -> ProcessOutcome:
    """Run argv in a new session; kill its group on timeout, on no output for `hang_timeout_s`
    (progress = a stdout line), or when `on_line` asks to stop. Never leaves a process behind."""
    stdout_file = open(stdout_path or os.devnull, "w")  # noqa: SIM115 - closed below
    stderr_file = open(stderr_path or os.devnull, "w+")  # noqa: SIM115
    start = time.monotonic()
    process = subprocess.Popen(
        list(argv), cwd=cwd, env=dict(env) if env is not None else None,
        stdout=subprocess.PIPE, stderr=stderr_file, text=True, bufsize=1,
        start_new_session=True,
    )
    tail: deque[str] = deque(maxlen=tail_lines)
    last_progress = [time.monotonic()]
    stop = threading.Event()

    def pump() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            stdout_file.write(line)
            stdout_file.flush()
            tail.append(line.rstrip("\n"))
            last_progress[0] = time.monotonic()
            if on_line is not None and on_line(line.rstrip("\n")):
                stop.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = hung = False
    try:
        while process.poll() is None:
            now = time.monotonic()
            if stop.is_set():
                break
            if now - start > timeout_s:
                timed_out = True
                break
            if hang_timeout_s is not None and now - last_progress[0] > hang_timeout_s:
                hung = True
                break
            time.sleep(0.1)
    finally:
        if process.poll() is None or group_alive(process.pid):
            _kill_group(process)
        reader.join(timeout=5)
        stdout_file.close()
        stderr_file.seek(0)
        stderr_tail = "\n".join(stderr_file.read().splitlines()[-tail_lines:])
        stderr_file.close()
    return ProcessOutcome(
        returncode=process.returncode, duration_s=time.monotonic() - start, timed_out=timed_out,
        hung=hung, stopped=stop.is_set() and not (timed_out or hung),
        stdout_tail="\n".join(tail), stderr_tail=stderr_tail,
    )
