"""Run one trial's command in its own process group, stream its output, and always reap it.

The command runs under a small guard (this file run as a script: `python process.py PARENT
GRACE LIMIT -- argv`). The guard owns the new session, tracks every descendant (torchrun starts
its workers in sessions of their own, so killing one group is not enough), kills them all when the
command ends, when it is told to stop (SIGTERM, then SIGKILL after a grace period), or when the
tuner that started it dies (even by SIGKILL): no process outlives its trial.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import IO

import psutil

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
    pid: int = 0
    """Process id (and process group id) of the guard that led the trial."""

    @property
    def tail(self) -> str:
        """The last lines of stderr then stdout, for the trial record."""
        return "\n".join(part for part in (self.stderr_tail, self.stdout_tail) if part)

    @property
    def killed_by_us(self) -> bool:
        """True when the watchdog or the pruner ended the run."""
        return self.timed_out or self.hung or self.stopped


class Family:
    """The descendants of one process, remembered while they live so that none escapes.

    Snapshots are taken repeatedly: a process that started in its own session and lost its parent
    is still known and still killed.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.members: dict[int, psutil.Process] = {}

    def snapshot(self) -> None:
        """Add the current descendants."""
        try:
            for child in psutil.Process(self.pid).children(recursive=True):
                self.members.setdefault(child.pid, child)
        except psutil.Error:
            pass

    def alive(self) -> list[psutil.Process]:
        """Members still running (zombies count as gone)."""
        living = []
        for member in self.members.values():
            try:
                if member.is_running() and member.status() != psutil.STATUS_ZOMBIE:
                    living.append(member)
            except psutil.Error:
                continue
        return living

    def signal(self, sig: int) -> None:
        """Send `sig` to every living member."""
        for member in self.alive():
            try:
                member.send_signal(sig)
            except psutil.Error:
                continue

    def kill(self, grace_s: float = 0.0) -> None:
        """SIGTERM (when grace_s > 0), wait up to grace_s, then SIGKILL whatever is left."""
        self.snapshot()
        if grace_s > 0:
            self.signal(signal.SIGTERM)
            psutil.wait_procs(self.alive(), timeout=grace_s)
            self.snapshot()
        self.signal(signal.SIGKILL)
        psutil.wait_procs(self.alive(), timeout=5.0)


def _guard_main(argv: Sequence[str]) -> int:
    """The guard: run argv, forward stop requests, and leave no descendant behind."""
    parent, grace_s, limit = int(argv[0]), float(argv[1]), int(argv[2])
    command = list(argv[4:]) if argv[3] == "--" else list(argv[3:])
    if limit > 0:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    stopping: list[float] = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(time.monotonic()))
    forwarded = False
    try:
        child = subprocess.Popen(command)
    except OSError as error:
        print(f"cannot start {command[0]}: {error}", file=sys.stderr)
        return 127
    family = Family(os.getpid())
    code: int | None = None
    while code is None:
        try:
            code = child.wait(timeout=0.5)
            break
        except subprocess.TimeoutExpired:
            family.snapshot()
        if os.getppid() != parent:  # the tuner died: take the whole trial down now
            family.kill()
            return 137
        if stopping:
            if not forwarded:  # members in other sessions missed the group's SIGTERM
                family.signal(signal.SIGTERM)
                forwarded = True
            if time.monotonic() - stopping[0] > grace_s:
                family.kill()
    family.kill(grace_s=min(grace_s, 5.0))  # the command ended; so do its stragglers
    if code < 0:  # die of the same signal, so the tuner sees what killed the command
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def _kill_group(process: subprocess.Popen[str], family: Family, grace_s: float = 5.0) -> None:
    """SIGTERM the guard's group, SIGKILL it after the grace period, then every descendant."""
    family.snapshot()
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=grace_s + 5.0)
    except ProcessLookupError:
        pass
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()
    family.kill()


def _last_lines(handle: IO[str], count: int, window: int = 1 << 20) -> str:
    """The last `count` lines of an open text file (read from its last `window` bytes)."""
    handle.flush()
    size = handle.seek(0, os.SEEK_END)
    handle.seek(max(0, size - window))
    return "\n".join(handle.read().splitlines()[-count:])


def group_alive(pgid: int) -> bool:
    """True while any process of the group exists."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def package_root() -> str | None:
    """The folder holding the `autotune` package, unless it is an installed site folder (then
    trial processes import it as this one does; otherwise they get it on PYTHONPATH)."""
    root = Path(__file__).resolve().parents[2]
    return None if root.name in ("site-packages", "dist-packages") else str(root)


def guarded(argv: Sequence[str], grace_s: float = 10.0, memory_limit_bytes: int = 0) -> list[str]:
    """argv wrapped in the guard (run by this interpreter, without importing autotune)."""
    return [
        sys.executable,
        str(Path(__file__).resolve()),
        str(os.getpid()),
        f"{grace_s:g}",
        str(int(memory_limit_bytes)),
        "--",
        *argv,
    ]


def run_process(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str] | None = None,
    timeout_s: float = 3600.0,
    hang_timeout_s: float | None = None,
    startup_timeout_s: float | None = None,
    is_progress: Callable[[str], bool] | None = None,
    on_line: LineHandler | None = None,
    stdout_path: Path | None = None,
    stderr_path: Path | None = None,
    tail_lines: int = 40,
    grace_s: float = 10.0,
    memory_limit_bytes: int = 0,
) -> ProcessOutcome:
    """Run argv under the guard in a new session and kill everything it started on timeout, on no
    progress, or when `on_line` asks to stop. Never leaves a process behind.

    Args:
        argv: The command.
        cwd: Working directory.
        env: Environment (None inherits this process's).
        timeout_s: Wall-clock limit of the whole run.
        hang_timeout_s: Longest time without progress (None: no limit).
        startup_timeout_s: Longest time before the first progress (default hang_timeout_s).
        is_progress: Which stdout lines count as progress (default: every line).
        on_line: Called with every stdout line; True stops the run (`stopped`).
        stdout_path: File that receives stdout (default: discarded).
        stderr_path: File that receives stderr (default: discarded).
        tail_lines: Lines of each stream kept in the outcome.
        grace_s: Time between SIGTERM and SIGKILL when the run is stopped.
        memory_limit_bytes: Address-space limit (RLIMIT_AS) of every process; 0 for none.
    """
    stdout_file = open(stdout_path or os.devnull, "w")  # noqa: SIM115 - closed below
    stderr_file = open(stderr_path or os.devnull, "w+", errors="replace")  # noqa: SIM115
    start = time.monotonic()
    process = subprocess.Popen(
        guarded(argv, grace_s, memory_limit_bytes),
        cwd=cwd,
        env=dict(env) if env is not None else None,
        stdout=subprocess.PIPE,
        stderr=stderr_file,
        text=True,
        bufsize=1,
        errors="replace",
        start_new_session=True,
    )
    family = Family(process.pid)
    tail: deque[str] = deque(maxlen=tail_lines)
    last_progress: list[float | None] = [None]
    stop = threading.Event()

    def pump() -> None:
        assert process.stdout is not None
        for raw in process.stdout:
            line = raw.rstrip("\n")
            stdout_file.write(raw)
            stdout_file.flush()
            tail.append(line)
            if is_progress is None or is_progress(line):
                last_progress[0] = time.monotonic()
            if on_line is not None and on_line(line):
                stop.set()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    timed_out = hung = False
    startup = startup_timeout_s if startup_timeout_s is not None else hang_timeout_s
    polls = 0
    try:
        while process.poll() is None:
            now = time.monotonic()
            if stop.is_set():
                break
            if now - start > timeout_s:
                timed_out = True
                break
            if last_progress[0] is None:
                if startup is not None and now - start > startup:
                    hung = True
                    break
            elif hang_timeout_s is not None and now - last_progress[0] > hang_timeout_s:
                hung = True
                break
            polls += 1
            if polls % 10 == 0:
                family.snapshot()
            time.sleep(0.1)
    finally:
        if process.poll() is None or group_alive(process.pid):
            _kill_group(process, family, grace_s)
        family.kill()
        reader.join(timeout=5)
        stdout_file.close()
        stderr_tail = _last_lines(stderr_file, tail_lines)
        stderr_file.close()
    return ProcessOutcome(
        returncode=process.returncode,
        duration_s=time.monotonic() - start,
        timed_out=timed_out,
        hung=hung,
        stopped=stop.is_set() and not (timed_out or hung),
        stdout_tail="\n".join(tail),
        stderr_tail=stderr_tail,
        pid=process.pid,
    )


if __name__ == "__main__":
    sys.exit(_guard_main(sys.argv[1:]))
