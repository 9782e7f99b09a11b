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
    >>> # autotune.search.study.tune(cfg, space, runner, TuneSettings(), Path("study"))
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
import socket
import sys
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from autotune.exceptions import AutotuneError
from autotune.frameworks import framework_of
from autotune.measurement import Measurement
from autotune.runners.base import ProgramOptions
from autotune.runners.base import Runner
from autotune.runners.base import TrialPlan
from autotune.runners.base import check_program
from autotune.runners.base import cpu_allocator_env
from autotune.runners.failures import classify
from autotune.runners.process import ProcessOutcome
from autotune.runners.process import package_root
from autotune.runners.process import run_process
from autotune.specs import AutotuneConfig
from autotune.workloads import workload_spec
from autotune.workloads import write_problem
from autotune.workloads.records import TrialRecords
from autotune.workloads.records import read_tail

LAUNCHERS = ("torchrun", "deepspeed")
"""How the built-in workloads are launched."""


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class LocalSettings(ProgramOptions):
    """What the local runner reads."""

    launcher: str = "torchrun"
    """local: the launcher of trial processes, torchrun or deepspeed."""


class LocalRunner(Runner):
    """Runs each trial for real on this machine and measures it (see the module docstring).

    Args:
        steps: Optimizer steps per trial, warm-up included.
        warmup: Leading steps left out of the measurement.
        timeout_s: Wall-clock limit of one trial (status `timeout`).
        hang_timeout_s: Longest time between two steps (status `hang`).
        startup_timeout_s: Longest time before the first step (imports, op builds, init).
        launcher: `torchrun` or the `deepspeed` launcher (built-in programs only).
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

    @classmethod
    def from_settings(cls, settings: LocalSettings, resume: bool = False) -> LocalRunner:
        """The runner `settings` describe (`resume` changes nothing here)."""
        return cls(steps=settings.steps, warmup=settings.warmup(),
                   timeout_s=settings.timeout_s, hang_timeout_s=settings.hang_timeout_s,
                   launcher=settings.launcher, megatron_lm=settings.megatron_lm)

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
        self.checkout = Path(megatron_lm).resolve() if megatron_lm is not None else None
        """The framework checkout whose rendered launch script trials run, if any."""
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
        check_program(cfg, self.checkout, lambda: not cfg.cluster.cpu_processes,
                      "a cluster of CPU processes")
        if not cfg.cluster.cpu_processes:
            import torch

            found = torch.cuda.device_count()
            if found < cfg.cluster.gpus_per_node:
                raise AutotuneError(
                    f"--runner local: the layouts need {cfg.cluster.gpus_per_node} GPUs per "
                    f"node but this machine has {found}; use --cluster local (--processes N)"
                )

    def command(self, plan: TrialPlan) -> list[str]:
        """The trial's argv (run in plan.directory)."""
        cfg, folder = plan.cfg, plan.directory
        framework = framework_of(cfg)
        if self.checkout is not None:  # the rendered launch script runs the user's checkout
            script = plan.artifacts.get(framework.launch_script, folder / framework.launch_script)
            return ["bash", str(script), *framework.checkout_trial_args(self.steps),
                    *self.extra_args]
        spec = workload_spec(framework.workload)
        nproc = str(cfg.cluster.gpus_per_node)
        if self.launcher == "torchrun":
            launch = [self.python, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1"]
            launch += ["--nproc_per_node", nproc, "-m", spec.module]
        else:
            launch = [self.python, "-m", "deepspeed.launcher.runner", "--num_gpus", nproc]
            launch += ["--master_port", str(free_port()), "--module", spec.module]
        return [*launch, *spec.arguments(folder, steps=self.steps, warmup=self.warmup),
                *self.extra_args]

    def environment(self, plan: TrialPlan) -> dict[str, str]:
        """Variables the trial gets on top of this process's environment."""
        cores = (
            len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        )
        threads = self.threads or max(1, (cores or 1) // plan.cfg.cluster.gpus_per_node)
        extra = {
            "OMP_NUM_THREADS": str(threads),
            "PYTHONUNBUFFERED": "1",
            **cpu_allocator_env(plan.cfg, os.environ),
            "TORCH_EXTENSIONS_DIR": os.environ.get(
                "TORCH_EXTENSIONS_DIR",
                str(Path.home() / ".cache" / "autotune" / "torch_extensions"),
            ),
        }
        root = package_root()
        if root is not None:
            extra["PYTHONPATH"] = os.pathsep.join(
                p for p in (root, os.environ.get("PYTHONPATH", "")) if p
            )
        checkout_env = framework_of(plan.cfg).checkout_env
        if self.checkout is not None and checkout_env is not None:
            extra.update(
                {
                    checkout_env: str(self.checkout),
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
        write_problem(plan.cfg, folder)
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
        framework = framework_of(plan.cfg)
        records = TrialRecords(
            plan.cfg, self.warmup,
            log=framework.log_parser() if self.checkout is not None else None,
            metrics=folder / "metrics.jsonl" if self.checkout is not None else None,
        )

        def on_line(line: str) -> bool:
            progress = records.progress(records.feed(line))
            return progress is not None and plan.report(*progress)

        outcome = run_process(
            argv,
            cwd=folder,
            env={**os.environ, **extra_env},
            timeout_s=self.timeout_s,
            hang_timeout_s=self.hang_timeout_s,
            startup_timeout_s=self.startup_timeout_s,
            is_progress=records.is_step,
            on_line=on_line,
            stdout_path=folder / "stdout.log",
            stderr_path=folder / "stderr.log",
            grace_s=self.grace_s,
            memory_limit_bytes=self.memory_limit_bytes,
        )
        measurement = self.measure(plan, records, outcome)
        with (folder / "metrics.jsonl").open("a") as handle:
            handle.write(json.dumps({"event": "result", **measurement.to_dict()}) + "\n")
        return measurement

    def measure(
        self, plan: TrialPlan, records: TrialRecords, outcome: ProcessOutcome
    ) -> Measurement:
        """The trial's Measurement: its figures when it ran through, else its failure class."""
        extra: dict[str, Any] = {
            "exit_code": outcome.returncode,
            "wall_s": round(outcome.duration_s, 3),
            "steps_done": len(records.steps),
        }
        if outcome.stopped:
            return Measurement(
                "pruned", reason="stopped by the pruner", log_tail=outcome.tail, extra=extra
            )
        text = read_tail(plan.directory / "stderr.log") + "\n" + read_tail(
            plan.directory / "stdout.log")
        reported = records.summary
        failure = classify(
            returncode=outcome.returncode,
            text=text,
            timed_out=outcome.timed_out,
            hung=outcome.hung,
            reported=reported,
            timeout_s=self.timeout_s,
            hang_timeout_s=self.hang_timeout_s if records.steps else self.startup_timeout_s,
        )
        steady = records.steady()
        if self.checkout is not None:  # the framework's own program prints no summary
            finished = outcome.returncode == 0 and bool(steady)
        else:
            finished = reported is not None and reported.get("status") == "ok" and bool(steady)
        if failure is not None and not (finished and not outcome.killed_by_us):
            reason = failure.reason
            said = reported or {}
            if said.get("status") == "nan" and not said.get("reason") and records.steps:
                reason = f"the loss became NaN at step {records.steps[-1].get('step')}"
            return Measurement(
                failure.status,
                reason=reason,
                log_tail=outcome.tail,
                peak_memory_bytes=records.peak_memory_bytes(),
                extra=extra,
            )
        figures = records.figures(plan.layout, extra)
        if figures is None:
            return Measurement(
                "crash",
                reason="the trial ended without a step after warm-up",
                log_tail=outcome.tail,
                extra=extra,
            )
        if failure is not None:
            figures.extra["exit_note"] = f"exited with code {outcome.returncode} after its summary"
        return dataclasses.replace(figures, log_tail=outcome.tail)
