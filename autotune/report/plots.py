"""The report's figures as SVG text (matplotlib, Agg): one function per figure.

Every function takes plain values and returns the SVG document without its XML prolog and
metadata, so the same text is written to plots/NAME.svg and inlined into report.html. A fixed
hash salt and no date make the output deterministic.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any
from typing import ParamSpec

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import FuncFormatter  # noqa: E402
from matplotlib.ticker import LogLocator  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402
from matplotlib.ticker import NullLocator  # noqa: E402

from autotune.costmodel.memory import MEMORY_PARTS  # noqa: E402
from autotune.costmodel.step_time import TIME_PARTS  # noqa: E402
from autotune.scaling import BOUND_BELOW  # noqa: E402
from autotune.scaling import FINE_AT  # noqa: E402
from autotune.scaling import PART_LABELS  # noqa: E402
from autotune.units import GIB  # noqa: E402

STYLE: dict[Any, Any] = {
    "svg.hashsalt": "autotune",
    "svg.fonttype": "path",
    "font.size": 10,
    "axes.titlesize": 11,
    "axes.titleweight": "bold",
    "axes.labelsize": 10,
    "axes.grid": True,
    "grid.alpha": 0.3,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "legend.fontsize": 9,
    "legend.frameon": False,
}
PALETTE = ("#4c72b0", "#dd8452", "#55a868", "#c44e52", "#8172b3", "#937860", "#da8bc3",
           "#8c8c8c", "#ccb974", "#64b5cd")
STATUS_COLORS = {"ok": "#4c72b0", "infeasible": "#8c8c8c", "oom": "#c44e52",
                 "duplicate": "#ccb974", "pruned": "#937860"}
MEMORY_LABELS = {"weights": "weights", "gradients": "gradients", "optimizer": "optimizer states",
                 "activations": "activations", "logits": "logits", "buffers": "comm buffers",
                 "runtime": "CUDA/NCCL runtime"}


def _svg(fig: Figure) -> str:
    buffer = io.StringIO()
    fig.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    text = buffer.getvalue()
    text = text[text.index("<svg"):]
    return re.sub(r"\s*<metadata>.*?</metadata>", "", text, flags=re.S)


def _figure(width: float, height: float, ncols: int = 1) -> tuple[Figure, Any]:
    with plt.rc_context(STYLE):
        fig, axes = plt.subplots(1, ncols, figsize=(width, height), layout="constrained")
    return fig, axes


def si(value: float, _: Any = None) -> str:
    """Compact number: 1.2M, 150k, 950."""
    for factor, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g}{suffix}"
    return f"{value:.3g}"


def wrap_layout(label: str, width: int = 44) -> str:
    """A layout's `key=value,...` text broken after commas into lines of at most `width`
    characters (a bar label stays the notation `--layout` reads, only wrapped)."""
    lines = [""]
    for item in label.split(","):
        if lines[-1] and len(lines[-1]) + len(item) + 1 > width:
            lines[-1] += ","
            lines.append(item)
        else:
            lines[-1] += ("," if lines[-1] else "") + item
    return "\n".join(lines)


def _status_color(status: str) -> str:
    return STATUS_COLORS.get(status, "#c44e52")


_Args = ParamSpec("_Args")


def _styled(func: Callable[_Args, str]) -> Callable[_Args, str]:
    def wrapper(*args: _Args.args, **kwargs: _Args.kwargs) -> str:
        with plt.rc_context(STYLE):
            return func(*args, **kwargs)

    wrapper.__doc__ = func.__doc__
    wrapper.__name__ = func.__name__
    return wrapper


# --- breakdowns -------------------------------------------------------------------------------


@_styled
def stacked_bars(
    labels: Sequence[str],
    parts: Sequence[dict[str, float]],
    order: Sequence[str],
    names: dict[str, str],
    *,
    xlabel: str,
    title: str,
    markers: Sequence[float | None] = (),
    marker_label: str = "",
    limit: float | None = None,
    limit_label: str = "",
) -> str:
    """Horizontal stacked bars, first label on top; optional measured markers and a limit line."""
    used = [name for name in order if any(p.get(name, 0.0) > 0 for p in parts)]
    labels = [wrap_layout(label) for label in labels]
    height = 0.3 * max(label.count("\n") + 1 for label in labels) if labels else 0.3
    fig, ax = _figure(10, 1.2 + max(0.55, height + 0.25) * len(labels))
    rows = list(range(len(labels)))[::-1]
    left = [0.0] * len(labels)
    for name in used:
        widths = [p.get(name, 0.0) for p in parts]
        ax.barh(rows, widths, left=left, height=0.62, color=PALETTE[order.index(name) % 10],
                label=names.get(name, name), edgecolor="white", linewidth=0.5)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    if any(m is not None for m in markers):
        xs = [m for m in markers if m is not None]
        ys = [r for r, m in zip(rows, markers, strict=False) if m is not None]
        ax.scatter(xs, ys, marker="D", s=36, color="black", zorder=5, label=marker_label)
    if limit is not None:
        ax.axvline(limit, color="#c44e52", linestyle="--", linewidth=1.2, label=limit_label)
    ax.set_yticks(rows, labels, fontfamily="monospace", fontsize=9)
    ax.set_xlabel(xlabel)
    ax.set_title(title, loc="left")
    ax.grid(axis="y", visible=False)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.5 / (1 + 0.3 * len(labels))),
              ncols=min(5, len(used) + 2))
    return _svg(fig)


def memory_breakdown(
    labels: Sequence[str],
    parts: Sequence[dict[str, float]],
    measured: Sequence[float | None],
    usable_bytes: float,
    label: str = "measured",
) -> str:
    """Predicted memory per GPU by part (GiB), measured (or simulated: `label`) peak markers
    and the usable memory."""
    gib = [{k: v / GIB for k, v in p.items()} for p in parts]
    marks = [m / GIB if m else None for m in measured]
    return stacked_bars(
        labels, gib, MEMORY_PARTS, MEMORY_LABELS, xlabel="memory per GPU (GiB)",
        title="Memory per GPU, predicted by part", markers=marks,
        marker_label=f"{label} peak", limit=usable_bytes / GIB,
        limit_label=f"usable GPU memory ({usable_bytes / GIB:.1f} GiB)",
    )


def time_breakdown(
    labels: Sequence[str], parts: Sequence[dict[str, float]], measured: Sequence[float | None],
    label: str = "measured",
) -> str:
    """Predicted step time by part (s) with the measured (or simulated: `label`) step time."""
    return stacked_bars(
        labels, parts, TIME_PARTS, PART_LABELS, xlabel="step time (s)",
        title="Step time, predicted by part", markers=measured,
        marker_label=f"{label} step time",
    )


# --- the study --------------------------------------------------------------------------------

FROM_ZERO_BELOW = 0.5
"""A throughput axis starts at 0 only when the smallest value is below this share of the
largest (the data then covers most of the axis); else it fits the spread with a margin."""
FLOOR = 0.03
"""Height (share of the axis) of the strip along the bottom where trials without a throughput
are marked, whatever the axis limits."""


def throughput_limits(values: Sequence[float]) -> tuple[float, float]:
    """The y-limits of a throughput axis: from 0 when the values cover most of it, else the
    spread with a margin (a 48k-59k spread is not squashed into the top fifth), with room below
    for the strip of trials without a throughput."""
    if not values:
        return 0.0, 1.0
    low, high = min(values), max(values)
    if low < FROM_ZERO_BELOW * high:
        return -0.06 * high, 1.08 * high
    pad = (high - low) * 0.1 or 0.05 * high
    return low - 2.5 * pad, high + pad


def _no_throughput(ax: Any, xs: Sequence[float], **style: Any) -> None:
    """Trials without a throughput, along the bottom strip (x in data, y in axes units)."""
    ax.scatter(xs, [FLOOR] * len(xs), transform=ax.get_xaxis_transform(), clip_on=False,
               **style)


@_styled
def throughput_over_trials(
    points: Sequence[tuple[int, str, float | None]], best_number: int | None,
    label: str = "measured",
) -> str:
    """(trial number, status, tokens/s as measured or simulated: `label`) in study order;
    failures along the bottom."""
    fig, ax = _figure(10, 4.2)
    ok = [(n, v) for n, s, v in points if s == "ok" and v]
    if ok:
        ax.scatter([n for n, _ in ok], [v for _, v in ok], s=28, color=STATUS_COLORS["ok"],
                   label=label, zorder=3)
        best, xs, ys = float("nan"), [], []
        for n, status, v in sorted(points, key=lambda p: p[0]):
            if status == "ok" and v and not best >= v:
                best = v
            xs.append(n)
            ys.append(best)
        ax.step(xs, ys, where="post", color="#55a868", linewidth=1.5, label="best so far")
    for status in sorted({s for _, s, _ in points} - {"ok"}):
        xs = [n for n, s, _ in points if s == status]
        _no_throughput(ax, xs, marker="x" if status != "duplicate" else "|", s=30,
                       color=_status_color(status), label=f"{status} (no throughput)", zorder=3)
    if best_number is not None:
        value = next(v for n, _, v in points if n == best_number)
        ax.scatter([best_number], [value], s=90, facecolors="none", edgecolors="black",
                   linewidths=1.5, label=f"winner (trial {best_number})", zorder=4)
    ax.yaxis.set_major_formatter(FuncFormatter(si))
    ax.set_ylim(*throughput_limits([v for _, v in ok]))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("trial number")
    ax.set_ylabel("throughput (tokens/s)")
    ax.set_title(f"{label.capitalize()} throughput per trial over the study", loc="left")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=4)
    return _svg(fig)


@_styled
def memory_vs_throughput(
    points: Sequence[tuple[float, float, str]], usable_bytes: float, label: str = "measured"
) -> str:
    """(peak memory bytes, tokens/s, status) per trial, with the feasible memory boundary."""
    fig, ax = _figure(10, 4.6)
    limit = usable_bytes / GIB
    right = max([m / GIB for m, _, _ in points] + [limit]) * 1.08
    ax.axvspan(limit, right, color="#c44e52", alpha=0.07, label="does not fit")
    ax.axvline(limit, color="#c44e52", linestyle="--", linewidth=1.2,
               label=f"usable GPU memory ({limit:.1f} GiB)")
    for status in sorted({s for _, _, s in points}, key=lambda s: (s != "ok", s)):
        chosen = [(m / GIB, v) for m, v, s in points if s == status]
        marker = "o" if status == "ok" else "x"
        name = f"ran ({label})" if status == "ok" else f"{status} (predicted memory)"
        style = {"marker": marker, "s": 30, "color": _status_color(status), "label": name,
                 "zorder": 3}
        if status == "ok":
            ax.scatter([m for m, _ in chosen], [v for _, v in chosen], **style)
        else:
            _no_throughput(ax, [m for m, _ in chosen], **style)
    ax.set_xlim(0, right)
    ax.set_ylim(*throughput_limits([v for _, v, s in points if s == "ok"]))
    ax.yaxis.set_major_formatter(FuncFormatter(si))
    ax.set_xlabel("peak memory per GPU (GiB)")
    ax.set_ylabel("throughput (tokens/s)")
    ax.set_title("Memory vs throughput: every trial against the feasible boundary", loc="left")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.15), ncols=4)
    return _svg(fig)


@_styled
def predicted_vs_measured(
    points: Sequence[tuple[float, float]], median_abs_pct: float, winner: tuple[float, float]
    | None = None, label: str = "measured",
) -> str:
    """(measured or simulated: `label`, predicted) tokens/s per ok trial, the y = x line and a
    ±10 % band."""
    fig, ax = _figure(6.4, 5.4)
    values = [v for p in points for v in p]
    low, high = min(values) * 0.9, max(values) * 1.1
    line = [low, high]
    ax.fill_between(line, [v * 0.9 for v in line], [v * 1.1 for v in line], color="#55a868",
                    alpha=0.12, label="±10%")
    ax.plot(line, line, color="#55a868", linewidth=1.2, label=f"prediction = {label}")
    ax.scatter([m for m, _ in points], [p for _, p in points], s=28, color=PALETTE[0],
               label="trial", zorder=3)
    if winner is not None:
        ax.scatter([winner[0]], [winner[1]], s=90, facecolors="none", edgecolors="black",
                   linewidths=1.5, label="winner", zorder=4)
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.xaxis.set_major_formatter(FuncFormatter(si))
    ax.yaxis.set_major_formatter(FuncFormatter(si))
    ax.set_xlabel(f"{label} throughput (tokens/s)")
    ax.set_ylabel("predicted throughput (tokens/s)")
    ax.set_title(f"Predicted vs {label} (median |error| {median_abs_pct:.1f}%)", loc="left")
    ax.legend(loc="upper left")
    return _svg(fig)


@_styled
def outcomes(counts: dict[str, int]) -> str:
    """Trials by outcome (ok, infeasible, oom, …) as horizontal bars with counts."""
    names = sorted(counts, key=lambda s: (s != "ok", -counts[s], s))
    fig, ax = _figure(7, 0.9 + 0.4 * len(names))
    rows = list(range(len(names)))[::-1]
    ax.barh(rows, [counts[n] for n in names], color=[_status_color(n) for n in names],
            height=0.6)
    for row, name in zip(rows, names, strict=True):
        ax.text(counts[name], row, f" {counts[name]}", va="center", fontsize=9)
    ax.set_yticks(rows, names)
    ax.set_xlim(0, max(counts.values()) * 1.15)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlabel("trials")
    ax.set_title("Trials by outcome", loc="left")
    ax.grid(axis="y", visible=False)
    return _svg(fig)


# --- scaling ----------------------------------------------------------------------------------


def _gpu_axis(ax: Any, sizes: Sequence[int]) -> None:
    ax.set_xscale("log", base=2)
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_xticks(list(sizes), [str(s) for s in sizes])
    ax.set_xlabel("GPUs")


@_styled
def scaling_curves(
    series: Sequence[tuple[str, list[dict[str, Any]]]], title: str = "", label: str = "measured"
) -> str:
    """Throughput per GPU and efficiency against GPUs, one line per (name, ok points) series.

    Each point has gpus, tokens_per_s, efficiency and (optionally) predicted_efficiency; with one
    series the predicted efficiency and the ideal throughput are drawn too.
    """
    fig, (left, right) = _figure(11, 4.4, ncols=2)
    sizes = sorted({p["gpus"] for _, points in series for p in points})
    single = len(series) == 1
    for i, (name, points) in enumerate(series):
        color = PALETTE[i % 10]
        xs = [p["gpus"] for p in points]
        left.plot(xs, [p["tokens_per_s"] for p in points], marker="o", color=color,
                  label=label if single else name)
        right.plot(xs, [p["efficiency"] for p in points], marker="o", color=color,
                   label=label if single else name)
        if single and points:
            base = points[0]
            ideal = [base["tokens_per_s"] / base["gpus"] * x for x in xs]
            left.plot(xs, ideal, linestyle="--", color="#8c8c8c", label="ideal (linear)")
            predicted = [p.get("predicted_efficiency") for p in points]
            if all(v is not None for v in predicted):
                right.plot(xs, predicted, linestyle="--", marker=".", color=PALETTE[1],
                           label="predicted")
    _gpu_axis(left, sizes)
    left.set_yscale("log")
    left.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    left.yaxis.set_minor_locator(NullLocator())
    left.yaxis.set_major_formatter(FuncFormatter(si))
    left.set_ylabel("throughput (tokens/s)")
    left.set_title("Throughput", loc="left")
    _gpu_axis(right, sizes)
    top = max([1.1] + [p["efficiency"] * 1.05 for _, points in series for p in points])
    right.axhspan(FINE_AT, top, color="#55a868", alpha=0.08)
    right.axhspan(BOUND_BELOW, FINE_AT, color="#ccb974", alpha=0.12)
    right.axhspan(0, BOUND_BELOW, color="#c44e52", alpha=0.08)
    for level, text in ((FINE_AT + 0.01, "fine ≥ 0.7"),
                        (BOUND_BELOW + 0.01, "limited (by the cause that grew)"),
                        (0.01, "bound < 0.5")):
        right.text(0.01, level, text, transform=right.get_yaxis_transform(), fontsize=8,
                   color="#555555", va="bottom")
    right.set_ylim(0, top)
    right.set_ylabel("scaling efficiency")
    right.set_title("Efficiency vs the smallest size that ran", loc="left")
    if single:
        for ax in (left, right):
            ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.17), ncols=3)
    else:
        handles, names = left.get_legend_handles_labels()
        fig.legend(handles, names, loc="outside lower center", ncols=min(3, len(names)))
    if title:
        fig.suptitle(title, x=0.01, ha="left", fontweight="bold")
    return _svg(fig)


@_styled
def scaling_breakdown(points: Sequence[dict[str, Any]], base: dict[str, Any]) -> str:
    """Predicted step-time parts per size, normalised to the base (flat bars = perfect scaling).

    A part at N GPUs is shown as seconds × (N / base GPUs) × (base tokens / N tokens): the base's
    step time when scaling is perfect, more when that part scales worse.
    """
    fig, ax = _figure(10, 4.4)
    labels = [str(p["gpus"]) for p in points]
    scaled = []
    for p in points:
        factor = p["gpus"] / base["gpus"] * base["global_batch_size"] / p["global_batch_size"]
        scaled.append({k: v * factor for k, v in p["predicted_time_parts"].items()})
    used = [n for n in TIME_PARTS if any(s.get(n, 0.0) > 0 for s in scaled)]
    bottom = [0.0] * len(points)
    for name in used:
        heights = [s.get(name, 0.0) for s in scaled]
        ax.bar(labels, heights, bottom=bottom, color=PALETTE[TIME_PARTS.index(name) % 10],
               label=PART_LABELS[name], width=0.6, edgecolor="white", linewidth=0.5)
        bottom = [a + b for a, b in zip(bottom, heights, strict=True)]
    ax.axhline(bottom[0], color="black", linestyle=":", linewidth=1, label="base total")
    ax.set_xlabel("GPUs")
    ax.set_ylabel("normalised step time (s)")
    ax.set_title("Predicted step-time parts per size, normalised to the base size", loc="left")
    ax.grid(axis="x", visible=False)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncols=5)
    return _svg(fig)


# --- comparison -------------------------------------------------------------------------------


@_styled
def compare_best(names: Sequence[str], per_gpu: Sequence[float | None],
                 mfu: Sequence[float | None]) -> str:
    """Best throughput per GPU and MFU of several runs, side by side."""
    fig, (left, right) = _figure(11, 1.2 + 0.5 * len(names), ncols=2)
    rows = list(range(len(names)))[::-1]
    for ax, values, label, fmt in ((left, per_gpu, "tokens/s per GPU", si),
                                   (right, [m * 100 if m is not None else None for m in mfu],
                                    "MFU (%)", lambda v: f"{v:.1f}%")):
        shown = [v or 0.0 for v in values]
        ax.barh(rows, shown, color=[PALETTE[i % 10] for i in range(len(names))], height=0.6)
        for row, value in zip(rows, values, strict=True):
            ax.text(value or 0.0, row, f" {fmt(value) if value is not None else 'n/a'}",
                    va="center", fontsize=9)
        ax.set_xlim(0, max(shown + [1e-9]) * 1.2)
        ax.set_xlabel(label)
        ax.grid(axis="y", visible=False)
    left.set_yticks(rows, names, fontsize=9)
    right.set_yticks(rows, [""] * len(names))
    left.set_title("Best throughput per GPU", loc="left")
    right.set_title("Best MFU", loc="left")
    return _svg(fig)


# --- plans ------------------------------------------------------------------------------------

PlanSeries = Sequence[tuple[str, list[dict[str, Any]]]]
"""(cluster type, its plan points that fit, ascending GPUs) per line of a plan plot."""


def _mark_chosen(ax: Any, point: dict[str, Any] | None, key: str) -> None:
    if point is not None and point.get(key) is not None:
        ax.scatter([point["gpus"]], [point[key]], marker="*", s=260, color="#c44e52",
                   edgecolors="black", linewidths=0.8, zorder=6, label=f"chosen: {point['name']}")


def _band(ax: Any, xs: list[int], points: list[dict[str, Any]], key: str, color: str) -> None:
    """The interval of `key` as a shaded band, where every point has one."""
    low = [p.get(f"{key}_low") for p in points]
    high = [p.get(f"{key}_high") for p in points]
    if all(v is not None for v in low + high):
        ax.fill_between(xs, low, high, color=color, alpha=0.15, linewidth=0)


@_styled
def plan_days_cost(series: PlanSeries, chosen: dict[str, Any] | None = None) -> str:
    """Days to train and cost against GPUs, one line per cluster type; intervals shaded when
    known; the chosen point starred. Days on a log axis, cost on a linear axis fitted to the
    spread (a nearly flat cost would be squashed by an axis from 0)."""
    fig, (left, right) = _figure(11, 4.4, ncols=2)
    sizes = sorted({p["gpus"] for _, points in series for p in points})
    costs = []
    for i, (name, points) in enumerate(series):
        color = PALETTE[i % 10]
        xs = [p["gpus"] for p in points]
        left.plot(xs, [p["days"] for p in points], marker="o", color=color, label=name)
        _band(left, xs, points, "days", color)
        if all(p.get("cost") is not None for p in points):
            right.plot(xs, [p["cost"] for p in points], marker="o", color=color, label=name)
            _band(right, xs, points, "cost", color)
            costs += [p["cost"] for p in points]
            costs += [p[k] for p in points for k in ("cost_low", "cost_high") if p.get(k)]
    _mark_chosen(left, chosen, "days")
    _gpu_axis(left, sizes)
    left.set_yscale("log")
    left.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
    left.yaxis.set_minor_locator(NullLocator())
    left.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}" if v >= 1
                                                 else f"{v:.2g}"))
    left.set_ylabel("days to train (predicted)")
    left.set_title("Days to train", loc="left")
    _gpu_axis(right, sizes)
    if costs:
        _mark_chosen(right, chosen, "cost")
        low, high = min(costs), max(costs)
        pad = max(high - low, 0.02 * high) * 0.15
        right.set_ylim(max(0.0, low - pad), high + pad)
        right.yaxis.set_major_formatter(FuncFormatter(si))
        right.set_ylabel("cost (predicted GPU-hours × price)")
    else:
        right.text(0.5, 0.5, "no price given (--price)", transform=right.transAxes,
                   ha="center", va="center", color="#777777")
        right.set_yticks([])
    right.set_title("Cost", loc="left")
    handles, names = left.get_legend_handles_labels()
    extra = [(h, n) for h, n in zip(*right.get_legend_handles_labels(), strict=True)
             if n not in names]
    fig.legend([*handles, *(h for h, _ in extra)], [*names, *(n for _, n in extra)],
               loc="outside lower center", ncols=min(4, len(names) + len(extra)))
    return _svg(fig)


@_styled
def plan_efficiency(series: PlanSeries, chosen: dict[str, Any] | None = None,
                    measured: Sequence[dict[str, Any]] = ()) -> str:
    """Predicted scaling efficiency against GPUs per cluster type with the 0.7 and 0.5 lines;
    with `measured` (points of a verification sweep: gpus, efficiency) the measured curve."""
    fig, ax = _figure(10, 4.4)
    sizes = sorted({p["gpus"] for _, points in series for p in points}
                   | {p["gpus"] for p in measured})
    for i, (name, points) in enumerate(series):
        ax.plot([p["gpus"] for p in points], [p["efficiency"] for p in points], marker="o",
                color=PALETTE[i % 10], label=f"{name} (predicted)")
    if measured:
        ax.plot([p["gpus"] for p in measured], [p["efficiency"] for p in measured],
                marker="D", linestyle="--", color="black",
                label="measured (--verify-sizes, against its smallest)")
    _mark_chosen(ax, chosen, "efficiency")
    values = [p["efficiency"] for _, points in series for p in points]
    values += [p["efficiency"] for p in measured]
    top = max([1.05] + [v * 1.05 for v in values])
    bottom = min([BOUND_BELOW - 0.1] + [v - 0.05 for v in values])
    for level, color in ((FINE_AT, "#ccb974"), (BOUND_BELOW, "#c44e52")):
        ax.axhline(level, color=color, linestyle="--", linewidth=1.2)
        ax.text(0.01, level + 0.01, f"{level:g}", transform=ax.get_yaxis_transform(),
                fontsize=8, color="#555555", va="bottom")
    _gpu_axis(ax, sizes)
    ax.set_ylim(max(0.0, bottom), top)
    ax.set_ylabel("scaling efficiency")
    ax.set_title("Efficiency vs each type's smallest size that fits", loc="left")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.16), ncols=4)
    return _svg(fig)
