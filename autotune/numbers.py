"""How figures are written: thousands separators, k/M/G/T, a value with its range (no
imports beyond the standard library, so the CLI can use it without the report's plotting)."""

from __future__ import annotations

from typing import Any


def compact(value: float) -> str:
    """3 significant digits with k, M, G (billion), T: 15.6T, 71.2M, 950."""
    for factor, suffix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= factor:
            return f"{value / factor:.3g}{suffix}"
    return f"{value:.3g}"


def with_interval(value: float | None, low: float | None, high: float | None,
                  digits: int = 0, short: bool = False) -> str:
    """'72.4 (65.1–80.2)', or '72.4' without an interval (the row's interval column then
    says uncalibrated); '–' for None; `short`: 3 significant digits with k/M/G."""
    if value is None:
        return "–"
    shown = compact if short else (lambda v: num(v, digits))
    if low is None or high is None:
        return shown(value)
    return f"{shown(value)} ({shown(low)}–{shown(high)})"


def num(value: Any, digits: int = 0) -> str:
    """1,234 or 1,234.5; '–' for None."""
    return "–" if value is None else f"{value:,.{digits}f}"
