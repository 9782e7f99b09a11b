"""Which untried layouts fit: the memory model corrected by what the trials measured.

The analytic model splits a layout's memory into model states (weights, gradients, optimizer,
communication buffers), activations (with the logits) and a runtime reserve. On a real cluster
the activations differ by a factor that depends on the structure (recompute above all), the
states by one that depends on how they are sharded (ZeRO-3's gathered and prefetched
parameters, the offload's staging buffers, the framework's gradient copies), and the reserve
the allocator never shows (CUDA context, NCCL buffers, fragmentation) is larger or smaller
than assumed. Two unknowns, learned from every trial that ran:

- the need: peak = (1 + s_g) · states + a_f · activations + c, a Bayesian linear fit to the
  measured peaks of all `ok` trials (prior s = 0, a = 1, c = 0) of a global activation factor
  with a correction per recompute family, a global states correction with one per state
  family (ZeRO 0-2, ZeRO-3, offload), each shrunk towards its global one, and an offset c
  (what the runner's peak counts beyond the allocator, e.g. a process's resident memory);
- the limit L, the largest need that fits: the model's (usable memory − runtime, plus c) with
  a prior σ of `PRIOR_LIMIT_SD_GIB`, since the runtime reserve and the allocator's
  fragmentation never show in a measured peak.

Trials constrain both: a measured peak fitted (L above it); an `oom` trial needed more than L.
The joint posterior of the need's parameters and L given those censored observations is
sampled (draws of the peaks' Gaussian posterior, each weighted with every limit on a grid by
the censored trials, then resampled; Gelbart, Snoek and Adams 2014, "Bayesian optimization
with unknown constraints"): an OOM lowers L or raises the factors of layouts like it, in
proportion to how well each explains it, so an OOM in a ZeRO-3 layout costs ZeRO-3's
neighbours more probability of fitting than other families'; its need misses by what its
family's layouts miss by (`MemoryFit.miss_sd`), so an OOM in a family the model predicts
badly lowers L less. A new layout's need also misses
by `ROW_SD` (structure the fit cannot see, e.g. fragmentation growing with the pipeline); how
much is learned from the trials' own out-of-sample misses, per memory family (recompute mode
and state family; `row_sd`: each measured peak against the need the trials before it
predicted, and each OOM as a miss of at least what clears the highest fitted peak, shrunk
towards `ROW_SD`): a measured family's layouts are charged its own misses,
an unmeasured family's the misses of the families' first peaks, so a ZeRO-3 peak 33 % above
its prior need makes the untried families risky, not the layouts beside well-predicted ZeRO-1
peaks. An OOM below a peak that fitted raises its family's need by the parameters' share of
the deficit (their variance in its need against its own miss's: the rest is its own miss,
which only its grid shares): the state family's factor where only its recompute mode has a
measured peak (an offloaded layout's staging buffers), the recompute mode's where only the
state family has one, half each otherwise.
`MemoryFit.p_fit` is the probability that a layout fits (`p_fit_beside_oom` beside an OOM of
its grid, whose miss it shares); the proposer charges it in the
acquisition (an OOM is a trial spent) and proposes only layouts likely enough to fit
(`p_fit_needed`: more so after each OOM). The implied runtime reserve (device memory − limit +
c) is reported as the fitted offset.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from scipy.special import log_ndtr
from scipy.special import ndtr

from autotune.costmodel.constants import Constants
from autotune.costmodel.memory import MemoryEstimate
from autotune.costmodel.memory import usable_gpu_bytes
from autotune.layout import LayoutTable
from autotune.specs import AutotuneConfig
from autotune.units import GIB

FAMILIES = 3
"""Recompute modes (none, selective, full): each gets its own activation correction."""
STATE_FAMILIES = 3
"""Model-state families (ZeRO 0-2, ZeRO-3, any offload): each gets its own states
correction (ZeRO-3's gathered and prefetched parameters, the offload's staging buffers)."""
PRIOR_SCALE_SD = 0.15
"""Prior σ of the global activation factor (the model's activations within ±15 %)."""
PRIOR_FAMILY_SD = 0.15
"""Prior σ of a recompute family's deviation from the global factor."""
PRIOR_STATES_SD = 0.10
"""Prior σ of the global model-states factor (buffers, gradient copies, the framework's
accounting: the model's bytes per parameter within ±10 %)."""
PRIOR_STATE_FAMILY_SD = 0.10
"""Prior σ of a model-state family's deviation from the global states factor."""
PRIOR_OFFSET_SD_GIB = 1.0
"""Prior σ of the offset between a measured peak and the allocator's bytes."""
PEAK_NOISE = 0.02
"""Relative σ of a measured peak (allocator rounding, timing of the peak)."""
OOM_GAP = 0.03
"""An OOM below a need that fitted: its family's factor rises until its need is this much
above that need."""
ROW_SD = 0.03
"""Relative σ of a layout's need around the fit: what the fit's terms cannot see (allocator
fragmentation growing with the pipeline and recompute, per-layout buffers)."""
PRIOR_LIMIT_SD_GIB = 4.0
"""σ of the model's limit before any OOM: the runtime reserve (CUDA context, NCCL buffers per
communicator) and allocator fragmentation never show in a measured peak, and clusters differ
by a few GiB in both."""
P_FIT = 0.5
"""Probability of fitting below which a layout is not proposed (the acquisition charges the
rest)."""
P_FIT_STEP = 0.15
"""How much more likely to fit a proposal must be per OOM the study has seen (`p_fit_needed`)."""
P_FIT_MAX = 0.95
"""The most `p_fit_needed` asks."""
GRID = 241
"""Points of the grid (±6 prior σ) the limit's posterior is held on."""
ROW_SD_WEIGHT = 2.0
"""Pseudo-misses of `ROW_SD` behind the learned relative σ of a layout's need (`row_sd`)."""
SAMPLES = 512
"""Draws of the need's parameters for the joint posterior with the limit."""
DRAWS = 256
"""(parameters, limit) pairs resampled from the joint posterior for `MemoryFit.p_fit`."""


@dataclasses.dataclass(frozen=True)
class MemoryParts:
    """Model memory of layouts (bytes): states + buffers, activations + logits, the recompute
    family and the model-state family (`state_family`; none: all ZeRO 0-2)."""

    fixed: np.ndarray
    activation: np.ndarray
    family: np.ndarray
    states: np.ndarray | None = None

    @classmethod
    def from_memory(cls, memory: MemoryEstimate, table: LayoutTable) -> MemoryParts:
        """From the memory estimate of `table`."""
        part = memory.parts
        fixed = part["weights"] + part["gradients"] + part["optimizer"] + part["buffers"]
        return cls(
            np.asarray(fixed, float),
            np.asarray(part["activations"] + part["logits"], float),
            np.asarray(table.recompute, int),
            state_family(table),
        )

    def memory_family(self) -> np.ndarray:
        """Memory family of each row: its recompute mode and model-state family (the
        corrections the fit has for it)."""
        codes: np.ndarray = self.family * STATE_FAMILIES + self.state_codes()
        return codes

    def state_codes(self) -> np.ndarray:
        """Model-state family of each row (0 where none is given)."""
        if self.states is None:
            return np.zeros(len(self.fixed), dtype=int)
        return self.states

    def take(self, index: np.ndarray) -> MemoryParts:
        """The rows selected by `index`."""
        return MemoryParts(self.fixed[index], self.activation[index], self.family[index],
                           self.state_codes()[index])

    def design(self) -> np.ndarray:
        """Regressors in GiB: activation, activation per recompute family, states, states per
        state family, 1 (the offset)."""
        a, b = self.activation / GIB, self.fixed / GIB
        per_family = [a * (self.family == f) for f in range(FAMILIES)]
        codes = self.state_codes()
        per_state = [b * (codes == f) for f in range(STATE_FAMILIES)]
        return np.column_stack([a, *per_family, b, *per_state, np.ones_like(a)])


def state_family(table: LayoutTable) -> np.ndarray:
    """0: ZeRO 0-2 with the states on the device, 1: ZeRO-3, 2: anything offloaded."""
    codes: np.ndarray = np.where(np.asarray(table.offload) >= 1, 2,
                                 np.where(np.asarray(table.zero) >= 3, 1, 0))
    return codes


@dataclasses.dataclass(frozen=True)
class MemoryFit:
    """The corrected memory model and the learned limit."""

    mean: np.ndarray
    """Posterior mean: [global activation factor, recompute family deviations..., states
    deviation, state family deviations..., offset GiB]."""
    cov: np.ndarray
    limit_bytes: float
    """Posterior mean of the limit (the largest need that fits, on the measured scale)."""
    reserve_bytes: float
    """Device memory minus the limit, on the allocator's scale: the fitted runtime reserve."""
    measured: int
    oom: int
    limit_sd_bytes: float = 0.0
    """Posterior σ of the limit."""
    limits_gib: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    """Grid of the limit (GiB) its posterior is held on."""
    weights: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    """Posterior probability of each grid point."""
    row_sd: float = ROW_SD
    """Relative σ a layout's need misses by where its memory family has a measured peak
    (`ROW_SD`, or learned by `row_sd`)."""
    family_sd: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    """Relative σ a layout's need misses by, per memory family (`MemoryParts.memory_family`;
    `row_sd`); empty: `row_sd` for every layout."""
    draws: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros((0, 0)))
    """Joint posterior draws of the need's parameters (rows: `mean`'s order)."""
    limit_draws_gib: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0))
    """The limit (GiB) of each of `draws`."""

    def need(self, parts: MemoryParts) -> tuple[np.ndarray, np.ndarray]:
        """Predicted need (bytes, on the measured scale) and its predictive σ."""
        x = parts.design()
        mean = parts.fixed + (x @ self.mean) * GIB
        sd = np.sqrt(np.einsum("ij,jk,ik->i", x, self.cov, x)) * GIB
        return mean, sd

    def miss_sd(self, parts: MemoryParts) -> np.ndarray:
        """Relative σ each layout's need misses by: its memory family's `family_sd`
        (`row_sd` where none is given)."""
        if not len(self.family_sd):
            return np.full(len(parts.fixed), self.row_sd)
        sd: np.ndarray = self.family_sd[parts.memory_family()]
        return sd

    def p_fit(self, parts: MemoryParts) -> np.ndarray:
        """Probability that each layout fits: its need (each joint draw of the parameters and
        the limit, and the `miss_sd` it misses by) below the limit."""
        x = parts.design()
        miss = self.miss_sd(parts)
        p: np.ndarray = np.zeros(len(x))
        for start in range(0, len(x), 2048):
            rows = slice(start, start + 2048)
            need = parts.fixed[rows, None] / GIB + x[rows] @ self.draws.T
            sd = miss[rows, None] * np.maximum(need, 1e-3)
            p[rows] = ndtr((self.limit_draws_gib[None, :] - need) / sd).mean(axis=1)
        return p

    def p_fit_beside_oom(self, parts: MemoryParts, oom: MemoryParts) -> np.ndarray:
        """Probability that each layout fits given that `oom` (one layout of the same grid,
        the same shard of states and buffers) ran out of memory: the row's miss is shared
        with its neighbour (r: one draw of N(0, `row_sd`) for both), so a layout needing
        as much or more runs out too (p 0) and one needing a little less fits only where the
        shared miss falls between the two, P(L/n_oom − 1 < r < L/n − 1) / P(r > L/n_oom − 1),
        averaged over the joint draws of the parameters and the limit."""
        x = parts.design()
        need = parts.fixed[:, None] / GIB + x @ self.draws.T
        n_oom = oom.fixed[0] / GIB + oom.design()[0] @ self.draws.T
        low = (self.limit_draws_gib / n_oom - 1) / self.row_sd
        high = (self.limit_draws_gib[None, :] / np.maximum(need, 1e-3) - 1) / self.row_sd
        both = np.maximum(ndtr(high) - ndtr(low)[None, :], 0.0).mean(axis=1)
        p: np.ndarray = np.clip(both / max(float((1 - ndtr(low)).mean()), 1e-12), 0.0, 1.0)
        return p

    def fits(self, parts: MemoryParts, p: float = P_FIT) -> np.ndarray:
        """True where the probability of fitting is at least `p`."""
        fits: np.ndarray = self.p_fit(parts) >= p
        return fits

    def factors(self) -> list[float]:
        """Activation factor of each recompute family (none, selective, full)."""
        return [float(self.mean[0] + self.mean[1 + f]) for f in range(FAMILIES)]

    def state_factors(self) -> list[float]:
        """Model-states factor of each state family (ZeRO 0-2, ZeRO-3, offload)."""
        return [float(1 + self.mean[1 + FAMILIES] + self.mean[2 + FAMILIES + f])
                for f in range(STATE_FAMILIES)]

    def describe(self) -> str:
        """One line for the log."""
        factors = ", ".join(f"{f:.2f}" for f in self.factors())
        states = ", ".join(f"{f:.2f}" for f in self.state_factors())
        return (
            f"activation factor (none, selective, full recompute) {factors}; states factor "
            f"(ZeRO 0-2, ZeRO-3, offload) {states}; limit "
            f"{self.limit_bytes / GIB:.1f} ± {self.limit_sd_bytes / GIB:.1f} GiB, runtime "
            f"reserve {self.reserve_bytes / GIB:.1f} GiB ({self.measured} measured peaks, "
            f"{self.oom} OOM)"
        )

    def to_dict(self) -> dict[str, float | list[float]]:
        """JSON form (a trial attribute)."""
        return {
            "activation_factors": [round(f, 4) for f in self.factors()],
            "state_factors": [round(f, 4) for f in self.state_factors()],
            "offset_gib": round(float(self.mean[-1]), 4),
            "limit_gib": round(self.limit_bytes / GIB, 3),
            "limit_sd_gib": round(self.limit_sd_bytes / GIB, 3),
            "reserve_gib": round(self.reserve_bytes / GIB, 3),
            "row_sd": round(self.row_sd, 4),
        }


def fit_memory(
    cfg: AutotuneConfig,
    k: Constants,
    parts: MemoryParts,
    status: np.ndarray,
    peak: np.ndarray,
    row_sd: float = ROW_SD,
    joint: bool = True,
    family_sd: np.ndarray | None = None,
) -> MemoryFit:
    """Fit the correction to trials (`parts` of their layouts, `status`, measured `peak` or nan).

    `ok` trials with a peak enter the regression and say the limit is above their peak; `ok`
    trials without one say their need fitted; `oom` trials say theirs did not. `row_sd` is the
    relative σ of a new layout's need, `family_sd` the same per memory family (None: `row_sd`
    for all; both from `row_sd`). `joint`: the OOMs weigh the parameters too
    (the joint posterior `p_fit` draws from); without it only the measured peaks do.
    """
    prior_mean = np.zeros(FAMILIES + STATE_FAMILIES + 3)
    prior_mean[0] = 1.0
    prior_sd = np.array([PRIOR_SCALE_SD, *[PRIOR_FAMILY_SD] * FAMILIES, PRIOR_STATES_SD,
                         *[PRIOR_STATE_FAMILY_SD] * STATE_FAMILIES, PRIOR_OFFSET_SD_GIB])
    precision = np.diag(1 / prior_sd**2)
    shift = precision @ prior_mean
    measured = (status == "ok") & np.isfinite(peak) & (peak > 0)
    if measured.any():
        rows = parts.take(measured)
        x = rows.design()
        y = (peak[measured] - rows.fixed) / GIB
        weight = 1 / (ROW_SD * peak[measured] / GIB) ** 2
        precision = precision + x.T @ (weight[:, None] * x)
        shift = shift + x.T @ (weight * y)
    cov = np.linalg.inv(precision)
    mean = cov @ shift
    fit = MemoryFit(mean, cov, 0.0, 0.0, int(measured.sum()), int((status == "oom").sum()),
                    row_sd=row_sd, family_sd=np.zeros(0) if family_sd is None else family_sd)
    offset = float(mean[-1])
    oom = np.flatnonzero(status == "oom")
    if measured.any() and len(oom):  # an OOM below a level that fitted: its need is above it
        mean = raise_below_level(fit, parts, oom, measured, float(peak[measured].max()) / GIB)
        fit = dataclasses.replace(fit, mean=mean)
    base = (usable_gpu_bytes(cfg, k) - k.runtime_memory_gib * GIB) / GIB + offset
    grid = base + PRIOR_LIMIT_SD_GIB * np.linspace(-6.0, 6.0, GRID)
    log_p = -0.5 * ((grid - base) / PRIOR_LIMIT_SD_GIB) ** 2
    for i in np.flatnonzero(measured):
        level = peak[i] / GIB
        log_p += log_ndtr((grid - level) / (PEAK_NOISE * level))
    # draws of the parameters (common random numbers: the same draws for every call), each
    # weighted jointly with the limit by the censored trials; a censored trial's need misses
    # by its peak's noise and by what its layout misses by (`MemoryFit.miss_sd`, the σ
    # `p_fit` charged it before it ran), so an OOM of a family the model predicts badly says
    # less about the limit every layout shares
    epsilon = np.random.default_rng(0).standard_normal((SAMPLES, len(mean)))
    theta = fit.mean + epsilon @ np.linalg.cholesky(cov).T
    censored = np.flatnonzero(status == "oom"), np.flatnonzero((status == "ok") & ~measured)
    log_w = np.broadcast_to(log_p, (SAMPLES, GRID)).copy()
    if joint:
        miss = np.hypot(PEAK_NOISE, fit.miss_sd(parts))
        for sign, rows_i in zip((1.0, -1.0), censored, strict=True):
            for i in rows_i:
                row = parts.take(np.array([i]))
                need_i = (row.fixed[0] / GIB + theta @ row.design()[0])[:, None]
                log_w += log_ndtr(sign * (need_i - grid[None, :]) / (miss[i] * need_i))
    else:
        need_all, sd_all = fit.need(parts)
        for sign, rows_i in zip((1.0, -1.0), censored, strict=True):
            for i in rows_i:
                n_i, s_i = need_all[i] / GIB, np.hypot(sd_all[i] / GIB, PEAK_NOISE * need_all[i]
                                                       / GIB)
                log_w += log_ndtr(sign * (n_i - grid) / s_i)
    w = np.exp(log_w - log_w.max())
    w /= w.sum()
    weights = w.sum(axis=0)
    limit = float(weights @ grid)
    limit_sd = float(np.sqrt(weights @ (grid - limit) ** 2))
    by_draw = w.sum(axis=1)
    post_mean = by_draw @ theta
    post_cov = ((theta - post_mean).T * by_draw) @ (theta - post_mean)
    pick = np.random.default_rng(1).choice(w.size, size=DRAWS, p=w.ravel())
    reserve = cfg.cluster.gpu.memory_bytes - (limit - offset) * GIB
    return dataclasses.replace(fit, mean=post_mean if joint else fit.mean,
                               cov=post_cov if joint else cov, limit_bytes=limit * GIB,
                               reserve_bytes=reserve, limit_sd_bytes=limit_sd * GIB,
                               limits_gib=grid, weights=weights, row_sd=row_sd,
                               family_sd=np.zeros(0) if family_sd is None else family_sd,
                               draws=theta[pick // GRID], limit_draws_gib=grid[pick % GRID])


def raise_below_level(fit: MemoryFit, parts: MemoryParts, oom: np.ndarray,
                      measured: np.ndarray, level_gib: float) -> np.ndarray:
    """The need's parameters after each OOM below `level_gib` (a peak that fitted, so the
    limit is above it): its need must be `OOM_GAP` above that level. The deficit is the
    shared parameters' in the share of the need's variance they hold (the Gaussian update's
    gain, v / (v + m²), v the need's variance from the parameters, m its own miss,
    `MemoryFit.miss_sd`) and the layout's own miss in the rest, which only its grid shares
    (`MemoryFit.p_fit_beside_oom`); `oom_states_share` splits the shared part between its
    state family's and its recompute mode's factors."""
    mean = fit.mean.copy()
    rows = parts.take(oom)
    need, sd = fit.need(rows)
    miss = fit.miss_sd(rows) * need
    codes = parts.state_codes()
    target = level_gib / (1 - OOM_GAP)
    for j, i in enumerate(oom):
        gain = sd[j] ** 2 / (sd[j] ** 2 + miss[j] ** 2)
        deficit = gain * (target - need[j] / GIB)
        if deficit <= 0:
            continue
        share = oom_states_share(parts.family[i] in parts.family[measured],
                                 codes[i] in codes[measured], parts.activation[i] > 0)
        a, b = 1 + int(parts.family[i]), 2 + FAMILIES + int(codes[i])
        mean[a] = max(mean[a], fit.mean[a] + (1 - share) * deficit * GIB
                      / max(float(parts.activation[i]), 1.0))
        mean[b] = max(mean[b], fit.mean[b] + share * deficit * GIB
                      / max(float(parts.fixed[i]), 1.0))
    return mean


def oom_states_share(recompute_measured: bool, states_measured: bool,
                     has_activations: bool) -> float:
    """The share of an OOM's missing memory (below a peak that fitted) its model-state
    family takes; its recompute mode's activations take the rest. The family without a
    measured peak is the likelier culprit: an offloaded layout that runs out beside measured
    peaks of its recompute mode says the offload's staging buffers are larger, not that the
    activations are (its neighbours without recompute would run out too); where both or
    neither have a peak, half each."""
    if not has_activations:
        return 1.0
    if recompute_measured == states_measured:
        return 0.5
    return 1.0 if recompute_measured else 0.0


def p_fit_needed(base: float, ooms: int) -> float:
    """The probability of fitting a proposal needs after `ooms` OOM trials: each OOM shows the
    memory model (and its σ) missing on this cluster, and the next layout at the edge is the
    one the acquisition likes most (the fastest that may fit), so without a rising bar the
    search walks down the edge an OOM at a time."""
    return min(P_FIT_MAX, base + P_FIT_STEP * ooms)


def row_sd(
    cfg: AutotuneConfig,
    k: Constants,
    parts: MemoryParts,
    status: np.ndarray,
    peak: np.ndarray,
) -> tuple[float, np.ndarray]:
    """Relative σ of a layout's need, learned from the trials (in order): each measured peak's
    log miss against the need the fit to the trials before it predicted (prequential, so
    out of sample). `ROW_SD_WEIGHT` pseudo-misses of `ROW_SD` are behind the first two σ:

    - within: the misses of peaks whose memory family (`MemoryParts.memory_family`) had a
      measured peak before them (what a layout misses by once its family is fitted);
    - first: the misses of each family's first peak (what an unmeasured family misses by);
    - per family (the second value, indexed by memory family): a measured family's own
      misses with `ROW_SD_WEIGHT` pseudo-misses of the within σ, an unmeasured family the
      larger of within and first.

    An OOM is a censored miss (`_shrunk`): every peak that fitted is below the limit, so its
    need missed by at least log(the highest such peak / what the trials before it
    predicted), and it counts in the same σ as a peak of its family would.

    A ZeRO-3 peak 33 % above the prior need says its untried neighbours and the untried
    families may miss by that much, not that a ZeRO-1 layout beside a ZeRO-1 peak the model
    predicted within 5 % does."""
    misses: list[float] = []
    firsts: list[bool] = []
    families = parts.memory_family()
    measured = (status == "ok") & np.isfinite(peak) & (peak > 0)
    # an OOM's miss is censored: its need was above the limit, which is above every peak
    # that fitted, so it missed by at least log(that level / what the trials before it
    # predicted)
    censored = (status == "oom") & measured.any()
    level = float(peak[measured].max()) if measured.any() else np.nan
    for j in np.flatnonzero(measured | censored):
        before = np.arange(j)
        fit = fit_memory(cfg, k, parts.take(before), status[before], peak[before],
                         joint=False)
        need, _ = fit.need(parts.take(np.array([j])))
        misses.append(float(np.log((peak[j] if measured[j] else level) / need[0])))
        firsts.append(families[j] not in families[before][measured[before]])
    miss, first = np.array(misses), np.array(firsts, dtype=bool)
    lower = censored[measured | censored]
    trial_families = families[measured | censored]
    within = _shrunk(miss[~first], ROW_SD, lower[~first])
    unmeasured = max(within, _shrunk(miss[first], ROW_SD, lower[first]))
    per_family = np.full(FAMILIES * STATE_FAMILIES, unmeasured)
    for f in np.unique(trial_families):
        mine = trial_families == f
        prior = within if (families[measured] == f).any() else unmeasured
        per_family[f] = _shrunk(miss[mine], prior, lower[mine])
    return within, per_family


def _shrunk(misses: np.ndarray, prior: float, censored: np.ndarray | None = None) -> float:
    """RMS of log `misses` with `ROW_SD_WEIGHT` pseudo-misses of `prior`; where `censored`,
    the miss is only known to be above the value (an OOM), and counts by its expected square
    given that (E[r² | r > b] = σ² (1 + z λ(z)), z = b / σ, λ the inverse Mills ratio),
    σ solved by fixed-point iteration (expectation-maximisation for a censored normal)."""
    lower = np.zeros(len(misses), dtype=bool) if censored is None else censored
    exact, bound = misses[~lower], misses[lower]
    total = float(np.sum(np.square(exact))) + ROW_SD_WEIGHT * prior**2
    count = len(misses) + ROW_SD_WEIGHT
    sd = float(np.sqrt(total / (len(exact) + ROW_SD_WEIGHT)))
    for _ in range(50 if len(bound) else 0):
        z = bound / sd
        mills = np.exp(-0.5 * z**2 - 0.5 * np.log(2 * np.pi) - log_ndtr(-z))
        sd = float(np.sqrt((total + sd**2 * float(np.sum(1 + z * mills))) / count))
    return sd
