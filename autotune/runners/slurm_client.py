"""Talking to Slurm: submit, cancel, and read job states (squeue, scontrol, sacct, sinfo).

Plain functions over the Slurm client commands (run where they are installed, e.g. a login
node), and `QueuePoller`, which asks squeue once per interval for every job a runner follows.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import re
import subprocess
import threading
import time
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path

from autotune import templating
from autotune.exceptions import AutotuneError

log = logging.getLogger(__name__)

LIVE_STATES = frozenset({
    "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
    "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD",
    "POWER_UP_NODE",
})
"""Job states that are not final yet."""
_PATH_FIELDS = ("WorkDir", "Command", "StdOut", "StdErr", "StdIn")


class SlurmError(AutotuneError):
    """A Slurm command failed (sbatch refused the job, or the controller did not answer)."""


@dataclasses.dataclass(frozen=True)
class JobInfo:
    """What Slurm says about a job."""

    job_id: str
    state: str
    """Base state (RUNNING, TIMEOUT, ...) without flags such as `CANCELLED by 0`."""
    reason: str = ""
    exit_code: int | None = None
    """The batch script's exit status; negative: killed by that signal."""
    name: str = ""
    work_dir: str = ""
    nodes: str = ""


def _slurm(argv: Sequence[str], timeout_s: float = 60.0, cwd: Path | None = None,
           env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s,
                              cwd=cwd, env=dict(env) if env is not None else None, check=False)
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]}: command not found; the slurm runner runs where the Slurm "
                         "client commands are installed (a login node)") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{argv[0]} did not answer within {timeout_s:g} s") from None


def submit(script: Path, env: Mapping[str, str] | None = None) -> str:
    """Submit `script` from its folder (with `env`, which the job inherits); returns the job id.

    Raises:
        SlurmError: sbatch refused the job (its message says why).
    """
    done = _slurm(["sbatch", "--parsable", script.name], timeout_s=120.0, cwd=script.parent,
                  env=env)
    job_id = done.stdout.strip().split(";")[0]
    if done.returncode != 0 or not job_id.isdigit():
        message = (done.stderr or done.stdout).strip().replace("\n", " ")
        raise SlurmError(f"sbatch refused the job: {message or f'exit code {done.returncode}'}")
    return job_id


def cancel(job_id: str) -> None:
    """scancel the job (a job that already ended is no error)."""
    _slurm(["scancel", job_id])


def queue_states(job_ids: Sequence[str]) -> dict[str, JobInfo]:
    """State of each job slurmctld still knows (one squeue call); unknown ids are left out.

    Raises:
        SlurmError: squeue failed for another reason than unknown ids.
    """
    if not job_ids:
        return {}
    done = _slurm(["squeue", "-h", "--states=all", "-j", ",".join(job_ids),
                   "-o", "%i|%T|%r|%j|%N"])
    if done.returncode != 0 and "Invalid job id" not in done.stderr:
        raise SlurmError(f"squeue failed: {done.stderr.strip()}")
    found = {}
    for line in done.stdout.splitlines():
        parts = line.split("|")
        if len(parts) == 5 and parts[0] in job_ids:
            found[parts[0]] = JobInfo(parts[0], parts[1], _reason(parts[2]), name=parts[3],
                                      nodes=parts[4])
    return found


def _reason(text: str) -> str:
    return "" if text in ("None", "(null)") else text


def _nodes(text: str) -> str:
    """A node list; "" for Slurm's words for none (scontrol `(null)`, sacct `None assigned`)."""
    return "" if text in ("(null)", "None assigned") else text


def _exit_code(text: str) -> int | None:
    """`N:S` (exit status : signal) as one int, negative for a signal."""
    status, _, sig = text.partition(":")
    if not status.isdigit():
        return None
    return -int(sig) if sig.isdigit() and int(sig) and not int(status) else int(status)


def _scontrol_fields(text: str) -> dict[str, str]:
    """`scontrol show job` (multi-line form) as a dict; paths keep their spaces."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, _, rest = line.strip().partition("=")
        if key in _PATH_FIELDS:  # alone on their line, and may contain spaces
            fields[key] = rest
        else:
            fields.update(re.findall(r"(\S+?)=(\S*)", line))
    return fields


def job_info(job_id: str) -> JobInfo | None:
    """Everything about one job: `scontrol show job`, else `sacct`; None when neither knows it."""
    done = _slurm(["scontrol", "show", "job", job_id])
    if done.returncode == 0 and "JobState=" in done.stdout:
        fields = _scontrol_fields(done.stdout)
        return JobInfo(job_id, fields.get("JobState", ""), _reason(fields.get("Reason", "")),
                       _exit_code(fields.get("ExitCode", "")), fields.get("JobName", ""),
                       fields.get("WorkDir", ""), _nodes(fields.get("NodeList", "")))
    done = _slurm(["sacct", "-X", "-n", "-P", "-j", job_id,
                   "-o", "JobID,State,ExitCode,JobName,WorkDir,NodeList"])
    for line in done.stdout.splitlines() if done.returncode == 0 else []:
        parts = line.split("|")
        if len(parts) == 6 and parts[0] == job_id:
            return JobInfo(job_id, parts[1].split()[0], "", _exit_code(parts[2]), parts[3],
                           parts[4], _nodes(parts[5]))
    return None


class QueuePoller:
    """One `squeue` per interval for every job the runner follows (thread-safe)."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._jobs: set[str] = set()
        self._known: dict[str, JobInfo] = {}
        self._stamp = -math.inf
        self._failures = 0

    def watch(self, job_id: str) -> None:
        with self._lock:
            self._jobs.add(job_id)
            self._stamp = -math.inf

    def forget(self, job_id: str) -> None:
        with self._lock:
            self._jobs.discard(job_id)
            self._known.pop(job_id, None)

    def state(self, job_id: str) -> JobInfo | None:
        """The job's latest state, or None when squeue no longer knows it."""
        with self._lock:
            if time.monotonic() - self._stamp >= self.interval_s:
                try:
                    self._known = queue_states(sorted(self._jobs))
                    self._failures = 0
                except SlurmError as error:  # a busy controller: keep the last answer
                    self._failures += 1
                    log.warning("slurm: %s (attempt %d)", error, self._failures)
                    if self._failures >= 30:
                        raise
                self._stamp = time.monotonic()
            return self._known.get(job_id)


def sbatch_directives(options: Mapping[str, str | None]) -> list[str]:
    """`--key=value` (or `--key`) for each `--slurm-opt`, checked for an #SBATCH line.

    Raises:
        AutotuneError: A key or value would not survive an #SBATCH line.
    """
    return templating.sbatch_directives(options, source="--slurm-opt")


def parse_slurm_opts(items: Sequence[str]) -> dict[str, str | None]:
    """`--slurm-opt KEY=VAL` items (or a bare `KEY`) as a mapping."""
    options: dict[str, str | None] = {}
    for item in items:
        key, sep, value = item.partition("=")
        options[key.strip()] = value if sep else None
    return options




def partition_has_gpus(partition: str | None) -> bool:
    """Whether the nodes of `partition` (default: the default partition) offer GPUs: a `gpu`
    generic resource in `sinfo -o %G`.

    Raises:
        SlurmError: sinfo did not answer.
    """
    argv = ["sinfo", "-h", "-o", "%G"] + (["-p", partition] if partition else [])
    done = _slurm(argv)
    if done.returncode != 0:
        raise SlurmError(f"sinfo failed: {done.stderr.strip()}")
    return any("gpu" in line for line in done.stdout.splitlines())
