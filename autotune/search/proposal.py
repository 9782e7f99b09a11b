"""Which feasible layout to measure next, from the trials so far (no Optuna here).

Every proposal is an untried row of the enumerated feasible table (so no rule-rejected point and
no layout twice) that the memory model, corrected by the trials, finds at least `P_FIT` likely
to fit (`P_FIT_WARM` in the warm start; more after each OOM, `p_fit_needed`;
beside an OOM of its grid, `p_fit_beside_oom`); every score is
charged that probability (an OOM
measures nothing). What the
trials say about speed (`Proposer.belief`): the physical constants refitted to them
(`autotune.calibration.fit.fit_trials`), then one scale per term of the step time
(`autotune.calibration.term_scales`: compute, tp/cp/ep communication, pipeline, dp, ZeRO-3,
offload; a trial informs the terms it has), then a Gaussian process on what is left
(`autotune.search.surrogate`). Each row gets a mean log throughput and a σ from the scales'
posterior and the process. Among the rows that may run:

1. repeats first: with `repeat` > 1 a layout that ran fewer times (all ok) runs again;
2. warm start: the first `warm_start` trials each measure a new structural family (tp·pp·cp·ep
   factorisation, recompute, ZeRO family: replicated, sharded optimizer/gradients, sharded
   parameters): the best bound plus a bonus per factor whose value no trial has measured;
3. exploration, every `explore_every`-th trial: a family not measured yet that may plausibly
   beat the best (mean + `Z_EXPLORE` σ above it), drawn at random (seeded) with weights by
   expected improvement;
4. families before refinements: an unmeasured family whose interval (mean + `Z_OVERLAP` σ)
   reaches above the best measured layout by more than the noise gets a trial (the one of
   largest expected improvement) before another vpp or mbs of a measured family;
5. otherwise the largest expected improvement over the best measured throughput plus the
   noise, so layouts tied with a measured one within the noise are not worth a trial.

Ties (within the noise, `TIE`) are one choice: seed 0 takes the one most likely to fit, any
other seed draws among them, so different seeds run different trials. `Proposer.confidence` says
how likely an untried layout beats the winner by more than the noise (Monte Carlo over the
scales' posterior and the process, jointly over the most promising rows).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from collections.abc import Sequence
from typing import Any

import numpy as np
from scipy.stats import norm

from autotune.calibration.fit import STEP_SD
from autotune.calibration.fit import fit_trials
from autotune.calibration.term_scales import TERMS
from autotune.calibration.term_scales import TermFit
from autotune.calibration.term_scales import breakdown_seconds
from autotune.calibration.term_scales import fit_terms
from autotune.calibration.term_scales import prior_fit
from autotune.calibration.term_scales import term_seconds
from autotune.costmodel.constants import Constants
from autotune.costmodel.estimate import evaluate
from autotune.layout import DIMS
from autotune.layout import GRID_DIMS
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.search.memory_learning import P_FIT
from autotune.search.memory_learning import MemoryFit
from autotune.search.memory_learning import MemoryParts
from autotune.search.memory_learning import fit_memory
from autotune.search.memory_learning import p_fit_needed
from autotune.search.memory_learning import row_sd
from autotune.search.surrogate import CLIP
from autotune.search.surrogate import MIN_NOISE
from autotune.search.surrogate import Residuals
from autotune.search.surrogate import amplitude
from autotune.search.surrogate import features
from autotune.search.surrogate import fit_residuals
from autotune.specs import AutotuneConfig
from autotune.units import GIB

BETA = 1.0
"""Weight of the residual σ in the upper confidence bound."""
NOVELTY = 0.05
"""Warm start: bonus (log throughput) per structural factor whose value is not measured yet."""
Z_OVERLAP = 1.0
"""σ of a family's interval that must reach above the best measured layout (plus the noise)
for it to get a trial before refinements of measured families."""
Z_EXPLORE = 2.0
"""σ of a family's interval that must reach the best measured layout for exploration to draw
it (a family that cannot plausibly win is not worth an exploration turn)."""
TIE = 0.5
"""Rows whose bound is within this many noise σ of the best are one choice (the seed picks)."""
TIE_GAIN = 0.1
"""Rows whose expected improvement is within this fraction of the best are one choice."""
P_FIT_WARM = 0.8
"""Probability of fitting a warm-start trial needs (the limit is least known then)."""
EXPERT_DIMS = ("ep", "etp")
"""Grid dimensions that split only the experts: the families' second level (`family_keys`)."""
CONFIDENCE_ROWS = 200
"""Untried rows (the likeliest to win) drawn jointly by `Proposer.confidence`."""
CONFIDENCE_DRAWS = 1000
"""Monte Carlo draws of `Proposer.confidence`."""


@dataclasses.dataclass(frozen=True)
class Outcome:
    """A trial that ran: its layout, status and (when ok) what it measured."""

    layout: Layout
    status: str
    step_time_s: float | None = None
    peak_bytes: float | None = None
    spread: float | None = None
    breakdown: dict[str, float] | None = None
    """Measured seconds per step-time part (`TIME_PARTS` names), where the runner has them."""

    @classmethod
    def from_record(cls, attrs: Mapping[str, Any]) -> Outcome:
        """The outcome a trial's record (its Optuna user attributes) holds."""
        breakdown = attrs.get("breakdown")
        return cls(Layout(**attrs["layout_fields"]), str(attrs.get("status", "crash")),
                   attrs.get("measured_step_time_s"), attrs.get("measured_peak_memory_bytes"),
                   attrs.get("measured_step_time_spread"),
                   {str(k): float(v) for k, v in breakdown.items()
                    if isinstance(v, (int, float))} if isinstance(breakdown, dict) else None)


@dataclasses.dataclass(frozen=True)
class Proposal:
    """The next layout and why it was chosen."""

    layout: Layout
    reason: str
    """repeat, warm-start, explore or model."""
    predicted_tokens_per_s: float
    need_bytes: float
    """Memory need under the corrected model (on the measured scale)."""
    memory: MemoryFit

    def to_dict(self) -> dict[str, Any]:
        """JSON form (a trial attribute)."""
        return {
            "reason": self.reason,
            "layout_id": self.layout.id,
            "predicted_tokens_per_s": round(self.predicted_tokens_per_s, 3),
            "need_gib": round(self.need_bytes / GIB, 3),
            "memory": self.memory.to_dict(),
        }


def structure(t: LayoutTable, experts: bool = True) -> np.ndarray:
    """Integer codes per row of what makes a family, one column per factor: each grid
    dimension of `autotune.layout.DIMS` (tp, pp, cp, ep, etp; without `experts`, ep and etp
    left out), recompute and the ZeRO family (replicated, sharded optimizer/gradients, sharded
    parameters)."""
    zero_family = np.select([t.zero == 0, t.zero < 3], [0, 1], 2)
    columns = [getattr(t, d.name) if d.name != "zero" else zero_family
               for d in DIMS if d.kind in ("grid", "structure")
               and (experts or d.name not in EXPERT_DIMS)]
    return np.column_stack(columns)


def grid_keys(t: LayoutTable) -> np.ndarray:
    """An integer per row naming the memory neighbourhood of an OOM: the grid (tp, pp, cp, ep,
    etp), ZeRO stage and offload (the same shard of model states and the same buffers per
    GPU), and whether the pipeline interleaves (vpp > 1: the schedule's extra in-flight
    micro-batches and per-chunk buffers, a miss a layout without them does not share)."""
    columns = np.column_stack([*[getattr(t, name) for name in (*GRID_DIMS, "zero", "offload")],
                               np.asarray(t.vpp) > 1])
    return np.unique(columns, axis=0, return_inverse=True)[1].ravel()


def family_keys(t: LayoutTable, experts: bool = True) -> np.ndarray:
    """An integer per row naming its structural family (`structure`: tp, pp, cp, ep, etp,
    recompute, ZeRO family); with `experts` False, its expert-free family (ep and etp left
    out: every (ep, etp) split of one tp·pp·cp grid, recompute and ZeRO family is one)."""
    return np.unique(structure(t, experts), axis=0, return_inverse=True)[1].ravel()


@dataclasses.dataclass(frozen=True)
class Belief:
    """What the trials say about every feasible row's speed."""

    mean: np.ndarray
    """Expected log tokens/s."""
    sd: np.ndarray
    """Its σ: the term scales' posterior and the residual process together."""
    constants: Constants
    terms: TermFit
    process: Residuals
    best: float
    """Log tokens/s of the best measured layout (mean of its runs), -inf before any."""
    best_id: str | None
    noise: float
    """Relative noise of a measurement (the trials' spreads, at least `MIN_NOISE`)."""


@dataclasses.dataclass(frozen=True)
class Confidence:
    """How likely an untried layout beats the best measured one by more than the noise."""

    probability: float
    best_id: str | None
    noise: float
    untried: int
    term_scales: dict[str, float]

    def to_dict(self) -> dict[str, Any]:
        """JSON form (a study attribute, the report)."""
        return {"probability": round(self.probability, 4), "best_layout_id": self.best_id,
                "noise": round(self.noise, 4), "untried": self.untried,
                "term_scales": {k: round(v, 4) for k, v in self.term_scales.items()}}


class Proposer:
    """Chooses trials over one problem's feasible layouts."""

    def __init__(
        self,
        cfg: AutotuneConfig,
        feasible: LayoutTable,
        constants: Constants,
        *,
        seed: int | None = None,
        warm_start: int = 4,
        explore_every: int = 10,
        repeat: int = 1,
    ) -> None:
        self.cfg, self.feasible, self.base = cfg, feasible, constants
        self.warm_start, self.explore_every, self.repeat = warm_start, explore_every, repeat
        self.seed = seed
        self.rows = feasible.rows()
        self.index = {row.id: i for i, row in enumerate(self.rows)}
        self.structure = structure(feasible)
        self.family = family_keys(feasible)
        self.coarse = family_keys(feasible, experts=False)
        self.grid = grid_keys(feasible)
        self.x = features(feasible)
        values = evaluate(cfg, feasible, constants)
        self.parts = MemoryParts.from_memory(values.memory, feasible)
        self._fit_cache: tuple[int, Constants, np.ndarray] = (
            0, constants, term_seconds(values.time.parts)
        )
        self._memory_cache: tuple[Any, MemoryFit, np.ndarray] = (None, self.memory([]),
                                                                  np.zeros(0))
        self._prequential_cache: list[tuple[tuple[str, float | None], float]] = []
        self._constants_cache: dict[Any, Constants] = {}

    # --- what the trials say -----------------------------------------------------------------

    def fitted(self, ok: Sequence[Outcome]) -> tuple[Constants, np.ndarray]:
        """Constants refitted to the ok trials (`constants`) and the term seconds
        (`term_seconds`) of every feasible row under them."""
        k = self.constants(ok, self.prequential(ok))
        if self._fit_cache[1] is not k:
            terms = term_seconds(evaluate(self.cfg, self.feasible, k).time.parts)
            self._fit_cache = (len(ok), k, terms)
        return self._fit_cache[1], self._fit_cache[2]

    def constants(self, ok: Sequence[Outcome], errors: np.ndarray) -> Constants:
        """The physical constants fitted to the ok trials (`fit_trials`), each trial's error σ
        widened by the model's discrepancy (`amplitude` of the out-of-sample `errors`): a
        model that misses one layout by 2.7x has not shown that every layout runs 2.7x slower
        (Kennedy and O'Hagan 2001, calibration with a model discrepancy). Cached."""
        if not ok:
            return self.base
        step_sd = discrepant_sd(errors)
        key = (tuple((o.layout.id, o.step_time_s) for o in ok), round(step_sd, 9))
        if key not in self._constants_cache:
            self._constants_cache[key] = fit_trials(
                self.cfg, [o.layout for o in ok], [float(o.step_time_s or 0.0) for o in ok],
                self.base, step_sd=step_sd, clip=CLIP)
        return self._constants_cache[key]

    def memory(self, outcomes: Sequence[Outcome]) -> MemoryFit:
        """The memory correction fitted to every trial that ran."""
        if outcomes:
            table = LayoutTable.from_layouts([o.layout for o in outcomes])
            parts = MemoryParts.from_memory(evaluate(self.cfg, table, self.base).memory, table)
        else:
            parts = self.parts.take(np.zeros(0, dtype=int))
        status = np.array([o.status for o in outcomes], dtype=object)
        peak = np.array([o.peak_bytes or np.nan for o in outcomes], dtype=float)
        within, by_family = row_sd(self.cfg, self.base, parts, status, peak)
        return fit_memory(self.cfg, self.base, parts, status, peak, within,
                          family_sd=by_family)

    def belief(self, outcomes: Sequence[Outcome]) -> Belief:
        """Mean and σ of every row's log tokens/s: constants fit, term scales, residuals (their
        prior σ from the trials' out-of-sample errors, `prequential`)."""
        ok = [o for o in outcomes if o.status == "ok" and o.step_time_s]
        k, terms = self.fitted(ok)
        tokens = float(self.cfg.train.tokens_per_step)
        noise = max([MIN_NOISE, *(o.spread or 0.0 for o in ok)]) if ok else MIN_NOISE
        scales, process, _ = self._refit(ok, k, self.prequential(ok))
        best, best_id = -np.inf, None
        if ok:
            runs: dict[str, list[float]] = {}
            for o in ok:
                step = float(o.step_time_s or 1.0)
                runs.setdefault(o.layout.id, []).append(float(np.log(tokens / step)))
            best_id, best = max(((i, float(np.mean(v))) for i, v in runs.items()),
                                key=lambda pair: pair[1])
        gp_mean, gp_sd = process.predict(self.x)
        mean = np.log(tokens / scales.step_s(terms)) - gp_mean
        sd = np.hypot(gp_sd, scales.log_step_sd(terms))
        return Belief(mean, sd, k, scales, process, best, best_id, noise)

    def _refit(self, ok: Sequence[Outcome], k: Constants, errors: np.ndarray,
               extra: Sequence[Layout] = ()) -> tuple[TermFit, Residuals, np.ndarray]:
        """Term scales and residual process fitted to the ok trials under constants `k`, and
        the term seconds (under `k`) of the `extra` layouts."""
        table = LayoutTable.from_layouts([*(o.layout for o in ok), *extra])
        terms = term_seconds(evaluate(self.cfg, table, k).time.parts) if len(table) else \
            np.zeros((0, len(TERMS)))
        trial_terms, extra_terms = terms[:len(ok)], terms[len(ok):]
        if not ok:
            empty = fit_residuals(self.x[:0], np.zeros(0), np.zeros(0), amplitude(errors))
            return prior_fit(), empty, extra_terms
        steps = np.array([o.step_time_s for o in ok], dtype=float)
        scales = fit_terms(trial_terms, steps, breakdown_seconds([o.breakdown for o in ok]),
                           step_sd=discrepant_sd(errors), clip=CLIP)
        residual = np.log(steps / scales.step_s(trial_terms))
        spread = np.array([o.spread or 0.0 for o in ok])
        trial_table = LayoutTable.from_layouts([o.layout for o in ok])
        process = fit_residuals(features(trial_table), residual, spread, amplitude(errors))
        return scales, process, extra_terms

    def prequential(self, ok: Sequence[Outcome]) -> np.ndarray:
        """Log error, log(measured / predicted step time), of each ok trial against what the
        ok trials before it predicted (the whole refit: constants, term scales, residuals):
        the search's out-of-sample errors (Dawid 1984, prequential analysis). Cached per
        prefix, so each new trial costs one refit."""
        keys = [(o.layout.id, o.step_time_s) for o in ok]
        cached = self._prequential_cache
        n = 0
        while n < min(len(keys), len(cached)) and cached[n][0] == keys[n]:
            n += 1
        errors = [e for _, e in cached[:n]]
        for j in range(n, len(ok)):
            prefix = ok[:j]
            k = self.constants(prefix, np.array(errors))
            scales, process, target = self._refit(prefix, k, np.array(errors), [ok[j].layout])
            x = features(LayoutTable.from_layouts([ok[j].layout]))
            predicted = float(scales.step_s(target)[0]) * float(np.exp(process.predict(x)[0][0]))
            errors.append(float(np.log(float(ok[j].step_time_s or 0.0) / predicted)))
        self._prequential_cache = list(zip(keys, errors, strict=True))
        return np.array(errors)

    def scores(self, outcomes: Sequence[Outcome]) -> tuple[np.ndarray, np.ndarray]:
        """Expected log tokens/s of every row and its σ (`belief`)."""
        b = self.belief(outcomes)
        return b.mean, b.sd

    # --- the choice --------------------------------------------------------------------------

    def candidates(
        self, outcomes: Sequence[Outcome], pending: Sequence[str]
    ) -> tuple[np.ndarray, MemoryFit, list[int]]:
        """Rows that may be proposed, the memory fit, and rows owed a repeat."""
        allowed, memory, repeats, _ = self._candidates(outcomes, pending)
        return allowed, memory, repeats

    def _candidates(
        self, outcomes: Sequence[Outcome], pending: Sequence[str]
    ) -> tuple[np.ndarray, MemoryFit, list[int], np.ndarray]:
        """`candidates` and every row's probability of fitting (`MemoryFit.p_fit`)."""
        runs: dict[str, list[str]] = {}
        for o in outcomes:
            runs.setdefault(o.layout.id, []).append(o.status)
        open_rows = np.ones(len(self.rows), dtype=bool)
        repeats = []
        for layout_id, statuses in runs.items():
            i = self.index.get(layout_id)
            if i is None:
                continue
            open_rows[i] = False
            if all(s == "ok" for s in statuses) and len(statuses) < self.repeat:
                repeats.append(i)
        for layout_id in pending:
            if layout_id in self.index:
                open_rows[self.index[layout_id]] = False
        repeats = [i for i in repeats if self.rows[i].id not in pending]
        memory, p_fit = self.memory_and_fit(outcomes)
        allowed = open_rows & (p_fit >= self.bar(outcomes, pending))
        if not allowed.any():  # nothing that likely: the likeliest to fit
            allowed = open_rows & (p_fit >= 0.5 * float(np.max(np.where(open_rows, p_fit, 0))))
            allowed &= p_fit > 0
        return allowed, memory, repeats, p_fit

    def bar(self, outcomes: Sequence[Outcome], pending: Sequence[str] = ()) -> float:
        """The probability of fitting a row needs to be proposed (`p_fit_needed`:
        `P_FIT_WARM` in the warm start, `P_FIT` after it, more per OOM)."""
        cautious = len(outcomes) + len(pending) < self.warm_start
        ooms = sum(o.status == "oom" for o in outcomes)
        return p_fit_needed(P_FIT_WARM if cautious else P_FIT, ooms)

    def memory_and_fit(self, outcomes: Sequence[Outcome]) -> tuple[MemoryFit, np.ndarray]:
        """The memory fit and every feasible row's probability of fitting (cached per
        outcomes)."""
        key = tuple((o.layout.id, o.status) for o in outcomes)
        if self._memory_cache[0] != key:
            memory = self.memory(outcomes)
            p_fit = memory.p_fit(self.parts)
            for o in outcomes:  # an OOM's grid shares its miss: P(fit | that OOM)
                i = self.index.get(o.layout.id)
                if o.status == "oom" and i is not None:
                    rows = np.flatnonzero(self.grid == self.grid[i])
                    p_fit[rows] = np.minimum(p_fit[rows], memory.p_fit_beside_oom(
                        self.parts.take(rows), self.parts.take(np.array([i]))))
            self._memory_cache = (key, memory, p_fit)
        return self._memory_cache[1], self._memory_cache[2]

    def remaining(self, outcomes: Sequence[Outcome], pending: Sequence[str]) -> int:
        """How many proposals are left (untried layouts expected to fit, and owed repeats)."""
        allowed, _, repeats = self.candidates(outcomes, pending)
        return int(allowed.sum()) + len(repeats)

    def propose(self, outcomes: Sequence[Outcome], pending: Sequence[str]) -> Proposal | None:
        """The next layout to measure, or None when nothing is left."""
        allowed, memory, repeats, p_fit = self._candidates(outcomes, pending)
        b = self.belief(outcomes)
        mean, sd = b.mean, b.sd
        need, _ = memory.need(self.parts)
        if repeats:
            i = max(repeats, key=lambda r: mean[r])
            return self._proposal(i, "repeat", mean, need, memory)
        if not allowed.any():
            return None
        turn = len(outcomes) + len(pending)
        ucb = np.where(allowed, mean + BETA * sd, -np.inf)
        # an OOM says nothing about speed: its family stays fresh (at a smaller need now)
        ran = [self.index[o.layout.id] for o in outcomes
               if o.layout.id in self.index and o.status != "oom"]
        measured = set(self.family[ran])
        fresh = allowed & ~np.isin(self.family, list(measured))
        # the expert split (ep, etp) is the second level: a tp·pp·cp grid, recompute or ZeRO
        # family nothing measured comes before another (ep, etp) of a measured one
        new_grid = fresh & ~np.isin(self.coarse, list(set(self.coarse[ran])))
        if len(measured) < self.warm_start and fresh.any():
            i = self._warm(new_grid if new_grid.any() else fresh, ucb, sd, outcomes, b.noise,
                           turn, p_fit)
            return self._proposal(i, "warm-start", mean, need, memory)
        # a trial that runs out of memory measures nothing: expected improvement times the
        # probability of fitting (constrained expected improvement)
        gain = improvement(mean, sd, b.best + b.noise) * p_fit
        overlapping = fresh & (mean + Z_OVERLAP * sd > b.best + b.noise)
        plausible = fresh & (mean + Z_EXPLORE * sd > b.best) & (gain > 0)
        if self.explore_every and turn % self.explore_every == self.explore_every - 1 and \
                plausible.any():
            i = self._explore(plausible, gain, turn)
            return self._proposal(i, "explore", mean, need, memory)
        if (overlapping & new_grid).any():
            overlapping &= new_grid
        if overlapping.any():
            i = self._pick(np.where(overlapping, gain, -np.inf), gain_tie(gain, overlapping),
                           turn, p_fit)
            return self._proposal(i, "family", mean, need, memory)
        i = self._pick(np.where(allowed, gain, -np.inf), gain_tie(gain, allowed), turn, p_fit)
        return self._proposal(i, "model", mean, need, memory)

    def confidence(self, outcomes: Sequence[Outcome], pending: Sequence[str] = ()
                   ) -> Confidence:
        """The probability that an untried layout (expected to fit) beats the best measured
        one by more than the noise: draws of the term scales' posterior and, jointly over the
        `CONFIDENCE_ROWS` likeliest rows, of the residual process (seeded)."""
        allowed, _, _ = self.candidates(outcomes, pending)
        b = self.belief(outcomes)
        scales = b.terms.scales()
        if not np.isfinite(b.best) or not allowed.any():
            p = 1.0 if not np.isfinite(b.best) else 0.0
            return Confidence(p, b.best_id, b.noise, int(allowed.sum()), scales)
        target = b.best + b.noise
        z = np.where(allowed, (b.mean - target) / np.maximum(b.sd, 1e-9), -np.inf)
        rows = np.argsort(-z)[: min(CONFIDENCE_ROWS, int(allowed.sum()))]
        _, terms = self.fitted([o for o in outcomes if o.status == "ok" and o.step_time_s])
        rng = np.random.default_rng([self.seed or 0, len(outcomes)])
        log_step = b.terms.draws(terms[rows], CONFIDENCE_DRAWS, rng)
        gp_mean, _ = b.process.predict(self.x[rows])
        cov = b.process.covariance(self.x[rows]) + 1e-10 * np.eye(len(rows))
        gp = rng.multivariate_normal(gp_mean, cov, size=CONFIDENCE_DRAWS, method="eigh")
        rate = np.log(float(self.cfg.train.tokens_per_step)) - log_step - gp
        p = float(np.mean(rate.max(axis=1) > target))
        return Confidence(p, b.best_id, b.noise, int(allowed.sum()), scales)

    def _pick(self, scores: np.ndarray, tie: float, turn: int, p_fit: np.ndarray) -> int:
        """The best score; rows within `tie` of it are one choice: seed 0 takes the one most
        likely to fit (then the best score), any other seed draws among them, weighted by that
        probability."""
        top = float(np.max(scores))
        tied = np.flatnonzero(scores >= top - tie)
        if len(tied) == 1:
            return int(tied[0])
        if not self.seed:  # seed 0 (the default): the safest of the tied
            return int(tied[np.lexsort((-scores[tied], -np.round(p_fit[tied], 2)))[0]])
        rng = np.random.default_rng([self.seed, turn])
        weights = np.maximum(p_fit[tied], 1e-6)
        return int(rng.choice(tied, p=weights / weights.sum()))

    def _warm(self, fresh: np.ndarray, ucb: np.ndarray, sd: np.ndarray,
              outcomes: Sequence[Outcome], noise: float, turn: int, p_fit: np.ndarray) -> int:
        """The best bound among new families, plus NOVELTY for each of its tp·pp·cp·ep,
        recompute and ZeRO family that no trial measured yet (ties within the noise: seeded)."""
        seen = [self.structure[self.index[o.layout.id]] for o in outcomes
                if o.layout.id in self.index and o.status != "oom"]
        novelty = np.zeros(len(self.rows))
        for factor in range(self.structure.shape[1]):
            known = {int(s[factor]) for s in seen}
            novelty += ~np.isin(self.structure[:, factor], list(known))
        # an OOM measures nothing: the bound is charged the log of the probability of fitting,
        # so a family's first trial is one of its layouts likely to fit
        score = np.where(fresh, ucb + NOVELTY * novelty + np.log(np.maximum(p_fit, 1e-9)),
                         -np.inf)
        # before a family has run, bounds closer than half the model's own σ are tied too
        tie = TIE * float(np.hypot(noise, sd[int(np.argmax(score))]))
        return self._pick(score, tie, turn, p_fit)

    def _explore(self, fresh: np.ndarray, gain: np.ndarray, turn: int) -> int:
        """A seeded draw of an unmeasured family (weights: its best expected improvement),
        then its best row."""
        scores = np.where(fresh, gain, 0.0)
        families = np.unique(self.family[fresh & (gain > 0)])
        weights = np.array([scores[self.family == f].max() for f in families])
        rng = np.random.default_rng([self.seed or 0, turn])
        family = rng.choice(families, p=weights / weights.sum())
        return int(np.argmax(np.where(self.family == family, scores, -np.inf)))

    def _proposal(self, i: int, reason: str, mean: np.ndarray, need: np.ndarray,
                  memory: MemoryFit) -> Proposal:
        return Proposal(self.rows[i], reason, float(np.exp(mean[i])), float(need[i]), memory)


def discrepant_sd(errors: np.ndarray) -> float:
    """σ of a trial's log step time against a parametric fit (constants, term scales): the
    measurement's `STEP_SD` and the model's discrepancy (`amplitude` of the out-of-sample
    errors)."""
    return float(np.hypot(STEP_SD, amplitude(errors)))


def improvement(mean: np.ndarray, sd: np.ndarray, target: float) -> np.ndarray:
    """Expected improvement of log throughput over `target` (the mean above it where σ is 0;
    before any trial, when the target is -inf, the mean itself ranks)."""
    if not np.isfinite(target):
        return np.asarray(np.exp(mean - np.max(mean)), float)
    sd = np.maximum(sd, 1e-9)
    z = (mean - target) / sd
    return np.asarray(sd * norm.pdf(z) + (mean - target) * norm.cdf(z), float)


def gain_tie(gain: np.ndarray, mask: np.ndarray) -> float:
    """Expected improvements within `TIE_GAIN` of the best one's count as tied."""
    return TIE_GAIN * float(np.max(np.where(mask, gain, 0.0)))
