"""Every end a job can really have on the localhost Slurm, through the real SlurmRunner.

The trials (helpers_slurm_ends.py: one per end, each provoked for real) run side by side from
the first Slurm test on (`conftest.slurm_ends`); each test checks one of them. The oracles are
Slurm's own records of the job (`sacct`, kept by slurmdbd), torchrun's report of the worker's
exit code in the job's log, and the workload's exit codes (`autotune.workloads.common.EXIT_CODES`,
asserted by hand below).
"""

from __future__ import annotations

import re
from datetime import datetime

import pytest
from helpers_cluster import accounting
from helpers_cluster import queued_jobs
from helpers_cluster import records_of
from helpers_cluster import slurmctld_knows
from helpers_slurm_ends import Batch

from autotune.runners.slurm import JobInfo
from autotune.workloads.records import EXIT_CODES

pytestmark = pytest.mark.slow


def _worker_exit_code(log: str) -> int:
    """The worker's exit code as torchrun reports it (its 'Root Cause' block)."""
    return int(re.search(r"exitcode\s*:\s*(-?\d+)", log).group(1))


def test_a_trial_that_trains_completes(slurm_ends: Batch) -> None:
    """Oracle: sacct says COMPLETED with exit code 0:0 in the trial folder; the runner's figures
    come from the steps the workload wrote (4); no file `pwned` was made by the shell."""
    end = slurm_ends.end("ok")
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
        slurm_ends: Batch, name: str, status: str, code: int, words: str) -> None:
    """Oracle: sacct says FAILED, exit code 1:0 (torchrun's, for a failed worker); torchrun's
    report in the job's log names the worker's exit code, the workload's code for the failure
    (nan 3, oom 4, rejected 5: autotune.workloads.common.EXIT_CODES)."""
    end = slurm_ends.end(name)
    assert EXIT_CODES[status] == code
    assert end.measurement.status == status, end.measurement.reason
    assert words in end.measurement.reason
    assert end.measurement.extra["slurm_state"] == "FAILED"
    record = end.accounted()
    assert (record["State"], record["ExitCode"]) == ("FAILED", "1:0")
    assert _worker_exit_code(end.log) == code


def test_a_program_that_exits_7_is_a_crash(slurm_ends: Batch) -> None:
    """Oracle: the stand-in interpreter exits 7 (a shell script, helpers_slurm_ends.py); sacct
    says FAILED with 7:0."""
    end = slurm_ends.end("exit 7")
    assert end.measurement.status == "crash"
    assert end.measurement.reason == ("exit code 7: RuntimeError: the trial program gave up; "
                                      "Slurm state FAILED")
    assert end.measurement.extra["exit_code"] == 7
    record = end.accounted()
    assert (record["State"], record["ExitCode"]) == ("FAILED", "7:0")


def test_a_job_that_ends_without_a_summary_is_a_crash(slurm_ends: Batch) -> None:
    """`true` in place of the interpreter exits 0 without training. Oracle: sacct says
    COMPLETED 0:0, yet metrics.jsonl holds only the job script's job_start record."""
    end = slurm_ends.end("no summary")
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
def test_the_runner_cancels_at_its_limits(slurm_ends: Batch, name: str, status: str,
                                          words: str) -> None:
    """The workload hangs at step 2 (`--inject hang`); a `sleep` runs past the runner's timeout
    and never makes a first step. Oracle: sacct says CANCELLED (the runner's scancel); the hang
    trial wrote 2 steps (autotune.workloads.common.INJECT_STEP)."""
    end = slurm_ends.end(name)
    assert end.measurement.status == status and words in end.measurement.reason
    assert end.accounted()["State"].startswith("CANCELLED")
    if name == "hang":
        assert sum(r["event"] == "step" for r in records_of(end.plan.directory)) == 2


def test_a_job_past_its_deadline_is_a_timeout(slurm_ends: Batch) -> None:
    """`--deadline now+60` with a 35-minute time limit (the runner's default) cannot be met.
    Oracle: Slurm ends the pending job DEADLINE (sacct) before its script ever ran (no
    metrics.jsonl, which the script's first line writes) on no node (sacct: `None assigned`)."""
    end = slurm_ends.end("deadline")
    assert end.measurement.status == "timeout"
    assert end.measurement.reason == "reached its Slurm deadline; Slurm state DEADLINE"
    assert end.measurement.extra["slurm_nodes"] == ""
    assert end.accounted()["State"] == "DEADLINE"
    assert not (end.plan.directory / "metrics.jsonl").exists(), "the job ran"


def test_a_job_the_cluster_cannot_run_is_rejected(slurm_ends: Batch) -> None:
    """4 CPUs per task on a 2-CPU node (the test cluster has EnforcePartLimits=ALL). Oracle:
    sbatch's own refusal, quoted in the reason."""
    end = slurm_ends.end("cannot run").measurement
    assert end.status == "rejected"
    assert end.reason == ("sbatch refused the job: sbatch: error: Batch job submission failed: "
                          "More processors requested than permitted")


def test_a_job_cancelled_by_someone_else_is_a_crash(slurm_ends: Batch) -> None:
    """The test runs `scancel` once the job (a `sleep`) runs. Oracle: sacct's CANCELLED, and
    `scontrol show job` of the running job, in a folder with a space, a quote and `$(...)`."""
    end = slurm_ends.end("cancelled")
    assert end.measurement.status == "crash"
    assert end.measurement.reason == ("cancelled outside autotune (scancel by a user or an "
                                      "admin); Slurm state CANCELLED")
    assert end.accounted()["State"].startswith("CANCELLED")
    running: JobInfo = end.seen["job_info"]
    assert (running.state, running.work_dir) == ("RUNNING", str(end.plan.directory))
    assert end.job_id not in queued_jobs()


def test_a_requeued_job_is_followed_to_its_second_run(slurm_ends: Batch) -> None:
    """The test runs `scontrol requeue` after the first measured step; Slurm starts the job
    again some 11 s later (cred_expire=10 on the test cluster), more than the runner's 8 s hang
    timeout. Oracle: sacct keeps the first run as REQUEUED and the second COMPLETED; the job
    script logs restart 1. The figures are those of the second run alone (15 steps, not 15 +
    the first run's), and the wait in the queue is no hang."""
    end = slurm_ends.end("requeued")
    assert end.measurement.status == "ok", end.measurement.reason
    assert end.measurement.extra["slurm_state"] == "COMPLETED"
    assert end.measurement.extra["steps_done"] == 15
    assert end.seen["steps_before"] >= 2
    states = [record["State"] for record in accounting(end.job_id)]
    assert states == ["REQUEUED", "COMPLETED"]
    starts = [r["restart"] for r in records_of(end.plan.directory) if r["event"] == "job_start"]
    assert starts == [0, 1]


def test_the_end_of_a_forgotten_job_comes_from_sacct(slurm_ends: Batch) -> None:
    """The pruner holds the runner (trial "ok") until slurmctld has purged the finished job
    (MinJobAge=2 on the test cluster). Oracle: `scontrol show job` no longer knows it, so the
    COMPLETED state the runner reports can only come from Slurm's accounting (without it:
    UNKNOWN)."""
    end = slurm_ends.end("ok")
    assert end.seen["forgotten"] == end.job_id
    assert not slurmctld_knows(end.job_id)
    assert end.measurement.status == "ok", end.measurement.reason
    assert end.measurement.extra["slurm_state"] == "COMPLETED"
    assert end.measurement.extra["exit_code"] == 0


def test_slurm_time_limit_is_a_timeout(slurm_ends: Batch) -> None:
    """A `sleep` under `--time=1`. Oracle: Slurm ends it TIMEOUT (sacct), at least a minute
    after its start."""
    end = slurm_ends.end("time limit")
    assert end.measurement.status == "timeout", end.measurement.reason
    assert end.measurement.reason == "reached its Slurm time limit (1); Slurm state TIMEOUT"
    record = end.accounted()
    assert record["State"] == "TIMEOUT"
    start, stop = (datetime.fromisoformat(record[key]) for key in ("Start", "End"))
    assert (stop - start).total_seconds() >= 60
