"""Choices under a deadline or a budget. Oracle: hand-made points whose costs, days and
intervals are written in the test, with the margins worked out by hand."""

from __future__ import annotations

import pytest

from autotune.exceptions import AutotuneError
from autotune.planning.choice import by_budget
from autotune.planning.choice import by_deadline
from autotune.planning.plan import PlanPoint


def _point(name: str, days: float, cost: float, spread: float | None = None,
           price: float | None = 2.0) -> PlanPoint:
    """A point with days and cost, and a relative interval of ±spread on both."""
    low = high = None
    if spread is not None:
        low, high = 1 - spread, 1 + spread
    return PlanPoint(
        cluster=name.split(":")[0], name=name, gpu="h100-sxm-80gb", nodes=1, gpus=8,
        global_batch_size=512, global_batch_tokens=4_194_304, status="ok", tokens_per_s=1e5,
        days=days, cost=cost, price_per_gpu_hour=price,
        days_low=days * low if low else None, days_high=days * high if high else None,
        cost_low=cost * low if low else None, cost_high=cost * high if high else None)


POINTS = [_point("a:8", 40.0, 1.00e6), _point("a:16", 21.0, 1.05e6),
          _point("a:32", 11.0, 1.10e6), _point("b:8", 25.0, 0.90e6)]


def test_deadline_picks_the_cheapest_that_meets_it() -> None:
    choice = by_deadline(POINTS, 30)
    assert (choice.chosen, choice.runner_up) == ("b:8", "a:16")
    assert choice.margin == pytest.approx(1.05e6 / 0.90e6 - 1)  # +16.7 %
    assert choice.tie is None and "uncalibrated" in choice.message


def test_budget_picks_the_fastest_within_it() -> None:
    choice = by_budget(POINTS, 1.06e6)
    assert (choice.chosen, choice.runner_up) == ("a:16", "b:8")
    assert choice.margin == pytest.approx(25 / 21 - 1)


def test_overlapping_intervals_make_a_tie_and_separate_ones_do_not() -> None:
    close = [_point("a:8", 20.0, 1.00e6, 0.1), _point("a:16", 10.0, 1.05e6, 0.1)]
    assert by_deadline(close, 30).tie is True  # 1.00e6·1.1 >= 1.05e6·0.9
    apart = [_point("a:8", 20.0, 1.00e6, 0.01), _point("a:16", 10.0, 1.05e6, 0.01)]
    choice = by_deadline(apart, 30)
    assert choice.tie is False and "do not overlap" in choice.message
    assert choice.within_interval is True


def test_a_choice_whose_slow_end_misses_the_deadline_says_so() -> None:
    choice = by_deadline([_point("a:8", 28.0, 1e6, 0.2)], 30)  # 28 · 1.2 = 33.6 days
    assert choice.chosen == "a:8" and choice.within_interval is False
    assert "misses the deadline" in choice.message and "no other size does" in choice.message


def test_nothing_meets_the_limit_names_the_best_there_is() -> None:
    choice = by_deadline(POINTS, 5)
    assert choice.chosen == "" and "the fastest is a:32 at 11.0 days" in choice.message
    choice = by_budget(POINTS, 1000)
    assert choice.chosen == "" and "the cheapest is b:8 at 900,000" in choice.message


def test_a_limit_without_prices_is_bad_input() -> None:
    with pytest.raises(AutotuneError, match="--budget: needs a price per GPU-hour for c"):
        by_budget([*POINTS, _point("c:8", 1.0, 1.0, price=None)], 1e6)
