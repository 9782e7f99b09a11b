"""`autotune plan`: time to train, cost, and the cluster size worth paying for.

Its options come from `autotune.planning.build.PlanConfig` (and the training overrides,
the runner and `--verify-sizes` of `autotune.planning.verify.PlanRun`), like every other
command's; the library does the work and this module prints it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Annotated
from typing import Any

import typer
from rich.table import Table

from autotune.cli.app import JsonOpt
from autotune.cli.app import _failed
from autotune.cli.app import _parsed
from autotune.cli.app import app
from autotune.cli.app import console
from autotune.cli.options import RUNNER
from autotune.cli.options import TRAIN
from autotune.cli.options import Section
from autotune.cli.options import with_options
from autotune.layout import Layout
from autotune.planning.build import PlanConfig
from autotune.planning.plan import CAUSE_LABELS
from autotune.planning.plan import PlanPoint
from autotune.planning.verify import PlanRun

PLAN = Section(("plan",), PlanConfig, {"model": ("--model", "-m"),
                                       "clusters": ("--cluster", "-c")},
               skip=("train",), text=("tokens", "max_gbs_tokens", "deadline", "budget"))
PLAN_TRAIN = dataclasses.replace(TRAIN, path=("plan", "train"))
VERIFY = Section((), PlanRun, skip=("plan", "out", "runner"))
PLAN_OPTIONS = (PLAN, PLAN_TRAIN, VERIFY, RUNNER)
"""The plan's options: its inputs, the training overrides, --verify-sizes and the runner."""


def _money(value: float | None) -> str:
    return f"{value:,.0f}" if value is not None else "-"


def _range(value: float | None, low: float | None, high: float | None, fmt: str) -> str:
    if value is None:
        return "-"
    text = format(value, fmt)
    return text if low is None or high is None else \
        f"{text} ({format(low, fmt)}-{format(high, fmt)})"


def plan_table(points: list[PlanPoint]) -> Table:
    """One row per cluster size; the interval column says 'uncalibrated' without one."""
    table = Table(title="Plan per cluster size (predicted)")
    for column in ("cluster", "GPUs", "layout", "interval", "tokens/s", "days", "GPU-hours",
                   "cost", "eff", "costs the efficiency"):
        table.add_column(column, justify="left" if column in (
            "cluster", "layout", "interval", "costs the efficiency") else "right",
            overflow="fold")
    for p in points:
        if not p.ok:
            table.add_row(p.name, f"{p.gpus:,}", f"[red]infeasible[/]: {p.reason}", "", "-",
                          "-", "-", "-", "-", "")
            continue
        cause = (f"{CAUSE_LABELS[p.cause]} (-{p.cause_loss:.1%})" if p.cause and p.cause_loss
                 else "")
        table.add_row(
            p.name, f"{p.gpus:,}", Layout(**p.layout_fields).text, p.interval,
            _range(p.tokens_per_s, p.tokens_per_s_low, p.tokens_per_s_high, ",.0f"),
            _range(p.days, p.days_low, p.days_high, ",.1f"),
            _range(p.gpu_hours, p.gpu_hours_low, p.gpu_hours_high, ",.0f"),
            _range(p.cost, p.cost_low, p.cost_high, ",.0f"),
            f"{p.efficiency:.2f} {p.mark}".strip() if p.efficiency is not None else "-", cause,
        )
    return table


@app.command()
@with_options(*PLAN_OPTIONS)
def plan(
    out: Annotated[Path | None, typer.Option(help="Output folder (default: autotune-plan).")
                   ] = None,
    as_json: JsonOpt = False,
    *,
    config: dict[str, Any],
) -> None:
    """Plan a training run: per cluster size the best layout, days, GPU-hours, cost and
    scaling efficiency; with --deadline the cheapest cluster that meets it, with --budget the
    fastest within it."""
    from autotune.planning.verify import run_plan

    data = dict(config)
    data["out"] = out if out is not None else data.get("out", "autotune-plan")
    data.setdefault("plan", {})
    run = _parsed(PlanRun, data, PLAN_OPTIONS)
    outcome = run_plan(run)
    result = outcome.plan
    if as_json:
        from autotune.report.data import rounded

        print(json.dumps(rounded(result.to_dict()), indent=2, default=str))
    else:
        console.print(f"[bold]{run.plan.model}[/], {run.plan.tokens:,.0f} tokens; constants: "
                      f"{result.constants}")
        console.print(plan_table(result.points))
        for line in [c.message for c in result.choices]:
            console.print(f"[bold]choice[/]: {line}")
        chosen = result.chosen
        if chosen is not None:
            console.print(f"chosen layout on {chosen.name}: {chosen.layout}")
        for t in result.thresholds:
            if t.name:
                console.print(f"{t.cluster}: efficiency below {t.line:g} from {t.name} "
                              f"({t.efficiency:.2f}; costs most: "
                              f"{CAUSE_LABELS.get(t.cause, 'no single part')})")
        if result.verified:
            v = result.verified
            console.print(f"verified ({v['label']}, {v['runner']} runner) at "
                          + ", ".join(f"{p['gpus']} GPUs: {p['status']}" for p in v["points"])
                          + (f"; measured/predicted {v['ratio_at_largest']:.2f} at "
                             f"{v['largest_gpus']} GPUs" if v.get("ratio_at_largest") else ""))
        console.print(f"plan: {outcome.written['plan.html']} (and plan.md, plan.csv, "
                      "plan.json)")
    if not outcome.ok:
        _failed("no cluster size fits any layout; see the rules named per size in "
                f"{outcome.written['plan.md']}")
