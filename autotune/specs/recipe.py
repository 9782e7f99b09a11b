"""The training recipe the rendered configs train with, and where a Slurm job runs.

`RecipeSpec` is the `recipe:` section of a config file: learning rate and its schedule, weight
decay, clipping, Adam's constants, seed, token budget, save/eval intervals and the collective
timeout. A field left out takes the model family's published recipe where one exists
(`presets/recipes.yaml`, each entry with its source), else autotune's default (`TOOL_DEFAULTS`,
each with its reason); `resolve_recipe` says which is which, and the rendered scripts list every
value the tool chose. `JobSpec` is the `job:` section: Slurm partition, account, time limit and
an optional container (pyxis `--container-image` / `--container-mounts`).

Example:
    >>> from autotune.specs.inputs import load_config
    >>> recipe = resolve_recipe(load_config("llama3-70b", "dgx-h100:8"))
    >>> recipe.lr, recipe.warmup_iters, recipe.origin["lr"]
    (0.0003, 2000, 'published')
"""

from __future__ import annotations

import dataclasses
import math
import re
from functools import cache
from typing import Annotated
from typing import Any
from typing import Literal

import yaml
from pydantic import BaseModel
from pydantic import Field
from pydantic import field_validator

from autotune.exceptions import AutotuneError
from autotune.resources import resource_dir
from autotune.specs.types import FROZEN
from autotune.specs.types import FiniteFloat
from autotune.specs.types import Integer
from autotune.specs.types import Seed

DecayStyle = Literal["cosine", "linear", "constant"]
"""Learning-rate decay after the warm-up (Megatron-LM `--lr-decay-style`)."""

_Positive = Annotated[FiniteFloat, Field(gt=0)]
_NonNegative = Annotated[FiniteFloat, Field(ge=0)]
_Beta = Annotated[FiniteFloat, Field(ge=0, lt=1)]
_Count = Annotated[Integer, Field(ge=1)]
_CountOrZero = Annotated[Integer, Field(ge=0)]

RECIPE_FIELDS = (
    "lr", "min_lr", "warmup_iters", "decay_style", "decay_iters", "weight_decay", "clip_grad",
    "adam_beta1", "adam_beta2", "adam_eps", "seed", "train_tokens", "save_interval",
    "eval_interval", "eval_iters", "distributed_timeout_minutes",
)
"""The recipe's fields, in the order the rendered headers list them."""

TOOL_DEFAULTS: dict[str, tuple[Any, str]] = {
    "lr": (3.0e-4, "Llama 2 7B/13B's peak lr (Touvron et al. 2023, Table 1)"),
    "min_lr": (None, "a tenth of the peak lr (Llama 2, GPT-3)"),
    "warmup_iters": (2000, "Llama 2's 2,000 steps, at most a tenth of the run"),
    "decay_style": ("cosine", "Llama 2, Llama 3 and GPT-3 decay by a cosine"),
    "decay_iters": (None, "the run's iterations"),
    "weight_decay": (0.1, "AdamW weight decay of Llama 2 and GPT-3"),
    "clip_grad": (1.0, "global gradient-norm clip of Llama 2 and GPT-3"),
    "adam_beta1": (0.9, "Llama 2 and GPT-3"),
    "adam_beta2": (0.95, "Llama 2 and GPT-3"),
    "adam_eps": (1.0e-8, "GPT-3 (Brown et al. 2020, Appendix B)"),
    "seed": (1234, "Megatron-LM's default --seed"),
    "train_tokens": (None, "20 tokens per parameter, compute-optimal per Hoffmann et al. 2022"),
    "save_interval": (1000, "a checkpoint every 1,000 iterations"),
    "eval_interval": (1000, "Megatron-LM's default --eval-interval"),
    "eval_iters": (10, "ten validation batches per evaluation"),
    "distributed_timeout_minutes": (
        60, "Megatron's and DeepSpeed's 10 minutes are shorter than a large model's "
            "checkpoint load or a long-context step"),
}
"""Each field's default when no published recipe gives it, with the reason (None: derived)."""

TOKENS_PER_PARAMETER = 20
"""Compute-optimal tokens per parameter (Hoffmann et al. 2022, "Training Compute-Optimal Large
Language Models", Table 3): the token budget of a model without a published recipe."""


class RecipeSpec(BaseModel):
    """The training recipe (a config file's `recipe:` section); None takes the default."""

    model_config = FROZEN

    lr: _Positive | None = None
    """Peak learning rate (`--lr`)."""
    min_lr: _NonNegative | None = None
    """Learning rate at the end of the decay (`--min-lr`)."""
    warmup_iters: _CountOrZero | None = None
    """Iterations of linear warm-up from 0 to the peak (`--lr-warmup-iters`)."""
    decay_style: DecayStyle | None = None
    """Decay after the warm-up (`--lr-decay-style`)."""
    decay_iters: _Count | None = None
    """Iterations over which the learning rate decays (`--lr-decay-iters`; default: the run)."""
    weight_decay: _NonNegative | None = None
    """Decoupled (AdamW) weight decay (`--weight-decay`)."""
    clip_grad: _NonNegative | None = None
    """Global gradient-norm clip, 0 for none (`--clip-grad`)."""
    adam_beta1: _Beta | None = None
    """Adam's first-moment decay (`--adam-beta1`)."""
    adam_beta2: _Beta | None = None
    """Adam's second-moment decay (`--adam-beta2`)."""
    adam_eps: _Positive | None = None
    """Adam's epsilon (`--adam-eps`)."""
    seed: Seed | None = None
    """Random seed (`--seed`)."""
    train_tokens: _Count | None = None
    """Token budget of the run, tokens (`--train-iters` = tokens / tokens per step, rounded up)."""
    save_interval: _Count | None = None
    """Iterations between checkpoints (`--save-interval`)."""
    eval_interval: _Count | None = None
    """Iterations between evaluations (`--eval-interval`)."""
    eval_iters: _CountOrZero | None = None
    """Batches per evaluation, 0 for none (`--eval-iters`)."""
    distributed_timeout_minutes: _Count | None = None
    """Minutes a collective may wait before the job fails (`--distributed-timeout-minutes`,
    DeepSpeed's `DEEPSPEED_TIMEOUT`)."""


_MOUNT = re.compile(r"[^\s,:'\"\\#$`]+:[^\s,:'\"\\#$`]+(:ro|:rw)?")
_IMAGE = re.compile(r"\S+")


class JobSpec(BaseModel):
    """Where the Slurm job runs (a config file's `job:` section); None leaves it to the site."""

    model_config = FROZEN

    partition: str | None = None
    """`#SBATCH --partition` (unset: a commented placeholder)."""
    account: str | None = None
    """`#SBATCH --account` (unset: a commented placeholder)."""
    time: str | None = None
    """`#SBATCH --time`, e.g. `04:00:00` or `2-00:00:00` (unset: a commented placeholder)."""
    container_image: str | None = None
    """Container the tasks run in, through pyxis/enroot (`srun --container-image`): an image
    reference such as `nvcr.io#nvidia/pytorch:25.01-py3` or a squashfs file."""
    container_mounts: tuple[str, ...] = ()
    """`SRC:DST[:ro]` mounts of the container (`srun --container-mounts`); the artifacts folder,
    the data and the framework checkout must be visible inside."""
    train_script: str | None = None
    """DeepSpeed: the training program launch_deepspeed.sh and sbatch.sh run (TRAIN_SCRIPT's
    default; unset: train.py). `builtin`: autotune's own DeepSpeed GPT trained on DATA_PATH, a
    .npy file of uint16/uint32 token ids, for TRAIN_ITERS steps (no checkpoints)."""

    @field_validator("train_script")
    @classmethod
    def _check_script(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("is empty; give a script path or builtin")
        return value

    @field_validator("container_image")
    @classmethod
    def _check_image(cls, value: str | None) -> str | None:
        if value is not None and not _IMAGE.fullmatch(value):
            raise ValueError(f"{value!r} may not contain whitespace")
        return value

    @field_validator("container_mounts")
    @classmethod
    def _check_mounts(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for mount in value:
            if not _MOUNT.fullmatch(mount):
                raise ValueError(f"{mount!r} is not SRC:DST or SRC:DST:ro (no spaces or commas)")
        return value


@dataclasses.dataclass(frozen=True, slots=True)
class Recipe:
    """The recipe a layout is rendered with, every value resolved, and where each came from."""

    lr: float
    min_lr: float
    warmup_iters: int
    decay_style: DecayStyle
    decay_iters: int | None
    """None: over the run's iterations (Megatron's default for --lr-decay-iters)."""
    weight_decay: float
    clip_grad: float
    adam_beta1: float
    adam_beta2: float
    adam_eps: float
    seed: int
    train_tokens: int
    save_interval: int
    eval_interval: int
    eval_iters: int
    distributed_timeout_minutes: int
    train_iters: int
    """Iterations of the token budget at this run's tokens per step (rounded up)."""
    tokens_per_iteration: int
    """Tokens per optimizer step (global batch x sequence length)."""
    origin: dict[str, str]
    """Field -> `set` (the user's), `published` (the family's recipe) or `autotune`."""
    source: str | None
    """The published recipe's citation, if one applies."""

    @property
    def decay_length(self) -> int:
        """Iterations the learning rate decays over."""
        return self.decay_iters if self.decay_iters is not None else self.train_iters

    def value_text(self, name: str) -> str:
        """A field's value as the header shows it."""
        if name == "decay_iters" and self.decay_iters is None:
            return f"the run ({self.train_iters:,} iterations)"
        value = getattr(self, name)
        if name == "train_tokens":
            return f"{value:,} tokens ({self.train_iters:,} iterations)"
        if name == "seed" or not isinstance(value, int):
            return str(value)
        return f"{value:,}"

    def why(self, name: str) -> str:
        """Where a field's value came from, in words."""
        return {"set": "your config", "published": "published recipe"}.get(
            self.origin[name], "autotune default: " + TOOL_DEFAULTS[name][1])

    def rows(self) -> list[tuple[str, str, str]]:
        """(field, value, why) of every field, in `RECIPE_FIELDS` order."""
        return [(name, self.value_text(name), self.why(name)) for name in RECIPE_FIELDS]

    def chosen(self) -> list[tuple[str, str, str]]:
        """(field, value, why) of every value the user did not set, in `RECIPE_FIELDS` order."""
        return [row for row in self.rows() if self.origin[row[0]] != "set"]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready values, origins and source (for manifest.json)."""
        return dataclasses.asdict(self)


@cache
def published_recipes() -> dict[str, Any]:
    """Model preset name -> its published recipe entry (`presets/recipes.yaml`)."""
    data: dict[str, Any] = yaml.safe_load((resource_dir("presets") / "recipes.yaml").read_text())
    return data


def _iterations(tokens: float, per_iteration: int) -> int:
    return max(1, math.ceil(tokens / per_iteration))


def resolve_recipe(cfg: Any) -> Recipe:
    """The recipe of `cfg` (an `AutotuneConfig`): its `recipe` section, else the model preset's
    published recipe, else `TOOL_DEFAULTS`.

    Raises:
        AutotuneError: The values contradict each other (min_lr above lr, a warm-up as long as
            the decay); the message names the field and the fix.
    """
    spec: RecipeSpec = cfg.recipe
    entry = published_recipes().get(cfg.model.name)
    published: dict[str, Any] = dict(entry["recipe"]) if entry else {}
    per_iteration = cfg.train.tokens_per_step
    if "train_iters" in published:
        at = entry["at"] if entry else {}
        published["train_tokens"] = (published.pop("train_iters") * at["global_batch_size"]
                                     * at["seq_length"])
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for name in RECIPE_FIELDS:
        if getattr(spec, name) is not None:
            values[name], origin[name] = getattr(spec, name), "set"
        elif name in published:
            values[name], origin[name] = published[name], "published"
        else:
            values[name], origin[name] = TOOL_DEFAULTS[name][0], "autotune"
    for name in ("warmup", "decay"):
        if origin[f"{name}_iters"] == "autotune" and f"{name}_tokens" in published:
            values[f"{name}_iters"] = _iterations(published[f"{name}_tokens"], per_iteration)
            origin[f"{name}_iters"] = "published"
    if values["train_tokens"] is None:
        values["train_tokens"] = TOKENS_PER_PARAMETER * cfg.model.num_params()
    train_iters = _iterations(values["train_tokens"], per_iteration)
    if values["min_lr"] is None:
        values["min_lr"] = float(f"{values['lr'] / 10:.6g}")
    if origin["warmup_iters"] == "autotune":
        values["warmup_iters"] = min(values["warmup_iters"], train_iters // 10)
    if values["min_lr"] > values["lr"]:
        raise AutotuneError(f"recipe.min_lr: {values['min_lr']} exceeds lr {values['lr']}; "
                            "set min_lr at most lr")
    decay = values["decay_iters"] or train_iters
    if values["warmup_iters"] >= decay:
        raise AutotuneError(
            f"recipe.warmup_iters: {values['warmup_iters']:,} warm-up iterations reach the "
            f"{decay:,} of the decay (Megatron asserts warm-up < decay); lower warmup_iters or "
            "raise train_tokens / decay_iters")
    return Recipe(**values, train_iters=train_iters, tokens_per_iteration=per_iteration,
                  origin=origin, source=" ".join(entry["source"].split()) if entry else None)
