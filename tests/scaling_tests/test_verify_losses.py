"""verify: the winner's loss curve against pure data parallelism's, real CPU DeepSpeed runs."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from autotune.exceptions import AutotuneError
from autotune.layout import Layout
from autotune.runners.local import LocalRunner
from autotune.runners.simulate import SimulateRunner
from autotune.specs.inputs import load_config
from autotune.trial import TrialPipeline
from autotune.verify import TOLERANCE
from autotune.verify import VERIFY_JSON
from autotune.verify import compare
from autotune.verify import reference_layout
from autotune.verify import verify
from autotune.workloads.instruments import FAULTS_ENV

CFG = load_config("tiny-gpt", "local", processes=2, framework="deepspeed", seq_length=64,
                  global_batch_size=8)
TP2 = Layout(tp=2, dp=1, zero=1, mbs=2, gas=4)


def test_the_reference_is_pure_data_parallel_with_the_same_batch() -> None:
    """By hand: 2 processes, micro-batch 2, global batch 8 → dp 2, gas 2, ZeRO 0 fits."""
    reference = reference_layout(TrialPipeline(CFG, SimulateRunner()), TP2)
    assert (reference.tp, reference.pp, reference.cp, reference.dp) == (1, 1, 1, 2)
    assert (reference.mbs, reference.gas, reference.zero) == (2, 2, 0)
    assert reference.global_batch_size == TP2.global_batch_size
    odd = Layout(tp=2, dp=1, mbs=3, gas=1)
    with pytest.raises(AutotuneError, match="global batch 3 is not a multiple of micro-batch 3"):
        reference_layout(TrialPipeline(CFG, SimulateRunner()), odd)


def test_compare_worked_by_hand() -> None:
    """9.0 vs 9.0009 is 1e-4 relative: inside fp32's 1e-4; 9.1 vs 9.0 (1.1e-2) is not."""
    assert compare([9.0, 8.9], [9.0, 8.9], TOLERANCE["fp32"])[2] == ""
    worst, step, reason = compare([9.0, 9.1], [9.0, 9.0], TOLERANCE["fp32"])
    assert step == 1 and worst == pytest.approx(0.1 / 9.0)
    assert reason.startswith("loss at step 1 is 9.1 against the reference's 9 (1.11e-02")
    assert compare([9.0, math.nan], [9.0, 9.0], 1.0)[2].startswith("loss at step 1 is nan")
    assert "recorded 1 and 2 losses" in compare([9.0], [9.0, 9.0], 1.0)[2]


@pytest.mark.slow
@pytest.mark.parametrize("fault", [None, "grad_bug"])
def test_verify_passes_a_correct_layout_and_fails_a_numerical_bug(
    tmp_path: Path, fault: str | None
) -> None:
    """Oracle: the reference run (pure dp, real DeepSpeed). tp=2 (AutoTP) trains the same
    model, so its losses agree to fp32 rounding; with tensor-parallel rank 1 scaling its
    gradients by 4 (the grad_bug fault; the reference has no tp rank 1) the curves part after
    the first optimizer step."""
    env = {FAULTS_ENV: fault} if fault else {}
    runner = LocalRunner(steps=3, warmup=0, timeout_s=600, env=env)
    result = verify(CFG, TP2, runner, tmp_path)
    written = json.loads((tmp_path / VERIFY_JSON).read_text())
    assert written["passed"] == result.passed and len(result.winner_losses) == 3
    assert result.winner_losses[0] == pytest.approx(result.reference_losses[0], rel=1e-5)
    if fault is None:
        assert result.passed, result.reason
        assert result.max_rel_diff is not None and result.max_rel_diff <= TOLERANCE["fp32"]
    else:
        assert not result.passed
        assert result.worst_step is not None and result.worst_step >= 1
        assert "does not train the same model" in result.reason
