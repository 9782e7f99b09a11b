"""The Slurm ends that the localhost cluster cannot produce, played by a fake Slurm.

Faked, and only these: OUT_OF_MEMORY needs Slurm to enforce a job's memory in a cgroup
(task/cgroup with ConstrainRAMSpace), which the test cluster runs without (proctrack/linuxproc,
task/none: CI containers do not delegate cgroups); PREEMPTED needs a second partition and a
preemption policy, NODE_FAIL and BOOT_FAIL a node that dies or does not boot, and each of those
would take the one node away from the other tests' jobs. Every other end runs for real in
test_slurm_outcomes.py.

The fake replaces the module's `submit`, `queue_states`, `job_info` and `cancel`: each job is
RUNNING for a few squeue calls, writes the given records to metrics.jsonl, then ends in the
state given for its submission. The oracle is Slurm's documented meaning of each state
(slurm.schedmd.com/job_state_codes.html): OUT_OF_MEMORY is the job's own memory limit (the
layout's fault: status oom), the three others say nothing about the layout (submit again).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Sequence
from pathlib import Path

import pytest
from helpers_cluster import first_layout
from helpers_cluster import tiny_config
from helpers_cluster import trial_plan

import autotune.runners.slurm as slurm
import autotune.runners.slurm_client as slurm_client
from autotune.measurement import Measurement
from autotune.runners.slurm import JobInfo
from autotune.runners.slurm import SlurmRunner

STEPS = [{"event": "step", "step_time_s": 0.5, "tokens": 256, "tokens_per_s": 512.0,
          "warmup": i == 0} for i in range(4)]
SUMMARY = {"event": "summary", "status": "ok", "median_step_time_s": 0.5}


class FakeSlurm:
    """Jobs that are RUNNING for 3 squeue calls, writing `records` to metrics.jsonl, then end in
    `ends[i]` (the i-th submission; the last one repeats)."""

    def __init__(self, ends: Sequence[str], records: Sequence[dict]) -> None:
        self.ends, self.records = list(ends), records
        self.jobs: dict[str, dict] = {}
        self.lock = threading.Lock()

    def submit(self, script: Path, env: object = None) -> str:
        with self.lock:
            job_id = str(100 + len(self.jobs))
            end = self.ends[min(len(self.jobs), len(self.ends) - 1)]
            self.jobs[job_id] = {"dir": script.parent, "left": 3, "end": end}
        return job_id

    def queue_states(self, ids: Sequence[str]) -> dict[str, JobInfo]:
        with self.lock:
            found = {}
            for job_id in ids:
                job = self.jobs[job_id]
                if job["left"] == 3:  # the job starts: it writes its records
                    with (job["dir"] / "metrics.jsonl").open("a") as handle:
                        handle.writelines(json.dumps(r) + "\n" for r in self.records)
                job["left"] -= 1
                found[job_id] = (JobInfo(job_id, "RUNNING", name="x", nodes="n1")
                                 if job["left"] >= 0 else self._final(job_id))
            return found

    def _final(self, job_id: str) -> JobInfo:
        job = self.jobs[job_id]
        code = 0 if job["end"] == "COMPLETED" else None
        if code is not None:
            (job["dir"] / "exit_code").write_text(f"{code}\n")
        return JobInfo(job_id, job["end"], exit_code=code, name="x", nodes="n1",
                       work_dir=str(job["dir"]))

    def job_info(self, job_id: str) -> JobInfo:
        with self.lock:
            return self._final(job_id)

    def cancel(self, job_id: str) -> None:
        raise AssertionError(f"the runner cancelled job {job_id}")


def _run(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fake: FakeSlurm,
         retries: int = 1) -> Measurement:
    for name in ("submit", "queue_states", "job_info", "cancel"):
        monkeypatch.setattr(slurm, name, getattr(fake, name))
    monkeypatch.setattr(slurm_client, "queue_states", fake.queue_states)  # the poller's
    cfg = tiny_config()
    plan = trial_plan(cfg, first_layout(cfg), tmp_path)
    return SlurmRunner(poll_s=0.0, steps=4, warmup=1, retries=retries).run(plan)


def test_out_of_memory_is_oom(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Fake: OUT_OF_MEMORY needs Slurm's memory cgroup. Oracle: Slurm documents the state as
    'experienced out of memory error' (the job's limit): status oom, not retried."""
    fake = FakeSlurm(["OUT_OF_MEMORY"], STEPS[:2])
    measurement = _run(monkeypatch, tmp_path, fake)
    assert measurement.status == "oom"
    assert measurement.reason == ("Slurm: out of memory (the job's memory limit); "
                                  "Slurm state OUT_OF_MEMORY")
    assert len(fake.jobs) == 1


@pytest.mark.parametrize("first", ["PREEMPTED", "NODE_FAIL", "BOOT_FAIL"])
def test_infrastructure_failures_are_submitted_again(monkeypatch: pytest.MonkeyPatch,
                                                     tmp_path: Path, first: str) -> None:
    """Fake: preemption and node failures would take the test cluster's one node away. Oracle:
    the state is the cluster's doing, so the second submission's measurement stands (its 3
    measured steps at 512 tokens/s, written by the fake)."""
    fake = FakeSlurm([first, "COMPLETED"], [*STEPS, SUMMARY])
    measurement = _run(monkeypatch, tmp_path, fake)
    assert measurement.status == "ok", measurement.reason
    assert measurement.tokens_per_s == pytest.approx(512.0)
    assert sorted(fake.jobs) == ["100", "101"] and measurement.extra["slurm_job_id"] == "101"


def test_a_node_failure_after_the_last_retry_is_a_crash(monkeypatch: pytest.MonkeyPatch,
                                                         tmp_path: Path) -> None:
    """Fake: as above. Oracle: with retries=1, two submissions, then the state is reported."""
    fake = FakeSlurm(["NODE_FAIL"], STEPS[:1])
    measurement = _run(monkeypatch, tmp_path, fake, retries=1)
    assert measurement.status == "crash"
    assert measurement.reason == "Slurm state NODE_FAIL after 1 resubmission(s)"
    assert sorted(fake.jobs) == ["100", "101"]
