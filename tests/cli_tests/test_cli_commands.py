"""The CLI: tables, JSON keys, and exit code 2 with one clear line on bad input."""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from autotune.cli.app import _run
from autotune.cli.app import app


def assert_one_error_line(err: str, fragment: str) -> None:
    """stderr is exactly one `error: ...` line that contains `fragment`."""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert fragment in lines[0], (fragment, lines[0])


def _invoke(args: list[str]) -> tuple[int, str, str]:
    """Exit code, stdout and stderr of `autotune ARGS` through `_run`, the function the console
    script's main() calls (so the exit codes are the real ones)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = _run(app, args)
    return code, out.getvalue(), err.getvalue()


def test_estimate_json_keys() -> None:
    """Oracle: the documented contract of `estimate --json` (README): its keys, and each
    breakdown's total the sum of its parts."""
    code, out, _ = _invoke(
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
    """Oracle: the documented contract of `space`: --top rows, the feasible count and what each
    rule removed (a 6.7B model does not fit every layout of 16 A100s: memory_fits removes
    some), as JSON and as a table."""
    space = ["space", "-m", "gpt3-6.7b", "-c", "dgx-a100:2", "--top", "3"]
    code, out, _ = _invoke([*space, "--json"])
    assert code == 0
    data = json.loads(out)
    assert len(data["top"]) == 3 and data["feasible"] > 0 and "memory_fits" in data["removed"]
    code, out, _ = _invoke(space)
    assert code == 0 and "memory_fits" in out
    # each predicted tokens/s carries its range: the stored measured / predicted step-time
    # ratios [low, high] make the throughput range tokens/s / high to tokens/s / low
    band = data["interval"]
    for row in data["top"]:
        tokens = row["tokens_per_s"]
        printed = (f"{tokens:,.0f} ({tokens / band['high']:,.0f}–{tokens / band['low']:,.0f})")
        assert printed in out
    assert band["key"] in out


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
    """Oracle: the documented CLI contract (README): bad input exits 2 with one `error:` line
    naming the input, never a traceback."""
    code = _run(app, args)
    captured = capsys.readouterr()
    assert code == 2
    assert_one_error_line(captured.err, message)
    assert "Traceback" not in captured.err + captured.out


def test_tune_simulate_prints_where_configs_went(tmp_path) -> None:
    """Oracle: the documented CLI contract: tune prints where the best configs went; a second
    tune into the same folder exits 2 naming --resume; --resume continues the same study."""
    out = tmp_path / "run"
    code, text, err = _invoke(
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
    code, text, err = _invoke(
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
    assert code == 2  # the study exists: --resume it or pick another --study
    assert_one_error_line(err, "pass --resume to continue it or --study NEW_NAME")
    code, text, err = _invoke(
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
    """Oracle: the documented contract of `render`: ds_config.json with the asked ZeRO stage and
    CPU optimizer offload; a layout Megatron cannot build exits 2 naming the rule."""
    code, text, err = _invoke(
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
    code, text, err = _invoke(
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
    assert code == 2
    assert_one_error_line(err, "--layout: breaks megatron_fsdp_without_pp")


@pytest.mark.slow
def test_tune_local_runner_trains_for_real(tmp_path) -> None:
    """Oracle: a real DeepSpeed run of the README's real-trial command on 2 CPU processes
    (gloo): it trains, measures a throughput and leaves its metrics and ds_config.json."""
    out = tmp_path / "local"
    code, text, err = _invoke(["tune", "-m", "tiny-gpt", "-c", "local", "--runner", "local",
                          "--trials", "1", "--steps", "3", "--seq", "64", "--gbs", "4",
                          "--out", str(out), "--json"])
    assert code == 0, text
    data = json.loads(text)
    assert data["best"]["status"] == "ok" and data["best"]["measured_tokens_per_s"] > 0
    trial_dir = Path(data["best"]["trial_dir"])
    assert (trial_dir / "metrics.jsonl").exists() and (trial_dir / "ds_config.json").exists()


def test_the_cli_imports_no_plotting_library() -> None:
    """Oracle: a fresh Python process's sys.modules. `space` and `estimate` draw nothing, so
    importing the CLI must not pay for matplotlib (the report package loads it lazily)."""
    probe = "import sys, autotune.cli.app; print('matplotlib' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True, cwd=Path(__file__).resolve().parents[2])
    assert done.stdout.strip() == "False"


def test_tune_with_an_in_memory_study_writes_its_report(tmp_path) -> None:
    """Oracle: the files on disk and a count by hand. An in-memory Optuna study is gone once
    tune returns; the report used to read it back and failed after every trial had run
    (`report: no study ... in memory`). Three trials give trials.csv a header and three rows;
    there is no study to open with optuna-dashboard."""
    out = tmp_path / "run"
    code, text, err = _invoke(["tune", "-m", "tiny-gpt", "-c", "dgx-h100:1", "--trials", "3",
                               "--storage", "memory", "--out", str(out)])
    assert code == 0, text + err
    assert len((out / "trials.csv").read_text().splitlines()) == 4
    assert (out / "report.html").is_file() and "optuna-dashboard" not in text


def test_seq_without_a_batch_warns_on_stderr() -> None:
    """Oracle: 512 preset sequences x 16,384 tokens = 8,388,608 tokens per step (by hand);
    the warning goes to stderr, the JSON on stdout stays parseable."""
    code, out, err = _invoke(["estimate", "-m", "llama3-8b", "-c", "dgx-h100:2", "--seq",
                              "16384", "-l", "tp=2,pp=1,cp=1,zero=1,mbs=1", "--json"])
    assert code == 0 and json.loads(out) and "8.39M tokens per step" in err
    code, _, err = _invoke(["estimate", "-m", "llama3-8b", "-c", "dgx-h100:2", "--seq",
                            "16384", "--gbs", "256", "-l", "tp=2,pp=1,cp=1,zero=1,mbs=1"])
    assert code == 0 and "tokens per step" not in err
