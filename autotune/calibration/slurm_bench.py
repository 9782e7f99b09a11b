"""The calibration workers as one Slurm job (`autotune calibrate --runner slurm`).

`run_slurm` renders `templates/slurm/calibrate.sbatch.j2` into the run's folder: one job over
the cluster's nodes, one task per GPU (or CPU worker), ranks numbered node by node
(`--distribution=block`, as `autotune.calibration.kernel_fit.comm_seconds` assumes), each task
running the same bench worker as `--runner local` (`autotune.calibration.bench_worker`: NCCL on
GPUs, gloo on CPU, its rank from SLURM_PROCID). It submits the job through
`autotune.runners.slurm_client`, follows it (squeue, then scontrol/sacct), reports the points
measured so far, and reads them back. A job that loses a worker (a task killed, a node failed,
the time limit) raises `WorkerLost` naming the first worker that failed (each task writes its
exit status and time to `exit-<rank>`), or, when none wrote one (a node that failed), the
Slurm state and the workers that did not finish; the points measured are kept.

Example:
    >>> from autotune.calibration.slurm_bench import run_slurm
    >>> # points, devices, job_id = run_slurm(plan, cfg, Path("/shared/cal"), SlurmSettings())
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.calibration.file import Device
from autotune.calibration.file import Point
from autotune.calibration.microbench import WorkerLost
from autotune.calibration.microbench import exit_text
from autotune.calibration.microbench import lost_worker
from autotune.calibration.microbench import prepare_folder
from autotune.calibration.microbench import read_points
from autotune.exceptions import AutotuneError
from autotune.runners.slurm import PORT_BASE
from autotune.runners.slurm import PORT_SPAN
from autotune.runners.slurm import SlurmRunner
from autotune.runners.slurm import SlurmSettings
from autotune.runners.slurm_client import LIVE_STATES
from autotune.runners.slurm_client import JobInfo
from autotune.runners.slurm_client import QueuePoller
from autotune.runners.slurm_client import cancel
from autotune.runners.slurm_client import job_info
from autotune.runners.slurm_client import parse_slurm_opts
from autotune.runners.slurm_client import partition_has_gpus
from autotune.runners.slurm_client import submit
from autotune.specs import AutotuneConfig
from autotune.templating import render_template
from autotune.templating import version

JOB_NAME = "autotune-calibrate"
SCRIPT = "calibrate.sbatch"
JOB_FILE = "slurm_job.json"
"""In the run's folder: the id of the job that measured its points."""
POLL_S = 2.0
"""Seconds between two squeue calls."""


def slurm_runner(settings: SlurmSettings, timeout_s: float) -> SlurmRunner:
    """The Slurm runner whose sbatch options, environment and interpreter the job uses (its
    `--time` default: `timeout_s` in minutes, plus 5)."""
    return SlurmRunner(partition=settings.partition, account=settings.account,
                       time_limit=settings.time_limit,
                       options=parse_slurm_opts(settings.slurm_opts), timeout_s=timeout_s)


def calibration_script(cfg: AutotuneConfig, out: Path, *, directives: list[str], python: str,
                       threads: int) -> str:
    """The job script (templates/slurm/calibrate.sbatch.j2): `cfg`'s nodes, one task per GPU
    or CPU worker (`threads` CPUs each), the workers writing to `out`."""
    return render_template(
        "slurm/calibrate.sbatch.j2", job_name=JOB_NAME, nodes=cfg.cluster.nodes,
        tasks_per_node=cfg.cluster.gpus_per_node, cpu_only=cfg.cluster.cpu_processes,
        threads=threads, directives=directives, cluster_name=cfg.cluster.name,
        version=version(), bench_dir=str(out.resolve()), port_base=PORT_BASE,
        port_span=PORT_SPAN, python=python)


def check_partition(cfg: AutotuneConfig, settings: SlurmSettings) -> None:
    """Refuse a GPU cluster whose partition has no GPUs, before submitting.

    Raises:
        AutotuneError: no gpu GRES in the partition's sinfo (or sinfo failed).
    """
    if cfg.cluster.cpu_processes or partition_has_gpus(settings.partition):
        return
    where = f"--partition {settings.partition}" if settings.partition else "the default partition"
    raise AutotuneError(f"{where}: no GPU nodes (no gpu GRES in sinfo) to calibrate "
                        f"{cfg.cluster.gpu.name}; name a GPU partition, or use -c local for CPU "
                        "workers")


def run_slurm(
    plan: Mapping[str, Any],
    cfg: AutotuneConfig,
    out: Path,
    settings: SlurmSettings,
    *,
    threads: int | None = None,
    worker_env: Mapping[int, Mapping[str, str]] | None = None,
    timeout_s: float = 600.0,
    poll_s: float = POLL_S,
    on_progress: Callable[[int], None] | None = None,
    on_state: Callable[[str], None] | None = None,
) -> tuple[list[Point], list[Device], str]:
    """Run the plan as one Slurm job over `cfg`'s nodes and read the workers' points.

    Args:
        plan: `microbench.bench_plan`'s output.
        cfg: The problem: its cluster's nodes and GPUs per node (or CPU workers) are allocated.
        out: Folder for the script, plan, records and logs, on a file system the nodes share.
        settings: Partition, account, time limit and more sbatch options (as `tune` takes them).
        threads: CPUs (torch threads) per CPU worker (default 1).
        worker_env: Extra environment of single workers by rank (`env-<rank>` files that the
            task exports before it starts the worker).
        timeout_s: Limit from the job's start (queue time not counted); then it is cancelled.
        poll_s: Seconds between squeue calls.
        on_progress: Called with the number of points measured so far, once per poll.
        on_state: Called with "job <id> <state>" once per poll.

    Returns:
        The points, the workers, and the job id.

    Raises:
        WorkerLost: a worker failed, the job ended early, or it ran past `timeout_s` (the
            points are kept, the worker named).
        SlurmError: sbatch refused the job, or Slurm did not answer.
    """
    out = out.resolve()
    runner = slurm_runner(settings, timeout_s)
    prepare_folder(plan, out)
    for old in out.glob("env-*"):
        old.unlink()
    for rank, env in (worker_env or {}).items():
        (out / f"env-{rank}").write_text("".join(f"{name}={shlex.quote(value)}\n"
                                                 for name, value in env.items()))
    script = out / SCRIPT
    script.write_text(calibration_script(cfg, out, directives=runner.directives,
                                         python=runner.python, threads=threads or 1))
    script.chmod(0o755)
    job_id = submit(script, runner.environment())
    (out / JOB_FILE).write_text(json.dumps({"job_id": job_id, "submitted": time.time()}) + "\n")
    info, overran = _follow(job_id, out, timeout_s, poll_s, on_progress, on_state)
    state = info.state if info else "UNKNOWN"
    world = cfg.cluster.nodes * cfg.cluster.gpus_per_node
    for wait_s in (0.0, 2.0):  # a shared file system may show the last records late
        time.sleep(wait_s)
        points, devices, last = read_points(out)
        done = {rank for rank, record in last.items() if record.get("event") == "done"}
        if state != "COMPLETED" or len(done) == world:
            break
    if state == "COMPLETED" and len(done) == world and not overran:
        return points, devices, job_id
    message = lost_job(out, job_id, info, world, done, timeout_s if overran else None)
    raise WorkerLost(message, points, devices, job_id)


def _follow(job_id: str, out: Path, timeout_s: float, poll_s: float,
            on_progress: Callable[[int], None] | None,
            on_state: Callable[[str], None] | None) -> tuple[JobInfo | None, bool]:
    """Wait for the job's end; scancel it past `timeout_s` from its start, or when this
    process is interrupted. Returns Slurm's last word and whether it ran past the limit."""
    started: float | None = None
    overran = False
    poller = QueuePoller(poll_s)  # keeps its last answer while the controller is busy
    poller.watch(job_id)
    try:
        while True:
            info = poller.state(job_id) or job_info(job_id)
            if info is None or info.state not in LIVE_STATES:
                return job_info(job_id) or info, overran
            now = time.monotonic()
            if info.state == "RUNNING" and started is None:
                started = now
            if on_state is not None:
                on_state(f"job {job_id} {info.state}")
            if on_progress is not None:
                on_progress(len(read_points(out)[0]))
            if started is not None and now - started > timeout_s and not overran:
                overran = True
                cancel(job_id)
            time.sleep(poll_s)
    except BaseException:  # interrupted (Ctrl-C): the job goes too
        cancel(job_id)
        raise


def _exits(out: Path) -> list[tuple[float, int, int]]:
    """(time, rank, exit status) of every task that wrote its exit file, the earliest first."""
    found = []
    for path in out.glob("exit-*"):
        parts = path.read_text().split()
        rank = path.name.removeprefix("exit-")
        if len(parts) == 2 and rank.isdigit() and parts[0].lstrip("-").isdigit():
            found.append((float(parts[1]), int(rank), int(parts[0])))
    return sorted(found)


def lost_job(out: Path, job_id: str, info: JobInfo | None, world: int, done: set[int],
             overran_s: float | None) -> str:
    """The line naming what the job lost (see the module docstring)."""
    state = info.state if info else "UNKNOWN"
    ended = f"Slurm job {job_id} {state}" + (f" on {info.nodes}" if info and info.nodes else "")
    measured, devices, _ = read_points(out)
    points = len(measured)
    if overran_s is not None:
        return (f"calibrate: the workers did not finish within {overran_s:.0f} s of the job's "
                f"start (scancel); {points} points kept in {out}; {ended}")
    failed = [(rank, code) for _, rank, code in _exits(out) if code != 0]
    if failed:
        rank, code = failed[0]
        how = exit_text(128 - code if 128 < code < 160 else code)  # bash: 128 + the signal
        return f"{lost_worker(rank, None, how, out)}; {ended}"
    missing = [rank for rank in range(world) if rank not in done]
    hosts = {d.rank: d.host for d in devices}
    named = ", ".join(f"{rank} ({hosts.get(rank, 'never started')})" for rank in missing)
    return (f"calibrate: {ended}{f' ({info.reason})' if info and info.reason else ''}; "
            f"workers {named or 'all'} did not finish; {points} points kept in {out} (the job's "
            f"log: {out / f'slurm-{job_id}.out'})")
