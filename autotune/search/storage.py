"""Optuna storages from a URL: SQLite by default, any RDB URL, or `journal:PATH`.

RDB storages (SQLite, PostgreSQL, MySQL) run Optuna's heartbeat, so a worker that dies leaves
its RUNNING trial to be failed and re-enqueued (RetryFailedTrialCallback) by whoever notices
first. Journal storages (a shared file system only) have no heartbeat in Optuna 5; autotune's
`HeartbeatJournalStorage` adds one (a timestamp per running trial, written to the journal), so
both kinds recover dead workers the same way.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Sequence
from pathlib import Path

import optuna
from optuna.storages import RDBStorage
from optuna.storages import RetryHeartbeatStaleTrialCallback
from optuna.storages._heartbeat import BaseHeartbeat
from optuna.storages._heartbeat import is_heartbeat_enabled
from optuna.storages.journal import JournalFileBackend
from optuna.storages.journal import JournalStorage
from optuna.trial import TrialState

from autotune.exceptions import AutotuneError
from autotune.exceptions import shorten

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


HEARTBEAT_ATTR = "autotune:heartbeat"
"""System attribute of a running trial in a journal: the time (Unix seconds) of its last beat."""


class HeartbeatJournalStorage(JournalStorage, BaseHeartbeat):
    """JournalStorage with Optuna's heartbeat protocol, which Optuna 5 gives only RDB storages.

    While `study.optimize` runs a trial, Optuna's heartbeat thread calls `record_heartbeat`
    every `heartbeat_interval` seconds: here that appends the time to the journal as the trial's
    system attribute `autotune:heartbeat`. Before each trial, Optuna's `fail_stale_trials` fails
    every RUNNING trial whose last beat (or start, if later) is older than `grace_period` and
    hands it to the callback, which enqueues a retry. Clocks of the hosts sharing the journal
    must agree to well within the grace period (NTP); every worker must open the journal through
    this class (a RUNNING trial without beats counts from its start).
    """

    def __init__(
        self,
        backend: JournalFileBackend,
        heartbeat_interval: int = HEARTBEAT_INTERVAL_S,
        grace_period: int = GRACE_PERIOD_S,
        stale_trial_callback: RetryHeartbeatStaleTrialCallback | None = None,
    ) -> None:
        super().__init__(backend)
        self.heartbeat_interval = heartbeat_interval
        self.grace_period = grace_period
        if stale_trial_callback is None:
            with warnings.catch_warnings():  # 'experimental' in Optuna since 2.8
                warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
                stale_trial_callback = RetryHeartbeatStaleTrialCallback(max_retry=2)
        self.stale_trial_callback = stale_trial_callback

    def record_heartbeat(self, trial_id: int) -> None:
        try:
            self.set_trial_system_attr(trial_id, HEARTBEAT_ATTR, time.time())
        except optuna.exceptions.UpdateFinishedTrialError:
            pass  # another worker failed it as stale meanwhile; the trial's tell will say so

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        oldest = time.time() - self.grace_period
        stale = []
        for trial in self.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,)):
            beats = [float(trial.system_attrs.get(HEARTBEAT_ATTR, 0.0))]
            if trial.datetime_start is not None:  # a retry copies its predecessor's last beat
                beats.append(trial.datetime_start.timestamp())
            if max(beats) < oldest:
                stale.append(trial._trial_id)
        return stale

    def get_heartbeat_interval(self) -> int:
        return self.heartbeat_interval

    def get_heartbeat_stale_trial_callback(self) -> RetryHeartbeatStaleTrialCallback:
        return self.stale_trial_callback


def has_heartbeat(storage: optuna.storages.BaseStorage) -> bool:
    """True when dead workers' trials are detected (RDB storages and journals opened here)."""
    return is_heartbeat_enabled(storage)


def default_storage_url(out_dir: Path) -> str:
    """SQLite next to the results: DIR/study.db."""
    return f"sqlite:///{(out_dir / 'study.db').resolve()}"


def _postgres_driver(url: str) -> str:
    """`postgresql://` with the installed driver: SQLAlchemy 2.1 means psycopg 3 by it; fall
    back to psycopg2 (the `test` extra's psycopg2-binary) when psycopg 3 is missing."""
    scheme, sep, rest = url.partition("://")
    if scheme not in ("postgresql", "postgres"):
        return url
    try:
        import psycopg  # noqa: F401
    except ImportError:
        return f"postgresql+psycopg2{sep}{rest}"
    return f"postgresql+psycopg{sep}{rest}"


def open_storage(url: str) -> optuna.storages.BaseStorage:
    """An Optuna storage for `url` (`journal:PATH`, `memory`, or an SQLAlchemy URL)."""
    if url == "memory":
        return optuna.storages.InMemoryStorage()
    if url.startswith("journal:"):
        path = Path(url.removeprefix("journal:")).expanduser()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            return HeartbeatJournalStorage(JournalFileBackend(str(path)))
        except (OSError, ValueError) as error:
            reason = getattr(error, "strerror", None) or str(error)
            raise AutotuneError(
                f"--storage: cannot open the journal {shorten(str(path))}: {reason}; "
                "give a writable file, e.g. journal:OUT/study.journal"
            ) from None
    if "://" not in url:
        raise AutotuneError(
            f"--storage: {shorten(url)} is not a storage URL; use sqlite:///PATH, "
            "postgresql://..., journal:PATH or memory"
        )
    url = _postgres_driver(url)
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
        reason = " ".join(str(error).split())[:200]
        raise AutotuneError(f"--storage: cannot open {shorten(url)}: {reason}") from None
