"""The runner settings (what the CLI's runner flags say) and the runner they build.

Each runner declares the settings it reads next to itself (`SimulateSettings` in
`runners/simulate.py`, ...); `RunnerSettings` composes them with the runner's name, and
`make_runner`, `RunnerSettings.recorded` and the CLI's runner options iterate `RUNNER_TYPES`.
A new runner option is one field of its runner's settings model.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated
from typing import Any
from typing import NamedTuple

from pydantic import AfterValidator

from autotune.exceptions import AutotuneError
from autotune.exceptions import shorten
from autotune.runners.base import Runner
from autotune.runners.base import RunnerOptions
from autotune.runners.command import CommandRunner
from autotune.runners.command import CommandSettings
from autotune.runners.local import LocalRunner
from autotune.runners.local import LocalSettings
from autotune.runners.simulate import SimulateRunner
from autotune.runners.simulate import SimulateSettings
from autotune.runners.slurm import SlurmRunner
from autotune.runners.slurm import SlurmSettings


class RunnerType(NamedTuple):
    """A runner's settings model and what builds the runner from them."""

    settings: type[RunnerOptions]
    build: Callable[[Any, bool], Runner]
    """`from_settings(settings, resume)` of the runner's class."""


RUNNER_TYPES = {
    "simulate": RunnerType(SimulateSettings, SimulateRunner.from_settings),
    "command": RunnerType(CommandSettings, CommandRunner.from_settings),
    "local": RunnerType(LocalSettings, LocalRunner.from_settings),
    "slurm": RunnerType(SlurmSettings, SlurmRunner.from_settings),
}
"""Each runner by name, in `--runner` order."""
RUNNERS = tuple(RUNNER_TYPES)
"""Runner names, as `--runner` takes them."""


def figure_label(runner: str | None) -> str:
    """What a runner's figures are: "simulated" for the simulate runner (the analytic model,
    perturbed), else "measured"."""
    return "simulated" if runner == "simulate" else "measured"


def _known_runner(name: str) -> str:
    if name not in RUNNERS:
        raise ValueError(f"{shorten(name, 20)} is not a runner; choose {', '.join(RUNNERS)}")
    return name


class _Named(RunnerOptions):
    name: Annotated[str, AfterValidator(_known_runner)] = "simulate"
    """simulate, command, local or slurm."""


class RunnerSettings(SlurmSettings, LocalSettings, CommandSettings, SimulateSettings, _Named):
    """The runner that measures trials, and its options: every runner's settings model in one
    (each runner reads its own fields)."""

    @classmethod
    def option_flags(cls) -> dict[str, str]:
        """Command-line spellings of the fields that are not the field name with dashes."""
        flags = {"name": "--runner"}
        for kind in RUNNER_TYPES.values():
            flags.update(kind.settings.flags)
        return flags

    def build(self, resume: bool = False) -> Runner:
        """The runner (`resume`: a Slurm runner re-attaches to jobs still running)."""
        return make_runner(self, resume=resume)

    def recorded(self) -> dict[str, Any]:
        """The settings of this runner worth keeping in run.json."""
        keep = RUNNER_TYPES[self.name].settings.model_fields
        values = self.model_dump(include=set(keep), mode="json")
        return {k: v for k, v in values.items() if v not in (None, [], ())}


def make_runner(options: RunnerSettings, resume: bool = False) -> Runner:
    """The runner `options.name`, configured from `options` (`resume`: re-attach to live
    Slurm jobs).

    Raises:
        AutotuneError: a Slurm-only setting for another runner, or a runner's own check.
    """
    name = options.name
    slurm = options.given()
    if slurm and name != "slurm":
        raise AutotuneError(f"{', '.join(slurm)}: only for --runner slurm (got --runner {name})")
    return RUNNER_TYPES[name].build(options, resume)
