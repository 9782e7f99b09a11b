"""What every built-in workload shares: arguments, layout.json, the reporter, the step loop.

The records a workload prints and its exit codes are the protocol of `autotune.workloads.records`.
A run
refused before it trained exits non-zero on rank 0 only (`Reporter.fail`), a rank that fails
alone with its own code (`Reporter.rank_failed`); `exit_now` ends the process.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import resource
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any
from typing import NoReturn
from typing import Protocol

import torch

from autotune.costmodel.constants import Constants
from autotune.exceptions import AutotuneError
from autotune.frameworks.base import Rule
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.space.rules import structural_violations
from autotune.specs import AutotuneConfig
from autotune.specs import ClusterSpec
from autotune.specs import GPUSpec
from autotune.specs import ModelSpec
from autotune.specs import TrainSpec
from autotune.workloads.records import EXIT_CODES
from autotune.workloads.records import step_record
from autotune.workloads.records import summary_record

SEED = 1234
"""Seed of the weights and of the synthetic token stream."""
INJECTIONS = ("nan", "hang", "oom")
"""Failures ``--inject`` can provoke, to test how runners classify them."""
INJECT_STEP = 2
"""Step at which an injected failure happens."""
_OOM_MARKERS = ("out of memory", "can't allocate memory")


class StepPlan(Protocol):
    """What the training loop reads of a workload's plan."""

    @property
    def layout(self) -> Layout: ...

    @property
    def steps(self) -> int: ...

    @property
    def warmup(self) -> int: ...

    @property
    def tokens_per_step(self) -> int: ...


def workload_parser(prog: str) -> argparse.ArgumentParser:
    """A parser of the arguments every workload takes; the workload adds its own.

    ``--problem`` (or ``--model`` and ``--seq``), ``--layout``, ``--steps``, ``--warmup``,
    ``--metrics``, ``--inject``.
    """
    parser = argparse.ArgumentParser(prog=prog)
    parser.add_argument("--problem", type=Path,
                        help="problem.json of the trial (model, cluster, training setup), as "
                             "runners write it; the layout is checked against its rules")
    parser.add_argument("--model", help="without --problem: preset name, YAML or HF config.json")
    parser.add_argument("--seq", type=int, help="without --problem: tokens per sequence")
    parser.add_argument("--layout", required=True, type=Path, help="layout.json of the trial")
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps, warm-up included")
    parser.add_argument("--warmup", type=int, default=2, help="steps left out of the summary")
    parser.add_argument("--metrics", type=Path, help="JSONL file the records are appended to")
    parser.add_argument("--inject", choices=INJECTIONS,
                        help=f"provoke a failure at step {INJECT_STEP}")
    return parser


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Exit through `parser.error` unless the problem and the step counts are usable."""
    if args.problem is None and (args.model is None or args.seq is None):
        parser.error("give --problem problem.json, or --model and --seq")
    if (args.seq is not None and args.seq < 1) or args.warmup < 0 or args.steps <= args.warmup:
        parser.error(
            f"need --seq >= 1 and 0 <= --warmup < --steps (got seq={args.seq}, "
            f"warmup={args.warmup}, steps={args.steps})"
        )


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from a file; AutotuneError says what is wrong with it."""
    try:
        data = json.loads(path.read_text())
    except OSError as error:
        raise AutotuneError(f"cannot read {path}: {error.strerror}") from None
    except json.JSONDecodeError as error:
        raise AutotuneError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(data, dict):
        raise AutotuneError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def read_problem(path: Path) -> AutotuneConfig:
    """The AutotuneConfig in problem.json; AutotuneError names what is wrong with it."""
    from pydantic import ValidationError

    from autotune.specs.inputs import validation_message

    try:
        return AutotuneConfig.model_validate(read_json(path))
    except ValidationError as error:
        raise AutotuneError(validation_message(error, str(path))) from None


def read_layout(path: Path) -> Layout:
    """The Layout in layout.json (its fields at the top level or under ``layout``)."""
    data = read_json(path)
    data = data.get("layout", data) if isinstance(data.get("layout"), dict) else data
    names = {field.name for field in dataclasses.fields(Layout)}
    try:
        return Layout(**{key: value for key, value in data.items() if key in names})
    except TypeError as error:
        raise AutotuneError(f"{path}: {error}") from None


def trial_config(
    model: ModelSpec,
    *,
    world_size: int,
    seq_length: int,
    global_batch_size: int,
    precision: str,
    framework: str,
    flash_attention: bool = True,
) -> AutotuneConfig:
    """The problem a trial program checks its layout against: the model and training setup on
    this world's processes (LOCAL_WORLD_SIZE per node); the GPU figures are placeholders the
    structural rules never read.

    Raises:
        AutotuneError: the training setup is not valid (named field).
    """
    from pydantic import ValidationError

    from autotune.specs.inputs import validation_message

    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", world_size)) or world_size
    gpu = GPUSpec(name="workload", memory_gb=80, peak_tflops={precision: 1.0}, hbm_tb_s=1.0)
    cluster = ClusterSpec(name="workload", nodes=max(1, world_size // per_node),
                          gpus_per_node=min(per_node, world_size), gpu=gpu, intra_node_gb_s=1.0,
                          inter_node_gb_s=1.0, host_memory_gb=1.0, pcie_gb_s=1.0)
    try:
        train = TrainSpec(seq_length=seq_length, global_batch_size=global_batch_size,
                          precision=precision, framework=framework,
                          flash_attention=flash_attention)
    except ValidationError as error:
        raise AutotuneError(validation_message(error, "training setup")) from None
    return AutotuneConfig(model=model, cluster=cluster, train=train)


def refusal(cfg: AutotuneConfig, layout: Layout, limits: tuple[Rule, ...] = ()) -> str | None:
    """Why this program will not train the layout: the first named rule it breaks (the
    framework's rules, then the program's own `limits`), as `name: reason`; None when none."""
    broken = structural_violations(cfg, layout)
    table = LayoutTable.from_layouts([layout])
    broken += [(r.name, r.explain(cfg, layout)) for r in limits
               if bool(r.check(cfg, table, Constants())[0])]
    return f"{broken[0][0]}: {broken[0][1]}" if broken else None


def peak_memory_bytes() -> int:
    """This rank's peak: allocated CUDA memory on GPU, this process's resident high-water mark
    on CPU (`VmHWM` of /proc/self/status). Not `ru_maxrss`: Linux carries it across exec from
    the parent (`exec_mmap` keeps `signal->maxrss`), so a worker started by a larger process
    (a test runner, a launcher) would report the parent's size. The kernel reports `VmHWM` as
    the larger of its recorded high-water mark, updated lazily, and the current RSS, so two reads
    can go down: callers keep the running maximum."""
    if torch.cuda.is_available():
        return int(torch.cuda.max_memory_allocated())
    peak = process_status_bytes("VmHWM")
    if peak is None:  # no procfs (macOS): the kernel's own peak
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return peak


def process_status_bytes(field: str) -> int | None:
    """A memory field of /proc/self/status (VmHWM, VmRSS, RssAnon, ...) in bytes; None where
    there is no procfs or no such field."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return None
    match = re.search(rf"^{field}:\s+(\d+) kB", status, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else None


def malloc_arenas() -> list[tuple[int, int]]:
    """Per glibc malloc arena of this process (the main one first, then one per thread that
    allocated, up to `MALLOC_ARENA_MAX`): the bytes it holds from the system and, of them, its
    free chunks (`malloc_info`'s `system current`, and `total rest` + `fast`); [] without
    glibc. Source: glibc `malloc/malloc.c`, `__malloc_info`."""
    import ctypes
    import tempfile

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.fopen.restype = ctypes.c_void_p
        libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
        libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc.fclose.argtypes = [ctypes.c_void_p]
    except (OSError, AttributeError):
        return []
    with tempfile.NamedTemporaryFile(suffix=".xml") as xml:
        handle = libc.fopen(xml.name.encode(), b"w")
        if not handle:
            return []
        libc.malloc_info(0, handle)
        libc.fclose(handle)
        text = Path(xml.name).read_text()
    heaps = []
    for heap in re.findall(r'<heap nr="\d+">(.*?)</heap>', text, re.S):
        free = sum(int(size) for size in re.findall(
            r'<total type="(?:fast|rest)" count="\d+" size="(\d+)"/>', heap))
        system = re.search(r'<system type="current" size="(\d+)"/>', heap)
        heaps.append((int(system.group(1)) if system else 0, free))
    return heaps


class Reporter:
    """Writes records as JSON lines to stdout and the metrics file (rank 0 unless forced)."""

    def __init__(self, rank: int, metrics: Path | None) -> None:
        self.rank, self.metrics = rank, metrics

    def emit(self, record: dict[str, Any], any_rank: bool = False) -> None:
        """Print one record (only on rank 0 unless ``any_rank``)."""
        if self.rank != 0 and not any_rank:
            return
        line = json.dumps(record)
        print(line, flush=True)
        if self.metrics is not None:
            with self.metrics.open("a") as handle:
                handle.write(line + "\n")

    def fail(self, status: str, reason: str, world: int) -> int:
        """Summarise a run refused before it started (every rank decides alike); the exit code.

        Only rank 0 exits with the status's code, the others with 0: a launcher kills the other
        workers as soon as one fails, so a peer failing first could kill rank 0 before it printed
        the summary.
        """
        self.emit({"event": "summary", "status": status, "reason": reason, "world_size": world})
        return EXIT_CODES[status] if self.rank == 0 else 0

    def rank_failed(self, status: str, error: BaseException, world: int) -> int:
        """Report a failure of this rank alone (with its traceback); returns the exit code.

        Every rank that fails prints its own summary, with a ``rank`` field, and exits with the
        status's code. Peers may differ or wait in a collective: the caller must not tear down.
        """
        traceback.print_exc()
        record = {"event": "summary", "status": status, "reason": str(error)[:500],
                  "rank": self.rank, "world_size": world}
        self.emit(record, any_rank=True)
        return EXIT_CODES[status]

    def finish(self, summary: dict[str, Any], teardown: Callable[[], None]) -> int:
        """Emit the summary of a run that trained, tear down, and return its exit code."""
        self.emit(summary)
        teardown()
        return EXIT_CODES[summary["status"]]


def inject_failure(kind: str | None, step: int, device: torch.device) -> bool:
    """Provoke the failure ``--inject`` asked for at INJECT_STEP.

    ``hang`` sleeps forever and ``oom`` allocates more than any memory (the allocator raises its
    real out-of-memory error); True means ``nan``: the caller must make the loss NaN.
    """
    if kind is None or step != INJECT_STEP:
        return False
    if kind == "hang":
        while True:
            time.sleep(3600)
    elif kind == "oom":
        torch.empty(1 << 62, dtype=torch.uint8, device=device)
    return kind == "nan"


def train_loop(
    plan: StepPlan,
    reporter: Reporter,
    device: torch.device,
    timed_step: Callable[[int], tuple[float, float]],
    step_extra: Callable[[int], dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """Run the steps, emit one record per step, and return the summary record.

    ``timed_step(step)`` runs one optimizer step and returns its time in seconds and the loss of
    the global batch (the same on every rank); ``step_extra(step)`` adds fields to its record
    (the measured parts). A NaN loss ends the run with status nan.
    """
    times_s: list[float] = []
    peak, loss = 0, math.nan
    status, steps = "ok", plan.steps
    for step in range(plan.steps):
        step_time_s, loss = timed_step(step)
        peak = max(peak, max_over_ranks(peak_memory_bytes(), device))
        warmup = step < plan.warmup
        record = step_record(step, step_time_s, plan.tokens_per_step, loss, peak, warmup)
        reporter.emit({**record, **(step_extra(step) if step_extra else {})})
        if not math.isfinite(loss):
            status, steps = "nan", step + 1
            break
        if not warmup:
            times_s.append(step_time_s)
    return summary_record(status, times_s, plan.tokens_per_step, peak, loss,
                          world=plan.layout.world_size, steps=steps, warmup=plan.warmup,
                          layout=plan.layout)


def is_oom(error: BaseException) -> bool:
    """Whether an exception means device or host memory ran out."""
    if isinstance(error, torch.OutOfMemoryError | MemoryError):
        return True
    return any(marker in str(error) for marker in _OOM_MARKERS)


def max_over_ranks(value: int, device: torch.device) -> int:
    """The largest value over all ranks of the default process group."""
    import torch.distributed as dist

    tensor = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
    return int(tensor.item())


def teardown() -> None:
    """Barrier and destroy the default process group, if there is one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def exit_now(code: int) -> NoReturn:
    """Flush stdout and stderr, then leave with ``code`` without interpreter teardown.

    After the process group is destroyed, C++ destructors of gloo / DeepSpeed comm threads at
    interpreter exit occasionally abort ("terminate called without an active exception",
    SIGABRT) although the run finished; ``os._exit`` skips them.
    """
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
