"""The trial record: one Optuna trial flattened (`study.trial_records`), with typed accessors.

The keys are the trial's user attributes as `study.Objective` writes them; every reader (the
refit, the reports, the CLI, the sampler) goes through the accessors below instead of spelling
keys, so a rename is one edit here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from typing import TypedDict

from autotune.layout import Layout


class TrialRecord(TypedDict, total=False):
    """One trial of a study (every key optional: a trial records what it got to)."""

    number: int
    state: str
    """Optuna's trial state (COMPLETE, FAIL, PRUNED, ...)."""
    value: float | None
    """The objective: measured tokens/s of an ok trial."""
    datetime_start: str | None
    datetime_complete: str | None
    params: dict[str, Any]
    retry_of: int
    """The trial this one retries (an interrupted or stale trial)."""
    status: str
    """`autotune.measurement.Status`."""
    ran: bool
    """A runner measured it (False: a rule removed it, or the layout ran already)."""
    layout: str
    """The layout as users type it (`tp=..,pp=..`)."""
    layout_id: str
    """The layout's file-safe id."""
    layout_fields: dict[str, Any]
    """`Layout.to_dict()`."""
    predicted: dict[str, Any]
    """`Estimate.to_dict()` of the layout, before the trial ran."""
    rule: str
    reason: str
    duplicate_of: int
    log_tail: str
    trial_dir: str
    memory_flag: str
    measured_step_time_s: float
    measured_tokens_per_s: float
    measured_tflops_per_gpu: float
    measured_mfu: float
    measured_peak_memory_bytes: float
    measured_step_time_spread: float


def record_layout(record: Mapping[str, Any]) -> Layout | None:
    """The trial's layout (None for a record without one)."""
    fields = record.get("layout_fields")
    return Layout(**fields) if isinstance(fields, Mapping) else None


def layout_of(record: Mapping[str, Any]) -> Layout:
    """The layout of a trial that ran (ranked trials always have one)."""
    layout = record_layout(record)
    if layout is None:
        raise ValueError(f"trial {record.get('number')} records no layout")
    return layout


def measured_figure(record: Mapping[str, Any], name: str) -> float | None:
    """A measured figure (`step_time_s`, `tokens_per_s`, `mfu`, ...) or None."""
    value = record.get(f"measured_{name}")
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def predicted_figure(record: Mapping[str, Any], name: str) -> Any:
    """A figure the model predicted for the trial's layout (`tokens_per_s`, ...) or None."""
    return (record.get("predicted") or {}).get(name)


def ran(record: Mapping[str, Any]) -> bool:
    """True when a runner measured the trial and its layout is known."""
    return bool(record.get("ran")) and record_layout(record) is not None
