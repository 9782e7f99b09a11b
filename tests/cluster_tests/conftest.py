"""Real services for the cluster tests: a one-node Slurm and a PostgreSQL server on localhost.

Each fixture runs its script in tests/services/ once per session (the scripts install the Debian
packages when missing and reuse running daemons), and skips only when that is impossible here:
not root, or apt cannot install the packages. The trials that test_slurm_outcomes.py checks run
side by side in the background (`slurm_ends`).
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers_slurm_ends import EARLY
from helpers_slurm_ends import Batch

SERVICES = Path(__file__).resolve().parents[1] / "services"
CANNOT = {3: "installing the packages needs root", 4: "apt-get could not install the packages"}


def start_service(script: str) -> dict[str, str]:
    """Run tests/services/SCRIPT and return the variables it exports (`export K=V` lines)."""
    done = subprocess.run(["bash", str(SERVICES / script)], capture_output=True, text=True,
                          timeout=600, check=False)
    if done.returncode in CANNOT:
        pytest.skip(f"{script}: {CANNOT[done.returncode]} ({done.stderr.strip()[-300:]})")
    if done.returncode != 0:
        pytest.fail(f"{script} failed with exit code {done.returncode}:\n{done.stderr[-3000:]}")
    exported = {}
    for line in done.stdout.splitlines():
        if line.startswith("export ") and "=" in line:
            key, _, value = line.removeprefix("export ").partition("=")
            exported[key] = value
    return exported


@pytest.fixture(scope="session")
def slurm() -> Iterator[str]:
    """A running one-node Slurm with accounting (2 CPUs, no GPUs); SLURM_CONF is set for the
    session."""
    conf = start_service("slurm.sh")["SLURM_CONF"]
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SLURM_CONF", conf)
        yield conf


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """The URL of a running PostgreSQL database for tests (role and database `autotune`)."""
    return start_service("postgres.sh")["AUTOTUNE_TEST_POSTGRES"]


@pytest.fixture(scope="session")
def slurm_ends(slurm: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Batch]:
    """The trials of helpers_slurm_ends, in folders whose names hold a space, a quote and a
    command substitution; the first test of test_slurm_outcomes.py starts them all (those that
    mostly wait start with the session)."""
    root = tmp_path_factory.mktemp("ends") / "it's a $(touch pwned) folder"
    with ThreadPoolExecutor(32) as pool:
        batch = Batch(pool, root)
        yield batch
        batch.cleanup()


@pytest.fixture(scope="session", autouse=True)
def _waiting_trials_started(request: pytest.FixtureRequest) -> None:
    """Start the trials that mostly wait (helpers_slurm_ends.EARLY) with the session, when it
    collected a test that checks them."""
    if any("slurm_ends" in item.fixturenames for item in request.session.items):
        request.getfixturevalue("slurm_ends").start(EARLY)
