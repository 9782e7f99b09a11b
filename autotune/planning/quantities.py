"""The plan's quantities as people write them: 15T tokens, 30d, $2.5M, 8,16,...,512 nodes.

Every reader returns a positive finite number (or a list of sizes) or raises `AutotuneError`
naming the option, the value and the form to use.

Example:
    >>> parse_tokens("15.6T"), parse_days("36h"), parse_money("$2.5M")
    (15600000000000.0, 1.5, 2500000.0)
    >>> expand_sizes("8,16,...,128", "-c")
    [8, 16, 32, 64, 128]
"""

from __future__ import annotations

import math
import re

from autotune.exceptions import AutotuneError
from autotune.exceptions import shorten

SI = {"": 1.0, "k": 1e3, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12, "P": 1e15}
"""Multipliers of the count suffixes (B and G both 1e9: 'billion')."""
DAYS_PER = {"": 1.0, "d": 1.0, "h": 1 / 24, "w": 7.0}
"""Duration suffixes in days (a bare number is days)."""
_NUMBER = r"([-+]?[0-9][0-9_,]*(?:\.[0-9]*)?(?:[eE][+-]?[0-9]+)?|[-+]?\.[0-9]+)"
MAX_SIZES = 1024
"""The most sizes one `...` may expand to."""


def _positive(value: float, option: str, text: object, example: str) -> float:
    if not math.isfinite(value) or value <= 0:
        raise AutotuneError(
            f"{option}: {shorten(text, 30)} is not a positive finite number; write e.g. {example}"
        )
    return value


def _read(text: object, option: str, suffixes: dict[str, float], example: str,
          prefix: str = "") -> float:
    """A number with an optional prefix and one suffix of `suffixes`, times its multiplier."""
    if isinstance(text, bool):
        raise AutotuneError(f"{option}: {text} is not a number; write e.g. {example}")
    if isinstance(text, int | float):
        return _positive(float(text), option, text, example)
    raw = str(text).strip()
    keys = "|".join(re.escape(k) for k in sorted(suffixes, key=len, reverse=True) if k)
    pattern = rf"{re.escape(prefix)}?\s*{_NUMBER}\s*({keys})?" if prefix else \
        rf"{_NUMBER}\s*({keys})?"
    match = re.fullmatch(pattern, raw)
    if not match:
        try:  # inf, nan, -5 read as numbers, refused as not positive finite
            return _positive(float(raw), option, text, example)
        except ValueError:
            raise AutotuneError(
                f"{option}: cannot read {shorten(text, 30)}; write e.g. {example}"
            ) from None
    number = float(match.group(1).replace("_", "").replace(",", ""))
    return _positive(number * suffixes[match.group(2) or ""], option, text, example)


def parse_tokens(text: object, option: str = "--tokens") -> float:
    """Tokens: 15T, 300B, 1.5e12, 2M (suffixes k, M, B or G, T, P)."""
    return _read(text, option, SI, "15T or 300B")


def parse_days(text: object, option: str = "--deadline") -> float:
    """A duration in days: 30d, 36h, 2w, or a bare number of days."""
    return _read(text, option, DAYS_PER, "30d, 36h or 2w")


def parse_money(text: object, option: str = "--budget") -> float:
    """An amount: 2500000, $2.5M, 800k (suffixes k, M, B)."""
    suffixes = {k: v for k, v in SI.items() if k in ("", "k", "K", "M", "B")}
    return _read(text, option, suffixes, "2.5M or 800k", prefix="$")


def parse_prices(text: str, option: str = "--price") -> tuple[float | None, dict[str, float]]:
    """Price per GPU-hour: one for every cluster ('2.49') and/or per cluster
    ('dgx-h100=2.49,hgx-h200=3.1'; the name is the preset or the cluster file's stem).

    Returns:
        The price for every cluster (None if not given) and the prices by cluster name.
    """
    every: float | None = None
    named: dict[str, float] = {}
    for part in filter(None, (p.strip() for p in str(text).split(","))):
        name, sep, value = part.rpartition("=")
        if sep and not name.strip():
            raise AutotuneError(f"{option}: {shorten(part, 30)} names no cluster; write "
                                "NAME=PRICE, e.g. dgx-h100=2.49")
        price = _read(value, option, {"": 1.0}, "2.49 or dgx-h100=2.49", prefix="$")
        if sep:
            named[name.strip()] = price
        else:
            every = price
    if every is None and not named:
        raise AutotuneError(f"{option}: {shorten(text, 30)} gives no price; write e.g. 2.49")
    return every, named


def expand_sizes(text: str, option: str) -> list[int]:
    """Sizes such as '8,16,32', with '...' continuing the two sizes before it up to the one
    after: by their ratio when the second is a multiple of the first ('8,16,...,512' doubles),
    else by their difference ('8,12,...,24').

    Raises:
        AutotuneError: a size that is not a positive integer, or a '...' without two sizes
            before it and one after.
    """
    parts = [p.strip() for p in text.split(",") if p.strip()]
    sizes: list[int] = []
    pending = False
    for part in parts:
        if part in ("...", "…"):
            if len(sizes) < 2 or pending:
                raise AutotuneError(f"{option}: {shorten(text, 40)}: '...' needs two sizes "
                                    "before it, as in 8,16,...,512")
            pending = True
            continue
        if not (part.isascii() and part.isdigit()) or len(part) > 9 or int(part) < 1:
            raise AutotuneError(f"{option}: {shorten(part, 20)} is not a positive whole number; "
                                "write sizes as 8,16,32 or 8,16,...,512")
        size = int(part)
        if pending:
            sizes.extend(_continue(sizes[-2], sizes[-1], size, option, text))
            pending = False
        sizes.append(size)
    if pending or not sizes:
        raise AutotuneError(f"{option}: {shorten(text, 40)} ends without a last size; write "
                            "e.g. 8,16,...,512")
    return sorted(set(sizes))


def _continue(a: int, b: int, last: int, option: str, text: str) -> list[int]:
    """The sizes strictly between b and last that continue a, b (ratio, else step)."""
    out: list[int] = []
    if b > a and b % a == 0 and b // a > 1:
        value = b * (b // a)
        while value < last and len(out) < MAX_SIZES:
            out.append(value)
            value *= b // a
    elif b > a:
        value = b + (b - a)
        while value < last and len(out) < MAX_SIZES:
            out.append(value)
            value += b - a
    else:
        raise AutotuneError(f"{option}: {shorten(text, 40)}: '...' needs growing sizes before it")
    if len(out) >= MAX_SIZES:
        raise AutotuneError(f"{option}: {shorten(text, 40)} expands to more than {MAX_SIZES} "
                            "sizes; give fewer")
    return out
