"""The report's study line and figures note say what happened, and no more."""

from __future__ import annotations

import warnings
from pathlib import Path

import optuna

from autotune.report import write_report
from autotune.report.data import write_run_json
from autotune.runners.simulate import SimulateRunner
from autotune.search.settings import TuneSettings
from autotune.search.storage import open_storage
from autotune.search.study import tune
from autotune.space.search_space import load_space
from autotune.specs.inputs import load_config


def test_the_study_line_and_the_figures_note_say_what_happened(tmp_path: Path) -> None:
    """Oracle: what the study was made to do, read back from its Optuna journal: three trials
    at --noise 0 all run (no "rest" to explain, and the figures are the model's own, exactly:
    no perturbed constants, and no error printed as −0.0%); one more, queued with tp·pp = 8·8
    on 8 GPUs (worked by hand: 64 does not divide 8), is rejected by a rule beside a fourth
    run, and the line counts it."""
    cfg = load_config("llama3-8b", "dgx-h100:1")
    storage = f"journal:{tmp_path / 'study.journal'}"
    write_run_json(tmp_path, study_name="exact", storage=storage, runner="simulate",
                   runner_options={"noise": 0.0, "seed": 0})
    options = TuneSettings(trials=3, storage=storage, study="exact", render=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        first = tune(cfg, load_space(None, "megatron"), SimulateRunner(noise=0.0), options,
                     tmp_path)
    assert all(r.get("ran") for r in first.records)
    md = write_report(tmp_path)["report.md"].read_text()
    assert "3 ran on the simulate runner." in md and "did not run" not in md
    assert "rejected by rules" not in md and "perturbed" not in md
    assert "autotune's own model, exactly" in md and "−0.0%" not in md

    study = optuna.load_study(study_name="exact", storage=open_storage(first.storage))
    study.enqueue_trial({"tp": 8, "pp": 8, "cp": 1, "vpp": 1, "zero": 1, "offload": "none",
                         "mbs": 1, "recompute": "none", "sp": True})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tune(cfg, load_space(None, "megatron"), SimulateRunner(noise=0.0),
             options.model_copy(update={"resume": True, "trials": 4}), tmp_path)
    md = write_report(tmp_path)["report.md"].read_text()
    line = next(line for line in md.splitlines() if line.startswith("- Study:"))
    assert ("5 trials (4 ok, 1 infeasible); 4 ran on the simulate runner; the other 1 did not "
            "run: 1 rejected by rules.") in line, line
