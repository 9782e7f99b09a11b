"""Layouts the model cannot tell apart: those within the between-layout error of the fastest
one (`autotune.costmodel.uncertainty.Interval.overlaps`; without it, those whose step-time
interval overlaps the fastest one's) are tied with it, and a tie goes
to the simpler layout (no offload, no FSDP / ZeRO-2/3, fewer interleaved chunks, no context
parallelism, fewer pipeline stages, less tensor parallelism, less recompute)."""

from __future__ import annotations

from collections.abc import Sequence

from autotune.costmodel.estimate import Estimate
from autotune.costmodel.uncertainty import Interval
from autotune.layout import RECOMPUTES
from autotune.layout import Layout


def simplicity(layout: Layout) -> tuple[int, ...]:
    """Sort key, simplest first: offload, sharded gradients or weights (zero >= 2: FSDP),
    interleaved chunks, cp, pp, tp, recompute (each costs tuning, memory or a framework path
    that a user must trust)."""
    return (int(layout.offload != "none"), int(layout.zero >= 2), layout.vpp, layout.cp,
            layout.pp, layout.tp, RECOMPUTES.index(layout.recompute))


def rank_with_ties(estimates: Sequence[Estimate],
                   interval: Interval | None) -> list[tuple[Estimate, bool]]:
    """`estimates` (fastest first) reordered: the layouts tied with the fastest
    (`Interval.overlaps`) first, simplest first, each marked True; then the rest in their
    order. Without an interval (uncalibrated) or with nothing tied, the order stays."""
    if interval is None or not estimates:
        return [(e, False) for e in estimates]
    best = estimates[0].step_time_s
    tied = [e for e in estimates if interval.overlaps(best, e.step_time_s)]
    if len(tied) < 2:
        return [(e, False) for e in estimates]
    rest = [e for e in estimates if not interval.overlaps(best, e.step_time_s)]
    tied.sort(key=lambda e: (simplicity(e.layout), e.step_time_s))
    return [(e, True) for e in tied] + [(e, False) for e in rest]
