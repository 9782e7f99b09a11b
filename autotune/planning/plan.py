"""Plan a training run: per cluster size the best layout, days, GPU-hours, cost and efficiency.

For every cluster type (a preset or a cluster file: one GPU type, one network) and every size
asked, the full enumeration is run again (`autotune.space.search_space.enumerate_layouts`:
every candidate through the framework's rules, survivors ranked by predicted throughput), so
each size gets its own best layout. The global batch is held in tokens across sizes; with
`max_gbs_tokens` it grows with the GPUs from the smallest size of the type instead, up to that
cap. From the best layout's predicted tokens/s: days = tokens / (tokens/s · 86,400),
GPU-hours = GPUs · tokens / (tokens/s · 3,600), cost = GPU-hours · price per GPU-hour.

Efficiency at N GPUs is (tokens/s per GPU at N) / (tokens/s per GPU at the type's smallest size
that fits). What costs it comes from the model's own step-time parts, grouped into `CAUSES`
(`autotune.scaling.efficiency_losses`): the growth of a group's GPU·seconds per token over the
base, as a share of the step at N. Recompute is the compute the chosen recompute adds (the same
layout estimated without it).

Every figure is a prediction. Its interval comes from one injectable function (`IntervalFn`);
without one the plan marks its figures "uncalibrated" and never prints a bare number.
"""

from __future__ import annotations

import dataclasses
import importlib
import math
from collections.abc import Callable
from collections.abc import Sequence
from typing import Any

from autotune.costmodel.constants import Constants
from autotune.costmodel.constants import constants_for
from autotune.costmodel.estimate import Estimate
from autotune.costmodel.estimate import estimate
from autotune.scaling import BOUND_BELOW
from autotune.scaling import FINE_AT
from autotune.scaling import efficiency_losses
from autotune.scaling import resized
from autotune.space.search_space import SearchSpace
from autotune.space.search_space import enumerate_layouts
from autotune.specs import AutotuneConfig

SECONDS_PER_DAY = 86_400.0
UNCALIBRATED = "uncalibrated"
"""The mark a figure carries when no interval is known."""
COMMUNICATION_PARTS = ("tp_comm", "cp_comm", "pp_p2p", "dp_comm", "zero3_gather", "ep_comm")
CAUSES: dict[str, tuple[str, ...]] = {
    "communication": COMMUNICATION_PARTS,
    "pipeline bubble": ("pp_bubble",),
    "recompute": (),
    "offload": ("offload",),
    "compute": ("compute",),
    "optimizer": ("optimizer",),
}
"""What can cost efficiency, as groups of `autotune.costmodel.step_time.TIME_PARTS`
(recompute: the compute the chosen recompute adds; compute: the rest, e.g. smaller GEMMs)."""
CAUSE_LABELS = {"communication": "communication", "pipeline bubble": "pipeline bubble",
                "recompute": "recompute (memory)", "offload": "offload (memory)",
                "compute": "smaller kernels", "optimizer": "optimizer step"}
"""How the causes read in tables and reports (recompute and offload are what memory forces;
compute grows when smaller per-GPU GEMMs run less efficiently)."""
BELOW_FINE = f"< {FINE_AT:g}"
BELOW_BOUND = f"< {BOUND_BELOW:g}"


@dataclasses.dataclass(frozen=True, slots=True)
class Interval:
    """A prediction interval of throughput (tokens/s) and where it comes from."""

    low: float
    high: float
    source: str


IntervalFn = Callable[[AutotuneConfig, Estimate], Interval | None]
"""Gives a prediction its interval (None: uncalibrated for this GPU, stack and regime)."""
ConstantsFn = Callable[[AutotuneConfig], Constants]
"""Gives a cluster's model constants (presets, a calibration file, a study's refit)."""


def no_interval(cfg: AutotuneConfig, prediction: Estimate) -> Interval | None:
    """No calibrated interval: every figure is marked uncalibrated."""
    return None


UNCERTAINTY_MODULE = "autotune.costmodel.uncertainty"
"""Where the cost model's prediction intervals live (cross-validated residuals per GPU, stack
and regime), in builds that have it."""


def model_interval(cfg: AutotuneConfig, prediction: Estimate) -> Interval | None:
    """The cost model's own interval for this setup (`prediction_interval(cfg)` of
    `UNCERTAINTY_MODULE`, turned into a tokens/s range), or None: uncalibrated, also in a
    build without that module."""
    try:
        module = importlib.import_module(UNCERTAINTY_MODULE)
    except ModuleNotFoundError:
        return None
    found = module.prediction_interval(cfg)
    if found is None:
        return None
    low, high = found.throughput(prediction.tokens_per_s)
    return Interval(float(low), float(high), str(found.text()))


def preset_constants(cfg: AutotuneConfig) -> Constants:
    """The GPU preset's constants (`autotune/presets/constants.yaml`)."""
    return constants_for(cfg.cluster.gpu, cfg.train.software_stack)


def mark_for(efficiency: float) -> str:
    """'' at or above 0.7 (the field notes' fine), '< 0.7' from 0.5, '< 0.5' below."""
    if efficiency >= FINE_AT:
        return ""
    return BELOW_FINE if efficiency >= BOUND_BELOW else BELOW_BOUND


@dataclasses.dataclass(frozen=True)
class ClusterSizes:
    """One cluster type and the node counts to plan on it."""

    name: str
    """The preset name or the cluster file's stem (what --price NAME=... refers to)."""
    config: AutotuneConfig
    """Model, cluster (at any size) and training setup."""
    nodes: tuple[int, ...]
    price_per_gpu_hour: float | None = None


@dataclasses.dataclass(frozen=True)
class PlanPoint:
    """One cluster size: its best layout and what training on it takes, or why it cannot."""

    cluster: str
    """The cluster type (preset name or file stem)."""
    name: str
    """The cluster at this size, e.g. dgx-h100:64."""
    gpu: str
    nodes: int
    gpus: int
    global_batch_size: int
    """Sequences per step at this size."""
    global_batch_tokens: int
    status: str
    """ok, or infeasible (no candidate passed the rules)."""
    candidates: int = 0
    feasible: int = 0
    rule: str = ""
    """For an infeasible size: the rule that removed the most candidates."""
    reason: str = ""
    layout: str = ""
    layout_fields: dict[str, Any] = dataclasses.field(default_factory=dict)
    tokens_per_s: float | None = None
    tokens_per_s_low: float | None = None
    tokens_per_s_high: float | None = None
    interval: str = UNCALIBRATED
    """Where the interval comes from, or 'uncalibrated'."""
    step_time_s: float | None = None
    mfu: float | None = None
    peak_memory_bytes: float | None = None
    time_parts: dict[str, float] = dataclasses.field(default_factory=dict)
    """Predicted step-time parts of the best layout, seconds."""
    causes: dict[str, float] = dataclasses.field(default_factory=dict)
    """The step time grouped by `CAUSES`, seconds."""
    days: float | None = None
    days_low: float | None = None
    days_high: float | None = None
    gpu_hours: float | None = None
    gpu_hours_low: float | None = None
    gpu_hours_high: float | None = None
    price_per_gpu_hour: float | None = None
    cost: float | None = None
    cost_low: float | None = None
    cost_high: float | None = None
    efficiency: float | None = None
    """Predicted tokens/s per GPU against the cluster type's smallest size that fits."""
    mark: str = ""
    """'< 0.7' or '< 0.5' when the efficiency falls below that line, else ''."""
    cause: str = ""
    """The group of `CAUSES` whose growth costs the most efficiency."""
    cause_loss: float | None = None
    losses: dict[str, float] = dataclasses.field(default_factory=dict)
    """Efficiency each group of `CAUSES` costs (they sum to 1 − efficiency)."""

    @property
    def ok(self) -> bool:
        """True when some layout fits at this size."""
        return self.status == "ok" and bool(self.tokens_per_s)

    @property
    def calibrated(self) -> bool:
        """True when the figures carry an interval."""
        return self.tokens_per_s_low is not None

    def to_dict(self) -> dict[str, Any]:
        """Plain fields, for JSON."""
        return dataclasses.asdict(self)


def _batch(cfg: AutotuneConfig, gpus: int, base_gpus: int, cap: float | None) -> int:
    """Sequences per step at `gpus`: the config's tokens per step, or with `cap` grown with
    the GPUs from `base_gpus` and capped (at least one sequence)."""
    seq = cfg.train.seq_length
    tokens = float(cfg.train.tokens_per_step)
    if cap is not None:
        tokens = min(cap, tokens * gpus / base_gpus)
    return max(1, int(tokens // seq))


def _grouped(parts: dict[str, float], recompute_s: float) -> dict[str, float]:
    grouped = {name: sum(parts.get(p, 0.0) for p in members) for name, members in CAUSES.items()}
    grouped["recompute"] = recompute_s
    grouped["compute"] = max(0.0, grouped["compute"] - recompute_s)
    return grouped


def _recompute_s(cfg: AutotuneConfig, best: Estimate, k: Constants) -> float:
    """The compute time the layout's recompute adds (the same layout estimated without it)."""
    if best.layout.recompute == "none":
        return 0.0
    plain = estimate(cfg, dataclasses.replace(best.layout, recompute="none"), k)
    return max(0.0, best.time_parts["compute"] - plain.time_parts["compute"])


def _span(tokens: float, rate: float | None, gpus: int, price: float | None) -> dict[str, Any]:
    """Days, GPU-hours and cost of `tokens` at `rate` tokens/s (None where unknown)."""
    if not rate:
        return {"days": None, "gpu_hours": None, "cost": None}
    seconds = tokens / rate
    hours = gpus * seconds / 3600
    return {"days": seconds / SECONDS_PER_DAY, "gpu_hours": hours,
            "cost": hours * price if price is not None else None}


def plan_point(
    sizes: ClusterSizes, nodes: int, base_gpus: int, tokens: float, space: SearchSpace,
    *, max_gbs_tokens: float | None = None, constants: ConstantsFn = preset_constants,
    interval: IntervalFn = no_interval,
) -> PlanPoint:
    """The best layout at `nodes` nodes of a cluster type and what `tokens` take on it."""
    per_node = sizes.config.cluster.gpus_per_node
    gpus = nodes * per_node
    gbs = _batch(sizes.config, gpus, base_gpus, max_gbs_tokens)
    cfg = resized(sizes.config, gpus, gbs)
    k = constants(cfg)
    shape: dict[str, Any] = {
        "cluster": sizes.name, "name": f"{sizes.name}:{nodes}", "gpu": cfg.cluster.gpu.name,
        "nodes": nodes, "gpus": gpus, "global_batch_size": gbs,
        "global_batch_tokens": cfg.train.tokens_per_step,
        "price_per_gpu_hour": sizes.price_per_gpu_hour}
    found = enumerate_layouts(cfg, space, k)
    if not len(found):
        ranked = sorted(((c, n) for n, c in found.removed.items() if c), reverse=True)
        listed = ", ".join(f"{name} {count:,}" for count, name in ranked[:3])
        return PlanPoint(**shape, status="infeasible", candidates=found.total,
                         rule=ranked[0][1] if ranked else "",
                         reason=f"no layout of {found.total:,} candidates fits; removed by "
                                f"{listed}")
    best = found.estimates.row(0)
    band = interval(cfg, best)
    price = sizes.price_per_gpu_hour
    figures = _span(tokens, best.tokens_per_s, gpus, price)
    slow = _span(tokens, band.low if band else None, gpus, price)
    fast = _span(tokens, band.high if band else None, gpus, price)
    return PlanPoint(
        **shape, status="ok", candidates=found.total, feasible=len(found),
        layout=best.layout.text, layout_fields=best.layout.to_dict(),
        tokens_per_s=best.tokens_per_s,
        tokens_per_s_low=band.low if band else None,
        tokens_per_s_high=band.high if band else None,
        interval=band.source if band else UNCALIBRATED,
        step_time_s=best.step_time_s, mfu=best.mfu, peak_memory_bytes=best.peak_memory_bytes,
        time_parts=dict(best.time_parts),
        causes=_grouped(best.time_parts, _recompute_s(cfg, best, k)),
        **figures,
        days_low=fast["days"], days_high=slow["days"],
        gpu_hours_low=fast["gpu_hours"], gpu_hours_high=slow["gpu_hours"],
        cost_low=fast["cost"], cost_high=slow["cost"],
    )


def diagnose(points: Sequence[PlanPoint]) -> list[PlanPoint]:
    """Efficiency, its mark and its main cause for the points of one cluster type.

    The plan's throughputs are the model's, tokens per step over the summed step-time parts,
    so the efficiency is the ratio of the parts in GPU·seconds per token
    (`autotune.scaling.efficiency_losses`), equal to the ratio of tokens/s per GPU."""
    base = next((p for p in sorted(points, key=lambda p: p.gpus) if p.ok), None)
    if base is None:
        return list(points)
    out = []
    for p in points:
        predicted, losses = efficiency_losses(base.causes, base.gpus, base.global_batch_tokens,
                                              p.causes, p.gpus, p.global_batch_tokens)
        if not p.ok or predicted is None:
            out.append(p)
            continue
        efficiency = predicted  # every figure of a plan is predicted: the ratio of rates
        cause = max(losses, key=lambda name: losses[name])
        named = p.gpus != base.gpus and losses[cause] >= 1e-3
        out.append(dataclasses.replace(
            p, efficiency=efficiency, mark=mark_for(efficiency), losses=losses,
            cause=cause if named else "", cause_loss=losses[cause] if named else None))
    return out


@dataclasses.dataclass(frozen=True)
class Threshold:
    """Where a cluster type's efficiency first falls below a line, and what costs it."""

    cluster: str
    line: float
    name: str
    """The first size below the line ('' when none is)."""
    gpus: int
    efficiency: float | None
    cause: str
    cause_loss: float | None
    last_above: str
    """The largest size still at or above the line ('' when none is)."""


def thresholds(points: Sequence[PlanPoint]) -> list[Threshold]:
    """For every cluster type, the 0.7 and 0.5 lines: the first size below each."""
    out = []
    for cluster in dict.fromkeys(p.cluster for p in points):
        ran = sorted((p for p in points if p.cluster == cluster and p.efficiency is not None),
                     key=lambda p: p.gpus)
        for line in (FINE_AT, BOUND_BELOW):
            below = next((p for p in ran if p.efficiency < line), None)  # type: ignore[operator]
            above = [p for p in ran if p.efficiency >= line  # type: ignore[operator]
                     and (below is None or p.gpus < below.gpus)]
            out.append(Threshold(
                cluster, line, below.name if below else "", below.gpus if below else 0,
                below.efficiency if below else None, below.cause if below else "",
                below.cause_loss if below else None, above[-1].name if above else ""))
    return out


def plan_points(
    clusters: Sequence[ClusterSizes], tokens: float, space: SearchSpace, *,
    max_gbs_tokens: float | None = None, constants: ConstantsFn = preset_constants,
    interval: IntervalFn = no_interval,
) -> list[PlanPoint]:
    """Every size of every cluster type, diagnosed against the type's smallest size."""
    if not math.isfinite(tokens) or tokens <= 0:
        raise ValueError(f"tokens must be positive and finite, not {tokens}")
    out: list[PlanPoint] = []
    for sizes in clusters:
        base_gpus = min(sizes.nodes) * sizes.config.cluster.gpus_per_node
        points = [plan_point(sizes, n, base_gpus, tokens, space, max_gbs_tokens=max_gbs_tokens,
                             constants=constants, interval=interval)
                  for n in sorted(set(sizes.nodes))]
        out.extend(diagnose(points))
    return out
