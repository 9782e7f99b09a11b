"""How far a step-time prediction may be off: an interval from cross-validated residuals.

`benchmarks/accuracy.py --fit` predicts every published run with constants fitted without the
run's source (leave one source out) and stores, per (GPU preset, software stack, regime), the
ratios measured / predicted step time in `autotune/presets/constants.yaml` (`intervals`). The
interval of a new prediction is the range of those ratios, widened to contain 1: the worst
error seen on each side when the model predicted a publication it was not fitted on. A regime
is the precision class (bf16 or fp8) and, for Mixture-of-Experts models, `-moe`; a regime the
pair has no residuals for takes the pair's pooled residuals (`all`). A pair never fitted (a
custom GPU without `like`, a stack without published runs on that GPU) has no interval: its
figures are "uncalibrated".

API (small on purpose): `prediction_interval(cfg) -> Interval | None`; `Interval.step_s(x)`
and `Interval.throughput(x)` turn a predicted figure into its (low, high) range;
`Interval.overlaps` tells whether two predictions are indistinguishable; `UNCALIBRATED` is the
mark printed instead of a range.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from autotune.costmodel.constants import calibrated_gpu
from autotune.costmodel.constants import calibration
from autotune.numbers import with_interval
from autotune.specs import AutotuneConfig

UNCALIBRATED = "uncalibrated"
"""The mark a figure carries when its (GPU, stack) has no cross-validated interval."""


@dataclasses.dataclass(frozen=True, slots=True)
class Interval:
    """Measured / predicted step time lies in [low, high] (relative factors, low <= 1 <= high)
    on `rows` held-out published runs from `sources` publications of `key`."""

    low: float
    high: float
    rows: int
    sources: int
    key: str
    """gpu/stack/regime the residuals come from."""
    between: float | None = None
    """The largest ratio of the measured / predicted step times of two held-out runs of one
    source and model (>= 1): how far the model misjudges one layout or size against another on
    the same setup, which the absolute range (a shared error) overstates. None: no source has
    two such runs."""
    left_out: str = "its source left out"
    """How each held-out run was predicted (for MoE regimes also with its model left out, the
    worse of the two)."""

    def step_s(self, predicted: float) -> tuple[float, float]:
        """(low, high) step time in seconds around a predicted one."""
        return predicted * self.low, predicted * self.high

    def throughput(self, predicted: float) -> tuple[float, float]:
        """(low, high) of a rate (tokens/s, TFLOP/s, MFU) around a predicted one."""
        return predicted / self.high, predicted / self.low

    def overlaps(self, step_a: float, step_b: float) -> bool:
        """Whether the model cannot tell which of two layouts of one setup is faster: their
        ratio is within `between`, or, without it, their step-time ranges overlap."""
        if self.between is not None:
            return max(step_a, step_b) <= self.between * min(step_a, step_b)
        a_low, a_high = self.step_s(step_a)
        b_low, b_high = self.step_s(step_b)
        return a_low <= b_high and b_low <= a_high

    def text(self) -> str:
        """'-4 %/+7 %' style relative range of the step time."""
        return f"{self.low - 1:+.0%}/{self.high - 1:+.0%} step time"

    def origin(self) -> str:
        """Where the range comes from, in words."""
        return (f"the range of {self.rows} published runs from {self.sources} source(s) of "
                f"{self.key}, each predicted with {self.left_out}")

    def to_dict(self) -> dict[str, Any]:
        """JSON form."""
        return dataclasses.asdict(self)


def regime(cfg: AutotuneConfig) -> str:
    """The residual class of a setup: bf16 or fp8, `-moe` for Mixture-of-Experts models."""
    base = "fp8" if cfg.train.precision == "fp8" else "bf16"
    return base + ("-moe" if cfg.model.num_experts else "")


def residual_summary(ratios: Sequence[float], sources: int,
                     left_out: str | None = None) -> dict[str, float | int | str]:
    """What `constants.yaml` stores for one regime: the range of measured / predicted step time
    over the held-out rows (widened to contain 1), the row and source counts, and what the
    rows were predicted without when it is more than their source (`left_out`)."""
    values = np.asarray(ratios, dtype=float)
    return {"low": round(float(min(values.min(), 1.0)), 4),
            "high": round(float(max(values.max(), 1.0)), 4),
            "rows": int(values.size), "sources": int(sources),
            **({"left_out": left_out} if left_out else {})}


def between_summary(runs: Sequence[Sequence[float]]) -> dict[str, float | int] | None:
    """What `constants.yaml` stores as `between_layouts`: over groups of measured / predicted
    step-time ratios (each group: the held-out runs of one source and model), the largest
    ratio of two ratios in one group, and how many pairs it is the maximum of; None without a
    group of two."""
    pairs = [max(g) / min(g) for g in runs if len(g) >= 2]
    count = sum(len(g) * (len(g) - 1) // 2 for g in runs if len(g) >= 2)
    return {"ratio": round(max(pairs), 4), "pairs": count} if pairs else None


def prediction_interval(cfg: AutotuneConfig) -> Interval | None:
    """The interval of this setup's step-time predictions, or None when uncalibrated."""
    gpu = calibrated_gpu(cfg.cluster.gpu)
    stack = cfg.train.software_stack
    entry = calibration(gpu, stack) if gpu else None
    intervals = (entry or {}).get("intervals") or {}
    name = regime(cfg)
    key = name if name in intervals else "all"
    stored = intervals.get(key)
    if not stored:
        return None
    origin = (entry or {}).get("intervals_from") or gpu
    between = ((entry or {}).get("between_layouts") or {}).get("ratio")
    return Interval(float(stored["low"]), float(stored["high"]), int(stored["rows"]),
                    int(stored["sources"]), f"{origin}/{stack}/{key}",
                    float(between) if between else None,
                    str(stored.get("left_out", "its source left out")))


def interval_text(cfg: AutotuneConfig) -> str:
    """The interval's text, or the uncalibrated mark."""
    interval = prediction_interval(cfg)
    return interval.text() if interval else UNCALIBRATED


def uncalibrated_text(cfg: AutotuneConfig) -> str:
    """Why a setup without an interval is uncalibrated, and which constants its figures use."""
    gpu, stack = cfg.cluster.gpu, cfg.train.software_stack
    if gpu.calibration:
        used = f"the constants calibration {gpu.calibration} fitted on this cluster"
    elif cfg.cluster.cpu_processes:
        used = ("the cpu preset's constants (typical of one host's calibrations): run "
                "autotune calibrate for this one")
    else:
        used = "the model's defaults"
    return (f"{UNCALIBRATED}: no published runs of {gpu.name} with {stack} bound the error; "
            f"the figures use {used}")


def with_range(tokens_per_s: float | None, band: Interval | None) -> str:
    """A predicted tokens/s with its range (low–high) where the setup has an interval."""
    low, high = band.throughput(tokens_per_s) if band and tokens_per_s else (None, None)
    return with_interval(tokens_per_s, low, high)


def range_note(cfg: AutotuneConfig, band: Interval | None) -> str:
    """Where the ranges `with_range` prints come from (`band`: `prediction_interval(cfg)`), or
    why there are none."""
    if band is None:
        return f"predicted figures are {uncalibrated_text(cfg)}"
    return f"predicted tokens/s (low–high): {band.text()}, {band.origin()}"
