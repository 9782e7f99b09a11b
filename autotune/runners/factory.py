"""The runner settings (what the CLI's runner flags say) and the runner they build."""

from __future__ import annotations

from typing import Annotated
from typing import Any

from pydantic import AfterValidator
from pydantic import BaseModel
from pydantic import ConfigDict
from pydantic import Field

from autotune.exceptions import AutotuneError
from autotune.exceptions import shorten
from autotune.runners.base import Runner
from autotune.specs import FiniteFloat
from autotune.specs import Integer
from autotune.specs import Seed
from autotune.specs import at_most

RUNNERS = ("simulate", "command", "local", "slurm")


def figure_label(runner: str | None) -> str:
    """What a runner's figures are: "simulated" for the simulate runner (the analytic model,
    perturbed), else "measured"."""
    return "simulated" if runner == "simulate" else "measured"
"""Runner names, as `--runner` takes them."""


_CONFIG = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
Seconds = Annotated[FiniteFloat, Field(gt=0), at_most(30 * 86400, "30 days")]
"""A duration in seconds."""


def _known_runner(name: str) -> str:
    if name not in RUNNERS:
        raise ValueError(f"{shorten(name, 20)} is not a runner; choose {', '.join(RUNNERS)}")
    return name


class RunnerSettings(BaseModel):
    """The runner that measures trials, and its options (each runner reads its own)."""

    model_config = _CONFIG

    name: Annotated[str, AfterValidator(_known_runner)] = "simulate"
    """simulate, command, local or slurm."""
    timeout_s: Seconds = 3600.0
    """Wall-clock limit of one trial or sweep point (command, local, slurm)."""
    noise: Annotated[
        FiniteFloat, Field(ge=0), at_most(1.0, "a log-normal sigma of 1 already varies 2.7x")
    ] = 0.0
    """simulate: sigma of the log-normal perturbation of the model's constants."""
    seed: Seed = 0
    """simulate: seed of the perturbation."""
    command: str | None = None
    """command: the command template (placeholders {layout_json}, {trial_dir}, ...)."""
    steps: Annotated[
        Integer, Field(ge=1), at_most(100_000, "a trial measures steps, it does not train")
    ] = 6
    """local, slurm: optimizer steps per trial, warm-up included."""
    hang_timeout_s: Seconds = 300.0
    """local: seconds without a new step before a trial counts as hung."""
    launcher: str = "torchrun"
    """local: the launcher of trial processes, torchrun or deepspeed."""
    megatron_lm: str | None = None
    """local: a Megatron-LM checkout whose pretrain_gpt.py runs the trials."""
    partition: str | None = None
    """slurm: partition of the trial jobs."""
    account: str | None = None
    """slurm: account charged for the trial jobs."""
    time_limit: str | None = None
    """slurm: Slurm --time of each trial job (default: the timeout plus 5 minutes)."""
    slurm_opts: tuple[str, ...] = ()
    """slurm: more sbatch options, KEY=VAL or KEY."""

    def build(self, resume: bool = False) -> Runner:
        """The runner (`resume`: a Slurm runner re-attaches to jobs still running)."""
        return make_runner(self, resume=resume)

    def explicit_slurm(self) -> dict[str, object]:
        """The slurm-only settings the user gave."""
        values = {"partition": self.partition, "account": self.account,
                  "time_limit": self.time_limit, "slurm_opt": list(self.slurm_opts)}
        return {k: v for k, v in values.items() if v}

    def recorded(self) -> dict[str, Any]:
        """The settings of this runner worth keeping in run.json."""
        keep = {
            "simulate": ("noise", "seed"),
            "command": ("command", "timeout_s"),
            "local": ("steps", "launcher", "megatron_lm", "timeout_s", "hang_timeout_s"),
            "slurm": ("steps", "partition", "account", "time_limit", "slurm_opts", "timeout_s"),
        }[self.name]
        values = self.model_dump(include=set(keep), mode="json")
        return {k: v for k, v in values.items() if v not in (None, [], ())}


def make_runner(options: RunnerSettings, resume: bool = False) -> Runner:
    """The runner `options.name`, configured from `options` (`resume`: re-attach to live
    Slurm jobs)."""
    name = options.name
    slurm = options.explicit_slurm()
    if slurm and name != "slurm":
        flags = ", ".join("--" + k.replace("_", "-") for k in slurm)
        raise AutotuneError(f"{flags}: only for --runner slurm (got --runner {name})")
    if name in ("local", "slurm") and options.steps < 2:
        raise AutotuneError(f"--steps: {options.steps} leaves no step after warm-up; use >= 2")
    warmup = min(2, options.steps - 1)
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

        return LocalRunner(steps=options.steps, warmup=warmup,
                           timeout_s=options.timeout_s, hang_timeout_s=options.hang_timeout_s,
                           launcher=options.launcher, megatron_lm=options.megatron_lm)
    if name == "slurm":
        from autotune.runners.slurm import SlurmRunner
        from autotune.runners.slurm_client import parse_slurm_opts

        return SlurmRunner(partition=options.partition, account=options.account,
                           time_limit=options.time_limit,
                           options=parse_slurm_opts(options.slurm_opts),
                           timeout_s=options.timeout_s, hang_timeout_s=options.hang_timeout_s,
                           steps=options.steps, warmup=warmup,
                           megatron_lm=options.megatron_lm, reattach=resume)
    raise AutotuneError(f"--runner: {name!r} must be one of {', '.join(RUNNERS)}")
