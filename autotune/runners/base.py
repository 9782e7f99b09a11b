"""The runner contract: how one trial executes and what it measures."""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated
from typing import Any
from typing import ClassVar

from pydantic import BaseModel
from pydantic import ConfigDict
from pydantic import Field

from autotune.exceptions import AutotuneError
from autotune.frameworks import FRAMEWORKS
from autotune.frameworks import framework_of
from autotune.frameworks import get_framework
from autotune.layout import Layout
from autotune.measurement import Measurement
from autotune.specs import AutotuneConfig
from autotune.specs import FiniteFloat
from autotune.specs import Integer
from autotune.specs import at_most

Reporter = Callable[[int, float], bool]
"""report(step, tokens_per_s) -> True when the trial should stop (pruned)."""
Noter = Callable[[str, Any], None]
"""note(key, value): store a JSON value on the trial at once (an Optuna user attribute)."""


@dataclasses.dataclass(frozen=True)
class TrialPlan:
    """Everything a runner needs for one trial."""

    cfg: AutotuneConfig
    layout: Layout
    number: int
    directory: Path
    artifacts: dict[str, Path] = dataclasses.field(default_factory=dict)
    report: Reporter = lambda step, value: False
    attrs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """The trial's user attributes when it started (a retry carries its predecessor's)."""
    note: Noter = lambda key, value: None
    """Store a value on the trial now, e.g. a job id that a retry of the trial can re-attach to."""

Seconds = Annotated[FiniteFloat, Field(gt=0), at_most(30 * 86400, "30 days")]
"""A duration in seconds."""


class RunnerOptions(BaseModel):
    """The settings one runner reads (declared next to the runner, as torchtitan keeps each
    component's `Config` beside it): `RunnerSettings` composes them, and the CLI, run.json and
    the factory iterate their fields, so a new runner option is one field of its runner's model.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)
    flags: ClassVar[dict[str, str]] = {}
    """Command-line spellings that are not the field name with dashes."""


class TrialOptions(RunnerOptions):
    """Settings of every runner that starts a trial program."""

    timeout_s: Seconds = 3600.0
    """Wall-clock limit of one trial or sweep point (command, local, slurm)."""
    flags: ClassVar[dict[str, str]] = {"timeout_s": "--timeout"}


class ProgramOptions(TrialOptions):
    """Settings of the runners that run the trial program themselves and read its steps."""

    steps: Annotated[
        Integer, Field(ge=1), at_most(100_000, "a trial measures steps, it does not train")
    ] = 6
    """local, slurm: optimizer steps per trial, warm-up included."""
    hang_timeout_s: Seconds = 300.0
    """local: seconds without a new step before a trial counts as hung."""
    megatron_lm: str | None = None
    """local: a Megatron-LM checkout whose pretrain_gpt.py runs the trials."""
    flags: ClassVar[dict[str, str]] = {**TrialOptions.flags, "hang_timeout_s": "--hang-timeout"}

    def warmup(self) -> int:
        """Warm-up steps: 2, or one fewer than the steps.

        Raises:
            AutotuneError: fewer than 2 steps leave none measured.
        """
        if self.steps < 2:
            raise AutotuneError(f"--steps: {self.steps} leaves no step after warm-up; use >= 2")
        return min(2, self.steps - 1)


CPU_ALLOCATOR_ENV = {"MALLOC_ARENA_MAX": "1"}
"""Environment defaults of trials on CPU workers: one glibc malloc arena per process. By
default glibc gives each thread that allocates its own arena (up to 8 per core,
`arena_get2` in glibc's `malloc/arena.c`), and torch's `ProcessGroupGloo` runs every
collective on one of its worker threads (2 per process group), whose temporaries, such as
the flat output of an all-gather (`AsyncAllgatherWork`, world × input), stay resident in that
thread's arena once freed, below its trim threshold, where the training thread's allocations
(from the main arena) do not reuse them. With one arena any thread's next allocation can, as
one caching allocator serves all of a GPU's streams. This changes what a CPU trial measures,
not the model (`benchmarks/cpu_memory.py allocators` prints the peaks both ways;
docs/calibration.md). A value the user's environment sets wins."""


def cpu_allocator_env(cfg: AutotuneConfig, environ: Mapping[str, str]) -> dict[str, str]:
    """CPU_ALLOCATOR_ENV for a trial of `cfg` on CPU workers, less what `environ` sets."""
    if not cfg.cluster.cpu_processes:
        return {}
    return {name: value for name, value in CPU_ALLOCATOR_ENV.items() if name not in environ}


def run_guarded(runner: Runner, plan: TrialPlan) -> Measurement:
    """`runner.run(plan)`; a runner that raises makes a `crash` trial with the error instead."""
    try:
        return runner.run(plan)
    except Exception as error:  # a runner bug must not kill the study or free the layout
        return Measurement(
            "crash", reason=f"the {runner.name} runner raised {type(error).__name__}: {error}"
        )


class Runner(abc.ABC):
    """Runs trials. Lifecycle: `check(cfg)` before the study, `prepare()` once before the first
    trial, `run(plan)` per trial (possibly from several threads with --jobs), `cleanup()` once at
    the end, even after errors.

    `run` never raises for a failed trial: it returns a Measurement whose status names the class
    of failure, so the study goes on. It calls `plan.report` with intermediate throughput and
    stops the trial (killing its processes) when that returns True, returning status `pruned`.
    """

    name: str = "runner"
    needs_artifacts: bool = False
    """True when the runner reads the rendered configs (they are written per trial)."""

    @abc.abstractmethod
    def check(self, cfg: AutotuneConfig) -> None:
        """Raise AutotuneError (naming the option to change) when this runner cannot run trials
        of `cfg`; `tune` and `scale` call it before the first trial."""

    def prepare(self) -> None:  # noqa: B027 - optional hook, no-op by default
        """Set up shared resources (no-op by default)."""

    @abc.abstractmethod
    def run(self, plan: TrialPlan) -> Measurement:
        """Execute one trial and measure it."""

    def cleanup(self) -> None:  # noqa: B027 - optional hook, no-op by default
        """Release shared resources (no-op by default)."""


def check_program(cfg: AutotuneConfig, checkout: object | None, gpus: Callable[[], bool],
                  where: str) -> None:
    """What every runner that starts trial programs checks first: a framework checkout only
    for a framework that runs one, and a framework whose programs need CUDA only where there
    are GPUs (`gpus()` is asked only then; `where` names the place, e.g. "CPU processes").

    Raises:
        AutotuneError: naming the option and the framework to use instead.
    """
    framework = framework_of(cfg)
    if checkout is not None and framework.checkout_env is None:
        with_checkout = ", ".join(f for f in FRAMEWORKS if get_framework(f).checkout_env)
        raise AutotuneError(
            f"--megatron-lm: {framework.name} trials run its built-in program; drop "
            f"--megatron-lm or use --framework {with_checkout}"
        )
    if framework.trains_on_cpu or checkout is not None or gpus():  # a checkout decides itself
        return
    on_cpu = ", ".join(f for f in FRAMEWORKS if get_framework(f).trains_on_cpu)
    raise AutotuneError(f"--framework {framework.name}: its trials train on CUDA GPUs only, and "
                        f"{where} offers none (use --framework {on_cpu})")
