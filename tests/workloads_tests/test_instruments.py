"""Measured parts of a step, and the faults the gate must catch in real DeepSpeed runs.

The real runs are the local runner's (torchrun, gloo, the built-in DeepSpeed workload on
tiny-gpt) through the trial pipeline, so the validity gate reads what DeepSpeed itself reports.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from autotune.exceptions import AutotuneError
from autotune.layout import Layout
from autotune.measurement import Measurement
from autotune.measurement import cpu_wait_s
from autotune.runners.base import TrialPlan
from autotune.runners.local import LocalRunner
from autotune.specs.inputs import load_config
from autotune.trial import TrialPipeline
from autotune.workloads.instruments import FAULTS_ENV
from autotune.workloads.instruments import SLOW_S
from autotune.workloads.instruments import PartClock
from autotune.workloads.instruments import collective_kind
from autotune.workloads.instruments import faults
from autotune.workloads.instruments import time_collectives

CFG = load_config("tiny-gpt", "local", processes=2, framework="deepspeed", seq_length=64,
                  global_batch_size=8)
DP2 = Layout(dp=2, zero=1, mbs=2, gas=2)


class _Comm:
    """A stand-in for ``deepspeed.comm`` whose collective takes a known time."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock

    def all_reduce(self, tensor: object, group: object = None) -> str:
        self.clock[0] += 0.25
        return "reduced"

    def send(self, tensor: object, dst: int) -> None:
        self.clock[0] += 0.5


def test_parts_of_a_step_worked_by_hand(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake wall clock: forward 1.0 s holding a 0.25 s tp all-reduce, backward 2.0 s holding
    a 0.25 s dp all-reduce, a 0.5 s pipeline send, optimizer 0.5 s, data 0.1 s. By hand:
    compute = 1.0 - 0.25 + 2.0 - 0.25 = 2.5, tp 0.25, dp 0.25, pp_p2p 0.5, optimizer 0.5."""
    now = [0.0]
    monkeypatch.setattr("autotune.workloads.instruments.time.perf_counter", lambda: now[0])
    clock = PartClock(lambda: None)
    comm = _Comm(now)
    tp_group = object()
    time_collectives(comm, clock, lambda name, group: "tp" if group is tp_group else (
        "pp" if name == "send" else "dp"))
    assert comm.all_reduce(None) == "reduced" and now[0] == 0.25  # outside a phase: not timed
    now[0] = 0.0

    def spend(phase: str, seconds: float, *calls: tuple[str, object]) -> None:
        with clock.timing(phase):
            for name, group in calls:
                comm.send(None, 1) if name == "send" else comm.all_reduce(None, group=group)
            now[0] += seconds - sum(0.5 if n == "send" else 0.25 for n, _g in calls)

    spend("data", 0.1)
    spend("forward", 1.0, ("all_reduce", tp_group))
    spend("backward", 2.0, ("all_reduce", None))
    spend("pipe", 0.5, ("send", None))
    spend("optimizer", 0.5)
    parts = clock.take()
    assert parts == pytest.approx({"data": 0.1, "compute": 2.5, "tp_comm": 0.25,
                                   "dp_comm": 0.25, "pp_p2p": 0.5, "optimizer": 0.5})
    assert sum(parts.values()) == pytest.approx(now[0])
    assert clock.take() == {}  # reset for the next step


class _Work:
    """A stand-in for an asynchronous collective's handle: its wait takes 0.75 s."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock

    def wait(self) -> bool:
        self.clock[0] += 0.75
        return True

    def is_completed(self) -> bool:
        return False


class _AsyncComm:
    """A stand-in for ``deepspeed.comm`` whose gather launches in 0.25 s (async_op=True);
    like deepspeed.comm, `allgather_fn` calls `all_gather_into_tensor` (both timed)."""

    def __init__(self, clock: list[float]) -> None:
        self.clock = clock

    def allgather_fn(self, output: object, tensor: object, group: object = None,
                     async_op: bool = False) -> _Work | None:
        return self.all_gather_into_tensor(output, tensor, group=group, async_op=async_op)

    def all_gather_into_tensor(self, output: object, tensor: object, group: object = None,
                               async_op: bool = False) -> _Work | None:
        self.clock[0] += 0.25
        return _Work(self.clock) if async_op else None


def test_an_asynchronous_gather_is_charged_its_launch_and_its_wait(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A fake wall clock: a forward of 2.0 s launches a gather (0.25 s) and waits for it
    (0.75 s) later, as ZeRO-3's coordinator does, through a gather that calls another. By
    hand: zero3_gather = 0.25 + 0.75 = 1.0 (each counted once), compute = 2.0 − 1.0; the
    handle's other attributes are the real handle's."""
    now = [0.0]
    monkeypatch.setattr("autotune.workloads.instruments.time.perf_counter", lambda: now[0])
    clock = PartClock(lambda: None)
    comm = _AsyncComm(now)
    time_collectives(comm, clock, lambda name, group: collective_kind(name, None, True))
    with clock.timing("forward"):
        handle = comm.allgather_fn(None, None, async_op=True)
        assert handle is not None and handle.is_completed() is False
        now[0] += 0.5
        assert handle.wait() is True
        now[0] += 0.5
    assert clock.take() == pytest.approx({"compute": 1.0, "zero3_gather": 1.0})


def test_collective_kinds() -> None:
    """By hand: point-to-point is pipeline, a call on a tp, cp or ep group is of that kind
    whatever its ranks, any other group's reductions and gathers are data-parallel (ZeRO-3's
    gathers inside a forward or backward `zero3`)."""
    assert collective_kind("send", "tp") == "pp"
    assert collective_kind("all_reduce", "tp") == "tp"
    assert collective_kind("all_to_all_single", "cp") == "cp"
    assert collective_kind("all_gather_into_tensor", None) == "dp"
    assert collective_kind("allgather_fn", None, True) == "zero3"
    assert collective_kind("reduce_scatter_fn", None, True) == "dp"
    assert collective_kind("allgather_fn", "tp", True) == "tp"


def test_unknown_fault_names_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(FAULTS_ENV, "same_seed,typo")
    with pytest.raises(AutotuneError, match=f"{FAULTS_ENV}: unknown fault 'typo'"):
        faults()
    monkeypatch.setenv(FAULTS_ENV, "same_seed")
    assert faults() == {"same_seed"}


class _OneProcess(LocalRunner):
    """A launcher fault: torchrun starts one process whatever the layout asks (the real
    local runner otherwise)."""

    def command(self, plan: TrialPlan) -> list[str]:
        argv = super().command(plan)
        argv[argv.index("--nproc_per_node") + 1] = "1"
        return argv


def _run(tmp_path: Path, layout: Layout, *names: str, runner: type[LocalRunner] = LocalRunner
         ) -> Measurement:
    env = {FAULTS_ENV: ",".join(names)} if names else {}
    trials = runner(steps=4, warmup=1, timeout_s=600, env=env)
    return TrialPipeline(CFG, trials).run(layout, number=0, directory=tmp_path).measurement


@pytest.mark.slow
@pytest.mark.parametrize("zero", [2, 3])
def test_a_correct_run_passes_and_its_parts_add_up(tmp_path: Path, zero: int) -> None:
    """Oracle: the step time the workload measures around the whole step; the parts are timed
    separately per phase and must cover it to 5 %. DeepSpeed's engine reports the layout;
    under ZeRO-3 its weight gathers (issued asynchronously, waited for in the forward and
    backward) are their own part."""
    m = _run(tmp_path, Layout(dp=2, zero=zero, mbs=2, gas=2))
    assert m.status == "ok", m.reason + m.log_tail[-2000:]
    breakdown = m.extra["breakdown"]
    assert abs(breakdown["unattributed_s"]) <= 0.05 * breakdown["step_time_s"]
    assert {"compute", "dp_comm", "optimizer"} <= set(breakdown["parts"])
    assert ("zero3_gather" in breakdown["parts"]) == (zero == 3)
    assert m.extra["ran"]["zero"] == zero and m.extra["ran"]["world_size"] == 2
    assert not m.extra.get("pitfalls")


@pytest.mark.slow
def test_injected_faults_are_caught_with_their_reason(tmp_path: Path) -> None:
    """One real run with four faults at once: ZeRO configured away, the same data seed on both
    dp ranks, rank 1 sleeping SLOW_S per forward and the loader sleeping SLOW_S per micro-batch
    (2 micro-batches: 0.5 s of data loading per step)."""
    m = _run(tmp_path, DP2, "zero_ignored", "same_seed", "slow_rank", "slow_data")
    assert m.status == "invalid", m.reason + m.log_tail[-2000:]
    assert "zero ran 0, layout asks 1" in m.reason
    assert "data-parallel ranks [0, 1] trained on identical tokens" in m.reason
    slow, stall = m.extra["pitfalls"]
    assert slow.startswith("rank 1 is persistently slower")
    assert stall.startswith("data loading takes") and "num_workers" in stall
    data = statistics.median(m.extra["ranks"][0]["data_s"])
    assert data >= 2 * SLOW_S


@pytest.mark.slow
def test_fewer_processes_than_the_layout_asks_is_invalid(tmp_path: Path) -> None:
    """One process started for a dp=2 layout; the faulty program shrinks dp to fit instead of
    refusing, and DeepSpeed's process group says world size 1."""
    m = _run(tmp_path, DP2, "fit_world", runner=_OneProcess)
    assert m.status == "invalid", m.reason + m.log_tail[-2000:]
    assert "world_size ran 1, layout asks 2; dp ran 1, layout asks 2" in m.reason


@pytest.mark.skipif(not Path("/proc/thread-self/schedstat").exists()
                    or not hasattr(os, "sched_setaffinity"), reason="Linux schedstat only")
def test_cpu_wait_counts_the_time_a_busy_sibling_held_our_cpu() -> None:
    """Oracle: the Linux scheduler. A spinning child pinned to our one CPU takes about half
    of it, so 0.4 s of our own spinning leaves us waiting for the CPU a good part of that."""
    cpu = min(os.sched_getaffinity(0))
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {cpu})
    child = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        time.sleep(0.2)  # the child is running
        waited = cpu_wait_s()
        end = time.monotonic() + 0.4
        while time.monotonic() < end:
            pass
        waited = cpu_wait_s() - waited
    finally:
        child.kill()
        child.wait()
        os.sched_setaffinity(0, before)
    assert 0.08 < waited < 0.4
