"""The Optuna study: rules recorded, warm start, no duplicate work, resume, rendered winners."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from autotune.exceptions import AutotuneError
from autotune.runners.command import CommandRunner
from autotune.runners.simulate import SimulateRunner
from autotune.search.settings import TuneSettings
from autotune.search.study import recover_interrupted
from autotune.search.study import tune
from autotune.space.search_space import load_space
from autotune.specs.inputs import load_config

CFG = load_config("llama3-8b", "dgx-h100:4")
SPACE = load_space(None, "megatron")


def test_tune_simulate_renders_winners(tmp_path: Path) -> None:
    """Oracle: the study's own records and the rendered manifest on disk."""
    result = tune(
        CFG,
        SPACE,
        SimulateRunner(noise=0.1, seed=3),
        TuneSettings(trials=8, top_k=2), tmp_path,
    )
    ran = [r for r in result.records if r.get("ran")]
    assert len(ran) == 8
    assert len({r["layout_id"] for r in ran}) == 8, "a layout ran twice"
    # the first trials are the warm start, each with the sampler's reason on record
    assert result.records[0]["warm_start"] == 1
    assert result.records[0]["proposal"]["reason"] == "warm-start"
    best = result.ranked[0]
    assert best["measured_tokens_per_s"] == max(r["measured_tokens_per_s"] for r in ran)
    manifest = json.loads((tmp_path / "best" / "manifest.json").read_text())
    assert manifest["measured"]["tokens_per_s"] == pytest.approx(best["measured_tokens_per_s"])
    runners_up = sorted(p.name for p in (tmp_path / "top").iterdir())
    assert runners_up == [f"{rank}-{result.ranked[rank - 1]['layout_id']}" for rank in (2, 3)]
    second = json.loads((tmp_path / "top" / runners_up[0] / "manifest.json").read_text())
    assert second["measured"]["trial"] == result.ranked[1]["number"]
    assert (tmp_path / "study.db").exists()


def test_a_queued_rule_breaking_layout_is_recorded_and_not_run(tmp_path: Path) -> None:
    """Oracle: tp·pp = 8·8 = 64 cannot divide 32 GPUs (worked by hand); Optuna's storage."""
    options = TuneSettings(trials=1, render=False)
    first = tune(CFG, SPACE, SimulateRunner(), options, tmp_path)
    study = optuna.load_study(study_name=first.study_name, storage=first.storage)
    study.enqueue_trial({"tp": 8, "pp": 8, "cp": 1, "vpp": 1, "zero": 1, "offload": "none",
                         "mbs": 1, "recompute": "none", "sp": True})

    result = tune(CFG, SPACE, SimulateRunner(),
                  options.model_copy(update={"resume": True, "trials": 2}), tmp_path)

    rejected = [r for r in result.records if r["status"] == "infeasible"]
    assert len(rejected) == 1 and rejected[0]["rule"] == "world_divisible_by_tp_pp_cp"
    assert "8·8·1" in rejected[0]["reason"] and "32 GPUs" in rejected[0]["reason"]
    assert not rejected[0].get("ran") and rejected[0]["value"] == 0.0
    assert sum(1 for r in result.records if r.get("ran")) == 2


def test_parallel_jobs_do_not_duplicate_work(tmp_path: Path) -> None:
    """Oracle: the study's records; three threads claim layouts and none runs twice."""
    result = tune(
        CFG,
        SPACE,
        SimulateRunner(noise=0.05),
        TuneSettings(trials=10, jobs=3, render=False), tmp_path,
    )
    ran = [r["layout_id"] for r in result.records if r.get("ran")]
    assert len(ran) == len(set(ran)) >= 10


def test_resume_keeps_completed_trials_and_retries_interrupted(tmp_path: Path) -> None:
    """Oracle: Optuna's journal storage, with a RUNNING trial left as a killed worker would."""
    options = TuneSettings(trials=4, render=False,
                           storage="journal:" + str(tmp_path / "journal.log"))
    first = tune(CFG, SPACE, SimulateRunner(), options, tmp_path)
    study = optuna.load_study(
        study_name=first.study_name,
        storage=optuna.storages.JournalStorage(
            optuna.storages.journal.JournalFileBackend(str(tmp_path / "journal.log"))
        ),
    )
    # a worker killed mid-trial leaves a RUNNING trial behind
    abandoned = study.ask()
    abandoned.suggest_categorical("tp", list(SPACE.resolved(CFG).tp))  # as the study asks
    with pytest.raises(AutotuneError, match="--resume"):
        tune(CFG, SPACE, SimulateRunner(), options, tmp_path)
    resumed = tune(
        CFG,
        SPACE,
        SimulateRunner(),
        options.model_copy(update={"resume": True, "trials": 7}),
        tmp_path,
    )
    numbers = {r["number"]: r for r in resumed.records}
    for r in first.records:
        assert numbers[r["number"]]["value"] == r["value"], "a completed trial changed"
    assert numbers[abandoned.number]["state"] == "FAIL"
    assert any(r.get("retry_of") == abandoned.number for r in resumed.records)
    assert sum(1 for r in resumed.records if r.get("ran")) == 7


def test_resume_refuses_other_inputs(tmp_path: Path) -> None:
    """Oracle: the error message; 8 nodes are not the 4 the study was made for."""
    options = TuneSettings(trials=2, render=False)
    tune(CFG, SPACE, SimulateRunner(), options, tmp_path)
    other = load_config("llama3-8b", "dgx-h100:8")
    with pytest.raises(AutotuneError, match="other inputs"):
        tune(
            other,
            SPACE,
            SimulateRunner(),
            options.model_copy(
                update={"resume": True, "study": "llama3-8b-dgx-h100:4-megatron"}),
            tmp_path,
        )


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "trial.py"
    path.write_text(body)
    return f"{sys.executable} {path} {{layout_json}} {{trial_dir}}"


def test_command_runner_measures_and_survives_failures(tmp_path: Path) -> None:
    """Oracle: a real subprocess per trial that crashes, prints no JSON, or measures (20 s or
    10 s per step of 512 × 2048 tokens on 8 A100s: MFU 18 % and 36 %, physical)."""
    body = """
import json, sys, time
layout = json.load(open(sys.argv[1]))
if layout["zero"] == 2:
    sys.exit(7)                      # a crash
if layout["zero"] == 3:
    print("not json at all")         # bad output
    sys.exit(0)
for step in range(3):
    print(json.dumps({"event": "step", "tokens_per_s": 1000.0 * layout["mbs"]}), flush=True)
print(json.dumps({"step_time_s": 20.0 / layout["mbs"], "peak_memory_gb": 12.5}))
"""
    runner = CommandRunner(_script(tmp_path, body), timeout_s=60)
    space = SPACE.model_copy(
        update={
            "tp": [1],
            "pp": [1],
            "cp": [1],
            "vpp": [1],
            "zero": [1, 2, 3],
            "offload": ["none"],
            "mbs": [1, 2],
            "recompute": ["selective"],
            "sp": [False],
        }
    )
    small = load_config("gpt3-1.3b", "dgx-a100:1")
    result = tune(
        small, space, runner, TuneSettings(trials=6, render=False), tmp_path / "out"
    )
    by_zero = {}
    for r in result.records:
        if r.get("ran"):
            by_zero.setdefault(r["layout_fields"]["zero"], []).append(r)
    assert all(r["status"] == "crash" and "exit code 7" in r["reason"] for r in by_zero[2])
    assert all(r["status"] == "crash" and "no JSON" in r["reason"] for r in by_zero[3])
    oks = [r for r in by_zero[1] if r["status"] == "ok"]
    assert oks and oks[0]["measured_peak_memory_bytes"] == pytest.approx(12.5e9)
    trial_dir = Path(oks[0]["trial_dir"])
    for name in ("layout.json", "command.sh", "stdout.log", "manifest.json"):
        assert (trial_dir / name).exists()


def test_command_runner_timeout_kills_the_process(tmp_path: Path) -> None:
    """Oracle: /proc: the timed-out command's process no longer exists."""
    marker = tmp_path / "pid"
    body = f"""
import os, time
open({str(marker)!r}, "w").write(str(os.getpid()))
time.sleep(60)
"""
    runner = CommandRunner(_script(tmp_path, body), timeout_s=1.5)
    space = SPACE.model_copy(
        update={
            k: [v]
            for k, v in dict(
                tp=1, pp=1, cp=1, vpp=1, zero=1, offload="none", mbs=1, recompute="none", sp=False
            ).items()
        }
    )
    small = load_config("gpt3-1.3b", "dgx-a100:1")
    result = tune(
        small,
        space,
        runner,
        TuneSettings(trials=1, render=False, warm_start=1), tmp_path / "o",
    )
    assert result.records[0]["status"] == "timeout"
    pid = int(marker.read_text())
    assert not Path(f"/proc/{pid}").exists(), "the timed-out command is still running"


def test_unknown_placeholder_is_a_clear_error() -> None:
    """Oracle: the error message names the placeholders."""
    with pytest.raises(AutotuneError, match="placeholder"):
        CommandRunner("run {nope}")
    plan_free = CommandRunner("""echo '{"a": 1}' {layout}""")
    assert "{layout}" in plan_free.template


def test_study_states_are_plain_optuna(tmp_path: Path) -> None:
    """Oracle: Optuna's own load_study and trial states."""
    result = tune(
        CFG, SPACE, SimulateRunner(), TuneSettings(trials=3, render=False), tmp_path
    )
    study = optuna.load_study(study_name=result.study_name, storage=result.storage)
    assert study.best_trial.user_attrs["status"] == "ok"
    assert all(t.state in (TrialState.COMPLETE, TrialState.PRUNED) for t in study.trials)
    assert recover_interrupted(study) == 0
