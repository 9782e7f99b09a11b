"""The slurm runner without a cluster: job scripts, sizing, and how each Slurm end is classified.

A fake `sbatch`/`squeue`/`scontrol`/`scancel` (the module's functions, patched) plays back a
scripted life for every job, so every state Slurm can end in is covered in milliseconds.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import stat
import subprocess
import threading
import time
from collections.abc import Callable
from collections.abc import Sequence
from pathlib import Path

import pytest
from helpers_cluster import first_layout
from helpers_cluster import tiny_config
from helpers_cluster import trial_plan

import autotune.runners.slurm as slurm
import autotune.runners.slurm_client as slurm_client
from autotune.exceptions import AutotuneError
from autotune.frameworks import get_framework
from autotune.inputs import load_config
from autotune.layout import Layout
from autotune.runners.base import Measurement
from autotune.runners.base import TrialPlan
from autotune.runners.slurm import JOB_FILE
from autotune.runners.slurm import SlurmRunner
from autotune.runners.slurm import trial_sbatch_script
from autotune.runners.slurm_client import JobInfo
from autotune.runners.slurm_client import parse_slurm_opts
from autotune.runners.slurm_client import sbatch_directives

STEP = {"event": "step", "step_time_s": 0.5, "tokens": 256, "tokens_per_s": 512.0,
        "peak_memory_bytes": 1e8}
SUMMARY = {"event": "summary", "status": "ok", "median_step_time_s": 0.5}
REAL_SLEEP = time.sleep


class FakeSlurm:
    """Jobs that live `polls` squeue calls (RUNNING), writing `records` to metrics.jsonl, then end
    in `ends[i]` (one per submission); an scancel ends a job CANCELLED at the next call."""

    def __init__(self, ends: Sequence[str], records: Sequence[dict] = (), exit_code: int = 0,
                 log: str = "", polls: int = 3) -> None:
        self.ends, self.records, self.exit_code, self.log = list(ends), records, exit_code, log
        self.polls = polls
        self.jobs: dict[str, dict] = {}
        self.cancelled: list[str] = []
        self.squeue_calls = 0
        self.lock = threading.Lock()

    def submit(self, script: Path, env: object = None) -> str:
        with self.lock:
            job_id = str(100 + len(self.jobs))
            end = self.ends[min(len(self.jobs), len(self.ends) - 1)]
            self.jobs[job_id] = {"dir": script.parent, "left": self.polls, "end": end}
        return job_id

    def queue_states(self, ids: Sequence[str]) -> dict[str, JobInfo]:
        with self.lock:
            self.squeue_calls += 1
            found = {}
            for job_id in ids:
                job = self.jobs[job_id]
                if job["left"] > 0 and job_id not in self.cancelled:
                    job["left"] -= 1
                    if job["left"] == self.polls - 1:  # the job starts: it writes its records
                        self._write(job_id, job)
                    found[job_id] = JobInfo(job_id, "RUNNING", name="x", nodes="n1")
                else:
                    found[job_id] = self._final(job_id)
            return found

    def _write(self, job_id: str, job: dict) -> None:
        with (job["dir"] / "metrics.jsonl").open("a") as handle:
            for record in self.records:
                handle.write(json.dumps(record) + "\n")
        (job["dir"] / f"slurm-{job_id}.out").write_text(self.log)

    def _final(self, job_id: str) -> JobInfo:
        state = "CANCELLED" if job_id in self.cancelled else self.jobs[job_id]["end"]
        if state in ("COMPLETED", "FAILED"):
            (self.jobs[job_id]["dir"] / "exit_code").write_text(f"{self.exit_code}\n")
        return JobInfo(job_id, state, exit_code=self.exit_code, name="x", nodes="n1",
                       work_dir=str(self.jobs[job_id]["dir"]))

    def job_info(self, job_id: str) -> JobInfo:
        with self.lock:
            return self._final(job_id)

    def cancel(self, job_id: str) -> None:
        with self.lock:
            self.cancelled.append(job_id)


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    cluster = FakeSlurm(["COMPLETED"])
    for name in ("submit", "queue_states", "job_info", "cancel"):
        monkeypatch.setattr(slurm, name, getattr(cluster, name))
    monkeypatch.setattr(slurm_client, "queue_states", cluster.queue_states)  # the poller's
    monkeypatch.setattr(slurm.time, "sleep", lambda s: None)  # polls back to back
    return cluster


def _run(fake: FakeSlurm, tmp_path: Path, runner: SlurmRunner | None = None,
         **plan_kw: object) -> Measurement:
    cfg = tiny_config()
    plan = trial_plan(cfg, first_layout(cfg), tmp_path, **plan_kw)
    return (runner or SlurmRunner(poll_s=0.0, steps=4, warmup=1)).run(plan)


@pytest.mark.parametrize(
    ("end", "exit_code", "log", "records", "status", "words"),
    [
        ("TIMEOUT", 0, "", [], "timeout", "Slurm time limit"),
        ("DEADLINE", 0, "", [], "timeout", "deadline"),
        ("OUT_OF_MEMORY", 0, "", [], "oom", "out of memory"),
        ("CANCELLED", 0, "", [], "crash", "outside autotune"),
        ("NODE_FAIL", 0, "", [], "crash", "NODE_FAIL"),
        ("FAILED", 4, "", [], "oom", "exited with code 4"),
        ("FAILED", 1, "Watchdog caught collective operation timeout", [], "nccl_timeout",
         "Watchdog"),
        ("FAILED", 1, "RuntimeError: boom", [], "crash", "boom"),
        ("FAILED", 3, "", [{**SUMMARY, "status": "nan"}], "nan", "nan"),
        ("COMPLETED", 0, "", [STEP], "crash", "no summary"),
        ("COMPLETED", 0, "", [{**STEP, "warmup": True}, STEP, STEP, SUMMARY], "ok", ""),
    ],
)
def test_slurm_end_maps_to_status(fake: FakeSlurm, tmp_path: Path, end: str, exit_code: int,
                                  log: str, records: list[dict], status: str, words: str) -> None:
    fake.ends, fake.exit_code, fake.records, fake.log = [end], exit_code, records, log
    measurement = _run(fake, tmp_path, SlurmRunner(poll_s=0.0, steps=4, warmup=1, retries=0))
    assert measurement.status == status, measurement.reason
    assert words in measurement.reason
    assert measurement.extra["slurm_job_id"] == "100"
    assert measurement.extra["slurm_state"] == end
    if status == "ok":
        assert measurement.tokens_per_s == pytest.approx(512.0)
        assert measurement.tflops_per_gpu and measurement.mfu


@pytest.mark.parametrize("first", ["PREEMPTED", "NODE_FAIL", "BOOT_FAIL"])
def test_infrastructure_failures_are_submitted_again(fake: FakeSlurm, tmp_path: Path,
                                                     first: str) -> None:
    fake.ends, fake.records = [first, "COMPLETED"], [STEP, SUMMARY]
    measurement = _run(fake, tmp_path)
    assert measurement.status == "ok", measurement.reason
    assert len(fake.jobs) == 2 and measurement.extra["slurm_job_id"] == "101"


def test_pruner_cancels_through_scancel(fake: FakeSlurm, tmp_path: Path) -> None:
    fake.records, fake.polls = [STEP, STEP], 50
    measurement = _run(fake, tmp_path, report=lambda step, rate: step >= 2)
    assert measurement.status == "pruned"
    assert fake.cancelled == ["100"]
    record = json.loads((tmp_path / "trials").glob("*/slurm_job.json").__next__().read_text())
    assert record["cancelled"] == "pruned"


@dataclasses.dataclass(frozen=True)
class PlanWithAttrs(TrialPlan):
    """TrialPlan with the fields proposed for runners/base.py (the trial's attributes and a
    setter), whether or not TrialPlan has them yet."""

    attrs: dict = dataclasses.field(default_factory=dict)
    note: Callable[[str, object], None] = lambda key, value: None


def test_a_retry_reattaches_to_the_job_it_inherited(fake: FakeSlurm, tmp_path: Path) -> None:
    """A dead worker's trial is retried by another worker (another output folder): the retry
    carries `slurm_job_id`, so the runner follows that job instead of submitting again."""
    fake.records, fake.polls = [STEP, SUMMARY], 3
    runner = SlurmRunner(poll_s=0.0, steps=4, warmup=1)
    cfg = tiny_config()
    old = trial_plan(cfg, first_layout(cfg), tmp_path / "worker-a", number=3)
    job_id = fake.submit(old.directory / "trial.sbatch")
    record = {"job_id": job_id, "job_name": "x", "fingerprint": runner.fingerprint(old)}
    (old.directory / JOB_FILE).write_text(json.dumps(record))
    noted: dict[str, object] = {}
    new = trial_plan(cfg, first_layout(cfg), tmp_path / "worker-b", number=9)
    fields = {f.name: getattr(new, f.name) for f in dataclasses.fields(new)
              if f.name not in ("attrs", "note")}
    plan = PlanWithAttrs(**fields, attrs={"slurm_job_id": job_id}, note=noted.__setitem__)
    measurement = runner.run(plan)
    assert measurement.status == "ok" and measurement.extra["slurm_job_id"] == job_id
    assert len(fake.jobs) == 1, "submitted again"
    assert noted == {"slurm_job_id": job_id, "slurm_trial_dir": str(old.directory)}


@pytest.mark.parametrize(("limits", "status"), [
    ({"timeout_s": -1.0}, "timeout"),
    ({"startup_timeout_s": -1.0}, "hang"),
])
def test_runner_limits_cancel_the_job(fake: FakeSlurm, tmp_path: Path, limits: dict,
                                      status: str) -> None:
    fake.polls = 50
    runner = SlurmRunner(poll_s=0.0, steps=4, warmup=1, **limits)
    measurement = _run(fake, tmp_path, runner)
    assert measurement.status == status and fake.cancelled == ["100"]


def test_threads_share_one_squeue_per_poll(fake: FakeSlurm, tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    fake.records, fake.polls = [STEP, SUMMARY], 20
    runner = SlurmRunner(poll_s=0.05, steps=4, warmup=0)
    cfg = tiny_config()
    layouts = [first_layout(cfg, f"tp=1,pp=1,zero={z},mbs={m}") for z in (0, 1) for m in (1, 2)]
    plans = [trial_plan(cfg, lay, tmp_path, number=i) for i, lay in enumerate(layouts)]
    results: list = [None] * 4
    monkeypatch.setattr(slurm.time, "sleep", REAL_SLEEP)  # the threads must interleave

    def work(i: int) -> None:
        results[i] = runner.run(plans[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert [m.status for m in results] == ["ok"] * 4
    assert len({m.extra["slurm_job_id"] for m in results}) == 4
    assert fake.squeue_calls < 4 * 20, "each thread polled squeue on its own"


def test_submission_errors(fake: FakeSlurm, tmp_path: Path,
                           monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(script: Path, env: object = None) -> str:
        raise slurm.SlurmError("sbatch refused the job: Requested node configuration is not "
                               "available")

    monkeypatch.setattr(slurm, "submit", refuse)
    assert _run(fake, tmp_path).status == "rejected"
    megatron = load_config("tiny-gpt", "local", processes=2, framework="megatron",
                           seq_length=64, global_batch_size=4)
    with pytest.raises(AutotuneError, match="--framework megatron: .*GPUs only.*--framework deep"):
        SlurmRunner().check(megatron)


def test_scontrol_output_keeps_paths_with_spaces() -> None:
    text = ("JobId=7 JobName=autotune-0001-x\n   JobState=TIMEOUT Reason=TimeLimit\n"
            "   ExitCode=0:15\n   WorkDir=/shared/my runs/trials/0001-x\n   NodeList=n[1-2]\n")
    fields = slurm_client._scontrol_fields(text)
    assert fields["WorkDir"] == "/shared/my runs/trials/0001-x"
    assert fields["JobState"] == "TIMEOUT" and fields["NodeList"] == "n[1-2]"
    assert slurm_client._exit_code("0:15") == -15 and slurm_client._exit_code("4:0") == 4


# --- the job script --------------------------------------------------------------------------


def test_directives_are_checked() -> None:
    assert parse_slurm_opts(["qos=high", "exclusive", "constraint=a100&ib"]) == {
        "qos": "high", "exclusive": None, "constraint": "a100&ib"}
    assert sbatch_directives({"qos": "high", "exclusive": None}) == ["--qos=high", "--exclusive"]
    for bad in ({"qos": "a b"}, {"qos": "x#y"}, {"Bad Key": "1"}, {"mail-user": "'q'"}):
        with pytest.raises(AutotuneError, match="--slurm-opt"):
            sbatch_directives(bad)
    runner = SlurmRunner(partition="gpu", account="proj", time_limit="0:30:00",
                         options={"qos": "high"})
    assert runner.directives == ["--partition=gpu", "--account=proj", "--time=0:30:00",
                                 "--qos=high"]
    assert "--time=35" in SlurmRunner(timeout_s=1800).directives


def _lint(script: str, path: Path) -> None:
    """shellcheck the script, where it is installed (.ci/run installs it)."""
    if shutil.which("shellcheck"):
        path.write_text(script)
        lint = subprocess.run(["shellcheck", "-s", "bash", str(path)], capture_output=True,
                              text=True, check=False)
        assert lint.returncode == 0, lint.stdout


def test_script_is_sized_from_the_layout(tmp_path: Path) -> None:
    gpu = load_config("tiny-gpt", "dgx-h100:2", framework="deepspeed")
    layout = Layout.parse("tp=1,pp=1,zero=1,mbs=1", 16, gpu.train.global_batch_size,
        get_framework("deepspeed"))
    plan = trial_plan(gpu, layout, tmp_path)
    runner = SlurmRunner(partition="gpu", options={"qos": "high"})
    script = trial_sbatch_script(plan, job_name="j", directives=runner.directives,
                                 python="python", args=runner.program_args(plan))
    assert "#SBATCH --nodes=2" in script and "#SBATCH --gpus-per-node=8" in script
    assert "#SBATCH --exclusive" in script and "--nproc_per_node 8" in script
    assert "#SBATCH --partition=gpu" in script and "#SBATCH --qos=high" in script
    _lint(script, tmp_path / "gpu.sbatch")
    cpu = tiny_config()
    plan = trial_plan(cpu, first_layout(cpu), tmp_path / "cpu")
    script = trial_sbatch_script(plan, job_name="j", directives=[], python="python", args=[])
    assert "#SBATCH --nodes=1" in script and "#SBATCH --cpus-per-task=2" in script
    assert "gpus" not in script and "--nproc_per_node 2" in script
    _lint(script, tmp_path / "cpu.sbatch")


def _executable(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def test_script_quotes_every_value(tmp_path: Path) -> None:
    """Run the job script with stand-ins for scontrol, srun and python: a folder and arguments
    full of shell syntax reach the workload unchanged, and nothing in them runs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _executable(bin_dir / "scontrol", "#!/bin/sh\necho node-a\necho node-b\n")
    # srun: drop its own options, run the task as node 1 of 2
    _executable(bin_dir / "srun", "#!/bin/sh\nwhile [ \"${1#--}\" != \"$1\" ]; do shift; done\n"
                                  "SLURM_NODEID=1 SLURM_NNODES=2 exec \"$@\"\n")
    _executable(bin_dir / "fake python", "#!/usr/bin/env python3\nimport json, os, sys\n"
                "json.dump([sys.argv[1:], os.environ['MASTER_ADDR']], open('argv.json', 'w'))\n")
    cfg = tiny_config()
    odd = tmp_path / "it's a $(touch pwned) `touch pwned2` folder"
    plan = trial_plan(cfg, first_layout(cfg), odd)
    args = ["--model", "a b", "--x", "$(touch pwned3)", "'; touch pwned4 #"]
    script = trial_sbatch_script(plan, job_name="j", directives=[],
                                 python=str(bin_dir / "fake python"), args=args)
    path = plan.directory / "trial.sbatch"
    path.write_text(script)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "7",
           "SLURM_JOB_NODELIST": "node-[a-b]"}
    done = subprocess.run(["bash", str(path)], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=30, check=False)
    assert done.returncode == 0, done.stderr
    argv, master = json.loads((plan.directory / "argv.json").read_text())
    assert master == "node-a"
    assert argv[:6] == ["-m", "torch.distributed.run", "--nnodes", "2", "--node_rank", "1"]
    assert argv[-len(args) - 2:] == ["-m", "autotune.workloads.deepspeed_gpt", *args]
    assert "--master_port" in argv and argv[argv.index("--master_port") + 1] == "20007"
    assert (plan.directory / "exit_code").read_text().strip() == "0"
    assert not list(tmp_path.rglob("pwned*")), "a value was executed by the shell"
    start = json.loads((plan.directory / "metrics.jsonl").read_text().splitlines()[0])
    assert start == {"event": "job_start", "job_id": "7", "restart": 0, "master": "node-a:20007"}
