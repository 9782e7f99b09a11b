"""Which term of the step-time model is wrong: one scale per term, fitted to measured trials.

The physical constants (`autotune.calibration.fit.fit_trials`) move every layout together: a
slower GEMM or network changes all of them. What they cannot say is that one *term* is off, e.g.
a pipeline's fill and drain costing 1.5x the 1F1B bubble or ZeRO-3's gathers running at half
the modelled rate; one global factor cannot either. So after the constants fit, each term of
`autotune.costmodel.step_time.TIME_PARTS` (grouped into `TERMS`) gets a multiplicative scale
s_t with a log-normal prior around 1 (σ `TERM_PRIOR_SD`), fitted by maximum a posteriori to
the trials' log step times (σ `autotune.calibration.fit.STEP_SD`), and, where a runner
recorded one, to the measured seconds of each part (σ `BREAKDOWN_SD`):

    step ≈ Σ_t s_t · term_t(layout)

A term's scale is fitted only where the trials can tell it from the others: a measured breakdown
names it, or its share of the step varies across the trials by `MIN_SHARE_SPREAD` or more. A
term whose share is (nearly) the same in every trial cannot be told from compute or from the
physical constants fitted before (both move every trial alike), so it keeps its prior: without
a pipelined trial the pipeline's scale stays at 1 ± `TERM_PRIOR_SD`, and one trial alone fits
no scale (the constants fit owns the level). The Laplace approximation
(Gauss-Newton at the optimum) gives the scales' covariance and, by the delta method, every
layout's σ of log step time; `TermFit.draws` samples the joint posterior.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from collections.abc import Sequence

import numpy as np
from scipy.optimize import least_squares

from autotune.calibration.fit import STEP_SD

TERMS: dict[str, tuple[str, ...]] = {
    "compute": ("compute", "optimizer"),
    "tp_comm": ("tp_comm",),
    "cp_comm": ("cp_comm",),
    "ep_comm": ("ep_comm",),
    "pipeline": ("pp_bubble", "pp_p2p"),
    "dp_comm": ("dp_comm",),
    "zero3_gather": ("zero3_gather",),
    "offload": ("offload",),
}
"""Terms whose scales are fitted, and the step-time parts each one sums."""
TERM_PRIOR_SD = 0.5
"""Prior σ of a term's log scale: a term may be off by about 1.65x at one σ (a NIC at half
rate, attention at half the assumed efficiency)."""
BREAKDOWN_SD = 0.05
"""σ of a measured part's log seconds against its scaled model (timer and attribution error)."""
SCALE_BOUNDS = (np.log(0.2), np.log(5.0))
"""A term scale stays within 0.2x-5x."""
MIN_SHARE_SPREAD = 0.05
"""A term's share of the step must differ by this much between two trials (max - min) for the
trials to fit its scale."""


def term_seconds(parts: Mapping[str, np.ndarray]) -> np.ndarray:
    """(rows, terms) seconds of each term from `estimate_time`'s parts."""
    return np.column_stack([sum(np.asarray(parts[p], float) for p in names)
                            for names in TERMS.values()])


def breakdown_seconds(breakdowns: Sequence[Mapping[str, float] | None]) -> np.ndarray:
    """(trials, terms) measured seconds per term, nan where a trial recorded no breakdown or
    none of a term's parts (part names of `TIME_PARTS`; a term sums the parts it has)."""
    out = np.full((len(breakdowns), len(TERMS)), np.nan)
    for i, parts in enumerate(breakdowns):
        if not parts:
            continue
        for j, names in enumerate(TERMS.values()):
            known = [float(parts[p]) for p in names if p in parts]
            if known:
                out[i, j] = sum(known)
    return out


@dataclasses.dataclass(frozen=True)
class TermFit:
    """The fitted term scales (log), their covariance and the trials behind them."""

    log_scale: np.ndarray
    cov: np.ndarray
    trials: int

    def scales(self) -> dict[str, float]:
        """Each term's fitted factor on the model's seconds."""
        return {name: float(np.exp(x)) for name, x in zip(TERMS, self.log_scale, strict=True)}

    def sd(self) -> dict[str, float]:
        """Each term's posterior σ of its log scale (TERM_PRIOR_SD where no trial informs it)."""
        return {name: float(np.sqrt(v)) for name, v in zip(TERMS, np.diag(self.cov),
                                                            strict=True)}

    def step_s(self, terms: np.ndarray) -> np.ndarray:
        """Corrected step time of rows with term seconds `terms`."""
        return np.asarray(terms @ np.exp(self.log_scale), float)

    def log_step_sd(self, terms: np.ndarray) -> np.ndarray:
        """σ of each row's log step time from the scales' uncertainty (delta method)."""
        scaled = terms * np.exp(self.log_scale)
        grad = scaled / scaled.sum(1, keepdims=True)
        var = np.einsum("ij,jk,ik->i", grad, self.cov, grad)
        return np.asarray(np.sqrt(np.maximum(var, 0.0)), float)

    def draws(self, terms: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
        """(n, rows) log step times under n draws of the scales from the posterior."""
        x = rng.multivariate_normal(self.log_scale, self.cov, size=n, method="cholesky")
        return np.asarray(np.log(np.exp(x) @ terms.T), float)


def prior_fit() -> TermFit:
    """The scales before any trial: 1, each with σ TERM_PRIOR_SD."""
    return TermFit(np.zeros(len(TERMS)), np.eye(len(TERMS)) * TERM_PRIOR_SD**2, 0)


def fit_terms(
    terms: np.ndarray,
    step_s: np.ndarray,
    breakdown: np.ndarray | None = None,
    *,
    prior_sd: float = TERM_PRIOR_SD,
    step_sd: float = STEP_SD,
    clip: float | None = None,
) -> TermFit:
    """Maximum a posteriori term scales for trials with model term seconds `terms` (trials ×
    terms, from `term_seconds`), measured `step_s`, and optional measured `breakdown` seconds
    (from `breakdown_seconds`, nan where absent). Gaussian errors in log space; only the
    `identifiable` scales are fitted (the others keep their prior); with `clip`, a residual
    beyond `clip` σ pulls no harder than one at `clip` σ (Huber loss, as `fit_trials`); the
    covariance is the inverse Gauss-Newton Hessian at the optimum."""
    if not len(step_s):
        return prior_fit()
    measured = np.log(np.asarray(step_s, float))
    parts = np.zeros_like(terms) if breakdown is None else np.asarray(breakdown, float)
    usable = np.isfinite(parts) & (parts > 0) & (terms > 0)
    free = identifiable(terms, usable)
    n = terms.shape[1]
    if not free.any():
        return TermFit(np.zeros(n), np.eye(n) * prior_sd**2, len(step_s))
    rows, cols = np.nonzero(usable[:, free])
    logged = np.log(np.where(usable, parts, 1.0))[:, free][rows, cols]
    model_parts = np.log(np.where(usable, terms, 1.0))[:, free][rows, cols]

    def full(x: np.ndarray) -> np.ndarray:
        out = np.zeros(n)
        out[free] = x
        return out

    def residuals(x: np.ndarray) -> np.ndarray:
        total = np.log(terms @ np.exp(full(x)))
        return np.concatenate([(total - measured) / step_sd,
                               (model_parts + x[cols] - logged) / BREAKDOWN_SD,
                               x / prior_sd])

    m = int(free.sum())
    fit = least_squares(residuals, np.zeros(m), bounds=(np.full(m, SCALE_BOUNDS[0]),
                                                        np.full(m, SCALE_BOUNDS[1])),
                        loss="linear" if clip is None else "huber",
                        f_scale=1.0 if clip is None else clip)
    jac = np.asarray(fit.jac, float)
    cov = np.eye(n) * prior_sd**2
    cov[np.ix_(free, free)] = np.linalg.inv(jac.T @ jac + 1e-12 * np.eye(m))
    return TermFit(full(np.asarray(fit.x, float)), (cov + cov.T) / 2, len(step_s))


def identifiable(terms: np.ndarray, measured: np.ndarray | None = None) -> np.ndarray:
    """Terms the trials can fit: a measured part (`measured`, trials × terms) or a share of
    the step that differs by `MIN_SHARE_SPREAD` or more between trials."""
    share = terms / np.maximum(terms.sum(1, keepdims=True), 1e-30)
    varies: np.ndarray = (share.max(0) - share.min(0)) >= MIN_SHARE_SPREAD
    if measured is not None:
        varies |= measured.any(0)
    return varies
