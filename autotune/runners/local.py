"""The local runner: real training steps on this machine, one process per GPU (or CPU worker).

Each trial runs in `DIR/trials/<number>-<layout id>/` next to its rendered configs: a built-in
workload under torchrun or the deepspeed launcher (`autotune.workloads.deepspeed_gpt` from the
rendered ds_config.json; for the megatron framework `autotune.workloads.megatron_gpt`, CUDA
only), or, with `megatron_lm` and the megatron framework, the rendered `pretrain_gpt.sh` of a
Megatron-LM checkout on mock data (metrics from Megatron's own log lines). The folder keeps the
exact command (`command.sh`), `stdout.log`, `stderr.log` and `metrics.jsonl` (one record per
step, then the runner's `result` record).

Example:
    >>> from autotune.runners.local import LocalRunner
    >>> runner = LocalRunner(steps=6, warmup=2, hang_timeout_s=120)
    >>> # autotune.search.tune(cfg, space, runner, TuneOptions(out_dir=Path("study")))
"""

from __future__ import annotations

import json
import math
import os
import shlex
import socket
import statistics
import sys
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autotune.exceptions import AutotuneError
from autotune.flops import model_flops
from autotune.frameworks import framework_of
from autotune.runners.base import Measurement
from autotune.runners.base import Runner
from autotune.runners.base import TrialPlan
from autotune.runners.base import step_time_spread
from autotune.runners.failures import classify
from autotune.runners.megatron_log import MegatronLog
from autotune.runners.process import ProcessOutcome
from autotune.runners.process import run_process
from autotune.specs import AutotuneConfig

LAUNCHERS = ("torchrun", "deepspeed")
"""How the built-in workloads are launched."""
WORKLOAD_MODULE = "autotune.workloads.deepspeed_gpt"
"""The built-in DeepSpeed trial program."""
MEGATRON_MODULE = "autotune.workloads.megatron_gpt"
"""The built-in megatron-core trial program (CUDA only)."""
_LOG_WINDOW = 2 << 20
"""Bytes read from the end of each log to classify a failure."""


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


def parse_record(line: str) -> dict[str, Any] | None:
    """The first JSON object of a line (see `parse_records`), or None."""
    records = parse_records(line)
    return records[0] if records else None


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _read_tail(path: Path, window: int = _LOG_WINDOW) -> str:
    try:
        with path.open("rb") as handle:
            handle.seek(max(0, path.stat().st_size - window))
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


def _package_root() -> str | None:
    """The folder holding the `autotune` package, unless it is an installed site folder."""
    root = Path(__file__).resolve().parents[2]
    return None if root.name in ("site-packages", "dist-packages") else str(root)


def _diverged(step: dict[str, Any]) -> bool:
    """True when a step record carries a loss that is not a finite number (null or NaN)."""
    if "loss" not in step or (step.get("source") == "megatron" and step["loss"] is None):
        return False
    loss = step["loss"]
    return loss is None or not math.isfinite(float(loss))


class _Trial:
    """What one running trial has seen: step records, summaries, Megatron lines."""

    def __init__(self, plan: TrialPlan, warmup: int, metrics: Path, megatron: bool) -> None:
        self.plan, self.warmup, self.metrics, self.megatron = plan, warmup, metrics, megatron
        self.steps: list[dict[str, Any]] = []
        self.summaries: list[dict[str, Any]] = []
        self.log = MegatronLog()

    def steady(self) -> list[dict[str, Any]]:
        """Step records after warm-up."""
        return [s for s in self.steps if not s.get("warmup")]

    def on_line(self, line: str) -> bool:
        """Collect a stdout line; report throughput after warm-up; True asks to stop."""
        step = self._megatron_step(line) if self.megatron else self._workload_record(line)
        if step is None or step.get("warmup") or _diverged(step):
            return False  # a diverged step ends the trial as nan, not as pruned
        rates = [float(s["tokens_per_s"]) for s in self.steady() if s.get("tokens_per_s")]
        return bool(rates) and self.plan.report(len(rates), statistics.median(rates))

    def _workload_record(self, line: str) -> dict[str, Any] | None:
        step = None
        for record in parse_records(line):
            if record.get("event") == "summary":
                self.summaries.append(record)
            elif record.get("event") == "step" and record.get("step_time_s"):
                self.steps.append(record)
                step = record
        return step

    def _megatron_step(self, line: str) -> dict[str, Any] | None:
        it = self.log.feed(line)
        if it is None:
            return None
        train = self.plan.cfg.train
        tokens = (it.global_batch_size or train.global_batch_size) * train.seq_length
        step_s = it.elapsed_ms / 1000.0
        record = {
            "event": "step",
            "step": it.iteration,
            "step_time_s": step_s,
            "tokens": tokens,
            "tokens_per_s": tokens / step_s if step_s > 0 else None,
            "loss": it.losses.get("lm loss"),
            "tflops_per_gpu": it.tflops_per_gpu,
            "warmup": it.iteration <= self.warmup,
            "source": "megatron",
        }
        self.steps.append(record)
        with self.metrics.open("a") as handle:
            handle.write(json.dumps(record) + "\n")
        return record

    def reported(self) -> dict[str, Any] | None:
        """The workload's summary: the first failure one, else the last."""
        failed = [s for s in self.summaries if s.get("status") not in (None, "ok")]
        return failed[0] if failed else (self.summaries[-1] if self.summaries else None)

    def is_progress(self, line: str) -> bool:
        """A step line (the watchdog's notion of progress)."""
        if self.megatron:
            return " iteration " in line and "elapsed time per iteration" in line
        return '"event": "step"' in line or '"event":"step"' in line


class LocalRunner(Runner):
    """Runs each trial for real on this machine and measures it (see the module docstring).

    Args:
        steps: Optimizer steps per trial, warm-up included.
        warmup: Leading steps left out of the measurement.
        timeout_s: Wall-clock limit of one trial (status `timeout`).
        hang_timeout_s: Longest time between two steps (status `hang`).
        startup_timeout_s: Longest time before the first step (imports, op builds, init).
        launcher: `torchrun` or `deepspeed` (the built-in workload only).
        python: Interpreter that runs the launcher and the workload.
        megatron_lm: A Megatron-LM checkout; trials of the megatron framework then run its
            `pretrain_gpt.py` through the rendered `pretrain_gpt.sh`.
        env: Extra environment variables of every trial.
        threads: Threads per process (OMP_NUM_THREADS); default: cores / processes.
        extra_args: Appended to the workload's (or pretrain_gpt.sh's) arguments.
        memory_limit_bytes: Address-space limit of every trial process (RLIMIT_AS); 0: none.
        grace_s: Time between SIGTERM and SIGKILL when a trial is stopped.
    """

    name = "local"
    needs_artifacts = True

    def __init__(
        self,
        *,
        steps: int = 6,
        warmup: int = 2,
        timeout_s: float = 1800.0,
        hang_timeout_s: float = 300.0,
        startup_timeout_s: float = 900.0,
        launcher: str = "torchrun",
        python: str | None = None,
        megatron_lm: str | os.PathLike[str] | None = None,
        env: Mapping[str, str] | None = None,
        threads: int | None = None,
        extra_args: Sequence[str] = (),
        memory_limit_bytes: int = 0,
        grace_s: float = 10.0,
    ) -> None:
        if launcher not in LAUNCHERS:
            raise AutotuneError(f"--launcher: {launcher!r} is not one of {', '.join(LAUNCHERS)}")
        if warmup < 0 or steps <= warmup:
            raise AutotuneError(
                f"--steps/--warmup: need 0 <= warmup < steps (got steps={steps}, warmup={warmup})"
            )
        if megatron_lm is not None and not (Path(megatron_lm) / "pretrain_gpt.py").is_file():
            raise AutotuneError(
                f"--megatron-lm: no pretrain_gpt.py in {megatron_lm}; point it at a Megatron-LM "
                "checkout"
            )
        self.steps, self.warmup = steps, warmup
        self.timeout_s, self.hang_timeout_s = timeout_s, hang_timeout_s
        self.startup_timeout_s = startup_timeout_s
        self.launcher = launcher
        self.python = python or sys.executable
        self.megatron_lm = Path(megatron_lm).resolve() if megatron_lm is not None else None
        self.env = dict(env or {})
        self.threads = threads
        self.extra_args = tuple(extra_args)
        self.memory_limit_bytes = memory_limit_bytes
        self.grace_s = grace_s

    # --- what to run -----------------------------------------------------------------------

    def check(self, cfg: AutotuneConfig) -> None:
        """Raise AutotuneError when this runner cannot run trials of `cfg` here."""
        if cfg.cluster.nodes != 1:
            raise AutotuneError(
                f"--runner local: runs one node, but cluster {cfg.cluster.name!r} has "
                f"{cfg.cluster.nodes}; use --cluster local or the slurm runner"
            )
        if cfg.train.framework == "megatron" and self.megatron_lm is None:
            if cfg.cluster.cpu_processes:
                raise AutotuneError(
                    "--runner local: megatron-core trains on CUDA GPUs only; on CPU pass "
                    "--framework deepspeed (or --megatron-lm PATH on a GPU machine)"
                )
            if self.launcher != "torchrun":
                raise AutotuneError(
                    "--launcher deepspeed: the megatron framework runs under torchrun"
                )
        if not cfg.cluster.cpu_processes:
            import torch

            found = torch.cuda.device_count()
            if found < cfg.cluster.gpus_per_node:
                raise AutotuneError(
                    f"--runner local: the layouts need {cfg.cluster.gpus_per_node} GPUs per "
                    f"node but this machine has {found}; use --cluster local (--processes N)"
                )

    def uses_megatron(self, cfg: AutotuneConfig) -> bool:
        """True when trials run Megatron-LM's pretrain_gpt.py."""
        return cfg.train.framework == "megatron" and self.megatron_lm is not None

    def command(self, plan: TrialPlan) -> list[str]:
        """The trial's argv (run in plan.directory)."""
        cfg, folder = plan.cfg, plan.directory
        if self.uses_megatron(cfg):
            script = plan.artifacts.get("pretrain_gpt.sh", folder / "pretrain_gpt.sh")
            iterations = ["--train-iters", str(self.steps), "--log-interval", "1"]
            return ["bash", str(script), *iterations, *self.extra_args]
        nproc = str(cfg.cluster.gpus_per_node)
        megatron = cfg.train.framework == "megatron"
        module = MEGATRON_MODULE if megatron else WORKLOAD_MODULE
        if self.launcher == "torchrun":
            launch = [self.python, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1"]
            launch += ["--nproc_per_node", nproc, "-m", module]
        else:
            launch = [self.python, "-m", "deepspeed.launcher.runner", "--num_gpus", nproc]
            launch += ["--master_port", str(free_port()), "--module", module]
        flags: dict[str, Any] = {"--model": folder / "model.json"}
        if megatron:  # megatron-core reads the layout and the training setup, no ds_config
            flags["--gbs"] = cfg.train.global_batch_size
            flags["--precision"] = cfg.train.precision
        else:
            flags["--ds-config"] = plan.artifacts.get("ds_config.json", folder / "ds_config.json")
        flags.update(
            {
                "--layout": plan.artifacts.get("layout.json", folder / "layout.json"),
                "--seq": cfg.train.seq_length,
                "--steps": self.steps,
                "--warmup": self.warmup,
                "--metrics": folder / "metrics.jsonl",
            }
        )
        return [*launch, *(str(x) for item in flags.items() for x in item), *self.extra_args]

    def environment(self, plan: TrialPlan) -> dict[str, str]:
        """Variables the trial gets on top of this process's environment."""
        cores = (
            len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        )
        threads = self.threads or max(1, (cores or 1) // plan.cfg.cluster.gpus_per_node)
        extra = {
            "OMP_NUM_THREADS": str(threads),
            "PYTHONUNBUFFERED": "1",
            "TORCH_EXTENSIONS_DIR": os.environ.get(
                "TORCH_EXTENSIONS_DIR",
                str(Path.home() / ".cache" / "autotune" / "torch_extensions"),
            ),
        }
        root = _package_root()
        if root is not None:
            extra["PYTHONPATH"] = os.pathsep.join(
                p for p in (root, os.environ.get("PYTHONPATH", "")) if p
            )
        if self.uses_megatron(plan.cfg):
            extra.update(
                {
                    "MEGATRON_LM": str(self.megatron_lm),
                    "MASTER_PORT": str(free_port()),
                    "GPUS_PER_NODE": str(plan.cfg.cluster.gpus_per_node),
                    "NNODES": "1",
                    "NODE_RANK": "0",
                    "PATH": os.pathsep.join(
                        (str(Path(self.python).parent), os.environ.get("PATH", ""))
                    ),
                }
            )
        return {**extra, **self.env}

    def _write_inputs(self, plan: TrialPlan, argv: list[str], extra_env: dict[str, str]) -> None:
        folder = plan.directory
        folder.mkdir(parents=True, exist_ok=True)
        if not plan.artifacts and not (folder / "layout.json").exists():
            from autotune.render import write_artifacts

            write_artifacts(plan.cfg, plan.layout, folder)
        (folder / "model.json").write_text(
            json.dumps(plan.cfg.model.model_dump(mode="json"), indent=2) + "\n"
        )
        (folder / "metrics.jsonl").write_text("")
        assignments = " ".join(f"{k}={shlex.quote(v)}" for k, v in extra_env.items())
        limit = f"ulimit -v {self.memory_limit_bytes // 1024}\n" if self.memory_limit_bytes else ""
        (folder / "command.sh").write_text(
            f"#!/usr/bin/env bash\n# trial {plan.number}: {plan.layout.text}\n"
            f"cd {shlex.quote(str(folder))}\n{limit}"
            f"{assignments} \\\n  {shlex.join(argv)}\n"
        )

    # --- one trial -------------------------------------------------------------------------

    def run(self, plan: TrialPlan) -> Measurement:
        self.check(plan.cfg)
        argv = self.command(plan)
        extra_env = self.environment(plan)
        self._write_inputs(plan, argv, extra_env)
        folder = plan.directory
        trial = _Trial(plan, self.warmup, folder / "metrics.jsonl", self.uses_megatron(plan.cfg))
        outcome = run_process(
            argv,
            cwd=folder,
            env={**os.environ, **extra_env},
            timeout_s=self.timeout_s,
            hang_timeout_s=self.hang_timeout_s,
            startup_timeout_s=self.startup_timeout_s,
            is_progress=trial.is_progress,
            on_line=trial.on_line,
            stdout_path=folder / "stdout.log",
            stderr_path=folder / "stderr.log",
            grace_s=self.grace_s,
            memory_limit_bytes=self.memory_limit_bytes,
        )
        measurement = self.measure(plan, trial, outcome)
        with (folder / "metrics.jsonl").open("a") as handle:
            handle.write(json.dumps({"event": "result", **measurement.to_dict()}) + "\n")
        return measurement

    def measure(self, plan: TrialPlan, trial: _Trial, outcome: ProcessOutcome) -> Measurement:
        """The trial's Measurement: its figures when it ran through, else its failure class."""
        extra = {
            "exit_code": outcome.returncode,
            "wall_s": round(outcome.duration_s, 3),
            "steps_done": len(trial.steps),
        }
        if outcome.stopped:
            return Measurement(
                "pruned", reason="stopped by the pruner", log_tail=outcome.tail, extra=extra
            )
        text = (
            _read_tail(plan.directory / "stderr.log")
            + "\n"
            + _read_tail(plan.directory / "stdout.log")
        )
        reported = trial.reported()
        failure = classify(
            returncode=outcome.returncode,
            text=text,
            timed_out=outcome.timed_out,
            hung=outcome.hung,
            reported=reported,
            timeout_s=self.timeout_s,
            hang_timeout_s=self.hang_timeout_s if trial.steps else self.startup_timeout_s,
        )
        steady = trial.steady()
        finished = reported is not None and reported.get("status") == "ok" and steady
        if failure is not None and not (finished and not outcome.killed_by_us):
            peak = max((float(s.get("peak_memory_bytes") or 0) for s in trial.steps), default=0)
            reason = failure.reason
            said = reported or {}
            if said.get("status") == "nan" and not said.get("reason") and trial.steps:
                reason = f"the loss became NaN at step {trial.steps[-1].get('step')}"
            return Measurement(
                failure.status,
                reason=reason,
                log_tail=outcome.tail,
                peak_memory_bytes=peak or None,
                extra=extra,
            )
        if not steady:
            return Measurement(
                "crash",
                reason="the trial ended without a step after warm-up",
                log_tail=outcome.tail,
                extra=extra,
            )
        if failure is not None:
            extra["exit_note"] = f"exited with code {outcome.returncode} after its summary"
        return self._figures(plan, trial, outcome, extra)

    def _figures(
        self, plan: TrialPlan, trial: _Trial, outcome: ProcessOutcome, extra: dict[str, Any]
    ) -> Measurement:
        cfg, layout = plan.cfg, plan.layout
        steady = trial.steady()
        times = [float(s["step_time_s"]) for s in steady]
        step_s = statistics.median(times)
        tokens = float(steady[-1].get("tokens") or cfg.train.tokens_per_step)
        batch = tokens / cfg.train.seq_length
        vocab = framework_of(cfg).padded_vocab(cfg.model.vocab_size, layout.tp)
        flops = model_flops(cfg.model, cfg.train.seq_length, batch, vocab)
        tflops = float(flops) / step_s / cfg.world_size / 1e12
        peak_tflops = cfg.cluster.gpu.peak_tflops[cfg.train.precision]
        peaks = [float(s["peak_memory_bytes"]) for s in trial.steps if s.get("peak_memory_bytes")]
        peak: float | None = max(peaks) if peaks else None
        if trial.megatron:
            figures = trial.log.measured(self.warmup)
            peak = figures.get("peak_memory_bytes")
            extra["peak_memory_by_rank"] = {
                str(k): v for k, v in figures.get("peak_memory_by_rank", {}).items()
            }
            if figures.get("tflops_per_gpu") is not None:
                extra["megatron_tflops_per_gpu"] = figures["tflops_per_gpu"]
        loss = steady[-1].get("loss")
        if loss is not None:
            extra["final_loss"] = float(loss)
        extra["steps_measured"] = len(times)
        return Measurement(
            "ok",
            step_time_s=step_s,
            tokens_per_s=tokens / step_s,
            tflops_per_gpu=tflops,
            mfu=tflops / peak_tflops,
            peak_memory_bytes=peak,
            step_time_spread=step_time_spread(times),
            log_tail=outcome.tail,
            extra=extra,
        )
