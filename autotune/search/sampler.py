"""Optuna pieces that know the analytic model: the sampler, the pruner, who holds a layout.

`ModelGuidedSampler` turns the study's trials into outcomes and asks `autotune.search.proposal`
for the
next feasible layout (memory learned from the trials, warm start over families, seeded
exploration, upper confidence bound); enqueued trials keep their fixed values. Each proposal is
stored on its trial (`proposal`: reason, prediction, memory limit). `NoiseAwarePruner` stops a
trial only when it trails the best by more than the measured noise of both. `holding_trial`
says which earlier trial keeps a layout from running again.
"""

from __future__ import annotations

import logging
import math
import statistics
import threading
from collections.abc import Sequence
from typing import Any

from optuna.distributions import BaseDistribution
from optuna.distributions import CategoricalDistribution
from optuna.pruners import BasePruner
from optuna.samplers import BaseSampler
from optuna.samplers import RandomSampler
from optuna.study import Study
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from autotune.exceptions import AutotuneError
from autotune.layout import SEARCH_DIMS
from autotune.layout import Layout
from autotune.search.proposal import Confidence
from autotune.search.proposal import Outcome
from autotune.search.proposal import Proposer
from autotune.space.search_space import AUTO
from autotune.space.search_space import SearchSpace
from autotune.specs import AutotuneConfig
from autotune.workloads.records import step_time_spread

log = logging.getLogger(__name__)
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)
"""States of trials that ended; one that ran (user attribute `ran`) holds its layout."""


def distributions(space: SearchSpace) -> dict[str, CategoricalDistribution]:
    """The Optuna distribution of every dimension that has a choice (of a space whose `auto`
    dimensions are resolved for the problem: `SearchSpace.resolved`)."""
    unresolved = [dim for dim in SEARCH_DIMS if getattr(space, dim) == AUTO]
    if unresolved:
        raise AutotuneError(f"search space {space.name}: {', '.join(unresolved)} still 'auto'; "
                            "resolve the space for the problem first (SearchSpace.resolved)")
    return {
        dim: CategoricalDistribution(list(getattr(space, dim)))
        for dim in SEARCH_DIMS
        if len(getattr(space, dim)) > 1
    }


def layout_params(layout: Layout, space: SearchSpace) -> dict[str, Any]:
    """The Optuna params that select `layout` in `space`."""
    return {dim: getattr(layout, dim) for dim in distributions(space)}


def layout_from_params(cfg: AutotuneConfig, space: SearchSpace, params: dict[str, Any]) -> Layout:
    """The layout Optuna params select (fixed dims from the space; dp and gas derived).

    dp is 0 when tp·pp·cp does not divide the world; the rules then reject the layout.
    """
    values = {dim: params.get(dim, getattr(space, dim)[0]) for dim in SEARCH_DIMS}
    return Layout.derived(cfg.world_size, cfg.train.global_batch_size, **values)


def outcomes(trials: Sequence[FrozenTrial]) -> list[Outcome]:
    """Every trial that ran, failed or not, in trial order."""
    result = []
    for t in sorted(trials, key=lambda t: t.number):
        attrs = t.user_attrs
        if t.state not in FINISHED or not attrs.get("ran") or "layout_fields" not in attrs:
            continue
        result.append(Outcome.from_record(attrs))
    return result


def pending(trials: Sequence[FrozenTrial], number: int) -> list[str]:
    """Layouts that other unfinished trials run or will run (claimed, proposed or enqueued)."""
    result = []
    for t in trials:
        if t.number == number or t.state not in (TrialState.RUNNING, TrialState.WAITING):
            continue
        layout_id = t.user_attrs.get("layout_id") or t.user_attrs.get("proposal", {}).get(
            "layout_id"
        )
        if layout_id:
            result.append(layout_id)
    return result


def holding_trial(
    trials: Sequence[FrozenTrial], number: int, layout_id: str, *, lower_only: bool,
    repeat: int = 1,
) -> FrozenTrial | None:
    """The trial that keeps `layout_id` from running in trial `number`, or None.

    A trial holds its layout once it ran (whatever its outcome) or while it runs with a claim.
    A layout runs at most `repeat` times, and never again after a run that was not ok. With
    `lower_only`, only lower-numbered trials count (the second phase of a claim).
    """
    holders = []
    for other in trials:
        if other.number == number or other.user_attrs.get("layout_id") != layout_id:
            continue
        if lower_only and other.number > number:
            continue
        ran = other.state in FINISHED and other.user_attrs.get("ran")
        if ran or (other.state == TrialState.RUNNING and other.user_attrs.get("claimed")):
            holders.append(other)
    failed = [t for t in holders if t.state in FINISHED and t.user_attrs.get("status") != "ok"]
    if failed:
        return failed[0]
    return holders[-1] if len(holders) >= repeat else None


class ModelGuidedSampler(BaseSampler):
    """Proposes feasible layouts with `autotune.search.proposal.Proposer` (see there)."""

    def __init__(self, space: SearchSpace, proposer: Proposer) -> None:
        self._cfg, self._space, self._proposer = proposer.cfg, space, proposer
        self._fallback = RandomSampler(seed=proposer.seed)
        self._lock = threading.Lock()
        self._proposed: dict[int, str] = {}
        """Trial number -> layout id proposed in this process (seen before storage has it)."""
        self._limit: float | None = None

    def _state(self, study: Study, number: int) -> tuple[list[Outcome], list[str]]:
        trials = study.get_trials(deepcopy=False)
        done = {t.number for t in trials if t.state in FINISHED}
        claimed = pending(trials, number) + [
            layout_id for n, layout_id in self._proposed.items() if n != number and n not in done
        ]
        claimed += [  # enqueued trials (pinned by the user, or retries) will run their layouts
            layout_from_params(self._cfg, self._space, t.system_attrs["fixed_params"]).id
            for t in trials
            if t.state == TrialState.WAITING and "fixed_params" in t.system_attrs
        ]
        return outcomes(trials), claimed

    def remaining(self, study: Study) -> int:
        """Trials left to run: enqueued ones, repeats owed and untried layouts expected to fit."""
        waiting = len(study.get_trials(deepcopy=False, states=(TrialState.WAITING,)))
        return waiting + self._proposer.remaining(*self._state(study, -1))

    def confidence(self, study: Study) -> Confidence:
        """How likely an untried layout beats the best measured one by more than the noise
        (`Proposer.confidence`)."""
        with self._lock:
            return self._proposer.confidence(*self._state(study, -1))

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return dict(distributions(self._space))

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if not search_space or "fixed_params" in trial.system_attrs:
            return {}
        with self._lock:
            done, claimed = self._state(study, trial.number)
            proposal = self._proposer.propose(done, claimed)
            if proposal is None:  # nothing left: a tried layout, which the study reuses
                return layout_params(self._proposer.rows[0], self._space)
            self._proposed[trial.number] = proposal.layout.id
            study._storage.set_trial_user_attr(trial._trial_id, "proposal", proposal.to_dict())
            if proposal.reason == "warm-start":
                study._storage.set_trial_user_attr(trial._trial_id, "warm_start", len(done) + 1)
            if proposal.memory.limit_bytes != self._limit:
                self._limit = proposal.memory.limit_bytes
                log.debug("memory: %s", proposal.memory.describe())
        return layout_params(proposal.layout, self._space)

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        return self._fallback.sample_independent(study, trial, param_name, param_distribution)


def _spread(values: Sequence[float]) -> float:
    """Relative spread of the step times behind throughput reports."""
    return step_time_spread([1 / v for v in values if v > 0])


class NoiseAwarePruner(BasePruner):
    """Stop a trial that trails the best completed trial by more than the noise of both.

    After `warmup_steps` reports, the trial's throughput is the median of its reports after the
    first; it is pruned when it is below the best by more than `tolerance` and by more than `k`
    times the combined relative spread of the two (the best's measured step-time spread, the
    trial's from its reports so far). The pruned trial keeps `pruned_tokens_per_s` (that median)
    and `pruned_margin`.
    """

    def __init__(self, warmup_steps: int = 2, tolerance: float = 0.1, k: float = 2.0) -> None:
        self.warmup_steps = warmup_steps
        self.tolerance = tolerance
        self.k = k

    def margin(self, trial_spread: float, best_spread: float) -> float:
        """The relative gap below the best that counts as slower."""
        return max(self.tolerance, self.k * math.hypot(trial_spread, best_spread))

    def prune(self, study: Study, trial: FrozenTrial) -> bool:
        step = trial.last_step
        if step is None or step < self.warmup_steps:
            return False
        found = max(
            ((t.value, t) for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
             if t.value and t.user_attrs.get("status") == "ok"),
            key=lambda pair: pair[0],
            default=None,
        )
        if found is None:
            return False
        best_value, best = found
        values = [v for _, v in sorted(trial.intermediate_values.items())]
        values = values[1:] if len(values) > 1 else values
        current = statistics.median(values)
        best_spread = float(best.user_attrs.get("measured_step_time_spread") or 0.0)
        margin = self.margin(_spread(values), best_spread)
        if current >= best_value * (1 - margin):
            return False
        study._storage.set_trial_user_attr(trial._trial_id, "pruned_tokens_per_s", current)
        study._storage.set_trial_user_attr(trial._trial_id, "pruned_margin", margin)
        return True


__all__ = [
    "ModelGuidedSampler",
    "NoiseAwarePruner",
    "distributions",
    "holding_trial",
    "layout_params",
]
