"""README.md of a rendered folder: the training code's obligations, the recipe, checkpoints."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

from autotune import Layout
from autotune import load_config
from autotune.frameworks import get_framework
from autotune.render import write_artifacts
from autotune.specs.recipe import RECIPE_FIELDS

with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    from deepspeed.checkpoint import ds_to_universal
    from deepspeed.runtime import constants as ds_constants

MEGATRON_LM_FLAGS = frozenset(
    line.strip()
    for line in (Path(__file__).parent / "megatron_lm_flags.txt").read_text().splitlines()
    if line.startswith("--")
)


def test_deepspeed_readme_and_launch_header_name_the_obligations(tmp_path: Path) -> None:
    """Oracle: DeepSpeed's APIs the obligations name exist in DeepSpeed 0.19 (PipelineModule,
    DistributedAttention, parallel_state_sp); a pp=2 layout with full recompute must build a
    PipelineModule of 2 stages and a cp=2 one Ulysses attention and a sampler over the 8 dp
    ranks (16 GPUs / cp 2, worked out by hand); both appear in README.md and the launch header."""
    import deepspeed.pipe
    import deepspeed.runtime.sequence_parallel.parallel_state_sp
    import deepspeed.sequence.layer

    assert deepspeed.pipe.PipelineModule and deepspeed.sequence.layer.DistributedAttention
    assert deepspeed.runtime.sequence_parallel.parallel_state_sp
    cfg = load_config("llama2-13b", "dgx-a100:2", framework="deepspeed")
    pipeline = write_artifacts(cfg, Layout(pp=2, dp=8, zero=1, gas=128, recompute="full"),
                               tmp_path / "pp")
    readme = pipeline["README.md"].read_text()
    assert "PipelineModule(layers=..., num_stages=2" in readme
    assert "PipelineModule(layers=..., num_stages=2" in pipeline["launch_deepspeed.sh"].read_text()
    ulysses = write_artifacts(cfg, Layout(cp=2, dp=8, zero=3, gas=128, recompute="full"),
                              tmp_path / "cp")
    for name in ("README.md", "launch_deepspeed.sh", "sbatch.sh"):
        text = ulysses[name].read_text()
        assert "DistributedAttention" in text and "data-parallel rank (0..7" in text
        assert "checkpoint every decoder layer" in text


def test_readme_lists_every_recipe_value_and_says_what_kind_of_run(tmp_path: Path) -> None:
    """Oracle: the recipe's contract: README.md has one row per recipe field (16), the token
    budget of Llama 3 70B's published recipe (1,168,251 iterations of 4,194,304 tokens, by
    hand); a trial render says it is a benchmark."""
    cfg = load_config("llama3-70b", "dgx-h100:8")
    layout = Layout(tp=4, pp=4, cp=2, dp=2, vpp=5, zero=1, gas=256, sp=True)
    readme = write_artifacts(cfg, layout, tmp_path / "train")["README.md"].read_text()
    rows = [name for name in RECIPE_FIELDS if re.search(rf"^\| `{name}` \|", readme, re.M)]
    assert rows == list(RECIPE_FIELDS)
    assert "**A training run**" in readme and "1,168,251 iterations of 4,194,304 tokens" in readme
    trial = write_artifacts(cfg, layout, tmp_path / "trial", trial=True)["README.md"]
    assert "A short benchmark run, not a training run" in trial.read_text()


def test_megatron_carry_over_warns_when_the_checkpoint_formats_differ() -> None:
    """Oracle: Megatron-LM's rules: Megatron-FSDP requires --ckpt-format fsdp_dtensor
    (arguments.py), other layouts save torch_dist; the flags the advice names are real
    Megatron-LM flags (the flag list of pretrain_gpt.py at d98e8a64)."""
    cfg = load_config("llama3-70b", "dgx-h100:8")
    megatron = get_framework("megatron")
    recipe_like = Layout(tp=4, pp=4, cp=2, dp=2, vpp=5, zero=1, gas=256, sp=True)
    fsdp = Layout(tp=2, cp=2, dp=16, zero=3, gas=32, sp=True)
    to_fsdp = megatron.carry_over(cfg, recipe_like, fsdp)
    assert to_fsdp[0].startswith("WARNING: the old run saved --ckpt-format torch_dist")
    assert "convert-torch-dist-to-fsdp-dtensor" in to_fsdp[1] and "--swiglu" in to_fsdp[1]
    back = megatron.carry_over(cfg, fsdp, recipe_like)
    assert back[0].startswith("WARNING:") and "no converter" in back[1]
    reshard = megatron.carry_over(cfg, recipe_like, Layout(tp=8, pp=2, dp=4, zero=1, gas=128,
                                                           sp=True))
    assert not any(line.startswith("WARNING") for line in reshard)
    words = [word.strip(";,") for line in reshard for word in line.split()]
    named = {word for word in words if word.startswith("--")}
    assert named and named <= MEGATRON_LM_FLAGS


def test_deepspeed_carry_over_goes_through_a_universal_checkpoint() -> None:
    """Oracle: DeepSpeed 0.19's converter (deepspeed/checkpoint/ds_to_universal.py: its parser
    takes --input_folder and --output_folder) and its config key `checkpoint.load_universal`
    (runtime/constants.py); a same-partitioning change (mbs, recompute) needs neither."""
    cfg = load_config("llama2-13b", "dgx-a100:2", framework="deepspeed")
    deepspeed = get_framework("deepspeed")
    old = Layout(dp=16, zero=2, gas=64)
    steps = deepspeed.carry_over(cfg, old, Layout(dp=8, pp=2, zero=1, gas=128))
    assert steps[0].startswith("WARNING:")
    parser = ds_to_universal.parse_arguments.__code__.co_consts
    assert "--input_folder" in parser and "--output_folder" in parser
    assert "--input_folder" in steps[1] and "--output_folder" in steps[1]
    assert f'"{ds_constants.LOAD_UNIVERSAL_CHECKPOINT}": true' in steps[2]
    same = deepspeed.carry_over(cfg, old, Layout(dp=16, zero=2, gas=32, mbs=2))
    assert len(same) == 1 and not same[0].startswith("WARNING")
