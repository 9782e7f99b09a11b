"""The CLI: tables, JSON keys, and exit code 2 with one clear line on bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from autotune.cli import _run
from autotune.cli import app

runner = CliRunner()


def _invoke(args: list[str]) -> tuple[int, str]:
    import sys

    saved = sys.argv
    sys.argv = ["autotune", *args]
    try:
        result = runner.invoke(app, args)
    finally:
        sys.argv = saved
    return result.exit_code, result.output


def test_estimate_json_keys() -> None:
    code, out = _invoke(
        [
            "estimate",
            "-m",
            "llama2-7b",
            "-c",
            "dgx-a100:1",
            "-l",
            "tp=2,zero=1,mbs=1,recompute=selective",
            "--json",
        ]
    )
    assert code == 0
    data = json.loads(out)
    for key in (
        "step_time_s",
        "tokens_per_s",
        "tflops_per_gpu",
        "hw_tflops_per_gpu",
        "mfu",
        "peak_memory_bytes",
        "memory",
        "time",
    ):
        assert key in data
    assert set(data["memory"]) == {"parts", "total"}
    assert data["memory"]["total"] == pytest.approx(sum(data["memory"]["parts"].values()))
    assert data["time"]["total"] == pytest.approx(sum(data["time"]["parts"].values()))


def test_space_json_and_table() -> None:
    code, out = _invoke(["space", "-m", "gpt3-6.7b", "-c", "dgx-a100:2", "--top", "3", "--json"])
    assert code == 0
    data = json.loads(out)
    assert len(data["top"]) == 3 and data["feasible"] > 0 and "memory_fits" in data["removed"]
    code, out = _invoke(["space", "-m", "gpt3-6.7b", "-c", "dgx-a100:2", "--top", "3"])
    assert code == 0 and "memory_fits" in out


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["space", "-m", "no-such-model", "-c", "dgx-a100:1"], "presets"),
        (["space", "-m", "gpt3-175b", "-c", "dgx-a100:1"], "no feasible layout"),
        (["estimate", "-m", "llama2-7b", "-c", "dgx-a100:1", "-l", "tp=3"], "does not divide"),
        (["space", "-m", "llama2-7b", "-c", "dgx-a100:1", "--framework", "jax"], "framework"),
        (["space", "-m", "llama2-7b", "-c", "dgx-a100:1", "--gbs", "0"], "--gbs 0"),
    ],
)
def test_bad_input_exits_2_without_traceback(args, message, capsys) -> None:
    code = _run(app, args)
    captured = capsys.readouterr()
    assert code == 2
    assert message in captured.err.replace("\n", " ")
    assert "Traceback" not in captured.err + captured.out


def test_tune_simulate_prints_where_configs_went(tmp_path) -> None:
    out = tmp_path / "run"
    code, text = _invoke(
        [
            "tune",
            "-m",
            "llama3-8b",
            "-c",
            "dgx-h100:2",
            "--trials",
            "4",
            "--out",
            str(out),
            "--noise",
            "0.05",
        ]
    )
    assert code == 0, text
    assert str(out / "best") in text.replace("\n", "")
    assert (out / "best" / "pretrain_gpt.sh").exists() and (out / "study.db").exists()
    code, text = _invoke(
        [
            "tune",
            "-m",
            "llama3-8b",
            "-c",
            "dgx-h100:2",
            "--trials",
            "4",
            "--out",
            str(out),
            "--json",
        ]
    )
    assert code != 0  # the study exists: --resume it or pick another --study
    code, text = _invoke(
        [
            "tune",
            "-m",
            "llama3-8b",
            "-c",
            "dgx-h100:2",
            "--trials",
            "6",
            "--out",
            str(out),
            "--resume",
            "--json",
        ]
    )
    assert code == 0, text
    data = json.loads(text)
    assert data["best"]["status"] == "ok" and data["artifacts"]["best"]


def test_render_one_layout(tmp_path) -> None:
    code, text = _invoke(
        [
            "render",
            "-m",
            "llama2-7b",
            "-c",
            "dgx-a100:2",
            "--framework",
            "deepspeed",
            "-l",
            "zero=3,offload=optimizer,mbs=2",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 0, text
    config = json.loads((tmp_path / "ds_config.json").read_text())
    assert config["zero_optimization"]["stage"] == 3
    assert config["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    code, text = _invoke(
        [
            "render",
            "-m",
            "llama2-7b",
            "-c",
            "dgx-a100:1",
            "-l",
            "pp=2,zero=3",
            "--out",
            str(tmp_path / "x"),
        ]
    )
    assert code != 0


@pytest.mark.slow
def test_tune_local_runner_trains_for_real(tmp_path) -> None:
    """The README's real-trial command: DeepSpeed on 2 CPU processes (gloo)."""
    out = tmp_path / "local"
    code, text = _invoke(["tune", "-m", "tiny-gpt", "-c", "local", "--runner", "local",
                          "--trials", "1", "--steps", "3", "--seq", "64", "--gbs", "4",
                          "--out", str(out), "--json"])
    assert code == 0, text
    data = json.loads(text)
    assert data["best"]["status"] == "ok" and data["best"]["measured_tokens_per_s"] > 0
    trial_dir = Path(data["best"]["trial_dir"])
    assert (trial_dir / "metrics.jsonl").exists() and (trial_dir / "ds_config.json").exists()
