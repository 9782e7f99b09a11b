"""The recipe in the rendered configs: the frameworks' own schedulers read it back."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
import torch

from autotune import Layout
from autotune import load_config
from autotune.frameworks.megatron.args import megatron_args
from autotune.render import deepspeed_config
from autotune.render import megatron_launch_script
from autotune.specs import RecipeSpec
from autotune.specs import resolve_recipe

with warnings.catch_warnings():  # megatron-core warns that Transformer Engine / Apex are absent
    warnings.simplefilter("ignore")
    from deepspeed.runtime import lr_schedules
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler


def _flags(argv: list[str]) -> dict[str, str]:
    return {flag: value for flag, value in zip(argv, argv[1:], strict=False)
            if flag.startswith("--") and not value.startswith("--")}


def _optimizer(lr: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr)


def _deepspeed_scheduler(style: str, warmup_iters: int) -> tuple[dict, torch.optim.Optimizer, Any]:
    """(ds_config, optimizer, scheduler) of a 2e-4 → 2e-5 recipe of 100 steps, the scheduler
    built by DeepSpeed from the rendered section as the engine builds it."""
    spec = RecipeSpec(lr=2e-4, min_lr=2e-5, warmup_iters=warmup_iters, decay_style=style,
                      train_tokens=4096 * 1024 * 100)
    cfg = load_config("llama2-7b", "dgx-h100:1", framework="deepspeed", recipe=spec)
    config = deepspeed_config(cfg, Layout(dp=8, zero=2, gas=128))
    section = config["scheduler"]
    optimizer = _optimizer(config["optimizer"]["params"]["lr"])
    return config, optimizer, getattr(lr_schedules, section["type"])(optimizer,
                                                                     **section["params"])


def test_megatron_scheduler_follows_the_llama3_70b_recipe() -> None:
    """Oracle: megatron-core's OptimizerParamScheduler built as Megatron-LM's training.py builds
    it from the rendered flags (--lr, --min-lr, --lr-decay-style, --weight-decay; warm-up and
    length from the script's defaults): the lr peaks at 3e-4 after the 2,000 warm-up iterations,
    reaches 3e-5 at the run's last iteration, and the weight decay is 0.033 throughout."""
    cfg = load_config("llama3-70b", "dgx-h100:8")
    layout = Layout(tp=4, pp=4, cp=2, dp=2, zero=1, gas=256, sp=True)
    flags = _flags(megatron_args(cfg, layout))
    recipe = resolve_recipe(cfg)
    script = megatron_launch_script(cfg, layout)
    assert f'LR_WARMUP_ITERS="${{LR_WARMUP_ITERS:-{recipe.warmup_iters}}}"' in script
    assert f'TRAIN_ITERS="${{TRAIN_ITERS:-{recipe.train_iters}}}"' in script
    assert "--lr-decay-iters" not in flags  # the decay follows --train-iters
    wd = float(flags["--weight-decay"])
    optimizer = _optimizer(float(flags["--lr"]))
    scheduler = OptimizerParamScheduler(
        optimizer, init_lr=0.0, max_lr=float(flags["--lr"]), min_lr=float(flags["--min-lr"]),
        lr_warmup_steps=recipe.warmup_iters, lr_decay_steps=recipe.train_iters,
        lr_decay_style=flags["--lr-decay-style"], start_wd=wd, end_wd=wd,
        wd_incr_steps=recipe.train_iters, wd_incr_style="constant")
    scheduler.step(recipe.warmup_iters)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(3e-4)
    scheduler.step(recipe.train_iters - recipe.warmup_iters)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(3e-5)
    assert optimizer.param_groups[0]["weight_decay"] == pytest.approx(0.033)
    assert (flags["--adam-eps"], flags["--seed"], flags["--clip-grad"]) == ("1e-05", "1234", "1.0")
    assert flags["--distributed-timeout-minutes"] == "60"


@pytest.mark.parametrize("style", ["cosine", "linear", "constant"])
def test_deepspeed_scheduler_follows_the_recipe(style: str) -> None:
    """Oracle: DeepSpeed's own schedulers (deepspeed/runtime/lr_schedules.py), built from the
    rendered `scheduler` section as the engine builds them: linear warm-up to the peak lr over
    the recipe's warm-up; then cosine down to min_lr, linear down to 0 (DeepSpeed's
    WarmupDecayLR has no floor), or constant at the peak, at the decay's last step."""
    config, optimizer, scheduler = _deepspeed_scheduler(style, warmup_iters=10)
    scheduler.step(last_batch_iteration=10)  # WarmupCosineLR is one decay step past the peak
    assert optimizer.param_groups[0]["lr"] == pytest.approx(2e-4, rel=1e-3)
    scheduler.step(last_batch_iteration=100)
    end = {"cosine": 2e-5, "linear": 0.0, "constant": 2e-4}[style]
    assert optimizer.param_groups[0]["lr"] == pytest.approx(end, abs=1e-9)
    assert config["optimizer"]["params"]["weight_decay"] == 0.1


@pytest.mark.parametrize("style", ["cosine", "linear", "constant"])
def test_deepspeed_scheduler_without_warmup_starts_at_the_peak(style: str) -> None:
    """Oracle: DeepSpeed's own schedulers built from the rendered section, as the engine builds
    them: with `warmup_iters` 0 every style is accepted (WarmupCosineLR raises on 0 warm-up
    steps) and the first step trains at the peak lr, not at 0."""
    _, optimizer, scheduler = _deepspeed_scheduler(style, warmup_iters=0)
    scheduler.step(last_batch_iteration=0)
    assert optimizer.param_groups[0]["lr"] == pytest.approx(2e-4, rel=1e-3)
