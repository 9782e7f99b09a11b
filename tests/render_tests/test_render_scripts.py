"""Rendered shell scripts: bash -n, shellcheck, real runs against fake launchers, injection.

The launchers (torchrun, deepspeed, srun, scontrol) are fakes that record their argv: the real
ones need GPUs and a cluster. Everything else is real bash running the rendered scripts.
"""

from __future__ import annotations

import os
import re
import stat
import subprocess
import warnings
from pathlib import Path

import pytest
from render_samples import Case
from render_samples import problem
from render_samples import sample

from autotune import AutotuneConfig
from autotune import AutotuneError
from autotune import Layout
from autotune import templating
from autotune.frameworks.megatron.args import megatron_args
from autotune.render import TrainProgram
from autotune.render import deepspeed_launch_script
from autotune.render import megatron_launch_script
from autotune.render import sbatch_script
from autotune.render import write_artifacts
from autotune.specs import JobSpec

with warnings.catch_warnings():  # megatron-core warns that Transformer Engine / Apex are absent
    warnings.simplefilter("ignore")
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.pipeline_parallel_layer_layout import (
        PipelineParallelLayerLayout,
    )

EVIL = "evil name $(touch pwned) `touch pwned`; touch pwned 'q' \"d\" \\ * ~ #"
"""A value that runs `touch pwned` wherever a shell evaluates it unquoted."""
FAKE = """#!/usr/bin/env bash
# records its argv (NUL-separated) as $RECORD_DIR/<name>; srun then runs the command it got
printf '%s\\0' "$@" > "$RECORD_DIR/$(basename "$0")"
if [[ "$(basename "$0")" == srun ]]; then
  while [[ "$1" == --* ]]; do shift; done
  exec "$@"
fi
if [[ "$(basename "$0")" == deepspeed ]]; then
  cp "$DS_ENV_FILE" "$RECORD_DIR/deepspeed_env"
fi
"""
SCONTROL = """#!/usr/bin/env bash
printf 'nodeA\\nnodeB\\n'
"""


def scripts(cases: tuple[Case, ...]) -> dict[str, str]:
    """File name → text of every launch and sbatch script of the sampled cases."""
    out: dict[str, str] = {}
    for i, case in enumerate(cases):
        if case.cfg.train.framework == "megatron":
            out[f"{i}-pretrain_gpt.sh"] = megatron_launch_script(case.cfg, case.layout)
        else:
            out[f"{i}-launch_deepspeed.sh"] = deepspeed_launch_script(case.cfg, case.layout)
        out[f"{i}-sbatch.sh"] = sbatch_script(case.cfg, case.layout, job_name="trial")
    return out


@pytest.mark.parametrize("framework", ["megatron", "deepspeed"])
def test_scripts_pass_bash_n_and_shellcheck(framework: str, tmp_path: Path,
                                            request: pytest.FixtureRequest) -> None:
    """Oracle: bash's parser (bash -n) and shellcheck, on the launch and sbatch scripts of one
    example per feature (the shellcheck fixture fails in CI when shellcheck is missing)."""
    files = scripts(sample(framework))
    for name, text in files.items():
        (tmp_path / name).write_text(text)
        check = subprocess.run(["bash", "-n", str(tmp_path / name)], capture_output=True,
                               text=True)
        assert check.returncode == 0, f"{name}: {check.stderr}"
    shellcheck = request.getfixturevalue("shellcheck")  # fails in CI when missing
    lint = subprocess.run([shellcheck, "-f", "gcc", *sorted(files)], cwd=tmp_path,
                          capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr


# --- real runs against fake launchers -----------------------------------------------------------


@pytest.fixture
def fakes(tmp_path: Path) -> dict[str, str]:
    """Environment whose PATH has recording torchrun, deepspeed, srun and scontrol."""
    bin_dir, records = tmp_path / "bin", tmp_path / "records"
    bin_dir.mkdir()
    records.mkdir()
    for name, text in (("torchrun", FAKE), ("deepspeed", FAKE), ("srun", FAKE),
                       ("scontrol", SCONTROL)):
        path = bin_dir / name
        path.write_text(text)
        path.chmod(path.stat().st_mode | stat.S_IEXEC)
    keep = {key: os.environ[key] for key in ("HOME", "LANG") if key in os.environ}
    return {**keep, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
            "RECORD_DIR": str(records)}


def recorded(env: dict[str, str], name: str) -> list[str]:
    """Argv the fake `name` was called with."""
    raw = (Path(env["RECORD_DIR"]) / name).read_bytes().decode()
    return raw.split("\0")[:-1]


def run(script: Path, env: dict[str, str], *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(script), *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=60)


def _evil(cfg: AutotuneConfig) -> AutotuneConfig:
    model = cfg.model.model_copy(update={"name": EVIL + "\ntouch pwned"})
    cluster = cfg.cluster.model_copy(update={"name": EVIL})
    return cfg.model_copy(update={"model": model, "cluster": cluster})


@pytest.fixture
def megatron_setup(tmp_path: Path) -> tuple[AutotuneConfig, Layout, Path]:
    """A two-node Megatron problem with an evil model name and Megatron-LM path."""
    cfg = _evil(problem("llama3-8b", "dgx-h100:2", "megatron", None))
    layout = Layout(tp=2, pp=2, cp=1, dp=4, zero=1, gas=128, sp=True, recompute="selective")
    checkout = tmp_path / EVIL.replace("/", "_")
    checkout.mkdir()
    (checkout / "pretrain_gpt.py").write_text("")
    return cfg, layout, checkout


def test_pretrain_script_passes_exact_flags(megatron_setup, fakes, tmp_path: Path) -> None:
    """Oracle: the argv torchrun really receives, against flags worked out by hand: the run's
    data, tokenizer, checkpoints and length come from the variables documented at the top; the
    warm-up, eval and save intervals are autotune's defaults (2,000, 1,000 x 10, 1,000: the evil
    model name has no published recipe); a run no longer than its warm-up stops with one line
    (Megatron would assert)."""
    cfg, layout, checkout = megatron_setup
    script = tmp_path / "pretrain_gpt.sh"
    script.write_text(megatron_launch_script(cfg, layout, megatron_lm=str(checkout)))
    ckpt = str(tmp_path / "check points")
    env = {**fakes, "NODE_RANK": "1", "MASTER_ADDR": "head node",
           "DATA_PATH": "0.7 /data/a_text 0.3 /data/b_text", "TOKENIZER_MODEL": "meta/llama 3",
           "CHECKPOINT_DIR": ckpt, "TRAIN_TOKENS": "10000000000"}
    result = run(script, env, "--exit-interval", "5", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    # 1e10 tokens / (global batch 512 · seq 8192 = 4,194,304 tokens per iteration) → 2,385
    assert recorded(env, "torchrun") == [
        "--nproc_per_node", "8", "--nnodes", "2", "--node_rank", "1",
        "--master_addr", "head node", "--master_port", "6000",
        str(checkout / "pretrain_gpt.py"), *megatron_args(cfg, layout),
        "--train-iters", "2385", "--lr-warmup-iters", "2000", "--log-interval", "1",
        "--eval-interval", "1000", "--eval-iters", "10",
        "--data-path", "0.7", "/data/a_text", "0.3", "/data/b_text",
        "--split", "99,1,0", "--tokenizer-type", "HuggingFaceTokenizer",
        "--tokenizer-model", "meta/llama 3", "--save", ckpt, "--load", ckpt,
        "--save-interval", "1000", "--exit-interval", "5",
    ]
    assert not (tmp_path / "pwned").exists()
    # both set: TRAIN_ITERS wins, as in launch_deepspeed.sh; 12 iterations end inside the warm-up
    env["TRAIN_ITERS"] = "12"
    short = run(script, env, cwd=tmp_path)
    assert short.returncode == 2 and len(short.stderr.splitlines()) == 1
    assert "LR_WARMUP_ITERS (2000) must be below the 12 decay iterations" in short.stderr
    env["LR_WARMUP_ITERS"] = "3"
    assert run(script, env, cwd=tmp_path).returncode == 0
    argv = recorded(env, "torchrun")
    assert argv[argv.index("--train-iters") + 1] == "12"


def test_training_script_needs_data_and_trial_script_defaults_to_mock(
    megatron_setup, fakes, tmp_path: Path
) -> None:
    """Oracle: the documented contract of the scripts, run by bash, and the argv the recording
    torchrun receives against flags worked out by hand: a training script refuses to start
    without DATA_PATH (exit 2, one line); a trial script trains its default iterations on
    Megatron's synthetic data (--mock-data, NullTokenizer) with no warm-up (a benchmark)."""
    cfg, layout, checkout = megatron_setup
    training, trial = tmp_path / "train.sh", tmp_path / "trial.sh"
    training.write_text(megatron_launch_script(cfg, layout, megatron_lm=str(checkout)))
    trial.write_text(megatron_launch_script(cfg, layout, megatron_lm=str(checkout),
                                            train_iters=7, trial=True))
    refused = run(training, fakes, cwd=tmp_path)
    assert refused.returncode == 2 and "set DATA_PATH and TOKENIZER_MODEL" in refused.stderr
    assert len(refused.stderr.splitlines()) == 1
    assert run(trial, fakes, cwd=tmp_path).returncode == 0
    assert "A SHORT BENCHMARK RUN" in trial.read_text()
    assert "A TRAINING RUN" in training.read_text()
    assert recorded(fakes, "torchrun")[-15:] == [
        "--train-iters", "7", "--lr-warmup-iters", "0", "--log-interval", "1",
        "--eval-interval", "1000", "--eval-iters", "10", "--mock-data", "--tokenizer-type",
        "NullTokenizer",
        "--vocab-size", str(cfg.model.vocab_size),
    ]


def test_pipeline_layout_reaches_torchrun_as_one_argument(fakes, tmp_path: Path) -> None:
    """Oracle: the argv the recording torchrun receives when bash runs pretrain_gpt.sh, read by
    megatron-core's PipelineParallelLayerLayout: DeepSeek-V3's custom layout on pp 8 x vpp 4
    (`|`, `(`, `)` and `*` in it) arrives whole, 32 chunks holding the 61 layers."""
    cfg = problem("deepseek-v3", "dgx-h100:1024", "megatron", None)
    layout = Layout(tp=2, pp=8, dp=64, vpp=4, zero=1, ep=64, etp=1, sp=True, gas=240)
    checkout = tmp_path / "Megatron-LM"
    checkout.mkdir()
    (checkout / "pretrain_gpt.py").write_text("")
    script = tmp_path / "pretrain_gpt.sh"
    script.write_text(megatron_launch_script(cfg, layout, megatron_lm=str(checkout), trial=True))
    env = {**fakes, "NODE_RANK": "0", "MASTER_ADDR": "head"}
    result = run(script, env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    argv = recorded(env, "torchrun")
    parsed = PipelineParallelLayerLayout(argv[argv.index("--pipeline-model-parallel-layout") + 1],
                                         8)
    assert parsed.virtual_pipeline_model_parallel_size == 4
    assert parsed.flatten_layout.count(LayerType.decoder) == 61


def test_pretrain_script_rejects_wrong_world_size(megatron_setup, fakes, tmp_path) -> None:
    """Oracle: the documented contract of pretrain_gpt.sh, run by bash: exit 2 with one line
    naming the GPUs the layout needs (tp·pp·cp·dp = 2·2·1·4 = 16, by hand) or the missing
    Megatron-LM checkout, before torchrun starts."""
    cfg, layout, checkout = megatron_setup
    script = tmp_path / "pretrain_gpt.sh"
    script.write_text(megatron_launch_script(cfg, layout, megatron_lm=str(checkout)))
    result = run(script, {**fakes, "NNODES": "1"}, cwd=tmp_path)
    assert (result.returncode, result.stderr) == (2, (
        "pretrain_gpt.sh: NNODES (1) x GPUS_PER_NODE (8) must be the 16 GPUs this layout was "
        "rendered for\n"))
    missing = tmp_path / "missing"
    result = run(script, {**fakes, "MEGATRON_LM": str(missing)}, cwd=tmp_path)
    assert (result.returncode, result.stderr) == (2, (
        f"pretrain_gpt.sh: no pretrain_gpt.py in MEGATRON_LM={missing}; point MEGATRON_LM at a "
        "Megatron-LM checkout\n"))
    assert not (Path(fakes["RECORD_DIR"]) / "torchrun").exists()


def test_megatron_sbatch_runs_pretrain_on_each_node(megatron_setup, fakes, tmp_path) -> None:
    """Oracle: the argv the recording srun and torchrun receive when bash runs sbatch.sh under
    Slurm's variables, against values worked out by hand: one srun task per node running
    pretrain_gpt.sh, whose torchrun gets 8 processes on 2 nodes, this node's rank and the first
    host of the node list (what scontrol show hostnames prints) as master."""
    cfg, layout, checkout = megatron_setup
    paths = write_artifacts(cfg, layout, tmp_path / "out", job_name="trial")
    slurm = {"SLURM_JOB_NODELIST": "node[A-B]", "SLURM_NNODES": "2", "SLURM_NODEID": "1",
             "SLURM_JOB_ID": "42", "SLURM_SUBMIT_DIR": str(tmp_path / "out"),
             "MEGATRON_LM": str(checkout), "MOCK_DATA": "1", "TRAIN_ITERS": "3",
             "LR_WARMUP_ITERS": "0"}
    env = {**fakes, **slurm}
    result = run(paths["sbatch.sh"], env, "--exit-interval", "5", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert recorded(env, "srun") == [
        "--ntasks-per-node=1", "--kill-on-bad-exit=1", "bash",
        str(tmp_path / "out" / "pretrain_gpt.sh"), "--exit-interval", "5",
    ]
    torchrun = recorded(env, "torchrun")
    assert torchrun[:10] == ["--nproc_per_node", "8", "--nnodes", "2", "--node_rank", "1",
                             "--master_addr", "nodeA", "--master_port", "6000"]
    assert torchrun[11:] == [
        *megatron_args(cfg, layout), "--train-iters", "3", "--lr-warmup-iters", "0",
        "--log-interval", "1", "--eval-interval", "1000", "--eval-iters", "10", "--mock-data",
        "--tokenizer-type", "NullTokenizer", "--vocab-size", str(cfg.model.vocab_size),
        "--exit-interval", "5"]
    assert not (tmp_path / "pwned").exists()


def test_sbatch_runs_tasks_in_the_configured_container(megatron_setup, fakes, tmp_path) -> None:
    """Oracle: the argv the recording srun receives, against pyxis's documented srun options
    (--container-image, --container-mounts SRC:DST[,SRC:DST], --container-workdir) worked out by
    hand: the config's job section names the image and a mount, the artifacts folder is mounted
    at its own path; the site's partition, account and time are directives, and unset ones are
    disabled placeholders Slurm does not read (`##SBATCH`)."""
    cfg, layout, checkout = megatron_setup
    job = JobSpec(partition="batch", container_image="nvcr.io#nvidia/pytorch:25.01-py3",
                  container_mounts=("/lustre/data:/data:ro",))
    cfg = cfg.model_copy(update={"job": job})
    out = tmp_path / "out"
    paths = write_artifacts(cfg, layout, out, job_name="trial")
    text = paths["sbatch.sh"].read_text()
    assert "#SBATCH --partition=batch\n" in text
    assert "##SBATCH --account=<account>" in text and "##SBATCH --time=<time>" in text
    env = {**fakes, "SLURM_JOB_NODELIST": "node[A-B]", "SLURM_NNODES": "2",
           "SLURM_SUBMIT_DIR": str(out), "MEGATRON_LM": str(checkout), "MOCK_DATA": "1"}
    assert run(paths["sbatch.sh"], env, cwd=tmp_path).returncode == 0
    assert recorded(env, "srun") == [
        "--ntasks-per-node=1", "--kill-on-bad-exit=1",
        "--container-image=nvcr.io#nvidia/pytorch:25.01-py3", f"--container-workdir={out}",
        f"--container-mounts={out}:{out},/lustre/data:/data:ro",
        "bash", str(out / "pretrain_gpt.sh"),
    ]


@pytest.fixture
def deepspeed_setup(tmp_path: Path) -> tuple[AutotuneConfig, Layout, TrainProgram]:
    """A two-node DeepSpeed problem with an evil model name and training program."""
    cfg = _evil(problem("llama3-8b", "dgx-h100:2", "deepspeed", None))
    layout = Layout(tp=2, pp=1, cp=1, dp=8, zero=3, offload="optimizer", gas=64)
    program = TrainProgram(script=str(tmp_path / EVIL.replace("/", "_")), args=(EVIL, "--x"),
                           config_flag="--ds-config", layout_flag="--layout")
    return cfg, layout, program


def test_launch_deepspeed_script(deepspeed_setup, fakes, tmp_path: Path) -> None:
    """Oracle: the argv the recording deepspeed launcher receives when bash runs
    launch_deepspeed.sh, against the deepspeed launcher's documented options worked out by hand,
    and the environment file it forwards to every node (.deepspeed_env); evil values stay
    inert."""
    cfg, layout, program = deepspeed_setup
    paths = write_artifacts(cfg, layout, tmp_path / "out", program=program)
    env = {**fakes, "MASTER_ADDR": "nodeA"}
    result = run(paths["launch_deepspeed.sh"], env, "--steps", "3", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = tmp_path / "out"
    assert recorded(env, "deepspeed") == [
        "--hostfile", str(out / "hostfile"), "--num_nodes", "2", "--num_gpus", "8",
        "--master_port", "6000", "--master_addr", "nodeA", program.script, EVIL, "--x",
        "--ds-config", str(out / "ds_config.json"), "--layout", str(out / "layout.json"),
        "--steps", "3",
    ]
    forwarded = (Path(env["RECORD_DIR"]) / "deepspeed_env").read_text().split()
    assert "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True" in forwarded
    assert not (tmp_path / "pwned").exists()


def test_deepspeed_sbatch_uses_c10d_rendezvous(deepspeed_setup, fakes, tmp_path) -> None:
    """Oracle: the argv the recording torchrun receives when bash runs sbatch.sh, against
    torchrun's documented c10d rendezvous options worked out by hand (job id as rendezvous id,
    the first host as endpoint)."""
    cfg, layout, program = deepspeed_setup
    program = TrainProgram(script="autotune.workloads.deepspeed_gpt", module=True,
                           args=program.args, config_flag="--ds-config", layout_flag="--layout")
    paths = write_artifacts(cfg, layout, tmp_path / "out", program=program)
    out = str(tmp_path / "out")
    env = {**fakes, "SLURM_JOB_NODELIST": "node[A-B]", "SLURM_NNODES": "2",
           "SLURM_JOB_ID": "42", "SLURM_SUBMIT_DIR": out}
    result = run(paths["sbatch.sh"], env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert recorded(env, "torchrun") == [
        "--nproc_per_node", "8", "--nnodes", "2", "--module", "--rdzv_id", "42",
        "--rdzv_backend", "c10d", "--rdzv_endpoint", "nodeA:6000",
        "autotune.workloads.deepspeed_gpt", EVIL, "--x", "--ds-config", f"{out}/ds_config.json",
        "--layout", f"{out}/layout.json",
    ]
    assert not (tmp_path / "pwned").exists()


# --- injection -----------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [EVIL, "a b", "$HOME", "x\ntouch pwned", "", "'"])
def test_shquote_keeps_values_inert(value: str, tmp_path: Path) -> None:
    """Oracle: bash itself prints the quoted value back unchanged and runs nothing in it."""
    quoted = templating.environment().filters["shquote"](value)
    echoed = subprocess.run(["bash", "-c", f"printf '%s' {quoted}"], cwd=tmp_path,
                            capture_output=True, text=True)
    assert echoed.stdout == value
    assert not (tmp_path / "pwned").exists()


def test_evil_values_stay_in_comments(megatron_setup, deepspeed_setup, tmp_path) -> None:
    """Oracle: bash's parser (bash -n) accepts every script rendered with evil names, and no
    line of them starts a command the names carry (a newline in a name cannot end a comment).
    The scripts themselves run with these names in the fake-launcher tests above."""
    cfg, layout, checkout = megatron_setup
    texts = [megatron_launch_script(cfg, layout, megatron_lm=str(checkout)),
             sbatch_script(cfg, layout, job_name="trial")]
    ds_cfg, ds_layout, program = deepspeed_setup
    texts += [deepspeed_launch_script(ds_cfg, ds_layout, program=program),
              sbatch_script(ds_cfg, ds_layout, job_name="trial", program=program)]
    for text in texts:
        assert not [line for line in text.splitlines() if line.lstrip().startswith("touch")]
        script = tmp_path / "check.sh"
        script.write_text(text)
        assert subprocess.run(["bash", "-n", str(script)], cwd=tmp_path).returncode == 0


UNSAFE = "may not contain spaces, quotes, backslashes, '#', '$' or backticks"


@pytest.mark.parametrize(
    ("options", "message"),
    [({"job_name": "x\ntouch pwned"}, f"job-name='x\\ntouch pwned' {UNSAFE}"),
     ({"job_name": "a b"}, f"job-name='a b' {UNSAFE}"),
     ({"job_name": "ok", "partition": "$(id)"}, f"partition='$(id)' {UNSAFE}"),
     ({"job_name": "ok", "extra": ("--qos=$(id)",)}, f"qos='$(id)' {UNSAFE}"),
     ({"job_name": "ok", "extra": ("qos=high",)}, "extra option 'qos=high' must look like "
      "--key=value")],
    ids=["newline", "space", "partition", "extra-value", "extra-not-an-option"],
)
def test_sbatch_rejects_unsafe_directives(options: dict, message: str) -> None:
    """Oracle: sbatch's documented #SBATCH syntax (the directive ends at the first space, no
    shell expansion there): each value that would be cut or misread is refused, naming it."""
    cfg = problem("llama2-7b", "dgx-h100:1", "megatron", None)
    with pytest.raises(AutotuneError, match=f"^{re.escape(f'sbatch: {message}')}"):
        sbatch_script(cfg, Layout(dp=8, zero=1, gas=128), **options)


def test_sbatch_directives() -> None:
    """Oracle: sbatch's documented options, worked out by hand for 4 nodes of 8 GPUs."""
    cfg = problem("llama2-7b", "dgx-h100:4", "megatron", None)
    text = sbatch_script(cfg, Layout(tp=8, dp=4, zero=1, gas=256, sp=True), job_name="llama",
                         partition="gpu", account="proj-1", time_limit="02:00:00",
                         extra=("--qos=high",))
    directives = [line for line in text.splitlines() if line.startswith("#SBATCH")]
    assert directives == [
        "#SBATCH --job-name=llama", "#SBATCH --partition=gpu", "#SBATCH --account=proj-1",
        "#SBATCH --time=02:00:00", "#SBATCH --qos=high", "#SBATCH --nodes=4",
        "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=8", "#SBATCH --exclusive",
        "#SBATCH --output=%x-%j.out",
    ]
