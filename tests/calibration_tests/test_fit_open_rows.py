"""The published-runs fit treats a row whose settings are open as a one-sided bound."""

from __future__ import annotations

import pytest

from autotune.calibration.fit import Measured
from autotune.calibration.fit import fit_constants
from autotune.calibration.fit import predicted_step_s
from autotune.costmodel.constants import constants_for
from autotune.frameworks import get_framework
from autotune.layout import Layout
from autotune.specs.inputs import load_config

CFG = load_config("llama3-8b", "dgx-h100:1", seq_length=4096, global_batch_size=64)
TRUTH = constants_for(CFG.cluster.gpu, CFG.train.software_stack).model_copy(
    update={"gemm_efficiency": 0.7})


def _point(name: str, text: str | list[str], slower: float = 1.0) -> Measured:
    """A run measured at the TRUTH model's step time of its first layout, times `slower`."""
    texts = [text] if isinstance(text, str) else text
    megatron = get_framework("megatron")
    layouts = tuple(Layout.parse(t, CFG.world_size, CFG.train.global_batch_size, megatron)
                    for t in texts)
    stated = Measured(name, CFG, layouts[:1], 1.0, CFG.cluster.gpu.name)
    return Measured(name, CFG, layouts, predicted_step_s(stated, TRUTH) * slower,
                    CFG.cluster.gpu.name)


@pytest.mark.parametrize("bound", [False, True])
def test_an_open_row_slower_than_its_fastest_candidate(bound: bool) -> None:
    """Oracle: step times made by the model itself at gemm_efficiency 0.7 (worked out by the
    model, not fitted). Two stated rows anchor the fit; a third row leaves recompute open
    (none or full) and ran with full recompute. As a one-sided bound (`open_as_bound`) it is
    consistent with the truth (its fastest candidate, no recompute, runs faster than what ran)
    and the fit recovers 0.7; as a two-sided point its fastest candidate is forced onto the
    slower measurement and drags the GEMM efficiency down."""
    points = [_point("a", "tp=1,pp=1,zero=1,mbs=1,recompute=none"),
              _point("b", "tp=2,pp=1,zero=1,mbs=2,recompute=none,sp=on"),
              _point("open", ["tp=1,pp=1,zero=1,mbs=2,recompute=full",
                              "tp=1,pp=1,zero=1,mbs=2,recompute=none"])]
    start = TRUTH.model_copy(update={"gemm_efficiency": 0.6})
    fitted = fit_constants(points, start, ("gemm_efficiency",), loss="linear",
                           open_as_bound=bound)
    if bound:
        assert fitted.gemm_efficiency == pytest.approx(0.7, rel=1e-3)
    else:
        assert fitted.gemm_efficiency < 0.68
