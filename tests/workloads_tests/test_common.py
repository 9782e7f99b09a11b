"""What both built-in workloads share (`autotune.workloads.common`): records, failures, exit."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from autotune.layout import Layout
from autotune.workloads import common
from autotune.workloads import deepspeed_gpt
from autotune.workloads import megatron_gpt
from autotune.workloads import records

ROOT = Path(__file__).resolve().parents[2]
SHARED = ("workload_parser", "SEED", "Reporter", "read_layout", "inject_failure", "train_loop",
          "is_oom", "teardown", "exit_now")


@pytest.mark.parametrize("name", SHARED)
def test_both_workloads_use_the_shared_helpers(name: str) -> None:
    """Oracle: the design rule of one implementation: both workload modules hold the very same
    objects as autotune.workloads.common."""
    assert getattr(deepspeed_gpt, name) is getattr(common, name)
    assert getattr(megatron_gpt, name) is getattr(common, name)


def test_summary_counts_the_steps_that_ran() -> None:
    """Oracle: values worked out by hand: steps of 2 and 4 s have a median of 3 s, 100 tokens in 3
    s are 33.3 tokens/s, and a NaN loss is recorded as null."""
    summary = records.summary_record("nan", [2.0, 4.0], 100, 7, float("nan"), world=2, steps=3,
                                    warmup=1, layout=Layout(mbs=1, gas=1))
    assert (summary["status"], summary["steps"], summary["loss"]) == ("nan", 3, None)
    assert summary["median_step_time_s"] == 3.0
    assert summary["tokens_per_s"] == pytest.approx(100 / 3)


def test_refusal_exits_nonzero_on_rank_0_only(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Oracle: the documented record protocol: every rank refuses alike; only rank 0 prints the
    summary and exits with the protocol's exit code for rejected."""
    metrics = tmp_path / "metrics.jsonl"
    assert common.Reporter(1, metrics).fail("rejected", "no", 2) == 0
    assert capsys.readouterr().out == "" and not metrics.exists()
    assert common.Reporter(0, metrics).fail("rejected", "no", 2) == records.EXIT_CODES["rejected"]
    summary = {"event": "summary", "status": "rejected", "reason": "no", "world_size": 2}
    assert json.loads(capsys.readouterr().out) == json.loads(metrics.read_text()) == summary


def test_a_rank_failing_alone_reports_itself(capsys: pytest.CaptureFixture[str]) -> None:
    """Oracle: the documented record protocol: a rank that fails alone prints its own summary with
    its rank, exits with the oom code (4) and keeps the traceback on stderr."""
    try:
        raise MemoryError("can't allocate memory")
    except MemoryError as error:
        code = common.Reporter(3, None).rank_failed("oom", error, 4)
    assert code == records.EXIT_CODES["oom"]
    captured = capsys.readouterr()
    assert json.loads(captured.out) == {"event": "summary", "status": "oom",
                                        "reason": "can't allocate memory", "rank": 3,
                                        "world_size": 4}
    assert "MemoryError" in captured.err


def _raised(make) -> BaseException:  # type: ignore[no-untyped-def]
    try:
        make()
    except BaseException as error:  # noqa: BLE001 - whatever torch or Python really raises
        return error
    raise AssertionError("nothing raised")


def test_is_oom() -> None:
    """Oracle: the errors torch and Python really raise: torch's CPU allocator refusing 2**50
    bytes, MemoryError from a list too large to exist, a shape error; and the CUDA allocator's
    exception type and message (torch.OutOfMemoryError, 'CUDA error: out of memory'), which need
    a GPU to raise for real."""
    assert common.is_oom(_raised(lambda: torch.empty(1 << 50, dtype=torch.uint8)))
    assert common.is_oom(_raised(lambda: [0] * (1 << 62)))
    assert not common.is_oom(_raised(lambda: torch.ones(2, 3) @ torch.ones(2, 3)))
    assert common.is_oom(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert common.is_oom(RuntimeError("CUDA error: out of memory"))


def test_exit_now_flushes_and_exits_with_the_code() -> None:
    """Oracle: a real Python process: its exit status and both streams as the parent receives
    them."""
    code = ("import sys\nfrom autotune.workloads.common import exit_now\n"
            "print('out', end=''); print('err', end='', file=sys.stderr); exit_now(3)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          timeout=120)
    assert (done.returncode, done.stdout, done.stderr) == (3, "out", "err")


def test_inject_failure() -> None:
    """Oracle: torch's real CPU allocator error for the oom injection (2**62 bytes refused), and
    the documented injection step."""
    cpu = torch.device("cpu")
    assert not common.inject_failure(None, common.INJECT_STEP, cpu)
    assert not common.inject_failure("nan", common.INJECT_STEP - 1, cpu)
    assert common.inject_failure("nan", common.INJECT_STEP, cpu)
    assert not common.inject_failure("oom", common.INJECT_STEP + 1, cpu)
    with pytest.raises(RuntimeError, match="DefaultCPUAllocator: can't allocate memory") as raised:
        common.inject_failure("oom", common.INJECT_STEP, cpu)
    assert common.is_oom(raised.value)


def test_train_loop_stops_at_a_nan_loss(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Oracle: values worked out by hand: with one warm-up step, steps of 2 and 3 s give a median
    of 2.5 s; the loop stops at the NaN of step 3. The all-reduce of peak memory is faked (it
    needs a process group)."""
    monkeypatch.setattr(common, "max_over_ranks", lambda value, device: 5)
    plan = SimpleNamespace(layout=Layout(mbs=1, gas=2), steps=6, warmup=1, tokens_per_step=10)
    losses = [9.0, 8.0, 7.0, float("nan"), 6.0]
    summary = common.train_loop(plan, common.Reporter(0, None), torch.device("cpu"),
                                lambda step: (float(step + 1), losses[step]))
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    assert [r["warmup"] for r in records] == [True, False, False, False]
    assert records[3]["loss"] is None and records[1]["tokens_per_s"] == 5.0
    assert (summary["status"], summary["steps"], summary["peak_memory_bytes"]) == ("nan", 4, 5)
    assert summary["median_step_time_s"] == 2.5  # steps 1 and 2; warm-up and the NaN step left out
    assert (summary["world_size"], summary["layout"]) == (1, plan.layout.id)


def test_a_workers_peak_is_its_own_not_its_parents() -> None:
    """Oracle: the Linux kernel. A process started by a larger one (a test runner, a launcher)
    inherits the parent's `ru_maxrss` across exec, so that figure would report the parent's
    size; the peak the workload reports is the child's own resident high-water mark."""
    held = b"\x01" * (1536 * 2**20)  # 1.5 GiB of touched pages in this process
    probe = ("import resource\nfrom autotune.workloads.common import peak_memory_bytes\n"
             "print(peak_memory_bytes(), "
             "resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True, timeout=120)
    own, inherited = (int(x) for x in done.stdout.split())
    parent = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    assert len(held) > 0 and parent > len(held)
    assert inherited >= len(held)  # what ru_maxrss would have reported
    assert own < len(held)  # the child's own peak (interpreter, torch, autotune)
