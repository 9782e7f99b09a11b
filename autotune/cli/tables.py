"""The CLI's rich tables: ranked layouts, rule removals, trial records, sweeps, and the
estimate command's breakdowns (the commands in `autotune.cli.app` parse, call, then print
these)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from autotune.costmodel.estimate import Estimate
from autotune.costmodel.uncertainty import prediction_interval
from autotune.costmodel.uncertainty import range_note
from autotune.costmodel.uncertainty import with_range
from autotune.runners.factory import figure_label
from autotune.scaling import THRESHOLDS
from autotune.scaling import lost_text
from autotune.search.record import measured_figure
from autotune.specs import AutotuneConfig
from autotune.units import GIB


def gib(value: float) -> str:
    """Bytes as GiB with one decimal."""
    return f"{value / GIB:.1f}"


def layout_table(title: str, rows: list[Estimate], cfg: AutotuneConfig,
                 tied: list[bool] | None = None, caption: str | None = None) -> Table:
    """Ranked predicted layouts, each tokens/s with its range (`tied`: which rows the interval
    cannot tell from the first); the caption says where the ranges come from, then `caption`."""
    band = prediction_interval(cfg)
    note = range_note(cfg, band)
    table = Table(title=title, caption=f"{note}; {caption}" if caption else note)
    columns = ("#", "layout", "dp", "gas", "predicted tokens/s", "TFLOP/s/GPU", "MFU", "mem GiB")
    for column in (*columns, *(("vs #1",) if tied is not None else ())):
        table.add_column(column, justify="left" if column == "layout" else "right")
    for rank, e in enumerate(rows, 1):
        table.add_row(
            str(rank), e.layout.text, str(e.layout.dp), str(e.layout.gas),
            with_range(e.tokens_per_s, band), f"{e.tflops_per_gpu:.0f}", f"{e.mfu:.1%}",
            gib(e.peak_memory_bytes), *(("tied" if tied[rank - 1] else "",) if tied else ()),
        )
    return table


def rules_table(removed: dict[str, int], total: int) -> Table:
    """How many candidates each rule removed, in the order the rules ran."""
    table = Table(title=f"Rules applied to {total:,} candidates (in order)")
    table.add_column("rule")
    table.add_column("removed", justify="right")
    for name, count in removed.items():
        table.add_row(name, f"{count:,}")
    return table


def records_table(title: str, records: list[dict[str, Any]], label: str,
                  cfg: AutotuneConfig) -> Table:
    """Ranked trials: `label` (measured or simulated) against predicted tokens/s, each
    prediction with its range (the caption says where it comes from, or why there is none)."""
    band = prediction_interval(cfg)
    table = Table(title=title, caption=range_note(cfg, band))
    for column in ("#", "trial", "layout", f"{label} tok/s", "predicted tok/s", "error", "MFU",
                   "mem GiB"):
        table.add_column(
            column, justify="left" if column == "layout" else "right", overflow="fold"
        )
    for rank, r in enumerate(records, 1):
        predicted = r.get("predicted", {})
        measured = measured_figure(r, "tokens_per_s") or 0.0
        guess = predicted.get("tokens_per_s") or 0.0
        error = f"{round(guess / measured - 1, 3) + 0.0:+.1%}" if measured and guess else "-"
        mfu = measured_figure(r, "mfu")
        table.add_row(
            str(rank), str(r["number"]), str(r["layout"]), f"{measured:,.0f}",
            with_range(guess, band), error, f"{mfu:.1%}" if mfu else "-",
            gib(predicted.get("peak_memory_bytes") or 0.0),
        )
    return table


def scaling_table(result: Any) -> Table:
    """One row per size of a scaling sweep (a `ScalingResult`)."""
    label = figure_label(result.runner)
    table = Table(title=f"{result.mode} scaling of {result.layout.text} ({label})",
                  caption=THRESHOLDS)
    left = ("status", "flag / reason", "efficiency lost to", "grew most")
    for column in ("GPUs", "nodes", "dp", "gas", "global batch", "status", "tokens/s",
                   "tok/s/GPU", "efficiency", "flag / reason", "efficiency lost to",
                   "grew most"):
        table.add_column(column, justify="left" if column in left else "right")
    for p in result.points:
        grew = f"{p.grew} ({p.grew_loss:.1%} lost)" if p.grew else ""
        table.add_row(
            str(p.gpus), str(p.nodes), str(p.dp or "-"), str(p.gas or "-"),
            f"{p.global_batch_size:,}" if p.global_batch_size else "-", p.status,
            f"{p.tokens_per_s:,.0f}" if p.tokens_per_s else "-",
            f"{p.tokens_per_s_per_gpu:,.0f}" if p.tokens_per_s else "-",
            f"{p.efficiency:.2f}" if p.efficiency is not None else "-",
            p.flag or f"{p.rule} {p.reason}".strip(), lost_text(p.lost), grew,
        )
    return table


def headline(cfg: AutotuneConfig) -> str:
    """The problem in one line (rich markup)."""
    return (
        f"[bold]{cfg.model.name}[/] on [bold]{cfg.cluster.name}[/] "
        f"({cfg.world_size} × {cfg.cluster.gpu.name}), {cfg.train.framework}, "
        f"seq {cfg.train.seq_length}, global batch {cfg.train.global_batch_size}, "
        f"{cfg.train.precision}"
        + (f", calibration {cfg.cluster.gpu.calibration}" if cfg.cluster.gpu.calibration else "")
    )


def memory_table(result: Estimate) -> Table:
    """The estimate command's memory breakdown of one layout (GiB per GPU)."""
    mem = Table(title="Memory per GPU (most loaded rank)")
    mem.add_column("part")
    mem.add_column("GiB", justify="right")
    for name, value in result.memory_parts.items():
        mem.add_row(name, gib(value))
    mem.add_row("[bold]total[/]", f"[bold]{gib(result.peak_memory_bytes)}[/]")
    if result.host_memory_bytes:
        mem.add_row("host (per node, offload)", gib(result.host_memory_bytes))
    return mem


def time_table(result: Estimate) -> Table:
    """The estimate command's step-time breakdown of one layout (seconds and shares)."""
    time = Table(title="Step time")
    time.add_column("part")
    time.add_column("seconds", justify="right")
    time.add_column("share", justify="right")
    for name, value in result.time_parts.items():
        time.add_row(name, f"{value:.4f}", f"{value / result.step_time_s:.1%}")
    time.add_row("[bold]total[/]", f"[bold]{result.step_time_s:.4f}[/]", "100%")
    return time
