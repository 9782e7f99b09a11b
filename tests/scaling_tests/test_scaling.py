"""Scaling sweeps: shapes per size, weak/strong batches, skips, efficiency, flags, diagnosis."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from autotune.exceptions import AutotuneError
from autotune.frameworks import get_framework
from autotune.inputs import load_config
from autotune.layout import Layout
from autotune.runners.base import Measurement
from autotune.runners.base import Runner
from autotune.runners.base import TrialPlan
from autotune.runners.simulate import SimulateRunner
from autotune.scaling import BOUND
from autotune.scaling import CSV_COLUMNS
from autotune.scaling import FINE
from autotune.scaling import LIMITED
from autotune.scaling import default_sizes
from autotune.scaling import flag_for
from autotune.scaling import read_scaling
from autotune.scaling import resized
from autotune.scaling import sweep
from autotune.scaling import text_table

NODES_1_TO_128 = [8 * 2**i for i in range(8)]


@pytest.fixture
def cfg8b():
    return load_config("llama3-8b", "dgx-h100:1")


@pytest.fixture
def layout8b(cfg8b) -> Layout:
    return Layout.parse("tp=2,zero=1,mbs=1,recompute=selective", cfg8b.world_size,
                        cfg8b.train.global_batch_size, get_framework("megatron"))


class Scripted(Runner):
    """Tokens/s = per_gpu · N · efficiency[N]; status from `statuses` (default ok)."""

    name = "scripted"

    def __init__(self, efficiency: dict[int, float], statuses: dict[int, str] | None = None,
                 needs_artifacts: bool = False) -> None:
        self.efficiency, self.statuses = efficiency, statuses or {}
        self.needs_artifacts = needs_artifacts
        self.plans: list[TrialPlan] = []
        self.events: list[str] = []

    def check(self, cfg) -> None:
        self.events.append(f"check {cfg.world_size}")

    def prepare(self) -> None:
        self.events.append("prepare")

    def cleanup(self) -> None:
        self.events.append("cleanup")

    def run(self, plan: TrialPlan) -> Measurement:
        self.plans.append(plan)
        n = plan.cfg.world_size
        status = self.statuses.get(n, "ok")
        if status != "ok":
            return Measurement(status, reason=f"scripted {status} at {n}")
        rate = 1000.0 * n * self.efficiency.get(n, 1.0)
        return Measurement("ok", tokens_per_s=rate, step_time_s=1.0, mfu=0.4,
                           peak_memory_bytes=1e9)


def test_flag_thresholds() -> None:
    assert flag_for(1.0) == FINE and flag_for(0.7) == FINE
    assert flag_for(0.69) == LIMITED and flag_for(0.5) == LIMITED
    assert flag_for(0.49) == BOUND


def test_resized_whole_nodes_and_sub_node(cfg8b) -> None:
    big = resized(cfg8b, 64, 1024)
    assert (big.cluster.nodes, big.cluster.gpus_per_node, big.world_size) == (8, 8, 64)
    assert big.cluster.name == "dgx-h100:8" and big.train.global_batch_size == 1024
    small = resized(cfg8b, 4, 256)
    assert (small.cluster.nodes, small.cluster.gpus_per_node) == (1, 4)
    assert small.cluster.intra_node_gb_s == cfg8b.cluster.intra_node_gb_s
    with pytest.raises(AutotuneError, match="whole nodes of 8"):
        resized(cfg8b, 12, 256)


def test_weak_keeps_per_replica_batch(cfg8b, layout8b, tmp_path: Path) -> None:
    runner = Scripted({})
    result = sweep(cfg8b, layout8b, [32, 4, 16, 8], "weak", runner, tmp_path)
    assert [p.gpus for p in result.points] == [4, 8, 16, 32]
    for plan in runner.plans:
        lay = plan.layout
        assert (lay.tp, lay.pp, lay.cp, lay.zero, lay.mbs, lay.recompute, lay.sp) == (
            2, 1, 1, 1, 1, "selective", True)
        assert lay.gas == layout8b.gas
        assert lay.dp == plan.cfg.world_size // 2
        assert plan.cfg.train.global_batch_size == lay.mbs * lay.dp * lay.gas
        assert plan.directory == tmp_path / "scale" / str(plan.cfg.world_size)
    # every size is checked before the first one runs (Runner lifecycle)
    assert runner.events == ["check 4", "check 8", "check 16", "check 32", "prepare", "cleanup"]


def test_strong_keeps_global_batch_and_skips_indivisible(tmp_path: Path) -> None:
    cfg = load_config("llama3-8b", "dgx-h100:1", global_batch_size=96)
    layout = Layout.parse("tp=2,zero=1", cfg.world_size, 96, get_framework("megatron"))
    result = sweep(cfg, layout, [4, 8, 16, 128], "strong", Scripted({}), tmp_path)
    by_size = {p.gpus: p for p in result.points}
    assert by_size[8].global_batch_size == 96 and by_size[8].gas == 24
    assert by_size[16].gas == 12
    assert by_size[128].status == "skipped"
    assert "global batch 96" in by_size[128].reason and "1·64" in by_size[128].reason


def test_sizes_without_a_replica_or_whole_nodes_are_skipped(cfg8b, layout8b,
                                                            tmp_path: Path) -> None:
    result = sweep(cfg8b, layout8b, [1, 12, 8], "weak", Scripted({}), tmp_path)
    reasons = {p.gpus: (p.status, p.reason) for p in result.points}
    assert reasons[1][0] == "skipped" and "does not divide 1 GPUs" in reasons[1][1]
    assert reasons[12][0] == "skipped" and "whole nodes" in reasons[12][1]
    assert reasons[8][0] == "ok"


def test_efficiency_flags_and_base_is_smallest_that_ran(cfg8b, layout8b,
                                                        tmp_path: Path) -> None:
    runner = Scripted({16: 0.9, 32: 0.6, 64: 0.4}, statuses={4: "oom"})
    result = sweep(cfg8b, layout8b, [4, 8, 16, 32, 64], "weak", runner, tmp_path)
    assert result.base is not None and result.base.gpus == 8
    points = {p.gpus: p for p in result.points}
    assert points[4].status == "oom" and points[4].efficiency is None
    assert points[8].efficiency == pytest.approx(1.0)
    assert points[16].efficiency == pytest.approx(0.9) and points[16].flag == FINE
    assert points[32].efficiency == pytest.approx(0.6) and points[32].flag == LIMITED
    assert points[64].efficiency == pytest.approx(0.4) and points[64].flag == BOUND


def test_rule_violations_are_recorded_not_run(tmp_path: Path) -> None:
    cfg = load_config("llama3-70b", "dgx-h100:16")
    layout = Layout.parse("tp=4,cp=2,zero=2", cfg.world_size, cfg.train.global_batch_size,
                          get_framework("megatron"))
    runner = Scripted({})
    result = sweep(cfg, layout, [8, 128], "strong", runner, tmp_path)
    small = result.points[0]
    assert small.status == "infeasible" and small.rule == "memory_fits"
    assert "GiB" in small.reason
    assert [plan.cfg.world_size for plan in runner.plans] == [128]


def test_simulated_1_to_128_nodes_names_the_dp_reduce(tmp_path: Path) -> None:
    """The 70B winner's strong sweep loses efficiency to the data-parallel reduce."""
    cfg = load_config("llama3-70b", "dgx-h100:16")
    layout = Layout.parse("tp=4,cp=2,zero=2", cfg.world_size, cfg.train.global_batch_size,
                          get_framework("megatron"))
    result = sweep(cfg, layout, NODES_1_TO_128, "strong", SimulateRunner(), tmp_path)
    ran = [p for p in result.points if p.ok]
    # the base is the smallest size that fits; the smaller ones are infeasible (memory)
    assert all(p.rule == "memory_fits" for p in result.points if p.gpus < ran[0].gpus)
    assert ran[0].gpus >= 64 and ran[-1].gpus == 1024
    last = ran[-1]
    assert last.grew == "dp_comm" and 0 < last.grew_loss < 1
    assert last.efficiency == pytest.approx(last.predicted_efficiency, rel=1e-6)
    assert last.efficiency < 1
    assert 1 - last.efficiency >= last.grew_loss - 1e-9
    assert "DP gradient reduce" in text_table(result)


def test_writes_json_and_csv(cfg8b, layout8b, tmp_path: Path) -> None:
    sweep(cfg8b, layout8b, [4, 8], "weak", SimulateRunner(), tmp_path)
    data = read_scaling(tmp_path)
    assert data is not None and data["mode"] == "weak" and data["base_gpus"] == 4
    assert data["inputs"]["model"]["name"] == "llama3-8b"
    assert [p["gpus"] for p in data["points"]] == [4, 8]
    with (tmp_path / "scaling.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert tuple(rows[0]) == CSV_COLUMNS and rows[1]["flag"] == FINE
    point = json.loads((tmp_path / "scale" / "8" / "point.json").read_text())
    assert point["measurement"]["status"] == "ok"


def test_renders_artifacts_for_runners_that_need_them(cfg8b, layout8b, tmp_path: Path) -> None:
    runner = Scripted({}, needs_artifacts=True)
    sweep(cfg8b, layout8b, [16], "weak", runner, tmp_path)
    plan = runner.plans[0]
    assert plan.artifacts
    assert all(path.parent == plan.directory for path in plan.artifacts.values())
    manifest = json.loads((plan.directory / "manifest.json").read_text())
    assert manifest["inputs"]["cluster"]["nodes"] == 2


def test_bad_arguments(cfg8b, layout8b, tmp_path: Path) -> None:
    with pytest.raises(AutotuneError, match="weak or strong"):
        sweep(cfg8b, layout8b, [8], "sideways", SimulateRunner(), tmp_path)  # type: ignore[arg-type]
    with pytest.raises(AutotuneError, match="positive"):
        sweep(cfg8b, layout8b, [0, 8], "weak", SimulateRunner(), tmp_path)


def test_default_sizes(cfg8b, layout8b) -> None:
    assert default_sizes(cfg8b, layout8b) == [2, 4, 8]
    cfg = load_config("llama3-70b", "dgx-h100:16")
    layout = Layout.parse("tp=4,cp=2", cfg.world_size, 512, get_framework("megatron"))
    assert default_sizes(cfg, layout) == [8, 16, 32, 64, 128]
