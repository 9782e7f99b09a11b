"""Shared pieces of the cluster tests: a tiny 2-process problem, trial plans, Slurm queries."""

from __future__ import annotations

import subprocess
from collections.abc import Callable
from pathlib import Path

import psutil

from autotune.frameworks import framework_of
from autotune.inputs import load_config
from autotune.layout import Layout
from autotune.render import write_artifacts
from autotune.runners.base import TrialPlan
from autotune.space import SearchSpace
from autotune.specs import AutotuneConfig

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


def job_fields(job_id: str) -> dict[str, str]:
    """`scontrol show job` of a job as a dict (StartTime, EndTime, JobState, ...)."""
    done = subprocess.run(["scontrol", "show", "job", "-o", job_id], capture_output=True,
                          text=True, check=True)
    return dict(item.split("=", 1) for item in done.stdout.split() if "=" in item)


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
