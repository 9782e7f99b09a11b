"""Megatron trials on the real one-node Slurm (tests/services/slurm.sh, CPUs only).

On CPU the megatron framework is refused before anything is submitted; a Megatron-LM checkout
runs through the rendered pretrain_gpt.sh as an sbatch job (a stand-in checkout here, since the
real pretrain_gpt.py needs CUDA: `fake_megatron_lm` prints Megatron-LM's own log format), and
the built-in megatron-core program runs on a machine with an NVIDIA GPU (marked `gpu`).
Oracles: Slurm's job states (squeue, sacct), the exit-code contract of the CLI, and the log
lines the checkout printed.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers_cluster import accounting
from helpers_cluster import first_layout
from helpers_cluster import queued_jobs

from autotune.cli.app import _run
from autotune.cli.app import app
from autotune.exceptions import AutotuneError
from autotune.runners.slurm import SlurmRunner
from autotune.specs.inputs import load_config
from autotune.testing import run_trial

pytestmark = pytest.mark.slow


def _megatron_cpu():
    return load_config("tiny-gpt", "local", processes=2, framework="megatron", seq_length=64,
                       global_batch_size=8)


def test_cpu_slurm_refuses_megatron_before_submitting(slurm: str, tmp_path: Path,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    """`autotune tune --runner slurm --framework megatron` on a CPU-only Slurm: exit 2 with one
    line naming --framework deepspeed; squeue shows no new job."""
    before = queued_jobs()
    code = _run(app, ["tune", "-m", "tiny-gpt", "-c", "local", "--processes", "2",
                      "--framework", "megatron", "--seq", "64", "--gbs", "8",
                      "--runner", "slurm", "--trials", "1", "--out", str(tmp_path / "study")])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "--framework deepspeed" in lines[0], err
    assert queued_jobs() - before == set()
    # a GPU cluster spec does not help: sinfo shows no gpu GRES on this Slurm's partition
    with pytest.raises(AutotuneError, match="offers none .*--framework deepspeed"):
        SlurmRunner().check(load_config("tiny-gpt", "dgx-h100:1", framework="megatron"))


def test_checkout_trial_is_submitted_followed_and_measured(slurm: str, tmp_path: Path,
                                                           fake_megatron_lm: Path) -> None:
    """The rendered pretrain_gpt.sh runs the checkout on every node of the job; the runner
    reads Megatron-LM's iteration lines from the job's output as steps (103, 104, 105 ms after
    2 warm-up iterations: median 0.104 s) and its memory report as the peak."""
    cfg = _megatron_cpu()
    runner = SlurmRunner(poll_s=0.5, steps=5, warmup=2, megatron_lm=fake_megatron_lm)
    runner.check(cfg)  # a checkout decides for itself whether it needs GPUs
    result = run_trial(runner, cfg, first_layout(cfg, "tp=1,pp=1,zero=1,mbs=4"), tmp_path / "t")
    m = result.measurement
    assert m.status == "ok", (m.reason, m.log_tail)
    assert m.step_time_s == pytest.approx(0.104)
    assert m.peak_memory_bytes == pytest.approx(400.0 * 2**20)  # rank 1's max allocated
    assert accounting(m.extra["slurm_job_id"])[-1]["State"] == "COMPLETED"
    assert "pretrain_gpt.sh" in (result.directory / "trial.sbatch").read_text()


def test_checkout_trial_is_pruned_and_failures_are_classified(
    slurm: str, tmp_path: Path, fake_megatron_lm: Path
) -> None:
    """The pruner's stop cancels the job (squeue forgets it, Slurm says CANCELLED); a checkout
    whose log says NaN is a `nan` trial."""
    cfg = _megatron_cpu()
    layout = first_layout(cfg, "tp=1,pp=1,zero=1,mbs=4")
    runner = SlurmRunner(poll_s=0.5, steps=400, warmup=1, megatron_lm=fake_megatron_lm)
    pruned = run_trial(runner, cfg, layout, tmp_path / "pruned", stop_after=1).measurement
    assert pruned.status == "pruned", pruned.reason
    job_id = pruned.extra["slurm_job_id"]
    assert job_id not in queued_jobs()
    assert accounting(job_id)[-1]["State"].startswith("CANCELLED")
    nan = SlurmRunner(poll_s=0.5, steps=6, warmup=1, megatron_lm=fake_megatron_lm,
                      env={"FAKE_NAN": "1"})
    failed = run_trial(nan, cfg, layout, tmp_path / "nan").measurement
    assert failed.status == "nan" and "found NaN" in failed.reason, failed


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_megatron_core_program_on_a_gpu_slurm(slurm: str, tmp_path: Path) -> None:
    """On a Slurm cluster with an NVIDIA GPU: the megatron-core trial program as an sbatch
    job, measured like the DeepSpeed one."""
    cfg = load_config("tiny-gpt", "local", framework="megatron", seq_length=64,
                      global_batch_size=8)
    runner = SlurmRunner(poll_s=0.5, steps=4, warmup=1)
    runner.check(cfg)
    m = run_trial(runner, cfg, first_layout(cfg, "tp=1,pp=1,zero=1,mbs=4"), tmp_path).measurement
    assert m.status == "ok", (m.reason, m.log_tail)
