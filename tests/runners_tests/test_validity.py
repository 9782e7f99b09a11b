"""The validity gate: impossible figures and layouts the framework did not run are `invalid`,
never ranked, never fitted; pitfalls carry their fix."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from autotune.layout import Layout
from autotune.measurement import STATUSES
from autotune.measurement import Measurement
from autotune.runners.command import CommandRunner
from autotune.runners.validity import gate
from autotune.runners.validity import pitfalls_of
from autotune.search.refit import refit_study
from autotune.search.settings import TuneSettings
from autotune.search.study import tune
from autotune.space.search_space import load_space
from autotune.specs.inputs import load_config

LLAMA = load_config("llama3-8b", "dgx-h100:1")
SPACE = load_space(None, "megatron").model_copy(
    update={"tp": [1, 2], "pp": [1], "cp": [1], "vpp": [1], "zero": [1], "offload": ["none"],
            "mbs": [1], "recompute": ["full"], "sp": [False]}
)
"""Two layouts of Llama 3 8B on one DGX H100: tp 1 and tp 2, dp filling the node."""


def test_invalid_is_a_status() -> None:
    assert "invalid" in STATUSES


def test_an_impossible_throughput_is_invalid_never_ranked_never_fitted(tmp_path: Path) -> None:
    """Oracle: a real subprocess prints the figures; Optuna's storage holds the trials.

    1e12 tokens/s for Llama 3 8B (6 · 8e9 FLOPs per token at least) on 8 H100s is ~6e9
    TFLOP/s per GPU against a 989 TFLOP/s bf16 peak. Before, it ranked #1 at MFU 2,727,442 %
    and the refit pushed three constants to their bounds. 5e4 tokens/s (~300 TFLOP/s per GPU,
    MFU ~30 %) is plausible and ranks.
    """
    script = tmp_path / "trial.sh"
    script.write_text('case "$1" in tp=1,*) echo \'{"tokens_per_s": 1e12}\';;\n'
                      '*) echo \'{"tokens_per_s": 5e4}\';; esac\n')
    runner = CommandRunner(f"bash {script} {{layout}}", timeout_s=30)

    result = tune(LLAMA, SPACE, runner, TuneSettings(trials=2, render=False), tmp_path / "out")

    by_tp = {r["layout_fields"]["tp"]: r for r in result.records if r.get("ran")}
    impossible, plausible = by_tp[1], by_tp[2]
    assert impossible["status"] == "invalid"
    assert "above the h100-sxm-80gb peak of 989.4 TFLOP/s (bf16)" in impossible["reason"]
    assert "measured_tokens_per_s" not in impossible and impossible["value"] == 0.0
    assert plausible["status"] == "ok"
    assert [r["number"] for r in result.ranked] == [plausible["number"]]
    report = refit_study(LLAMA, result.records, space=SPACE)
    assert [t.number for t in report.trials] == [plausible["number"]]
    assert report.failures.get("invalid") == 1
    assert not report.fitted  # one measured trial: nothing to fit, constants untouched


def _ok(**extra: Any) -> Measurement:
    return Measurement("ok", step_time_s=1.0, tokens_per_s=1000.0, tflops_per_gpu=1.0,
                       mfu=0.001, extra=extra)


DP2 = Layout(dp=2, zero=1)
DP2_CFG = load_config("tiny-gpt", "dgx-h100:1")
READ = {"world_size": 2, "tp": 1, "pp": 1, "dp": 2, "cp": 1, "ep": 1, "zero": 1,
        "offload": "none", "mbs": 1, "gas": 1, "precision": "fp32"}
"""What a DeepSpeed engine reports for DP2 (worked out from the layout by hand)."""


def test_a_read_back_that_matches_the_layout_passes() -> None:
    assert gate(DP2_CFG, DP2, _ok(ran=READ)).status == "ok"


@pytest.mark.parametrize(("change", "fragment"), [
    ({"zero": 0}, "zero ran 0, layout asks 1"),
    ({"world_size": 1, "dp": 1}, "world_size ran 1, layout asks 2; dp ran 1, layout asks 2"),
    ({"precision": "bf16"}, "precision ran 'bf16', layout asks 'fp32'"),
    ({"gas": 4}, "gas ran 4, layout asks 1"),
])
def test_a_read_back_that_differs_is_invalid(change: dict[str, Any], fragment: str) -> None:
    m = gate(DP2_CFG, DP2, _ok(ran={**READ, **change}))
    assert m.status == "invalid" and fragment in m.reason
    assert m.tokens_per_s is None and m.extra["rejected_figures"]["tokens_per_s"] == 1000.0


def test_tensor_parallel_peers_that_disagree_are_invalid() -> None:
    """Ranks 0 and 1 are the tp peers of replica 0: 9.10 vs 9.20 differ by 1 %."""
    ranks = [{"rank": 0, "dp": 0, "tp": 0, "losses": [9.1, 9.0]},
             {"rank": 1, "dp": 0, "tp": 1, "losses": [9.2, 9.0]}]
    m = gate(DP2_CFG, Layout(tp=2, dp=1), _ok(ranks=ranks))
    assert m.status == "invalid"
    assert "replica 0 disagree on the loss at measured step 0 (rank 0: 9.1, rank 1: 9.2)" in (
        m.reason)


def test_identical_data_across_data_parallel_ranks_is_invalid() -> None:
    ranks = [{"rank": r, "dp": r, "losses": [9.0], "data": [11, 12]} for r in range(2)]
    m = gate(DP2_CFG, DP2, _ok(ranks=ranks))
    assert m.status == "invalid" and "ranks [0, 1] trained on identical tokens" in m.reason
    assert "DistributedSampler" in m.reason
    distinct = [{"rank": r, "dp": r, "data": [11 + r, 12]} for r in range(2)]
    assert gate(DP2_CFG, DP2, _ok(ranks=distinct)).status == "ok"


def test_a_slow_rank_and_a_stalling_loader_are_pitfalls_with_their_fix() -> None:
    """Rank 1 computes 0.5 s where rank 0 computes 0.2 s (2.5x); rank 0 loads 0.3 s of a 1 s
    step (30 % > 10 %)."""
    ranks = [{"rank": 0, "dp": 0, "compute_s": [0.2, 0.2, 0.2], "data_s": [0.3, 0.3, 0.3]},
             {"rank": 1, "dp": 1, "compute_s": [0.5, 0.5, 0.5], "data_s": [0.0, 0.0, 0.0]}]
    found = pitfalls_of(ranks, 1.0)
    assert len(found) == 2
    assert found[0].startswith("rank 1 is persistently slower: its compute takes 2.50x")
    assert found[1].startswith("data loading takes 30 % of the step") and "num_workers" in found[1]
    m = gate(DP2_CFG, DP2, _ok(ranks=ranks))
    assert m.status == "ok" and m.extra["pitfalls"] == found
    even = [{**r, "compute_s": [0.2, 0.21, 0.2], "data_s": [0.01]} for r in ranks]
    assert pitfalls_of(even, 1.0) == []
    # CPU workers sharing cores differ by up to 1.5x in correct runs: flagged from 2x there
    uneven = [{**r, "compute_s": [0.2 * (1 + 0.5 * r["rank"])] * 3, "data_s": [0.01]}
              for r in ranks]
    cpu = load_config("tiny-gpt", "local", processes=2, framework="deepspeed")
    assert gate(DP2_CFG, DP2, _ok(ranks=uneven)).extra["pitfalls"][0].startswith("rank 1")
    assert "pitfalls" not in gate(cpu, DP2, _ok(ranks=uneven)).extra
    assert gate(cpu, DP2, _ok(ranks=ranks)).extra["pitfalls"][0].startswith("rank 1")


def test_failures_pass_through() -> None:
    oom = Measurement("oom", reason="CUDA out of memory")
    assert gate(DP2_CFG, DP2, oom) is oom


def test_a_measured_cpu_peak_has_slack() -> None:
    """The CPU stand-in's peak is a 0.1 s single-core timing: 5x above it passes, 11x is
    impossible (bound 10x)."""
    cpu = load_config("tiny-gpt", "local", processes=2, framework="deepspeed")
    peak = cpu.cluster.gpu.peak_tflops[cpu.train.precision]
    for factor, status in ((5.0, "ok"), (11.0, "invalid")):
        m = Measurement("ok", step_time_s=1.0, tokens_per_s=1.0, tflops_per_gpu=factor * peak)
        assert gate(cpu, Layout(dp=2), m).status == status
