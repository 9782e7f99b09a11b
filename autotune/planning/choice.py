"""Choices under a constraint: the cheapest cluster that meets a deadline, or the fastest
within a budget; the runner-up, the margin, and whether the choice is a tie.

A choice is a tie when the chosen point's interval and the runner-up's overlap (cost
intervals under a deadline, days intervals under a budget). Without intervals (an uncalibrated
plan) the margin is given but no tie can be judged, and the answer says so.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from autotune.exceptions import AutotuneError
from autotune.planning.plan import PlanPoint


@dataclasses.dataclass(frozen=True)
class Choice:
    """The answer to a deadline or a budget."""

    constraint: str
    """deadline (days) or budget (money)."""
    limit: float
    chosen: str = ""
    """The chosen cluster size ('' when none meets the constraint)."""
    runner_up: str = ""
    margin: float | None = None
    """How much dearer (deadline) or slower (budget) the runner-up is, relative."""
    tie: bool | None = None
    """True when the intervals overlap; None when the figures have no interval."""
    within_interval: bool | None = None
    """True when the chosen point meets the limit across its whole interval."""
    message: str = ""

    def to_dict(self) -> dict[str, Any]:
        """Plain fields, for JSON."""
        return dataclasses.asdict(self)


def _need_prices(points: Sequence[PlanPoint], constraint: str) -> None:
    missing = sorted({p.cluster for p in points if p.ok and p.price_per_gpu_hour is None})
    if missing:
        raise AutotuneError(
            f"--{constraint}: needs a price per GPU-hour for {', '.join(missing)}; give --price "
            "PRICE or NAME=PRICE, or price_per_gpu_hour in the cluster file"
        )


def _overlap(a: tuple[float | None, float | None], b: tuple[float | None, float | None]
             ) -> bool | None:
    if None in a or None in b:
        return None
    return a[0] <= b[1] and b[0] <= a[1]  # type: ignore[operator]


def _days(value: float | None) -> str:
    return f"{value:,.1f} days" if value is not None else "-"


def _money(value: float | None) -> str:
    return f"{value:,.0f}" if value is not None else "-"


def _tie_words(tie: bool | None, what: str) -> str:
    if tie is None:
        return "uncalibrated: no interval to tell whether the margin is real"
    if tie:
        return f"a tie: the {what} intervals overlap"
    return f"the {what} intervals do not overlap"


@dataclasses.dataclass(frozen=True)
class _Rule:
    """How one constraint ranks points: what must fit the limit, what is minimised."""

    constraint: str
    fits: str
    """The PlanPoint field held to the limit (days or cost)."""
    best: str
    """The field minimised among the points that fit (cost or days)."""
    goal: str
    """'cheapest' or 'fastest'."""
    verb: str
    """How the runner-up's margin reads ('costs', 'takes')."""
    miss: str


_DEADLINE = _Rule("deadline", "days", "cost", "cheapest", "costs", "misses the deadline")
_BUDGET = _Rule("budget", "cost", "days", "fastest", "takes", "exceeds the budget")


def _figures(p: PlanPoint, rule: _Rule) -> str:
    first, second = (p.cost, p.days) if rule.best == "cost" else (p.days, p.cost)
    return (f"{_money(first)}, {_days(second)}" if rule.best == "cost"
            else f"{_days(first)}, {_money(second)}")


def _limit(rule: _Rule, limit: float) -> str:
    return f"{limit:g} days" if rule.fits == "days" else _money(limit)


def _choose(points: Sequence[PlanPoint], limit: float, rule: _Rule) -> Choice:
    _need_prices(points, rule.constraint)
    ran = [p for p in points if p.ok]
    fit = sorted((p for p in ran if getattr(p, rule.fits) is not None
                  and getattr(p, rule.fits) <= limit),
                 key=lambda p: (getattr(p, rule.best), getattr(p, rule.fits)))
    within = _limit(rule, limit)
    if not fit:
        nearest = min(ran, key=lambda p: getattr(p, rule.fits) or float("inf"), default=None)
        told = ""
        if nearest is not None:
            value = getattr(nearest, rule.fits)
            shown = _days(value) if rule.fits == "days" else _money(value)
            told = f"; the {'fastest' if rule.fits == 'days' else 'cheapest'} is " \
                   f"{nearest.name} at {shown}"
        return Choice(rule.constraint, limit, message=f"no cluster trains within {within}{told}")
    chosen = fit[0]
    runner = fit[1] if len(fit) > 1 else None
    slow_end = getattr(chosen, f"{rule.fits}_high")
    sure = None if slow_end is None else slow_end <= limit
    message = f"{rule.goal} within {within}: {chosen.name} ({_figures(chosen, rule)})"
    if sure is False:
        shown = _days(slow_end) if rule.fits == "days" else _money(slow_end)
        message += f"; its slow end ({shown}) {rule.miss}"
    if runner is None:
        return Choice(rule.constraint, limit, chosen.name, within_interval=sure,
                      message=message + "; no other size does")
    margin = getattr(runner, rule.best) / getattr(chosen, rule.best) - 1
    tie = _overlap((getattr(chosen, f"{rule.best}_low"), getattr(chosen, f"{rule.best}_high")),
                   (getattr(runner, f"{rule.best}_low"), getattr(runner, f"{rule.best}_high")))
    message += (f"; runner-up {runner.name} ({_figures(runner, rule)}) {rule.verb} "
                f"{margin:+.1%}; {_tie_words(tie, rule.best)}")
    return Choice(rule.constraint, limit, chosen.name, runner.name, margin, tie, sure, message)


def by_deadline(points: Sequence[PlanPoint], days: float) -> Choice:
    """The cheapest size that trains within `days` (fewer days break a cost tie).

    Raises:
        AutotuneError: when a size that fits has no price.
    """
    return _choose(points, days, _DEADLINE)


def by_budget(points: Sequence[PlanPoint], budget: float) -> Choice:
    """The fastest size whose cost fits `budget` (a lower cost breaks a days tie).

    Raises:
        AutotuneError: when a size that fits has no price.
    """
    return _choose(points, budget, _BUDGET)
