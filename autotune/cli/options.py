"""The command-line options, generated from the config models: one declaration per option.

Each option is a field of a config section (`Problem`, `TrainSpec` through `TrainOverrides`,
`RunnerSettings`, `TuneSettings`, `ScaleSettings`): its flag is the field name with dashes
(or the one spelling in `Section.flags`), its help is the field's docstring with its default,
and its value goes to that field. `with_options(...)` gives a command the options of the
sections it names plus `--config FILE` (a YAML/JSON `RunConfig`, or a `run.json`); the command
receives the merged values as `config`: the file's, overridden by the flags typed.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Annotated
from typing import Any
from typing import Optional

import typer
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from autotune.exceptions import AutotuneError
from autotune.run import Problem
from autotune.run import ScaleSettings
from autotune.runners.base import ProgramOptions
from autotune.runners.factory import RunnerSettings
from autotune.runners.slurm import SlurmSettings
from autotune.search.settings import TuneSettings
from autotune.specs.inputs import read_structured
from autotune.specs.recipe import JobSpec
from autotune.specs.recipe import RecipeSpec
from autotune.specs.train import TrainOverrides
from autotune.specs.train import TrainSpec


@dataclasses.dataclass(frozen=True)
class Section:
    """A config section whose fields become options."""

    path: tuple[str, ...]
    """Where the section sits in a `RunConfig` (e.g. ("problem", "train"))."""
    model: type[BaseModel]
    """The pydantic model whose fields (and docstrings) the options come from."""
    flags: dict[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    """Flag spellings that are not the field name with dashes (short forms included)."""
    skip: tuple[str, ...] = ()
    """Fields that are config-file only (no flag)."""
    prefix: str = ""
    """Flag prefix, e.g. "scale-" for the sweep options of tune."""
    defaults_from: type[BaseModel] | None = None
    """Where the shown defaults live when `model` has none (TrainOverrides: TrainSpec)."""
    text: tuple[str, ...] = ()
    """Fields whose flag passes the text as typed (their validator reads it, e.g. 15T)."""

    def options(self) -> list[tuple[str, tuple[str, ...]]]:
        """(field, flag declarations) of every option of the section."""
        return [(name, self.flags.get(name, ("--" + self.prefix + name.replace("_", "-"),)))
                for name in self.model.model_fields if name not in self.skip]


PROBLEM = Section(("problem",), Problem, {"model": ("--model", "-m"),
                                          "cluster": ("--cluster", "-c")},
                  skip=("train", "recipe", "job"))
TRAIN = Section(("problem", "train"), TrainOverrides,
                {"seq_length": ("--seq",), "global_batch_size": ("--gbs",),
                 "moe_token_dispatcher": ("--moe-dispatcher",)},
                defaults_from=TrainSpec)
RECIPE = Section(("problem", "recipe"), RecipeSpec,
                 skip=tuple(name for name in RecipeSpec.model_fields if name not in (
                     "lr", "min_lr", "warmup_iters", "decay_style", "train_tokens",
                     "distributed_timeout_minutes")))
"""The recipe's common fields as flags (the rest: the config file's `recipe:` section)."""
JOB = Section(("problem", "job"), JobSpec, skip=("container_mounts",))
"""sbatch.sh's partition, account, time and container image as flags."""
RUNNER = Section(("runner",), RunnerSettings,
                 {name: (flag,) for name, flag in RunnerSettings.option_flags().items()})
"""Every runner's settings (each runner declares its own model; `RunnerSettings` joins them)."""
SLURM_JOB = Section(("runner",), SlurmSettings, {"slurm_opts": ("--slurm-opt",)},
                   skip=tuple(ProgramOptions.model_fields))
"""The Slurm runner's job options alone (partition, account, time limit, sbatch options):
calibrate's one job."""
TUNE = Section(("tune",), TuneSettings,
               skip=("warm_start", "explore_every", "pruner_tolerance", "render"))
SCALE = Section(("scale",), ScaleSettings, {"layout": ("--layout", "-l")})
SWEEP = Section(("scale",), ScaleSettings, skip=("layout",), prefix="scale-")
"""tune's options for sweeping its winner (--scale-gpus, --scale-mode; --scale turns it on)."""

CONFIG_HELP = ("A YAML or JSON file of the run (problem, runner, tune, scale, out; a run.json "
               "works too); flags override it.")


def _cli_type(annotation: Any) -> tuple[Any, bool]:
    """The Python type typer parses a field into, and whether it is a yes/no flag."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _cli_type(args[0])
    if origin in (types.UnionType, typing.Union):
        return _cli_type(args[0]) if len(args) == 1 else (str, False)
    if origin in (tuple, list):
        inner = args[0] if args else str
        return (list[str] if inner is str else str), False  # counts: "8,16,32"
    if annotation is bool:
        return bool, True
    if annotation in (int, float, Path):
        return annotation, False
    return str, False


def _default(section: Section, name: str) -> Any:
    model = section.defaults_from or section.model
    field = model.model_fields[name]
    return None if field.default is PydanticUndefined else field.default


def _help(section: Section, name: str) -> str:
    text = " ".join((section.model.model_fields[name].description or "").split())
    default = _default(section, name)
    if default not in (None, (), [], ""):
        text += f" (default: {default})"
    return text


@dataclasses.dataclass(frozen=True)
class _Option:
    param: str
    decls: tuple[str, ...]
    targets: tuple[tuple[str, ...], ...]
    """(path..., field) of every config field the option sets (one flag may feed two)."""
    annotation: Any


def _collect(sections: tuple[Section, ...]) -> list[_Option]:
    by_flag: dict[str, _Option] = {}
    for section in sections:
        for name, decls in section.options():
            target = (*section.path, name)
            if decls[0] in by_flag:  # e.g. --seed: the runner's and the study's
                known = by_flag[decls[0]]
                by_flag[decls[0]] = dataclasses.replace(known, targets=(*known.targets, target))
                continue
            kind, yes_no = _cli_type(section.model.model_fields[name].annotation)
            if name in section.text:
                kind, yes_no = str, False
            spelled = decls
            if yes_no:
                spelled = (f"{decls[0]}/--no-{decls[0].removeprefix('--')}", *decls[1:])
            option = typer.Option(*spelled, help=_help(section, name), show_default=False)
            param = "_".join((*section.path, name))
            by_flag[decls[0]] = _Option(param, decls, (target,),
                                        Annotated[Optional[kind], option])  # noqa: UP045
    return list(by_flag.values())


def flag_of(sections: tuple[Section, ...], loc: tuple[str | int, ...]) -> str | None:
    """The flag behind a config location, e.g. ('problem', 'train', 'seq_length') → --seq."""
    path = tuple(str(part) for part in loc if isinstance(part, str))
    for option in _collect(sections):
        if any(path[: len(target)] == target for target in option.targets):
            return option.decls[0]
    return None


def read_config(path: Path) -> dict[str, Any]:
    """A run config file: a `RunConfig` as YAML/JSON, or the `config` of a run.json.

    Raises:
        AutotuneError: unreadable, or not a mapping of config sections.
    """
    try:
        data = read_structured(path)
    except AutotuneError as error:
        raise AutotuneError(f"--config: {error}") from None
    if isinstance(data, dict) and isinstance(data.get("config"), dict):
        data = data["config"]  # a run.json records the run under "config"
    if not isinstance(data, dict):
        raise AutotuneError(f"--config: {path} holds no mapping; write problem:, runner:, tune:")
    return data


def _merge(base: dict[str, Any], path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        inner = base.get(key)
        base[key] = inner = dict(inner) if isinstance(inner, dict) else {}
        base = inner
    base[path[-1]] = value


def with_options(*sections: Section) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command the options of `sections` and `--config`; it receives `config`, the run's
    values as nested dicts (the file's, then every flag typed)."""
    options = _collect(sections)

    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        signature = inspect.signature(command, eval_str=True)
        own = [p for p in signature.parameters.values() if p.name != "config"]
        added = [inspect.Parameter(o.param, inspect.Parameter.KEYWORD_ONLY, default=None,
                                   annotation=o.annotation) for o in options]
        config_file = inspect.Parameter(
            "config_file", inspect.Parameter.KEYWORD_ONLY, default=None,
            annotation=Annotated[Optional[Path],  # noqa: UP045
                                 typer.Option("--config", help=CONFIG_HELP)])

        @functools.wraps(command)
        def run(**kwargs: Any) -> Any:
            path = kwargs.pop("config_file")
            config = read_config(path) if path is not None else {}
            for option in options:
                value = kwargs.pop(option.param)
                if value is not None:
                    for target in option.targets:
                        _merge(config, target, value)
            return command(**kwargs, config=config)

        run.__signature__ = signature.replace(  # type: ignore[attr-defined]
            parameters=[*own, *added, config_file])
        return run

    return decorate
