"""Term scales: which term of the step time is wrong, from trials (hand-worked oracles)."""

from __future__ import annotations

import numpy as np
import pytest

from autotune.calibration.term_scales import TERM_PRIOR_SD
from autotune.calibration.term_scales import TERMS
from autotune.calibration.term_scales import breakdown_seconds
from autotune.calibration.term_scales import fit_terms
from autotune.calibration.term_scales import term_seconds

NAMES = list(TERMS)
COMPUTE, PIPELINE, ZERO3 = (NAMES.index(n) for n in ("compute", "pipeline", "zero3_gather"))


def _terms(rows: list[dict[str, float]]) -> np.ndarray:
    out = np.zeros((len(rows), len(TERMS)))
    for i, row in enumerate(rows):
        for name, seconds in row.items():
            out[i, NAMES.index(name)] = seconds
    return out


def test_term_seconds_sums_the_parts_of_each_term() -> None:
    """Oracle: the grouping restated by hand: compute = compute + optimizer, pipeline =
    bubble + p2p."""
    parts = {p: np.array([0.0]) for names in TERMS.values() for p in names}
    parts.update(compute=np.array([2.0]), optimizer=np.array([0.5]),
                 pp_bubble=np.array([0.3]), pp_p2p=np.array([0.1]))
    seconds = term_seconds(parts)
    assert seconds[0, COMPUTE] == pytest.approx(2.5)
    assert seconds[0, PIPELINE] == pytest.approx(0.4)
    assert seconds.sum() == pytest.approx(2.9)


def test_trials_that_differ_in_one_term_find_that_term() -> None:
    """Oracle: worked by hand. Three trials: compute 1 s each, pipeline 0, 0.2 and 0.4 s
    modelled; the truth runs the pipeline 1.5x slower (measured 1.0, 1.3, 1.6 s). Only the
    pipeline scale explains the slope: it comes out near 1.5 and compute near 1 (one global
    factor cannot fit 1.0, 1.3 and 1.6 at once)."""
    terms = _terms([{"compute": 1.0}, {"compute": 1.0, "pipeline": 0.2},
                    {"compute": 1.0, "pipeline": 0.4}])
    fit = fit_terms(terms, np.array([1.0, 1.3, 1.6]))
    scales = fit.scales()
    assert scales["pipeline"] == pytest.approx(1.5, rel=0.05)
    assert scales["compute"] == pytest.approx(1.0, abs=0.02)
    # a term no trial has keeps its prior: scale 1, σ TERM_PRIOR_SD
    assert scales["zero3_gather"] == pytest.approx(1.0)
    assert fit.sd()["zero3_gather"] == pytest.approx(TERM_PRIOR_SD, rel=1e-3)
    assert fit.sd()["pipeline"] < 0.2 * TERM_PRIOR_SD
    # an untried layout with a large ZeRO-3 share is uncertain by that share (delta method)
    untried = _terms([{"compute": 1.0, "zero3_gather": 1.0}])
    assert fit.log_step_sd(untried)[0] == pytest.approx(0.5 * TERM_PRIOR_SD, rel=0.05)


def test_a_measured_breakdown_names_the_term_from_one_trial() -> None:
    """Oracle: worked by hand. One trial, modelled 1 s compute + 0.5 s ZeRO-3 gathers,
    measured 2.5 s with a breakdown of 1 s compute and 1.5 s gathers: the gathers' scale is 3
    and compute's 1. Without the breakdown the total alone cannot tell the two apart (one
    trial, no share varies): both keep their prior, and the miss is left to the constants fit
    and the residuals."""
    terms = _terms([{"compute": 1.0, "zero3_gather": 0.5}])
    breakdown = breakdown_seconds([{"compute": 1.0, "zero3_gather": 1.5}])
    fit = fit_terms(terms, np.array([2.5]), breakdown)
    assert fit.scales()["zero3_gather"] == pytest.approx(3.0, rel=0.03)
    assert fit.scales()["compute"] == pytest.approx(1.0, abs=0.03)
    without = fit_terms(terms, np.array([2.5]))
    assert without.scales()["compute"] == 1.0 and without.scales()["zero3_gather"] == 1.0
    assert without.sd()["zero3_gather"] == pytest.approx(TERM_PRIOR_SD)


def test_a_term_whose_share_never_varies_keeps_its_prior() -> None:
    """Oracle: worked by hand. Two trials, each 1 s compute + 0.1 s tp communication (the
    same 9 % share), plus 0 and 0.4 s of pipeline; measured 2.2 and 2.8 s. Nothing in these
    trials tells tp communication from compute (its share is the same in both), so its scale
    stays 1 ± TERM_PRIOR_SD; the pipeline's share differs by 27 %: its scale is fitted (the
    pair of totals needs it above 1) and its σ shrinks. Before, the fit spread the miss over
    every term the trials had, tp communication included."""
    terms = _terms([{"compute": 1.0, "tp_comm": 0.1},
                    {"compute": 1.0, "tp_comm": 0.1, "pipeline": 0.4}])
    fit = fit_terms(terms, np.array([2.2, 2.8]))
    assert fit.scales()["tp_comm"] == 1.0
    assert fit.sd()["tp_comm"] == pytest.approx(TERM_PRIOR_SD)
    assert fit.scales()["pipeline"] > 1.1
    assert fit.sd()["pipeline"] < 0.5 * TERM_PRIOR_SD


def test_breakdown_seconds_skips_trials_without_one() -> None:
    """Oracle: by hand: nan where a trial has no breakdown or none of a term's parts."""
    seconds = breakdown_seconds([None, {"pp_bubble": 0.2, "pp_p2p": 0.1, "other": 9.0}])
    assert np.isnan(seconds[0]).all()
    assert seconds[1, PIPELINE] == pytest.approx(0.3)
    assert np.isnan(seconds[1, COMPUTE]) and np.isnan(seconds[1, ZERO3])


def test_draws_follow_the_posterior() -> None:
    """Oracle: the delta-method σ the fit reports; 4,000 draws of a row's log step time have
    that standard deviation within 10 %."""
    terms = _terms([{"compute": 1.0}, {"compute": 1.0, "pipeline": 0.3}])
    fit = fit_terms(terms, np.array([1.02, 1.5]))
    row = _terms([{"compute": 1.0, "pipeline": 0.3, "dp_comm": 0.5}])
    draws = fit.draws(row, 4000, np.random.default_rng(0))
    assert draws.std() == pytest.approx(fit.log_step_sd(row)[0], rel=0.1)


def test_one_gross_miss_pulls_the_scales_as_far_as_the_clip() -> None:
    """Oracle: worked by hand. Four trials: 1 s compute and 0, 0.1, 0.2, 0.3 s of pipeline,
    the truth's pipeline 2x (measured 1.0, 1.2, 1.4, 1.6 s), and a fifth, 1 s of compute
    alone, measured 6 s (a structure no term scale expresses), at a step σ of 0.1. Under
    plain least squares its log miss of 1.79 (18 σ) drags the compute scale to about 1.7
    and, to keep the four in place, the pipeline's below 1 (the wrong way); clipped at
    2.5 σ (Huber) it pulls like a 2.5 σ residual: compute stays within 25 % of 1 and the
    pipeline's scale above 1, as the four agreeing trials say."""
    terms = _terms([{"compute": 1.0, "pipeline": p} for p in (0.0, 0.1, 0.2, 0.3, 0.0)])
    measured = np.array([1.0, 1.2, 1.4, 1.6, 6.0])
    plain = fit_terms(terms, measured, step_sd=0.1).scales()
    clipped = fit_terms(terms, measured, step_sd=0.1, clip=2.5).scales()
    assert plain["compute"] > 1.5 and plain["pipeline"] < 1.0
    assert clipped["compute"] < 1.25 and clipped["pipeline"] > 1.0
