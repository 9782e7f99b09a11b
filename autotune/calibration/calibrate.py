"""`autotune calibrate`: microbenchmarks on the cluster, or the user's own runs, to a file.

`calibrate_cluster` runs the microbenchmarks (`autotune.calibration.microbench`), screens the
workers, fits the kernel and link constants (`autotune.calibration.kernel_fit`), on CPU workers
measures a MoE model's router load at initialisation (`autotune.calibration.router_load`) and
returns a `Calibration`; a lost worker still returns one (incomplete, its points kept, the
worker named).
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
from autotune.calibration.file import Device
from autotune.calibration.file import Point
from autotune.calibration.file import Software
from autotune.calibration.file import software_stack
from autotune.calibration.file import stack_mismatch
from autotune.calibration.kernel_fit import SCREEN_MARGIN
from autotune.calibration.kernel_fit import fit_kernels
from autotune.calibration.kernel_fit import measured_figures
from autotune.calibration.kernel_fit import screen
from autotune.calibration.kernel_fit import spans_nodes
from autotune.calibration.microbench import WorkerLost
from autotune.calibration.microbench import bench_plan
from autotune.calibration.microbench import run_local
from autotune.calibration.microbench import worker_stacks
from autotune.calibration.router_load import router_load
from autotune.calibration.slurm_bench import run_slurm
from autotune.costmodel.constants import constants_for
from autotune.exceptions import AutotuneError
from autotune.layout import LayoutTable
from autotune.runners.slurm import SlurmSettings
from autotune.specs import AutotuneConfig
from autotune.specs import ClusterSpec
from autotune.specs import GPUSpec
from autotune.specs.inputs import gpu_preset_for


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
    slurm: SlurmSettings | None = None,
    on_state: Callable[[str], None] | None = None,
) -> Calibration:
    """Microbenchmark the cluster's devices for `cfg`'s candidate `layouts` and fit.

    Args:
        cfg: The problem (its cluster: `local` CPU workers or this machine's GPUs; through
            Slurm, its nodes and GPUs per node).
        layouts: Candidate layouts whose GEMM and attention shapes are timed.
        out: Folder for the workers' plan, records and logs (shared with the nodes, for Slurm).
        margin: Screening margin below the peers' median that names a worker or link slow.
        threads: torch threads per CPU worker (default: cores / workers; Slurm: 1).
        worker_env: Extra environment of single workers by rank (e.g. to reproduce a slow
            node).
        budget_s: Time spent repeating each kernel.
        plan: What to time (default: `bench_plan(cfg, layouts, budget_s=budget_s)`).
        timeout_s: Limit of the whole run (Slurm: from the job's start).
        on_progress: Called with the points measured so far.
        slurm: Run the workers as one Slurm job with these sbatch settings
            (`autotune.calibration.slurm_bench`) instead of on this machine.
        on_state: Slurm only: called with the job's id and state once per poll.

    Returns:
        The calibration; incomplete (`complete` False, `failure` naming the worker) when a
        worker was lost.
    """
    plan = plan or bench_plan(cfg, layouts, budget_s=budget_s)
    created, job_id = _now(), None
    try:
        if slurm is None:
            points, devices = run_local(plan, cfg.cluster.gpus_per_node, out, threads=threads,
                                        worker_env=worker_env, timeout_s=timeout_s,
                                        on_progress=on_progress)
        else:
            points, devices, job_id = run_slurm(plan, cfg, out, slurm, threads=threads,
                                                worker_env=worker_env, timeout_s=timeout_s,
                                                on_progress=on_progress, on_state=on_state)
    except WorkerLost as lost:
        return Calibration(created=created, source="microbenchmarks", cluster=cfg.cluster.name,
                           software=_software(out), job_id=lost.job_id, complete=False,
                           failure=str(lost), gpu=_plain(cfg.cluster.gpu),
                           devices=lost.devices, points=lost.points)
    measured = measured_figures(cfg, points)
    base = constants_for(cfg.cluster.gpu, cfg.train.software_stack)
    fitted, predicted = fit_kernels(measured, points, base)
    routed = router_load(cfg, layouts, out, base.moe_load_imbalance)
    if routed is not None:
        fitted = {**fitted, "moe_load_imbalance": routed}
    screening = screen(points, {d.rank: d.host for d in devices}, margin)
    cpu = cfg.cluster.cpu_processes
    calibration = Calibration(created=created, source="microbenchmarks",
                              cluster=cfg.cluster.name, software=_software(out), job_id=job_id,
                              gpu=_plain(measured.cluster.gpu),
                              intra_node_gb_s=measured.cluster.intra_node_gb_s if cpu else None,
                              inter_node_gb_s=_measured_inter(measured, points) if cpu else None,
                              nodes=len({d.host for d in devices}) or 1,
                              not_measured=not_measured(devices), devices=devices,
                              points=predicted, constants=fitted, screening=screening)
    warnings = (bound_warnings(calibration) + screening.slow() + stack_warnings(out)
                + device_warnings(cfg.cluster, devices))
    return calibration.model_copy(update={"warnings": warnings})


def not_measured(devices: list[Device]) -> list[str]:
    """What a run on these workers cannot measure: links between nodes on one node,
    collectives with one worker."""
    lines = []
    if len(devices) < 2:
        lines.append("collectives and links not measured: 1 worker")
    if len({d.host for d in devices}) < 2:
        lines.append("inter-node links not measured: 1 node (comm_efficiency and "
                     "latency_inter_s keep the preset's values)")
    return lines


def device_warnings(cluster: ClusterSpec, devices: list[Device]) -> list[str]:
    """One line when workers report another device than the cluster's: a GPU that CUDA's name
    and memory match to another preset (or to none, `autotune.specs.inputs.gpu_preset_for`),
    or no GPU at all; the constants were fitted against the cluster GPU's figures."""
    def preset(device: Device) -> str | None:
        if device.device.startswith("cpu"):
            return "cpu"
        try:
            return gpu_preset_for(device.device, device.memory_gib)
        except AutotuneError:
            return None

    expected = "cpu" if cluster.cpu_processes else (cluster.gpu.like or cluster.gpu.name)
    other = [d for d in devices if preset(d) != expected]
    if not other:
        return []
    names = sorted({d.device for d in other})
    return [f"workers {', '.join(f'{d.rank} ({d.host})' for d in other[:4])}"
            f"{' ...' if len(other) > 4 else ''} report {', '.join(names)}, not the cluster's "
            f"{cluster.gpu.name}: the constants were fitted against its figures; calibrate "
            "with the cluster preset of the GPU the nodes have"]


def _measured_inter(cfg: AutotuneConfig, points: list[Point]) -> float | None:
    """The inter-node link figure the workers measured (None: no link between nodes)."""
    across = any(spans_nodes(cfg, p.ranks) for p in points if p.kind in ("collective", "send"))
    return cfg.cluster.inter_node_gb_s if across else None


def _software(out: Path) -> Software:
    """The workers' software stack (rank 0's host), else this process's."""
    stacks = worker_stacks(out)
    return next(iter(stacks.values())) if stacks else software_stack()


def stack_warnings(out: Path) -> list[str]:
    """One line per host whose workers ran another software stack than rank 0's host."""
    stacks = list(worker_stacks(out).items())
    lines = []
    for host, stack in stacks[1:]:
        mismatch = stack_mismatch(stacks[0][1], stack)
        if mismatch:
            first = stacks[0][0]
            lines.append(f"workers on {host} run other software than on {first}: " + mismatch
                         .replace(" in the file", f" on {first}").replace(" here", f" on {host}"))
    return lines


def _plain(gpu: GPUSpec) -> GPUSpec:
    """The GPU figures without calibration fields."""
    return gpu.model_copy(update={"constants": {}, "calibration": ""})
