"""`autotune calibrate`: measure this machine's devices (or read own runs) into a calibration
file that `--calibration FILE` then applies to every prediction."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated
from typing import Any

import typer
from rich.progress import Progress
from rich.table import Table

from autotune.calibration.calibrate import calibrate_cluster
from autotune.calibration.file import Calibration
from autotune.calibration.from_runs import calibrate_from_runs
from autotune.calibration.from_runs import runs_from_file
from autotune.calibration.kernel_fit import SCREEN_MARGIN
from autotune.calibration.kernel_fit import link_gb_s
from autotune.calibration.slurm_bench import check_partition
from autotune.cli.app import PROBLEM_OPTIONS
from autotune.cli.app import _failed
from autotune.cli.app import _parsed
from autotune.cli.app import _problem
from autotune.cli.app import app
from autotune.cli.app import console
from autotune.cli.options import SLURM_JOB
from autotune.cli.options import with_options
from autotune.exceptions import AutotuneError
from autotune.layout import Layout
from autotune.runners.slurm import SlurmSettings
from autotune.space.search_space import enumerate_layouts
from autotune.space.search_space import load_space
from autotune.specs import AutotuneConfig


def _table(calibration: Calibration) -> Table:
    table = Table(title=f"Fitted constants ({len(calibration.points)} points)")
    for column in ("constant", "before", "fitted", "± (1σ)", "median |error|", "max |error|",
                   "bound"):
        table.add_column(column)
    for name, c in calibration.constants.items():
        spread = "" if c.stderr is None else f"{c.stderr:.1%}"
        table.add_row(name, f"{c.before:.4g}", f"{c.value:.4g}", spread,
                      f"{c.median_residual:.1%}", f"{c.max_residual:.1%}", c.at_bound or "")
    return table


def _print_links(cfg: AutotuneConfig, calibration: Calibration) -> None:
    """The fastest link figures measured within a node and between nodes (bus bandwidth)."""
    for where, across in (("within a node", False), ("between nodes", True)):
        rate = link_gb_s(cfg, calibration.points, across=across)
        if rate is not None:
            console.print(f"links {where}: {rate:.3g} GB/s measured (the fastest collective "
                          "bus bandwidth or send)")


def runs_from_study(directory: Path) -> tuple[AutotuneConfig, list[tuple[Layout, float]]]:
    """The problem of a study folder and its measured trials."""
    from autotune.report.data import load_run  # matplotlib loads with reports only

    run = load_run(directory)
    cfg = AutotuneConfig.model_validate(run.config)
    runs = [(Layout(**r["layout_fields"]), float(r["measured_step_time_s"]))
            for r in run.records
            if r.get("status") == "ok" and r.get("measured_step_time_s")
            and r.get("layout_fields")]
    return cfg, runs


@app.command()
@with_options(*PROBLEM_OPTIONS, SLURM_JOB)
def calibrate(
    out: Annotated[Path, typer.Option(help="The calibration file to write (YAML).")] = Path(
        "calibration.yaml"),
    runner: Annotated[str, typer.Option(
        help="local: this machine's GPUs or CPU workers; slurm: one Slurm job over the "
        "cluster's nodes (the folder next to --out must be shared with them).")] = "local",
    from_runs: Annotated[Path | None, typer.Option(
        help="Refit to own runs instead: a CSV/JSON of layout,step_time_s or a tune folder.")
    ] = None,
    margin: Annotated[float, typer.Option(
        help="Screening: name workers and links this fraction below their peers' median.")
    ] = SCREEN_MARGIN,
    *,
    config: dict[str, Any],
) -> None:
    """Microbenchmark the cluster's GPUs (or CPU workers on gloo) for the model's layouts, here
    or through Slurm, fit the cost model's constants, screen for slow workers, and write a
    calibration file."""
    if not 0 < margin < 1:
        raise AutotuneError(f"--margin: {margin} must be between 0 and 1, e.g. 0.2")
    if runner not in ("local", "slurm"):
        raise AutotuneError(f"--runner: {runner} does not calibrate; use local or slurm")
    problem = _problem(config)
    slurm = _parsed(SlurmSettings, dict(config.get("runner") or {}), (SLURM_JOB,), ("runner",))
    if slurm.given() and runner != "slurm":
        raise AutotuneError(f"{', '.join(slurm.given())}: only for --runner slurm")
    if from_runs is not None and runner != "local":
        raise AutotuneError(f"--runner {runner}: --from-runs refits runs already measured; "
                            "drop one of them")
    started = time.monotonic()
    if from_runs is not None:
        if from_runs.is_dir():
            cfg, runs = runs_from_study(from_runs)
        else:
            cfg = problem.load()
            runs = runs_from_file(cfg, from_runs)
        calibration = calibrate_from_runs(cfg, runs, str(from_runs))
    else:
        cfg = problem.load("deepspeed" if problem.cluster == "local" else "megatron")
        if cfg.cluster.nodes > 1 and runner == "local":
            raise AutotuneError(
                f"--cluster {problem.cluster}: {cfg.cluster.nodes} nodes; --runner local "
                "measures this machine only: use --runner slurm (or --cluster local)")
        if runner == "slurm":
            check_partition(cfg, slurm)
        layouts = enumerate_layouts(cfg, load_space(problem.space, cfg.train.framework))
        with Progress(console=console, transient=True) as progress:
            what = "microbenchmarks (points measured)"
            task = progress.add_task(what, total=None)
            calibration = calibrate_cluster(
                cfg, layouts.feasible, out.with_suffix(".d"), margin=margin,
                slurm=slurm if runner == "slurm" else None,
                on_progress=lambda n: progress.update(task, completed=n),
                on_state=lambda state: progress.update(task, description=f"{what}, {state}"))
    calibration.write(out)
    if not calibration.complete:
        _failed(f"{calibration.failure}; the points are in {out}")
    console.print(_table(calibration))
    if calibration.screening is not None:
        for worker in calibration.screening.workers:
            console.print(f"worker {worker.ranks[0]} ({worker.host}): GEMM "
                          f"{worker.rate / 1e12:.3g} TFLOP/s ({worker.relative:.0%} of peers)")
    if calibration.source == "microbenchmarks":
        _print_links(cfg, calibration)
    for warning in calibration.warnings:
        console.print(f"[yellow]warning:[/] {warning}")
    for line in calibration.not_measured:
        console.print(f"note: {line}")
    if calibration.job_id:
        console.print(f"measured by Slurm job {calibration.job_id} on {calibration.nodes} "
                      f"node(s), {len(calibration.devices)} workers")
    console.print(f"wrote {out} in {time.monotonic() - started:.0f} s; use it with "
                  f"--calibration {out}")
