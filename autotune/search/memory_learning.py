"""Which untried layouts fit: the memory model corrected by what the trials measured.

The analytic model splits a layout's memory into model states (weights, gradients, optimizer,
communication buffers), activations (with the logits) and a runtime reserve. On a real cluster
the activations differ by a factor that depends on the structure (recompute above all), and the
reserve the allocator never shows (CUDA context, NCCL buffers, fragmentation) is larger or
smaller than assumed. Each trial teaches one of two things:

- an `ok` trial with a measured peak: peak = states + a_f · activations + c, a Bayesian linear
  fit (prior a = 1, c = 0) of a global activation factor, a correction per recompute family
  (shrunk towards the global factor) and an offset c (what the runner's peak counts beyond the
  allocator, e.g. a process's resident memory); the peak is also a level known to fit;
- an `oom` trial: its need (under the fit) is above what the device holds. If it needs more
  than every layout that ran, the limit drops below it by a safety gap; if not (a layout that
  ran needed more), its recompute family's activation factor rises until it does not fit.

The limit is the largest need that fits: the model's (usable memory − runtime, plus c) until a
trial says otherwise. A layout is proposed only when its need plus `z` predictive standard
deviations stays within the limit, so the first trials keep a margin that the fit then removes.
Until an OOM places the limit, the limit itself is uncertain by `PRIOR_LIMIT_SD_GIB` (never below
the largest need that fitted); the warm start (`fits(cautious=True)`) adds that σ to the need's,
so exploring families does not spend trials on OOMs, and later trials probe the edge.
The implied runtime reserve (device memory − limit + c) is reported as the fitted offset.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from autotune.costmodel.constants import Constants
from autotune.costmodel.memory import MemoryEstimate
from autotune.costmodel.memory import usable_gpu_bytes
from autotune.specs import AutotuneConfig
from autotune.units import GIB

FAMILIES = 3
"""Recompute modes (none, selective, full): each gets its own activation correction."""
PRIOR_SCALE_SD = 0.15
"""Prior σ of the global activation factor (the model's activations within ±15 %)."""
PRIOR_FAMILY_SD = 0.3
"""Prior σ of a recompute family's deviation from the global factor."""
PRIOR_OFFSET_SD_GIB = 1.0
"""Prior σ of the offset between a measured peak and the allocator's bytes."""
PEAK_NOISE = 0.02
"""Relative σ of a measured peak around the fit (allocator rounding, timing of the peak)."""
OOM_GAP = 0.03
"""After an OOM, layouts within 3 % below its need are treated as not fitting either."""
Z = 1.0
"""Predictive standard deviations a proposal keeps below the limit."""
PRIOR_LIMIT_SD_GIB = 3.0
"""σ of the model's limit until an OOM has placed it: the runtime reserve (CUDA context, NCCL
buffers per communicator) and allocator fragmentation never show in a measured peak, and
clusters differ by a few GiB in both."""


@dataclasses.dataclass(frozen=True)
class MemoryParts:
    """Model memory of layouts (bytes): states + buffers, activations + logits, the family."""

    fixed: np.ndarray
    activation: np.ndarray
    family: np.ndarray

    @classmethod
    def from_memory(cls, memory: MemoryEstimate, recompute: np.ndarray) -> MemoryParts:
        """From the memory estimate of a table with `recompute` codes."""
        part = memory.parts
        fixed = part["weights"] + part["gradients"] + part["optimizer"] + part["buffers"]
        return cls(
            np.asarray(fixed, float),
            np.asarray(part["activations"] + part["logits"], float),
            np.asarray(recompute, int),
        )

    def take(self, index: np.ndarray) -> MemoryParts:
        """The rows selected by `index`."""
        return MemoryParts(self.fixed[index], self.activation[index], self.family[index])

    def design(self) -> np.ndarray:
        """Regressors in GiB: activation, activation per family, 1 (the offset)."""
        a = self.activation / GIB
        per_family = [a * (self.family == f) for f in range(FAMILIES)]
        return np.column_stack([a, *per_family, np.ones_like(a)])


@dataclasses.dataclass(frozen=True)
class MemoryFit:
    """The corrected memory model and the learned limit."""

    mean: np.ndarray
    """Posterior mean: [global factor, family deviations..., offset GiB]."""
    cov: np.ndarray
    limit_bytes: float
    reserve_bytes: float
    """Device memory minus the limit, on the allocator's scale: the fitted runtime reserve."""
    measured: int
    oom: int
    limit_sd_bytes: float = 0.0
    """σ of the limit itself: `PRIOR_LIMIT_SD_GIB` (at most the gap down to the largest need
    that fitted) while no OOM has lowered it, else 0."""

    def need(self, parts: MemoryParts) -> tuple[np.ndarray, np.ndarray]:
        """Predicted need (bytes, on the measured scale) and its predictive σ."""
        x = parts.design()
        mean = parts.fixed + (x @ self.mean) * GIB
        sd = np.sqrt(np.einsum("ij,jk,ik->i", x, self.cov, x)) * GIB
        return mean, sd

    def fits(self, parts: MemoryParts, z: float = Z, cautious: bool = False) -> np.ndarray:
        """True where the need plus z σ stays within the limit (`cautious`: the limit's own σ
        joins the need's, as the first trials do)."""
        mean, sd = self.need(parts)
        sd = np.hypot(sd, self.limit_sd_bytes) if cautious else sd
        fits: np.ndarray = mean + z * sd <= self.limit_bytes
        return fits

    def factors(self) -> list[float]:
        """Activation factor of each recompute family (none, selective, full)."""
        return [float(self.mean[0] + self.mean[1 + f]) for f in range(FAMILIES)]

    def describe(self) -> str:
        """One line for the log."""
        factors = ", ".join(f"{f:.2f}" for f in self.factors())
        return (
            f"activation factor (none, selective, full recompute) {factors}; limit "
            f"{self.limit_bytes / GIB:.1f} GiB, runtime reserve {self.reserve_bytes / GIB:.1f} "
            f"GiB ({self.measured} measured peaks, {self.oom} OOM)"
        )

    def to_dict(self) -> dict[str, float | list[float]]:
        """JSON form (a trial attribute)."""
        return {
            "activation_factors": [round(f, 4) for f in self.factors()],
            "offset_gib": round(float(self.mean[-1]), 4),
            "limit_gib": round(self.limit_bytes / GIB, 3),
            "reserve_gib": round(self.reserve_bytes / GIB, 3),
        }


def fit_memory(
    cfg: AutotuneConfig,
    k: Constants,
    parts: MemoryParts,
    status: np.ndarray,
    peak: np.ndarray,
) -> MemoryFit:
    """Fit the correction to trials (`parts` of their layouts, `status`, measured `peak` or nan).

    Only `ok` trials with a peak enter the regression; `oom` trials only lower the limit.
    """
    prior_mean = np.zeros(FAMILIES + 2)
    prior_mean[0] = 1.0
    prior_sd = np.array([PRIOR_SCALE_SD, *[PRIOR_FAMILY_SD] * FAMILIES, PRIOR_OFFSET_SD_GIB])
    precision = np.diag(1 / prior_sd**2)
    shift = precision @ prior_mean
    measured = (status == "ok") & np.isfinite(peak) & (peak > 0)
    if measured.any():
        rows = parts.take(measured)
        x = rows.design()
        y = (peak[measured] - rows.fixed) / GIB
        weight = 1 / (PEAK_NOISE * peak[measured] / GIB) ** 2
        precision = precision + x.T @ (weight[:, None] * x)
        shift = shift + x.T @ (weight * y)
    cov = np.linalg.inv(precision)
    mean = cov @ shift
    offset = float(mean[-1]) * GIB
    oom = status == "oom"
    fit = MemoryFit(mean, cov, 0.0, 0.0, int(measured.sum()), int(oom.sum()))
    limit = usable_gpu_bytes(cfg, k) - k.runtime_memory_gib * GIB + offset
    modelled = limit
    ran = status == "ok"
    level = 0.0  # the largest need known to fit: measured peaks, else predicted needs
    if ran.any():
        need, _ = fit.need(parts.take(ran))
        level = float(np.where(measured[ran], peak[ran], need).max())
    if oom.any():
        need, _ = fit.need(parts.take(oom))
        above = need[need >= level]  # OOMs the limit explains
        if len(above):
            limit = min(limit, float(above.min()) * (1 - OOM_GAP))
    limit = max(limit, level)
    if oom.any():  # an OOM the limit does not explain: its family needs more than modelled
        mean = mean.copy()
        rows = parts.take(oom)
        need, _ = fit.need(rows)
        for j in np.flatnonzero(need * (1 - OOM_GAP) < limit):
            if rows.activation[j] <= 0:
                continue
            wanted = (limit / (1 - OOM_GAP) - rows.fixed[j] - offset) / rows.activation[j]
            family = 1 + int(rows.family[j])
            mean[family] = max(mean[family], wanted - mean[0])
    reserve = cfg.cluster.gpu.memory_bytes - (limit - offset)
    # the limit is at least the largest need that fitted: its σ never reaches below that
    limit_sd = min(PRIOR_LIMIT_SD_GIB * GIB, limit - level) if limit >= modelled else 0.0
    return dataclasses.replace(fit, mean=mean, limit_bytes=limit, reserve_bytes=reserve,
                               limit_sd_bytes=limit_sd)
