"""A real study with the local runner: DeepSpeed trials on 2 CPU processes, every dimension."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers_runners import SPACE
from helpers_runners import leftovers
from helpers_runners import pin_trials

from autotune.calibration.refit import refit_study
from autotune.layout import Layout
from autotune.runners.local import LocalRunner
from autotune.search.settings import TuneSettings
from autotune.search.study import tune
from autotune.specs import AutotuneConfig

LAYOUTS = [
    Layout(dp=2, zero=0, mbs=4, gas=1),
    Layout(dp=2, zero=1, mbs=1, gas=4),
    Layout(dp=2, zero=2, offload="optimizer", mbs=4, gas=1),
    Layout(dp=2, zero=3, mbs=4, gas=1),
    Layout(pp=2, dp=1, zero=1, mbs=4, gas=2),
    Layout(tp=2, dp=1, zero=1, mbs=4, gas=2),
    Layout(cp=2, dp=1, zero=0, mbs=4, gas=2),
]
"""ZeRO 0-3, optimizer offload, pp, tp (AutoTP), cp (Ulysses) and two micro-batch sizes."""


def _summary(trial_dir: Path) -> dict:
    records = [json.loads(line) for line in (trial_dir / "metrics.jsonl").read_text().splitlines()]
    return next(r for r in records if r.get("event") == "summary")


@pytest.mark.slow
def test_study_measures_every_dimension_and_picks_the_fastest(
    tmp_path: Path, cfg: AutotuneConfig
) -> None:
    """Oracle: real DeepSpeed on 2 CPU processes: every layout trains, DeepSpeed's own summary
    reports the ZeRO stage it built and fewer local parameters under tp or pp, tokens/s = tokens
    per step / measured step time, and the study's best is the fastest measured trial."""
    pin_trials(tmp_path, cfg, SPACE, LAYOUTS)
    runner = LocalRunner(steps=3, warmup=1, hang_timeout_s=120, startup_timeout_s=600)
    # measure every trial to the end
    options = TuneSettings(trials=len(LAYOUTS), resume=True, top_k=1, pruner_tolerance=1.0)

    result = tune(cfg, SPACE, runner, options, tmp_path)

    ran = [r for r in result.records if r.get("ran")]
    assert [r["layout_id"] for r in ran] == [lay.id for lay in LAYOUTS]
    assert all(r["status"] == "ok" for r in ran), [(r["layout"], r.get("reason")) for r in ran]
    for record, layout in zip(ran, LAYOUTS, strict=True):
        folder = Path(record["trial_dir"])
        for name in ("command.sh", "stdout.log", "stderr.log", "metrics.jsonl", "ds_config.json"):
            assert (folder / name).is_file(), name
        assert "--nproc_per_node 2" in (folder / "command.sh").read_text()
        assert record["measured_step_time_s"] > 0 and record["measured_peak_memory_bytes"] > 0
        assert record["measured_tokens_per_s"] == pytest.approx(
            cfg.train.tokens_per_step / record["measured_step_time_s"]
        )
        assert 0 < record["measured_mfu"] and record["predicted"]["step_time_s"] > 0
        summary = _summary(folder)  # what DeepSpeed really built
        assert summary["zero_stage"] == layout.zero
        if layout.offload == "optimizer":
            ds_config = json.loads((folder / "ds_config.json").read_text())
            assert ds_config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
        if layout.tp > 1 or layout.pp > 1:  # each rank holds part of the model
            assert summary["params_local"] < _summary(Path(ran[0]["trial_dir"]))["params_local"]

    best = max(ran, key=lambda r: r["measured_tokens_per_s"])
    assert result.ranked[0]["number"] == best["number"]
    manifest = json.loads((tmp_path / "best" / "manifest.json").read_text())
    assert manifest["measured"]["trial"] == best["number"]
    assert manifest["layout"]["id"] == best["layout_id"]

    # the refit reads real records (its accuracy is the calibration tests' and benchmarks'
    # business: scored on the trials it was fitted to it proves nothing, and it can go up)
    report = refit_study(cfg, result.records, space=SPACE)
    assert len(report.trials) == len(LAYOUTS)
    assert report.untried and not {c.layout.id for c in report.untried} & {
        lay.id for lay in LAYOUTS
    }
    print(report.table())
    assert leftovers(tmp_path) == []
