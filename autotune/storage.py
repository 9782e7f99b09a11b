"""Optuna storages from a URL: SQLite by default, any RDB URL, or `journal:PATH`.

RDB storages (SQLite, PostgreSQL, MySQL) run Optuna's heartbeat, so a worker that dies leaves
its RUNNING trial to be failed and re-enqueued (RetryFailedTrialCallback) by whoever notices
first. Journal storages (a shared file system only) have no heartbeat in Optuna; see
`fail_stale_trials`.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Sequence
from pathlib import Path

import optuna
from optuna.storages import RDBStorage
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.storages.journal import JournalFileBackend
from optuna.storages.journal import JournalStorage
from optuna.trial import TrialState

from autotune.exceptions import AutotuneError

HEARTBEAT_INTERVAL_S = 5
GRACE_PERIOD_S = 20


class _SQLiteStorage(RDBStorage):
    """RDBStorage for SQLite with state changes serialised between threads.

    SQLite has no row locks, so two `--jobs` threads could both pop the same enqueued trial;
    a lock makes the read-check-write of a state change atomic within the process. (Several
    processes on one study need a server database: PostgreSQL.)
    """

    _lock = threading.Lock()

    def set_trial_state_values(
        self, trial_id: int, state: TrialState, values: Sequence[float] | None = None
    ) -> bool:
        with self._lock:
            return super().set_trial_state_values(trial_id, state, values)


def default_storage_url(out_dir: Path) -> str:
    """SQLite next to the results: DIR/study.db."""
    return f"sqlite:///{(out_dir / 'study.db').resolve()}"


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """An Optuna storage for `url` (`journal:PATH`, `memory`, or an SQLAlchemy URL)."""
    if url == "memory":
        return optuna.storages.InMemoryStorage()
    if url.startswith("journal:"):
        path = Path(url.removeprefix("journal:")).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True)
        return JournalStorage(JournalFileBackend(str(path)))
    if "://" not in url:
        raise AutotuneError(
            f"--storage: {url!r} is not a storage URL; use sqlite:///PATH, postgresql://..., "
            "journal:PATH or memory"
        )
    storage_class = _SQLiteStorage if url.startswith("sqlite") else RDBStorage
    try:
        with warnings.catch_warnings():  # heartbeats are 'experimental' in Optuna since 2.8
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            return storage_class(
                url,
                heartbeat_interval=HEARTBEAT_INTERVAL_S,
                grace_period=GRACE_PERIOD_S,
                heartbeat_stale_trial_callback=RetryHeartbeatStaleTrialCallback(max_retry=2),
                engine_kwargs={"pool_pre_ping": True} if not url.startswith("sqlite") else None,
            )
    except Exception as error:  # SQLAlchemy raises many kinds; the user needs one line
        raise AutotuneError(f"--storage: cannot open {url!r}: {error}") from None
