"""How wrong the model is where nothing was measured: a Gaussian process on its residuals.

The residual of a measured layout is log(measured step time / modelled step time). A Gaussian
process over the layout's structure (every searched dimension of `autotune.layout.DIMS`:
log2 of tp, pp, cp, vpp, micro-batch, ep and etp, ZeRO stage, offload, recompute, sequence
parallelism; squared-exponential kernel, one length scale per dimension) spreads each residual
to similar layouts: layouts of a measured family (same tp·pp·cp·ep·etp, recompute and ZeRO
stage) inherit its correction with little uncertainty, another expert split (ep, etp) of it
much of it, while an
unmeasured family keeps the prior uncertainty. That prior σ (`amplitude`) is learned from the
search's own out-of-sample errors: how far each trial ran from what the trials before it
predicted (shrunk towards 10 %). The residuals after the refit cannot say it (the refit has
absorbed them), so a model that keeps missing widens the search; once three errors are known,
a gross miss is winsorized at `CLIP` robust σ (Huber 1964), so one layout that ran 6x slower
than predicted does not hold every unmeasured family at ±50 % for the rest of the study.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from autotune.layout import DIMS
from autotune.layout import LayoutTable

FEATURES = tuple(d for d in DIMS if d.kind != "derived")
"""The kernel's inputs: every searched dimension of `autotune.layout.DIMS` (log2 where the
table says so), ep and etp included so MoE layouts are told apart."""
LENGTH_SCALES = np.array([{"mbs": 1.5, "vpp": 2.0, "ep": 3.0, "etp": 3.0}.get(d.name, 1.0)
                          for d in FEATURES])
"""Per feature (log2 steps for the log-scaled): 1; 1.5 for the micro-batch and 2 for vpp
(refinements within a family: a measured family's other vpp and mbs share its residual); 3
for ep and etp, the families' second level (`autotune.search.proposal.family_keys`): the
expert split changes only the MoE layers' expert shards and token dispatch, so another
(ep, etp) of a measured grid, recompute and ZeRO family shares much of its residual (ep 1,
etp 8 against ep 8, etp 1 at correlation 0.37; at a length scale of 1, 1.2e-4, and the
search ran every split of a grid as a family of its own)."""
ZERO_POSITION = np.array([0.0, 1.0, 1.5, 4.0])
"""Where each ZeRO stage sits on its axis: stages 1 and 2 shard the optimizer and gradients
(close to each other and to 0), stage 3 gathers the parameters every layer, another algorithm
(corr. 0.04 with stage 2), so a slow ZeRO-3 trial says little about ZeRO-2."""
PRIOR_SD = 0.10
"""Prior σ of the log residual (the model within ~10 % before any trial)."""
PRIOR_WEIGHT = 2.0
"""Pseudo-observations behind PRIOR_SD when the σ is re-estimated."""
MIN_NOISE = 0.01
"""Floor of a measurement's relative noise."""
CLIP = 2.5
"""Errors beyond this many robust σ (1.4826 · median |error|, at least `PRIOR_SD`) are
winsorized there (Huber 1964): one gross miss is one layout's residual, not every family's
uncertainty."""
ROBUST_MIN = 3
"""Errors needed before they are winsorized (a median of fewer says nothing)."""


def features(t: LayoutTable) -> np.ndarray:
    """Kernel inputs of every row, divided by the length scales."""
    columns = [np.log2(getattr(t, d.name)) if d.log_scaled
               else ZERO_POSITION[t.zero] if d.name == "zero" else getattr(t, d.name)
               for d in FEATURES]
    scaled: np.ndarray = np.column_stack(columns).astype(float) / LENGTH_SCALES
    return scaled


TREND = 0.15**2
"""Prior variance (over the squared σ) of the residual's slope per length scale: a linear
kernel on the centred inputs beside the squared exponential, so residuals that fall along a
dimension (slower than modelled the larger tp is) carry on past the measured values."""


def _kernel(a: np.ndarray, b: np.ndarray, centre: np.ndarray) -> np.ndarray:
    squared = (a * a).sum(1)[:, None] + (b * b).sum(1)[None, :] - 2 * a @ b.T
    kernel: np.ndarray = np.exp(-0.5 * np.maximum(squared, 0.0)) + TREND * (
        (a - centre) @ (b - centre).T)
    return kernel


@dataclasses.dataclass(frozen=True)
class Residuals:
    """The fitted process: predicts the log residual of any layout, with its σ."""

    x: np.ndarray
    weights: np.ndarray
    factor: np.ndarray
    """Cholesky factor of the observed covariance."""
    mean: float
    sd: float
    centre: np.ndarray
    """Where the linear kernel is centred: the mean of the observed inputs."""

    def predict(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and σ of the log residual at kernel inputs `x`."""
        if not len(self.x):
            return np.full(len(x), self.mean), np.full(len(x), self.sd)
        cross = self.sd**2 * _kernel(x, self.x, self.centre)
        mean = self.mean + cross @ self.weights
        solved = np.linalg.solve(self.factor, cross.T)
        prior = 1.0 + TREND * ((x - self.centre) ** 2).sum(1)
        var = self.sd**2 * prior - (solved * solved).sum(0)
        return mean, np.sqrt(np.maximum(var, 0.0))

    def covariance(self, x: np.ndarray) -> np.ndarray:
        """Posterior covariance of the log residuals at kernel inputs `x` (joint draws)."""
        prior: np.ndarray = self.sd**2 * _kernel(x, x, self.centre)
        if not len(self.x):
            return prior
        solved = np.linalg.solve(self.factor, self.sd**2 * _kernel(x, self.x, self.centre).T)
        posterior: np.ndarray = prior - solved.T @ solved
        return posterior


def amplitude(errors: np.ndarray) -> float:
    """Prior σ of the log residual from out-of-sample log errors (each trial against the
    prediction made before it ran), `winsorized`, with `PRIOR_WEIGHT` pseudo-errors of
    `PRIOR_SD`."""
    errors = winsorized(np.asarray(errors, float))
    return float(np.sqrt(((errors**2).sum() + PRIOR_WEIGHT * PRIOR_SD**2)
                         / (len(errors) + PRIOR_WEIGHT)))


def winsorized(errors: np.ndarray) -> np.ndarray:
    """`errors` clipped at `CLIP` robust σ once there are `ROBUST_MIN` of them."""
    if len(errors) < ROBUST_MIN:
        return errors
    scale = max(PRIOR_SD, 1.4826 * float(np.median(np.abs(errors))))
    clipped: np.ndarray = np.clip(errors, -CLIP * scale, CLIP * scale)
    return clipped


def fit_residuals(x: np.ndarray, residual: np.ndarray, noise: np.ndarray,
                  sd: float | None = None) -> Residuals:
    """Fit to observed kernel inputs `x`, log residuals and relative measurement noise; `sd`
    is the prior σ (`amplitude`; None: from the residuals themselves). The process's level
    is the median of the residuals and one pseudo-residual of 0 (shrunk towards 0; Huber
    1964: the median's breakdown point is one half), so one layout missed by 6x does not move
    every unmeasured layout, while a level most trials agree on reaches the unmeasured ones."""
    n = len(residual)
    if not n:
        return Residuals(x, np.zeros(0), np.zeros((0, 0)), 0.0, PRIOR_SD if sd is None else sd,
                         np.zeros(x.shape[1]))
    mean = float(np.median(np.append(residual, 0.0)))
    if sd is None:
        sd = amplitude(residual - mean)
    noise = np.maximum(noise, MIN_NOISE)
    centre = x.mean(0)
    cov = sd**2 * _kernel(x, x, centre) + np.diag(noise**2)
    factor = np.linalg.cholesky(cov)
    weights = np.linalg.solve(factor.T, np.linalg.solve(factor, residual - mean))
    return Residuals(x, weights, factor, mean, sd, centre)
