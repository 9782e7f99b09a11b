"""The slurm runner: every trial is one sbatch job that trains the built-in workload.

Lifecycle of one trial (`SlurmRunner.run`, safe to call from several threads with --jobs):

1. Render `trial.sbatch` (templates/slurm/trial.sbatch.j2) into the trial folder, sized from the
   layout: nodes = ceil(world / processes per node), one task per node, GPUs per node (or, on a
   CPU-only cluster, CPUs per task). Each task runs torchrun with the rendezvous taken from the
   allocation (MASTER_ADDR = first host of `scontrol show hostnames`, node rank = SLURM_NODEID).
2. Submit it (`sbatch --parsable`, from the trial folder, which the job inherits as its working
   directory and this environment) and write `slurm_job.json` there. Instead of submitting, the
   runner re-attaches to a job that is still queued or running for the same layout and inputs:
   the one a retried trial inherited (user attribute `slurm_job_id`, when search passes trial
   attributes in the plan), or, with `reattach` (`--resume`), the newest of the sibling
   folders `OUT/trials/*-<layout id>/`.
3. Follow it: one `squeue` per poll for all jobs of the runner; read `metrics.jsonl` as it grows
   and report every measured (non-warm-up) step to the pruner; `scancel` when the pruner, the
   runner timeout or the hang timeout says so, or when the tuner stops.
4. Map the end onto a trial status: TIMEOUT and DEADLINE → timeout, OUT_OF_MEMORY → oom,
   NODE_FAIL/BOOT_FAIL/PREEMPTED → resubmitted up to `retries` times, then crash; CANCELLED →
   pruned, timeout or hang when this runner cancelled it, else crash; FAILED and COMPLETED →
   the workload's summary line, exit code and log (`autotune.runners.failures.classify`).

Finished jobs are looked up with `scontrol show job` (while slurmctld remembers them,
MinJobAge), then `sacct`, then the `exit_code` file the job script writes. The trial folder must
be on a file system that the compute nodes share with the tuner.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import re
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autotune.exceptions import AutotuneError
from autotune.flops import model_flops
from autotune.runners.base import Measurement
from autotune.runners.base import Runner
from autotune.runners.base import TrialPlan
from autotune.runners.base import step_time_spread
from autotune.runners.failures import classify

log = logging.getLogger(__name__)

WORKLOAD_MODULE = "autotune.workloads.deepspeed_gpt"
"""The trial program every task runs under torchrun (the local runner's program)."""
JOB_FILE = "slurm_job.json"
"""Per trial folder: the job id and what it was submitted for (read back by --resume)."""
LIVE_STATES = frozenset({
    "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD",
    "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED", "RESV_DEL_HOLD",
    "POWER_UP_NODE",
})
"""Job states that are not final yet."""
WAITING_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})
"""Live states of a job that is not running: queued, or requeued and queued again."""
RETRIED_STATES = frozenset({"PREEMPTED", "NODE_FAIL", "BOOT_FAIL"})
"""Ends that say nothing about the layout: the trial is submitted again (up to `retries`)."""
_UNSATISFIABLE = re.compile(r"node configuration is not available|Node count specification "
                            r"invalid|More processors requested than permitted")
"""sbatch's words for a job the cluster can never run (the layout's size, not a fault)."""
_SBATCH_VALUE = re.compile(r"[^\s'\"\\#]+")
_SBATCH_KEY = re.compile(r"[a-z][a-z0-9-]*")
_PATH_FIELDS = ("WorkDir", "Command", "StdOut", "StdErr", "StdIn")
PORT_BASE, PORT_SPAN = 20000, 20000
"""Rendezvous port = PORT_BASE + job id % PORT_SPAN (trials sharing a node do not collide)."""


# --- talking to Slurm ------------------------------------------------------------------------


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


class _Poller:
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


# --- the job script --------------------------------------------------------------------------


def sbatch_directives(options: Mapping[str, str | None]) -> list[str]:
    """`--key=value` (or `--key` when the value is None) for each option, checked.

    Raises:
        AutotuneError: A key or value would not survive an #SBATCH line.
    """
    directives = []
    for key, value in options.items():
        key = key.removeprefix("--")
        if not _SBATCH_KEY.fullmatch(key):
            raise AutotuneError(f"--slurm-opt: {key!r} is not an sbatch option name "
                                "(e.g. qos=high, constraint=h100, exclusive)")
        if value is None:
            directives.append(f"--{key}")
        elif _SBATCH_VALUE.fullmatch(value):
            directives.append(f"--{key}={value}")
        else:
            raise AutotuneError(f"--slurm-opt: {key}={value!r} may not contain spaces, quotes, "
                                "backslashes or '#' (it goes into an #SBATCH line)")
    return directives


def parse_slurm_opts(items: Sequence[str]) -> dict[str, str | None]:
    """`--slurm-opt KEY=VAL` items (or a bare `KEY`) as a mapping."""
    options: dict[str, str | None] = {}
    for item in items:
        key, sep, value = item.partition("=")
        options[key.strip()] = value if sep else None
    return options


def trial_sbatch_script(plan: TrialPlan, *, job_name: str, directives: Sequence[str],
                        python: str, args: Sequence[str]) -> str:
    """The job script of one trial (rendered by autotune.render from trial.sbatch.j2)."""
    from autotune.render import trial_job_script

    return trial_job_script(plan.cfg, plan.layout, number=plan.number,
                            directory=plan.directory, job_name=job_name, directives=directives,
                            python=python, module=WORKLOAD_MODULE, args=args,
                            port_base=PORT_BASE, port_span=PORT_SPAN)


# --- reading the trial -----------------------------------------------------------------------


class _Metrics:
    """The JSON records of metrics.jsonl, read as the file grows (partial lines wait)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def records(self) -> list[dict[str, Any]]:
        try:
            with self.path.open("rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        found = []
        for line in lines:
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                found.append(value)
        return found


def _log_tail(path: Path, lines: int = 60, window: int = 1 << 16) -> str:
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - window))
            text = handle.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def measured(plan: TrialPlan, steps: Sequence[Mapping[str, Any]]) -> Measurement | None:
    """Figures of the measured (non-warm-up) steps, computed as the local runner does them:
    median step time, its spread, TFLOP/s per process from Megatron's FLOPs, MFU, peak memory.
    None when no step was measured."""
    cfg = plan.cfg
    steady = [s for s in steps if not s.get("warmup") and s.get("step_time_s")]
    if not steady:
        return None
    times = [float(s["step_time_s"]) for s in steady]
    step_s = statistics.median(times)
    tokens = float(steady[-1].get("tokens") or cfg.train.tokens_per_step)
    flops = model_flops(cfg.model, cfg.train.seq_length, tokens / cfg.train.seq_length,
                        cfg.padded_vocab(plan.layout.tp))
    tflops = float(flops) / step_s / plan.layout.world_size / 1e12
    peaks = [float(s["peak_memory_bytes"]) for s in steps if s.get("peak_memory_bytes")]
    return Measurement(
        "ok", step_time_s=step_s, tokens_per_s=tokens / step_s, tflops_per_gpu=tflops,
        mfu=tflops / cfg.cluster.gpu.peak_tflops[cfg.train.precision],
        peak_memory_bytes=max(peaks) if peaks else None, step_time_spread=step_time_spread(times),
    )


def _package_root() -> str | None:
    """The folder holding the `autotune` package, unless it is an installed site folder."""
    root = Path(__file__).resolve().parents[2]
    return None if root.name in ("site-packages", "dist-packages") else str(root)


# --- the runner ------------------------------------------------------------------------------


@dataclasses.dataclass
class _Job:
    """One submitted job as the runner follows it."""

    job_id: str
    directory: Path
    reattached: bool = False
    cancelled_for: str | None = None
    """Why this runner cancelled it: pruned, timeout, hang, startup (no first step) or stopped."""
    cancelled_at: float = 0.0
    started_at: float | None = None
    last_step: float | None = None
    state: str = "PENDING"
    nodes: str = ""
    steps: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """Step records seen in metrics.jsonl."""
    summaries: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    """Summary records seen in metrics.jsonl."""
    restart: int = 0
    """Slurm's restart count of the run being read (the job script's job_start record)."""
    metrics: _Metrics | None = None

    def read(self) -> int:
        """Take in the new records of metrics.jsonl; returns how many measured steps came.

        A requeued job runs its script again from the start: the records of its earlier runs
        no longer count once the next run's job_start record comes."""
        if self.metrics is None:
            self.metrics = _Metrics(self.directory / "metrics.jsonl")
        measured = 0
        for record in self.metrics.records():
            event = record.get("event")
            if event == "job_start" and int(record.get("restart") or 0) > self.restart:
                self.restart = int(record["restart"])
                self.steps.clear()
                self.summaries.clear()
                self.last_step = None
            elif event == "summary":
                self.summaries.append(record)
            elif event == "step" and record.get("step_time_s"):
                self.last_step = time.monotonic()
                self.steps.append(record)
                measured += not record.get("warmup")
        return measured

    @property
    def summary(self) -> dict[str, Any] | None:
        """The workload's summary: the first failure one, else the last (as the local runner)."""
        failed = [s for s in self.summaries if s.get("status") not in (None, "ok")]
        return failed[0] if failed else (self.summaries[-1] if self.summaries else None)


class SlurmRunner(Runner):
    """Runs each trial as an sbatch job on a Slurm cluster (see the module docstring).

    Args:
        partition: `--partition` of every job, if any.
        account: `--account`, if any.
        time_limit: `--time` of every job (Slurm syntax: `MM`, `HH:MM:SS`, `D-HH`); default:
            the runner timeout rounded up to minutes, plus 5, so Slurm stops a job that the
            tuner no longer follows.
        options: More sbatch options, KEY → VALUE (None for a flag), from `--slurm-opt`.
        timeout_s: Longest run of one job once it started (queue time not counted).
        hang_timeout_s: Longest time between two steps (status `hang`).
        startup_timeout_s: Longest time from the job's start to its first step.
        poll_s: Seconds between squeue calls (one call for all jobs of the runner).
        steps: Optimizer steps per trial, warm-up included.
        warmup: Leading steps not measured (and not reported to the pruner).
        retries: Submissions again after PREEMPTED, NODE_FAIL or BOOT_FAIL.
        reattach: Follow a still-queued or running job of an earlier (interrupted) tuner for the
            same layout and inputs instead of submitting a new one (`--resume`).
        python: Interpreter on the compute nodes (default: this one; jobs inherit this
            environment, as sbatch's default `--export=ALL` does).
        env: Extra environment variables of every job.
        extra_args: Appended to the workload's arguments (e.g. `("--inject", "hang")`).

    Example:
        >>> from autotune.runners.slurm import SlurmRunner
        >>> runner = SlurmRunner(partition="gpu", time_limit="00:30:00", options={"qos": "high"})
        >>> # autotune.search.tune(cfg, space, runner, TuneOptions(out_dir=Path("/shared/study")))
    """

    name = "slurm"
    needs_artifacts = True

    def __init__(
        self,
        *,
        partition: str | None = None,
        account: str | None = None,
        time_limit: str | None = None,
        options: Mapping[str, str | None] | None = None,
        timeout_s: float = 1800.0,
        hang_timeout_s: float = 300.0,
        startup_timeout_s: float = 900.0,
        poll_s: float = 5.0,
        steps: int = 6,
        warmup: int = 2,
        retries: int = 1,
        reattach: bool = False,
        python: str | None = None,
        env: Mapping[str, str] | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        if warmup < 0 or steps <= warmup:
            raise AutotuneError(
                f"--steps/--warmup: need 0 <= warmup < steps (got steps={steps}, warmup={warmup})")
        self.timeout_s, self.hang_timeout_s = timeout_s, hang_timeout_s
        self.startup_timeout_s, self.poll_s = startup_timeout_s, poll_s
        self.steps, self.warmup, self.retries, self.reattach = steps, warmup, retries, reattach
        self.python = python or sys.executable
        self.env = dict(env or {})
        self.extra_args = tuple(extra_args)
        self.time_limit = time_limit or str(math.ceil(timeout_s / 60) + 5)
        fixed = {"partition": partition, "account": account, "time": self.time_limit}
        self.directives = sbatch_directives(
            {**{k: v for k, v in fixed.items() if v is not None}, **dict(options or {})})
        self._poller = _Poller(poll_s)
        self._lock = threading.Lock()
        self._active: dict[str, _Job] = {}
        self._stopping = threading.Event()

    # lifecycle

    def prepare(self) -> None:
        """Check that the Slurm client commands answer."""
        self._stopping.clear()
        done = _slurm(["squeue", "-h", "-j", "0"])
        if done.returncode != 0 and "Invalid job id" not in done.stderr:
            raise SlurmError(f"squeue does not answer: {done.stderr.strip()}")

    def cleanup(self) -> None:
        """Cancel every job still followed (the tuner is stopping)."""
        self._stopping.set()
        with self._lock:
            jobs = list(self._active.values())
        for job in jobs:
            self._cancel(job, "stopped")

    def run(self, plan: TrialPlan) -> Measurement:
        attempt = 0
        job = self._reattach(plan)
        while True:
            if job is None:
                try:
                    job = self._submit(plan)
                except AutotuneError as error:  # SlurmError included
                    status = "rejected" if _UNSATISFIABLE.search(str(error)) else "crash"
                    return Measurement(status, reason=str(error))
            try:
                info = self._follow(plan, job)
            finally:
                self._poller.forget(job.job_id)
                with self._lock:
                    self._active.pop(job.job_id, None)
            state = info.state if info else "UNKNOWN"
            if state in RETRIED_STATES and attempt < self.retries and not job.cancelled_for:
                attempt += 1
                log.warning("trial %d: job %s ended %s; submitting it again (%d/%d)",
                            plan.number, job.job_id, state, attempt, self.retries)
                job = None
                continue
            measurement = self._outcome(plan, job, info)
            extra = {"slurm_job_id": job.job_id, "slurm_state": state,
                     "slurm_nodes": job.nodes or (info.nodes if info else ""),
                     **({"slurm_reattached": str(job.directory)} if job.reattached else {}),
                     **measurement.extra}
            return dataclasses.replace(measurement, extra=extra)

    # submitting and re-attaching

    def workload_argv(self, plan: TrialPlan) -> list[str]:
        """Arguments of the workload (after `-m module`) for this trial."""
        folder = plan.directory.resolve()
        (folder / "model.json").write_text(json.dumps(plan.cfg.model.model_dump(mode="json")))
        return ["--model", str(folder / "model.json"),
                "--ds-config", str(folder / "ds_config.json"),
                "--layout", str(folder / "layout.json"),
                "--seq", str(plan.cfg.train.seq_length), "--steps", str(self.steps),
                "--warmup", str(self.warmup), "--metrics", str(folder / "metrics.jsonl"),
                *self.extra_args]

    def environment(self) -> dict[str, str]:
        """The environment sbatch passes on to the job: this one, plus the package's folder on
        PYTHONPATH (a source checkout), unbuffered output and `env`."""
        extra = {"PYTHONUNBUFFERED": "1"}
        root = _package_root()
        if root is not None:
            extra["PYTHONPATH"] = os.pathsep.join(
                p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
        return {**os.environ, **extra, **self.env}

    def fingerprint(self, plan: TrialPlan) -> str:
        """What a job measures: inputs, layout and workload settings (not paths)."""
        data = {"cfg": plan.cfg.identity(), "layout": plan.layout.id,
                "steps": self.steps, "warmup": self.warmup, "args": self.extra_args}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]

    def _submit(self, plan: TrialPlan) -> _Job:
        if plan.cfg.train.framework != "deepspeed":
            raise AutotuneError(
                f"slurm runner: the built-in workload trains with DeepSpeed; got framework "
                f"{plan.cfg.train.framework!r} (use --framework deepspeed, or --runner command "
                "with your own sbatch wrapper)")
        plan.directory.mkdir(parents=True, exist_ok=True)
        job_name = f"autotune-{plan.number:04d}-{plan.layout.id}"
        script = plan.directory / "trial.sbatch"
        script.write_text(trial_sbatch_script(
            plan, job_name=job_name, directives=self.directives, python=self.python,
            args=self.workload_argv(plan)))
        script.chmod(0o755)
        (plan.directory / "metrics.jsonl").unlink(missing_ok=True)
        job_id = submit(script, self.environment())
        record = {"job_id": job_id, "job_name": job_name, "layout_id": plan.layout.id,
                  "fingerprint": self.fingerprint(plan), "submitted": time.time()}
        (plan.directory / JOB_FILE).write_text(json.dumps(record, indent=2) + "\n")
        self._note(plan, job_id, plan.directory)
        log.info("trial %d: submitted %s as Slurm job %s", plan.number, plan.layout.text, job_id)
        return self._track(_Job(job_id, plan.directory))

    def _track(self, job: _Job) -> _Job:
        with self._lock:
            self._active[job.job_id] = job
        self._poller.watch(job.job_id)
        return job

    def _candidates(self, plan: TrialPlan) -> list[tuple[str, Path]]:
        """(job id, trial folder) of earlier jobs for this layout: the one the trial inherited
        (user attribute `slurm_job_id`, carried by the retry of a dead worker's trial), then,
        with `reattach`, those of sibling folders (OUT/trials/*-<layout id>)."""
        found = []
        inherited = str(getattr(plan, "attrs", {}).get("slurm_job_id", ""))  # proposed field
        if inherited:
            info = job_info(inherited)
            if info is not None and info.work_dir:
                found.append((inherited, Path(info.work_dir)))
        siblings = plan.directory.parent.glob(f"*-{plan.layout.id}/{JOB_FILE}")
        for path in sorted(siblings, reverse=True) if self.reattach else ():
            try:
                found.append((str(json.loads(path.read_text())["job_id"]), path.parent))
            except (OSError, ValueError, KeyError):
                continue
        return found

    def _reattach(self, plan: TrialPlan) -> _Job | None:
        """A live job of an earlier tuner for the same layout and inputs, now followed here."""
        fingerprint = self.fingerprint(plan)
        for job_id, folder in self._candidates(plan):
            with self._lock:
                if job_id in self._active:
                    continue
            try:
                record = json.loads((folder / JOB_FILE).read_text())
            except (OSError, ValueError):
                continue
            if (record.get("job_id") != job_id or record.get("fingerprint") != fingerprint
                    or record.get("cancelled")):
                continue
            info = queue_states([job_id]).get(job_id)
            if info is None or info.state not in LIVE_STATES or info.name != record["job_name"]:
                continue
            log.info("trial %d: re-attached to Slurm job %s (%s) of an earlier run",
                     plan.number, job_id, info.state)
            plan.directory.mkdir(parents=True, exist_ok=True)
            (plan.directory / "reattached_to").write_text(f"{job_id} {folder}\n")
            self._note(plan, job_id, folder)
            return self._track(_Job(job_id, folder, reattached=True))
        return None

    @staticmethod
    def _note(plan: TrialPlan, job_id: str, folder: Path) -> None:
        """Put the job on the trial now, so that a retry of it inherits the job id."""
        note = getattr(plan, "note", None)  # proposed TrialPlan field: trial.set_user_attr
        if note is not None:
            note("slurm_job_id", job_id)
            note("slurm_trial_dir", str(folder))

    # following

    def _cancel(self, job: _Job, why: str) -> None:
        if job.cancelled_for is not None:
            return
        job.cancelled_for, job.cancelled_at = why, time.monotonic()
        try:
            cancel(job.job_id)
        except SlurmError as error:
            log.warning("scancel %s: %s", job.job_id, error)
        path = job.directory / JOB_FILE
        try:
            record = json.loads(path.read_text())
            path.write_text(json.dumps({**record, "cancelled": why}, indent=2) + "\n")
        except (OSError, ValueError):
            pass

    def _follow(self, plan: TrialPlan, job: _Job) -> JobInfo | None:
        """Follow the job until it ends; returns Slurm's last word on it."""
        while True:
            now = time.monotonic()
            if job.read() and self._report(plan, job):
                self._cancel(job, "pruned")
            info = self._poller.state(job.job_id)
            if info is None:  # gone from squeue: ask scontrol / sacct once
                info = job_info(job.job_id)
            if info is not None:
                job.state = info.state
                job.nodes = info.nodes or job.nodes
            if info is None or info.state not in LIVE_STATES:
                return job_info(job.job_id) or info
            if info.state == "RUNNING" and job.started_at is None:
                job.started_at = now
            elif info.state in WAITING_STATES:  # e.g. requeued: limits count from its next start
                job.started_at = job.last_step = None
            self._check_limits(job, now)
            if job.cancelled_for and now - job.cancelled_at > 120:
                log.warning("job %s still %s two minutes after scancel", job.job_id, job.state)
                return info
            time.sleep(min(self.poll_s, 1.0) if job.cancelled_for else self.poll_s)

    @staticmethod
    def _report(plan: TrialPlan, job: _Job) -> bool:
        """Report the median throughput of the measured steps so far (as the local runner)."""
        rates = [float(s["tokens_per_s"]) for s in job.steps
                 if not s.get("warmup") and s.get("tokens_per_s")]
        return job.cancelled_for is None and bool(rates) and plan.report(
            len(rates), statistics.median(rates))

    def _check_limits(self, job: _Job, now: float) -> None:
        if job.cancelled_for is not None:
            return
        if self._stopping.is_set():
            self._cancel(job, "stopped")
            return
        if job.started_at is None:
            return
        if now - job.started_at > self.timeout_s:
            self._cancel(job, "timeout")
        elif job.last_step is None and now - job.started_at > self.startup_timeout_s:
            self._cancel(job, "startup")
        elif job.last_step is not None and now - job.last_step > self.hang_timeout_s:
            self._cancel(job, "hang")

    # the outcome

    def _outcome(self, plan: TrialPlan, job: _Job, info: JobInfo | None) -> Measurement:
        """The trial's Measurement from how the job ended."""
        job.read()
        if info is not None and info.state == "COMPLETED" and job.summary is None:
            time.sleep(2.0)  # a shared file system may show the last lines late
            job.read()
        summary = job.summary
        tail = _log_tail(job.directory / f"slurm-{job.job_id}.out")
        state = info.state if info else "UNKNOWN"
        why = job.cancelled_for
        if why == "pruned":
            return Measurement("pruned", reason="stopped by the pruner (scancel)", log_tail=tail)
        if why == "timeout":
            return Measurement("timeout", reason=f"ran longer than {self.timeout_s:g} s (scancel)",
                               log_tail=tail)
        if why == "hang":
            return Measurement("hang", reason=f"no new step within {self.hang_timeout_s:g} s "
                               "(scancel)", log_tail=tail)
        if why == "startup":
            return Measurement("hang", reason=f"no first step within {self.startup_timeout_s:g} "
                               "s of the job's start (scancel)", log_tail=tail)
        if why == "stopped":
            return Measurement("crash", reason="the tuner stopped; job cancelled", log_tail=tail)
        fixed = {
            "TIMEOUT": ("timeout", f"reached its Slurm time limit ({self.time_limit})"),
            "DEADLINE": ("timeout", "reached its Slurm deadline"),
            "OUT_OF_MEMORY": ("oom", "Slurm: out of memory (the job's memory limit)"),
            "CANCELLED": ("crash", "cancelled outside autotune (scancel by a user or an admin)"),
        }
        if state in fixed:
            status, reason = fixed[state]
            return Measurement(status, reason=f"{reason}; Slurm state {state}", log_tail=tail)
        if state in RETRIED_STATES or state == "REVOKED":
            detail = f" ({info.reason})" if info and info.reason else ""
            return Measurement("crash", reason=f"Slurm state {state}{detail} after "
                               f"{self.retries} resubmission(s)", log_tail=tail)
        code = info.exit_code if info else None
        exit_file = job.directory / "exit_code"
        if exit_file.exists():
            text = exit_file.read_text().strip()
            code = int(text) if text.lstrip("-").isdigit() else code
        failure = classify(returncode=code, text=tail, reported=summary)
        extra = {"exit_code": code, "steps_done": len(job.steps)}
        if failure is not None:
            return Measurement(failure.status, reason=f"{failure.reason}; Slurm state {state}",
                               log_tail=tail, extra=extra)
        figures = measured(plan, job.steps) if summary is not None else None
        if figures is None:
            return Measurement("crash", reason=f"Slurm state {state}, but the workload wrote no "
                               "summary after its measured steps", log_tail=tail, extra=extra)
        return dataclasses.replace(figures, log_tail=tail, extra=extra)
