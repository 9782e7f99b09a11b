"""The slurm runner on a real one-node Slurm (tests/services/slurm.sh): real training jobs.

The time-limit trial starts with the module's first test and is checked by the last one, so
Slurm's minute-granular limit (and its 30 s enforcement tick) overlaps the other tests.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers_cluster import SPACE
from helpers_cluster import first_layout
from helpers_cluster import job_fields
from helpers_cluster import processes_mentioning
from helpers_cluster import queued_jobs
from helpers_cluster import tiny_config
from helpers_cluster import trial_plan

from autotune.runners.base import Measurement
from autotune.runners.slurm import JOB_FILE
from autotune.runners.slurm import SlurmRunner
from autotune.search import TuneOptions
from autotune.search import tune

HERE = Path(__file__).resolve().parent
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def time_limit_trial(slurm: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Future]:
    """A 1-process trial that hangs at step 2 under a 1-minute Slurm time limit (background)."""
    cfg = tiny_config(processes=1)
    runner = SlurmRunner(time_limit="1", poll_s=1.0, steps=50, warmup=1,
                         extra_args=("--inject", "hang"), hang_timeout_s=900)
    plan = trial_plan(cfg, first_layout(cfg, "tp=1,pp=1,zero=0,mbs=4"),
                      tmp_path_factory.mktemp("time-limit"))
    with ThreadPoolExecutor(1) as pool:
        yield pool.submit(runner.run, plan)
        runner.cleanup()


@pytest.fixture(autouse=True)
def _time_limit_started(time_limit_trial: Future) -> None:
    """Start the time-limit trial with the first test of the module."""


def test_study_trains_layouts_on_slurm_two_at_a_time(tmp_path: Path) -> None:
    cfg = tiny_config()
    runner = SlurmRunner(poll_s=1.0, steps=4, warmup=1)
    options = TuneOptions(out_dir=tmp_path, trials=2, jobs=2, warm_start=2, render=False,
                          pruner_tolerance=1.0)  # the pruner test below prunes; here none
    result = tune(cfg, SPACE, runner, options)
    ran = [r for r in result.records if r.get("ran")]
    print("\n#  layout                          job  Slurm state  status  tokens/s  step s")
    for r in sorted(ran, key=lambda r: r["number"]):
        print(f"{r['number']:<2} {r['layout_id']:<31} {r['slurm_job_id']:>4}  "
              f"{r['slurm_state']:<11}  {r['status']:<6}  "
              f"{r.get('measured_tokens_per_s', 0):8.0f}  {r.get('measured_step_time_s', 0):.3f}")
    # two threads: the second may start one more trial before the first one's stop lands
    assert len(ran) >= 2 and all(r["status"] == "ok" for r in ran), [r.get("reason") for r in ran]
    assert all(r["slurm_state"] == "COMPLETED" and r["measured_tokens_per_s"] > 0 for r in ran)
    jobs = [job_fields(r["slurm_job_id"]) for r in ran]
    assert len({j["JobId"] for j in jobs}) == len(ran)
    assert all(j["NumCPUs"] == "2" and j["NumNodes"] == "1" for j in jobs)
    spans = sorted((j["StartTime"], j["EndTime"]) for j in jobs)
    overlap = any(b[0] < a[1] for a, b in zip(spans, spans[1:], strict=False))
    assert overlap, f"--jobs 2 should keep two jobs in flight: {spans}"
    folder = Path(ran[0]["trial_dir"])
    for name in ("trial.sbatch", JOB_FILE, "metrics.jsonl", f"slurm-{ran[0]['slurm_job_id']}.out"):
        assert (folder / name).exists(), name


def test_pruner_cancels_the_job(tmp_path: Path) -> None:
    cfg = tiny_config()
    reported: list[tuple[int, float]] = []

    def report(step: int, rate: float) -> bool:
        reported.append((step, rate))
        return True  # the pruner says stop at the first measured step

    plan = trial_plan(cfg, first_layout(cfg), tmp_path / "a folder's name", report=report)
    measurement = SlurmRunner(poll_s=0.5, steps=400, warmup=1).run(plan)
    job_id = measurement.extra["slurm_job_id"]
    assert measurement.status == "pruned", measurement.reason
    assert reported and reported[0][1] > 0
    assert job_id not in queued_jobs(), "the pruned job is still in squeue"
    assert job_fields(job_id)["JobState"] == "CANCELLED"
    deadline = time.monotonic() + 15
    while processes_mentioning(str(plan.directory)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not processes_mentioning(str(plan.directory)), "a trial process outlived scancel"


def test_resume_reattaches_to_the_running_job(tmp_path: Path) -> None:
    cfg = tiny_config()
    layout = first_layout(cfg, "tp=1,pp=1,zero=0,mbs=2")
    driver = subprocess.Popen([sys.executable, str(HERE / "slurm_trial_driver.py"), str(tmp_path),
                               "tp=1,pp=1,zero=0,mbs=2", "10"], cwd=HERE)
    job_file = tmp_path / "trials" / f"0000-{layout.id}" / JOB_FILE
    deadline = time.monotonic() + 120
    while not job_file.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert job_file.exists(), "the first tuner did not submit"
    first_job = __import__("json").loads(job_file.read_text())["job_id"]
    driver.send_signal(signal.SIGKILL)  # the tuner dies; its job goes on
    driver.wait(timeout=10)
    assert first_job in queued_jobs()
    resumed = SlurmRunner(poll_s=0.5, steps=10, warmup=1, reattach=True)
    measurement: Measurement = resumed.run(trial_plan(cfg, layout, tmp_path, number=1))
    assert measurement.status == "ok", measurement.reason
    assert measurement.extra["slurm_job_id"] == first_job
    assert measurement.extra["slurm_reattached"] == str(job_file.parent)
    assert not (tmp_path / "trials" / f"0001-{layout.id}" / JOB_FILE).exists(), "submitted again"


def test_time_limit_is_classified_timeout(time_limit_trial: Future) -> None:
    measurement = time_limit_trial.result(timeout=300)
    assert measurement.status == "timeout", measurement.reason
    assert measurement.extra["slurm_state"] == "TIMEOUT"
    assert "time limit" in measurement.reason
    assert measurement.extra["slurm_job_id"] not in queued_jobs()
