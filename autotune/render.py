"""Render one layout into ready-to-run artifacts, plus layout.json and manifest.json.

The framework's bundle (`autotune.frameworks`) says which artifacts a layout gets and fills
their templates through `autotune.templating`, the one module that reads `templates/`; this module
checks the layout against the rules first, writes the files and the manifest (inputs, layout,
predicted breakdowns, measured figures, library versions, how to launch each script), and renders
the Slurm job script of one trial.

Example:
    >>> from autotune import Layout, load_config
    >>> from autotune.render import deepspeed_config
    >>> cfg = load_config("llama2-7b", "dgx-h100:1", framework="deepspeed")
    >>> deepspeed_config(cfg, Layout(dp=8, zero=2, gas=128))["train_batch_size"]
    1024
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from autotune.costmodel.estimate import Estimate
from autotune.costmodel.estimate import estimate as estimate_layout
from autotune.exceptions import AutotuneError
from autotune.frameworks import framework_of
from autotune.frameworks.base import MEGATRON_LM
from autotune.frameworks.base import TRIAL_ITERS
from autotune.frameworks.base import RenderOptions
from autotune.frameworks.deepspeed import BUILTIN_LAUNCH
from autotune.frameworks.deepspeed import TrainProgram
from autotune.frameworks.deepspeed import config as deepspeed_config
from autotune.frameworks.deepspeed import hostfile
from autotune.frameworks.deepspeed import job_program
from autotune.frameworks.megatron.args import megatron_args
from autotune.frameworks.megatron.bundle import launch_script as megatron_launch_script
from autotune.launchers import LAUNCH
from autotune.launchers import manifests
from autotune.layout import Layout
from autotune.space.rules import structural_violations
from autotune.specs import AutotuneConfig
from autotune.specs import resolve_recipe
from autotune.specs.inputs import position_warnings
from autotune.templating import header
from autotune.templating import render_template
from autotune.templating import sbatch_directives
from autotune.templating import version
from autotune.workloads import PROBLEM_FILE
from autotune.workloads import problem_text

__all__ = [
    "TrainProgram",
    "deepspeed_config",
    "deepspeed_launch_script",
    "hostfile",
    "megatron_args",
    "megatron_launch_script",
    "render_artifacts",
    "sbatch_script",
    "write_artifacts",
]

LIBRARIES = ("torch", "deepspeed", "megatron-core", "optuna")
"""Distributions whose versions the manifest records."""


def deepspeed_launch_script(
    cfg: AutotuneConfig, layout: Layout, *, program: TrainProgram | None = None
) -> str:
    """launch_deepspeed.sh: the `deepspeed` launcher over `hostfile` with ds_config.json."""
    return _options_render(cfg, layout, program=program)["launch_deepspeed.sh"]


def sbatch_script(
    cfg: AutotuneConfig,
    layout: Layout,
    *,
    job_name: str,
    partition: str | None = None,
    account: str | None = None,
    time_limit: str | None = None,
    extra: Sequence[str] = (),
    program: TrainProgram | None = None,
) -> str:
    """sbatch.sh: one task per node; megatron runs pretrain_gpt.sh, deepspeed torchrun's program.

    Submit from the artifacts folder (`cd DIR && sbatch sbatch.sh`), or set ARTIFACTS_DIR.

    Args:
        cfg: Model, cluster and training setup (the framework picks the program).
        layout: The layout.
        job_name: Slurm job name.
        partition: `--partition`, if any.
        account: `--account`, if any.
        time_limit: `--time` (e.g. `02:00:00`), if any.
        extra: More sbatch options, one `--key=value` (or `--key`) each.
        program: DeepSpeed training program (default: the user's train.py).

    Raises:
        AutotuneError: A value holds characters that do not belong in an #SBATCH line.
    """
    return _options_render(
        cfg, layout, job_name=job_name, partition=partition, account=account,
        time_limit=time_limit, extra=extra, program=program,
    )["sbatch.sh"]


def _options_render(cfg: AutotuneConfig, layout: Layout, **options: Any) -> dict[str, str]:
    """The framework's artifacts (no rule check: the callers that need one make it); `options`
    are `_render_options`'."""
    return framework_of(cfg).render(cfg, layout, _render_options(cfg, layout, **options))


def _render_options(
    cfg: AutotuneConfig,
    layout: Layout,
    *,
    job_name: str | None = None,
    partition: str | None = None,
    account: str | None = None,
    time_limit: str | None = None,
    extra: Sequence[str] = (),
    program: TrainProgram | None = None,
    megatron_lm: str = MEGATRON_LM,
    train_iters: int = TRIAL_ITERS,
    trial: bool = False,
) -> RenderOptions:
    """The RenderOptions of a layout: checked #SBATCH lines (the arguments win over the config's
    `job` section), placeholders for the unset site options, the container and the program."""
    job = cfg.job
    site = {"partition": partition or job.partition, "account": account or job.account,
            "time": time_limit or job.time}
    options: dict[str, str | None] = {"job-name": job_name or f"autotune-{layout.id}", **site}
    named: dict[str, str | None] = {
        key: value for key, value in options.items() if value is not None
    }
    for item in extra:
        key, sep, value = item.partition("=")
        if not key.startswith("--"):
            raise AutotuneError(f"sbatch: extra option {item!r} must look like --key=value")
        named[key] = value if sep else None
    return RenderOptions(
        directives=tuple(sbatch_directives(named)), gpus=not cfg.cluster.cpu_processes,
        program=program or job_program(job.train_script), megatron_lm=megatron_lm,
        train_iters=train_iters, trial=trial,
        placeholders=tuple(key for key, value in site.items() if value is None),
        container_image=job.container_image or "", container_mounts=",".join(job.container_mounts),
    )


def render_artifacts(
    cfg: AutotuneConfig,
    layout: Layout,
    *,
    job_name: str | None = None,
    program: TrainProgram | None = None,
    megatron_lm: str = MEGATRON_LM,
    train_iters: int = TRIAL_ITERS,
    trial: bool = False,
) -> dict[str, str]:
    """File name → text of the framework's artifacts, without layout.json and manifest.json.

    megatron: pretrain_gpt.sh, sbatch.sh. deepspeed: ds_config.json, launch_deepspeed.sh,
    hostfile, sbatch.sh.

    Raises:
        AutotuneError: The layout breaks a rule of the framework (each is named).
    """
    broken = structural_violations(cfg, layout)
    if broken:
        raise AutotuneError(
            f"{cfg.train.framework}: layout {layout.text} breaks "
            + "; ".join(f"{name}: {reason}" for name, reason in broken)
        )
    return _options_render(cfg, layout, job_name=job_name, program=program,
                           megatron_lm=megatron_lm, train_iters=train_iters, trial=trial)


def _plain(value: Any) -> Any:
    """JSON-ready form of estimates and measurements (dataclasses, numpy values, to_dict)."""
    if hasattr(value, "to_dict"):
        return _plain(value.to_dict())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _plain(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic | np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    return value


def library_versions() -> dict[str, str | None]:
    """Installed versions of the libraries the artifacts depend on (None when absent)."""
    versions: dict[str, str | None] = {}
    for name in LIBRARIES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def write_artifacts(
    cfg: AutotuneConfig,
    layout: Layout,
    out_dir: str | os.PathLike[str],
    *,
    estimate: Estimate | Mapping[str, Any] | None = None,
    measured: Any = None,
    extra_manifest: Mapping[str, Any] | None = None,
    job_name: str | None = None,
    program: TrainProgram | None = None,
    megatron_lm: str = MEGATRON_LM,
    train_iters: int = TRIAL_ITERS,
    trial: bool = False,
    from_layout: Layout | None = None,
) -> dict[str, Path]:
    """Write the artifacts of one layout into `out_dir` (created if needed); scripts are +x.

    Besides `render_artifacts`' files: layout.json (the layout's fields, text and id),
    manifest.json (inputs, layout, recipe, predicted memory and time breakdowns, measured
    figures, autotune and library versions, and how to launch each script) and README.md (what
    the folder is, how to launch it, what the training code must do, the recipe, and how to carry
    the checkpoints of `from_layout` over).

    Args:
        cfg: Model, cluster and training setup.
        layout: The layout to render.
        out_dir: Destination folder.
        estimate: The prediction to record; None computes `autotune.costmodel.estimate.estimate`.
        measured: Measured figures (a mapping, dataclass or object with `to_dict`), if any.
        extra_manifest: More top-level manifest entries (they override the defaults).
        job_name: Slurm job name (default `autotune-<layout id>`).
        program: DeepSpeed training program for the launch scripts.
        megatron_lm: Megatron-LM checkout pretrain_gpt.sh uses when MEGATRON_LM is unset.
        train_iters: Default optimizer steps of a trial's pretrain_gpt.sh.
        trial: Render for autotune's short trials (synthetic data unless DATA_PATH is set)
            rather than for training (which needs the data variables).
        from_layout: The layout the user trains with now, whose checkpoints README.md says how
            to carry over (warning when the formats differ).

    Returns:
        File name → path of every file written.
    """
    layout.validate(cfg.world_size, cfg.train.global_batch_size)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = render_artifacts(cfg, layout, job_name=job_name, program=program,
                             megatron_lm=megatron_lm, train_iters=train_iters, trial=trial)
    if not cfg.cluster.cpu_processes:  # the manifests ask for GPUs
        files.update(manifests(cfg, layout, _render_options(
            cfg, layout, program=program, megatron_lm=megatron_lm, trial=trial)))
    resolved = program or job_program(cfg.job.train_script)
    builtin = framework_of(cfg).runs_train_script and resolved is not None and resolved.builtin
    if builtin:
        files[PROBLEM_FILE] = problem_text(cfg)  # what the built-in program reads
    predicted = estimate if estimate is not None else estimate_layout(cfg, layout)
    layout_doc = {**layout.to_dict(), "text": layout.text, "id": layout.id}
    files["layout.json"] = json.dumps(layout_doc, indent=2) + "\n"
    manifest: dict[str, Any] = {
        "tool": {"name": "autotune", "version": version()},
        "libraries": library_versions(),
        "framework": cfg.train.framework,
        "inputs": {
            "model": cfg.model.model_dump(mode="json"),
            "cluster": cfg.cluster.model_dump(mode="json"),
            "train": cfg.train.model_dump(mode="json"),
            "recipe": cfg.recipe.model_dump(mode="json"),
            "job": cfg.job.model_dump(mode="json"),
        },
        "recipe": resolve_recipe(cfg).to_dict(),
        "layout": layout_doc,
        "predicted": _plain(predicted),
        "measured": _plain(measured),
        "artifacts": sorted([*files, "manifest.json", "README.md"]),
        "launch": {**framework_of(cfg).launch(), **(BUILTIN_LAUNCH if builtin else {}),
                   **{name: how for name, how in LAUNCH.items() if name in files}},
        "notes": framework_of(cfg).notes(cfg, layout),
    }
    bundle = framework_of(cfg)
    carry = bundle.carry_over(cfg, from_layout, layout) if from_layout is not None else []
    if from_layout is not None:
        manifest["checkpoints"] = {"format": bundle.checkpoint_format(layout),
                                   "from_layout": from_layout.text, "carry_over": carry}
    manifest.update(_plain(dict(extra_manifest or {})))
    files["manifest.json"] = json.dumps(manifest, indent=2) + "\n"
    recipe = resolve_recipe(cfg)
    files["README.md"] = render_template(
        "common/README.md.j2", **header(cfg, layout), framework=cfg.train.framework,
        layout_id=layout.id, trial=trial, recipe=recipe, notices=position_warnings(cfg),
        builtin_program=builtin,
        launch=manifest["launch"], obligations=bundle.notes(cfg, layout),
        rows=recipe.rows(),
        checkpoint_format=bundle.checkpoint_format(layout), carry_over=carry,
        from_text=from_layout.text if from_layout is not None else "")
    paths: dict[str, Path] = {}
    for name, text in files.items():
        path = out / name
        path.write_text(text)
        if name.endswith(".sh"):
            path.chmod(0o755)
        paths[name] = path
    return paths
