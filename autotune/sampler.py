"""Optuna pieces that know the analytic model: a model-guided sampler and a best-so-far pruner.

`ModelGuidedSampler` proposes, trial after trial, the best untried feasible layout under the
model whose constants were refitted (least squares) to the trials measured so far; every
`explore_every`-th trial comes from Optuna's TPE sampler (with constraints) instead, so regions
the model ranks low still get sampled. Enqueued (warm-start) trials keep their fixed values.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from optuna.distributions import BaseDistribution
from optuna.distributions import CategoricalDistribution
from optuna.pruners import BasePruner
from optuna.samplers import BaseSampler
from optuna.samplers import TPESampler
from optuna.study import Study
from optuna.trial import FrozenTrial
from optuna.trial import TrialState

from autotune.calibration import Measured
from autotune.calibration import fit_constants
from autotune.constants import Constants
from autotune.estimate import evaluate
from autotune.exceptions import AutotuneError
from autotune.layout import SEARCH_DIMS
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.space import AUTO
from autotune.space import SearchSpace
from autotune.specs import AutotuneConfig

REFIT = ("gemm_efficiency", "comm_efficiency")
"""Constants refitted to measured trials (few points: the two that move rankings most)."""


def distributions(space: SearchSpace) -> dict[str, BaseDistribution]:
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


def measured_points(cfg: AutotuneConfig, trials: Sequence[FrozenTrial]) -> list[Measured]:
    """Completed trials that measured a step time, as calibration points."""
    points = []
    for t in trials:
        if t.state == TrialState.COMPLETE and t.user_attrs.get("status") == "ok":
            layout = Layout(**t.user_attrs["layout_fields"])
            points.append(
                Measured(
                    f"trial {t.number}",
                    cfg,
                    (layout,),
                    float(t.user_attrs["measured_step_time_s"]),
                    cfg.cluster.gpu.name,
                )
            )
    return points


class ModelGuidedSampler(BaseSampler):
    """Best untried layout under the refitted model; TPE every `explore_every`-th trial."""

    def __init__(
        self,
        cfg: AutotuneConfig,
        space: SearchSpace,
        feasible: LayoutTable,
        constants: Constants,
        *,
        seed: int | None = None,
        explore_every: int = 5,
    ) -> None:
        self._cfg = cfg
        self._space = space
        self._feasible = feasible
        self._ids = [row.id for row in feasible.rows()]
        self._base = constants
        self._explore_every = explore_every
        self._tpe = TPESampler(seed=seed, multivariate=True, n_startup_trials=5)
        self._fit_cache: tuple[int, Constants] = (-1, constants)

    def fitted_constants(self, study: Study) -> Constants:
        """Constants refitted to the study's measured trials (cached per trial count)."""
        points = measured_points(self._cfg, study.get_trials(deepcopy=False))
        if self._fit_cache[0] != len(points):
            fitted = fit_constants(points, self._base, REFIT) if len(points) >= 2 else self._base
            self._fit_cache = (len(points), fitted)
        return self._fit_cache[1]

    def ranking(self, study: Study) -> np.ndarray:
        """Indices of the feasible layouts, fastest first under the refitted model."""
        values = evaluate(self._cfg, self._feasible, self.fitted_constants(study))
        return np.argsort(-values["tokens_per_s"], kind="stable")

    def _tried(self, study: Study) -> set[str]:
        states = (TrialState.COMPLETE, TrialState.RUNNING, TrialState.WAITING, TrialState.PRUNED)
        tried = set()
        for t in study.get_trials(deepcopy=False, states=states):
            if "layout_id" in t.user_attrs:
                tried.add(t.user_attrs["layout_id"])
            elif "fixed_params" in t.system_attrs:
                tried.add(
                    layout_from_params(self._cfg, self._space, t.system_attrs["fixed_params"]).id
                )
        return tried

    def infer_relative_search_space(
        self, study: Study, trial: FrozenTrial
    ) -> dict[str, BaseDistribution]:
        return distributions(self._space)

    def sample_relative(
        self, study: Study, trial: FrozenTrial, search_space: dict[str, BaseDistribution]
    ) -> dict[str, Any]:
        if not search_space:
            return {}
        if self._explore_every and trial.number % self._explore_every == self._explore_every - 1:
            return self._tpe.sample_relative(study, trial, search_space)
        tried = self._tried(study)
        for index in self.ranking(study):
            if self._ids[index] not in tried:
                return layout_params(self._feasible.row(int(index)), self._space)
        return self._tpe.sample_relative(study, trial, search_space)

    def sample_independent(
        self,
        study: Study,
        trial: FrozenTrial,
        param_name: str,
        param_distribution: BaseDistribution,
    ) -> Any:
        return self._tpe.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study: Study, trial: FrozenTrial) -> None:
        self._tpe.before_trial(study, trial)

    def after_trial(
        self, study: Study, trial: FrozenTrial, state: TrialState, values: Sequence[float] | None
    ) -> None:
        self._tpe.after_trial(study, trial, state, values)


class BestSoFarPruner(BasePruner):
    """Stop a trial whose throughput, after `warmup_steps` reports, trails the best completed
    trial by more than `tolerance` (a fraction)."""

    def __init__(self, warmup_steps: int = 2, tolerance: float = 0.1) -> None:
        self.warmup_steps = warmup_steps
        self.tolerance = tolerance

    def prune(self, study: Study, trial: FrozenTrial) -> bool:
        step = trial.last_step
        if step is None or step < self.warmup_steps:
            return False
        best = [
            t.value
            for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
            if t.value and t.user_attrs.get("status") == "ok"
        ]
        if not best:
            return False
        return trial.intermediate_values[step] < max(best) * (1 - self.tolerance)


__all__ = ["BestSoFarPruner", "ModelGuidedSampler", "distributions", "layout_params"]
