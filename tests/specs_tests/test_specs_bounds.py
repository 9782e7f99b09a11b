"""The bounded number types of autotune.specs: strict, finite, bounded, with the bound's reason
in the message."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import settings
from hypothesis import strategies as st
from pydantic import TypeAdapter
from pydantic import ValidationError

from autotune import specs

INTEGERS = {
    # type: (lowest, highest) as the docstrings of autotune.specs state them
    "SeqLength": (1, 16_777_216),
    "BatchSize": (1, 1_048_576),
    "NodeCount": (1, 65_536),
    "DevicesPerNode": (1, 1_024),
    "LayerCount": (1, 16_384),
    "Width": (1, 1_048_576),
    "HeadCount": (1, 16_384),
    "VocabSize": (1, 16_777_216),
    "Seed": (0, 4_294_967_295),
}
FLOATS = {
    "GpuMemoryGiB": 65_536.0,
    "TFlops": 1e5,
    "MemoryTBs": 1e3,
    "LinkGBs": 1e5,
    "HostMemoryGB": 16_777_216.0,
}


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(INTEGERS)), value=st.integers())
def test_integers_are_strict_and_bounded(name: str, value: int) -> None:
    """Oracle: the bounds written above by hand (2**24 tokens, 2**20 sequences, ...)."""
    low, high = INTEGERS[name]
    adapter = TypeAdapter(getattr(specs, name))
    if low <= value <= high:
        assert adapter.validate_python(value) == value
    elif value > high:
        with pytest.raises(ValidationError, match=rf"must be at most {high:,} \("):
            adapter.validate_python(value)
    else:
        with pytest.raises(ValidationError, match="greater than or equal"):
            adapter.validate_python(value)


@pytest.mark.parametrize("name", sorted(INTEGERS))
@pytest.mark.parametrize(
    ("value", "message"),
    [(True, "not true/false"), (4.0, "valid integer"), ("8", "valid integer")],
)
def test_integers_refuse_bools_floats_and_strings(name: str, value: object, message: str) -> None:
    """Oracle: YAML's `true` is a bool, `4.0` a float and `"8"` a string, none a count (pydantic's
    lax mode would read them as 1, 4 and 8)."""
    with pytest.raises(ValidationError, match=message):
        TypeAdapter(getattr(specs, name)).validate_python(value)


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(FLOATS)),
       value=st.floats(allow_nan=True, allow_infinity=True) | st.booleans())
def test_hardware_figures_are_finite_positive_and_bounded(name: str, value: float) -> None:
    """Oracle: a peak of 0 or −989 TFLOP/s, NaN or infinity gives no meaningful step time."""
    adapter = TypeAdapter(getattr(specs, name))
    good = not isinstance(value, bool) and math.isfinite(value) and 0 < value <= FLOATS[name]
    if good:
        assert adapter.validate_python(value) == value
    else:
        with pytest.raises(ValidationError, match="not true/false|finite|greater than|at most"):
            adapter.validate_python(value)
