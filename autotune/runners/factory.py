"""Build a runner by name from one options value (what the CLI's runner flags say)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from autotune.exceptions import AutotuneError
from autotune.runners.base import Runner

RUNNERS = ("simulate", "command", "local", "slurm")
"""Runner names, as `--runner` takes them."""


@dataclasses.dataclass(frozen=True)
class RunnerOptions:
    """Every runner's settings; each runner reads its own."""

    timeout_s: float = 3600.0
    """Per-trial wall-clock limit, seconds (command, local, slurm)."""
    noise: float = 0.0
    """simulate: σ of the perturbation of the truth."""
    seed: int = 0
    """simulate: seed of the perturbation."""
    command: str | None = None
    """command: the command template."""
    steps: int = 6
    """local, slurm: optimizer steps per trial (warm-up included)."""
    hang_timeout_s: float = 300.0
    """local: no new step within this many seconds is a hang."""
    launcher: str = "torchrun"
    """local: torchrun or deepspeed."""
    megatron_lm: str | None = None
    """local: a Megatron-LM checkout; trials then run its pretrain_gpt.py."""
    partition: str | None = None
    """slurm: partition of the trial jobs."""
    account: str | None = None
    """slurm: account charged."""
    time_limit: str | None = None
    """slurm: --time of each job."""
    slurm_opts: Sequence[str] = ()
    """slurm: more sbatch options, KEY=VAL or KEY."""
    resume: bool = False
    """slurm: re-attach to jobs still running."""

    def explicit_slurm(self) -> dict[str, object]:
        """The slurm-only settings the user gave."""
        values = {"partition": self.partition, "account": self.account,
                  "time_limit": self.time_limit, "slurm_opt": list(self.slurm_opts)}
        return {k: v for k, v in values.items() if v}


def make_runner(name: str, options: RunnerOptions) -> Runner:
    """The runner called `name`, configured from `options`."""
    slurm = options.explicit_slurm()
    if slurm and name != "slurm":
        flags = ", ".join("--" + k.replace("_", "-") for k in slurm)
        raise AutotuneError(f"{flags}: only for --runner slurm (got --runner {name})")
    if name == "simulate":
        from autotune.runners.simulate import SimulateRunner

        return SimulateRunner(noise=options.noise, seed=options.seed)
    if name == "command":
        from autotune.runners.command import CommandRunner

        if not options.command:
            raise AutotuneError("--runner command needs --command 'TEMPLATE' (placeholders: "
                                "{layout_json} {ds_config} {megatron_script} {trial_dir} ...)")
        return CommandRunner(options.command, timeout_s=options.timeout_s)
    if name == "local":
        from autotune.runners.local import LocalRunner

        if options.steps < 2:
            raise AutotuneError(f"--steps: {options.steps} leaves no step after warm-up; use >= 2")
        return LocalRunner(steps=options.steps, warmup=min(2, options.steps - 1),
                           timeout_s=options.timeout_s, hang_timeout_s=options.hang_timeout_s,
                           launcher=options.launcher, megatron_lm=options.megatron_lm)
    if name == "slurm":
        from autotune.runners.slurm import SlurmRunner
        from autotune.runners.slurm_client import parse_slurm_opts

        if options.steps < 2:
            raise AutotuneError(f"--steps: {options.steps} leaves no step after warm-up; use >= 2")
        return SlurmRunner(partition=options.partition, account=options.account,
                           time_limit=options.time_limit,
                           options=parse_slurm_opts(options.slurm_opts),
                           timeout_s=options.timeout_s, hang_timeout_s=options.hang_timeout_s,
                           steps=options.steps, warmup=min(2, options.steps - 1),
                           megatron_lm=options.megatron_lm, reattach=options.resume)
    raise AutotuneError(f"--runner: {name!r} must be one of {', '.join(RUNNERS)}")
