"""The runner contract: how one trial executes and what it measures."""

from __future__ import annotations

import abc
import dataclasses
import math
from collections.abc import Callable
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from autotune.layout import Layout
from autotune.specs import AutotuneConfig

STATUSES = ("ok", "oom", "nccl_timeout", "hang", "timeout", "nan", "rejected", "crash", "pruned")
"""Every outcome a trial can have: ok, or the class of its failure."""

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


@dataclasses.dataclass(frozen=True)
class Measurement:
    """What a trial measured. Units are in the names; `status` is one of STATUSES."""

    status: str
    step_time_s: float | None = None
    tokens_per_s: float | None = None
    tflops_per_gpu: float | None = None
    mfu: float | None = None
    peak_memory_bytes: float | None = None
    step_time_spread: float | None = None
    reason: str = ""
    log_tail: str = ""
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True when the trial ran to the end and measured a throughput."""
        return self.status == "ok" and bool(self.tokens_per_s)

    def to_dict(self) -> dict[str, Any]:
        """Plain fields, for JSON and Optuna user attributes."""
        return dataclasses.asdict(self)


_RATES = ("step_time_s", "tokens_per_s")
"""Figures an `ok` trial stands on: each present one must be a positive finite number."""
_OPTIONAL = ("tflops_per_gpu", "mfu", "peak_memory_bytes", "step_time_spread")
"""Figures a trial may add: a value that is not a finite number >= 0 is dropped."""


def _usable(value: Any, positive: bool) -> bool:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return math.isfinite(value) and (value > 0 if positive else value >= 0)


def validated(m: Measurement) -> Measurement:
    """The measurement, or a `crash` naming the figure that cannot be a measurement.

    An unknown status, or an `ok` trial whose step time or throughput is missing, not a number,
    not finite, zero or negative, becomes `crash` with that reason. Optional figures (TFLOP/s,
    MFU, peak memory, spread) that are not finite numbers >= 0 are dropped and listed in
    `extra["dropped"]`.
    """
    if m.status not in STATUSES:
        return Measurement("crash", reason=f"unknown status {m.status!r}", log_tail=m.log_tail)
    fields: dict[str, Any] = {}
    dropped = {k: repr(getattr(m, k)) for k in _OPTIONAL
               if getattr(m, k) is not None and not _usable(getattr(m, k), positive=False)}
    fields.update(dict.fromkeys(dropped))
    if m.status == "ok":
        given = [k for k in _RATES if getattr(m, k) is not None]
        bad = [k for k in given if not _usable(getattr(m, k), positive=True)]
        if not given or bad:
            what = (f"{bad[0]} = {getattr(m, bad[0])!r} is not a positive finite number"
                    if bad else "an ok trial measured neither step_time_s nor tokens_per_s")
            return Measurement("crash", reason=f"invalid measurement: {what}",
                               log_tail=m.log_tail, extra=m.extra)
    else:
        fields.update({k: None for k in _RATES
                       if getattr(m, k) is not None and not _usable(getattr(m, k), True)})
    if dropped:
        fields["extra"] = {**m.extra, "dropped": dropped}
    return dataclasses.replace(m, **fields) if fields else m


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
