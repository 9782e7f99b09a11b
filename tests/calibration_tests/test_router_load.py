"""calibrate's router load: the one-sequence load fitted under the 1/sqrt(sequences) law, and
the measuring process on a real DeepSpeed MoE model.

Oracles: loads generated from a known one-sequence load (the fit must return it, and stay
within the constant's range); DeepSpeed's own routing counts, through the workload's
`expert_load` (`tests/workloads_tests/test_deepspeed_moe.py` checks that against
`MOELayer.exp_counts`): a process that builds tiny-moe at initialisation and routes random
tokens must find the busiest expert above the mean, and the fitted load must explain every
pair within the residuals it reports.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from autotune.calibration.router_load import LOAD_BOUND
from autotune.calibration.router_load import router_load
from autotune.calibration.router_load import single_sequence_load
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.specs.inputs import load_config


@pytest.mark.parametrize("one", [1.0, 1.3, 2.2])
def test_the_fit_recovers_a_known_one_sequence_load(one: float) -> None:
    """Generated: load(b) = 1 + (I − 1)/sqrt(b) at b = 1, 2, 4, 8 recovers I exactly."""
    sequences = [1, 2, 4, 8]
    loads = [1 + (one - 1) / math.sqrt(b) for b in sequences]
    assert single_sequence_load(loads, sequences) == pytest.approx(one)
    assert single_sequence_load([9.0, 9.0], [1, 4]) == LOAD_BOUND


def test_dense_models_and_gpus_measure_no_router(tmp_path: Path) -> None:
    """A dense model has no router; GPUs do not run the built-in CPU workload."""
    table = LayoutTable.from_layouts([Layout.derived(2, 16, tp=1, pp=1, mbs=1)])
    dense = load_config("tiny-gpt", "local", framework="deepspeed", processes=2)
    assert router_load(dense, table, tmp_path, 1.1) is None
    gpu = load_config("mixtral-8x7b", "dgx-h100:8", framework="megatron")
    assert router_load(gpu, table, tmp_path, 1.1) is None


@pytest.mark.slow
def test_tiny_moe_router_is_unbalanced_at_initialisation(tmp_path: Path) -> None:
    """A real process (DeepSpeed's MoE on gloo, world 1): tiny-moe's router at
    initialisation sends its busiest expert more than the mean, and the 1/sqrt(sequences)
    law explains each (ep, micro-batch) pair within 25 %."""
    cfg = load_config("tiny-moe", "local", framework="deepspeed", processes=2)
    table = LayoutTable.from_layouts([Layout.derived(2, 16, tp=1, pp=1, mbs=b, ep=ep)
                                      for b in (1, 4) for ep in (1, 2)])
    fitted = router_load(cfg, table, tmp_path, 1.1)
    assert fitted is not None and fitted.points == 4 and fitted.before == 1.1
    assert 1 < fitted.value <= LOAD_BOUND and fitted.max_residual < 0.25
    assert "LOADS" in (tmp_path / "router_load.log").read_text()
