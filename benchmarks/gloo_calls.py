"""What one gloo call costs on this machine's CPU workers, issued from idle ranks and after
compute, as in training: real processes, real gloo.

Two worker processes (one torch thread each, as the CPU trials run) time each op and message
size back to back (what a calibration without compute measures) and right after every rank
computed for a few ms (`autotune.calibration.bench_worker.busy_work`, as a layer's collectives
follow its GEMMs), and with only rank 0 computing (the other waits inside the call: skew, not
the call's cost). Prints the median milliseconds of rank 0 per row.

    python benchmarks/gloo_calls.py [--busy-ms 3] [--repeats 20]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from autotune.runners.local import free_port

SIZES = (4096, 1 << 19, 4 << 20, 16 << 20, 64 << 20)
OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "reduce")


def _call(op: str, buffer: torch.Tensor) -> Callable[[], Any]:
    shard = buffer[: buffer.numel() // 2].clone()
    received = torch.empty_like(buffer)
    calls: dict[str, Callable[[], Any]] = {
        "all_reduce": lambda: dist.all_reduce(buffer),
        "all_gather": lambda: dist.all_gather_into_tensor(buffer, shard),
        "reduce_scatter": lambda: dist.reduce_scatter_tensor(shard, buffer),
        "all_to_all": lambda: dist.all_to_all_single(received, buffer),
        "reduce": lambda: dist.reduce(buffer, 0),
    }
    return calls[op]


def _worker(rank: int, port: int, busy_ms: float, repeats: int,
            queue: Any) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    start = time.perf_counter()
    for _ in range(20):
        torch.mm(a, b)
    gemms = max(1, round(busy_ms / 1e3 / ((time.perf_counter() - start) / 20)))

    def compute() -> None:
        for _ in range(gemms):
            torch.mm(a, b)

    modes: dict[str, Callable[[], None]] = {
        "idle": lambda: None, "after compute": compute,
        "rank 0 computes": compute if rank == 0 else lambda: None}
    rows = []
    for op in OPS:
        for nbytes in SIZES:
            call = _call(op, torch.ones(nbytes // 4))
            cells = []
            for before in modes.values():
                call()
                dist.barrier()
                times = []
                for _ in range(repeats):
                    before()
                    started = time.perf_counter()
                    call()
                    times.append(time.perf_counter() - started)
                cells.append(statistics.median(times) * 1e3)
            rows.append((op, nbytes, cells))
    if rank == 0:
        queue.put(rows)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    """Run both workers and print the table (module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--busy-ms", type=float, default=3.0)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args(argv)
    context = mp.get_context("spawn")
    queue = context.SimpleQueue()
    print(f"load average {os.getloadavg()[0]:.2f} before")
    mp.spawn(_worker, args=(free_port(), args.busy_ms, args.repeats, queue), nprocs=2)
    rows = queue.get()
    print(f"load average {os.getloadavg()[0]:.2f} after")
    print(f"\n| op | MiB | idle (ms) | after {args.busy_ms:g} ms of compute on every rank (ms) "
          "| ratio | rank 0 computes alone (ms) |")
    print("|---|---:|---:|---:|---:|---:|")
    for op, nbytes, (idle, busy, skew) in rows:
        print(f"| {op} | {nbytes / 2**20:.3g} | {idle:.2f} | {busy:.2f} | {busy / idle:.1f} "
              f"| {skew:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
