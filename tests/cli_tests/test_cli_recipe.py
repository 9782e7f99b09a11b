"""render's recipe, job, batch-in-tokens and current-layout options."""

from __future__ import annotations

import json
from pathlib import Path

from helpers_cli import cli

LAYOUT = "tp=2,pp=1,cp=8,zero=1,mbs=1,recompute=none"


def test_render_takes_the_recipe_job_and_token_batch(tmp_path: Path) -> None:
    """Oracle: values worked out by hand: 4,194,304 tokens per step at seq 131,072 are 32
    sequences; the flags' lr and partition land in pretrain_gpt.sh and sbatch.sh; Llama 3 8B at
    131,072 positions without rope scaling is warned about; from tp=1 to tp=2 the torch_dist
    checkpoint reshards (no format warning)."""
    result = cli("render", "-m", "llama3-8b", "-c", "dgx-h100:2", "--seq", "131072",
                 "--gbs-tokens", "4194304", "--lr", "2e-4", "--partition", "batch",
                 "--container-image", "nvcr.io#nvidia/pytorch:25.01-py3", "-l", LAYOUT,
                 "--from", "tp=1,pp=1,cp=8,zero=1,mbs=1", "--out", tmp_path)
    assert result.code == 0, result.err
    script = (tmp_path / "pretrain_gpt.sh").read_text()
    assert "--global-batch-size 32\n" in script and "--lr 0.0002\n" in script
    sbatch = (tmp_path / "sbatch.sh").read_text()
    assert "#SBATCH --partition=batch\n" in sbatch and "##SBATCH --account=<account>" in sbatch
    assert "CONTAINER_IMAGE_DEFAULT='nvcr.io#nvidia/pytorch:25.01-py3'" in sbatch
    assert "8,192 positions" in " ".join(result.err.split())
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["recipe"]["origin"]["lr"] == "set"
    carry = manifest["checkpoints"]["carry_over"]
    assert carry[0].startswith("torch_dist reshards") and "WARNING" not in " ".join(carry)
    assert "Carrying over the checkpoints" in (tmp_path / "README.md").read_text()


def test_a_token_batch_that_is_not_whole_sequences_exits_2(tmp_path: Path) -> None:
    """Oracle: the CLI contract: bad input is one line naming the flag, exit 2."""
    result = cli("render", "-m", "llama3-8b", "-c", "dgx-h100:2", "--gbs-tokens", "5000000",
                 "-l", LAYOUT, "--out", tmp_path)
    assert result.code == 2 and len(result.error_lines) == 1
    assert "--gbs-tokens" in result.err
