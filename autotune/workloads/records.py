"""The record protocol between trial programs and runners, and the figures measured from it.

A trial program prints one JSON object per line on rank 0's stdout (and appends it to its
``--metrics`` file):

- ``{"event": "step", "step", "step_time_s", "tokens", "tokens_per_s", "loss",
  "peak_memory_bytes", "warmup"}`` once per optimizer step (`step_record`);
- ``{"event": "summary", "status", "median_step_time_s", "tokens_per_s", "peak_memory_bytes",
  "step_time_spread", "world_size", "steps", ...}`` once at the end (`summary_record`), or
  ``{"event": "summary", "status", "reason", "world_size"}`` for a run that never trained;

and exits with `EXIT_CODES[status]`. A framework's own training program (Megatron-LM's
`pretrain_gpt.py`) prints its own log instead; its `LogParser` turns iteration lines into step
records. Runners feed whatever lines they get (a process's stdout, a growing file) to a
`TrialRecords`, which keeps the steps and summaries, reports progress to the pruner and computes
the `Measurement` (`TrialRecords.figures`) the same way for every runner.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from typing import Protocol

from autotune.costmodel.flops import model_flops
from autotune.frameworks import framework_of
from autotune.layout import Layout
from autotune.measurement import Measurement
from autotune.specs import AutotuneConfig

EXIT_CODES = {"ok": 0, "bad_input": 2, "nan": 3, "oom": 4, "rejected": 5}
"""Process exit code of a trial program per summary status."""
FAILURE_EXIT_CODES = {code: status for status, code in EXIT_CODES.items() if code >= 3}
"""Exit code → failure class (what a runner reads when the summary line is missing)."""
REPORTED = ("ran", "breakdown", "ranks")
"""Summary fields of the built-in workloads a measurement carries: the layout read back from
the framework, the measured parts and per-rank series (`autotune.runners.validity` reads them)."""
TAIL_WINDOW = 2 << 20
"""Bytes read from the end of a log to classify a failure."""


def step_time_spread(times_s: Sequence[float]) -> float:
    """Relative spread of step times: IQR / median from 4 steps on, else (max - min) / median."""
    if len(times_s) < 2:
        return 0.0
    median = statistics.median(times_s)
    if len(times_s) >= 4:
        q1, _, q3 = statistics.quantiles(times_s, n=4, method="inclusive")
        return (q3 - q1) / median
    return (max(times_s) - min(times_s)) / median


def step_record(
    step: int, step_time_s: float, tokens: int, loss: float, peak: int, warmup: bool
) -> dict[str, Any]:
    """The record of one optimizer step."""
    return {
        "event": "step", "step": step, "step_time_s": step_time_s, "tokens": tokens,
        "tokens_per_s": tokens / step_time_s, "loss": loss if math.isfinite(loss) else None,
        "peak_memory_bytes": peak, "warmup": warmup,
    }


def summary_record(
    status: str,
    times_s: list[float],
    tokens_per_step: int,
    peak: int,
    loss: float,
    *,
    world: int,
    steps: int,
    warmup: int,
    layout: Layout,
) -> dict[str, Any]:
    """The final record of a run that trained (status ok or nan).

    ``times_s`` holds the measured (non-warm-up) step times; ``steps`` counts the steps that
    ran, warm-up included (fewer than asked when a NaN loss ended the run).
    """
    median = statistics.median(times_s) if times_s else None
    return {
        "event": "summary", "status": status, "median_step_time_s": median,
        "tokens_per_s": tokens_per_step / median if median else None,
        "peak_memory_bytes": peak, "step_time_spread": step_time_spread(times_s),
        "world_size": world, "steps": steps, "warmup": warmup,
        "loss": loss if math.isfinite(loss) else None, "layout": layout.id,
    }


def parse_records(line: str) -> list[dict[str, Any]]:
    """The JSON objects a line carries: a launcher prefix such as `[default0]:` is skipped, and
    objects that ranks printed at the same moment onto one line are all read."""
    decoder = json.JSONDecoder()
    records: list[dict[str, Any]] = []
    start = line.find("{")
    while start >= 0:
        try:
            value, end = decoder.raw_decode(line, start)
        except json.JSONDecodeError:
            start = line.find("{", start + 1)
            continue
        if isinstance(value, dict):
            records.append(value)
        start = line.find("{", end)
    return records


def read_tail(path: Path, window: int = TAIL_WINDOW) -> str:
    """The last `window` bytes of a file as text ("" when it does not exist)."""
    try:
        with path.open("rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            handle.seek(max(0, size - window))
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


def last_lines(text: str, count: int = 60) -> str:
    """The last `count` lines of a text."""
    return "\n".join(text.splitlines()[-count:])


class LineReader:
    """The complete lines a growing file gained since the last call (partial lines wait)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0
        self._partial = b""

    def lines(self) -> list[str]:
        """New complete lines (none when the file does not exist yet)."""
        try:
            with self.path.open("rb") as handle:
                handle.seek(self._offset)
                data = handle.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        *lines, self._partial = (self._partial + data).split(b"\n")
        return [line.decode(errors="replace") for line in lines]


class LogParser(Protocol):
    """A framework's own log reader (`autotune.frameworks.megatron.log.MegatronLog`)."""

    def feed(self, line: str) -> Any: ...

    def is_iteration(self, line: str) -> bool: ...

    def measured(self, warmup: int) -> dict[str, Any]: ...


def _diverged(step: dict[str, Any]) -> bool:
    """True when a step record carries a loss that is not a finite number (null or NaN)."""
    if "loss" not in step or (step.get("source") == "log" and step["loss"] is None):
        return False
    loss = step["loss"]
    return loss is None or not math.isfinite(float(loss))


class TrialRecords:
    """What one running trial has shown: step records and summaries (see the module docstring).

    Args:
        cfg: The trial's problem (tokens per step for log lines, FLOPs for the figures).
        warmup: Leading steps left out of the measurement and of the pruner's reports.
        log: A framework log parser when the trial runs the framework's own program; its
            iteration lines become step records (appended to `metrics`, if given).
        metrics: Where converted step records are appended.
    """

    def __init__(self, cfg: AutotuneConfig, warmup: int, log: LogParser | None = None,
                 metrics: Path | None = None) -> None:
        self.cfg, self.warmup, self.log, self.metrics = cfg, warmup, log, metrics
        self.steps: list[dict[str, Any]] = []
        self.summaries: list[dict[str, Any]] = []
        self.restart = 0
        """Slurm's restart count of the run being read (a Slurm job script's `job_start`
        record): a requeued job runs its program again, and the records of its earlier runs
        no longer count once the next run starts."""

    def feed(self, line: str) -> dict[str, Any] | None:
        """Take in one line; returns the step record it carried, if any."""
        if self.log is not None:
            return self._log_step(line)
        step = None
        for record in parse_records(line):
            event = record.get("event")
            if event == "summary":
                self.summaries.append(record)
            elif event == "step" and record.get("step_time_s"):
                self.steps.append(record)
                step = record
            elif event == "job_start" and int(record.get("restart") or 0) > self.restart:
                self.restart = int(record["restart"])
                self.steps.clear()
                self.summaries.clear()
        return step

    def is_step(self, line: str) -> bool:
        """Whether a line reports a training step (a watchdog's notion of progress)."""
        if self.log is not None:
            return self.log.is_iteration(line)
        return any(r.get("event") == "step" for r in parse_records(line))

    def _log_step(self, line: str) -> dict[str, Any] | None:
        it = self.log.feed(line)  # type: ignore[union-attr]
        if it is None:
            return None
        train = self.cfg.train
        tokens = (it.global_batch_size or train.global_batch_size) * train.seq_length
        step_s = it.elapsed_ms / 1000.0
        record = {
            "event": "step", "step": it.iteration, "step_time_s": step_s, "tokens": tokens,
            "tokens_per_s": tokens / step_s if step_s > 0 else None,
            "loss": it.losses.get("lm loss"), "tflops_per_gpu": it.tflops_per_gpu,
            "warmup": it.iteration <= self.warmup, "source": "log",
        }
        self.steps.append(record)
        if self.metrics is not None:
            with self.metrics.open("a") as handle:
                handle.write(json.dumps(record) + "\n")
        return record

    def steady(self) -> list[dict[str, Any]]:
        """Step records after warm-up."""
        return [s for s in self.steps if not s.get("warmup")]

    def progress(self, step: dict[str, Any] | None) -> tuple[int, float] | None:
        """(measured steps, median tokens/s so far) to report after `step`, when it was a
        measured step of a run that did not diverge."""
        if step is None or step.get("warmup") or _diverged(step):
            return None  # a diverged step ends the trial as nan, not as pruned
        rates = [float(s["tokens_per_s"]) for s in self.steady() if s.get("tokens_per_s")]
        return (len(rates), statistics.median(rates)) if rates else None

    @property
    def summary(self) -> dict[str, Any] | None:
        """The program's summary: the first failure one, else the last."""
        failed = [s for s in self.summaries if s.get("status") not in (None, "ok")]
        return failed[0] if failed else (self.summaries[-1] if self.summaries else None)

    def peak_memory_bytes(self) -> float | None:
        """The largest peak any step (or the framework's log) reported."""
        if self.log is not None:
            return self.log.measured(self.warmup).get("peak_memory_bytes")
        peaks = [float(s["peak_memory_bytes"]) for s in self.steps if s.get("peak_memory_bytes")]
        return max(peaks) if peaks else None

    def figures(self, layout: Layout, extra: dict[str, Any] | None = None) -> Measurement | None:
        """The measurement of the steady steps: median step time, tokens/s, TFLOP/s per GPU
        (Megatron-Core's model FLOPs over the layout's GPUs), MFU, peak memory and the spread of
        step times; None when no step was measured."""
        cfg = self.cfg
        steady = self.steady()
        if not steady:
            return None
        extra = dict(extra or {})
        said = self.summary or {}
        extra.update({k: said[k] for k in REPORTED if k in said})
        times = [float(s["step_time_s"]) for s in steady]
        step_s = statistics.median(times)
        tokens = float(steady[-1].get("tokens") or cfg.train.tokens_per_step)
        if self.log is not None:
            logged = self.log.measured(self.warmup)
            extra["peak_memory_by_rank"] = {
                str(k): v for k, v in logged.get("peak_memory_by_rank", {}).items()}
            if logged.get("tflops_per_gpu") is not None:
                extra["framework_tflops_per_gpu"] = logged["tflops_per_gpu"]
            if logged.get("breakdown"):
                extra["breakdown"] = logged["breakdown"]
        loss = steady[-1].get("loss")
        if loss is not None:
            extra["final_loss"] = float(loss)
        extra["steps_measured"] = len(times)
        return measured(cfg, layout, step_s, tokens=tokens,
                        peak_memory_bytes=self.peak_memory_bytes(),
                        step_time_spread=step_time_spread(times), extra=extra)


def measured(
    cfg: AutotuneConfig,
    layout: Layout,
    step_time_s: float,
    *,
    tokens: float | None = None,
    peak_memory_bytes: float | None = None,
    step_time_spread: float | None = None,
    extra: dict[str, Any] | None = None,
) -> Measurement:
    """An ok Measurement from a step time: tokens/s, TFLOP/s per GPU (Megatron-Core's model
    FLOPs of `tokens` over the layout's GPUs) and MFU against the GPU's peak."""
    tokens = tokens or cfg.train.tokens_per_step
    vocab = framework_of(cfg).padded_vocab(cfg.model.vocab_size, layout.tp)
    flops = model_flops(cfg.model, cfg.train.seq_length, tokens / cfg.train.seq_length, vocab)
    tflops = float(flops) / step_time_s / layout.world_size / 1e12
    return Measurement(
        "ok", step_time_s=step_time_s, tokens_per_s=tokens / step_time_s, tflops_per_gpu=tflops,
        mfu=tflops / cfg.cluster.gpu.peak_tflops[cfg.train.precision],
        peak_memory_bytes=peak_memory_bytes, step_time_spread=step_time_spread,
        extra=dict(extra or {}),
    )
