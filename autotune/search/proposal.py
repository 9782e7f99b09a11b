"""Which feasible layout to measure next, from the trials so far (no Optuna here).

Every proposal is an untried row of the enumerated feasible table (so no rule-rejected point and
no layout twice) that the memory model, corrected by the trials, expects to fit. Among those:

1. repeats first: with `repeat` > 1 a layout that ran fewer times (all ok) runs again;
2. warm start: the first `warm_start` trials each measure a new structural family (tp·pp·cp,
   recompute, ZeRO family: replicated, sharded optimizer/gradients, sharded parameters):
   the best bound plus a bonus per factor whose value no trial has measured, so one wrong
   assumption of the model cannot cost every warm-start trial;
3. exploration, every `explore_every`-th trial: a family not measured yet, drawn at random
   (seeded) with weights favouring families the model rates well;
4. otherwise the upper confidence bound: log throughput under the model refitted to the
   trials, corrected by the residual process, plus `BETA` of its σ, so a family the model may
   mis-rank is measured early and a measured one is trusted.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from autotune.calibration.fit import fit_trials
from autotune.costmodel.constants import Constants
from autotune.costmodel.estimate import evaluate
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.search.memory_learning import MemoryFit
from autotune.search.memory_learning import MemoryParts
from autotune.search.memory_learning import fit_memory
from autotune.search.surrogate import features
from autotune.search.surrogate import fit_residuals
from autotune.specs import AutotuneConfig
from autotune.units import GIB

BETA = 1.0
"""Weight of the residual σ in the upper confidence bound."""
NOVELTY = 0.05
"""Warm start: bonus (log throughput) per structural factor whose value is not measured yet."""
EXPLORE_TEMPERATURE = 0.1
"""Spread (in log throughput) of the exploration draw over families."""


@dataclasses.dataclass(frozen=True)
class Outcome:
    """A trial that ran: its layout, status and (when ok) what it measured."""

    layout: Layout
    status: str
    step_time_s: float | None = None
    peak_bytes: float | None = None
    spread: float | None = None


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


def structure(t: LayoutTable) -> np.ndarray:
    """Integer codes per row of what makes a family: tp·pp·cp, recompute, ZeRO family."""
    zero_family = np.select([t.zero == 0, t.zero < 3], [0, 1], 2)
    grid = np.unique(np.column_stack([t.tp, t.pp, t.cp]), axis=0, return_inverse=True)[1]
    return np.column_stack([grid.ravel(), t.recompute, zero_family])


def family_keys(t: LayoutTable) -> np.ndarray:
    """An integer per row naming its structural family (tp, pp, cp, recompute, ZeRO family)."""
    return np.unique(structure(t), axis=0, return_inverse=True)[1].ravel()


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
        self.x = features(feasible)
        values = evaluate(cfg, feasible, constants)
        self.parts = MemoryParts.from_values(values, feasible.recompute)
        self._fit_cache: tuple[int, Constants, np.ndarray] = (
            0, constants, np.log(values["tokens_per_s"])
        )

    # --- what the trials say -----------------------------------------------------------------

    def fitted(self, ok: Sequence[Outcome]) -> tuple[Constants, np.ndarray]:
        """Constants refitted to the ok trials and log tokens/s of every feasible row."""
        if self._fit_cache[0] != len(ok):
            k = self.base
            if ok:
                k = fit_trials(self.cfg, [o.layout for o in ok],
                               [float(o.step_time_s or 0.0) for o in ok], self.base)
            rates = evaluate(self.cfg, self.feasible, k)["tokens_per_s"]
            self._fit_cache = (len(ok), k, np.log(rates))
        return self._fit_cache[1], self._fit_cache[2]

    def memory(self, outcomes: Sequence[Outcome]) -> MemoryFit:
        """The memory correction fitted to every trial that ran."""
        if outcomes:
            table = LayoutTable.from_layouts([o.layout for o in outcomes])
            parts = MemoryParts.from_values(evaluate(self.cfg, table, self.base), table.recompute)
        else:
            parts = self.parts.take(np.zeros(0, dtype=int))
        status = np.array([o.status for o in outcomes], dtype=object)
        peak = np.array([o.peak_bytes or np.nan for o in outcomes], dtype=float)
        return fit_memory(self.cfg, self.base, parts, status, peak)

    def scores(self, outcomes: Sequence[Outcome]) -> tuple[np.ndarray, np.ndarray]:
        """Expected log tokens/s of every row (refit + residuals) and its σ."""
        ok = [o for o in outcomes if o.status == "ok" and o.step_time_s]
        k, log_rate = self.fitted(ok)
        if not ok:
            mean, sd = fit_residuals(self.x[:0], np.zeros(0), np.zeros(0)).predict(self.x)
            return log_rate - mean, sd
        table = LayoutTable.from_layouts([o.layout for o in ok])
        modelled = evaluate(self.cfg, table, k)["step_time_s"]
        residual = np.log(np.array([o.step_time_s for o in ok]) / modelled)
        noise = np.array([o.spread or 0.0 for o in ok])
        process = fit_residuals(features(table), residual, noise)
        mean, sd = process.predict(self.x)
        return log_rate - mean, sd

    # --- the choice --------------------------------------------------------------------------

    def candidates(
        self, outcomes: Sequence[Outcome], pending: Sequence[str]
    ) -> tuple[np.ndarray, MemoryFit, list[int]]:
        """Rows that may be proposed, the memory fit, and rows owed a repeat."""
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
        memory = self.memory(outcomes)
        allowed = open_rows & memory.fits(self.parts)
        if not allowed.any():  # nothing with a margin: what is expected to fit at all
            allowed = open_rows & memory.fits(self.parts, z=0.0)
        return allowed, memory, repeats

    def remaining(self, outcomes: Sequence[Outcome], pending: Sequence[str]) -> int:
        """How many proposals are left (untried layouts expected to fit, and owed repeats)."""
        allowed, _, repeats = self.candidates(outcomes, pending)
        return int(allowed.sum()) + len(repeats)

    def propose(self, outcomes: Sequence[Outcome], pending: Sequence[str]) -> Proposal | None:
        """The next layout to measure, or None when nothing is left."""
        allowed, memory, repeats = self.candidates(outcomes, pending)
        mean, sd = self.scores(outcomes)
        need, _ = memory.need(self.parts)
        if repeats:
            i = max(repeats, key=lambda r: mean[r])
            return self._proposal(i, "repeat", mean, need, memory)
        if not allowed.any():
            return None
        ucb = np.where(allowed, mean + BETA * sd, -np.inf)
        # an OOM says nothing about speed: its family stays fresh (at a smaller need now)
        measured = {self.family[self.index[o.layout.id]] for o in outcomes
                    if o.layout.id in self.index and o.status != "oom"}
        fresh = allowed & ~np.isin(self.family, list(measured))
        families_tried = len(measured)
        if families_tried < self.warm_start and fresh.any():
            return self._proposal(self._warm(fresh, ucb, outcomes), "warm-start", mean, need,
                                  memory)
        turn = len(outcomes) + len(pending)
        if self.explore_every and turn % self.explore_every == self.explore_every - 1 and \
                fresh.any():
            return self._proposal(self._explore(fresh, ucb, turn), "explore", mean, need, memory)
        return self._proposal(int(np.argmax(ucb)), "model", mean, need, memory)

    def _warm(self, fresh: np.ndarray, ucb: np.ndarray, outcomes: Sequence[Outcome]) -> int:
        """The best bound among new families, plus NOVELTY for each of its tp·pp·cp, recompute
        and ZeRO family that no trial measured yet."""
        seen = [self.structure[self.index[o.layout.id]] for o in outcomes
                if o.layout.id in self.index and o.status != "oom"]
        novelty = np.zeros(len(self.rows))
        for factor in range(self.structure.shape[1]):
            known = {int(s[factor]) for s in seen}
            novelty += ~np.isin(self.structure[:, factor], list(known))
        return int(np.argmax(np.where(fresh, ucb + NOVELTY * novelty, -np.inf)))

    def _explore(self, fresh: np.ndarray, ucb: np.ndarray, turn: int) -> int:
        """A seeded draw of an unmeasured family (by its best bound), then its best row."""
        scores = np.where(fresh, ucb, -np.inf)
        families = np.unique(self.family[fresh])
        best = np.array([scores[self.family == f].max() for f in families])
        weights = np.exp((best - best.max()) / EXPLORE_TEMPERATURE)
        rng = np.random.default_rng([self.seed or 0, turn])
        family = rng.choice(families, p=weights / weights.sum())
        return int(np.argmax(np.where(self.family == family, scores, -np.inf)))

    def _proposal(self, i: int, reason: str, mean: np.ndarray, need: np.ndarray,
                  memory: MemoryFit) -> Proposal:
        return Proposal(self.rows[i], reason, float(np.exp(mean[i])), float(need[i]), memory)
