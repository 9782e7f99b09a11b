"""`autotune verify DIR`: bad input is one line and exit 2 (the real runs are in
tests/scaling_tests/test_verify_losses.py)."""

from __future__ import annotations

from pathlib import Path

from helpers_cli import assert_usage_error
from helpers_cli import cli


def test_verify_needs_a_training_runner_and_a_folder(tmp_path: Path) -> None:
    assert_usage_error(cli("verify", str(tmp_path), "--runner", "simulate"),
                       "--runner", "needs a runner that trains", "'simulate'")
    assert_usage_error(cli("verify", str(tmp_path / "nope")), "is not a folder")
    assert_usage_error(cli("verify", str(tmp_path), "--steps", "1"), "--steps: 1")


def test_verify_of_a_study_without_a_measured_trial(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = cli("tune", "-m", "tiny-gpt", "-c", "dgx-h100:1", "--runner", "command", "--command",
               "echo '{\"tokens_per_s\": 1e30}' # {layout}", "--trials", "1", "--out", str(out))
    assert done.code == 1, done.err  # the only trial is invalid: no throughput measured
    assert_usage_error(cli("verify", str(out)), "has no trial that measured a throughput")


def test_tune_verify_needs_a_training_runner(tmp_path: Path) -> None:
    assert_usage_error(cli("tune", "-m", "tiny-gpt", "-c", "dgx-h100:1", "--verify",
                           "--out", str(tmp_path / "out")),
                       "--verify", "needs --runner local or slurm", "simulate")
