"""Megatron-LM's log lines: the parser, and the local runner on a stand-in Megatron-LM checkout
whose pretrain_gpt.py prints lines built with Megatron-LM's own format strings."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers_runners import leftovers
from helpers_runners import tiny_config

from autotune.frameworks.megatron.log import MIB
from autotune.frameworks.megatron.log import MegatronLog
from autotune.frameworks.megatron.log import parse_iteration
from autotune.frameworks.megatron.log import parse_memory
from autotune.layout import Layout
from autotune.runners.local import LocalRunner
from autotune.testing import run_trial

# lines as megatron/training/training.py:training_log and report_memory print them
ITERATION = (
    " [2026-08-22 15:22:22] iteration       10/     100 | consumed samples:         1280 | "
    "elapsed time per iteration (ms): 1234.5 | throughput per GPU (TFLOP/s/GPU): 412.3 | "
    "learning rate: 1.500000E-04 | global batch size:   128 | lm loss: 1.034567E+01 | "
    "loss scale: 1.0 | grad norm: 3.210 | number of skipped iterations:   0 | "
    "number of nan iterations:   0 |"
)
MEMORY = (
    "[Rank 0] (after 10 iterations) memory (MB) | allocated: 12345.67 | max allocated: 23456.78 "
    "| reserved: 25000.00 | max reserved: 25000.00"
)
FORK = (
    " [2026-08-22 15:22:22] iteration        3/      20 | consumed samples:           24 | "
    "elapsed time per iteration (ms): 88.0 | throughput (token/sec/GPU): 2909.1 | "
    "flop throughput (TFLOP/sec/GPU): 0.4 | learning rate: 1.000000E-04 | global batch size:"
    "     8 | lm loss: 9.180000E+00 | mtp_1 loss: 9.300000E+00 | loss scale: 1.0 | "
    "number of skipped iterations:   0 | number of nan iterations:   1 |"
)


def test_iteration_line() -> None:
    """Oracle: lines in the format Megatron-LM's training_log prints
    (megatron/training/training.py), including a fork's variant with token throughput and an MTP
    loss; other lines are not iterations."""
    it = parse_iteration(ITERATION)
    assert it is not None
    assert (it.iteration, it.train_iters, it.consumed_samples) == (10, 100, 1280)
    assert it.elapsed_ms == 1234.5 and it.tflops_per_gpu == 412.3
    assert it.global_batch_size == 128 and it.losses == {"lm loss": pytest.approx(10.34567)}
    assert it.fields["grad_norm"] == 3.21 and it.nan_iterations == 0
    fork = parse_iteration(FORK)
    assert fork is not None and fork.tflops_per_gpu == 0.4 and fork.nan_iterations == 1
    assert set(fork.losses) == {"lm loss", "mtp_1 loss"}
    assert parse_iteration("iteration 3 of the data loader") is None
    assert parse_iteration(MEMORY) is None


def test_memory_line() -> None:
    """Oracle: a line in the format Megatron-LM's report_memory prints, in MB (2**20 bytes)."""
    report = parse_memory(MEMORY)
    assert report is not None and (report.rank, report.iteration) == (0, 10)
    assert report.max_allocated_bytes == pytest.approx(23456.78 * MIB)
    assert report.reserved_bytes == pytest.approx(25000.0 * MIB)
    assert parse_memory(ITERATION) is None


def test_measured_skips_warmup() -> None:
    """Oracle: values worked out by hand: iterations of 100, 200, 300, 400 ms with one warm-up
    iteration give a median of 0.3 s; both ranks' memory lines are kept."""
    lines = [
        ITERATION.replace("      10/", f"{i:8d}/").replace("1234.5", f"{100.0 * i:.1f}")
        for i in (1, 2, 3, 4)
    ]
    log = MegatronLog.parse([*lines, MEMORY, MEMORY.replace("Rank 0", "Rank 1")])
    figures = log.measured(warmup=1)
    assert figures["step_time_s"] == pytest.approx(0.3)  # median of 0.2, 0.3, 0.4
    assert figures["iterations"] == 4 and figures["loss"] == pytest.approx(10.34567)
    assert set(figures["peak_memory_by_rank"]) == {0, 1}


@pytest.mark.slow
def test_local_runner_runs_rendered_pretrain_gpt(tmp_path: Path, fake_megatron_lm: Path) -> None:
    """Oracle: the rendered pretrain_gpt.sh run for real by the local runner on a stand-in
    Megatron-LM checkout (pretrain_gpt.py needs CUDA GPUs; the stand-in prints lines with
    Megatron-LM's own format strings): 103, 104, 105 ms after 2 warm-up iterations give 0.104 s,
    rank 1's 400 MB is the peak, and a NaN raised as Megatron-LM raises it is nan."""
    cfg = tiny_config("megatron")
    layout, folder = Layout(dp=2, mbs=4, gas=1), tmp_path / "trial"
    runner = LocalRunner(steps=5, warmup=2, megatron_lm=fake_megatron_lm, hang_timeout_s=60)

    m = run_trial(runner, cfg, layout, folder).measurement

    assert m.status == "ok", (m.reason, m.log_tail)
    assert m.step_time_s == pytest.approx(0.104)  # median of 103, 104, 105 ms
    assert m.tokens_per_s == pytest.approx(cfg.train.tokens_per_step / 0.104)
    assert m.peak_memory_bytes == pytest.approx(400.0 * MIB)  # rank 1's max allocated
    assert m.extra["framework_tflops_per_gpu"] == 0.5
    command = (folder / "command.sh").read_text()
    assert "pretrain_gpt.sh" in command and f"MEGATRON_LM={fake_megatron_lm}" in command
    steps = [
        json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()
    ]
    assert [s["step"] for s in steps if s["event"] == "step"] == [1, 2, 3, 4, 5]
    assert steps[-1]["event"] == "result" and steps[-1]["status"] == "ok"

    nan = LocalRunner(steps=5, warmup=2, megatron_lm=fake_megatron_lm, env={"FAKE_NAN": "1"})
    failed = run_trial(nan, cfg, layout, tmp_path / "nan").measurement
    assert failed.status == "nan" and "found NaN" in failed.reason
    assert leftovers(tmp_path) == []


def _iteration(number: int, elapsed_ms: float) -> str:
    return (f" [2026-08-22 15:22:{20 + number}] iteration {number:8d}/       3 | consumed samples:"
            f" {number * 128:12d} | elapsed time per iteration (ms): {elapsed_ms:.1f} | "
            "learning rate: 1.500000E-04 | global batch size:   128 | lm loss: 1.034567E+01 | "
            "loss scale: 1.0 | number of skipped iterations:   0 | "
            "number of nan iterations:   0 |")


def _timers(forward_max: float) -> list[str]:
    """A `--timing-log-level 2` block as Timers.log prints it (name padded with dots to 48
    columns, minmax option), through Megatron's logger (a prefix before the header)."""
    values = {"forward-backward": (930.0, 940.0), "forward-compute": (300.0, forward_max),
              "backward-compute": (540.0, 550.0), "batch-generator": (4.0, 5.0),
              "forward-recv": (20.0, 30.0), "backward-send": (10.0, 15.0),
              "all-grads-sync": (35.0, 40.0), "optimizer-inner-step": (20.0, 22.0),
              "optimizer": (40.0, 45.0)}
    lines = ["[2026-08-22 15:22:22] INFO:megatron.core.timers:(min, max) time across ranks (ms):"]
    lines += [f"    {(name + ' ').ljust(48, '.')}: ({lo:.2f}, {hi:.2f})"
              for name, (lo, hi) in values.items()]
    return lines


RECORDED = [_iteration(1, 1900.0), *_timers(900.0), _iteration(2, 1000.0), *_timers(310.0),
            MEMORY, _iteration(3, 1100.0), *_timers(360.0)]
"""Three iterations of a pp=2 run at --timing-log-level 2; the first is warm-up."""


def test_timers_become_the_measured_parts() -> None:
    """By hand (max over ranks, iterations 2 and 3): compute (310 + 550 + 360 + 550) / 2 =
    885 ms, data 5, pipeline 30 + 15 = 45, dp 40, optimizer 45 (its sub-timer not added);
    mean step (1000 + 1100) / 2 = 1050 ms, so 1050 - 1020 = 30 ms unattributed."""
    log = MegatronLog.parse(RECORDED)
    assert [it.iteration for it in log.iterations] == [1, 2, 3] and len(log.memory) == 1
    assert log.timers[2]["forward-compute"] == 310.0
    breakdown = log.measured(warmup=1)["breakdown"]
    assert breakdown["parts"] == pytest.approx(
        {"compute": 0.885, "data": 0.005, "pp_p2p": 0.045, "dp_comm": 0.040, "optimizer": 0.045})
    assert breakdown["step_time_s"] == pytest.approx(1.05)
    assert breakdown["unattributed_s"] == pytest.approx(0.030)


def test_max_only_timers_and_logs_without_timers() -> None:
    lines = [_iteration(2, 500.0), "max time across ranks (ms):",
             f"    {'forward-compute '.ljust(48, '.')}: 200.00", "some other line",
             f"    {'backward-compute '.ljust(48, '.')}: 999.00"]
    log = MegatronLog.parse(lines)
    assert log.timers == {2: {"forward-compute": 200.0}}  # the block ended at the other line
    assert log.breakdown(warmup=1) == {"parts": {"compute": 0.2}, "step_time_s": 0.5,
                                       "unattributed_s": pytest.approx(0.3)}
    assert MegatronLog.parse([ITERATION]).breakdown(warmup=0) is None
