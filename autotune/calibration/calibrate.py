"""`autotune calibrate`: microbenchmarks on the cluster, or the user's own runs, to a file.

`calibrate_cluster` runs the microbenchmarks (`autotune.calibration.microbench`), screens the
workers, fits the kernel and link constants (`autotune.calibration.kernel_fit`) and returns a
`Calibration`; a lost worker still returns one (incomplete, its points kept, the worker named).
`calibrate_from_runs` (`autotune.calibration.from_runs`) refits step-time constants to measured
runs with the one step-time fit.

Example:
    >>> from autotune.calibration.calibrate import calibrate_cluster
    >>> # calibration = calibrate_cluster(cfg, layouts, out=Path("cal")); calibration.write(p)
"""

from __future__ import annotations

import datetime
from collections.abc import Callable
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.calibration.file import Calibration
from autotune.calibration.file import software_stack
from autotune.calibration.kernel_fit import SCREEN_MARGIN
from autotune.calibration.kernel_fit import fit_kernels
from autotune.calibration.kernel_fit import measured_figures
from autotune.calibration.kernel_fit import screen
from autotune.calibration.microbench import WorkerLost
from autotune.calibration.microbench import bench_plan
from autotune.calibration.microbench import run_local
from autotune.costmodel.constants import constants_for
from autotune.layout import LayoutTable
from autotune.specs import AutotuneConfig
from autotune.specs import GPUSpec


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0)


def bound_warnings(calibration: Calibration) -> list[str]:
    """One line per fitted constant on the bound of its fit."""
    return [f"{name} = {c.value:.4g} sits on its {c.at_bound} bound: the model lacks a term "
            "these points need" for name, c in calibration.constants.items() if c.at_bound]


def calibrate_cluster(
    cfg: AutotuneConfig,
    layouts: LayoutTable,
    out: Path,
    *,
    margin: float = SCREEN_MARGIN,
    threads: int | None = None,
    worker_env: Mapping[int, Mapping[str, str]] | None = None,
    budget_s: float = 0.02,
    plan: Mapping[str, Any] | None = None,
    timeout_s: float = 600.0,
    on_progress: Callable[[int], None] | None = None,
) -> Calibration:
    """Microbenchmark the cluster's devices for `cfg`'s candidate `layouts` and fit.

    Args:
        cfg: The problem (its cluster: `local` CPU workers or this machine's GPUs).
        layouts: Candidate layouts whose GEMM and attention shapes are timed.
        out: Folder for the workers' plan, records and logs.
        margin: Screening margin below the peers' median that names a worker or link slow.
        threads: torch threads per CPU worker (default: cores / workers).
        worker_env: Extra environment of single workers by rank.
        budget_s: Time spent repeating each kernel.
        plan: What to time (default: `bench_plan(cfg, layouts, budget_s=budget_s)`).
        timeout_s: Limit of the whole run.
        on_progress: Called with the points measured so far.

    Returns:
        The calibration; incomplete (`complete` False, `failure` naming the worker) when a
        worker was lost.
    """
    workers = cfg.cluster.gpus_per_node
    plan = plan or bench_plan(cfg, layouts, budget_s=budget_s)
    created, software = _now(), software_stack()
    try:
        points, devices = run_local(plan, workers, out, threads=threads, worker_env=worker_env,
                                    timeout_s=timeout_s, on_progress=on_progress)
    except WorkerLost as lost:
        return Calibration(created=created, source="microbenchmarks", cluster=cfg.cluster.name,
                           software=software, complete=False, failure=str(lost),
                           gpu=_plain(cfg.cluster.gpu), devices=lost.devices,
                           points=lost.points)
    measured = measured_figures(cfg, points)
    base = constants_for(cfg.cluster.gpu, cfg.train.software_stack)
    fitted, predicted = fit_kernels(measured, points, base)
    screening = screen(points, {d.rank: d.host for d in devices}, margin)
    links = measured.cluster.intra_node_gb_s if cfg.cluster.cpu_processes else None
    calibration = Calibration(created=created, source="microbenchmarks",
                              cluster=cfg.cluster.name, software=software,
                              gpu=_plain(measured.cluster.gpu), intra_node_gb_s=links,
                              devices=devices, points=predicted, constants=fitted,
                              screening=screening)
    warnings = bound_warnings(calibration) + screening.slow()
    return calibration.model_copy(update={"warnings": warnings})


def _plain(gpu: GPUSpec) -> GPUSpec:
    """The GPU figures without calibration fields."""
    return gpu.model_copy(update={"constants": {}, "calibration": ""})
