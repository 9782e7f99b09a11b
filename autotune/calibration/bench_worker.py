"""One worker of a calibration run: kernels, copies and collectives timed with torch.

Started once per GPU (or CPU worker) by `autotune.calibration.microbench` (or `srun` across
nodes)::

    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29500 \\
        python -m autotune.calibration.bench_worker --plan plan.json --out DIR

The plan (JSON, `microbench.bench_plan`) lists GEMM shapes and dtypes, attention shapes,
elementwise and copy sizes, the screening GEMM, collective message and group sizes. Every
worker times its own kernels, all at once as in training; then every worker times the screening
GEMM in rounds started together; then the group runs each collective (the slowest rank's time
counts, as in nccl-tests) and every link of a ring sends alone, in rounds. Each worker appends
its points to `DIR/rank-<r>.jsonl` as it goes (a lost worker leaves what it measured) and ends
with a `done` record. Under Slurm (`autotune.calibration.slurm_bench`) the rank comes from
SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID and the host name from SLURMD_NODENAME. The start
record carries the worker's software stack (what the calibration file records) and its Slurm
job id.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from autotune.calibration.file import screening_rate
from autotune.calibration.file import software_stack
from autotune.measurement import cpu_wait_s
from autotune.units import GIB

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
BUS_FACTOR = {"all_reduce": 2.0, "all_gather": 1.0, "reduce_scatter": 1.0, "all_to_all": 1.0}
"""nccl-tests' bus bandwidth: busbw = algbw · factor · (n − 1)/n (`doc/PERFORMANCE.md`)."""


class Worker:
    """This process's rank, device and output file."""

    def __init__(self, out: Path) -> None:
        env = os.environ
        self.rank = int(env.get("RANK", env.get("SLURM_PROCID", "0")))
        self.world = int(env.get("WORLD_SIZE", env.get("SLURM_NTASKS", "1")))
        self.local = int(env.get("LOCAL_RANK", env.get("SLURM_LOCALID", "0")))
        env.setdefault("RANK", str(self.rank))  # what init_process_group reads
        env.setdefault("WORLD_SIZE", str(self.world))
        self.host = env.get("SLURMD_NODENAME") or socket.gethostname()  # Slurm's node name
        self.cuda = torch.cuda.is_available()
        # a task that Slurm bound to its own GPU sees that one only
        index = self.local % torch.cuda.device_count() if self.cuda else 0
        if self.cuda:
            torch.cuda.set_device(index)
        self.device = torch.device("cuda", index) if self.cuda else torch.device("cpu")
        self.file = (out / f"rank-{self.rank}.jsonl").open("a")

    def write(self, record: dict[str, Any]) -> None:
        """Append one record and flush it (a worker may be lost at any point)."""
        self.file.write(json.dumps({"rank": self.rank, **record}) + "\n")
        self.file.flush()

    def waited(self) -> float:
        """Seconds this (CPU) worker has waited for a CPU; 0 on GPUs, whose kernels do not
        run on the host thread."""
        return 0.0 if self.cuda else cpu_wait_s()

    def sync(self) -> None:
        """Wait for this device's queued work."""
        if self.cuda:
            torch.cuda.synchronize()


def timed(worker: Worker, fn: Callable[[], Any], budget_s: float, most: int = 50,
          exactly: int | None = None, before: Callable[[], Any] | None = None) -> float:
    """Median seconds of `fn` after one warm-up call, repeated until `budget_s` or `most`
    (or `exactly` times: collectives, where every rank must make the same calls); `before`
    runs untimed ahead of each call. A CPU worker does not count the time it waited for a CPU
    that other processes held (`cpu_wait_s`): the figures are the machine's, not its other
    tenants' (the trials are judged alike)."""
    fn()
    worker.sync()
    times: list[float] = []
    spent = 0.0
    while (len(times) < exactly if exactly is not None
           else len(times) < 3 or (spent < budget_s and len(times) < most)):
        if before is not None:
            before()
        start, waited = time.perf_counter(), worker.waited()
        fn()
        worker.sync()
        wall = time.perf_counter() - start
        times.append(max(wall - (worker.waited() - waited), 1e-3 * wall))
        spent += wall
    return statistics.median(times)


def gemms(worker: Worker, plan: dict[str, Any]) -> None:
    """Each GEMM shape and dtype: seconds and FLOP/s. With `gemm_passes` "training" (CPU
    workers), each M×N×K is a linear layer as autograd runs it in training: the forward
    x·Wᵀ and the backward's two transposed GEMMs (the input gradient g·W and the weight
    gradient gᵀ·x), each into a fresh output (op "linear", 6·M·N·K FLOPs); otherwise the
    forward `torch.mm` alone (op "mm")."""
    training = plan.get("gemm_passes") == "training"
    for dtype in plan["dtypes"]:
        for m, n, k in plan["gemms"]:
            if training:
                fn, flops = _linear(worker, m, n, k, DTYPES[dtype]), 6 * m * n * k
            else:
                fn, flops = _mm(worker, m, n, k, DTYPES[dtype]), 2 * m * n * k
            seconds = timed(worker, fn, plan["budget_s"])
            worker.write({"kind": "gemm", "op": "linear" if training else "mm", "dtype": dtype,
                          "shape": {"m": m, "n": n, "k": k}, "seconds": seconds,
                          "rate": flops / seconds})


def _mm(worker: Worker, m: int, n: int, k: int, dtype: torch.dtype) -> Callable[[], None]:
    """The forward GEMM: [m, k] × [k, n] into a fresh output."""
    a = torch.randn(m, k, device=worker.device).to(dtype)
    b = torch.randn(k, n, device=worker.device).to(dtype)

    def forward() -> None:
        torch.mm(a, b)

    return forward


def _linear(worker: Worker, m: int, n: int, k: int, dtype: torch.dtype) -> Callable[[], None]:
    """A linear layer of k inputs and n outputs on m tokens, forward and backward
    (`torch.nn.functional.linear`, `torch.autograd.grad`: no gradient accumulates)."""
    x = torch.randn(m, k, device=worker.device).to(dtype).requires_grad_()
    w = torch.randn(n, k, device=worker.device).to(dtype).requires_grad_()
    g = torch.randn(m, n, device=worker.device).to(dtype)

    def step() -> None:
        y = torch.nn.functional.linear(x, w)
        torch.autograd.grad(y, (x, w), g)

    return step


SCREEN_ROUND_S = 0.03
"""Seconds of GEMMs per screening round the plan expects. A device far slower than planned (a
CPU given a GPU plan, a throttled GPU) times a smaller n (doubled from `SCREEN_SMALLEST_N`
while the next size fits a round) and fewer calls, so screening stays seconds, not hours."""
SCREEN_SMALLEST_N = 256


def screening(worker: Worker, plan: dict[str, Any]) -> None:
    """The screening GEMM (n × n × n into a kept output: no page faults) in rounds that every
    worker starts together (a barrier), as all devices compute at once in training; one point
    with each round's rate (`Point.repeats`). Interference then slows some rounds of a worker,
    a slow device all of them."""
    spec = plan.get("screen")
    if not spec:
        return
    planned, calls = int(spec["n"]), int(spec["calls"])
    dtype = DTYPES[spec["dtype"]]
    round_s = float(spec.get("round_s", SCREEN_ROUND_S))
    n = min(SCREEN_SMALLEST_N, planned)
    while True:  # grow to the planned n unless the next size would overrun a round
        a, b, c = (torch.randn(n, n, device=worker.device).to(dtype) for _ in range(3))
        torch.mm(a, b, out=c)  # warm-up
        worker.sync()
        start = time.perf_counter()
        torch.mm(a, b, out=c)
        worker.sync()
        one = time.perf_counter() - start
        if n >= planned or one * 8 > 4 * round_s:
            break
        n = min(2 * n, planned)
    if one * calls > 4 * round_s:  # a device far slower than planned: fewer calls, not hours
        calls = max(1, round(round_s / one))
    flops = 2.0 * n**3 * calls
    rates = []
    for _ in range(int(spec["rounds"])):
        if dist.is_initialized():
            dist.barrier()
        start, waited = time.perf_counter(), worker.waited()
        for _ in range(calls):
            torch.mm(a, b, out=c)
        worker.sync()
        wall = time.perf_counter() - start
        rates.append(flops / max(wall - (worker.waited() - waited), 1e-3 * wall))
    rate, _ = screening_rate(rates)
    worker.write({"kind": "screen", "op": "mm", "dtype": spec["dtype"],
                  "shape": {"m": n, "n": n, "k": n}, "seconds": 2.0 * n**3 / rate,
                  "rate": rate, "repeats": rates})


def attention(worker: Worker, plan: dict[str, Any]) -> None:
    """Causal SDPA forward plus backward at each (batch, heads, seq, head_dim)."""
    dtype = DTYPES[plan["attention_dtype"]]
    for b, heads, seq, dim in plan["attention"]:
        q, k, v = (torch.randn(b, heads, seq, dim, device=worker.device, dtype=dtype,
                               requires_grad=True) for _ in range(3))

        def step(q: torch.Tensor = q, k: torch.Tensor = k, v: torch.Tensor = v) -> None:
            out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            out.sum().backward()  # type: ignore[no-untyped-call]

        seconds = timed(worker, step, plan["budget_s"])
        causal = 4 * b * heads * seq * seq * dim / 2  # QK^T and PV forward, half the square
        worker.write({"kind": "attention", "op": "sdpa", "dtype": plan["attention_dtype"],
                      "shape": {"b": b, "heads": heads, "seq": seq, "head_dim": dim},
                      "seconds": seconds, "rate": 3 * causal / seconds})


def memory(worker: Worker, plan: dict[str, Any]) -> None:
    """Elementwise add (two reads, one write); on CPU workers the first touch of a freshly
    mapped tensor (filling a new one less filling a kept one); on GPUs pinned host<->device
    copies."""
    for nbytes in plan["elementwise_bytes"]:
        x, y = (torch.randn(nbytes // 4, device=worker.device) for _ in range(2))
        out = torch.empty_like(x)
        def add(x: torch.Tensor = x, y: torch.Tensor = y, out: torch.Tensor = out) -> None:
            torch.add(x, y, out=out)

        seconds = timed(worker, add, plan["budget_s"])
        worker.write({"kind": "elementwise", "op": "add", "dtype": "fp32",
                      "shape": {"bytes": 3 * nbytes}, "seconds": seconds,
                      "rate": 3 * nbytes / seconds})
    for nbytes in plan.get("touch_bytes", []):
        kept = torch.empty(nbytes // 4, device=worker.device)

        def fresh(n: int = nbytes // 4) -> None:
            torch.empty(n, device=worker.device).fill_(1.0)

        def reused(x: torch.Tensor = kept) -> None:
            x.fill_(1.0)

        seconds = max(timed(worker, fresh, plan["budget_s"])
                      - timed(worker, reused, plan["budget_s"]), 1e-9)
        worker.write({"kind": "touch", "op": "fill", "dtype": "fp32",
                      "shape": {"bytes": nbytes}, "seconds": seconds, "rate": nbytes / seconds})
    if not worker.cuda:
        return
    for nbytes in plan["copy_bytes"]:
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        device = torch.empty(nbytes, dtype=torch.uint8, device=worker.device)
        for op, dst, src in (("h2d", device, host), ("d2h", host, device)):
            def copy(d: torch.Tensor = dst, s: torch.Tensor = src) -> None:
                d.copy_(s, non_blocking=True)

            seconds = timed(worker, copy, plan["budget_s"])
            worker.write({"kind": "copy", "op": op, "shape": {"bytes": nbytes},
                          "seconds": seconds, "rate": nbytes / seconds})


def eager(worker: Worker, plan: dict[str, Any]) -> None:
    """The CPU workload's eager elementwise ops at each token count: RMSNorm, rotary over the
    heads, SwiGLU's silu and mul, the residual add, forward and backward in fp32 (the ops
    `autotune.costmodel.eager` counts for a layer), with the ops and bytes they dispatched."""
    from torch.nn import functional

    from autotune.workloads.deepspeed_gpt import rotary
    from autotune.workloads.dispatch import ElementwiseCount

    spec = plan.get("eager") or {}
    hidden, heads = int(spec.get("hidden", 0)), int(spec.get("heads", 1))
    if not hidden:
        return
    norm = torch.nn.RMSNorm(hidden, eps=1e-5)
    for tokens in spec.get("tokens", []):
        x = torch.randn(1, tokens, hidden, requires_grad=True)
        grad = torch.randn_like(x)

        def layer_ops(x: torch.Tensor = x, grad: torch.Tensor = grad) -> None:
            norm.weight.grad = x.grad = None  # every call alike: no gradient accumulation
            normed = norm(x)
            turned = rotary(normed.view(*x.shape[:2], heads, hidden // heads), 0)
            out = x + functional.silu(turned.reshape(x.shape)) * normed
            out.backward(grad)

        with ElementwiseCount() as count:
            layer_ops()
        seconds = timed(worker, layer_ops, plan["budget_s"])
        worker.write({"kind": "eager", "op": "layer_ops", "dtype": "fp32",
                      "shape": {"tokens": tokens, "bytes": count.bytes, "ops": count.ops},
                      "seconds": seconds, "rate": count.bytes / seconds})


def _collective(op: str, buffer: torch.Tensor, n: int, group: Any) -> Callable[[], Any]:
    """The call that runs `op` on `buffer` (the full buffer of nccl-tests' size)."""
    if op == "all_reduce":
        return lambda: dist.all_reduce(buffer, group=group)
    if op == "all_gather":
        shard = buffer[: buffer.numel() // n]
        return lambda: dist.all_gather_into_tensor(buffer, shard, group=group)
    if op == "reduce_scatter":
        shard = torch.empty(buffer.numel() // n, dtype=buffer.dtype, device=buffer.device)
        reduce_scatter = getattr(dist, "reduce_scatter_single", dist.reduce_scatter_tensor)
        return lambda: reduce_scatter(shard, buffer, group=group)
    received = torch.empty_like(buffer)
    return lambda: dist.all_to_all_single(received, buffer, group=group)


def busy_work(worker: Worker, seconds: float) -> Callable[[], None]:
    """A call that keeps this CPU worker's threads busy on GEMMs for about `seconds` (nothing
    on GPUs or at 0 s): in training every collective and send follows compute on each rank,
    and a gloo call that follows compute on every rank costs several times one issued from
    idle ranks (benchmarks/gloo_calls.py), so the calibration times them so."""
    if worker.cuda or seconds <= 0:
        return lambda: None
    a, b = torch.randn(256, 256), torch.randn(256, 256)
    one = timed(worker, lambda: torch.mm(a, b), 0.005)
    repeats = max(1, round(seconds / max(one, 1e-6)))

    def work() -> None:
        for _ in range(repeats):
            torch.mm(a, b)

    return work


def _slowest(worker: Worker, seconds: float) -> float:
    """The largest of every rank's time."""
    value = torch.tensor([seconds], dtype=torch.float64, device=worker.device)
    dist.all_reduce(value, op=dist.ReduceOp.MAX)
    return float(value.item())


def collectives(worker: Worker, plan: dict[str, Any]) -> None:
    """Each op over each group of the first g ranks and each message size; rank 0 writes the
    slowest rank's median time and the bus bandwidth. CPU workers compute before each call
    (`busy_work`), as in training."""
    before = busy_work(worker, float(plan.get("busy_s", 0.0)))
    for size in plan["group_sizes"]:
        members = list(range(size))
        group = dist.new_group(members)
        inside = worker.rank < size
        for op in plan["collective_ops"]:
            for nbytes in plan["message_bytes"]:
                seconds = 1e-12
                if inside:
                    elements = max(size, nbytes // 4 // size * size)
                    buffer = torch.ones(elements, device=worker.device)
                    seconds = timed(worker, _collective(op, buffer, size, group),
                                    plan["budget_s"], exactly=plan["collective_repeats"],
                                    before=before)
                slowest = _slowest(worker, seconds)
                if worker.rank == 0:
                    moved = BUS_FACTOR[op] * (size - 1) / size * nbytes
                    worker.write({"kind": "collective", "op": op, "dtype": "fp32",
                                  "shape": {"bytes": nbytes}, "ranks": members,
                                  "seconds": slowest, "rate": moved / slowest})
        dist.barrier()


def links(worker: Worker, plan: dict[str, Any]) -> None:
    """Send/recv over every link of the ring r -> r+1, one link at a time, in rounds: each
    round sends once over every link in turn (a barrier before each send), so a slow spell of
    the host falls on all links alike, as the screening GEMM's rounds do for the workers. The
    receiver writes its median time and each round's rate (`Point.repeats`; the send
    completes when the data has arrived). CPU workers compute before each send or receive
    (`busy_work`), as the pipeline's stages do, and both ends time each round: the shorter time
    counts. The end that starts first waits for its peer to finish computing (on a shared core
    the peer's whole `busy_work`: one direction of a link read 78 % slow), the end that starts
    second times the transfer alone; a gloo send, even of 1 KiB, waits for its receive, so the
    sender's time is never a buffered write's."""
    if worker.world < 2:
        return
    before = busy_work(worker, float(plan.get("busy_s", 0.0)))
    ring = [(src, (src + 1) % worker.world) for src in range(worker.world)]
    for nbytes in plan["message_bytes"]:
        buffer = torch.ones(max(1, nbytes // 4), device=worker.device)
        times: dict[int, list[float]] = {src: [] for src, _ in ring}
        for round_ in range(plan["collective_repeats"] + 1):  # the first round warms up
            for src, dst in ring:
                dist.barrier()
                if worker.rank not in (src, dst):
                    continue
                move = dist.send if worker.rank == src else dist.recv
                before()
                start, waited = time.perf_counter(), worker.waited()
                move(buffer, dst if worker.rank == src else src)
                worker.sync()
                wall = time.perf_counter() - start
                if round_:
                    times[src].append(max(wall - (worker.waited() - waited), 1e-3 * wall))
        for src, dst in ring:  # a CPU sender's times reach the receiver, which keeps the shorter
            if worker.rank in (src, dst) and not worker.cuda:
                theirs = torch.tensor(times[src], dtype=torch.float64, device=worker.device)
                if worker.rank == src:
                    dist.send(theirs, dst)
                    continue
                dist.recv(theirs, src)
                times[src] = [min(a, b) for a, b in zip(times[src], theirs.tolist(), strict=True)]
            if worker.rank == dst:
                worker.write({"kind": "send", "op": "send_recv", "dtype": "fp32",
                              "shape": {"bytes": nbytes}, "ranks": [src, dst],
                              "seconds": statistics.median(times[src]),
                              "rate": nbytes / statistics.median(times[src]),
                              "repeats": [nbytes / t for t in times[src]]})
    dist.barrier()


def main(argv: list[str] | None = None) -> int:
    """Run the plan on this worker (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    plan = json.loads(args.plan.read_text())
    worker = Worker(args.out)
    threads = int(os.environ.get("OMP_NUM_THREADS", "0"))
    if threads and not worker.cuda:
        torch.set_num_threads(threads)
    name = torch.cuda.get_device_name(worker.device) if worker.cuda else "cpu"
    memory_gib = (torch.cuda.get_device_properties(worker.device).total_memory / GIB
                  if worker.cuda else 0.0)
    worker.write({"event": "start", "pid": os.getpid(), "host": worker.host,
                  "device": name if worker.cuda else f"cpu ({torch.get_num_threads()} threads)",
                  "memory_gib": memory_gib, "slurm_job": os.environ.get("SLURM_JOB_ID"),
                  "software": software_stack().model_dump()})
    torch.manual_seed(worker.rank)
    gemms(worker, plan)
    attention(worker, plan)
    memory(worker, plan)
    eager(worker, plan)
    if worker.world > 1:
        dist.init_process_group("nccl" if worker.cuda else "gloo",
                                device_id=worker.device if worker.cuda else None)
    screening(worker, plan)
    if worker.world > 1:
        collectives(worker, plan)
        links(worker, plan)
        dist.destroy_process_group()
    worker.write({"event": "done"})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
