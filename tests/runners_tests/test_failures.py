"""Failure classification on log text in the real formats of torch, torchrun, NCCL, gloo,
DeepSpeed and Megatron-LM."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from autotune.runners.failures import classify
from autotune.runners.failures import last_exception
from autotune.runners.failures import worker_exit_code
from autotune.workloads.records import EXIT_CODES

TORCHRUN_ROOT_CAUSE = """torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
autotune.workloads.deepspeed_gpt FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-29_09:40:15
  host      : localhost
  rank      : 1 (local_rank: 1)
  exitcode  : {code} (pid: 16298)
  error_file: <N/A>
  traceback : {traceback}
============================================================"""


def root_cause(code: int, traceback: str = "To enable traceback see: https://pytorch.org") -> str:
    return TORCHRUN_ROOT_CAUSE.format(code=code, traceback=traceback)


CASES = {
    "cuda_oom": (
        1,
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 "
        "has a total capacity of 79.11 GiB of which 1.23 GiB is free.",
        "oom",
    ),
    "cpu_oom": (
        1,
        "RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. "
        "DefaultCPUAllocator: can't allocate memory: you tried to allocate 765530112 "
        "bytes. Error code 12 (Cannot allocate memory)",
        "oom",
    ),
    "memory_error": (
        1,
        'Traceback (most recent call last):\n  File "x.py", line 1\nMemoryError',
        "oom",
    ),
    "oom_killer": (1, root_cause(-9, "Signal 9 (SIGKILL) received by PID 16298"), "oom"),
    "nccl_watchdog": (
        -6,
        "[rank1]:[E1129 09:00:00.000000 1234 ProcessGroupNCCL.cpp:632] [Rank 1]"
        " Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5, "
        "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran for "
        "600010 milliseconds before timing out.",
        "nccl_timeout",
    ),
    "gloo_timeout": (
        1,
        "RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc"
        ":81] Timed out waiting 1800000ms for recv operation to complete",
        "nccl_timeout",
    ),
    "megatron_nan": (
        1,
        "RuntimeError: Rank 0: found NaN in local grad norm for bucket #0 in "
        "backward pass before data-parallel communication collective. Device: 0, "
        "node: node-1",
        "nan",
    ),
    "zero_pipeline": (
        1,
        "AssertionError: ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism",
        "rejected",
    ),
    "deepspeed_pydantic": (
        1,
        "pydantic_core._pydantic_core.ValidationError: 1 validation error "
        "for DeepSpeedZeroConfig\nreduce_bucket_size\n  Input should be "
        "greater than or equal to 0",
        "rejected",
    ),
    "megatron_validate_args": (
        1,
        'Traceback (most recent call last):\n  File "/opt/Megatron-LM/'
        'megatron/training/arguments.py", line 512, in validate_args\n'
        "    assert args.num_layers % pp == 0\nAssertionError: number of "
        "layers should be divisible by the pipeline parallel size",
        "rejected",
    ),
    "workload_exit_code": (1, root_cause(EXIT_CODES["nan"]), "nan"),
    "deepspeed_launcher_exit_code": (
        EXIT_CODES["oom"],
        "[2026-11-29 09:57:14,686] [ERROR] [launch.py:259:sigkill_handler] ['/usr/bin/python', "
        "'-u', '-m', 'autotune.workloads.deepspeed_gpt', '--local_rank=1'] exits with return "
        f"code = {EXIT_CODES['oom']}",
        "oom",
    ),
    "segfault": (-11, "", "crash"),
    "plain_error": (
        1,
        'Traceback (most recent call last):\n  File "x.py", line 3, in <module>\n'
        "KeyError: 'q_proj'\n" + root_cause(1),
        "crash",
    ),
}


@pytest.mark.parametrize("case", CASES, ids=list(CASES))
def test_log_text_and_exit_code_give_the_class(case: str) -> None:
    """Oracle: log lines in the exact formats torch, torchrun (its ChildFailedError root-cause
    block), NCCL's watchdog, gloo, DeepSpeed's launcher and pydantic config and Megatron-LM's
    arguments.py print, with the exit codes those failures really end with (negative: the
    signal, POSIX); the class for each worked out by hand."""
    returncode, text, status = CASES[case]
    failure = classify(returncode=returncode, text=text)
    assert failure is not None and failure.status == status, failure
    assert failure.reason


def test_reasons_quote_the_cause() -> None:
    """Oracle: worked out by hand from the log texts: the reason quotes the last exception line,
    names SIGSEGV for -11 (POSIX), and torchrun's root cause gives the worker's exit code."""
    failure = classify(returncode=1, text=CASES["megatron_validate_args"][1])
    assert failure is not None
    assert failure.reason.startswith("AssertionError: number of layers should be divisible")
    crash = classify(returncode=1, text=CASES["plain_error"][1])
    assert crash is not None and crash.reason == "exit code 1: KeyError: 'q_proj'"
    assert "SIGSEGV" in classify(returncode=-11, text="").reason  # type: ignore[union-attr]
    assert last_exception("ok\nValueError: bad value\n") == "ValueError: bad value"
    assert worker_exit_code(root_cause(4)) == 4


def test_the_workload_summary_wins() -> None:
    """Oracle: the documented record protocol: the workload's own summary record decides the class;
    exit 0 without a failure is no failure."""
    for status in ("oom", "nan", "rejected"):
        failure = classify(returncode=1, text="", reported={"status": status, "reason": "why"})
        assert failure is not None and (failure.status, failure.reason) == (status, "why")
    assert classify(returncode=0, text="", reported={"status": "ok"}) is None
    assert classify(returncode=0, text="all good") is None


def test_watchdog_stops_become_hang_or_timeout_unless_a_cause_shows() -> None:
    """Oracle: the documented classification contract: a trial the watchdog stopped is a hang or a
    timeout naming the limit, unless its log shows the cause (an OOM or an NCCL timeout on one
    rank)."""
    hang = classify(returncode=-15, text="", hung=True, hang_timeout_s=30)
    assert hang is not None and hang.status == "hang" and "30 s" in hang.reason
    late = classify(returncode=-15, text="", timed_out=True, timeout_s=600)
    assert late is not None and late.status == "timeout" and "600 s" in late.reason
    # one rank ran out of memory, its peers waited in a collective until the watchdog came
    oom = classify(returncode=-15, text=CASES["cuda_oom"][1], hung=True)
    assert oom is not None and oom.status == "oom"
    nccl = classify(returncode=-15, text=CASES["nccl_watchdog"][1], hung=True)
    assert nccl is not None and nccl.status == "nccl_timeout"


def test_a_sigkill_we_did_not_send_is_an_oom_kill() -> None:
    """Oracle: Linux's OOM killer ends a process with SIGKILL, seen as -9 by Python and 137 (128 +
    9) by a shell."""
    for code in (-9, 137):
        failure = classify(returncode=code, text="")
        assert failure is not None and failure.status == "oom"
        assert "OOM killer" in failure.reason




def test_a_real_torchrun_failure_is_classified(tmp_path: Path) -> None:
    """Oracle: a real torchrun whose worker really runs out of memory (torch's CPU allocator
    refuses 2**50 bytes): its stderr and exit code, as a runner sees them, give oom with the
    allocator's line as the reason."""
    worker = tmp_path / "worker.py"
    worker.write_text("import torch\ntorch.empty(1 << 50, dtype=torch.uint8)\n")
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           "--nproc_per_node", "1", str(worker)], capture_output=True, text=True,
                          cwd=tmp_path, timeout=300, check=False)
    assert done.returncode == 1 and "ChildFailedError" in done.stderr
    failure = classify(returncode=done.returncode, text=done.stderr)
    assert failure is not None and failure.status == "oom"
    assert failure.reason.startswith("RuntimeError: [enforce fail at alloc_cpu.cpp")
    assert "DefaultCPUAllocator: can't allocate memory" in failure.reason
