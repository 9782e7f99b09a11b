"""One list of trial outcomes (`autotune.measurement.Status`) for runners, search and report."""

from __future__ import annotations

from autotune.measurement import STATUSES
from autotune.measurement import Status
from autotune.report.plots import STATUS_COLORS
from autotune.workloads.records import EXIT_CODES


def test_every_status_named_anywhere_is_a_status() -> None:
    """Oracle: the names the report colours and the trial programs' exit codes use, read from
    their own tables; a runner reports only statuses of trials that ran."""
    assert set(STATUS_COLORS) <= set(Status)
    assert set(EXIT_CODES) - {"bad_input"} <= set(Status)  # bad_input: an exit code, not a trial
    assert set(STATUSES) == {s for s in Status if s.ran}
    assert [s for s in Status if s.failed] == ["oom", "nccl_timeout", "hang", "timeout", "nan",
                                               "rejected", "crash"]
