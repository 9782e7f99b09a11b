"""What a trial measured (`Measurement`), the outcomes it can have, and the check that a
measurement is one (a core value beside `Layout`: runners, trial programs and the search use it);
`cpu_wait_s`, the time a CPU process waited for a CPU, which every CPU timing leaves out.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from pathlib import Path
from typing import Any


class Status(enum.StrEnum):
    """Every outcome of a trial: ok, the class of its failure, or a trial that never ran.

    Members compare equal to their names as strings, as trial records store them."""

    OK = "ok"
    OOM = "oom"
    NCCL_TIMEOUT = "nccl_timeout"
    HANG = "hang"
    TIMEOUT = "timeout"
    NAN = "nan"
    REJECTED = "rejected"
    """The framework refused the layout before training (its own argument checks)."""
    CRASH = "crash"
    PRUNED = "pruned"
    """Stopped early: its throughput trailed the best beyond the noise."""
    INVALID = "invalid"
    """It ran, but the framework did not run the layout or the figures cannot be physical
    (`autotune.runners.validity`): never a measurement."""
    INFEASIBLE = "infeasible"
    """Never ran: a named rule removes the layout (a queued or resumed trial)."""
    DUPLICATE = "duplicate"
    """Never ran: the layout ran already in this study."""

    @property
    def ran(self) -> bool:
        """True when a runner measured the trial (whatever the outcome)."""
        return self not in (Status.INFEASIBLE, Status.DUPLICATE)

    @property
    def failed(self) -> bool:
        """True for a failure of the trial itself (not ok, pruned, or never run)."""
        return self.ran and self not in (Status.OK, Status.PRUNED)


STATUSES = tuple(s.value for s in Status if s.ran)
"""The outcomes a runner may report: ok, or the class of its failure."""


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


def cpu_wait_s() -> float:
    """Seconds this thread has spent ready to run but waiting for a CPU (other processes held
    them): the second field of Linux's ``/proc/thread-self/schedstat`` (``run_delay``, ns;
    kernel `Documentation/scheduler/sched-stats.rst`); 0.0 where the kernel does not expose it.
    On a shared machine it tells how much of a step was contention, not the layout."""
    try:
        fields = Path("/proc/thread-self/schedstat").read_text().split()
        return int(fields[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0
