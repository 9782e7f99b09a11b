"""`--train-script builtin`: a rendered DeepSpeed folder that trains on the user's tokens as it is.

The render goes through the CLI; the run is the folder's own launch_deepspeed.sh under bash, the
real deepspeed launcher and two CPU processes (gloo), on a token file written here."""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from autotune.cli.app import _run
from autotune.cli.app import app
from autotune.exceptions import AutotuneError
from autotune.workloads.tokens import open_tokens
from autotune.workloads.tokens import window

ROOT = Path(__file__).resolve().parents[2]


def _render(out: Path) -> Path:
    args = ["render", "-m", "tiny-gpt", "-c", "local", "--framework", "deepspeed",
            "-l", "zero=1,mbs=2", "--gbs", "4", "--train-script", "builtin", "--lr", "0.01",
            "--warmup-iters", "0", "--out", str(out)]
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        assert _run(app, args) == 0, stderr.getvalue()
    return out


@pytest.mark.slow
def test_the_rendered_launch_trains_the_builtin_program_on_a_token_file(
    tmp_path: Path, shellcheck: str
) -> None:
    """Oracle: a real run (bash, the deepspeed launcher, two gloo processes) of the rendered
    launch_deepspeed.sh on a file of one 64-token phrase repeated: the 5 steps TRAIN_ITERS asks
    for are reported, every loss is finite, and the last is well below the first (a model
    that learns the phrase); the rendered scripts pass bash -n and shellcheck."""
    folder = _render(tmp_path / "out")
    assert (folder / "problem.json").exists()
    for script in ("launch_deepspeed.sh", "sbatch.sh"):
        subprocess.run(["bash", "-n", str(folder / script)], check=True)
        subprocess.run([shellcheck, "-S", "warning", str(folder / script)], check=True)
    phrase = np.random.default_rng(0).integers(0, 8192, 64)
    tokens = tmp_path / "tokens.npy"
    np.save(tokens, np.tile(phrase, 400).astype(np.uint16))
    env = {**os.environ, "DATA_PATH": str(tokens), "TRAIN_ITERS": "5", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH"))
                                         if p)}
    env.pop("HOSTFILE", None)
    result = subprocess.run(["bash", str(folder / "launch_deepspeed.sh")], env=env,
                            cwd=tmp_path, capture_output=True, text=True, timeout=300,
                            check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    records = [json.loads(line) for line in result.stdout.splitlines()
               if line.startswith('{"event"')]
    losses = [r["loss"] for r in records if r["event"] == "step"]
    assert len(losses) == 5 and all(math.isfinite(v) for v in losses)
    assert losses[-1] < 0.8 * losses[0], losses
    assert records[-1]["event"] == "summary" and records[-1]["status"] == "ok"


def test_the_launch_header_and_readme_say_how_to_run_it(tmp_path: Path) -> None:
    """Oracle: the documented usage: DATA_PATH and TRAIN_ITERS instead of a script of the user's,
    the program as a module with --train, and the manifest's launch line."""
    folder = _render(tmp_path / "out")
    launch = (folder / "launch_deepspeed.sh").read_text()
    assert "DATA_PATH=<tokens.npy> TRAIN_ITERS=<steps> bash launch_deepspeed.sh" in launch
    assert "TRAIN_SCRIPT_DEFAULT=autotune.workloads.deepspeed_gpt" in launch
    assert "LAUNCHER_ARGS+=(--module)" in launch and "\n  --train\n" in launch
    assert "## Training program" in (folder / "README.md").read_text()
    manifest = json.loads((folder / "manifest.json").read_text())
    assert "DATA_PATH=<tokens.npy>" in manifest["launch"]["launch_deepspeed.sh"]


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (np.arange(10, dtype=np.int64), "1-D int64 array"),
        (np.arange(4, dtype=np.uint16), "fewer than one sequence"),
        (np.full(40, 9000, dtype=np.uint16), "token id 9,000, beyond the model's vocabulary"),
    ],
)
def test_a_token_file_it_cannot_train_on_is_named(tmp_path: Path, data: np.ndarray,
                                                  match: str) -> None:
    """Oracle: the documented format (1-D uint16/uint32 ids below the vocabulary, at least one
    sequence), each breach worked by hand for a vocabulary of 8192 and 8-token sequences."""
    path = tmp_path / "t.npy"
    np.save(path, data)
    with pytest.raises(AutotuneError, match=match):
        open_tokens(path, 8192, 8)


def test_windows_walk_the_file_in_order() -> None:
    """Oracle: by hand: 21 tokens hold (21 − 1) // 8 = 2 windows of 8 + 1; sample 2 wraps to 0."""
    tokens = np.arange(21, dtype=np.uint32)
    assert window(tokens, 0, 8).tolist() == list(range(9))
    assert window(tokens, 1, 8).tolist() == list(range(8, 17))
    assert window(tokens, 2, 8).tolist() == list(range(9))
