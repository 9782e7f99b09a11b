"""Classify a failed trial from how it ended and what it logged.

Classes (see `autotune.measurement.Status`): `oom` (CUDA or host memory, or a SIGKILL that the
watchdog did not send: the kernel OOM killer or a memory cgroup), `nccl_timeout` (NCCL or gloo
collective timeouts), `hang` and `timeout` (the watchdog stopped the run), `nan`, `rejected` (the
framework refused the configuration), and `crash` (anything else). The first cause wins: a rank
that ran out of memory while its peers waited in a collective is `oom`, not `hang`.
"""

from __future__ import annotations

import dataclasses
import re
import signal
from collections.abc import Mapping

from autotune.workloads.records import FAILURE_EXIT_CODES

PATTERNS: dict[str, tuple[re.Pattern[str], ...]] = {
    "oom": tuple(
        re.compile(p)
        for p in (
            r"CUDA out of memory",
            r"OutOfMemoryError",
            r"DefaultCPUAllocator: can't allocate memory",
            r"\bMemoryError\b",
            r"std::bad_alloc",
            r"Cannot allocate memory",
            r"CUBLAS_STATUS_ALLOC_FAILED",
            r"\bout of memory\b",
        )
    ),
    "nccl_timeout": tuple(
        re.compile(p)
        for p in (
            r"Watchdog caught collective operation timeout",
            r"Some NCCL operations have failed or timed out",
            r"ProcessGroupNCCL.*[Tt]imed? ?out",
            r"NCCL.*(?:[Tt]imeout|timed out)",
            r"checkTimeout",
            r"Timed out waiting \d+ms for (?:send|recv) operation",
            r"[Gg]loo.*(?:[Tt]imeout|[Tt]imed out)",
        )
    ),
    "nan": tuple(
        re.compile(p, re.IGNORECASE)
        for p in (
            r"found NaN in local (?:forward loss|grad norm)",
            r"number of nan iterations:\s*[1-9]",
            r"\bloss is nan\b",
            r"\bnan loss\b",
            r"\b(?:detected|found) nan\b",
        )
    ),
    "rejected": tuple(
        re.compile(p)
        for p in (
            r"ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism",
            r"DeepSpeedConfigError",
            r"Check batch related parameters",
            r"ValidationError: \d+ validation errors? for DeepSpeed\w*",
            r"is not supported on your device",
            r"mpu must be None with pipeline parallelism",
            r"Not able to determine model policy",
            r"in validate_args",
        )
    ),
}
"""Log evidence of each failure class, tried in this order."""

_EXCEPTION = re.compile(r"(?:^|\]:?\s*)((?:[A-Za-z_][\w.]*)?(?:Error|Exception)\b:?.*)$")
_ROOT_CAUSE = re.compile(
    r"Root Cause \(first observed failure\):.*?exitcode\s*:\s*(-?\d+)", re.DOTALL
)
_LAUNCHER_CODE = re.compile(r"exits with return code = (-?\d+)")
_LAUNCHER_ERROR = re.compile(r"ChildFailedError|SignalException|CalledProcessError")
"""Exceptions of torchrun and the deepspeed launcher that only say a worker failed."""
_SIGNAL = re.compile(r"Signal (\d+) \((SIG\w+)\) received by PID")


@dataclasses.dataclass(frozen=True)
class Failure:
    """The class of a failed trial and one line saying why."""

    status: str
    reason: str


def evidence(text: str) -> dict[str, str]:
    """The first log line that shows each failure class (class → line)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        for status, patterns in PATTERNS.items():
            if status not in found and any(p.search(line) for p in patterns):
                found[status] = line.strip()[:300]
    if "rejected" in found and "in validate_args" in found["rejected"]:
        assertion = [ln for ln in text.splitlines() if "AssertionError" in ln]
        found["rejected"] = (assertion[-1].strip() if assertion else found["rejected"])[:300]
    return found


def last_exception(text: str) -> str | None:
    """The last `SomethingError: message` line of a log (launcher wrappers skipped), if any."""
    for line in reversed(text.splitlines()):
        match = _EXCEPTION.search(line.strip())
        if match and not line.strip().startswith("File ") and not _LAUNCHER_ERROR.search(line):
            return match.group(1).strip()[:300]
    return None


def worker_exit_code(text: str) -> int | None:
    """The first failed worker's exit code, as torchrun or the deepspeed launcher report it."""
    match = _ROOT_CAUSE.search(text)
    if match:
        return int(match.group(1))
    codes = [int(c) for c in _LAUNCHER_CODE.findall(text) if c != "0"]
    return codes[0] if codes else None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _killed_by(returncode: int | None, text: str, worker: int | None) -> int | None:
    """The signal that killed the trial (or its first failed worker), if one did."""
    for code in (returncode, worker):
        if code is not None and code < 0:
            return -code
        if code is not None and code > 128 and code - 128 in (6, 9, 11):
            return code - 128
    match = _SIGNAL.search(text)
    return int(match.group(1)) if match else None


def classify(
    *,
    returncode: int | None,
    text: str,
    timed_out: bool = False,
    hung: bool = False,
    reported: Mapping[str, object] | None = None,
    timeout_s: float | None = None,
    hang_timeout_s: float | None = None,
) -> Failure | None:
    """The failure class of a trial, or None when it succeeded.

    Args:
        returncode: Exit status of the launcher (negative: killed by that signal).
        text: Its stdout and stderr (or their last part).
        timed_out: The watchdog stopped it at the trial timeout.
        hung: The watchdog stopped it for lack of progress.
        reported: The workload's final summary (`status`, `reason`), if it printed one.
        timeout_s: The trial timeout, for the reason.
        hang_timeout_s: The hang timeout, for the reason.
    """
    found = evidence(text)
    said = str((reported or {}).get("status", ""))
    said_reason = str((reported or {}).get("reason") or "")
    if said in ("oom", "nan", "rejected"):
        return Failure(said, said_reason or found.get(said, f"the workload reported {said}"))
    if timed_out or hung:
        for status in ("oom", "nccl_timeout", "nan"):
            if status in found:
                return Failure(status, found[status])
        if timed_out:
            return Failure("timeout", f"exceeded the trial timeout ({timeout_s or 0:g} s)")
        return Failure("hang", f"no new step within the hang timeout ({hang_timeout_s or 0:g} s)")
    if returncode == 0 and said in ("", "ok"):
        return None
    for status in ("oom", "nccl_timeout", "nan", "rejected"):
        if status in found:
            return Failure(status, found[status])
    worker = worker_exit_code(text)
    killed = _killed_by(returncode, text, worker)
    if killed == signal.SIGKILL:
        return Failure(
            "oom",
            "killed by SIGKILL, which the watchdog did not send: the kernel "
            "OOM killer or a memory cgroup limit",
        )
    for code in (returncode, worker):
        if code in FAILURE_EXIT_CODES:
            status = FAILURE_EXIT_CODES[code]
            return Failure(status, f"the workload exited with code {code} ({status})")
    detail = last_exception(text) or said_reason
    if killed is not None:
        cause = f"killed by {_signal_name(killed)}"
    elif returncode == 0:
        cause = f"the workload reported status {said!r}"
    else:
        cause = f"exit code {returncode}"
    return Failure("crash", f"{cause}: {detail}" if detail else cause)
