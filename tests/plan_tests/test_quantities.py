"""The plan's quantities as people write them. Oracle: the values worked out by hand."""

from __future__ import annotations

import pytest

from autotune.exceptions import AutotuneError
from autotune.planning.quantities import expand_sizes
from autotune.planning.quantities import parse_days
from autotune.planning.quantities import parse_money
from autotune.planning.quantities import parse_prices
from autotune.planning.quantities import parse_tokens


@pytest.mark.parametrize(("text", "tokens"), [
    ("15T", 15e12), ("15.6T", 15.6e12), ("300B", 300e9), ("300G", 300e9), ("2M", 2e6),
    ("1.5e12", 1.5e12), ("1,000B", 1e12), ("800k", 8e5), (" 7 T ", 7e12), (2e9, 2e9),
])
def test_token_counts_read_with_their_suffix(text: object, tokens: float) -> None:
    assert parse_tokens(text) == pytest.approx(tokens)


@pytest.mark.parametrize(("text", "days"), [
    ("30d", 30.0), ("30", 30.0), ("36h", 1.5), ("2w", 14.0), ("0.5d", 0.5),
])
def test_durations_read_in_days(text: str, days: float) -> None:
    assert parse_days(text) == pytest.approx(days)


@pytest.mark.parametrize(("text", "amount"), [
    ("2500000", 2.5e6), ("$2.5M", 2.5e6), ("800k", 8e5), ("$1B", 1e9),
])
def test_amounts_read_with_dollar_and_suffix(text: str, amount: float) -> None:
    assert parse_money(text) == pytest.approx(amount)


@pytest.mark.parametrize("bad", ["0", "-5T", "inf", "nan", "1e400", "-0.1"])
def test_not_positive_finite_is_refused_naming_the_option(bad: str) -> None:
    with pytest.raises(AutotuneError, match=r"^--tokens: .* is not a positive finite number"):
        parse_tokens(bad)


@pytest.mark.parametrize("bad", ["abc", "5X", "15 TB", "", "T"])
def test_unreadable_is_refused_with_an_example(bad: str) -> None:
    with pytest.raises(AutotuneError, match="write e.g. 15T or 300B"):
        parse_tokens(bad)


def test_a_bool_is_not_a_number() -> None:
    with pytest.raises(AutotuneError, match="not a number"):
        parse_days(True)


def test_prices_for_every_cluster_and_by_name() -> None:
    assert parse_prices("2.49") == (2.49, {})
    assert parse_prices("2,dgx-h100=3.5,hgx-h200=$4") == (2.0, {"dgx-h100": 3.5,
                                                                 "hgx-h200": 4.0})
    with pytest.raises(AutotuneError, match="--price: '-1' is not a positive finite"):
        parse_prices("dgx-h100=-1")
    with pytest.raises(AutotuneError, match="names no cluster"):
        parse_prices("=2")


@pytest.mark.parametrize(("text", "sizes"), [
    ("8,16,32", [8, 16, 32]),
    ("8,16,...,512", [8, 16, 32, 64, 128, 256, 512]),
    ("1,4,...,64", [1, 4, 16, 64]),
    ("8,12,...,24", [8, 12, 16, 20, 24]),
    ("32,8,16", [8, 16, 32]),
    ("8,16,...,100", [8, 16, 32, 64, 100]),
])
def test_size_lists_expand_their_progression(text: str, sizes: list[int]) -> None:
    assert expand_sizes(text, "-c") == sizes


@pytest.mark.parametrize(("bad", "fragment"), [
    ("8,...,64", "needs two sizes before it"),
    ("8,16,...", "ends without a last size"),
    ("16,8,...,64", "growing sizes"),
    ("8,x", "'x' is not a positive whole number"),
    ("0,8", "'0' is not a positive whole number"),
    ("3,5,...,100000", "more than 1024 sizes"),
])
def test_bad_size_lists_are_refused(bad: str, fragment: str) -> None:
    with pytest.raises(AutotuneError, match=fragment):
        expand_sizes(bad, "-c")
