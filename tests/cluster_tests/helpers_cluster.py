"""Shared pieces of the cluster tests: a tiny problem, trial plans, what Slurm says of a job."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from autotune.frameworks import framework_of
from autotune.layout import Layout
from autotune.render import write_artifacts
from autotune.runners.base import TrialPlan
from autotune.runners.slurm import JOB_FILE
from autotune.space.search_space import SearchSpace
from autotune.specs import AutotuneConfig
from autotune.specs.inputs import load_config

SEQ, GBS = 64, 4
"""tiny-gpt, 64 tokens per sequence, 4 sequences per step: a trial trains in seconds on CPU."""

SPACE = SearchSpace(
    name="slurm-tests",
    tp=[1],
    pp=[1],
    cp=[1],
    zero=[0, 1],
    offload=["none"],
    mbs=[1, 2],
    recompute=["none"],
    sp=[False],
)
"""Four data-parallel layouts (ZeRO 0/1 × micro batch 1/2) that train fast on 2 CPU processes."""
ONE = "tp=1,pp=1,zero=0,mbs=4"
"""The tiny problem on one process: micro-batch 4 = the global batch."""


def tiny_config(processes: int = 2) -> AutotuneConfig:
    """tiny-gpt with DeepSpeed on `processes` CPU processes (`--cluster local`)."""
    return load_config("tiny-gpt", "local", processes=processes, framework="deepspeed",
                       seq_length=SEQ, global_batch_size=GBS)


def trial_plan(cfg: AutotuneConfig, layout: Layout, out: Path, number: int = 0,
               report: Callable[[int, float], bool] | None = None) -> TrialPlan:
    """A plan as `search.Objective.plan` makes it: OUT/trials/NNNN-<id> with the artifacts."""
    folder = out / "trials" / f"{number:04d}-{layout.id}"
    artifacts = write_artifacts(cfg, layout, folder)
    return TrialPlan(cfg, layout, number, folder, artifacts, report or (lambda step, rate: False))


def first_layout(cfg: AutotuneConfig, text: str = "tp=1,pp=1,zero=1,mbs=2") -> Layout:
    """A layout of the tiny problem from its text form."""
    return Layout.parse(text, cfg.world_size, cfg.train.global_batch_size, framework_of(cfg))


def queued_jobs() -> set[str]:
    """Ids of the jobs `squeue` lists (pending, running or completing)."""
    done = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True,
                          check=True)
    return set(done.stdout.split())


def slurmctld_knows(job_id: str) -> bool:
    """Whether slurmctld still holds the job's record (`scontrol show job`; MinJobAge)."""
    done = subprocess.run(["scontrol", "show", "job", job_id], capture_output=True, text=True,
                          check=False)
    return done.returncode == 0 and f"JobId={job_id} " in done.stdout


ACCOUNTED = ("JobID", "State", "ExitCode", "Start", "End", "AllocCPUS", "NNodes", "WorkDir")


def accounting(job_id: str, timeout_s: float = 30.0) -> list[dict[str, str]]:
    """Slurm's accounting of a finished job (`sacct -D`: one record per run, the requeued ones
    first), once slurmdbd has its end."""
    records: list[dict[str, str]] = []

    def ended() -> bool:
        done = subprocess.run(["sacct", "-D", "-X", "-n", "-P", "-j", job_id,
                               "-o", ",".join(ACCOUNTED)],
                              capture_output=True, text=True, check=True)
        records[:] = [dict(zip(ACCOUNTED, line.split("|"), strict=True))
                      for line in done.stdout.splitlines()]
        return bool(records) and records[-1]["End"] not in ("Unknown", "")

    wait_for(ended, timeout_s, f"the end of job {job_id} in sacct")
    return records


def wait_for(condition: Callable[[], object], timeout_s: float, what: str) -> None:
    """Poll `condition` every 0.2 s until it holds; AssertionError naming `what` after
    `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout_s:g} s waiting for {what}"
        time.sleep(0.2)


def job_id_of(folder: Path) -> str:
    """The id of the job the runner submitted for the trial folder (slurm_job.json)."""
    return str(json.loads((folder / JOB_FILE).read_text())["job_id"])


def records_of(folder: Path) -> list[dict]:
    """The JSON records of the trial folder's metrics.jsonl written so far."""
    try:
        text = (folder / "metrics.jsonl").read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.split("\n")[:-1]]  # the last one may be partial


def processes_mentioning(marker: str) -> list[psutil.Process]:
    """Living processes whose command line contains `marker` (a trial folder)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if marker in " ".join(proc.info["cmdline"] or ()) and proc.status() != "zombie":
                found.append(proc)
        except psutil.Error:
            continue
    return found
