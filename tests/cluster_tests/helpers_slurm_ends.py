"""The trials of test_slurm_outcomes.py: one per end a Slurm job can really have here.

Each trial is the real SlurmRunner on the localhost cluster, and its end is provoked for real:
the workload (tiny-gpt, 64 tokens, 1 CPU process) with `--inject nan|oom|hang` or a ZeRO setting
that DeepSpeed refuses; a program of a few shell lines in place of the interpreter where the
workload plays no part in the end (a crash with a code of its own, no training at all, or a
sleep that Slurm's time limit, the runner's limits or someone's `scancel` end); an `scontrol
requeue` by the test; sbatch options the cluster cannot honour. `Batch` starts them.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
from collections.abc import Callable
from collections.abc import Iterable
from concurrent.futures import Future
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from helpers_cluster import ONE
from helpers_cluster import accounting
from helpers_cluster import first_layout
from helpers_cluster import job_id_of
from helpers_cluster import records_of
from helpers_cluster import slurmctld_knows
from helpers_cluster import tiny_config
from helpers_cluster import trial_plan
from helpers_cluster import wait_for

from autotune.measurement import Measurement
from autotune.runners.base import TrialPlan
from autotune.runners.slurm import JOB_FILE
from autotune.runners.slurm import SlurmRunner
from autotune.runners.slurm import job_info

EARLY = ("time limit", "requeued")
"""The trials that mostly wait (over a minute for Slurm's time limit, 11 s in the queue after
the requeue): conftest starts them with the session, so that their waits overlap other tests."""


@dataclasses.dataclass
class End:
    """How one trial ended: the runner's measurement, its plan, what the test saw meanwhile."""

    measurement: Measurement
    plan: TrialPlan
    seen: dict[str, Any]
    """What the trial's helper or pruner saw while the job ran."""

    @property
    def job_id(self) -> str:
        return self.measurement.extra["slurm_job_id"]

    @property
    def log(self) -> str:
        return (self.plan.directory / f"slurm-{self.job_id}.out").read_text()

    def accounted(self) -> dict[str, str]:
        """sacct's record of the job's (last) run."""
        return accounting(self.job_id)[-1]


@dataclasses.dataclass
class Trial:
    """One trial: its runner, and what the test does around it."""

    runner: SlurmRunner
    processes: int = 1
    prepare: Callable[[TrialPlan], None] = lambda plan: None
    """Changes the trial's files before submission."""
    helper: Callable[[TrialPlan, dict[str, Any]], None] | None = None
    """Runs beside the runner (as someone else on the cluster would), noting what it saw."""
    pruner: Callable[[TrialPlan, dict[str, Any]], bool] | None = None
    """The trial's report callback (the pruner's place), noting what it saw."""


def _first_measured_step(plan: TrialPlan, seen: dict[str, Any]) -> str | None:
    """Wait for the job's first measured step; returns its job id (None: the trial ended)."""
    wait_for(lambda: seen.get("ended") or any(r.get("event") == "step" and not r.get("warmup")
                                              for r in records_of(plan.directory)),
             300, "a measured step")
    return None if seen.get("ended") else job_id_of(plan.directory)


def scancel(plan: TrialPlan, seen: dict[str, Any]) -> None:
    """`scancel` the job once it runs (after `scontrol show job` of it)."""
    def running() -> bool:
        if not (plan.directory / JOB_FILE).exists():
            return False
        info = job_info(job_id_of(plan.directory))
        return info is not None and info.state == "RUNNING"

    wait_for(lambda: seen.get("ended") or running(), 300, "the job to run")
    if not seen.get("ended"):
        job_id = job_id_of(plan.directory)
        seen["job_info"] = job_info(job_id)  # scontrol show job of a running job
        subprocess.run(["scancel", job_id], check=True)


def requeue(plan: TrialPlan, seen: dict[str, Any]) -> None:
    """`scontrol requeue` the job at its first measured step."""
    job_id = _first_measured_step(plan, seen)
    if job_id is not None:
        seen["steps_before"] = sum(r["event"] == "step" for r in records_of(plan.directory))
        subprocess.run(["scontrol", "requeue", job_id], check=True)


def wait_until_forgotten(plan: TrialPlan, seen: dict[str, Any]) -> bool:
    """A slow pruner: it answers once slurmctld has purged the finished job (MinJobAge), so
    that the runner can only learn the job's end from `sacct`."""
    if "forgotten" not in seen:
        job_id = job_id_of(plan.directory)
        wait_for(lambda: not slurmctld_knows(job_id), 120, f"slurmctld to forget job {job_id}")
        seen["forgotten"] = job_id
    return False


def refused_by_deepspeed(plan: TrialPlan) -> None:
    """A ZeRO bucket size that DeepSpeed's config model refuses (it must be > 0)."""
    path = plan.artifacts["ds_config.json"]
    config = json.loads(path.read_text())
    config["zero_optimization"]["reduce_bucket_size"] = -1
    path.write_text(json.dumps(config))


def program(folder: Path, text: str) -> str:
    """An executable shell script standing in for the trial's interpreter."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "program"
    path.write_text(f"#!/bin/sh\n{text}\n")
    path.chmod(0o755)
    return str(path)


def every_trial(programs: Path) -> dict[str, Trial]:
    """Every trial by name (test_slurm_outcomes.py checks each); PROGRAMS holds the programs
    that stand in for the interpreter."""
    def runner(**kw: Any) -> SlurmRunner:
        return SlurmRunner(**{"poll_s": 0.5, "steps": 4, "warmup": 1, **kw})

    sleep = program(programs / "sleep", "exec sleep 600")
    crash = program(programs / "exit7",
                    'echo "RuntimeError: the trial program gave up" >&2; exit 7')
    return {
        "time limit": Trial(runner(time_limit="1", python=sleep)),
        "ok": Trial(runner(), pruner=wait_until_forgotten),
        "nan": Trial(runner(extra_args=("--inject", "nan"))),
        "oom": Trial(runner(extra_args=("--inject", "oom"))),
        "rejected": Trial(runner(), prepare=refused_by_deepspeed),
        "hang": Trial(runner(steps=6, extra_args=("--inject", "hang"), hang_timeout_s=8)),
        "requeued": Trial(runner(steps=15, hang_timeout_s=8), helper=requeue),
        "exit 7": Trial(runner(python=crash)),
        "no summary": Trial(runner(python="true")),
        "runner timeout": Trial(runner(python=sleep, timeout_s=5)),
        "startup": Trial(runner(python=sleep, startup_timeout_s=1)),
        "cancelled": Trial(runner(python=sleep), helper=scancel),
        "deadline": Trial(runner(options={"deadline": "now+60"})),
        "cannot run": Trial(runner(), processes=4),
    }


class Batch:
    """The trials, each started once in a thread of its own, in folders ROOT/NAME."""

    def __init__(self, pool: ThreadPoolExecutor, root: Path) -> None:
        self.pool, self.root = pool, root
        self.trials = every_trial(root / "programs")
        self.futures: dict[str, Future[End]] = {}

    def start(self, names: Iterable[str] | None = None) -> None:
        """Start the named trials (default: all) that have not started yet."""
        for name in self.trials if names is None else names:
            if name not in self.futures:
                self.futures[name] = self.pool.submit(self._run, name, self.trials[name])

    def end(self, name: str, timeout_s: float = 600) -> End:
        """How the trial ended (every trial is started first: they run side by side)."""
        self.start()
        return self.futures[name].result(timeout=timeout_s)

    def cleanup(self) -> None:
        """Cancel the jobs that are still followed."""
        for trial in self.trials.values():
            trial.runner.cleanup()

    def _run(self, name: str, trial: Trial) -> End:
        cfg = tiny_config(processes=trial.processes)
        layout = first_layout(cfg, ONE if trial.processes == 1 else
                              f"tp=1,pp=1,zero=0,mbs={4 // trial.processes}")
        seen: dict[str, Any] = {}
        pruner = trial.pruner
        report = (lambda step, rate: pruner(plan, seen)) if pruner else None
        plan = trial_plan(cfg, layout, self.root / name, report=report)
        trial.prepare(plan)
        helper = self.pool.submit(trial.helper, plan, seen) if trial.helper else None
        try:
            measurement = trial.runner.run(plan)
        finally:
            seen["ended"] = True
        if helper is not None:
            helper.result(timeout=60)
        return End(measurement, plan, seen)
