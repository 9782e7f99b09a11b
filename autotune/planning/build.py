"""`PlanConfig` (every input of a plan) and `make_plan`: clusters read, constants chosen, every
size planned, the deadline and budget answered.

Clusters are given as `NAME:NODES,NODES,...` of a preset (`dgx-h100:8,16,...,512`: '...'
continues the progression) or as a cluster file, optionally with node counts
(`my-cluster.yaml:4,8`). A cluster's price per GPU-hour is, in order: `--price NAME=PRICE`, the
file's `price_per_gpu_hour`, `--price PRICE`.

Constants: the GPU presets', or with `calibration` a `tune` output folder whose measured
trials are refitted (`autotune.calibration.refit.refit_study`) for clusters of that GPU (the
plan then says which constants it used), or a calibration file of `autotune calibrate`
(`calibration_file_constants`).
"""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path
from typing import Annotated
from typing import Any

from pydantic import BaseModel
from pydantic import BeforeValidator
from pydantic import ConfigDict
from pydantic import Field

from autotune.costmodel.constants import Constants
from autotune.exceptions import AutotuneError
from autotune.exceptions import shorten
from autotune.planning.choice import Choice
from autotune.planning.choice import by_budget
from autotune.planning.choice import by_deadline
from autotune.planning.plan import CAUSE_LABELS
from autotune.planning.plan import ClusterSizes
from autotune.planning.plan import ConstantsFn
from autotune.planning.plan import IntervalFn
from autotune.planning.plan import PlanPoint
from autotune.planning.plan import Threshold
from autotune.planning.plan import model_interval
from autotune.planning.plan import plan_points
from autotune.planning.plan import preset_constants
from autotune.planning.plan import thresholds
from autotune.planning.quantities import expand_sizes
from autotune.planning.quantities import parse_days
from autotune.planning.quantities import parse_money
from autotune.planning.quantities import parse_prices
from autotune.planning.quantities import parse_tokens
from autotune.space.search_space import load_space
from autotune.specs import AutotuneConfig
from autotune.specs.inputs import cluster_presets
from autotune.specs.inputs import existing_path
from autotune.specs.inputs import load_config
from autotune.specs.train import TrainOverrides
from autotune.units import GIB

PLAN_CSV = "plan.csv"
CSV_COLUMNS = (
    "cluster", "name", "gpu", "nodes", "gpus", "global_batch_size", "global_batch_tokens",
    "status", "layout", "tokens_per_s", "tokens_per_s_low", "tokens_per_s_high", "interval",
    "mfu", "peak_memory_gib", "days", "days_low", "days_high", "gpu_hours", "gpu_hours_low",
    "gpu_hours_high", "price_per_gpu_hour", "cost", "cost_low", "cost_high", "efficiency",
    "mark", "cause", "cause_loss", "rule", "reason",
)
"""Columns of plan.csv, in order (stable)."""


def _text(value: Any) -> Any:
    return value if value is None or isinstance(value, str) else str(value)


Tokens = Annotated[float, BeforeValidator(lambda v: parse_tokens(_text(v)))]
GbsTokens = Annotated[float, BeforeValidator(lambda v: parse_tokens(_text(v),
                                                                    "--max-gbs-tokens"))]
Days = Annotated[float, BeforeValidator(lambda v: parse_days(_text(v)))]
Money = Annotated[float, BeforeValidator(lambda v: parse_money(_text(v)))]


class PlanConfig(BaseModel):
    """Everything a plan needs (the CLI's options; a YAML of the same fields works too)."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    model: str
    """A model preset, a YAML file in Megatron's names, or a Hugging Face config.json."""
    clusters: tuple[str, ...] = Field(min_length=1)
    """Cluster types with their sizes: `NAME:NODES,...` of a preset, or a cluster file
    (optionally `FILE:NODES,...`)."""
    tokens: Tokens
    """Tokens to train on (15T, 300B, 1.5e12)."""
    train: TrainOverrides = TrainOverrides()
    """Training settings that differ from the model preset's (any `TrainSpec` field); the
    global batch is the smallest size's, held in tokens across sizes."""
    max_gbs_tokens: GbsTokens | None = None
    """Let the global batch grow with the GPUs from each type's smallest size, up to this many
    tokens per step; None: held at the smallest size's."""
    space: str | None = None
    """A search space YAML file or bundled name; None: the framework's."""
    price: str | None = None
    """Price per GPU-hour: PRICE for every cluster and/or NAME=PRICE per cluster type."""
    deadline: Days | None = None
    """Train within this many days (30d, 36h, 2w): pick the cheapest cluster that does."""
    budget: Money | None = None
    """Spend at most this (2.5M): pick the fastest cluster that does."""
    calibration: Path | None = None
    """A `tune` output folder (its measured trials are refitted) or a calibration file."""

    @property
    def framework(self) -> str:
        """The framework: as set in `train`, else megatron."""
        return str(self.train.model_dump().get("framework") or "megatron")


@dataclasses.dataclass(frozen=True)
class Plan:
    """A finished plan: every size, the efficiency lines, the choices, what it assumed."""

    config: PlanConfig
    points: list[PlanPoint]
    thresholds: list[Threshold]
    choices: list[Choice]
    constants: str
    """Which constants the figures use (presets, a refit study, a calibration file)."""
    setup: dict[str, Any] = dataclasses.field(default_factory=dict)
    """The training setup at the smallest size (framework, sequence, batch, precision)."""
    verified: dict[str, Any] | None = None
    """The measured curve of `--verify-sizes` (scaling.json of the chosen layout)."""

    @property
    def chosen(self) -> PlanPoint | None:
        """The point of the first choice that chose one."""
        name = next((c.chosen for c in self.choices if c.chosen), "")
        return next((p for p in self.points if p.name == name), None)

    @property
    def calibrated(self) -> bool:
        """True when every size that fits carries an interval."""
        ran = [p for p in self.points if p.ok]
        return bool(ran) and all(p.calibrated for p in ran)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (plan.json)."""
        from autotune.report.data import PLAN_SCHEMA  # the report package loads matplotlib

        chosen = self.chosen
        return {
            "schema": PLAN_SCHEMA,
            "inputs": self.config.model_dump(mode="json"),
            "tokens": self.config.tokens,
            "constants": self.constants,
            "setup": self.setup,
            "figures": "predicted",
            "calibrated": self.calibrated,
            "cause_labels": CAUSE_LABELS,
            "points": [p.to_dict() for p in self.points],
            "thresholds": [dataclasses.asdict(t) for t in self.thresholds],
            "choices": [c.to_dict() for c in self.choices],
            "chosen": chosen.name if chosen else None,
            "verified": self.verified,
        }

    def rows(self) -> list[dict[str, Any]]:
        """One flat dict per point with the CSV columns (peak memory in GiB)."""
        gib = {"peak_memory_gib": lambda d: d["peak_memory_bytes"] / GIB
               if d["peak_memory_bytes"] else None}
        return [{key: gib[key](d) if key in gib else d.get(key) for key in CSV_COLUMNS}
                for d in (p.to_dict() for p in self.points)]

    def save(self, out_dir: str | Path) -> dict[str, Path]:
        """Write plan.json and plan.csv into out_dir."""
        from autotune.report.data import PLAN_JSON
        from autotune.report.data import rounded

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        paths = {PLAN_JSON: out / PLAN_JSON, PLAN_CSV: out / PLAN_CSV}
        paths[PLAN_JSON].write_text(json.dumps(rounded(self.to_dict()), indent=2) + "\n")
        cells = [[_cell(row[key]) for key in CSV_COLUMNS] for row in self.rows()]
        with paths[PLAN_CSV].open("w", newline="") as handle:
            csv.writer(handle, lineterminator="\n").writerows([list(CSV_COLUMNS), *cells])
        return paths


def _cell(value: Any) -> Any:
    return "" if value is None else f"{value:.6g}" if isinstance(value, float) else value


# --- inputs -----------------------------------------------------------------------------------


def _split_ref(ref: str) -> tuple[str, str | None, str]:
    """(name, file reference or None, sizes text) of one --cluster value."""
    head, sep, sizes = ref.partition(":")
    if head in cluster_presets():
        return head, None, sizes
    if existing_path(ref) is not None:
        return Path(ref).stem, ref, ""
    head, sep, sizes = ref.rpartition(":")
    if sep and existing_path(head) is not None:
        return Path(head).stem, head, sizes
    return head or ref, ref, ""


def cluster_sizes(config: PlanConfig) -> list[ClusterSizes]:
    """Every cluster type of the plan with its node counts and price.

    Raises:
        AutotuneError: an unreadable cluster or size list, a price for a cluster the plan
            does not have, or a cluster type given twice.
    """
    every, named = parse_prices(config.price) if config.price else (None, {})
    out: list[ClusterSizes] = []
    for ref in config.clusters:
        name, file, sizes_text = _split_ref(ref)
        if any(c.name == name for c in out):
            raise AutotuneError(f"--cluster: {name} is given twice; list all its sizes in one "
                                f"-c, e.g. {name}:8,16,32")
        nodes = expand_sizes(sizes_text, f"--cluster {shorten(ref, 40)}") if sizes_text else None
        first = file if file is not None else f"{name}:{nodes[0] if nodes else 1}"
        overrides = {"framework": config.framework,
                     **config.train.model_dump(exclude_none=True)}
        cfg = load_config(config.model, first, **overrides)
        listed = tuple(nodes) if nodes else (cfg.cluster.nodes,)
        price = named.get(name, cfg.cluster.price_per_gpu_hour or every)
        out.append(ClusterSizes(name, cfg, listed, price))
    unknown = sorted(set(named) - {c.name for c in out})
    if unknown:
        raise AutotuneError(
            f"--price: {', '.join(unknown)} is not a cluster of the plan "
            f"({', '.join(c.name for c in out)}); write NAME=PRICE with one of those names")
    return out


# --- constants --------------------------------------------------------------------------------


def calibration_file_constants(path: Path) -> tuple[ConstantsFn, str]:
    """The constants of a calibration file written by `autotune calibrate`.

    Hook: this build has no reader of calibration files yet, so it refuses them.

    Raises:
        AutotuneError: always (give a `tune` output folder instead).
    """
    raise AutotuneError(
        f"--calibration: {shorten(str(path))} is a file, and this version reads no calibration "
        "files yet; give a `tune --out` folder with measured trials, or plan without it")


def study_constants(folder: Path) -> tuple[ConstantsFn, str]:
    """Constants refitted to the measured trials of a `tune` output folder, for clusters of
    its GPU type (others keep their presets).

    Raises:
        AutotuneError: a folder without a study, a simulated study, or too few measured trials.
    """
    from autotune.calibration.refit import refit_study
    from autotune.report.data import load_run

    run = load_run(folder)
    if not run.records or run.runner in (None, "simulate"):
        raise AutotuneError(
            f"--calibration: {shorten(str(folder))} holds no measured study (its runner: "
            f"{run.runner or 'none'}); give a folder of `tune --runner local|slurm|command`")
    cfg = run.cfg
    report = refit_study(cfg, run.records)
    if not report.fitted:
        raise AutotuneError(
            f"--calibration: {shorten(str(folder))} has {len(report.trials)} measured trial(s); "
            "a refit needs 2 or more")
    gpu, fitted = cfg.cluster.gpu.name, report.after

    def constants(target: AutotuneConfig) -> Constants:
        return fitted if target.cluster.gpu.name == gpu else preset_constants(target)

    changed = ", ".join(f"{n} {getattr(report.before, n):.3g} -> {getattr(fitted, n):.3g}"
                        for n in report.names)
    return constants, (f"refitted to {len(report.trials)} measured trials of {folder} for "
                       f"{gpu} ({changed}); presets for other GPUs")


def choose_constants(config: PlanConfig) -> tuple[ConstantsFn, str]:
    """The constants the plan uses and the sentence that says which."""
    path = config.calibration
    if path is None:
        return preset_constants, "GPU presets (autotune/presets/constants.yaml)"
    if path.is_dir():
        return study_constants(path)
    if path.is_file():
        return calibration_file_constants(path)
    raise AutotuneError(f"--calibration: {shorten(str(path))} is neither a folder nor a file")


# --- the plan ---------------------------------------------------------------------------------


def make_plan(config: PlanConfig, *, interval: IntervalFn = model_interval,
              constants: ConstantsFn | None = None) -> Plan:
    """Plan every size of every cluster of `config` and answer its deadline and budget.

    Args:
        config: The plan's inputs.
        interval: Gives each prediction its interval (default: the cost model's, where it has
            one for the GPU and stack; else the figures are uncalibrated).
        constants: Overrides `config.calibration` (default: as `choose_constants` says).

    Raises:
        AutotuneError: on bad input (before any size is planned), or a deadline or budget
            with a cluster that has no price.
    """
    clusters = cluster_sizes(config)
    if (config.deadline or config.budget) and any(c.price_per_gpu_hour is None
                                                  for c in clusters):
        missing = ", ".join(c.name for c in clusters if c.price_per_gpu_hour is None)
        flag = "--deadline" if config.deadline else "--budget"
        raise AutotuneError(f"{flag}: needs a price per GPU-hour for {missing}; give --price "
                            "PRICE or NAME=PRICE, or price_per_gpu_hour in the cluster file")
    chosen_k, source = (constants, "given") if constants else choose_constants(config)
    space = load_space(config.space, config.framework)
    points = plan_points(clusters, config.tokens, space, max_gbs_tokens=config.max_gbs_tokens,
                         constants=chosen_k, interval=interval)
    choices = []
    if config.deadline is not None:
        choices.append(by_deadline(points, config.deadline))
    if config.budget is not None:
        choices.append(by_budget(points, config.budget))
    train = clusters[0].config.train
    setup = {"framework": train.framework, "seq_length": train.seq_length,
             "global_batch_size": train.global_batch_size, "precision": train.precision}
    return Plan(config, points, thresholds(points), choices, source, setup)

