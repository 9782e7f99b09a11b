"""Every end a job can really have on the localhost Slurm, through the real SlurmRunner.

All trials start together when the module's first test asks for them (`ends`) and run side by
side on the one-node cluster (tiny-gpt, 64 tokens, 1 CPU process each); each test then checks
one of them. A failure is provoked for real: the workload's `--inject nan|oom|hang`, a ZeRO
setting that DeepSpeed refuses, a program that exits with a code of its own, an `scancel` or
`scontrol requeue` from the test (someone else than the runner), sbatch options the cluster
cannot honour. The oracles are Slurm's own records of the job (`sacct`, kept by slurmdbd),
torchrun's report of the worker's exit code in the job's log, and the workload's exit codes
(`autotune.workloads.common.EXIT_CODES`, asserted by hand below). Slurm's own time limit is
checked by the last test (its trial starts with the cluster tests' first Slurm test:
`conftest.time_limit_trial`).
"""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from collections.abc import Callable
from collections.abc import Iterator
from concurrent.futures import Future
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from helpers_cluster import accounting
from helpers_cluster import first_layout
from helpers_cluster import job_id_of
from helpers_cluster import queued_jobs
from helpers_cluster import records_of
from helpers_cluster import slurmctld_knows
from helpers_cluster import tiny_config
from helpers_cluster import trial_plan
from helpers_cluster import wait_for

from autotune.runners.base import Measurement
from autotune.runners.base import TrialPlan
from autotune.runners.slurm import JobInfo
from autotune.runners.slurm import SlurmRunner
from autotune.runners.slurm import job_info
from autotune.workloads.common import EXIT_CODES

pytestmark = pytest.mark.slow
ONE = "tp=1,pp=1,zero=0,mbs=4"
"""The tiny problem on one process: micro-batch 4 = the global batch."""


@dataclasses.dataclass
class End:
    """How one trial ended: the runner's measurement and what Slurm recorded."""

    measurement: Measurement
    plan: TrialPlan
    seen: dict[str, Any]
    """What the test's helper saw while the job ran (before scancel, at the pruner's call)."""

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
    """One trial of the batch: its runner, and what the test does around it."""

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


def _scancel(plan: TrialPlan, seen: dict[str, Any]) -> None:
    job_id = _first_measured_step(plan, seen)
    if job_id is not None:
        seen["job_info"] = job_info(job_id)  # scontrol show job of a running job
        subprocess.run(["scancel", job_id], check=True)


def _requeue(plan: TrialPlan, seen: dict[str, Any]) -> None:
    job_id = _first_measured_step(plan, seen)
    if job_id is not None:
        seen["steps_before"] = sum(r["event"] == "step" for r in records_of(plan.directory))
        subprocess.run(["scontrol", "requeue", job_id], check=True)


def _wait_until_forgotten(plan: TrialPlan, seen: dict[str, Any]) -> bool:
    """A slow pruner: it answers once slurmctld has purged the finished job (MinJobAge), so
    that the runner can only learn the job's end from `sacct`."""
    if "forgotten" not in seen:
        job_id = job_id_of(plan.directory)
        wait_for(lambda: not slurmctld_knows(job_id), 120, f"slurmctld to forget job {job_id}")
        seen["forgotten"] = job_id
    return False


def _refused_by_deepspeed(plan: TrialPlan) -> None:
    """A ZeRO bucket size that DeepSpeed's config model refuses (it must be > 0)."""
    path = plan.artifacts["ds_config.json"]
    config = json.loads(path.read_text())
    config["zero_optimization"]["reduce_bucket_size"] = -1
    path.write_text(json.dumps(config))


def _program(folder: Path, text: str) -> str:
    """An executable shell script standing in for the trial's interpreter."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "program"
    path.write_text(f"#!/bin/sh\n{text}\n")
    path.chmod(0o755)
    return str(path)


def _trials(programs: Path) -> dict[str, Trial]:
    def runner(**kw: Any) -> SlurmRunner:
        return SlurmRunner(**{"poll_s": 0.5, "steps": 4, "warmup": 1, **kw})

    hang = ("--inject", "hang")
    crash = 'echo "RuntimeError: the trial program gave up" >&2; exit 7'
    return {
        "ok": Trial(runner()),
        "nan": Trial(runner(extra_args=("--inject", "nan"))),
        "oom": Trial(runner(extra_args=("--inject", "oom"))),
        "rejected": Trial(runner(), prepare=_refused_by_deepspeed),
        "exit 7": Trial(runner(python=_program(programs / "exit7", crash))),
        "traceback": Trial(runner(env={"OMP_NUM_THREADS": "many"})),
        "no summary": Trial(runner(python="true")),
        "hang": Trial(runner(steps=6, extra_args=hang, hang_timeout_s=8)),
        "runner timeout": Trial(runner(steps=6, extra_args=hang, timeout_s=5)),
        "startup": Trial(runner(startup_timeout_s=1)),
        "deadline": Trial(runner(options={"deadline": "now+60"})),
        "cannot run": Trial(runner(), processes=4),
        "cancelled": Trial(runner(steps=6, extra_args=hang), helper=_scancel),
        "requeued": Trial(runner(steps=15, hang_timeout_s=8), helper=_requeue),
        "sacct": Trial(runner(), pruner=_wait_until_forgotten),
    }


@pytest.fixture(scope="module")
def ends(slurm: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Future[End]]]:
    """Every trial of `_trials`, all started at once, in folders whose names hold a space, a
    quote and a command substitution."""
    root = tmp_path_factory.mktemp("ends") / "it's a $(touch pwned) folder"
    trials = _trials(root / "programs")
    runners = [trial.runner for trial in trials.values()]
    with ThreadPoolExecutor(2 * len(trials)) as pool:

        def run(name: str, trial: Trial) -> End:
            cfg = tiny_config(processes=trial.processes)
            layout = first_layout(cfg, ONE if trial.processes == 1 else
                                  f"tp=1,pp=1,zero=0,mbs={4 // trial.processes}")
            seen: dict[str, Any] = {}
            pruner = trial.pruner
            report = (lambda step, rate: pruner(plan, seen)) if pruner else None
            plan = trial_plan(cfg, layout, root / name, report=report)
            trial.prepare(plan)
            helper = pool.submit(trial.helper, plan, seen) if trial.helper else None
            measurement = trial.runner.run(plan)
            seen["ended"] = True
            if helper is not None:
                helper.result(timeout=60)
            return End(measurement, plan, seen)

        yield {name: pool.submit(run, name, trial) for name, trial in trials.items()}
        for runner in runners:
            runner.cleanup()


def _end(ends: dict[str, Future[End]], name: str) -> End:
    return ends[name].result(timeout=600)


def _worker_exit_code(log: str) -> int:
    """The worker's exit code as torchrun reports it (its 'Root Cause' block)."""
    return int(re.search(r"exitcode\s*:\s*(-?\d+)", log).group(1))


def test_a_trial_that_trains_completes(ends: dict[str, Future[End]]) -> None:
    """Oracle: sacct says COMPLETED with exit code 0:0 in the trial folder; the runner's figures
    come from the steps the workload wrote (4); no file `pwned` was made by the shell."""
    end = _end(ends, "ok")
    assert end.measurement.status == "ok", end.measurement.reason
    assert end.measurement.extra["slurm_state"] == "COMPLETED"
    assert end.measurement.extra["steps_done"] == 4 and end.measurement.tokens_per_s > 0
    record = end.accounted()
    assert (record["State"], record["ExitCode"]) == ("COMPLETED", "0:0")
    assert record["WorkDir"] == str(end.plan.directory)
    root = end.plan.directory.parents[2]
    assert "$(touch pwned)" in root.name and not list(root.parent.rglob("pwned")), "it ran"


@pytest.mark.parametrize(("name", "status", "code", "words"), [
    ("nan", "nan", 3, "the workload reported nan"),
    ("oom", "oom", 4, "DefaultCPUAllocator: can't allocate memory"),
    ("rejected", "rejected", 5, "validation error for DeepSpeedZeroConfig"),
])
def test_a_failed_workload_is_classified_by_its_exit_code(
        ends: dict[str, Future[End]], name: str, status: str, code: int, words: str) -> None:
    """Oracle: sacct says FAILED, exit code 1:0 (torchrun's, for a failed worker); torchrun's
    report in the job's log names the worker's exit code, the workload's code for the failure
    (nan 3, oom 4, rejected 5: autotune.workloads.common.EXIT_CODES)."""
    end = _end(ends, name)
    assert EXIT_CODES[status] == code
    assert end.measurement.status == status, end.measurement.reason
    assert words in end.measurement.reason
    assert end.measurement.extra["slurm_state"] == "FAILED"
    record = end.accounted()
    assert (record["State"], record["ExitCode"]) == ("FAILED", "1:0")
    assert _worker_exit_code(end.log) == code


def test_a_program_that_exits_7_is_a_crash(ends: dict[str, Future[End]]) -> None:
    """Oracle: the program exits 7 (written in this test); sacct says FAILED with 7:0."""
    end = _end(ends, "exit 7")
    assert end.measurement.status == "crash"
    assert end.measurement.reason == ("exit code 7: RuntimeError: the trial program gave up; "
                                      "Slurm state FAILED")
    assert end.measurement.extra["exit_code"] == 7
    record = end.accounted()
    assert (record["State"], record["ExitCode"]) == ("FAILED", "7:0")


def test_a_workload_traceback_is_a_crash(ends: dict[str, Future[End]]) -> None:
    """OMP_NUM_THREADS=many makes the workload's int() raise. Oracle: Python's ValueError text,
    torchrun's worker exit code 1 (an uncaught exception) and sacct's FAILED."""
    end = _end(ends, "traceback")
    assert end.measurement.status == "crash"
    assert "ValueError: invalid literal for int() with base 10: 'many'" in end.measurement.reason
    assert _worker_exit_code(end.log) == 1
    assert end.accounted()["State"] == "FAILED"


def test_a_job_that_ends_without_a_summary_is_a_crash(ends: dict[str, Future[End]]) -> None:
    """`true` in place of the interpreter exits 0 without training. Oracle: sacct says
    COMPLETED 0:0, yet metrics.jsonl holds only the job script's job_start record."""
    end = _end(ends, "no summary")
    assert end.measurement.status == "crash"
    assert "wrote no summary" in end.measurement.reason
    assert [r["event"] for r in records_of(end.plan.directory)] == ["job_start"]
    record = end.accounted()
    assert (record["State"], record["ExitCode"]) == ("COMPLETED", "0:0")


@pytest.mark.parametrize(("name", "status", "words"), [
    ("hang", "hang", "no new step within 8 s (scancel)"),
    ("runner timeout", "timeout", "ran longer than 5 s (scancel)"),
    ("startup", "hang", "no first step within 1 s of the job's start (scancel)"),
])
def test_the_runner_cancels_at_its_limits(ends: dict[str, Future[End]], name: str, status: str,
                                          words: str) -> None:
    """Oracle: sacct says CANCELLED (the runner's scancel); the injected hang stops the
    workload at step 2 (autotune.workloads.common.INJECT_STEP), so the hang trial wrote 2
    steps."""
    end = _end(ends, name)
    assert end.measurement.status == status and words in end.measurement.reason
    assert end.accounted()["State"].startswith("CANCELLED")
    if name == "hang":
        assert sum(r["event"] == "step" for r in records_of(end.plan.directory)) == 2


def test_a_job_past_its_deadline_is_a_timeout(ends: dict[str, Future[End]]) -> None:
    """`--deadline now+60` with a 35-minute time limit (the runner's default) cannot be met.
    Oracle: Slurm ends the pending job DEADLINE (sacct) before its script ever ran (no
    metrics.jsonl, which the script's first line writes)."""
    end = _end(ends, "deadline")
    assert end.measurement.status == "timeout"
    assert end.measurement.reason == "reached its Slurm deadline; Slurm state DEADLINE"
    assert end.accounted()["State"] == "DEADLINE"
    assert not (end.plan.directory / "metrics.jsonl").exists(), "the job ran"


def test_a_job_the_cluster_cannot_run_is_rejected(ends: dict[str, Future[End]]) -> None:
    """4 CPUs per task on a 2-CPU node (the test cluster has EnforcePartLimits=ALL). Oracle:
    sbatch's own refusal, quoted in the reason."""
    end = ends["cannot run"].result(timeout=60).measurement
    assert end.status == "rejected"
    assert end.reason == ("sbatch refused the job: sbatch: error: Batch job submission failed: "
                          "More processors requested than permitted")


def test_a_job_cancelled_by_someone_else_is_a_crash(ends: dict[str, Future[End]]) -> None:
    """The test runs `scancel` after the first measured step. Oracle: sacct's CANCELLED, and
    `scontrol show job` of the running job (in a folder with a space and a quote)."""
    end = _end(ends, "cancelled")
    assert end.measurement.status == "crash"
    assert end.measurement.reason == ("cancelled outside autotune (scancel by a user or an "
                                      "admin); Slurm state CANCELLED")
    assert end.accounted()["State"].startswith("CANCELLED")
    running: JobInfo = end.seen["job_info"]
    assert (running.state, running.work_dir) == ("RUNNING", str(end.plan.directory))
    assert end.job_id not in queued_jobs()


def test_a_requeued_job_is_followed_to_its_second_run(ends: dict[str, Future[End]]) -> None:
    """The test runs `scontrol requeue` after the first measured step; Slurm starts the job
    again some 11 s later (cred_expire=10 on the test cluster), more than the runner's 8 s hang
    timeout. Oracle: sacct keeps the first run as REQUEUED and the second COMPLETED; the job
    script logs restart 1. The figures are those of the second run alone (15 steps, not 15 +
    the first run's), and the wait in the queue is no hang."""
    end = _end(ends, "requeued")
    assert end.measurement.status == "ok", end.measurement.reason
    assert end.measurement.extra["slurm_state"] == "COMPLETED"
    assert end.measurement.extra["steps_done"] == 15
    assert end.seen["steps_before"] >= 2
    states = [record["State"] for record in accounting(end.job_id)]
    assert states == ["REQUEUED", "COMPLETED"]
    starts = [r["restart"] for r in records_of(end.plan.directory) if r["event"] == "job_start"]
    assert starts == [0, 1]


def test_the_end_of_a_forgotten_job_comes_from_sacct(ends: dict[str, Future[End]]) -> None:
    """The pruner holds the runner until slurmctld has purged the finished job (MinJobAge=2 on
    the test cluster). Oracle: `scontrol show job` no longer knows it, so the COMPLETED state the
    runner reports can only come from Slurm's accounting (without it: UNKNOWN)."""
    end = _end(ends, "sacct")
    assert end.seen["forgotten"] == end.job_id
    assert not slurmctld_knows(end.job_id)
    assert end.measurement.status == "ok", end.measurement.reason
    assert end.measurement.extra["slurm_state"] == "COMPLETED"
    assert end.measurement.extra["exit_code"] == 0


def test_slurm_time_limit_is_a_timeout(time_limit_trial: Future) -> None:
    """A trial that hangs under `--time=1`. Oracle: Slurm ends it TIMEOUT (sacct), at least a
    minute after its start."""
    measurement = time_limit_trial.result(timeout=300)
    assert measurement.status == "timeout", measurement.reason
    assert measurement.reason == "reached its Slurm time limit (1); Slurm state TIMEOUT"
    record = accounting(measurement.extra["slurm_job_id"])[-1]
    assert record["State"] == "TIMEOUT"
    start, end = (datetime.fromisoformat(record[key]) for key in ("Start", "End"))
    assert (end - start).total_seconds() >= 60
