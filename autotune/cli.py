"""The `autotune` command line: parse, call the API, print with rich. Nothing else lives here."""

from __future__ import annotations

import json
import logging
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated
from typing import Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.logging import RichHandler
from rich.progress import BarColumn
from rich.progress import MofNCompleteColumn
from rich.progress import Progress
from rich.progress import SpinnerColumn
from rich.progress import TextColumn
from rich.progress import TimeElapsedColumn
from rich.table import Table

from autotune.constants import constants_for
from autotune.estimate import Estimate
from autotune.estimate import estimate as estimate_layout
from autotune.estimate import row_estimate
from autotune.exceptions import AutotuneError
from autotune.inputs import load_config
from autotune.inputs import validation_message
from autotune.layout import Layout
from autotune.memory import GIB
from autotune.refit import refit_study
from autotune.report import compare as compare_runs
from autotune.report import write_report
from autotune.report import write_run_json
from autotune.rules import violations
from autotune.runners.factory import RunnerOptions
from autotune.runners.factory import make_runner
from autotune.scaling import default_sizes
from autotune.scaling import sweep
from autotune.search import TuneOptions
from autotune.search import default_study_name
from autotune.search import tune as run_tune
from autotune.space import enumerate_layouts
from autotune.space import load_space
from autotune.space import no_feasible_message
from autotune.specs import AutotuneConfig
from autotune.storage import default_storage_url

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Find the fastest parallel layout to train a transformer on a cluster.",
)
console = Console() if sys.stdout.isatty() else Console(width=160)
err_console = Console(stderr=True)
_state = {"debug": False}

ModelOpt = Annotated[
    str, typer.Option("--model", "-m", help="Preset name, YAML file or HF config.json.")
]
ClusterOpt = Annotated[
    str, typer.Option("--cluster", "-c", help="NAME:NODES preset, YAML file or 'local'.")
]
FrameworkOpt = Annotated[str, typer.Option(help="megatron or deepspeed.")]
SeqOpt = Annotated[
    int | None, typer.Option("--seq", help="Sequence length (default: the preset's).")
]
GbsOpt = Annotated[int | None, typer.Option("--gbs", help="Global batch in sequences.")]
PrecisionOpt = Annotated[str | None, typer.Option(help="bf16, fp16, fp8 or fp32.")]
ProcsOpt = Annotated[
    int | None,
    typer.Option(
        "--processes", help="Worker processes for --cluster local (default: GPUs, or 2 on CPU)."
    ),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
StepsOpt = Annotated[
    int, typer.Option(help="local/slurm runners: steps per trial (warm-up included).")
]


def _config(
    model: str,
    cluster: str,
    framework: str,
    seq: int | None,
    gbs: int | None,
    precision: str | None,
    processes: int | None = None,
) -> AutotuneConfig:
    if framework not in ("megatron", "deepspeed"):
        raise AutotuneError(f"--framework: {framework!r} must be megatron or deepspeed")
    return load_config(
        model,
        cluster,
        seq_length=seq,
        global_batch_size=gbs,
        precision=precision,
        framework=framework,
        processes=processes,
    )


def _layout(cfg: AutotuneConfig, text: str) -> tuple[Layout, list[tuple[str, str]]]:
    """The --layout text as a Layout, with the rules it breaks."""
    parsed = Layout.parse(text, cfg.world_size, cfg.train.global_batch_size, cfg.train.framework)
    return parsed, violations(cfg, parsed, constants_for(cfg.cluster.gpu))


def _gib(value: float) -> str:
    return f"{value / GIB:.1f}"


def _layout_table(title: str, rows: list[Estimate]) -> Table:
    table = Table(title=title)
    for column, justify in (
        ("#", "right"),
        ("layout", "left"),
        ("dp", "right"),
        ("gas", "right"),
        ("tokens/s", "right"),
        ("TFLOP/s/GPU", "right"),
        ("MFU", "right"),
        ("mem GiB", "right"),
    ):
        table.add_column(column, justify=justify)
    for rank, e in enumerate(rows, 1):
        table.add_row(
            str(rank),
            e.layout.text,
            str(e.layout.dp),
            str(e.layout.gas),
            f"{e.tokens_per_s:,.0f}",
            f"{e.tflops_per_gpu:.0f}",
            f"{e.mfu:.1%}",
            _gib(e.peak_memory_bytes),
        )
    return table


def _rules_table(removed: dict[str, int], total: int) -> Table:
    table = Table(title=f"Rules applied to {total:,} candidates (in order)")
    table.add_column("rule")
    table.add_column("removed", justify="right")
    for name, count in removed.items():
        table.add_row(name, f"{count:,}")
    return table


@app.command()
def space(
    model: ModelOpt,
    cluster: ClusterOpt,
    framework: FrameworkOpt = "megatron",
    space_ref: Annotated[
        str | None, typer.Option("--space", help="Search space YAML or bundled name.")
    ] = None,
    seq: SeqOpt = None,
    gbs: GbsOpt = None,
    precision: PrecisionOpt = None,
    top: Annotated[int, typer.Option(help="How many layouts to list.")] = 10,
    processes: ProcsOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Enumerate the legal layouts, rank them by predicted throughput, and count rule removals."""
    cfg = _config(model, cluster, framework, seq, gbs, precision, processes)
    search_space = load_space(space_ref, cfg.train.framework)
    result = enumerate_layouts(cfg, search_space)
    if not len(result):
        raise AutotuneError(no_feasible_message(result))
    best = [
        row_estimate(result.feasible.row(i), result.values, i)
        for i in range(min(top, len(result)))
    ]
    if as_json:
        print(
            json.dumps(
                {
                    "inputs": cfg.model_dump(),
                    "space": search_space.model_dump(),
                    "candidates": result.total,
                    "feasible": len(result),
                    "removed": result.removed,
                    "top": [e.to_dict() for e in best],
                },
                indent=2,
            )
        )
        return
    console.print(
        f"[bold]{cfg.model.name}[/] on [bold]{cfg.cluster.name}[/] "
        f"({cfg.world_size} × {cfg.cluster.gpu.name}), {cfg.train.framework}, "
        f"seq {cfg.train.seq_length}, global batch {cfg.train.global_batch_size}, "
        f"{cfg.train.precision}"
    )
    console.print(_rules_table(result.removed, result.total))
    console.print(_layout_table(f"Top {len(best)} of {len(result):,} feasible layouts", best))


@app.command()
def estimate(
    model: ModelOpt,
    cluster: ClusterOpt,
    layout: Annotated[
        str, typer.Option("--layout", "-l", help="e.g. tp=8,pp=4,zero=1,mbs=1,recompute=selective")
    ],
    framework: FrameworkOpt = "megatron",
    seq: SeqOpt = None,
    gbs: GbsOpt = None,
    precision: PrecisionOpt = None,
    processes: ProcsOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Predict memory and step time of one layout, with both breakdowns."""
    cfg = _config(model, cluster, framework, seq, gbs, precision, processes)
    parsed, broken = _layout(cfg, layout)
    result = estimate_layout(cfg, parsed)
    if as_json:
        print(
            json.dumps(
                {
                    **result.to_dict(),
                    "feasible": not broken,
                    "violations": [{"rule": n, "reason": r} for n, r in broken],
                },
                indent=2,
            )
        )
        return
    console.print(
        f"[bold]{parsed.text}[/] (dp={parsed.dp}, gas={parsed.gas}) — {cfg.model.name} on "
        f"{cfg.cluster.name}"
    )
    mem = Table(title="Memory per GPU (most loaded rank)")
    mem.add_column("part")
    mem.add_column("GiB", justify="right")
    for name, value in result.memory_parts.items():
        mem.add_row(name, _gib(value))
    mem.add_row("[bold]total[/]", f"[bold]{_gib(result.peak_memory_bytes)}[/]")
    if result.host_memory_bytes:
        mem.add_row("host (per node, offload)", _gib(result.host_memory_bytes))
    time = Table(title="Step time")
    time.add_column("part")
    time.add_column("seconds", justify="right")
    time.add_column("share", justify="right")
    for name, value in result.time_parts.items():
        time.add_row(name, f"{value:.4f}", f"{value / result.step_time_s:.1%}")
    time.add_row("[bold]total[/]", f"[bold]{result.step_time_s:.4f}[/]", "100%")
    console.print(mem)
    console.print(time)
    console.print(
        f"tokens/s {result.tokens_per_s:,.0f} · TFLOP/s/GPU {result.tflops_per_gpu:.1f} "
        f"(hardware {result.hw_tflops_per_gpu:.1f}) · MFU {result.mfu:.1%} "
        f"(HFU {result.hfu:.1%})"
    )
    for name, reason in broken:
        console.print(f"[red]infeasible[/] {name}: {reason}")


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def _recorded_options(runner: str, options: RunnerOptions) -> dict[str, Any]:
    """The runner settings worth keeping in run.json."""
    if runner == "simulate":
        return {"noise": options.noise, "seed": options.seed}
    if runner == "local":
        return {"steps": options.steps, "launcher": options.launcher,
                "megatron_lm": options.megatron_lm, "timeout_s": options.timeout_s}
    if runner == "slurm":
        return options.explicit_slurm()
    return {"command": options.command} if runner == "command" else {}


def _records_table(title: str, records: list[dict[str, Any]]) -> Table:
    table = Table(title=title)
    for column in (
        "#",
        "trial",
        "layout",
        "measured tok/s",
        "predicted tok/s",
        "error",
        "MFU",
        "mem GiB",
    ):
        table.add_column(
            column, justify="left" if column == "layout" else "right", overflow="fold"
        )
    for rank, r in enumerate(records, 1):
        predicted = r.get("predicted", {})
        measured = r.get("measured_tokens_per_s") or 0.0
        guess = predicted.get("tokens_per_s") or 0.0
        error = f"{guess / measured - 1:+.1%}" if measured and guess else "-"
        mfu = r.get("measured_mfu")
        table.add_row(
            str(rank),
            str(r["number"]),
            r["layout_id"],
            f"{measured:,.0f}",
            f"{guess:,.0f}",
            error,
            f"{mfu:.1%}" if mfu else "-",
            _gib(predicted.get("peak_memory_bytes") or 0.0),
        )
    return table


@app.command()
def tune(
    model: ModelOpt,
    cluster: ClusterOpt,
    framework: Annotated[
        str | None,
        typer.Option(help="megatron or deepspeed (default: megatron; deepspeed for local CPU "
                     "trials without --megatron-lm)."),
    ] = None,
    space_ref: Annotated[
        str | None, typer.Option("--space", help="Search space YAML or bundled name.")
    ] = None,
    runner: Annotated[str, typer.Option(help="simulate, command, local or slurm.")] = "simulate",
    trials: Annotated[
        int, typer.Option(min=1, help="Trials to run (rule rejections are free).")
    ] = 20,
    out: Annotated[Path, typer.Option(help="Output folder (study, trials, configs).")] = Path(
        "autotune-out"
    ),
    storage: Annotated[
        str | None, typer.Option(help="Optuna storage URL (default sqlite:///OUT/study.db).")
    ] = None,
    study: Annotated[
        str | None, typer.Option(help="Study name (default model-cluster-framework).")
    ] = None,
    resume: Annotated[bool, typer.Option(help="Continue an existing study.")] = False,
    seed: Annotated[int, typer.Option(help="Sampler (and --noise) seed.")] = 0,
    jobs: Annotated[int, typer.Option(min=1, help="Trials in flight at once.")] = 1,
    top_k: Annotated[int, typer.Option(help="Runners-up to render besides the best.")] = 5,
    noise: Annotated[float, typer.Option(help="simulate: perturb the truth (σ, e.g. 0.1).")] = 0.0,
    command: Annotated[
        str | None, typer.Option(help="command runner: the command template.")
    ] = None,
    timeout: Annotated[float, typer.Option(help="Per-trial timeout, seconds.")] = 3600.0,
    steps: StepsOpt = 6,
    hang_timeout: Annotated[
        float, typer.Option(help="local runner: seconds without a new step before a hang.")
    ] = 300.0,
    launcher: Annotated[
        str, typer.Option(help="local runner: torchrun or deepspeed.")
    ] = "torchrun",
    megatron_lm: Annotated[
        str | None, typer.Option(help="local runner: a Megatron-LM checkout to run trials with.")
    ] = None,
    partition: Annotated[
        str | None, typer.Option(help="slurm runner: partition of the trial jobs.")
    ] = None,
    account: Annotated[
        str | None, typer.Option(help="slurm runner: account charged for the trial jobs.")
    ] = None,
    time_limit: Annotated[
        str | None,
        typer.Option(
            "--time-limit",
            help="slurm runner: Slurm --time of each trial job, e.g. 00:30:00 (default: "
            "--timeout plus 5 minutes).",
        ),
    ] = None,
    slurm_opt: Annotated[
        list[str] | None,
        typer.Option(
            "--slurm-opt",
            help="slurm runner: another sbatch option, KEY=VAL or KEY (repeatable), e.g. "
            "--slurm-opt qos=high --slurm-opt exclusive.",
        ),
    ] = None,
    seq: SeqOpt = None,
    gbs: GbsOpt = None,
    precision: PrecisionOpt = None,
    processes: ProcsOpt = None,
    scale_after: Annotated[
        bool, typer.Option("--scale", help="Sweep the winner over cluster sizes.")
    ] = False,
    scale_gpus: Annotated[
        str | None, typer.Option("--scale-gpus", help="GPU counts of the sweep.")
    ] = None,
    scale_mode: Annotated[str, typer.Option("--scale-mode", help="weak or strong.")] = "weak",
    as_json: JsonOpt = False,
) -> None:
    """Search layouts with an Optuna study, measure them with a runner, render the winners."""
    if framework is None:
        cpu_trials = runner == "local" and cluster == "local" and not megatron_lm
        framework = "deepspeed" if cpu_trials and not _has_cuda() else "megatron"
    cfg = _config(model, cluster, framework, seq, gbs, precision, processes)
    search_space = load_space(space_ref, cfg.train.framework)
    runner_options = RunnerOptions(
        timeout_s=timeout, noise=noise, seed=seed, command=command, steps=steps,
        hang_timeout_s=hang_timeout, launcher=launcher, megatron_lm=megatron_lm,
        partition=partition, account=account, time_limit=time_limit,
        slurm_opts=tuple(slurm_opt or ()), resume=resume,
    )
    trial_runner = make_runner(runner, runner_options)
    if runner == "local" and jobs > 1:
        raise AutotuneError("--jobs: local trials share this machine's GPUs or cores; use 1")
    options = TuneOptions(
        out_dir=out,
        trials=trials,
        storage=storage,
        study_name=study,
        resume=resume,
        seed=seed,
        jobs=jobs,
        top_k=top_k,
    )
    out.mkdir(parents=True, exist_ok=True)
    write_run_json(
        out,
        study_name=study or default_study_name(cfg),
        storage=storage or default_storage_url(out),
        runner=runner,
        runner_options=_recorded_options(runner, runner_options),
        options={"trials": trials, "seed": seed, "jobs": jobs, "top_k": top_k},
        command=shlex.join(["autotune", *sys.argv[1:]]),
    )
    quiet = as_json or not sys.stderr.isatty()
    with Progress(
        SpinnerColumn(),
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        disable=quiet,
    ) as progress:
        task = progress.add_task(f"tuning ({runner})", total=trials)

        def on_trial(current: Any, trial: Any) -> None:
            ran = sum(1 for t in current.get_trials(deepcopy=False) if t.user_attrs.get("ran"))
            best = (
                current.best_value
                if any(t.value for t in current.get_trials(deepcopy=False))
                else 0
            )
            progress.update(
                task,
                completed=min(ran, trials),
                description=f"tuning ({runner}) best {best:,.0f} tok/s",
            )

        result = run_tune(cfg, search_space, trial_runner, options, on_trial=on_trial)
    ranked = result.ranked
    scaled = None  # the sweep of the winner, with --scale
    if scale_after and ranked:
        best_layout = Layout(**ranked[0]["layout_fields"])
        scaled = sweep(
            cfg, best_layout, _sizes(scale_gpus, cfg, best_layout), scale_mode, trial_runner, out
        )
    reports = write_report(out)
    refit = refit_study(cfg, result.records, space=search_space) if runner != "simulate" else None
    if as_json:
        print(
            json.dumps(
                {
                    "study": result.study_name,
                    "storage": result.storage,
                    "out": str(result.out_dir),
                    "best": ranked[0] if ranked else None,
                    "top": ranked[1 : top_k + 1],
                    "artifacts": {k: str(v) for k, v in result.artifacts.items()},
                    "refit": refit.to_dict() if refit and refit.trials else None,
                },
                indent=2,
                default=str,
            )
        )
        return
    statuses: dict[str, int] = {}
    for r in result.records:
        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    console.print(
        f"study [bold]{result.study_name}[/] in {result.storage} — trials by status: "
        + ", ".join(f"{k} {v}" for k, v in sorted(statuses.items()))
    )
    if not ranked:
        raise AutotuneError(
            "no trial measured a throughput; see the trials' reasons with "
            f"optuna-dashboard {result.storage}"
        )
    console.print(_records_table("Top layouts (measured and predicted)", ranked[: top_k + 1]))
    if refit is not None and refit.trials:
        console.print(refit.table())
    if scaled is not None:
        console.print(_scaling_table(scaled))
    console.print(
        f"best configs: [bold]{result.artifacts.get('best')}[/] "
        f"(runners-up under {result.out_dir / 'top'})\n"
        f"report: {reports['report.html']}\n"
        f"open the study with: optuna-dashboard {result.storage}"
    )


GpusOpt = Annotated[
    str | None,
    typer.Option(
        "--gpus", help="GPU counts, e.g. 8,16,32 (default: powers of two up to the cluster)."
    ),
]


def _sizes(text: str | None, cfg: AutotuneConfig, layout: Layout) -> list[int]:
    if not text:
        return default_sizes(cfg, layout)
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise AutotuneError(
            f"--gpus: {text!r} must be comma-separated GPU counts, e.g. 8,16,32"
        ) from None


def _scaling_table(result: Any) -> Table:
    table = Table(title=f"{result.mode} scaling of {result.layout.id}")
    for column in (
        "GPUs",
        "nodes",
        "dp",
        "gas",
        "status",
        "tokens/s",
        "tok/s/GPU",
        "efficiency",
        "flag / reason",
        "grew most",
    ):
        table.add_column(
            column,
            justify="left" if column in ("status", "flag / reason", "grew most") else "right",
        )
    for p in result.points:
        grew = f"{p.grew} (-{p.grew_loss:.1%})" if p.grew else ""
        table.add_row(
            str(p.gpus),
            str(p.nodes),
            str(p.dp or "-"),
            str(p.gas or "-"),
            p.status,
            f"{p.tokens_per_s:,.0f}" if p.tokens_per_s else "-",
            f"{p.tokens_per_s_per_gpu:,.0f}" if p.tokens_per_s else "-",
            f"{p.efficiency:.2f}" if p.efficiency is not None else "-",
            p.flag or f"{p.rule} {p.reason}".strip(),
            grew,
        )
    return table


@app.command()
def scale(
    model: ModelOpt,
    cluster: ClusterOpt,
    layout: Annotated[str, typer.Option("--layout", "-l", help="e.g. tp=8,pp=4,zero=1,mbs=1")],
    gpus: GpusOpt = None,
    mode: Annotated[str, typer.Option(help="weak (per-replica batch fixed) or strong.")] = "weak",
    framework: FrameworkOpt = "megatron",
    runner: Annotated[str, typer.Option(help="simulate, command, local or slurm.")] = "simulate",
    out: Annotated[Path, typer.Option(help="Output folder.")] = Path("autotune-scale"),
    noise: Annotated[float, typer.Option(help="simulate: perturb the truth (σ).")] = 0.0,
    seed: Annotated[int, typer.Option(help="--noise seed.")] = 0,
    command: Annotated[str | None, typer.Option(help="command runner: the template.")] = None,
    timeout: Annotated[float, typer.Option(help="Per-point timeout, seconds.")] = 3600.0,
    steps: StepsOpt = 6,
    seq: SeqOpt = None,
    gbs: GbsOpt = None,
    precision: PrecisionOpt = None,
    processes: ProcsOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Run one layout at several cluster sizes and report its scaling efficiency."""
    if mode not in ("weak", "strong"):
        raise AutotuneError(f"--mode: {mode!r} must be weak or strong")
    cfg = _config(model, cluster, framework, seq, gbs, precision, processes)
    parsed = Layout.parse(layout, cfg.world_size, cfg.train.global_batch_size, cfg.train.framework)
    trial_runner = make_runner(runner, RunnerOptions(timeout_s=timeout, noise=noise, seed=seed,
                                                     command=command, steps=steps))
    result = sweep(cfg, parsed, _sizes(gpus, cfg, parsed), mode, trial_runner, out)
    written = write_report(out)
    if as_json:
        print(json.dumps(result.to_dict(), indent=2, default=str))
        return
    console.print(_scaling_table(result))
    console.print(f"report: {written['report.html']}")


@app.command()
def report(
    directory: Annotated[Path, typer.Argument(help="A tune or scale output folder.")],
    out: Annotated[Path | None, typer.Option(help="Write here instead of DIRECTORY.")] = None,
) -> None:
    """Regenerate report.md, report.html, summary.json and trials.csv of a folder."""
    written = write_report(directory, out)
    for name in ("report.html", "report.md", "summary.json"):
        console.print(f"{name}: {written[name]}")


@app.command("compare")
def compare_command(
    dirs: Annotated[list[Path], typer.Argument(help="tune/scale output folders.")],
    out: Annotated[Path, typer.Option(help="Folder for compare.md/html/json.")] = Path(
        "autotune-compare"
    ),
) -> None:
    """Compare runs side by side: best layouts, throughput, MFU, memory, scaling efficiency."""
    written = compare_runs(dirs, out)
    for name in ("compare.html", "compare.md"):
        console.print(f"{name}: {written[name]}")


@app.command()
def render(
    model: ModelOpt,
    cluster: ClusterOpt,
    layout: Annotated[str, typer.Option("--layout", "-l", help="e.g. tp=8,pp=4,zero=1,mbs=1")],
    out: Annotated[Path, typer.Option(help="Folder for the configs.")],
    framework: FrameworkOpt = "megatron",
    seq: SeqOpt = None,
    gbs: GbsOpt = None,
    precision: PrecisionOpt = None,
    processes: ProcsOpt = None,
) -> None:
    """Render ds_config.json / pretrain_gpt.sh / sbatch.sh and a manifest for one layout."""
    from autotune.render import write_artifacts

    cfg = _config(model, cluster, framework, seq, gbs, precision, processes)
    parsed, broken = _layout(cfg, layout)
    if broken:
        raise AutotuneError(
            "the layout breaks rules: " + "; ".join(f"{n}: {r}" for n, r in broken)
        )
    written = write_artifacts(cfg, parsed, out)
    for name, path in written.items():
        console.print(f"{name}: {path}")


@app.callback()
def _options(debug: Annotated[bool, typer.Option(help="Show tracebacks.")] = False) -> None:
    _state["debug"] = debug
    logging.basicConfig(
        level=logging.INFO,
        format="%(message)s",
        handlers=[RichHandler(console=err_console, show_path=False)],
    )
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)


def _run(entry: Callable[..., Any]) -> int:
    try:
        entry(standalone_mode=False)
    except AutotuneError as error:
        if _state["debug"]:
            raise
        err_console.print(f"[red]error:[/] {error}")
        return 2
    except ValidationError as error:
        if _state["debug"]:
            raise
        err_console.print(f"[red]error:[/] {validation_message(error, 'input')}")
        return 2
    except typer.Exit as done:
        return done.exit_code
    except Exception as error:  # click usage errors carry their own exit code
        import click

        if isinstance(error, click.ClickException):
            error.show()
            return 2
        if isinstance(error, click.exceptions.Abort):
            return 130
        raise
    return 0


def main() -> None:
    """Console entry point."""
    sys.exit(_run(app))
