"""Scaling sweeps: shapes per size, weak/strong batches, skips, efficiency, flags, diagnosis."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from autotune.exceptions import AutotuneError
from autotune.frameworks import get_framework
from autotune.layout import Layout
from autotune.measurement import Measurement
from autotune.runners.base import Runner
from autotune.runners.base import TrialPlan
from autotune.runners.simulate import SimulateRunner
from autotune.scaling import CSV_COLUMNS
from autotune.scaling import FINE
from autotune.scaling import ScalingPoint
from autotune.scaling import _diagnose
from autotune.scaling import default_sizes
from autotune.scaling import flag_for
from autotune.scaling import lost_text
from autotune.scaling import read_scaling
from autotune.scaling import resized
from autotune.scaling import sweep
from autotune.scaling import text_table
from autotune.specs.inputs import load_config

NODES_1_TO_128 = [8 * 2**i for i in range(8)]


@pytest.fixture
def cfg8b():
    return load_config("llama3-8b", "dgx-h100:1")


@pytest.fixture
def layout8b(cfg8b) -> Layout:
    return Layout.parse("tp=2,zero=1,mbs=1,recompute=selective", cfg8b.world_size,
                        cfg8b.train.global_batch_size, get_framework("megatron"))


class Scripted(Runner):
    """A fake runner whose figures are set by hand: tokens/s = 1000 · N · efficiency[N], status
    from `statuses` (default ok). It stands in for a real one so that the sweep's arithmetic can
    be checked against values worked out by hand."""

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
    """Oracle: the documented thresholds (the field notes): fine at >= 0.7, limited at 0.5-0.7,
    bound below 0.5, each named by its cause; no cause predicted, no cause named."""
    assert flag_for(1.0) == FINE and flag_for(0.7, "bubble") == FINE
    assert flag_for(0.69, "bubble") == "bubble-limited" and flag_for(0.5) == "limited"
    assert flag_for(0.49, "communication") == "communication-bound"


def test_resized_whole_nodes_and_sub_node(cfg8b) -> None:
    """Oracle: values worked out by hand: 64 GPUs are 8 whole DGX nodes; 4 GPUs are part of one
    node with the same NVLink; 12 GPUs are neither."""
    big = resized(cfg8b, 64, 1024)
    assert (big.cluster.nodes, big.cluster.gpus_per_node, big.world_size) == (8, 8, 64)
    assert big.cluster.name == "dgx-h100:8" and big.train.global_batch_size == 1024
    small = resized(cfg8b, 4, 256)
    assert (small.cluster.nodes, small.cluster.gpus_per_node) == (1, 4)
    assert small.cluster.intra_node_gb_s == cfg8b.cluster.intra_node_gb_s
    with pytest.raises(AutotuneError, match="whole nodes of 8"):
        resized(cfg8b, 12, 256)


def test_weak_keeps_per_replica_batch(cfg8b, layout8b, tmp_path: Path) -> None:
    """Oracle: the definition of weak scaling (README: tp, pp, cp fixed, dp grows, the per-replica
    batch mbs·gas kept), worked out for each size; and the documented Runner lifecycle (check
    every size, then prepare, then cleanup)."""
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
    """Oracle: the definition of strong scaling worked out by hand: a batch of 96 on dp 4 (8 GPUs
    at tp 2) is 24 micro-batches, on dp 8 12; on dp 64 it does not divide, so that size is
    skipped naming the batch and mbs·dp."""
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
    """Oracle: worked out by hand: 1 GPU holds no tp=2 replica, 12 GPUs are not whole 8-GPU nodes,
    8 GPUs run."""
    result = sweep(cfg8b, layout8b, [1, 12, 8], "weak", Scripted({}), tmp_path)
    reasons = {p.gpus: (p.status, p.reason) for p in result.points}
    assert reasons[1][0] == "skipped" and "does not divide 1 GPUs" in reasons[1][1]
    assert reasons[12][0] == "skipped" and "whole nodes" in reasons[12][1]
    assert reasons[8][0] == "ok"


def test_efficiency_flags_and_base_is_smallest_that_ran(cfg8b, layout8b,
                                                        tmp_path: Path) -> None:
    """Oracle: the efficiency definition applied to the fake runner's hand-set figures: the 4-GPU
    point failed, so the base is 8 GPUs and each efficiency is the one the runner was given."""
    runner = Scripted({16: 0.9, 32: 0.6, 64: 0.4}, statuses={4: "oom"})
    result = sweep(cfg8b, layout8b, [4, 8, 16, 32, 64], "weak", runner, tmp_path)
    assert result.base is not None and result.base.gpus == 8
    points = {p.gpus: p for p in result.points}
    assert points[4].status == "oom" and points[4].efficiency is None
    assert points[8].efficiency == pytest.approx(1.0)
    assert points[16].efficiency == pytest.approx(0.9) and points[16].flag == FINE
    assert points[32].efficiency == pytest.approx(0.6) and points[32].flag.endswith("limited")
    assert points[64].efficiency == pytest.approx(0.4) and points[64].flag.endswith("bound")


def test_rule_violations_are_recorded_not_run(tmp_path: Path) -> None:
    """Oracle: the documented contract of a sweep: a size a rule refuses is recorded (rule and
    reason), not run; only the other size reaches the runner."""
    cfg = load_config("llama3-70b", "dgx-h100:16")
    layout = Layout.parse("tp=4,cp=2,zero=2", cfg.world_size, cfg.train.global_batch_size,
                          get_framework("megatron"))
    runner = Scripted({})
    result = sweep(cfg, layout, [8, 128], "strong", runner, tmp_path)
    small = result.points[0]
    assert small.status == "infeasible" and small.rule == "memory_fits"
    assert "GiB" in small.reason
    assert [plan.cfg.world_size for plan in runner.plans] == [128]


def test_diagnosis_worked_out_by_hand() -> None:
    """Oracle: the module docstring's formulas worked out by hand. Parts per GPU per sequence:
    base (8 GPUs, 64 sequences) compute 8 s → 8·8/64 = 1.0; at 16 GPUs compute 4 s, reduce 1 s
    → 1.0 + 0.25, predicted efficiency 1/1.25 = 0.8, the reduce costs 0.25/1.25 = 0.2; at 32
    GPUs compute 2, reduce 1, bubble 0.5 → 1.0 + 0.5 + 0.25, predicted 1/1.75, the reduce
    costs 0.5/1.75 and the bubble 0.25/1.75. Measured: 1000, 800 and 400 tokens/s per GPU:
    efficiency 1, 0.8, 0.4, the last bound by communication. The point at 4 GPUs ran out of
    memory: the base is the smallest size that ran."""
    shape = {"nodes": 1, "gpus_per_node": 8, "dp": 1, "gas": 1, "global_batch_size": 64}
    points = _diagnose([
        ScalingPoint(**{**shape, "gpus": 4}, status="oom"),
        ScalingPoint(**{**shape, "gpus": 8}, status="ok", tokens_per_s=8000.0,
                     predicted_time_parts={"compute": 8.0}),
        ScalingPoint(**{**shape, "gpus": 16}, status="ok", tokens_per_s=12800.0,
                     predicted_time_parts={"compute": 4.0, "dp_comm": 1.0}),
        ScalingPoint(**{**shape, "gpus": 32}, status="ok", tokens_per_s=12800.0,
                     predicted_time_parts={"compute": 2.0, "dp_comm": 1.0, "pp_bubble": 0.5}),
    ])
    oom, base, middle, last = points
    assert oom.efficiency is None and base.efficiency == 1.0 and base.grew == ""
    assert (middle.efficiency, middle.flag) == (pytest.approx(0.8), FINE)
    assert middle.predicted_efficiency == pytest.approx(0.8)
    assert (middle.grew, middle.grew_loss) == ("dp_comm", pytest.approx(0.2))
    assert (last.efficiency, last.flag) == (pytest.approx(0.4), "communication-bound")
    assert last.predicted_efficiency == pytest.approx(1 / 1.75)
    assert (last.grew, last.grew_loss) == ("dp_comm", pytest.approx(0.5 / 1.75))
    assert last.lost == pytest.approx({"communication": 0.5 / 1.75, "bubble": 0.25 / 1.75,
                                       "memory": 0.0, "compute": 0.0})
    assert lost_text(last.lost) == "communication 28.6%, bubble 14.3%"


def test_a_growing_bubble_is_named_not_communication() -> None:
    """Oracle: worked out by hand: base 8 GPUs, compute 8 s for 64 sequences (1.0 GPU·s per
    sequence); at 16 GPUs compute 4, bubble 1.5, reduce 0.2 → 1.0 + 0.375 + 0.05: the bubble
    costs 0.375/1.425 = 26.3%, communication 0.05/1.425 = 3.5%; measured 600 of 1000 tokens/s
    per GPU, efficiency 0.6: bubble-limited (a strong sweep on a pipeline: fewer micro-batches
    per replica), which the flag used to call communication-limited."""
    shape = {"nodes": 1, "gpus_per_node": 8, "dp": 1, "gas": 1, "global_batch_size": 64}
    _, point = _diagnose([
        ScalingPoint(**{**shape, "gpus": 8}, status="ok", tokens_per_s=8000.0,
                     predicted_time_parts={"compute": 8.0}),
        ScalingPoint(**{**shape, "gpus": 16}, status="ok", tokens_per_s=9600.0,
                     predicted_time_parts={"compute": 4.0, "pp_bubble": 1.5, "dp_comm": 0.2}),
    ])
    assert point.efficiency == pytest.approx(0.6) and point.flag == "bubble-limited"
    assert point.cause == "bubble"
    assert point.lost["bubble"] == pytest.approx(0.375 / 1.425)
    assert point.lost["communication"] == pytest.approx(0.05 / 1.425)


def test_simulated_1_to_128_nodes_names_the_dp_reduce(tmp_path: Path) -> None:
    """Oracle: reasoning worked out by hand: in a strong sweep at fixed tp·pp·cp each GPU
    reduces the same gradient bytes per step (a ring moves ~2·P/tp per GPU at any dp) while its
    share of the step's tokens falls as 1/dp, so the data-parallel reduce is the part whose
    per-token cost grows; and a 70B model's states do not fit one 8-GPU node at tp 4 · cp 2
    (memory_fits) until ZeRO-2 shards them over more GPUs."""
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
    assert "DP gradient reduce" in text_table(result)


def test_writes_json_and_csv(cfg8b, layout8b, tmp_path: Path) -> None:
    """Oracle: the documented files of a sweep (scaling.json, scaling.csv with its columns, one
    point.json per size)."""
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
    """Oracle: the documented Runner contract: a runner that needs artifacts gets them in the
    point's own folder, rendered for that size (2 nodes for 16 GPUs)."""
    runner = Scripted({}, needs_artifacts=True)
    sweep(cfg8b, layout8b, [16], "weak", runner, tmp_path)
    plan = runner.plans[0]
    assert plan.artifacts
    assert all(path.parent == plan.directory for path in plan.artifacts.values())
    manifest = json.loads((plan.directory / "manifest.json").read_text())
    assert manifest["inputs"]["cluster"]["nodes"] == 2


def test_bad_arguments(cfg8b, layout8b, tmp_path: Path) -> None:
    """Oracle: the documented error contract: one AutotuneError naming the bad mode or size."""
    with pytest.raises(AutotuneError, match="weak or strong"):
        sweep(cfg8b, layout8b, [8], "sideways", SimulateRunner(), tmp_path)  # type: ignore[arg-type]
    with pytest.raises(AutotuneError, match="positive"):
        sweep(cfg8b, layout8b, [0, 8], "weak", SimulateRunner(), tmp_path)


def test_default_sizes(cfg8b, layout8b) -> None:
    """Oracle: worked out by hand: powers of two up to the cluster that hold one replica
    (tp·pp·cp GPUs): 2, 4, 8 for tp 2 on one 8-GPU node; 8 to 128 for tp 4 · cp 2 on 16
    nodes."""
    assert default_sizes(cfg8b, layout8b) == [2, 4, 8]
    cfg = load_config("llama3-70b", "dgx-h100:16")
    layout = Layout.parse("tp=4,cp=2", cfg.world_size, 512, get_framework("megatron"))
    assert default_sizes(cfg, layout) == [8, 16, 32, 64, 128]
