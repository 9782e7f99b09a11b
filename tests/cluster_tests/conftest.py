"""Real services for the cluster tests: a one-node Slurm and a PostgreSQL server on localhost.

Each fixture runs its script in tests/services/ once per session (the scripts install the Debian
packages when missing and reuse running daemons), and skips only when that is impossible here:
not root, or apt cannot install the packages. The Slurm trial that waits for Slurm's time limit
(1 minute at least) runs in the background from the first Slurm test on.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from concurrent.futures import Future
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from helpers_cluster import first_layout
from helpers_cluster import tiny_config
from helpers_cluster import trial_plan

from autotune.runners.base import Measurement
from autotune.runners.slurm import SlurmRunner

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
def time_limit_trial(slurm: str, tmp_path_factory: pytest.TempPathFactory
                     ) -> Iterator[Future[Measurement]]:
    """A 1-process trial that hangs at step 2 under `--time=1`, in the background: slurmctld
    checks time limits every 30 s, so Slurm ends it 60 to 90 s after its start."""
    cfg = tiny_config(processes=1)
    runner = SlurmRunner(time_limit="1", poll_s=1.0, steps=50, warmup=1,
                         extra_args=("--inject", "hang"), hang_timeout_s=900)
    plan = trial_plan(cfg, first_layout(cfg, "tp=1,pp=1,zero=0,mbs=4"),
                      tmp_path_factory.mktemp("time-limit"))
    with ThreadPoolExecutor(1) as pool:
        yield pool.submit(runner.run, plan)
        runner.cleanup()
