"""Read Megatron-LM's own training log: iteration lines and memory reports.

Formats (Megatron-LM `megatron/training/training.py:training_log` and
`report_memory` in `megatron/training/utils`), printed by the last rank and by data-parallel rank 0
of each stage respectively::

     [2026-08-22 15:22:22.123456] iteration       10/     100 | consumed samples:         1280 |
     elapsed time per iteration (ms): 1234.5 | throughput per GPU (TFLOP/s/GPU): 412.3 |
     learning rate: 1.500000E-04 | global batch size:   128 | lm loss: 1.034567E+01 |
     loss scale: 1.0 | grad norm: 3.210 | number of skipped iterations:   0 |
     number of nan iterations:   0 |
    [Rank 0] (after 10 iterations) memory (MB) | allocated: 12345.67 | max allocated: 23456.78 |
     reserved: 25000.00 | max reserved: 25000.00

(each on one line; some forks print `throughput (token/sec/GPU)` and
`flop throughput (TFLOP/sec/GPU)` instead of `throughput per GPU`). The elapsed time is the
average over the `--log-interval` iterations before the line; memory figures are MiB (2**20
bytes).

With ``--timing-log-level 2`` the last rank follows each iteration line with its timers
(`megatron/core/timers.py:Timers.log`, the ``--timing-log-option`` minmax default; ``max``
prints one value), averaged over the same iterations, in ms::

    (min, max) time across ranks (ms):
        forward-backward ...............................: (1180.21, 1183.90)
        forward-compute ................................: (402.10, 410.55)

`TIMER_PARTS` maps them onto the cost model's step-time parts (`MegatronLog.breakdown`).
"""

from __future__ import annotations

import dataclasses
import re
import statistics
from collections.abc import Iterable
from typing import Any

MIB = 1024 * 1024
"""Megatron's 'MB' (report_memory divides by 1024 * 1024)."""

_ITERATION = re.compile(r"\biteration\s+(\d+)/\s*(\d+)\s*\|")
_MEMORY = re.compile(r"\[Rank (\d+)\] \(after (\d+) iterations\) memory \(MB\)\s*\|(.*)$")
_NUMBER = r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?|nan|inf|-inf"
_FIELD = re.compile(rf"^\s*([^:|]+?):\s*({_NUMBER})\s*$", re.IGNORECASE)
_TIMERS_HEADER = re.compile(r"(?:\(min, max\) |max )?time across ranks \(ms\):\s*$")
_TIMER = re.compile(rf"^\s+(\S+) \.*:\s*(?:\(\s*({_NUMBER}),\s*({_NUMBER})\)|({_NUMBER}))\s*$")
TIMER_PARTS = {
    "forward-compute": "compute",
    "backward-compute": "compute",
    "batch-generator": "data",
    "forward-recv": "pp_p2p",
    "forward-send": "pp_p2p",
    "backward-recv": "pp_p2p",
    "backward-send": "pp_p2p",
    "forward-send-forward-recv": "pp_p2p",
    "forward-send-backward-recv": "pp_p2p",
    "backward-send-forward-recv": "pp_p2p",
    "backward-send-backward-recv": "pp_p2p",
    "forward-backward-send-forward-backward-recv": "pp_p2p",
    "all-grads-sync": "dp_comm",
    "params-all-gather": "dp_comm",
    "layernorm-grads-all-reduce": "tp_comm",
    "embedding-grads-all-reduce": "dp_comm",
    "optimizer": "optimizer",
}
"""Megatron-LM timer → step-time part (`autotune.costmodel.step_time.TIME_PARTS`), from the
max over ranks. Pipeline send/recv include the wait for the neighbour stage (the bubble);
the optimizer's sub-timers (copy-to-main-grad, inner-step, ...) are inside `optimizer`, so
only the total counts; `forward-backward` holds compute and pipeline transfers and is not a
part."""
_KNOWN = {
    "consumed samples": "consumed_samples",
    "skipped samples": "skipped_samples",
    "elapsed time per iteration (ms)": "elapsed_ms",
    "throughput per GPU (TFLOP/s/GPU)": "tflops_per_gpu",
    "flop throughput (TFLOP/sec/GPU)": "tflops_per_gpu",  # some forks print both throughputs
    "throughput (token/sec/GPU)": "tokens_per_s_per_gpu",
    "learning rate": "learning_rate",
    "global batch size": "global_batch_size",
    "loss scale": "loss_scale",
    "grad norm": "grad_norm",
    "num zeros": "num_zeros",
    "params norm": "params_norm",
    "number of skipped iterations": "skipped_iterations",
    "number of nan iterations": "nan_iterations",
    "energy per GPU (J/iter/GPU)": "energy_j",
    "power per GPU (W/GPU)": "power_w",
}


@dataclasses.dataclass(frozen=True)
class Iteration:
    """One `training_log` line."""

    iteration: int
    train_iters: int
    elapsed_ms: float
    """Average wall time of the iterations since the previous line, ms."""
    tflops_per_gpu: float | None = None
    """Megatron's model TFLOP/s per GPU (needs --log-throughput)."""
    global_batch_size: int | None = None
    consumed_samples: int | None = None
    losses: dict[str, float] = dataclasses.field(default_factory=dict)
    """Every loss the line reports, e.g. {'lm loss': 10.3}."""
    nan_iterations: int = 0
    skipped_iterations: int = 0
    fields: dict[str, float] = dataclasses.field(default_factory=dict)
    """All numeric fields under their snake_case names (learning_rate, grad_norm, ...)."""


@dataclasses.dataclass(frozen=True)
class MemoryReport:
    """One `report_memory` line of one rank (bytes)."""

    rank: int
    iteration: int
    allocated_bytes: float
    max_allocated_bytes: float
    reserved_bytes: float
    max_reserved_bytes: float


def _number(text: str) -> float:
    return float(text)


def parse_iteration(line: str) -> Iteration | None:
    """The iteration record of a `training_log` line, or None for any other line."""
    match = _ITERATION.search(line)
    if not match:
        return None
    fields: dict[str, float] = {}
    losses: dict[str, float] = {}
    for part in line[match.end() :].split("|"):
        item = _FIELD.match(part)
        if not item:
            continue
        key, value = item.group(1).strip(), _number(item.group(2))
        if key in _KNOWN:
            fields[_KNOWN[key]] = value
        elif key.endswith("loss"):
            losses[key] = value
    if "elapsed_ms" not in fields:
        return None
    as_int = {k: int(fields[k]) for k in ("global_batch_size", "consumed_samples") if k in fields}
    return Iteration(
        iteration=int(match.group(1)),
        train_iters=int(match.group(2)),
        elapsed_ms=fields["elapsed_ms"],
        tflops_per_gpu=fields.get("tflops_per_gpu"),
        global_batch_size=as_int.get("global_batch_size"),
        consumed_samples=as_int.get("consumed_samples"),
        losses=losses,
        nan_iterations=int(fields.get("nan_iterations", 0)),
        skipped_iterations=int(fields.get("skipped_iterations", 0)),
        fields=fields,
    )


def parse_memory(line: str) -> MemoryReport | None:
    """The memory record of a `report_memory` line, or None for any other line."""
    match = _MEMORY.search(line)
    if not match:
        return None
    values: dict[str, float] = {}
    for part in match.group(3).split("|"):
        item = _FIELD.match(part)
        if item:
            values[item.group(1).strip()] = _number(item.group(2)) * MIB
    needed = ("allocated", "max allocated", "reserved", "max reserved")
    if any(key not in values for key in needed):
        return None
    return MemoryReport(
        int(match.group(1)),
        int(match.group(2)),
        values["allocated"],
        values["max allocated"],
        values["reserved"],
        values["max reserved"],
    )


@dataclasses.dataclass
class MegatronLog:
    """Everything read so far from one run's output (feed it line by line)."""

    iterations: list[Iteration] = dataclasses.field(default_factory=list)
    memory: list[MemoryReport] = dataclasses.field(default_factory=list)
    timers: dict[int, dict[str, float]] = dataclasses.field(default_factory=dict)
    """Iteration → timer name → max over ranks (ms) of the timers printed after its line."""
    _reading: dict[str, float] | None = None

    def feed(self, line: str) -> Iteration | None:
        """Read one line; returns the iteration record when it was an iteration line."""
        if self._reading is not None:
            timer = _TIMER.match(line)
            if timer:
                self._reading[timer.group(1)] = float(timer.group(3) or timer.group(4))
                return None
            self._reading = None
        if _TIMERS_HEADER.search(line) and self.iterations:
            self._reading = self.timers.setdefault(self.iterations[-1].iteration, {})
            return None
        record = parse_iteration(line)
        if record is not None:
            self.iterations.append(record)
            return record
        report = parse_memory(line)
        if report is not None:
            self.memory.append(report)
        return None

    def breakdown(self, warmup: int) -> dict[str, Any] | None:
        """The step-time parts (seconds, `TIMER_PARTS`) averaged over the iteration lines after
        `warmup` that carry timers, beside their mean elapsed time and what no part covers;
        None without timers (``--timing-log-level`` 0)."""
        steady = [it for it in self.iterations if it.iteration > warmup and it.iteration in
                  self.timers]
        if not steady:
            return None
        parts: dict[str, float] = {}
        for it in steady:
            for name, ms in self.timers[it.iteration].items():
                if name in TIMER_PARTS:
                    part = TIMER_PARTS[name]
                    parts[part] = parts.get(part, 0.0) + ms / 1000.0 / len(steady)
        step = sum(it.elapsed_ms for it in steady) / 1000.0 / len(steady)
        return {"parts": parts, "step_time_s": step,
                "unattributed_s": step - sum(parts.values())}

    @staticmethod
    def is_iteration(line: str) -> bool:
        """Whether a line is an iteration line."""
        return parse_iteration(line) is not None

    @classmethod
    def parse(cls, lines: Iterable[str]) -> MegatronLog:
        """Read a whole log."""
        log = cls()
        for line in lines:
            log.feed(line)
        return log

    def peak_memory_by_rank(self) -> dict[int, float]:
        """Largest `max allocated` each reporting rank printed, bytes."""
        peaks: dict[int, float] = {}
        for report in self.memory:
            peaks[report.rank] = max(peaks.get(report.rank, 0.0), report.max_allocated_bytes)
        return peaks

    def measured(self, warmup: int) -> dict[str, Any]:
        """Step time (median of the iterations after `warmup`), spread, TFLOP/s, peak, loss."""
        steady = [it for it in self.iterations if it.iteration > warmup] or self.iterations[-1:]
        if not steady:
            return {}
        times = [it.elapsed_ms / 1000.0 for it in steady]
        median = statistics.median(times)
        tflops = [it.tflops_per_gpu for it in steady if it.tflops_per_gpu is not None]
        peaks = self.peak_memory_by_rank()
        last = steady[-1]
        return {
            "step_time_s": median,
            "step_time_spread": (max(times) - min(times)) / median if median else 0.0,
            "tflops_per_gpu": statistics.median(tflops) if tflops else None,
            "peak_memory_bytes": max(peaks.values()) if peaks else None,
            "peak_memory_by_rank": peaks,
            "global_batch_size": last.global_batch_size,
            "loss": last.losses.get("lm loss", next(iter(last.losses.values()), None)),
            "nan_iterations": max(it.nan_iterations for it in self.iterations),
            "iterations": last.iteration,
            "breakdown": self.breakdown(warmup),
        }
