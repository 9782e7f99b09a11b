"""Render one layout into ready-to-run artifacts: ds_config.json, launch scripts, sbatch, manifest.

Only this module touches templates (`templates/deepspeed`, `templates/megatron`,
`templates/slurm`). Every string that reaches a shell goes through the `shquote` filter
(`shlex.quote`), numbers through `int`, and comment text through `comment` (one line), so a model
path with spaces or `$(...)` stays inert. Keys of ds_config.json are the ones DeepSpeed 0.19 reads
(`deepspeed/runtime/config.py`, `runtime/zero/config.py`, `runtime/precision_config.py`,
`runtime/tensor_parallel/config.py`; unknown top-level keys would be ignored silently).

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
import re
import shlex
from collections.abc import Mapping
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from typing import Any

import jinja2
import numpy as np

from autotune.estimate import Estimate
from autotune.estimate import estimate as estimate_layout
from autotune.exceptions import AutotuneError
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.megatron_config import ADAM_BETAS
from autotune.megatron_config import ADAM_EPS
from autotune.megatron_config import CLIP_GRAD
from autotune.megatron_config import LEARNING_RATE
from autotune.megatron_config import WEIGHT_DECAY
from autotune.megatron_config import fsdp
from autotune.megatron_config import megatron_args
from autotune.megatron_config import needs_single_connection
from autotune.megatron_config import pipeline_split
from autotune.memory import ZERO3_PREFETCH_FRACTION
from autotune.memory import deepspeed_bucket_elements
from autotune.memory import params_on_rank
from autotune.resources import resource_dir
from autotune.specs import AutotuneConfig
from autotune.stages import split_layers

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
SCRIPTS = ("pretrain_gpt.sh", "launch_deepspeed.sh", "sbatch.sh")
"""Artifacts written executable."""
MASTER_PORT = 6000
"""Default rendezvous port of the rendered scripts (the environment's MASTER_PORT wins)."""
_SBATCH_VALUE = re.compile(r"[A-Za-z0-9._:+,=@/%-]+")


@dataclasses.dataclass(frozen=True, slots=True)
class TrainProgram:
    """The DeepSpeed training program the launch scripts run (the user's script by default).

    The scripts run `script` (or `python -m script` when `module`), then `args`, then
    `config_flag DIR/ds_config.json` and, when `layout_flag` is set, `layout_flag DIR/layout.json`,
    then whatever the script itself was given. The environment variable TRAIN_SCRIPT overrides
    `script` at run time.
    """

    script: str = "train.py"
    """Path of the training script (or a module name with `module`)."""
    module: bool = False
    """Run `script` as a Python module (`--module` for torchrun and the deepspeed launcher)."""
    args: tuple[str, ...] = ()
    """Arguments before the config flag."""
    config_flag: str = "--deepspeed_config"
    """Flag that names ds_config.json (`deepspeed.add_config_arguments` reads this one)."""
    layout_flag: str | None = None
    """Flag that names layout.json, for programs that read it (the built-in trial workload)."""


def _comment(value: object) -> str:
    """Text safe inside a `#` comment: control characters (newlines) become spaces."""
    return re.sub(r"[\x00-\x1f\x7f]", " ", str(value))


@cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(resource_dir("templates")),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,
    )
    env.filters["shquote"] = lambda value: shlex.quote(str(value))
    env.filters["comment"] = _comment
    return env


def _render(template: str, **context: Any) -> str:
    return _environment().get_template(template).render(**context)


def _version() -> str:
    from autotune import __version__

    return __version__


def _header(cfg: AutotuneConfig, layout: Layout) -> dict[str, Any]:
    """Values every template shows or checks."""
    return {
        "version": _version(),
        "model_name": cfg.model.name,
        "cluster_name": cfg.cluster.name,
        "layout_text": layout.text,
        "world_size": cfg.world_size,
        "nodes": cfg.cluster.nodes,
        "gpus_per_node": cfg.cluster.gpus_per_node,
        "master_port": MASTER_PORT,
    }


# --- DeepSpeed ---------------------------------------------------------------------------------


def _params_per_rank(cfg: AutotuneConfig, layout: Layout) -> int:
    """Parameters on the most loaded rank before ZeRO sharding (first or last stage)."""
    table = LayoutTable.from_layouts([layout])
    split = split_layers(cfg, table.pp, table.vpp)
    single = np.array([layout.pp == 1])
    first = params_on_rank(cfg, table, split.first, np.array([True]), single)
    last = params_on_rank(cfg, table, split.last, single, np.array([True]))
    return int(max(first[0], last[0]))


def _deepspeed_context(cfg: AutotuneConfig, layout: Layout) -> dict[str, Any]:
    if layout.vpp > 1 or layout.sp:
        raise AutotuneError(
            f"deepspeed: layout {layout.text} uses vpp>1 or Megatron sequence parallelism, which "
            "DeepSpeed has no config for; use vpp=1 and sp=off (cp is Ulysses)"
        )
    if layout.offload == "optimizer+params" and layout.zero != 3:
        raise AutotuneError(f"deepspeed: offload_param needs ZeRO-3, got zero={layout.zero}")
    if layout.offload != "none" and layout.zero == 0:
        raise AutotuneError(f"deepspeed: offload={layout.offload} needs zero >= 1")
    bucket = int(deepspeed_bucket_elements(_params_per_rank(cfg, layout)))
    return {
        "train_batch_size": layout.global_batch_size,
        "micro_batch": layout.mbs,
        "gas": layout.gas,
        "zero": layout.zero,
        "overlap_comm": cfg.train.overlap_grad_reduce,
        "bucket": bucket,
        "prefetch_bucket": int(bucket * ZERO3_PREFETCH_FRACTION),
        "persistence_threshold": 10 * cfg.model.hidden_size,
        "max_live_parameters": 1_000_000_000,
        "offload_optimizer": layout.offload != "none",
        "offload_param": layout.offload == "optimizer+params",
        "precision": cfg.train.precision,
        "pp": layout.pp,
        "tp": layout.tp,
        "cp": layout.cp,
        "full_recompute": layout.recompute == "full",
        "lr": LEARNING_RATE,
        "betas": list(ADAM_BETAS),
        "eps": ADAM_EPS,
        "weight_decay": WEIGHT_DECAY,
        "clip_grad": CLIP_GRAD,
        "steps_per_print": 1,
        # AutoTP finds Llama-style module names with the llama preset
        "autotp_preset": "llama" if cfg.model.gated else None,
        # on CPU processes use torch's AdamW: DeepSpeed's fused CPU Adam is a 90 s JIT build
        "torch_adam": cfg.cluster.cpu_processes,
    }


def deepspeed_config(cfg: AutotuneConfig, layout: Layout) -> dict[str, Any]:
    """The ds_config.json of a layout, as a dict.

    Batch: train_batch_size = mbs·dp·gas, so DeepSpeed's data-parallel size must be dp: pass an
    mpu whose `get_data_parallel_world_size()` is dp when tp (AutoTP) shrinks it (PipelineModule's
    grid does this for pp; for cp alone DeepSpeed divides the world by `sequence_parallel_size`).
    `pipeline.stages`/`partition` are what the training code gives `PipelineModule(num_stages=,
    partition_method=)`; the engine itself reads `activation_checkpoint_interval`.

    Raises:
        AutotuneError: The layout has no DeepSpeed form (vpp>1, Megatron sp, bad offload).
    """
    text = _render("deepspeed/ds_config.json.j2", **_deepspeed_context(cfg, layout))
    return json.loads(text)


def hostfile(cfg: AutotuneConfig) -> str:
    """A DeepSpeed hostfile template: `node-N slots=G` per node (`localhost` for one node).

    Replace the names with the cluster's hosts; the deepspeed launcher reaches them over ssh.
    """
    return _render("deepspeed/hostfile.j2", nodes=cfg.cluster.nodes,
                   gpus_per_node=cfg.cluster.gpus_per_node, version=_version())


def _program_context(program: TrainProgram) -> dict[str, Any]:
    return {
        "train_script": program.script,
        "train_module": program.module,
        "train_args": list(program.args),
        "config_flag": program.config_flag,
        "layout_flag": program.layout_flag,
    }


def deepspeed_launch_script(
    cfg: AutotuneConfig, layout: Layout, *, program: TrainProgram | None = None
) -> str:
    """launch_deepspeed.sh: the `deepspeed` launcher over `hostfile` with ds_config.json.

    Run from anywhere; the artifacts folder must be on a filesystem every node sees.
    """
    return _render("deepspeed/launch_deepspeed.sh.j2", **_header(cfg, layout),
                   **_program_context(program or TrainProgram()))


# --- Megatron-LM -------------------------------------------------------------------------------


def _flag_lines(args: Sequence[str]) -> list[list[str]]:
    """Group argv items as one flag and its values per line."""
    lines: list[list[str]] = []
    for arg in args:
        if arg.startswith("--") or not lines:
            lines.append([arg])
        else:
            lines[-1].append(arg)
    return lines


def megatron_launch_script(
    cfg: AutotuneConfig,
    layout: Layout,
    *,
    megatron_lm: str = "/opt/Megatron-LM",
    train_iters: int = 20,
    mock_data: bool = True,
    log_interval: int = 1,
) -> str:
    """pretrain_gpt.sh: torchrun of Megatron-LM's `pretrain_gpt.py` with every layout flag.

    Args:
        cfg: Model, cluster and training setup.
        layout: The layout (Megatron rules).
        megatron_lm: Megatron-LM checkout used when the environment has no MEGATRON_LM.
        train_iters: Optimizer steps.
        mock_data: Synthetic data and a NullTokenizer; False leaves data flags to the caller
            (extra arguments of the script are appended to the rendered flags).
        log_interval: Steps between log lines.
    """
    args = megatron_args(cfg, layout, train_iters=train_iters, mock_data=mock_data,
                         log_interval=log_interval)
    _, edge = pipeline_split(cfg, layout)
    return _render(
        "megatron/pretrain_gpt.sh.j2", **_header(cfg, layout), megatron_lm=megatron_lm,
        flag_lines=_flag_lines(args), single_connection=needs_single_connection(layout),
        fsdp=fsdp(layout), uneven_edge=edge, mock_data=mock_data,
    )


# --- Slurm -------------------------------------------------------------------------------------


def _sbatch_value(name: str, value: str) -> str:
    if not _SBATCH_VALUE.fullmatch(value):
        raise AutotuneError(
            f"sbatch: {name}={value!r} may only contain letters, digits and ._:+,=@/%- "
            "(it goes into an #SBATCH line)"
        )
    return value


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
        extra: More sbatch options, one `--key=value` each.
        program: DeepSpeed training program (default: the user's train.py).

    Raises:
        AutotuneError: A value holds characters that do not belong in an #SBATCH line.
    """
    options = {"job-name": job_name, "partition": partition, "account": account,
               "time": time_limit}
    directives = [f"--{key}={_sbatch_value(key, value)}" for key, value in options.items()
                  if value is not None]
    for item in extra:
        key, sep, value = item.partition("=")
        if not key.startswith("--") or not _SBATCH_VALUE.fullmatch(key[2:] + (value or "x")):
            raise AutotuneError(
                f"sbatch: extra option {item!r} must look like --key=value with letters, digits "
                "and ._:+,=@/%-"
            )
        directives.append(item)
    return _render(
        "slurm/sbatch.sh.j2", **_header(cfg, layout), directives=directives,
        framework=cfg.train.framework, gpus=not cfg.cluster.cpu_processes,
        **_program_context(program or TrainProgram()),
    )


# --- all artifacts -----------------------------------------------------------------------------


def trial_job_script(
    cfg: AutotuneConfig,
    layout: Layout,
    *,
    number: int,
    directory: Path,
    job_name: str,
    directives: Sequence[str],
    python: str,
    module: str,
    args: Sequence[str],
    port_base: int,
    port_span: int,
) -> str:
    """The sbatch script of one Slurm trial (templates/slurm/trial.sbatch.j2): srun runs torchrun
    of the trial program on every node, rendezvous from the Slurm environment."""
    from autotune import __version__

    world = layout.world_size
    per_node = min(cfg.cluster.gpus_per_node, world)
    return _render(
        "slurm/trial.sbatch.j2", job_name=job_name, nodes=-(-world // per_node),
        nproc_per_node=per_node, cpu_only=cfg.cluster.cpu_processes, directives=list(directives),
        number=number, version=__version__, layout_text=layout.text, world_size=world,
        trial_dir=str(directory.resolve()), port_base=port_base, port_span=port_span,
        python=python, module=module, arg_lines=_flag_lines(args),
    )


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


def _notes(cfg: AutotuneConfig, layout: Layout) -> list[str]:
    notes = []
    if cfg.train.framework == "deepspeed":
        if cfg.train.precision == "fp8":
            notes.append("fp8: DeepSpeed has no fp8 config; ds_config.json trains in bf16, use "
                         "Transformer Engine layers in the model for fp8 GEMMs")
        if layout.tp > 1:
            notes.append("tp: AutoTP needs Hugging Face / Llama-style module names or "
                         "tensor_parallel.preset_model; give deepspeed.initialize an mpu whose "
                         "data-parallel size is dp so train_batch_size = mbs·dp·gas holds")
        if layout.cp > 1:
            notes.append("cp: Ulysses needs deepspeed.sequence.layer.DistributedAttention in the "
                         "model and parallel_state_sp as mpu")
        if layout.pp > 1:
            notes.append(f"pp: build deepspeed.pipe.PipelineModule(num_stages={layout.pp}, "
                         "partition_method='uniform') and train with engine.train_batch()")
        if layout.recompute == "full" and layout.pp == 1:
            notes.append("recompute=full: checkpoint every decoder layer in the model code "
                         "(deepspeed.checkpointing.checkpoint or torch.utils.checkpoint)")
    else:
        if fsdp(layout) and (layout.tp > 1 or layout.cp > 1):
            notes.append("Megatron-FSDP with tp/cp: CUDA_DEVICE_MAX_CONNECTIONS stays unset "
                         "(FSDP forbids 1); Megatron warns that tp/cp overlap less")
        if pipeline_split(cfg, layout)[1] is not None:
            notes.append("pipeline: layers do not divide over pp·vpp, so the first and last "
                         "stages hold fewer layers (--decoder-first/last-pipeline-num-layers)")
    return notes


def _launch(cfg: AutotuneConfig) -> dict[str, str]:
    if cfg.train.framework == "megatron":
        return {
            "pretrain_gpt.sh": "on every node: MEGATRON_LM=<Megatron-LM checkout> NNODES=<nodes> "
                               "NODE_RANK=<0..nodes-1> MASTER_ADDR=<node 0> bash pretrain_gpt.sh "
                               "[extra pretrain_gpt.py flags]",
            "sbatch.sh": "cd <this folder> && MEGATRON_LM=<checkout> sbatch sbatch.sh",
        }
    return {
        "ds_config.json": "deepspeed.initialize(model=..., config='ds_config.json') in the "
                          "training script (or --deepspeed_config through "
                          "deepspeed.add_config_arguments)",
        "launch_deepspeed.sh": "edit hostfile (ssh-reachable hosts), then "
                               "TRAIN_SCRIPT=<your script> bash launch_deepspeed.sh [script args]",
        "sbatch.sh": "cd <this folder> && TRAIN_SCRIPT=<your script> sbatch sbatch.sh",
    }


def render_artifacts(
    cfg: AutotuneConfig,
    layout: Layout,
    *,
    job_name: str | None = None,
    program: TrainProgram | None = None,
    megatron_lm: str = "/opt/Megatron-LM",
    train_iters: int = 20,
) -> dict[str, str]:
    """File name → text of the framework's artifacts, without layout.json and manifest.json.

    megatron: pretrain_gpt.sh, sbatch.sh. deepspeed: ds_config.json, launch_deepspeed.sh,
    hostfile, sbatch.sh.
    """
    name = job_name or f"autotune-{layout.id}"
    files: dict[str, str] = {}
    if cfg.train.framework == "megatron":
        files["pretrain_gpt.sh"] = megatron_launch_script(
            cfg, layout, megatron_lm=megatron_lm, train_iters=train_iters)
    else:
        files["ds_config.json"] = json.dumps(deepspeed_config(cfg, layout), indent=2) + "\n"
        files["launch_deepspeed.sh"] = deepspeed_launch_script(cfg, layout, program=program)
        files["hostfile"] = hostfile(cfg)
    files["sbatch.sh"] = sbatch_script(cfg, layout, job_name=name, program=program)
    return files


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
    megatron_lm: str = "/opt/Megatron-LM",
    train_iters: int = 20,
) -> dict[str, Path]:
    """Write the artifacts of one layout into `out_dir` (created if needed); scripts are +x.

    Besides `render_artifacts`' files: layout.json (the layout's fields, text and id) and
    manifest.json (inputs, layout, predicted memory and time breakdowns, measured figures,
    autotune and library versions, and how to launch each script).

    Args:
        cfg: Model, cluster and training setup.
        layout: The layout to render.
        out_dir: Destination folder.
        estimate: The prediction to record; None computes `autotune.estimate.estimate`.
        measured: Measured figures (a mapping, dataclass or object with `to_dict`), if any.
        extra_manifest: More top-level manifest entries (they override the defaults).
        job_name: Slurm job name (default `autotune-<layout id>`).
        program: DeepSpeed training program for the launch scripts.
        megatron_lm: Megatron-LM checkout pretrain_gpt.sh uses when MEGATRON_LM is unset.
        train_iters: Optimizer steps of pretrain_gpt.sh.

    Returns:
        File name → path of every file written.
    """
    layout.validate(cfg.world_size, cfg.train.global_batch_size)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = render_artifacts(cfg, layout, job_name=job_name, program=program,
                             megatron_lm=megatron_lm, train_iters=train_iters)
    predicted = estimate if estimate is not None else estimate_layout(cfg, layout)
    layout_doc = {**layout.to_dict(), "text": layout.text, "id": layout.id}
    files["layout.json"] = json.dumps(layout_doc, indent=2) + "\n"
    manifest: dict[str, Any] = {
        "tool": {"name": "autotune", "version": _version()},
        "libraries": library_versions(),
        "framework": cfg.train.framework,
        "inputs": {
            "model": cfg.model.model_dump(mode="json"),
            "cluster": cfg.cluster.model_dump(mode="json"),
            "train": cfg.train.model_dump(mode="json"),
        },
        "layout": layout_doc,
        "predicted": _plain(predicted),
        "measured": _plain(measured),
        "artifacts": sorted([*files, "manifest.json"]),
        "launch": _launch(cfg),
        "notes": _notes(cfg, layout),
    }
    manifest.update(_plain(dict(extra_manifest or {})))
    files["manifest.json"] = json.dumps(manifest, indent=2) + "\n"
    paths: dict[str, Path] = {}
    for name, text in files.items():
        path = out / name
        path.write_text(text)
        if name in SCRIPTS:
            path.chmod(0o755)
        paths[name] = path
    return paths
