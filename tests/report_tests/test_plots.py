"""The study plots read: throughput axes fit the spread, trial axes tick at whole numbers.

Each test reads the limits and ticks off the matplotlib figure the plot function drew (the
figure is caught as it is turned into SVG)."""

from __future__ import annotations

from typing import Any

import pytest
from matplotlib.figure import Figure

from autotune.layout import Layout
from autotune.report import plots
from autotune.report.render import layout_text


@pytest.fixture
def drawn(monkeypatch: pytest.MonkeyPatch) -> list[Figure]:
    """The figures the plot functions draw, in order."""
    figures: list[Figure] = []
    original = plots._svg

    def catch(fig: Figure) -> str:
        figures.append(fig)
        return original(fig)

    monkeypatch.setattr(plots, "_svg", catch)
    return figures


def _axes(fig: Figure) -> Any:
    return fig.axes[0]


def test_a_narrow_spread_is_not_squashed_against_zero(drawn: list[Figure]) -> None:
    """Oracle: the spread of the issue, worked by hand: throughputs from 48k to 59k tokens/s
    (a failure among them) fill at least two thirds of the axis height, where an axis from 0
    to 1.08 × 59k gave them 17 %; trials without a throughput still show, in the strip at the
    bottom; the trial axis ticks at whole numbers only."""
    values = [48_000.0, 52_500.0, 59_000.0, 55_000.0, 50_100.0]
    points = [(i, "ok", v) for i, v in enumerate(values)] + [(5, "oom", None)]
    plots.throughput_over_trials(points, best_number=2)
    ax = _axes(drawn[-1])
    low, high = ax.get_ylim()
    assert low > 0 and (59_000 - 48_000) / (high - low) >= 2 / 3
    assert low < 48_000 and high > 59_000
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks)
    labels = [text.get_text() for text in ax.get_legend().get_texts()]
    assert "oom (no throughput)" in labels


def test_an_axis_starts_at_zero_when_the_data_covers_most_of_it(drawn: list[Figure]) -> None:
    """Oracle: by hand: from 10k to 59k the values span 83 % of 0–59k, so the axis starts at 0
    (within the small margin below it) and the smallest point is not cut off."""
    points = [(0, "ok", 10_000.0), (1, "ok", 59_000.0), (2, "ok", 30_000.0)]
    plots.throughput_over_trials(points, best_number=1)
    low, high = _axes(drawn[-1]).get_ylim()
    assert -0.1 * 59_000 < low <= 0 and high > 59_000


def test_memory_against_throughput_fits_the_spread(drawn: list[Figure]) -> None:
    """Oracle: by hand, as above: 48k to 59k in the memory plot fills most of the axis; the
    OOM trial (no throughput) is drawn in the bottom strip, not at a throughput of 0."""
    gib = 2**30
    points = [(40 * gib, 48_000.0, "ok"), (50 * gib, 59_000.0, "ok"), (90 * gib, 0.0, "oom")]
    plots.memory_vs_throughput(points, usable_bytes=76 * gib)
    ax = _axes(drawn[-1])
    low, high = ax.get_ylim()
    assert low > 0 and (59_000 - 48_000) / (high - low) >= 2 / 3


def test_outcome_counts_tick_at_whole_trials(drawn: list[Figure]) -> None:
    """Oracle: a count of trials is a whole number: with 3 ok and 1 oom matplotlib's default
    locator ticks at 0.5 steps; the plot's ticks are integers."""
    plots.outcomes({"ok": 3, "oom": 1})
    ax = _axes(drawn[-1])
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert len(ticks) >= 2 and all(float(t).is_integer() for t in ticks)


def test_bar_labels_are_the_layout_notation_wrapped() -> None:
    """Oracle: `Layout.parse` (the reader of --layout): a breakdown's bar label, once its line
    breaks are taken out, is the layout's text and reads back as the layout."""
    from autotune.frameworks import get_framework

    layout = Layout(tp=4, pp=4, cp=2, dp=4, vpp=10, zero=1, offload="optimizer", mbs=1, gas=128,
                    recompute="selective", sp=True)
    wrapped = plots.wrap_layout(layout_text(layout.to_dict()))
    assert "\n" in wrapped and max(len(line) for line in wrapped.splitlines()) <= 44
    joined = wrapped.replace("\n", "")
    assert Layout.parse(joined, 128, 512, get_framework("megatron")) == layout
