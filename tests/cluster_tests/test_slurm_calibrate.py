"""`autotune calibrate --runner slurm` on the real one-node Slurm of localhost (2 CPUs, no GPUs).

Oracles: Slurm itself (the job id its tasks saw in SLURM_JOB_ID, its accounting in sacct, its
node name, sinfo's lack of GPUs), a worker killed with SIGKILL mid-run through its pid, and
`autotune estimate` reading the file back. Two gloo workers on one node: what the inter-node
part of a run across nodes does is not covered here (it needs a real multi-node cluster).
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers_cluster import GBS
from helpers_cluster import SEQ
from helpers_cluster import accounting

from autotune.calibration.calibrate import calibrate_cluster
from autotune.calibration.file import load_calibration
from autotune.calibration.microbench import read_points
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.runners.slurm import SlurmSettings
from autotune.specs.inputs import load_config
from tests.cli_tests.helpers_cli import assert_usage_error
from tests.cli_tests.helpers_cli import cli

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("slurm")]


@pytest.fixture(autouse=True)
def _nice_workers(tmp_path_factory: pytest.TempPathFactory,
                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The workers slurmd starts run at the lowest CPU priority, as the tests do (the job runs
    `sys.executable`, here a script that execs this interpreter under `nice -n 19`)."""
    wrapper = tmp_path_factory.mktemp("python") / "python"
    wrapper.write_text(f'#!/bin/sh\nexec nice -n 19 {shlex.quote(sys.executable)} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(wrapper))


SMALL = ("-m", "tiny-gpt", "-c", "local", "--processes", "2", "--seq", str(SEQ), "--gbs",
         str(GBS))
"""The cluster tests' tiny problem (short sequences: small GEMMs, a calibration in seconds)."""


def _node() -> str:
    """The one node of the test cluster, as Slurm names it."""
    done = subprocess.run(["sinfo", "-h", "-o", "%N"], capture_output=True, text=True,
                          check=True)
    return done.stdout.split()[0]


def _start_records(folder: Path) -> list[dict]:
    records = []
    for path in sorted(folder.glob("rank-*.jsonl")):
        records += [r for r in map(json.loads, path.read_text().splitlines())
                    if r.get("event") == "start"]
    return records


def test_calibrate_through_slurm_then_estimate(tmp_path: Path) -> None:
    """One Slurm job runs both workers in a folder whose name needs quoting; the file records
    that job (the id its tasks saw, which sacct accounts COMPLETED in that folder), Slurm's node
    name for every worker, both workers' kernels and their collectives and links, says that no
    inter-node link was measured, and `estimate --calibration` takes it."""
    folder = tmp_path / "it's a $(touch pwned) folder"
    out = folder / "cal.yaml"
    done = cli("calibrate", *SMALL, "--runner", "slurm", "--time-limit", "10", "--out", out)
    assert done.code == 0, done.err + done.out
    assert not (Path.cwd() / "pwned").exists() and not (folder / "pwned").exists()
    calibration = load_calibration(out)
    bench = out.with_suffix(".d")
    started = _start_records(bench)
    assert calibration.complete and calibration.job_id
    assert {r["slurm_job"] for r in started} == {calibration.job_id}
    record = accounting(calibration.job_id)[-1]
    assert record["State"] == "COMPLETED" and Path(record["WorkDir"]) == bench.resolve()
    assert {d.host for d in calibration.devices} == {_node()} and len(calibration.devices) == 2
    kinds = {(p.kind, tuple(p.ranks)) for p in calibration.points}
    assert {("gemm", (0,)), ("gemm", (1,)), ("collective", (0, 1)), ("send", (0, 1)),
            ("send", (1, 0))} <= kinds
    assert calibration.nodes == 1 and calibration.inter_node_gb_s is None
    assert any(line.startswith("inter-node links not measured: 1 node")
               for line in calibration.not_measured)
    assert "inter-node links not measured: 1 node" in done.out
    fastest = max(p.rate for p in calibration.points if p.kind in ("collective", "send"))
    assert f"links within a node: {fastest / 1e9:.3g} GB/s measured" in done.out
    assert "links between nodes" not in done.out
    assert f"Slurm job {calibration.job_id}" in done.out
    estimated = cli("estimate", *SMALL, "--framework", "deepspeed", "-l",
                    "tp=1,pp=1,zero=1,mbs=2", "--json", "--calibration", out)
    assert estimated.code == 0, estimated.err
    plain = cli("estimate", *SMALL, "--framework", "deepspeed", "-l", "tp=1,pp=1,zero=1,mbs=2",
                "--json")
    assert json.loads(estimated.out)["step_time_s"] != json.loads(plain.out)["step_time_s"]


LONG_PLAN = {"gemms": [[512, 512, 512]] * 200, "dtypes": ["fp32"], "attention": [],
             "attention_dtype": "fp32", "elementwise_bytes": [], "copy_bytes": [],
             "group_sizes": [2], "collective_ops": ["all_reduce"], "message_bytes": [4096],
             "collective_repeats": 4, "budget_s": 0.05}
"""Minutes of GEMMs: a run that is stopped long before it ends."""


def _once_measuring(folder: Path, then: Callable[[], None]) -> threading.Thread:
    """A thread that calls `then` once both workers wrote a point (90 s at most)."""
    def wait() -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if all(len(_lines(folder / f"rank-{r}.jsonl")) >= 2 for r in (0, 1)):
                then()
                return
            time.sleep(0.1)

    thread = threading.Thread(target=wait)
    thread.start()
    return thread


def test_lost_worker_under_slurm_is_named(tmp_path: Path) -> None:
    """Worker 1's process is killed (SIGKILL) once both workers wrote a point: srun stops the
    job, the calibration is incomplete and names worker 1, Slurm's node, the signal and the
    job, and keeps the points both workers wrote."""
    cfg = load_config("tiny-gpt", "local", framework="deepspeed", processes=2)

    def kill_worker_1() -> None:
        started = json.loads(_lines(tmp_path / "rank-1.jsonl")[0])
        os.kill(int(started["pid"]), signal.SIGKILL)

    killer = _once_measuring(tmp_path, kill_worker_1)
    calibration = calibrate_cluster(cfg, LayoutTable.from_layouts([Layout(mbs=1)]), tmp_path,
                                    plan=LONG_PLAN, slurm=SlurmSettings(time_limit="5"))
    killer.join()
    assert not calibration.complete and calibration.job_id
    failure = calibration.failure
    assert failure.startswith("calibrate: worker 1 (pid "), failure
    assert f"on {_node()})" in failure and "SIGKILL" in failure
    assert f"Slurm job {calibration.job_id} FAILED" in failure
    assert {p.ranks[0] for p in calibration.points} == {0, 1}
    assert len(read_points(tmp_path)[0]) == len(calibration.points)


def test_job_cancelled_by_someone_else_keeps_its_points(tmp_path: Path) -> None:
    """An scancel from outside (an admin, a preemption) while both workers measure: the run is
    incomplete, names the job CANCELLED (and, when a task still wrote its exit status, the
    worker SIGTERM reached first), and keeps the points."""
    cfg = load_config("tiny-gpt", "local", framework="deepspeed", processes=2)
    job = {}

    def scancel() -> None:
        job["id"] = json.loads((tmp_path / "slurm_job.json").read_text())["job_id"]
        subprocess.run(["scancel", job["id"]], check=True)

    thread = _once_measuring(tmp_path, scancel)
    calibration = calibrate_cluster(cfg, LayoutTable.from_layouts([Layout(mbs=1)]), tmp_path,
                                    plan=LONG_PLAN, slurm=SlurmSettings(time_limit="5"))
    thread.join()
    assert not calibration.complete and calibration.job_id == job["id"]
    assert f"Slurm job {job['id']} CANCELLED" in calibration.failure, calibration.failure
    assert {p.ranks[0] for p in calibration.points} == {0, 1}


def test_job_past_the_timeout_is_cancelled(tmp_path: Path) -> None:
    """A run still measuring 3 s after the job started is cancelled by calibrate: incomplete,
    the limit named, the points kept, and sacct accounts the job CANCELLED."""
    cfg = load_config("tiny-gpt", "local", framework="deepspeed", processes=2)
    calibration = calibrate_cluster(cfg, LayoutTable.from_layouts([Layout(mbs=1)]), tmp_path,
                                    plan=LONG_PLAN, slurm=SlurmSettings(time_limit="5"),
                                    timeout_s=3)
    assert not calibration.complete
    assert "did not finish within 3 s of the job's start (scancel)" in calibration.failure
    assert accounting(calibration.job_id)[-1]["State"].startswith("CANCELLED")
    assert len(calibration.points) == len(read_points(tmp_path)[0])


def test_slow_worker_under_slurm_is_named(tmp_path: Path) -> None:
    """Worker 1's task runs MKL's generic code path (`MKL_CBWR=COMPATIBLE`: several times
    slower GEMMs on Intel and AMD CPUs, as on an older or misconfigured node): the
    screening names worker 1, on Slurm's node, and only it."""
    cfg = load_config("tiny-gpt", "local", framework="deepspeed", processes=2)
    plan = {"gemms": [[256, 256, 256], [384, 384, 384], [512, 512, 512]], "dtypes": ["fp32"],
            "attention": [], "attention_dtype": "fp32", "elementwise_bytes": [1 << 20],
            "copy_bytes": [], "group_sizes": [2], "collective_ops": ["all_reduce"],
            "message_bytes": [4096, 1 << 20], "collective_repeats": 4, "budget_s": 0.01}
    calibration = calibrate_cluster(
        cfg, LayoutTable.from_layouts([Layout(mbs=1)]), tmp_path, plan=plan,
        slurm=SlurmSettings(time_limit="5"),
        worker_env={1: {"MKL_CBWR": "COMPATIBLE"}})
    assert calibration.complete, calibration.failure
    workers = [line for line in calibration.screening.slow() if line.startswith("worker")]
    assert workers == [line for line in workers if line.startswith(f"worker 1 on {_node()}:")]
    assert len(workers) == 1, calibration.screening.workers


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_bad_slurm_settings_are_refused_in_one_line(tmp_path: Path) -> None:
    """The test cluster has no gpu GRES (sinfo): calibrating an H100 node there is refused
    before anything is submitted, in one line naming the partition; a partition Slurm does not
    have is sbatch's refusal, in one line; a Slurm option without --runner slurm is refused."""
    refused = cli("calibrate", "-m", "llama3-8b", "-c", "dgx-h100:1", "--runner", "slurm",
                  "--partition", "debug", "--out", tmp_path / "cal.yaml")
    assert_usage_error(refused, "--partition debug", "no GPU nodes")
    assert not (tmp_path / "cal.d").exists()  # where the job script would have gone
    unknown = cli("calibrate", "-m", "tiny-gpt", "-c", "local", "--runner", "slurm",
                  "--partition", "nosuch", "--out", tmp_path / "cal.yaml")
    assert_usage_error(unknown, "sbatch refused the job", "nosuch")
    local = cli("calibrate", "-m", "tiny-gpt", "-c", "local", "--partition", "debug",
                "--out", tmp_path / "cal.yaml")
    assert_usage_error(local, "--partition", "--runner slurm")
