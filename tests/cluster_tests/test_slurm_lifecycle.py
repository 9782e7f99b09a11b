"""The slurm runner on a real one-node Slurm (tests/services/slurm.sh): a study of real
training jobs, the pruner's scancel, and a tuner that dies and is resumed.

Slurm's records of each job (`sacct`) are the oracle.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers_cluster import ONE
from helpers_cluster import SPACE
from helpers_cluster import accounting
from helpers_cluster import first_layout
from helpers_cluster import job_id_of
from helpers_cluster import processes_mentioning
from helpers_cluster import queued_jobs
from helpers_cluster import tiny_config
from helpers_cluster import trial_plan
from helpers_cluster import wait_for

import autotune.runners.slurm_client as slurm_client
from autotune.measurement import Measurement
from autotune.runners.slurm import JOB_FILE
from autotune.runners.slurm import JobInfo
from autotune.runners.slurm import SlurmRunner
from autotune.search.settings import TuneSettings
from autotune.search.study import tune

HERE = Path(__file__).resolve().parent
pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("slurm")]


def test_study_trains_layouts_on_slurm_two_at_a_time(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """`tune --jobs 2` on Slurm. Oracle: sacct's records of the jobs (COMPLETED, 2 CPUs on 1
    node each, two of them running at the same time) and the squeue calls the runner made (the
    real ones, counted: one call asks for both threads' jobs)."""
    calls: list[list[str]] = []
    real_queue_states = slurm_client.queue_states

    def counted(job_ids: Sequence[str]) -> dict[str, JobInfo]:
        calls.append(list(job_ids))
        return real_queue_states(job_ids)

    monkeypatch.setattr(slurm_client, "queue_states", counted)  # the poller asks squeue
    cfg = tiny_config()
    runner = SlurmRunner(poll_s=1.0, steps=4, warmup=1)
    # the pruner test below prunes; here none
    options = TuneSettings(trials=2, jobs=2, warm_start=2, render=False, pruner_tolerance=1.0)
    result = tune(cfg, SPACE, runner, options, tmp_path)
    ran = [r for r in result.records if r.get("ran")]
    print("\n#  layout                          job  Slurm state  status  tokens/s  step s")
    for r in sorted(ran, key=lambda r: r["number"]):
        print(f"{r['number']:<2} {r['layout_id']:<31} {r['slurm_job_id']:>4}  "
              f"{r['slurm_state']:<11}  {r['status']:<6}  "
              f"{r.get('measured_tokens_per_s', 0):8.0f}  {r.get('measured_step_time_s', 0):.3f}")
    # two threads: the second may start one more trial before the first one's stop lands
    assert len(ran) >= 2 and all(r["status"] == "ok" for r in ran), [r.get("reason") for r in ran]
    assert all(r["slurm_state"] == "COMPLETED" and r["measured_tokens_per_s"] > 0 for r in ran)
    jobs = [accounting(r["slurm_job_id"])[-1] for r in ran]
    assert len({j["JobID"] for j in jobs}) == len(ran)
    assert all((j["State"], j["AllocCPUS"], j["NNodes"]) == ("COMPLETED", "2", "1") for j in jobs)
    spans = sorted((j["Start"], j["End"]) for j in jobs)
    overlap = any(b[0] < a[1] for a, b in zip(spans, spans[1:], strict=False))
    assert overlap, f"--jobs 2 should keep two jobs in flight: {spans}"
    study_jobs = {j["JobID"] for j in jobs}
    assert any(len(study_jobs.intersection(ids)) >= 2 for ids in calls), "one squeue per job"
    folder = Path(ran[0]["trial_dir"])
    for name in ("trial.sbatch", JOB_FILE, "metrics.jsonl", f"slurm-{ran[0]['slurm_job_id']}.out"):
        assert (folder / name).exists(), name


def test_pruner_cancels_the_job(tmp_path: Path) -> None:
    """The pruner says stop at the first measured step. Oracle: sacct's CANCELLED, squeue's
    list, and the processes left on the machine (none of the trial's after scancel)."""
    cfg = tiny_config(processes=1)
    reported: list[tuple[int, float]] = []

    def report(step: int, rate: float) -> bool:
        reported.append((step, rate))
        return True  # the pruner says stop at the first measured step

    plan = trial_plan(cfg, first_layout(cfg, ONE), tmp_path / "a folder's name", report=report)
    measurement = SlurmRunner(poll_s=0.5, steps=400, warmup=1).run(plan)
    job_id = measurement.extra["slurm_job_id"]
    assert measurement.status == "pruned", measurement.reason
    assert reported and reported[0][1] > 0
    assert job_id not in queued_jobs(), "the pruned job is still in squeue"
    assert accounting(job_id)[-1]["State"].startswith("CANCELLED")
    assert json.loads((plan.directory / JOB_FILE).read_text())["cancelled"] == "pruned"
    deadline = time.monotonic() + 15
    while processes_mentioning(str(plan.directory)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not processes_mentioning(str(plan.directory)), "a trial process outlived scancel"


def _killed_tuner(out: Path, layout: str) -> subprocess.Popen:
    """A tuner process (slurm_trial_driver.py) that submits one 4-step 1-process trial."""
    return subprocess.Popen([sys.executable, str(HERE / "slurm_trial_driver.py"), str(out),
                             layout, "4", "1"], cwd=HERE)


def test_a_resumed_tuner_reattaches_to_the_running_jobs(tmp_path: Path) -> None:
    """Two tuners die (SIGKILL) right after submitting; their jobs go on. A resumed tuner finds
    one job in its output folder (`reattach`, i.e. --resume), a retried trial in another folder
    inherits the other job's id (user attribute `slurm_job_id`). Oracle: squeue lists both jobs
    after the kills, each follower reports the job it was handed, and nothing is submitted
    again (no slurm_job.json in the new trial folders)."""
    cfg = tiny_config(processes=1)
    texts = {"resume": ONE, "inherit": "tp=1,pp=1,zero=1,mbs=2"}
    layouts = {name: first_layout(cfg, text) for name, text in texts.items()}
    drivers = {name: _killed_tuner(tmp_path / name, text) for name, text in texts.items()}
    first = {name: tmp_path / name / "trials" / f"0000-{layouts[name].id}" for name in texts}
    for name, driver in drivers.items():
        wait_for(lambda name=name: (first[name] / JOB_FILE).exists(), 120,
                 f"the {name} tuner's submission")
        driver.send_signal(signal.SIGKILL)  # the tuner dies; its job goes on
        driver.wait(timeout=10)
    jobs = {name: job_id_of(folder) for name, folder in first.items()}
    assert set(jobs.values()) <= queued_jobs()
    resumed = trial_plan(cfg, layouts["resume"], tmp_path / "resume", number=1)
    noted: dict[str, object] = {}
    retried = dataclasses.replace(
        trial_plan(cfg, layouts["inherit"], tmp_path / "retry", number=7),
        attrs={"slurm_job_id": jobs["inherit"]}, note=noted.__setitem__)
    with ThreadPoolExecutor(2) as pool:
        followed = {
            "resume": pool.submit(SlurmRunner(poll_s=0.5, steps=4, warmup=1, reattach=True).run,
                                  resumed),
            "inherit": pool.submit(SlurmRunner(poll_s=0.5, steps=4, warmup=1).run, retried),
        }
        measurements: dict[str, Measurement] = {k: f.result(timeout=300)
                                                for k, f in followed.items()}
    for name, measurement in measurements.items():
        assert measurement.status == "ok", measurement.reason
        assert measurement.extra["slurm_job_id"] == jobs[name]
        assert measurement.extra["slurm_reattached"] == str(first[name])
        assert accounting(jobs[name])[-1]["State"] == "COMPLETED"
    assert noted == {"slurm_job_id": jobs["inherit"], "slurm_trial_dir": str(first["inherit"])}
    for plan in (resumed, retried):
        assert not (plan.directory / JOB_FILE).exists(), "submitted again"
