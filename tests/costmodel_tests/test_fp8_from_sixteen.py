"""FP8 GEMMs that no fp8 run identifies follow the 16-bit GEMM rate; oracle: values worked by
hand from the H100 and A100 datasheet peaks."""

from __future__ import annotations

import pytest

from autotune.costmodel.constants import Constants
from autotune.costmodel.constants import fp8_from_sixteen

H100 = {"bf16": 989.4, "fp16": 989.4, "fp8": 1978.9, "fp32": 494.7}
A100 = {"bf16": 312.0, "fp16": 312.0, "fp32": 156.0}


def test_h100_fp8_gemms_run_1_7x_the_bf16_rate() -> None:
    """0.59 of the BF16 peak, 1.7x faster, is 1.7 · 0.59 · 989.4 / 1978.9 = 0.5015 of the FP8
    peak (not the 0.65 default)."""
    k = fp8_from_sixteen(Constants(gemm_efficiency=0.59), H100)
    assert k.fp8_gemm_efficiency == pytest.approx(0.50148, abs=1e-4)
    assert k.gemm_efficiency == 0.59


def test_the_rate_stays_within_its_fit_bounds() -> None:
    """A 0.3 BF16 rate would give 0.255 of the FP8 peak, under the 0.3 lower bound: clipped."""
    assert fp8_from_sixteen(Constants(gemm_efficiency=0.3), H100).fp8_gemm_efficiency == 0.3


def test_a_gpu_without_an_fp8_peak_keeps_the_default() -> None:
    """A100 lists no FP8 peak: the constants come back as they were."""
    k = Constants(gemm_efficiency=0.7)
    assert fp8_from_sixteen(k, A100) == k
