"""Training recipes: published defaults per model family, the user's overrides, the checks."""

from __future__ import annotations

import pytest

from autotune import AutotuneError
from autotune import load_config
from autotune.specs import RecipeSpec
from autotune.specs import resolve_recipe
from autotune.specs.inputs import batch_warnings
from autotune.specs.inputs import position_warnings


def test_llama3_70b_defaults_are_the_megatron_bridge_recipe() -> None:
    """Oracle: Megatron-Bridge's published Llama 3 70B pretrain_config (recipes/llama/
    llama3_70b.py, recipes/utils/optimizer_utils.py), values typed from its source: peak lr 3e-4,
    min lr 3e-5, 2,000 warm-up iterations, cosine decay over the 1,168,251 training iterations
    of 512 x 8,192-token sequences, Adam (0.9, 0.95, eps 1e-5), weight decay 0.033 (the
    scheduler's constant start/end_weight_decay), clipping 1.0, seed 1234, evaluation every
    2,000 iterations over 32 batches, a checkpoint every 2,000."""
    recipe = resolve_recipe(load_config("llama3-70b", "dgx-h100:8", seq_length=8192,
                                        global_batch_size=512))
    assert (recipe.lr, recipe.min_lr, recipe.warmup_iters, recipe.decay_style) == (
        3e-4, 3e-5, 2000, "cosine")
    assert recipe.train_iters == 1_168_251 and recipe.decay_length == 1_168_251
    assert recipe.train_tokens == 1_168_251 * 512 * 8192
    assert (recipe.adam_beta1, recipe.adam_beta2, recipe.adam_eps) == (0.9, 0.95, 1e-5)
    assert (recipe.weight_decay, recipe.clip_grad, recipe.seed) == (0.033, 1.0, 1234)
    assert (recipe.eval_interval, recipe.eval_iters, recipe.save_interval) == (2000, 32, 2000)
    assert "Megatron-Bridge" in (recipe.source or "")
    assert recipe.origin["lr"] == "published"
    assert recipe.origin["distributed_timeout_minutes"] == "autotune"


def test_the_token_budget_sets_the_iterations_at_the_run_batch() -> None:
    """Oracle: arithmetic by hand: the same 4.9T-token budget at a global batch of 1,024
    sequences of 8,192 tokens is ceil(1,168,251 / 2) = 584,126 iterations."""
    recipe = resolve_recipe(load_config("llama3-70b", "dgx-h100:8", global_batch_size=1024))
    assert recipe.train_iters == 584_126


def test_gpt3_warmup_is_375m_tokens() -> None:
    """Oracle: GPT-3 (Brown et al. 2020, Appendix B): warm-up over 375M tokens, cosine decay
    over 260B; at 1,536 x 2,048 = 3,145,728 tokens per step that is ceil(119.2) = 120 and
    ceil(82,651.8) = 82,652 iterations (by hand); Table 2.1: 175B's peak lr 0.6e-4."""
    recipe = resolve_recipe(load_config("gpt3-175b", "dgx-a100:128"))
    assert (recipe.warmup_iters, recipe.decay_iters, recipe.lr) == (120, 82_652, 6e-5)
    assert recipe.origin["warmup_iters"] == recipe.origin["decay_iters"] == "published"


def test_user_values_win_and_every_other_value_is_listed() -> None:
    """Oracle: the spec's contract: a value the user sets is used and not listed among the
    values autotune chose; each of the 15 others is listed with its reason."""
    spec = RecipeSpec(lr=1e-4, train_tokens=10_000_000_000)
    recipe = resolve_recipe(load_config("llama3-70b", "dgx-h100:8", recipe=spec))
    assert recipe.lr == 1e-4 and recipe.min_lr == 3e-5
    assert recipe.train_iters == 2385  # ceil(1e10 / 4,194,304)
    chosen = {name for name, _, _ in recipe.chosen()}
    assert "lr" not in chosen and "train_tokens" not in chosen and len(chosen) == 14


def test_a_model_without_a_published_recipe_gets_autotune_defaults() -> None:
    """Oracle: Hoffmann et al. 2022 (20 tokens per parameter) and a tenth of the peak lr, worked
    out by hand from the model's parameter count; the warm-up is capped at a tenth of the run."""
    cfg = load_config("tiny-gpt", "local")
    recipe = resolve_recipe(cfg)
    assert recipe.source is None and set(recipe.origin.values()) == {"autotune"}
    assert recipe.train_tokens == 20 * cfg.model.num_params()
    assert recipe.min_lr == pytest.approx(recipe.lr / 10)
    assert recipe.warmup_iters == min(2000, recipe.train_iters // 10)


@pytest.mark.parametrize(("spec", "field"), [
    (RecipeSpec(lr=1e-5, min_lr=1e-4), "recipe.min_lr"),
    (RecipeSpec(warmup_iters=5000, train_tokens=4_194_304 * 100), "recipe.warmup_iters"),
])
def test_contradictions_name_the_field(spec: RecipeSpec, field: str) -> None:
    """Oracle: megatron-core's OptimizerParamScheduler asserts max_lr >= min_lr and warm-up <
    decay steps; autotune refuses the same values first, naming the field."""
    with pytest.raises(AutotuneError, match=field.replace(".", r"\.")):
        resolve_recipe(load_config("llama3-8b", "dgx-h100:1", recipe=spec))


def test_gbs_tokens_sets_the_batch_in_sequences() -> None:
    """Oracle: arithmetic by hand: 4,194,304 tokens at seq 8,192 are 512 sequences, at 131,072
    they are 32; a budget that is not whole sequences names the flag and a multiple."""
    short = load_config("llama3-8b", "dgx-h100:1", gbs_tokens=4_194_304)
    assert short.train.global_batch_size == 512
    long = load_config("llama3-8b", "dgx-h100:1", seq_length=131072, gbs_tokens=4_194_304)
    assert long.train.global_batch_size == 32
    with pytest.raises(AutotuneError, match=r"--gbs-tokens: 5,000,000 tokens .* e\.g\. 4,997,120"):
        load_config("llama3-8b", "dgx-h100:1", gbs_tokens=5_000_000)
    with pytest.raises(AutotuneError, match="not both"):
        load_config("llama3-8b", "dgx-h100:1", gbs_tokens=4_194_304, global_batch_size=512)


def test_positions_beyond_the_model_without_rope_scaling_warn() -> None:
    """Oracle: the released configs: Llama 3 8B has 8,192 positions and no rope_scaling
    (meta-llama/Meta-Llama-3-8B config.json), Llama 3.1 405B has llama3 rope scaling to 131,072."""
    assert position_warnings(load_config("llama3-8b", "dgx-h100:1", seq_length=8192)) == []
    warned = position_warnings(load_config("llama3-8b", "dgx-h100:1", seq_length=131072))
    assert len(warned) == 1 and "8,192 positions" in warned[0] and "rope_scaling" in warned[0]
    assert position_warnings(load_config("llama3-405b", "dgx-h100:1", seq_length=131072)) == []


def test_a_preset_batch_kept_in_sequences_warns_when_seq_changes() -> None:
    """Oracle: tokens per step = sequences x tokens per sequence, by hand: llama3-8b's preset
    batch of 512 sequences of 8,192 tokens is 4,194,304 tokens; at --seq 131,072 the same 512
    sequences are 67,108,864 tokens, and 32 sequences keep 4,194,304."""
    long = load_config("llama3-8b", "dgx-h100:1", seq_length=131072)
    warned = batch_warnings("llama3-8b", long, batch_given=False)
    assert len(warned) == 1 and "67.1M tokens per step" in warned[0]
    assert "4.19M at" in warned[0] and "--gbs 32 " in warned[0]
    assert batch_warnings("llama3-8b", long, batch_given=True) == []
    assert batch_warnings("llama3-8b", load_config("llama3-8b", "dgx-h100:1"),
                          batch_given=False) == []
