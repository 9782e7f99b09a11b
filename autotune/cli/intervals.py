"""What the CLI prints about a prediction's uncertainty: the interval line, the tie marks of a
ranking, and `estimate --vs`, part by part, why one layout beats another."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from autotune.costmodel.estimate import Estimate
from autotune.costmodel.uncertainty import UNCALIBRATED
from autotune.costmodel.uncertainty import Interval
from autotune.costmodel.uncertainty import prediction_interval
from autotune.costmodel.uncertainty import uncalibrated_text
from autotune.specs import AutotuneConfig
from autotune.units import GIB


def interval_line(cfg: AutotuneConfig, e: Estimate) -> str:
    """'tokens/s 190,000-260,000 (…)' from the interval of the setup, or the uncalibrated mark."""
    band = prediction_interval(cfg)
    if band is None:
        return uncalibrated_text(cfg)
    low, high = band.throughput(e.tokens_per_s)
    mfu_low, mfu_high = band.throughput(e.mfu)
    return (f"interval: tokens/s {low:,.0f}-{high:,.0f} · MFU {mfu_low:.1%}-{mfu_high:.1%} "
            f"({band.text()}: {band.origin()})")


def interval_json(cfg: AutotuneConfig) -> dict[str, Any] | str:
    """The interval as JSON, or the uncalibrated mark."""
    band = prediction_interval(cfg)
    return band.to_dict() if band else UNCALIBRATED


def tie_title(band: Interval | None) -> str:
    """The caption of a ranked table: how ties were decided."""
    if band is None:
        return f"predictions {UNCALIBRATED}: no ties marked"
    if band.between is not None:
        return (f"tied = step time within {band.between - 1:.1%} of #1's (the largest error "
                f"between two runs of one published setup, {band.key}); ties ranked simplest "
                "first")
    return (f"tied = step-time range overlaps #1's ({band.text()}, {band.key}); ties ranked "
            "simplest first")


def vs_table(this: Estimate, other: Estimate) -> Table:
    """Memory and step-time parts of two layouts side by side, with the difference."""
    table = Table(title=f"{this.layout.text} vs {other.layout.text}")
    for column in ("part", "this", "other", "this − other"):
        table.add_column(column, justify="left" if column == "part" else "right")
    for name, value in this.time_parts.items():
        theirs = other.time_parts[name]
        if value or theirs:
            table.add_row(f"{name} (s)", f"{value:.3f}", f"{theirs:.3f}", f"{value - theirs:+.3f}")
    table.add_row("[bold]step time (s)[/]", f"{this.step_time_s:.3f}", f"{other.step_time_s:.3f}",
                  f"{this.step_time_s - other.step_time_s:+.3f}")
    for name, value in this.memory_parts.items():
        theirs = other.memory_parts[name]
        if value or theirs:
            table.add_row(f"{name} (GiB)", f"{value / GIB:.1f}", f"{theirs / GIB:.1f}",
                          f"{(value - theirs) / GIB:+.1f}")
    table.add_row("[bold]peak memory (GiB)[/]", f"{this.peak_memory_bytes / GIB:.1f}",
                  f"{other.peak_memory_bytes / GIB:.1f}",
                  f"{(this.peak_memory_bytes - other.peak_memory_bytes) / GIB:+.1f}")
    return table
