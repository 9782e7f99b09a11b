"""The calibration's Slurm job script and what a run across nodes adds (no cluster needed).

Oracles: the sizes and the arithmetic worked out by hand, shellcheck and bash on the rendered
script. A run across nodes cannot happen on the one-node test cluster, so the points of one
are written here by hand (cluster_tests/test_slurm_calibrate.py runs the job for real).
"""

from __future__ import annotations

import json
import shlex
import subprocess
from pathlib import Path

from autotune.calibration.calibrate import device_warnings
from autotune.calibration.calibrate import not_measured
from autotune.calibration.file import Device
from autotune.calibration.file import Point
from autotune.calibration.kernel_fit import measured_figures
from autotune.calibration.kernel_fit import screen
from autotune.calibration.slurm_bench import calibration_script
from autotune.calibration.slurm_bench import lost_job
from autotune.calibration.slurm_bench import slurm_runner
from autotune.runners.slurm import SlurmSettings
from autotune.runners.slurm_client import JobInfo
from autotune.specs.inputs import load_config


def _lint(shellcheck: str, path: Path, script: str) -> None:
    path.write_text(script)
    lint = subprocess.run([shellcheck, "-s", "bash", str(path)], capture_output=True, text=True,
                          check=False)
    assert lint.returncode == 0, lint.stdout


def test_script_allocates_the_clusters_nodes(tmp_path: Path, shellcheck: str) -> None:
    """Two 8-GPU nodes: 2 nodes × 8 tasks with 8 GPUs each, exclusive, ranks node by node;
    2 CPU workers: 1 node × 2 tasks of 1 CPU, OMP_NUM_THREADS 1, no GPUs. The sbatch options
    come as tune takes them; a folder with a quote and `$(...)` is one shell word."""
    settings = SlurmSettings(partition="gpu", account="proj", slurm_opts=("qos=high",))
    runner = slurm_runner(settings, timeout_s=600)
    folder = tmp_path / "it's $(touch pwned)"
    gpu = calibration_script(load_config("llama3-8b", "dgx-h100:2"), folder,
                             directives=runner.directives, python="python3", threads=1)
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=8",
                 "#SBATCH --gpus-per-node=8", "#SBATCH --exclusive", "#SBATCH --partition=gpu",
                 "#SBATCH --account=proj", "#SBATCH --time=15", "#SBATCH --qos=high",
                 f"BENCH_DIR={shlex.quote(str(folder.resolve()))}"):
        assert line in gpu.splitlines(), line
    assert "--distribution=block" in gpu
    assert not [line for line in gpu.splitlines() if "--cpus-per-task=" in line]
    assert "  --gpus-per-node=8 \\" in gpu.splitlines()  # srun's step asks for them too
    assert subprocess.run(["bash", "-n"], input=gpu, text=True, check=False).returncode == 0
    plain = tmp_path / "calibration"  # shellcheck flags the quoted `$(...)` of the name above
    _lint(shellcheck, tmp_path / "gpu.sbatch", gpu.replace(shlex.quote(str(folder.resolve())),
                                                           str(plain)))
    cpu = calibration_script(load_config("tiny-gpt", "local", processes=2), plain,
                             directives=[], python="python3", threads=1)
    for line in ("#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=2",
                 "#SBATCH --cpus-per-task=1", "export OMP_NUM_THREADS=1"):
        assert line in cpu.splitlines(), line
    assert "gpus" not in cpu
    _lint(shellcheck, tmp_path / "cpu.sbatch", cpu)


def _link(kind: str, ranks: list[int], gb_s: float) -> Point:
    return Point(kind=kind, op="send_recv" if kind == "send" else "all_reduce",
                 shape={"bytes": 1 << 24}, ranks=ranks, seconds=(1 << 24) / (gb_s * 1e9),
                 rate=gb_s * 1e9)


def test_links_between_nodes_are_screened_and_measured_apart() -> None:
    """Two nodes of 2 CPU workers: the ring's links inside a node move 10 GB/s and those
    between nodes 1 GB/s; neither kind is named slow beside the other, but a link between
    nodes at 0.5 GB/s (half its peer's 1 GB/s) is. The measured figures by hand: 10 GB/s inside
    a node (the fastest link or collective within one), 1.2 GB/s between nodes (the fastest
    collective over both)."""
    hosts = {0: "a", 1: "a", 2: "b", 3: "b"}
    ring = [_link("send", [0, 1], 10.0), _link("send", [1, 2], 1.0),
            _link("send", [2, 3], 9.8), _link("send", [3, 0], 1.0)]
    assert screen(ring, hosts, 0.2).slow() == []
    across = [p for p in screen(ring, hosts, 0.2).links if p.across_nodes]
    assert [link.ranks for link in across] == [[1, 2], [3, 0]]
    slow = ring[:3] + [_link("send", [3, 0], 0.5)]
    assert [line.split(":")[0] for line in screen(slow, hosts, 0.2).slow()] == [
        "link 3->0 from b (across nodes)"]
    cfg = load_config("tiny-gpt", "local", processes=2)
    cfg = cfg.model_copy(update={"cluster": cfg.cluster.model_copy(update={"nodes": 2})})
    points = [*ring, _link("collective", [0, 1], 6.0), _link("collective", [0, 1, 2, 3], 1.2)]
    cluster = measured_figures(cfg, points).cluster
    assert cluster.intra_node_gb_s == 10.0 and cluster.inter_node_gb_s == 1.2


def test_one_node_says_what_it_did_not_measure() -> None:
    """One host: the inter-node links are named unmeasured; one worker: the collectives too;
    two hosts: nothing is missing."""
    one = [Device(rank=r, host="a", device="cpu") for r in (0, 1)]
    assert [line.split(":")[0] for line in not_measured(one)] == [
        "inter-node links not measured"]
    assert len(not_measured(one[:1])) == 2
    two = [Device(rank=0, host="a", device="cpu"), Device(rank=1, host="b", device="cpu")]
    assert not_measured(two) == []


def test_workers_on_another_device_are_named() -> None:
    """Oracle: CUDA's names and memory of an H100 and an A100 (GiB, as CUDA reports them) and
    the CPU worker's, written by hand. An H100 cluster whose workers report A100s, or ran
    without CUDA, gets one line naming them; H100 workers, and CPU workers of a CPU cluster,
    get none."""
    h100 = load_config("llama3-8b", "dgx-h100:1").cluster
    cpu = load_config("tiny-gpt", "local", processes=2).cluster
    ok = [Device(rank=r, host="n1", device="NVIDIA H100 80GB HBM3", memory_gib=79.1)
          for r in (0, 1)]
    assert device_warnings(h100, ok) == []
    other = [*ok, Device(rank=2, host="n2", device="NVIDIA A100-SXM4-80GB", memory_gib=79.3),
             Device(rank=3, host="n2", device="cpu (1 threads)")]
    [line] = device_warnings(h100, other)
    assert line.startswith("workers 2 (n2), 3 (n2) report NVIDIA A100-SXM4-80GB, cpu "), line
    assert device_warnings(cpu, [Device(rank=0, host="a", device="cpu (2 threads)")]) == []


def _records(folder: Path, rank: int, host: str, *points: str) -> None:
    start = {"rank": rank, "event": "start", "pid": 100 + rank, "host": host, "device": "cpu",
             "memory_gib": 0.0}
    gemm = {"rank": rank, "kind": "gemm", "op": "mm", "dtype": "fp32",
            "shape": {"m": 8, "n": 8, "k": 8}, "seconds": 1e-5, "rate": 1e8}
    lines = [json.dumps(start), *(json.dumps(gemm) for _ in points)]
    (folder / f"rank-{rank}.jsonl").write_text("\n".join(lines) + "\n")


def test_first_failed_task_is_named_else_the_unfinished_workers(tmp_path: Path) -> None:
    """Exit files written by hand as the job's tasks write them (status, time): rank 3 killed
    by SIGKILL (bash: 128 + 9) at t=5 before rank 0 failed with 1 at t=6 is the one named, on
    its host. A node failure writes none: the state Slurm gives (NODE_FAIL, its reason; a
    JobInfo by hand, as the one-node test cluster cannot lose a node) and the workers without
    a done record are named, with their hosts."""
    for rank, host in enumerate(["a", "a", "b", "b"]):
        _records(tmp_path, rank, host, "gemm")
    (tmp_path / "exit-0").write_text("1 6.0\n")
    (tmp_path / "exit-3").write_text("137 5.0\n")
    (tmp_path / "exit-1").write_text("0 7.0\n")
    failed = JobInfo("41", "FAILED", nodes="a,b")
    message = lost_job(tmp_path, "41", failed, 4, set(), None)
    assert message.startswith("calibrate: worker 3 (pid 103 on b) was killed by SIGKILL "), message
    assert "4 points kept" in message and message.endswith("; Slurm job 41 FAILED on a,b")
    for path in tmp_path.glob("exit-*"):
        path.unlink()
    node = JobInfo("42", "NODE_FAIL", reason="NodeDown", nodes="a,b")
    message = lost_job(tmp_path, "42", node, 5, {0, 1}, None)
    assert message.startswith("calibrate: Slurm job 42 NODE_FAIL on a,b (NodeDown); workers "
                              "2 (b), 3 (b), 4 (never started) did not finish; 4 points kept")


def _gemm(rank: int, tflops: float) -> list[Point]:
    return [Point(kind="gemm", op="mm", dtype="bf16", shape={"m": n, "n": n, "k": n},
                  ranks=[rank], seconds=2 * n**3 / (tflops * 1e12), rate=tflops * 1e12)
            for n in (2048, 4096, 8192)]


def test_a_slow_node_is_named_once_a_slow_gpu_alone() -> None:
    """Three nodes of 4 GPUs at 700 TFLOP/s. When all of node n2's run at 500 (a node
    throttled as a whole), one line names n2 and its workers, 29 % below the other nodes
    (500/700 by hand), instead of four worker lines. When only GPU 9 runs at 500, the line
    names worker 9 on n2 and no node (n2's median stays 700)."""
    hosts = {r: f"n{r // 4}" for r in range(12)}
    node = [p for r in range(12) for p in _gemm(r, 500.0 if r >= 8 else 700.0)]
    assert screen(node, hosts, 0.2).slow() == [
        "node n2 (workers 8-11): GEMM 500 TFLOP/s, 29% below the median of the other nodes"]
    gpu = [p for r in range(12) for p in _gemm(r, 500.0 if r == 9 else 700.0)]
    assert screen(gpu, hosts, 0.2).slow() == [
        "worker 9 on n2: GEMM 500 TFLOP/s, 29% below the median of its peers"]
