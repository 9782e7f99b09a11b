"""The search: an Optuna study over the feasible layouts, with real or simulated trials.

- `study`: the study (objective, trial records, ranking, resume), `tune` its entry;
- `sampler`, `proposal`: which layout to try next (the cost model refitted to the trials);
- `memory_learning`: what the trials taught about memory (out-of-memory edges);
- `surrogate`: a Gaussian process over layouts for the exploration steps;
- `storage`: Optuna storages (SQLite, PostgreSQL, in memory), shared studies.
"""

from autotune.search.settings import TuneSettings
from autotune.search.study import TuneResult
from autotune.search.study import rank_trials
from autotune.search.study import trial_records
from autotune.search.study import tune

__all__ = ["TuneSettings", "TuneResult", "rank_trials", "trial_records", "tune"]
