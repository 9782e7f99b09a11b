"""`autotune verify DIR`: train the study's winner and a pure data-parallel reference for N
steps with the same data and compare their loss curves (`autotune.verify`)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from autotune.cli.app import _failed
from autotune.cli.app import app
from autotune.cli.app import console
from autotune.exceptions import AutotuneError


@app.command()
def verify(
    directory: Annotated[Path, typer.Argument(help="A tune output folder.")],
    runner: Annotated[str, typer.Option(help="local or slurm: a runner that trains.")] = "local",
    steps: Annotated[int, typer.Option(help="Optimizer steps of each run (all compared).")] = 6,
    launcher: Annotated[str, typer.Option(help="local: torchrun or deepspeed.")] = "torchrun",
    timeout: Annotated[float, typer.Option(help="Seconds per run.")] = 3600.0,
) -> None:
    """Check that the winner trains the same model as pure data parallelism (loss curves)."""
    from autotune.layout import Layout
    from autotune.report import write_report
    from autotune.report.data import load_run
    from autotune.runners.factory import RunnerSettings
    from autotune.search.study import rank_trials
    from autotune.verify import verify as run_verify

    if runner not in ("local", "slurm"):
        raise AutotuneError(f"--runner: verify compares loss curves, so it needs a runner that "
                            f"trains (local or slurm), not {runner!r}")
    if steps < 2:
        raise AutotuneError(f"--steps: {steps} loss is no curve; use 2 or more")
    if not directory.is_dir():
        raise AutotuneError(f"verify: {directory} is not a folder; give a tune --out")
    run = load_run(directory)
    ranked = rank_trials(run.records)
    if not ranked:
        raise AutotuneError(f"verify: {directory} has no trial that measured a throughput")
    settings = RunnerSettings(name=runner, steps=steps, launcher=launcher, timeout_s=timeout)
    result = run_verify(run.cfg, Layout(**ranked[0]["layout_fields"]), settings.build(),
                        directory)
    write_report(directory)
    worst = "–" if result.max_rel_diff is None else f"{result.max_rel_diff:.2e}"
    console.print(f"winner    {result.winner}: {result.winner_losses}")
    console.print(f"reference {result.reference}: {result.reference_losses}")
    console.print(f"largest relative difference {worst} (tolerance {result.tolerance:g})")
    if not result.passed:
        _failed(f"verify: {result.reason}")
    console.print("loss curves agree: the winner trains the same model")
