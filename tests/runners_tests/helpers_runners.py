"""Shared pieces of the runner tests: a tiny CPU problem, pinned studies, leftover processes."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import optuna
import psutil

from autotune.layout import Layout
from autotune.search.sampler import layout_params
from autotune.search.storage import default_storage_url
from autotune.search.storage import open_storage
from autotune.search.study import default_study_name
from autotune.space.search_space import SearchSpace
from autotune.specs import AutotuneConfig
from autotune.specs.inputs import load_config

SEQ, GBS = 64, 8
"""A short problem: tiny-gpt, 64 tokens per sequence, 8 sequences per step, 2 processes."""

SPACE = SearchSpace(
    name="runner-tests",
    tp=[1, 2],
    pp=[1, 2],
    cp=[1, 2],
    zero=[0, 1, 2, 3],
    offload=["none", "optimizer"],
    mbs=[1, 4],
    recompute=["none"],
    sp=[False],
)
"""Every dimension the local runner must handle, with two or more choices."""


def tiny_config(framework: str = "deepspeed") -> AutotuneConfig:
    """tiny-gpt on `--cluster local` with 2 processes."""
    return load_config(
        "tiny-gpt",
        "local",
        processes=2,
        framework=framework,
        seq_length=SEQ,
        global_batch_size=GBS,
    )


def pin_trials(
    out_dir: Path, cfg: AutotuneConfig, space: SearchSpace, layouts: Sequence[Layout]
) -> None:
    """Create the study `tune(..., resume=True)` opens and queue `layouts` as its first trials."""
    out_dir.mkdir(parents=True, exist_ok=True)
    study = optuna.create_study(
        storage=open_storage(default_storage_url(out_dir)),
        study_name=default_study_name(cfg),
        direction="maximize",
    )
    for layout in layouts:
        study.enqueue_trial(layout_params(layout, space.resolved(cfg)))


def leftovers(marker: str | Path) -> list[str]:
    """Command lines of live processes (zombies excluded) that mention `marker`."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            line = " ".join(proc.info["cmdline"] or [])
            if str(marker) in line and proc.info["status"] != psutil.STATUS_ZOMBIE:
                found.append(f"{proc.info['pid']}: {line[:200]}")
        except psutil.Error:
            continue
    return found
