"""The fit's second descent, from the middle of the bounds, out of a robust loss's plateau."""

from __future__ import annotations

import pytest

from autotune.calibration.fit import fit_constants
from tests.calibration_tests.test_fit_open_rows import TRUTH
from tests.calibration_tests.test_fit_open_rows import _point


@pytest.mark.parametrize("midpoint", [False, True])
def test_a_start_on_the_plateau_of_the_robust_loss(midpoint: bool) -> None:
    """Oracle: step times made by the model itself at gemm_efficiency 0.7 (worked out by the
    model, not fitted). Started at 0.95 with a Cauchy loss of scale 0.03, both runs are about 30 %
    off, ten scales out, where the loss is nearly flat and a prior of spread 1 holds the
    descent near its start (0.94). From the middle of the bounds (0.5-0.95: 0.69) the descent
    reaches the truth, whose cost is lower, so that end is kept."""
    points = [_point("a", "tp=1,pp=1,zero=1,mbs=1,recompute=none"),
              _point("b", "tp=2,pp=1,zero=1,mbs=2,recompute=none,sp=on")]
    start = TRUTH.model_copy(update={"gemm_efficiency": 0.95})
    fitted = fit_constants(points, start, ("gemm_efficiency",), prior_sd=1.0,
                           robust_scale=0.03, midpoint_start=midpoint)
    if midpoint:
        assert fitted.gemm_efficiency == pytest.approx(0.7, abs=0.005)
    else:
        assert fitted.gemm_efficiency > 0.9
