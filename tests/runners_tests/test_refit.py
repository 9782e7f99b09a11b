"""refit_study: prediction error before and after fitting, re-ranking, memory flags."""

from __future__ import annotations

from pathlib import Path

from autotune.calibration.refit import refit_study
from autotune.costmodel.constants import constants_for
from autotune.costmodel.memory import usable_gpu_bytes
from autotune.layout import Layout
from autotune.runners.simulate import SimulateRunner
from autotune.search.settings import TuneSettings
from autotune.search.study import tune
from autotune.space.search_space import load_space
from autotune.specs.inputs import load_config

CFG = load_config("llama3-8b", "dgx-h100:4")
SPACE = load_space(None, "megatron")


def test_fit_lowers_the_error_and_reranks_untried_layouts(tmp_path: Path) -> None:
    # the 'cluster' runs with constants the model does not know (seeded perturbation)
    runner = SimulateRunner(noise=0.3, seed=5)
    options = TuneSettings(trials=8, storage="memory", render=False)
    result = tune(CFG, SPACE, runner, options, tmp_path)

    report = refit_study(CFG, result.records, space=SPACE)

    errors = report.error_stats()
    assert report.fitted and len(report.trials) == 8
    assert errors["median_abs_error_before"] > 0.05
    assert errors["median_abs_error_after"] < errors["median_abs_error_before"]
    tried = {r["layout_id"] for r in result.records if r.get("ran")}
    assert report.untried and not {c.layout.id for c in report.untried} & tried
    steps = [c.fitted_step_s for c in report.untried]
    assert steps == sorted(steps)
    assert report.failures == {"ok": 8}
    text = report.table()
    assert "fitted constants: gemm_efficiency" in text and "after" in text
    assert report.to_dict()["errors"] == errors


def test_memory_mismatches_are_flagged() -> None:
    usable = usable_gpu_bytes(CFG, constants_for(CFG.cluster.gpu))
    layout = Layout(tp=8, pp=4, dp=1, zero=1, mbs=1, gas=128)

    def record(number: int, status: str, predicted_peak: float) -> dict:
        return {
            "number": number,
            "status": status,
            "ran": True,
            "layout": layout.text,
            "layout_id": layout.id,
            "layout_fields": layout.to_dict(),
            "predicted": {"peak_memory_bytes": predicted_peak},
        }

    records = [
        record(0, "oom", 0.5 * usable),
        record(1, "ok", 2.0 * usable),
        record(2, "ok", 0.5 * usable),
        record(3, "oom", 2.0 * usable),
    ]

    report = refit_study(CFG, records, space=SPACE)

    flags = {f.number: f.message for f in report.memory_flags}
    assert set(flags) == {0, 1}
    assert flags[0].startswith("predicted to fit") and "ran out of memory" in flags[0]
    assert flags[1].startswith("predicted not to fit") and flags[1].endswith("but ran")
    assert not report.fitted and report.after == report.before  # no measured step times


def test_the_report_shows_the_fit_that_ranked_the_trials(tmp_path: Path) -> None:
    """Oracle: the proposer's own refit after the study's last trial. The refit report and the
    search must hold the same constants for the same trials (one fit, `fit_trials`)."""
    from autotune.search.proposal import Outcome
    from autotune.search.proposal import Proposer
    from autotune.space.search_space import enumerate_layouts

    runner = SimulateRunner(noise=0.3, seed=7)
    options = TuneSettings(trials=6, storage="memory", render=False)
    result = tune(CFG, SPACE, runner, options, tmp_path)
    report = refit_study(CFG, result.records, space=SPACE)

    feasible = enumerate_layouts(CFG, SPACE).feasible
    proposer = Proposer(CFG, feasible, constants_for(CFG.cluster.gpu))
    ok = [Outcome(Layout(**r["layout_fields"]), "ok", float(r["measured_step_time_s"]))
          for r in result.records if r.get("status") == "ok" and r.get("measured_step_time_s")]
    searched, _ = proposer.fitted(ok)
    assert report.fitted and len(ok) == 6
    for name in report.names:
        assert getattr(report.after, name) == getattr(searched, name), name
    assert report.after != report.before
