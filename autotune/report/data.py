"""What an output folder holds (a tune study, a scaling sweep, or both), as plain values.

A tune folder is found through `run.json` (written when the study starts; see `write_run_json`)
or, without one, through the single study in `DIR/study.db`. The study carries the inputs
(`autotune_inputs`) and every trial; `autotune.search.study.trial_records` flattens them. A scale
folder holds `scaling.json` (`autotune.scaling`). `summary` turns a folder into the stable
summary.json document and `trial_rows` into trials.csv rows.
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections import Counter
from pathlib import Path
from typing import Any
from typing import Literal

from pydantic import BaseModel
from pydantic import ConfigDict
from pydantic import Field
from pydantic import TypeAdapter
from pydantic import ValidationError
from pydantic import model_validator

from autotune.exceptions import AutotuneError
from autotune.layout import Layout
from autotune.runners.factory import figure_label
from autotune.scaling import SCALING_JSON
from autotune.scaling import ScalingPoint
from autotune.search.record import measured_figure
from autotune.search.record import predicted_figure
from autotune.specs import AutotuneConfig
from autotune.specs.inputs import validation_message
from autotune.units import GIB

RUN_JSON = "run.json"
PLAN_JSON = "plan.json"
"""What `autotune plan --out` writes (`autotune.planning.build.Plan.to_dict`)."""
PLAN_SCHEMA = "autotune.plan/1"
SUMMARY_SCHEMA = "autotune.report/1"
FAILED = ("oom", "nccl_timeout", "hang", "timeout", "nan", "rejected", "crash", "pruned",
          "invalid")
"""Statuses of trials that ran but did not measure a throughput."""
TRIAL_COLUMNS = (
    "number", "state", "status", "layout", "layout_id", "tp", "pp", "dp", "cp", "vpp", "zero",
    "offload", "mbs", "gas", "recompute", "sp", "measured_tokens_per_s", "measured_step_time_s",
    "measured_tflops_per_gpu", "measured_mfu", "measured_peak_memory_gib",
    "predicted_tokens_per_s", "predicted_step_time_s", "predicted_tflops_per_gpu",
    "predicted_mfu", "predicted_peak_memory_gib", "error_pct", "rule", "reason",
    "duplicate_of", "warm_start",
)
"""Columns of trials.csv, in order (stable; empty cells where a trial has no value)."""


@dataclasses.dataclass(frozen=True)
class RunData:
    """One output folder: the inputs, the study's trials and the sweep, whichever exist."""

    directory: Path
    config: dict[str, Any]
    """AutotuneConfig in JSON form (model, cluster, train)."""
    records: list[dict[str, Any]]
    """Trial records of the study, by trial number (empty without a study)."""
    scaling: dict[str, Any] | None
    study_name: str | None = None
    storage: str | None = None
    runner: str | None = None
    run_info: dict[str, Any] = dataclasses.field(default_factory=dict)
    """run.json as written (empty when the folder has none)."""
    confidence: dict[str, Any] | None = None
    """How sure the search is of its winner (`autotune.search.study.TuneResult.confidence`)."""

    @property
    def kind(self) -> str:
        """tune, scale or tune+scale."""
        parts = (["tune"] if self.study_name else []) + (["scale"] if self.scaling else [])
        return "+".join(parts)

    @property
    def label(self) -> str:
        """What the trials' figures are: measured, or simulated (the simulate runner)."""
        return figure_label(self.runner)

    @property
    def cfg(self) -> AutotuneConfig:
        """The inputs as an AutotuneConfig."""
        return AutotuneConfig.model_validate(self.config)

    @property
    def ranked(self) -> list[dict[str, Any]]:
        """Layouts that measured a throughput, fastest first
        (`autotune.search.study.rank_trials`)."""
        from autotune.search.study import rank_trials

        return rank_trials(self.records)


def write_run_json(
    out_dir: str | Path,
    *,
    study_name: str,
    storage: str,
    runner: str,
    runner_options: dict[str, Any] | None = None,
    options: dict[str, Any] | None = None,
    command: str | None = None,
    config: dict[str, Any] | None = None,
) -> Path:
    """Write DIR/run.json: where the study lives and how it was run (call when tune starts).

    A SQLite or journal storage inside DIR is stored relative (`sqlite:///study.db`), so the
    folder can move. `config` is the whole run (`RunConfig`): `autotune tune --config
    DIR/run.json` runs it again.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "schema": "autotune.run/1",
        "study_name": study_name,
        "storage": _relative_storage(storage, out),
        "runner": runner,
        "runner_options": runner_options or {},
        "options": options or {},
        "command": command,
        "config": config,
    }
    path = out / RUN_JSON
    path.write_text(json.dumps(doc, indent=2, default=str) + "\n")
    return path


def _relative_storage(url: str, out: Path) -> str:
    for prefix in ("sqlite:///", "journal:"):
        if url.startswith(prefix):
            path = Path(url.removeprefix(prefix))
            try:
                return prefix + str(path.resolve().relative_to(out.resolve()))
            except ValueError:
                return url
    return url


def _resolve_storage(url: str, directory: Path) -> str:
    """Relative SQLite and journal paths are relative to the folder; a moved folder finds its
    own copy."""
    for prefix in ("sqlite:///", "journal:"):
        if url.startswith(prefix):
            path = Path(url.removeprefix(prefix))
            if not path.is_absolute():
                path = directory / path
            if not path.exists() and (directory / path.name).exists():
                path = directory / path.name
            return prefix + str(path.resolve())
    return url


def _load_study(url: str, name: str | None) -> Any:
    import optuna

    from autotune.search.storage import open_storage

    storage: Any = open_storage(url)  # the driver for postgresql://, heartbeat journals
    if name is None:
        names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
        if len(names) != 1:
            raise AutotuneError(
                f"report: {url} holds {len(names)} studies ({', '.join(names) or 'none'}); "
                "name one in run.json (study_name)")
        name = names[0]
    try:
        return optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        raise AutotuneError(f"report: no study {name!r} in {url}") from None


class _Options(BaseModel):
    model_config = ConfigDict(extra="allow")

    top_k: int = Field(default=5, ge=0, le=1000)


class _RunInfo(BaseModel):
    """run.json as `write_run_json` writes it (unknown keys kept)."""

    model_config = ConfigDict(extra="allow")

    study_name: str | None = None
    storage: str | None = None
    runner: str | None = None
    runner_options: dict[str, Any] = {}
    options: _Options = _Options()
    command: str | None = None


class _SweptLayout(BaseModel):
    model_config = ConfigDict(extra="allow")

    text: str

    @model_validator(mode="after")
    def _fields(self) -> _SweptLayout:
        known = {f.name for f in dataclasses.fields(Layout)}
        fields = {k: v for k, v in (self.model_extra or {}).items() if k in known}
        TypeAdapter(Layout).validate_json(json.dumps(fields), strict=True)
        return self


class _ScalingDoc(BaseModel):
    """scaling.json as `autotune.scaling.ScalingResult.save` writes it (unknown keys kept)."""

    model_config = ConfigDict(extra="allow")

    mode: Literal["weak", "strong"]
    runner: str | None = None
    layout: _SweptLayout
    base_gpus: int | None = None
    inputs: AutotuneConfig
    points: list[ScalingPoint]


def _read_json(path: Path, schema: type[BaseModel]) -> dict[str, Any]:
    """A JSON object file that autotune wrote, checked against `schema` with JSON's own types
    (strict: a number written as a string is an error, not converted)."""
    fix = "regenerate it (rerun the command that wrote it) or delete it"
    try:
        text = path.read_text(encoding="utf-8")
        value = json.loads(text)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, RecursionError) as error:
        reason = getattr(error, "msg", None) or getattr(error, "strerror", None) or "unreadable"
        raise AutotuneError(f"report: {path} is not valid JSON ({reason}); {fix}") from None
    if not isinstance(value, dict):
        raise AutotuneError(
            f"report: {path} holds a JSON {type(value).__name__}, not an object; {fix}"
        )
    try:
        schema.model_validate_json(text, strict=True)
    except ValidationError as error:
        raise AutotuneError(f"{validation_message(error, f'report: {path}')}; {fix}") from None
    return value


def read_plan(directory: str | Path) -> dict[str, Any] | None:
    """plan.json of a folder as a dict, or None when the folder has none.

    Raises:
        AutotuneError: when plan.json is not a plan autotune wrote.
    """
    path = Path(directory) / PLAN_JSON
    if not path.is_file():
        return None
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise AutotuneError(f"{path}: cannot read it ({error}); rerun `autotune plan`") from None
    if not isinstance(doc, dict) or doc.get("schema") != PLAN_SCHEMA:
        raise AutotuneError(f"{path}: not an autotune plan (schema {PLAN_SCHEMA}); rerun "
                            "`autotune plan --out DIR`")
    return doc


def load_run(directory: str | Path, records: list[dict[str, Any]] | None = None,
             config: dict[str, Any] | None = None,
             confidence: dict[str, Any] | None = None) -> RunData:
    """Read a tune and/or scale output folder (`records` and `config`: the study's trials and
    inputs as the tuner that just ran holds them, so the study is not read back; an in-memory
    study cannot be).

    Raises:
        AutotuneError: when the folder holds neither a study nor scaling.json, or when run.json
            or scaling.json is not what autotune writes.
    """
    from autotune.search.study import INPUTS_ATTR
    from autotune.search.study import trial_records

    folder = Path(directory)
    info: dict[str, Any] = {}
    if (folder / RUN_JSON).is_file():
        info = _read_json(folder / RUN_JSON, _RunInfo)
    url = info.get("storage")
    if url is None and (folder / "study.db").is_file():
        url = "sqlite:///study.db"
    scaling = None
    if (folder / SCALING_JSON).is_file():
        scaling = _read_json(folder / SCALING_JSON, _ScalingDoc)
    name = info.get("study_name")
    if records is not None:
        records = sorted(records, key=lambda r: r["number"])
    elif url is not None:
        study = _load_study(_resolve_storage(url, folder), name)
        name = study.study_name
        records = sorted(trial_records(study), key=lambda r: r["number"])
        config = (study.user_attrs.get(INPUTS_ATTR) or {}).get("config")
        confidence = confidence or study.user_attrs.get("confidence")
    else:
        records = []
    if config is None and scaling is not None:
        config = scaling["inputs"]
    if config is None:
        raise AutotuneError(
            f"report: {folder} holds no study (run.json or study.db) and no scaling.json; run "
            "`autotune tune --out DIR` or `autotune scale --out DIR` first")
    try:
        AutotuneConfig.model_validate(config)
    except ValidationError as error:
        raise AutotuneError(validation_message(error, f"report: the inputs of {folder}")) from None
    runner = info.get("runner") or (scaling or {}).get("runner")
    return RunData(folder, config, records, scaling, name if url else None, url, runner, info,
                   confidence)


# --- derived values ----------------------------------------------------------------------------


def _gib(value: Any) -> float | None:
    return float(value) / GIB if value is not None else None


def error_pct(record: dict[str, Any]) -> float | None:
    """(predicted − measured) / measured tokens/s, in percent."""
    measured = measured_figure(record, "tokens_per_s")
    predicted = predicted_figure(record, "tokens_per_s")
    if not measured or predicted is None:
        return None
    error: float = (predicted - measured) / measured * 100
    return error


def trial_rows(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """trials.csv rows (TRIAL_COLUMNS), one per trial."""
    rows = []
    for r in records:
        fields = r.get("layout_fields") or {}
        predicted = r.get("predicted") or {}
        row: dict[str, Any] = {key: r.get(key) for key in TRIAL_COLUMNS}
        row.update({key: fields.get(key, r.get("params", {}).get(key))
                    for key in ("tp", "pp", "dp", "cp", "vpp", "zero", "offload", "mbs", "gas",
                                "recompute", "sp")})
        row["measured_peak_memory_gib"] = _gib(measured_figure(r, "peak_memory_bytes"))
        for key in ("tokens_per_s", "step_time_s", "tflops_per_gpu", "mfu"):
            row[f"predicted_{key}"] = predicted.get(key)
        row["predicted_peak_memory_gib"] = _gib(predicted.get("peak_memory_bytes"))
        row["error_pct"] = error_pct(r)
        row["reason"] = " ".join(str(r.get("reason") or "").split())
        rows.append(row)
    return rows


def _headline(record: dict[str, Any], directory: Path, rank: int) -> dict[str, Any]:
    predicted = record.get("predicted") or {}
    fields = record.get("layout_fields") or {}
    folder = "best" if rank == 0 else f"top/{rank + 1}-{record.get('layout_id')}"
    gpus = fields.get("tp", 1) * fields.get("pp", 1) * fields.get("cp", 1) * fields.get("dp", 1)
    return {
        "rank": rank + 1,
        "trial": record["number"],
        "layout": record.get("layout"),
        "layout_id": record.get("layout_id"),
        "layout_fields": fields,
        "tokens_per_s": measured_figure(record, "tokens_per_s"),
        "tokens_per_s_per_gpu": record["measured_tokens_per_s"] / gpus,
        "step_time_s": measured_figure(record, "step_time_s"),
        "tflops_per_gpu": measured_figure(record, "tflops_per_gpu"),
        "mfu": measured_figure(record, "mfu"),
        "peak_memory_gib": _gib(measured_figure(record, "peak_memory_bytes")),
        "predicted": {
            "tokens_per_s": predicted.get("tokens_per_s"),
            "step_time_s": predicted.get("step_time_s"),
            "tflops_per_gpu": predicted.get("tflops_per_gpu"),
            "mfu": predicted.get("mfu"),
            "peak_memory_gib": _gib(predicted.get("peak_memory_bytes")),
        },
        "error_pct": error_pct(record),
        "configs": folder if (directory / folder).is_dir() else None,
    }


def failures(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Trials that did not measure, grouped by status (and rule), with up to 3 example reasons."""
    groups: dict[tuple[str, str], list[str]] = {}
    for r in records:
        status = r.get("status", "")
        if status == "ok" or status == "duplicate":
            continue
        key = (status, r.get("rule") or "")
        groups.setdefault(key, []).append(" ".join(str(r.get("reason") or "").split()))
    out = []
    for (status, rule), reasons in sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0])):
        examples = [text for text, _ in Counter(reasons).most_common(3) if text]
        out.append({"status": status, "rule": rule, "count": len(reasons), "reasons": examples})
    return out


def prediction_error(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Median, maximum and mean (bias) of the throughput prediction error over ok trials."""
    errors = [e for e in (error_pct(r) for r in records if r.get("status") == "ok")
              if e is not None]
    if not errors:
        return None
    return {
        "trials": len(errors),
        "median_abs_error_pct": statistics.median(abs(e) for e in errors),
        "max_abs_error_pct": max(abs(e) for e in errors),
        "bias_pct": statistics.fmean(errors),
    }


def _scaling_summary(scaling: dict[str, Any] | None) -> dict[str, Any] | None:
    if scaling is None:
        return None
    keys = ("gpus", "nodes", "dp", "gas", "global_batch_size", "status", "tokens_per_s",
            "tokens_per_s_per_gpu", "efficiency", "predicted_efficiency", "flag", "cause", "lost",
            "grew", "grew_loss", "rule", "reason")
    points = [{k: p.get(k) for k in keys} for p in scaling["points"]]
    ran = [p for p in points if p["efficiency"] is not None]
    largest = ran[-1] if ran else None
    return {
        "mode": scaling["mode"],
        "layout": scaling["layout"]["text"],
        "base_gpus": scaling.get("base_gpus"),
        "largest_gpus": largest["gpus"] if largest else None,
        "efficiency_at_largest": largest["efficiency"] if largest else None,
        "flag_at_largest": largest["flag"] if largest else None,
        "points": points,
    }


def inputs_summary(run: RunData) -> dict[str, Any]:
    """Model, cluster, training setup and runner in a few flat keys."""
    cfg = run.cfg
    c, t = cfg.cluster, cfg.train
    return {
        "model": cfg.model.name,
        "params_b": cfg.model.num_params() / 1e9,
        "cluster": c.name,
        "nodes": c.nodes,
        "gpus_per_node": c.gpus_per_node,
        "gpus": c.world_size,
        "gpu": c.gpu.name,
        "gpu_memory_gb": c.gpu.memory_gb,
        "framework": t.framework,
        "precision": t.precision,
        "seq_length": t.seq_length,
        "global_batch_size": t.global_batch_size,
        "runner": run.runner,
        "figures": run.label,
        "study": run.study_name,
        "storage": run.storage,
    }


def summary(run: RunData, plots: dict[str, str] | None = None, top_k: int = 5) -> dict[str, Any]:
    """The summary.json document (keys documented in the README; floats to 6 digits)."""
    ranked = run.ranked
    by_status = Counter(r.get("status", "") for r in run.records)
    study = None
    if run.study_name:
        study = {
            "trials": len(run.records),
            "ran": sum(1 for r in run.records if r.get("ran")),
            "ok": len(ranked),
            "by_status": dict(sorted(by_status.items())),
        }
    headlines = [_headline(r, run.directory, i) for i, r in enumerate(ranked[: top_k + 1])]
    doc = {
        "schema": SUMMARY_SCHEMA,
        "kind": run.kind,
        "inputs": inputs_summary(run),
        "study": study,
        "best": headlines[0] if headlines else None,
        "runners_up": headlines[1:],
        "prediction": prediction_error(run.records),
        "failures": failures(run.records),
        "scaling": _scaling_summary(run.scaling),
        "files": {
            "report_md": "report.md",
            "report_html": "report.html",
            "summary_json": "summary.json",
            "trials_csv": "trials.csv" if run.records else None,
            "scaling_json": "scaling.json" if run.scaling else None,
            "plots": dict(plots or {}),
        },
    }
    summary: dict[str, Any] = rounded(doc)
    return summary


def rounded(data: Any, digits: int = 6) -> Any:
    """Floats to `digits` significant digits, recursively (stable JSON across machines)."""
    if isinstance(data, dict):
        return {k: rounded(v, digits) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [rounded(v, digits) for v in data]
    if isinstance(data, float):
        return float(f"{data:.{digits}g}")
    return data
