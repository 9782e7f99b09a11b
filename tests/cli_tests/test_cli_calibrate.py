"""`autotune calibrate --from-runs` and `--calibration FILE` through the real CLI entry point."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from autotune.calibration.file import load_calibration
from tests.cli_tests.helpers_cli import assert_usage_error
from tests.cli_tests.helpers_cli import cli

RUNS = "layout,step_time_s\n" + "\n".join(
    f"\"{layout}\",{step}" for layout, step in [
        ("tp=8,pp=1,mbs=1", 9.1), ("tp=4,pp=2,mbs=1", 9.8), ("tp=2,pp=4,mbs=1", 11.0),
        ("tp=8,pp=1,mbs=2", 8.7), ("tp=4,pp=1,mbs=1", 10.4), ("tp=2,pp=1,mbs=1", 12.5)])
"""Step times typed by hand (seconds), as a user's own measurements would be."""


def test_from_runs_then_estimate_uses_it(tmp_path: Path) -> None:
    """The refit writes a file; estimate with --calibration prints different figures from the
    preset's and names the calibration in its JSON inputs; the refit's fitted values are the
    file's."""
    runs = tmp_path / "runs.csv"
    runs.write_text(RUNS)
    out = tmp_path / "cal.yaml"
    done = cli("calibrate", "-m", "llama3-8b", "-c", "dgx-h100:1", "--from-runs", runs,
               "--out", out)
    assert done.code == 0, done.err
    calibration = load_calibration(out)
    assert calibration.source == "runs" and len(calibration.points) == 6
    args = ("estimate", "-m", "llama3-8b", "-c", "dgx-h100:1", "-l", "tp=8,mbs=1", "--json")
    plain, calibrated = cli(*args), cli(*args, "--calibration", out)
    assert plain.code == 0 and calibrated.code == 0, calibrated.err
    a, b = json.loads(plain.out), json.loads(calibrated.out)
    assert a["step_time_s"] != b["step_time_s"]
    assert b["step_time_s"] == calibration.points[0].predicted_s


def test_other_gpu_is_exit_2_in_one_line(tmp_path: Path) -> None:
    """A file made for an H100 applied to an A100 problem: exit 2, one line naming both."""
    runs = tmp_path / "runs.csv"
    runs.write_text(RUNS)
    out = tmp_path / "cal.yaml"
    assert cli("calibrate", "-m", "llama3-8b", "-c", "dgx-h100:1", "--from-runs", runs,
               "--out", out).code == 0
    refused = cli("estimate", "-m", "llama3-8b", "-c", "dgx-a100:1", "-l", "tp=8,mbs=1",
                  "--calibration", out)
    assert refused.code == 2
    assert len(refused.error_lines) == 1
    assert "h100-sxm-80gb" in refused.err and "a100-sxm-80gb" in refused.err
    assert yaml.safe_load(out.read_text())["gpu"]["name"] == "h100-sxm-80gb"


def test_other_software_stack_is_exit_2_unless_overridden(tmp_path: Path) -> None:
    """A file whose torch release differs from this one's (2.5 against the installed 2.13):
    exit 2, one line naming torch and both versions and the override; with
    --ignore-calibration-mismatch the same estimate runs and uses the file."""
    runs = tmp_path / "runs.csv"
    runs.write_text(RUNS)
    out = tmp_path / "cal.yaml"
    assert cli("calibrate", "-m", "llama3-8b", "-c", "dgx-h100:1", "--from-runs", runs,
               "--out", out).code == 0
    data = yaml.safe_load(out.read_text())
    here = data["software"]["torch"]
    data["software"]["torch"] = "2.5.1"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    args = ("estimate", "-m", "llama3-8b", "-c", "dgx-h100:1", "-l", "tp=8,mbs=1", "--json",
            "--calibration", out)
    assert_usage_error(cli(*args), "torch 2.5.1 in the file", here,
                       "--ignore-calibration-mismatch")
    forced = cli(*args, "--ignore-calibration-mismatch")
    assert forced.code == 0, forced.err
    assert json.loads(forced.out)["step_time_s"] == load_calibration(out).points[0].predicted_s


def test_runner_choices_are_refused_in_one_line(tmp_path: Path) -> None:
    """calibrate runs its workers here or through Slurm; own runs need neither; a runner that
    only simulates or runs commands measures no devices."""
    runs = tmp_path / "runs.csv"
    runs.write_text(RUNS)
    both = cli("calibrate", "-m", "llama3-8b", "-c", "dgx-h100:1", "--from-runs", runs,
               "--runner", "slurm", "--out", tmp_path / "cal.yaml")
    assert_usage_error(both, "--runner slurm", "--from-runs")
    assert_usage_error(cli("calibrate", "-m", "tiny-gpt", "-c", "local", "--runner", "simulate"),
                       "--runner", "simulate", "local or slurm")


def test_a_calibrated_cpu_estimate_names_its_calibration_not_the_defaults(tmp_path: Path) -> None:
    """No published run covers the CPU "GPU": with --calibration the interval line still
    carries the uncalibrated mark (no measured error bound) but names the file whose constants
    the figures use, instead of the cpu preset's constants (the line without it)."""
    runs = tmp_path / "runs.csv"
    runs.write_text("layout,step_time_s\n" + "\n".join(
        f"\"{layout}\",{step}" for layout, step in [
            ("tp=1,pp=1,mbs=1", 0.9), ("tp=2,pp=1,mbs=1", 1.2), ("tp=1,pp=2,mbs=1", 1.1),
            ("tp=1,pp=1,mbs=2", 0.8)]))
    out = tmp_path / "cal.yaml"
    assert cli("calibrate", "-m", "tiny-gpt", "-c", "local", "--from-runs", runs,
               "--out", out).code == 0
    args = ("estimate", "-m", "tiny-gpt", "-c", "local", "-l", "tp=1,mbs=1")
    plain, calibrated = cli(*args), cli(*args, "--calibration", out)
    assert calibrated.code == 0, calibrated.err
    assert "uncalibrated: no published runs" in " ".join(plain.out.split())
    assert "cpu preset's constants" in " ".join(plain.out.split())
    line = " ".join(calibrated.out.split())
    assert "uncalibrated: no published runs" in line and out.name in line
    assert "cpu preset's constants" not in line
