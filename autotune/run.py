"""One typed configuration of a run, and the policy that carries it out.

`RunConfig` holds everything a `tune` or `scale` run needs: the problem (model and cluster
references, training overrides, search space), the runner and its options, the study options,
the sweep and the output folder. `tune(config)` and `scale(config)` apply the policy that every
caller gets, from the CLI or from Python: the framework default for local CPU trials, the guard
against parallel local trials, `run.json`, the report, and the refit of the model after real
studies. The CLI only parses its options into a RunConfig and prints what these return.

Example:
    >>> from autotune.run import Problem, RunConfig, tune
    >>> config = RunConfig(problem=Problem(model="llama3-8b", cluster="dgx-h100:4"),
    ...                    out="/tmp/llama3-8b")
    >>> # outcome = tune(config); outcome.ranked[0]["layout"], outcome.reports["report.html"]
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Annotated
from typing import Any
from typing import Literal

from pydantic import BaseModel
from pydantic import BeforeValidator
from pydantic import ConfigDict
from pydantic import Field

from autotune.calibration.file import apply_calibration
from autotune.calibration.file import load_calibration
from autotune.costmodel.constants import constants_for
from autotune.exceptions import AutotuneError
from autotune.exceptions import shorten
from autotune.frameworks import FRAMEWORKS
from autotune.frameworks import framework_of
from autotune.frameworks import get_framework
from autotune.layout import Layout
from autotune.runners.factory import RunnerSettings
from autotune.search.record import layout_of
from autotune.search.settings import TuneSettings
from autotune.space.rules import MEMORY_RULE_NAMES
from autotune.space.rules import violations
from autotune.specs import AutotuneConfig
from autotune.specs import DevicesPerNode
from autotune.specs import Integer
from autotune.specs import JobSpec
from autotune.specs import RecipeSpec
from autotune.specs import at_most
from autotune.specs.inputs import batch_warnings
from autotune.specs.inputs import load_config
from autotune.specs.inputs import position_warnings
from autotune.specs.train import TrainOverrides

if TYPE_CHECKING:  # heavy modules (Optuna, matplotlib) load when a run starts
    from autotune.scaling import ScalingResult
    from autotune.search.refit import RefitReport
    from autotune.search.study import TuneResult
    from autotune.verify import VerifyResult


GpuCount = Annotated[Integer, Field(ge=1), at_most(2**26, "65,536 nodes of 1,024 devices")]
"""A number of GPUs."""

_CONFIG = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)


def _split_counts(value: Any) -> Any:
    """'8,16,32' → [8, 16, 32] (anything else is left to the type check)."""
    if not isinstance(value, str):
        return value
    counts = []
    for part in filter(None, (p.strip() for p in value.split(","))):
        if not (part.isascii() and part.isdigit()) or len(part) > 12:
            raise ValueError(f"{shorten(part, 20)} is not a GPU count; write e.g. 8,16,32")
        counts.append(int(part))
    return counts


class Problem(BaseModel):
    """What to train and where, as references the CLI takes (presets, files, `local`)."""

    model_config = _CONFIG

    model: str
    """A model preset, a YAML file in Megatron's names, or a Hugging Face config.json."""
    cluster: str
    """`NAME:NODES` of a cluster preset, a cluster YAML file, or `local`."""
    processes: DevicesPerNode | None = None
    """Worker processes of `local` (default: its GPUs, or 2 CPU processes)."""
    space: str | None = None
    """A search space YAML file or bundled name; None: the framework's."""
    train: TrainOverrides = TrainOverrides()
    """Training settings that differ from the model preset's (any `TrainSpec` field)."""
    calibration: str | None = None
    """A calibration file (`autotune calibrate --out`): its measured constants and figures
    replace the preset's in every prediction."""
    ignore_calibration_mismatch: bool = False
    """Use --calibration even when it was made on another GPU type or software stack."""
    gbs_tokens: Annotated[Integer, Field(ge=1)] | None = None
    """The global batch in tokens instead of --gbs sequences (tokens / seq, which must divide)."""
    recipe: RecipeSpec = RecipeSpec()
    """Learning rate, schedule, token budget and intervals of the rendered configs."""
    job: JobSpec = JobSpec()
    """Slurm partition, account, time limit and container of the rendered sbatch.sh."""

    def overrides(self) -> dict[str, Any]:
        """The training settings this problem sets (the rest keep the preset's)."""
        return dict(self.train.model_dump(exclude_none=True))

    def warnings(self, cfg: AutotuneConfig) -> list[str]:
        """What the user must hear about `cfg` (this problem, loaded): positions the model was
        not trained for, a batch kept in sequences while --seq changed."""
        given = "global_batch_size" in self.overrides() or self.gbs_tokens is not None
        return [*position_warnings(cfg), *batch_warnings(self.model, cfg, batch_given=given)]

    def load(self, default_framework: str = "megatron") -> AutotuneConfig:
        """The model, cluster and training setup (presets and files read, overrides applied)."""
        train = {"framework": default_framework, **self.overrides()}
        cfg = load_config(self.model, self.cluster, processes=self.processes,
                          gbs_tokens=self.gbs_tokens, recipe=self.recipe, job=self.job, **train)
        if self.calibration is None:
            return cfg
        return apply_calibration(cfg, load_calibration(self.calibration), self.calibration,
                                 ignore_mismatch=self.ignore_calibration_mismatch)


class ScaleSettings(BaseModel):
    """A scaling sweep: one layout at several cluster sizes."""

    model_config = _CONFIG

    layout: str | None = None
    """The layout to sweep; None: the study's best (tune --scale)."""
    gpus: Annotated[tuple[GpuCount, ...], BeforeValidator(_split_counts)] | None = None
    """GPU counts (a list or '8,16,32'); None: powers of two up to the cluster."""
    mode: Literal["weak", "strong"] = "weak"
    """weak keeps the per-replica batch, strong the global batch."""


class RunConfig(BaseModel):
    """Everything a run needs: problem, runner, study, sweep and where results go."""

    model_config = _CONFIG

    problem: Problem
    """Model, cluster and training setup."""
    runner: RunnerSettings = RunnerSettings()
    """Who measures the trials."""
    tune: TuneSettings = TuneSettings()
    """The study (tune only)."""
    scale: ScaleSettings | None = None
    """The sweep: the run of `scale`, or the winner's sweep after `tune` when set."""
    out: Path = Path("autotune-out")
    """Output folder: study, trials, configs, reports."""
    command: str | None = None
    """The command line that started the run (kept in run.json; repeated to resume)."""

    def framework(self) -> str:
        """The framework: as given, else for local CPU trials without a framework checkout the
        first framework whose trial programs train on CPU (DeepSpeed: megatron-core needs
        CUDA), else the first framework (Megatron)."""
        given: str | None = self.problem.overrides().get("framework")
        if given:
            return given
        cpu_trials = (
            self.runner.name == "local"
            and self.problem.cluster == "local"
            and not self.runner.megatron_lm
            and not cuda_available()
        )
        if cpu_trials:
            return next(name for name in FRAMEWORKS if get_framework(name).trains_on_cpu)
        return FRAMEWORKS[0]

    def load(self) -> AutotuneConfig:
        """The problem, with this run's framework."""
        return self.problem.load(self.framework())


def cuda_available() -> bool:
    """True when torch sees a CUDA device."""
    import torch

    return bool(torch.cuda.is_available())


def resume_command(config: RunConfig) -> str:
    """The command that continues this run's study (its own command line plus --resume)."""
    if not config.command:
        return "tune(config) again with config.tune.resume = True"
    words = [w for w in shlex.split(config.command) if w not in ("--resume", "--no-resume")]
    return shlex.join([*words, "--resume"])


def prepare_out(path: Path, flag: str = "--out") -> Path:
    """Create the output folder (and its parents); refuse a file or a place that cannot hold it.

    Raises:
        AutotuneError: naming the path and the reason.
    """
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise AutotuneError(f"{flag}: {shorten(str(path))} is a file; give a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise AutotuneError(
            f"{flag}: cannot create {shorten(str(path))}: {error.strerror or error}; "
            "give a writable folder"
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise AutotuneError(f"{flag}: {shorten(str(path))} is not writable; give another folder")
    return path


def check_layout(cfg: AutotuneConfig, text: str) -> tuple[Layout, list[tuple[str, str]]]:
    """Read `--layout` text and check it against the rules.

    Returns:
        The layout and the memory rules it breaks (MEMORY_RULES: it is well formed but too big).

    Raises:
        AutotuneError: when it breaks a structural rule (its memory and speed mean nothing).
    """
    layout = Layout.parse(text, cfg.world_size, cfg.train.global_batch_size, framework_of(cfg))
    broken = violations(cfg, layout, constants_for(cfg.cluster.gpu, cfg.train.software_stack))
    structural = [(name, reason) for name, reason in broken if name not in MEMORY_RULE_NAMES]
    if structural:
        raise AutotuneError(
            "--layout: breaks "
            + "; ".join(f"{name}: {reason}" for name, reason in structural)
            + " (`autotune space` lists the legal layouts)"
        )
    return layout, broken


def default_gpus(cfg: AutotuneConfig, layout: Layout, gpus: tuple[int, ...] | None) -> list[int]:
    """The sweep's GPU counts: as given, else powers of two up to the cluster."""
    from autotune.scaling import default_sizes

    return list(gpus) if gpus else default_sizes(cfg, layout)


@dataclasses.dataclass(frozen=True)
class TuneOutcome:
    """A finished `tune` run: the study, the optional sweep, the refit and the reports."""

    config: RunConfig
    result: TuneResult
    """The study's trials and the rendered configs."""
    refit: RefitReport | None
    """The model refitted to the trials, after real (not simulated) studies."""
    scaled: ScalingResult | None
    """The winner's sweep, with `config.scale`."""
    reports: dict[str, Path]
    """report.md, report.html, summary.json, ... by name."""
    verified: VerifyResult | None = None
    """The winner's loss curve against pure data parallelism, with `tune.verify`."""

    @property
    def ranked(self) -> list[dict[str, Any]]:
        """Trials that measured a throughput, fastest first."""
        return list(self.result.ranked)

    @property
    def ok(self) -> bool:
        """True when some trial measured a throughput (else the work failed)."""
        return bool(self.ranked)

    @property
    def statuses(self) -> dict[str, int]:
        """How many trials ended in each status, by status name."""
        return dict(sorted(Counter(r["status"] for r in self.result.records).items()))


@dataclasses.dataclass(frozen=True)
class ScaleOutcome:
    """A finished `scale` run: the sweep and its reports."""

    config: RunConfig
    result: ScalingResult
    """Every size of the sweep."""
    reports: dict[str, Path]
    """report.md, report.html, summary.json, ... by name."""

    @property
    def ok(self) -> bool:
        """True when some size measured a throughput."""
        return any(p.ok for p in self.result.points)


def tune(config: RunConfig, on_trial: Callable[[Any, Any], None] | None = None) -> TuneOutcome:
    """Run (or resume) the study of `config`, sweep the winner when asked, write the report.

    Args:
        config: The run.
        on_trial: Called after every trial with (study, trial), e.g. for a progress bar.

    Raises:
        AutotuneError: on bad input, before any trial runs.
    """
    from autotune.report import write_report
    from autotune.report import write_run_json
    from autotune.scaling import sweep
    from autotune.search.refit import refit_study
    from autotune.search.storage import default_storage_url
    from autotune.search.study import default_study_name
    from autotune.search.study import tune as run_study
    from autotune.space.search_space import load_space

    cfg = config.load()
    space = load_space(config.problem.space, cfg.train.framework)
    settings = config.tune
    if config.runner.name == "local" and settings.jobs > 1:
        raise AutotuneError("--jobs: local trials share this machine's GPUs or cores; use 1")
    if settings.verify and config.runner.name not in ("local", "slurm"):
        raise AutotuneError(f"--verify: compares loss curves, so it needs --runner local or "
                            f"slurm (got --runner {config.runner.name})")
    runner = config.runner.build(resume=settings.resume)
    out = prepare_out(config.out)
    write_run_json(
        out,
        study_name=settings.study or default_study_name(cfg),
        storage=settings.storage or default_storage_url(out),
        runner=config.runner.name,
        runner_options=config.runner.recorded(),
        options=settings.model_dump(mode="json"),
        command=config.command,
        config=config.model_dump(mode="json", exclude={"command"}),
    )
    result = run_study(cfg, space, runner, settings, out, on_trial=on_trial)
    scaled = None
    if config.scale is not None and result.ranked:
        best = layout_of(result.ranked[0])
        gpus = default_gpus(cfg, best, config.scale.gpus)
        scaled = sweep(cfg, best, gpus, config.scale.mode, runner, out)
    verified = None
    if settings.verify and result.ranked:
        from autotune.verify import verify

        verified = verify(cfg, layout_of(result.ranked[0]), runner, out)
    reports = write_report(out, records=result.records, config=cfg.model_dump(mode="json"),
                           confidence=result.confidence)
    refit = None
    if config.runner.name != "simulate":
        refit = refit_study(cfg, result.records, space=space)
    return TuneOutcome(config, result, refit, scaled, reports, verified)


def scale(config: RunConfig) -> ScaleOutcome:
    """Run `config.scale.layout` at each GPU count of the sweep and write the report.

    Raises:
        AutotuneError: on bad input (no layout, an unreadable one), before any point runs.
    """
    from autotune.report import write_report
    from autotune.scaling import sweep

    if config.scale is None or not config.scale.layout:
        raise AutotuneError("--layout: scale needs the layout to sweep, e.g. -l tp=8,pp=2")
    cfg = config.load()
    layout = Layout.parse(
        config.scale.layout, cfg.world_size, cfg.train.global_batch_size, framework_of(cfg)
    )
    runner = config.runner.build()
    out = prepare_out(config.out)
    result = sweep(cfg, layout, default_gpus(cfg, layout, config.scale.gpus), config.scale.mode,
                   runner, out)
    return ScaleOutcome(config, result, write_report(out))


