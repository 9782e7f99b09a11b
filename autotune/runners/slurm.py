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
import sys
import threading
import time
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from typing import ClassVar

from autotune.exceptions import AutotuneError
from autotune.frameworks import framework_of
from autotune.measurement import Measurement
from autotune.runners.base import ProgramOptions
from autotune.runners.base import Runner
from autotune.runners.base import TrialPlan
from autotune.runners.base import check_program
from autotune.runners.base import cpu_allocator_env
from autotune.runners.failures import classify
from autotune.runners.process import package_root
from autotune.runners.slurm_client import LIVE_STATES
from autotune.runners.slurm_client import JobInfo
from autotune.runners.slurm_client import QueuePoller
from autotune.runners.slurm_client import SlurmError
from autotune.runners.slurm_client import cancel
from autotune.runners.slurm_client import job_info
from autotune.runners.slurm_client import parse_slurm_opts
from autotune.runners.slurm_client import partition_has_gpus
from autotune.runners.slurm_client import queue_states
from autotune.runners.slurm_client import sbatch_directives
from autotune.runners.slurm_client import submit
from autotune.specs import AutotuneConfig
from autotune.templating import flag_lines
from autotune.templating import render_template
from autotune.templating import version
from autotune.workloads import workload_spec
from autotune.workloads import write_problem
from autotune.workloads.records import LineReader
from autotune.workloads.records import TrialRecords
from autotune.workloads.records import last_lines
from autotune.workloads.records import read_tail

log = logging.getLogger(__name__)

JOB_FILE = "slurm_job.json"
"""Per trial folder: the job id and what it was submitted for (read back by --resume)."""
WAITING_STATES = frozenset({"PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED"})
"""Live states of a job that is not running: queued, or requeued and queued again."""
RETRIED_STATES = frozenset({"PREEMPTED", "NODE_FAIL", "BOOT_FAIL"})
"""Ends that say nothing about the layout: the trial is submitted again (up to `retries`)."""
_UNSATISFIABLE = re.compile(r"node configuration is not available|Node count specification "
                            r"invalid|More processors requested than permitted")
"""sbatch's words for a job the cluster can never run (the layout's size, not a fault)."""
PORT_BASE, PORT_SPAN = 20000, 20000
"""Rendezvous port = PORT_BASE + job id % PORT_SPAN (trials sharing a node do not collide)."""


# --- the job script --------------------------------------------------------------------------


def trial_sbatch_script(plan: TrialPlan, *, job_name: str, directives: Sequence[str],
                        python: str, args: Sequence[str], checkout: Path | None = None) -> str:
    """The job script of one trial (templates/slurm/trial.sbatch.j2): srun runs, on every node,
    torchrun of the framework's built-in trial program, or, with `checkout`, the framework's
    rendered launch script running that checkout; the rendezvous comes from the allocation."""
    framework = framework_of(plan.cfg)
    world = plan.layout.world_size
    per_node = min(plan.cfg.cluster.gpus_per_node, world)
    program: dict[str, Any] = {"module": None, "script": None, "script_env": {}}
    if checkout is not None and framework.checkout_env is not None:
        program["script"] = str(plan.directory.resolve() / framework.launch_script)
        program["script_env"] = {framework.checkout_env: str(checkout)}
    else:
        program["module"] = workload_spec(framework.workload).module
    return render_template(
        "slurm/trial.sbatch.j2", job_name=job_name, nodes=-(-world // per_node),
        nproc_per_node=per_node, cpu_only=plan.cfg.cluster.cpu_processes,
        allocator_env=cpu_allocator_env(plan.cfg, {}), directives=list(directives),
        number=plan.number, version=version(),
        layout_text=plan.layout.text, world_size=world,
        trial_dir=str(plan.directory.resolve()), port_base=PORT_BASE, port_span=PORT_SPAN,
        python=python, arg_lines=flag_lines(args), **program,
    )


# --- the runner ------------------------------------------------------------------------------


@dataclasses.dataclass
class _Job:
    """One submitted job as the runner follows it."""

    job_id: str
    directory: Path
    records: TrialRecords
    """What the job's program printed so far (its metrics file, or its log for a checkout)."""
    source: LineReader
    """Where those lines come from."""
    reattached: bool = False
    cancelled_for: str | None = None
    """Why this runner cancelled it: pruned, timeout, hang, startup (no first step) or stopped."""
    cancelled_at: float = 0.0
    started_at: float | None = None
    last_step: float | None = None
    state: str = "PENDING"
    nodes: str = ""

    def read(self) -> tuple[int, float] | None:
        """Take in the new lines; returns (measured steps, median tokens/s) when a measured
        step came that the pruner should hear of."""
        progress = None
        for line in self.source.lines():
            step = self.records.feed(line)
            if step is not None:
                self.last_step = time.monotonic()
                progress = self.records.progress(step) or progress
        return progress


class SlurmSettings(ProgramOptions):
    """What the Slurm runner reads."""

    partition: str | None = None
    """slurm: partition of the jobs (trials, calibrate)."""
    account: str | None = None
    """slurm: account charged for the jobs (trials, calibrate)."""
    time_limit: str | None = None
    """slurm: Slurm --time of each job (default: the timeout plus 5 minutes)."""
    slurm_opts: tuple[str, ...] = ()
    """slurm: more sbatch options, KEY=VAL or KEY."""
    flags: ClassVar[dict[str, str]] = {**ProgramOptions.flags, "slurm_opts": "--slurm-opt"}

    def given(self) -> list[str]:
        """The flags of the Slurm-only settings that are set (the shared ones aside)."""
        return [self.flags.get(name, "--" + name.replace("_", "-"))
                for name in SlurmSettings.model_fields
                if name not in ProgramOptions.model_fields and getattr(self, name)]


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
        megatron_lm: A checkout of the framework (Megatron-LM) on the nodes; trials then run
            its rendered launch script (pretrain_gpt.sh) instead of the built-in program.
        env: Extra environment variables of every job.
        extra_args: Appended to the workload's arguments (e.g. `("--inject", "hang")`).

    Example:
        >>> from autotune.runners.slurm import SlurmRunner
        >>> runner = SlurmRunner(partition="gpu", time_limit="00:30:00", options={"qos": "high"})
        >>> # autotune.tune(cfg, space, runner, TuneSettings(), Path("/shared/study"))
    """

    name = "slurm"
    needs_artifacts = True

    @classmethod
    def from_settings(cls, settings: SlurmSettings, resume: bool = False) -> SlurmRunner:
        """The runner `settings` describe (`resume`: re-attach to jobs still running)."""
        return cls(partition=settings.partition, account=settings.account,
                   time_limit=settings.time_limit, options=parse_slurm_opts(settings.slurm_opts),
                   timeout_s=settings.timeout_s, hang_timeout_s=settings.hang_timeout_s,
                   steps=settings.steps, warmup=settings.warmup(),
                   megatron_lm=settings.megatron_lm, reattach=resume)

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
        megatron_lm: str | os.PathLike[str] | None = None,
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
        self.checkout = Path(megatron_lm).resolve() if megatron_lm is not None else None
        self.partition = partition
        self.env = dict(env or {})
        self.extra_args = tuple(extra_args)
        self.time_limit = time_limit or str(math.ceil(timeout_s / 60) + 5)
        fixed = {"partition": partition, "account": account, "time": self.time_limit}
        self.directives = sbatch_directives(
            {**{k: v for k, v in fixed.items() if v is not None}, **dict(options or {})})
        self._poller = QueuePoller(poll_s)
        self._lock = threading.Lock()
        self._active: dict[str, _Job] = {}
        self._stopping = threading.Event()

    # lifecycle

    def check(self, cfg: AutotuneConfig) -> None:
        """Refuse what cannot run on this Slurm cluster, before anything is submitted.

        Raises:
            AutotuneError: Slurm does not answer; the framework needs GPUs and the cluster (or
                the partition) has none; a checkout was given for a framework without one.
        """
        where = f"partition {self.partition!r}" if self.partition else "the default partition"
        check_program(
            cfg, self.checkout,
            lambda: not cfg.cluster.cpu_processes and partition_has_gpus(self.partition),
            f"{where} of this Slurm cluster (no gpu GRES in sinfo)")
        self.prepare()

    def prepare(self) -> None:
        """Check that the Slurm client commands answer."""
        self._stopping.clear()
        queue_states(["0"])

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

    def program_args(self, plan: TrialPlan) -> list[str]:
        """Arguments of the trial program (or of the framework's launch script) for this trial."""
        framework = framework_of(plan.cfg)
        if self.checkout is not None:
            return [*framework.checkout_trial_args(self.steps), *self.extra_args]
        spec = workload_spec(framework.workload)
        folder = plan.directory.resolve()
        return [*spec.arguments(folder, steps=self.steps, warmup=self.warmup), *self.extra_args]

    def _records(self, plan: TrialPlan, job_id: str, directory: Path) -> tuple[TrialRecords,
                                                                                 LineReader]:
        """The records of a job and where they are read: metrics.jsonl, or the job's output
        through the framework's log parser for a checkout (converted steps go to metrics)."""
        if self.checkout is not None:
            log_parser = framework_of(plan.cfg).log_parser()
            return (TrialRecords(plan.cfg, self.warmup, log=log_parser,
                                 metrics=directory / "metrics.jsonl"),
                    LineReader(directory / f"slurm-{job_id}.out"))
        return (TrialRecords(plan.cfg, self.warmup),
                LineReader(directory / "metrics.jsonl"))

    def environment(self) -> dict[str, str]:
        """The environment sbatch passes on to the job: this one, plus the package's folder on
        PYTHONPATH (a source checkout), this interpreter's folder first on PATH (the launch
        script of a checkout runs torchrun), unbuffered output and `env`."""
        extra = {"PYTHONUNBUFFERED": "1",
                 "PATH": os.pathsep.join((str(Path(self.python).parent),
                                          os.environ.get("PATH", "")))}
        root = package_root()
        if root is not None:
            extra["PYTHONPATH"] = os.pathsep.join(
                p for p in (root, os.environ.get("PYTHONPATH", "")) if p)
        return {**os.environ, **extra, **self.env}

    def fingerprint(self, plan: TrialPlan) -> str:
        """What a job measures: inputs, layout and workload settings (not paths)."""
        data = {"cfg": plan.cfg.identity(), "layout": plan.layout.id, "steps": self.steps,
                "warmup": self.warmup, "args": self.extra_args,
                "checkout": str(self.checkout) if self.checkout else None}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]

    def _submit(self, plan: TrialPlan) -> _Job:
        write_problem(plan.cfg, plan.directory)
        job_name = f"autotune-{plan.number:04d}-{plan.layout.id}"
        script = plan.directory / "trial.sbatch"
        script.write_text(trial_sbatch_script(
            plan, job_name=job_name, directives=self.directives, python=self.python,
            args=self.program_args(plan), checkout=self.checkout))
        script.chmod(0o755)
        (plan.directory / "metrics.jsonl").unlink(missing_ok=True)
        job_id = submit(script, self.environment())
        record = {"job_id": job_id, "job_name": job_name, "layout_id": plan.layout.id,
                  "fingerprint": self.fingerprint(plan), "submitted": time.time()}
        (plan.directory / JOB_FILE).write_text(json.dumps(record, indent=2) + "\n")
        self._note(plan, job_id, plan.directory)
        log.info("trial %d: submitted %s as Slurm job %s", plan.number, plan.layout.text, job_id)
        return self._track(_Job(job_id, plan.directory,
                                *self._records(plan, job_id, plan.directory)))

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
            return self._track(_Job(job_id, folder, *self._records(plan, job_id, folder),
                                    reattached=True))
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
            progress = job.read()
            if progress is not None and job.cancelled_for is None and plan.report(*progress):
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
        finished = job.records.summary is not None or (self.checkout is not None
                                                       and bool(job.records.steady()))
        if info is not None and info.state == "COMPLETED" and not finished:
            time.sleep(2.0)  # a shared file system may show the last lines late
            job.read()
        summary = job.records.summary
        text = read_tail(job.directory / f"slurm-{job.job_id}.out")
        tail = last_lines(text)
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
            written = exit_file.read_text().strip()
            code = int(written) if written.lstrip("-").isdigit() else code
        failure = classify(returncode=code, text=text, reported=summary)
        extra = {"exit_code": code, "steps_done": len(job.records.steps)}
        if failure is not None:
            return Measurement(failure.status, reason=f"{failure.reason}; Slurm state {state}",
                               log_tail=tail, peak_memory_bytes=job.records.peak_memory_bytes(),
                               extra=extra)
        wrote_summary = summary is not None or self.checkout is not None
        figures = job.records.figures(plan.layout, extra) if wrote_summary else None
        if figures is None:
            return Measurement("crash", reason=f"Slurm state {state}, but the program wrote no "
                               "summary after its measured steps", log_tail=tail, extra=extra)
        return dataclasses.replace(figures, log_tail=tail)
