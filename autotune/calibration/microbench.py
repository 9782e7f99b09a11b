"""Microbenchmarks on the real devices: the plan, the workers, and what they measured.

`bench_plan` picks what to time from the problem: the GEMM shapes of the model's candidate
layouts (each linear GEMM of a layer and the output layer, per tp, mbs, cp, ep), a few square
GEMMs for the size dependence, causal attention at the model's sequence and head sizes,
elementwise buffers of the model's activation sizes, the first touch of fresh tensors (CPU
workers), host<->device copies (GPUs), and
collectives over message and group sizes. `run_local` starts one worker process per GPU (or
CPU worker) on this machine (`autotune.calibration.bench_worker`, gloo on CPU, NCCL on GPUs);
`read_points` reads what they wrote. A worker that dies stops the run: the others are stopped,
the worker is named (rank, pid, host, exit status, the phase it was in) and its points are kept.

Example:
    >>> from autotune.calibration.microbench import bench_plan, run_local
    >>> # points, devices = run_local(bench_plan(cfg, space), workers=2, out=Path("cal"))
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from autotune.calibration.file import Device
from autotune.calibration.file import Point
from autotune.calibration.file import Software
from autotune.costmodel.constants import constants_for
from autotune.costmodel.kernels import layer_gemms
from autotune.costmodel.terms import terms_for
from autotune.exceptions import AutotuneError
from autotune.layout import LayoutTable
from autotune.runners.local import free_port
from autotune.runners.process import package_root
from autotune.specs import AutotuneConfig

MESSAGE_BYTES = (4096, 65536, 1 << 20, 16 << 20)
"""Collective and send sizes (full buffer): latency-bound to bandwidth-bound."""
MESSAGE_BYTES_CPU = (4096, 65536, 1 << 20, 16 << 20, 64 << 20)
"""CPU workers' sizes: also above 32 MiB, where gloo's temporary buffers are mapped afresh
(glibc's mmap threshold) and a small model's whole gradient is one DeepSpeed bucket."""
BUSY_S = 0.003
"""Seconds each CPU worker computes before every timed collective or send (a few ms, as
between a layer's collectives in training; `bench_worker.busy_work`)."""
COLLECTIVE_OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all")
MOST_SHAPES = 16
"""GEMM shapes timed at most (spread over the candidates' sizes), beside the squares."""
SQUARES_CPU = (64, 128, 256, 512)
SQUARES_GPU = (512, 1024, 2048, 4096, 8192)
"""Square GEMMs (n = m = k) for the size dependence (`gemm_half_size`) and screening."""
SCREEN_CPU = {"n": 512, "dtype": "fp32", "rounds": 9, "calls": 8}
SCREEN_GPU = {"n": 8192, "dtype": "bf16", "rounds": 9, "calls": 20}
"""The screening GEMM (`bench_worker.screening`): n³ into a kept output, `calls` per round
(about 25 ms on a CPU core here, 30 ms on an H100), `rounds` rounds started together."""
EAGER_TOKENS = (32, 128, 512, 2048)
"""Token counts of the eager elementwise benchmark (CPU workers): the small ones pin the
per-op cost, the large ones the bandwidth."""


TOUCH_BYTES = (48 << 20, 96 << 20)
"""Fresh tensors whose first touch CPU workers time: above glibc's largest mmap threshold
(32 MiB), so each is mapped anew (`autotune.costmodel.eager.first_touch_s`)."""


class WorkerLost(AutotuneError):
    """A calibration worker died; the message names it, the points measured so far are kept
    (`job_id`: the Slurm job that ran the workers, if any)."""

    def __init__(self, message: str, points: list[Point], devices: list[Device],
                 job_id: str | None = None) -> None:
        super().__init__(message)
        self.points, self.devices, self.job_id = points, devices, job_id


def _spread(shapes: list[tuple[int, int, int]], most: int) -> list[tuple[int, int, int]]:
    """At most `most` shapes, evenly spaced in size (m·n·k)."""
    ordered = sorted(set(shapes), key=lambda s: s[0] * s[1] * s[2])
    if len(ordered) <= most:
        return ordered
    picks = np.unique(np.linspace(0, len(ordered) - 1, most).round().astype(int))
    return [ordered[i] for i in picks]


def gemm_shapes(cfg: AutotuneConfig, table: LayoutTable) -> list[tuple[int, int, int]]:
    """The distinct M×N×K of every linear GEMM (and the output layer) of the layouts."""
    k = constants_for(cfg.cluster.gpu, cfg.train.software_stack)
    shapes: list[tuple[int, int, int]] = []
    moe = [False, True] if cfg.model.moe_layer_share else [False]
    tokens = table.mbs * cfg.train.seq_length / table.cp
    for kind in moe:
        for gemm in layer_gemms(cfg, table, k, kind):
            for m, n, kk in zip(*np.broadcast_arrays(gemm.m, gemm.n, gemm.k), strict=True):
                shapes.append((max(1, round(float(m))), max(1, round(float(n))),
                               max(1, round(float(kk)))))
    split = terms_for(cfg).tp_splits_output_layer
    for m, tp in zip(tokens, table.tp, strict=True):
        shapes.append((int(m), int(cfg.model.vocab_size // (tp if split else 1)),
                       cfg.model.hidden_size))
    return shapes


def bench_plan(cfg: AutotuneConfig, layouts: LayoutTable, *, budget_s: float = 0.02,
               group_sizes: list[int] | None = None) -> dict[str, Any]:
    """What the workers time for `cfg`'s candidate `layouts` (JSON-ready)."""
    cpu = cfg.cluster.cpu_processes
    precision = cfg.train.precision
    dtypes = ["fp32"] if cpu else sorted({precision if precision != "fp8" else "bf16", "bf16"})
    squares = SQUARES_CPU if cpu else SQUARES_GPU
    shapes = _spread(gemm_shapes(cfg, layouts), MOST_SHAPES) + [(s, s, s) for s in squares]
    m, s = cfg.model, cfg.train.seq_length
    heads = sorted({max(1, m.num_attention_heads // int(tp)) for tp in set(layouts.tp)})
    batches = sorted({1, int(max(layouts.mbs))})
    attention = [[b, h, s, m.head_dim] for b in batches for h in heads]
    activation = [int(b * s * m.hidden_size * 4) for b in batches]
    world = cfg.cluster.gpus_per_node * cfg.cluster.nodes
    sizes = group_sizes or sorted({g for g in (2, 4, 8, world) if 2 <= g <= world})
    return {
        "gemms": [list(shape) for shape in shapes],
        "dtypes": dtypes,
        "gemm_passes": "training" if cpu else "forward",
        "attention": attention,
        "attention_dtype": "fp32" if cpu else "bf16",
        "elementwise_bytes": sorted({max(4096, a) for a in activation}
                                    | {max(4096, 4 * a) for a in activation}),
        "copy_bytes": [] if cpu else [64 << 20],
        "touch_bytes": list(TOUCH_BYTES) if cpu else [],
        "eager": ({"hidden": m.hidden_size, "tokens": list(EAGER_TOKENS),
                   "heads": m.num_attention_heads
                   if m.hidden_size % (2 * m.num_attention_heads) == 0 else 1} if cpu else {}),
        "screen": dict(SCREEN_CPU if cpu else SCREEN_GPU),
        "group_sizes": sizes,
        "collective_ops": list(COLLECTIVE_OPS),
        "message_bytes": list(MESSAGE_BYTES_CPU if cpu else MESSAGE_BYTES),
        "busy_s": BUSY_S if cpu else 0.0,
        "collective_repeats": 16 if cpu else 20,
        "budget_s": budget_s,
    }


def read_points(out: Path) -> tuple[list[Point], list[Device], dict[int, dict[str, Any]]]:
    """Points and devices the workers wrote to `out`, and each rank's last record."""
    points, devices, last = [], [], {}
    for path in sorted(out.glob("rank-*.jsonl")):
        for line in path.read_text().splitlines():
            try:
                record = json.loads(line)
            except json.JSONDecodeError:  # a line cut by the worker's death
                continue
            rank = int(record.pop("rank"))
            last[rank] = record
            event = record.get("event")
            if event == "start":
                devices.append(Device(rank=rank, host=record["host"], device=record["device"],
                                      memory_gib=record["memory_gib"]))
            elif event is None:
                points.append(Point(**{"ranks": [rank], **record}))
    devices.sort(key=lambda d: d.rank)
    return points, devices, last


def prepare_folder(plan: Mapping[str, Any], out: Path) -> None:
    """`out` with the plan (plan.json) and without an earlier run's records and exit files."""
    out.mkdir(parents=True, exist_ok=True)
    for old in [*out.glob("rank-*.jsonl"), *out.glob("exit-*")]:
        old.unlink()
    (out / "plan.json").write_text(json.dumps(plan, indent=1))


def _phase(last: Mapping[str, Any] | None) -> str:
    if not last:
        return "before its first record"
    if last.get("event") == "start":
        return "after start, in its first GEMMs"
    return f"after its {last.get('kind', '?')} {last.get('op', '')} measurements"


def exit_text(code: int) -> str:
    """How a process ended from its return code (negative: the signal that killed it)."""
    if code >= 0:
        return f"exited with {code}"
    try:
        return f"was killed by {signal.Signals(-code).name}"
    except ValueError:
        return f"was killed by signal {-code}"


def lost_worker(rank: int, pid: int | None, how: str, out: Path) -> str:
    """The line naming a lost worker: rank, pid and host (from its start record), how it ended,
    the phase it was in, the points kept and its log."""
    points, devices, last = read_points(out)
    host = next((d.host for d in devices if d.rank == rank), "an unknown host")
    pid = pid if pid is not None else _started(out, rank).get("pid")
    return (f"calibrate: worker {rank} (pid {pid if pid is not None else '?'} on {host}) {how} "
            f"{_phase(last.get(rank))}; {len(points)} points kept in {out} "
            f"(its log: {out / f'rank-{rank}.log'})")


def worker_stacks(out: Path) -> dict[str, Software]:
    """The software stack each host's workers reported (their start records), by host, in rank
    order."""
    stacks: dict[str, Software] = {}
    for rank in sorted(int(p.stem.removeprefix("rank-")) for p in out.glob("rank-*.jsonl")):
        record = _started(out, rank)
        if "software" in record:
            stacks.setdefault(str(record.get("host", "")), Software(**record["software"]))
    return stacks


def _started(out: Path, rank: int) -> dict[str, Any]:
    """The start record of `rank`, or {}."""
    path = out / f"rank-{rank}.jsonl"
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            continue
        if record.get("event") == "start":
            return dict(record)
    return {}


def run_local(
    plan: Mapping[str, Any],
    workers: int,
    out: Path,
    *,
    threads: int | None = None,
    worker_env: Mapping[int, Mapping[str, str]] | None = None,
    timeout_s: float = 600.0,
    on_progress: Callable[[int], None] | None = None,
) -> tuple[list[Point], list[Device]]:
    """Run the plan on `workers` processes of this machine and read their points.

    Args:
        plan: `bench_plan`'s output.
        workers: Worker processes (one per GPU, or CPU workers on gloo).
        out: Folder for the plan, the workers' records and logs.
        threads: torch threads per CPU worker (default: cores / workers).
        worker_env: Extra environment of single workers by rank (e.g. to reproduce a slow node).
        timeout_s: Limit of the whole run.
        on_progress: Called with the number of points measured so far, about once a second.

    Raises:
        WorkerLost: a worker exited with an error or the run timed out (the points are kept).
    """
    prepare_folder(plan, out)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    port = str(free_port())
    root = package_root()
    base = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
            "WORLD_SIZE": str(workers), "PYTHONUNBUFFERED": "1",
            "OMP_NUM_THREADS": str(threads or max(1, (cores or 1) // workers))}
    if root is not None:
        base["PYTHONPATH"] = os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)
    argv = [sys.executable, "-m", "autotune.calibration.bench_worker",
            "--plan", str(out / "plan.json"), "--out", str(out)]
    procs: list[subprocess.Popen[bytes]] = []
    for rank in range(workers):
        env = {**base, "RANK": str(rank), "LOCAL_RANK": str(rank),
               **(worker_env or {}).get(rank, {})}
        log = (out / f"rank-{rank}.log").open("wb")
        procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True))
    start = time.monotonic()
    lost: tuple[int, subprocess.Popen[bytes] | None] | None = None
    try:
        while None in [p.poll() for p in procs]:  # poll every worker (any() would stop early)
            failed = [(r, p) for r, p in enumerate(procs) if p.returncode not in (None, 0)]
            if failed:
                lost = failed[0]
                break
            if time.monotonic() - start > timeout_s:
                lost = (-1, None)
                break
            if on_progress is not None:
                on_progress(len(read_points(out)[0]))
            time.sleep(0.5)
        failed = [(r, p) for r, p in enumerate(procs) if p.returncode not in (None, 0)]
        lost = lost or (failed[0] if failed else None)
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    points, devices, _ = read_points(out)
    if lost is None:
        return points, devices
    rank, proc = lost
    if proc is None:
        raise WorkerLost(f"calibrate: the workers did not finish within {timeout_s:.0f} s; "
                         f"{len(points)} points kept in {out}", points, devices)
    raise WorkerLost(lost_worker(rank, proc.pid, exit_text(proc.returncode or 0), out),
                     points, devices)
