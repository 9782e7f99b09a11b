"""CPU trials' allocator setting: gloo's worker threads and glibc's per-thread arenas.

Oracle: two real gloo processes (torch.distributed, no DeepSpeed) and glibc's own account of
its arenas (`malloc_info`, read by `autotune.workloads.common.malloc_arenas`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.layout import Layout
from autotune.runners.base import CPU_ALLOCATOR_ENV
from autotune.runners.base import TrialPlan
from autotune.runners.local import LocalRunner
from autotune.runners.local import free_port
from autotune.specs.inputs import load_config

REPO = Path(__file__).resolve().parents[2]
MIB = 2**20
WORKER = """
import json, torch, torch.distributed as dist
from autotune.workloads.common import malloc_arenas
dist.init_process_group("gloo")
big = torch.ones(16 * 2**20, dtype=torch.uint8)
del big  # a mapped chunk freed: glibc's mmap threshold rises to 16 MiB
for _ in range(4):  # all-gathers of 4 MiB per rank: gloo's flat output is 8 MiB
    out = [torch.empty(2**20) for _ in range(2)]
    dist.all_gather(out, torch.ones(2**20))
heaps = malloc_arenas()
if dist.get_rank() == 0:
    print("ARENAS " + json.dumps(heaps), flush=True)
dist.barrier()
"""


def _arenas(extra: dict[str, str]) -> list[tuple[int, int]]:
    """Rank 0's arenas (held, free bytes) after the all-gathers, with `extra` set."""
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port()),
           "WORLD_SIZE": "2", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    env.pop("MALLOC_ARENA_MAX", None)
    env.update(extra)
    procs = [subprocess.Popen([sys.executable, "-c", WORKER], env={**env, "RANK": str(rank)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for rank in range(2)]
    outputs = [proc.communicate(timeout=120) for proc in procs]
    assert all(proc.returncode == 0 for proc in procs), outputs[0][1][-2000:]
    line = next(text for text in outputs[0][0].splitlines() if text.startswith("ARENAS "))
    return [tuple(heap) for heap in json.loads(line[len("ARENAS "):])]


def test_gloo_temporaries_stay_in_thread_arenas_unless_one_arena() -> None:
    """By default gloo's worker thread allocates each all-gather's flat output (2 x 4 MiB) in
    its own arena, where it stays free and resident after the collective; with the trials'
    `MALLOC_ARENA_MAX=1` there is only the main arena, whose free chunks the training thread
    reuses."""
    default = _arenas({})
    assert len(default) >= 2
    assert sum(free for _, free in default[1:]) >= 8 * MIB
    assert len(_arenas(CPU_ALLOCATOR_ENV)) == 1


def test_cpu_trials_get_one_arena_unless_the_user_sets_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The local runner's environment: CPU clusters get CPU_ALLOCATOR_ENV, a value the user's
    environment sets wins, GPU clusters get nothing (worked out from the rule by hand)."""
    cpu = load_config("tiny-gpt", "local", framework="deepspeed", processes=2)
    runner = LocalRunner(steps=2, warmup=1)
    plan = TrialPlan(cpu, Layout(dp=2, mbs=1, gas=1), 0, tmp_path)
    assert runner.environment(plan)["MALLOC_ARENA_MAX"] == "1"
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert "MALLOC_ARENA_MAX" not in runner.environment(plan)
    gpu = load_config("llama3-8b", "dgx-h100:1", framework="deepspeed")
    gpu_plan = TrialPlan(gpu, Layout(tp=8, mbs=1, gas=1), 0, tmp_path)
    monkeypatch.delenv("MALLOC_ARENA_MAX")
    assert "MALLOC_ARENA_MAX" not in runner.environment(gpu_plan)
