"""The `autotune` command line: parse, call the API, print with rich. Nothing else lives here."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from typing import Annotated
from typing import Any

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.logging import RichHandler
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
from autotune.rules import violations
from autotune.space import enumerate_layouts
from autotune.space import load_space
from autotune.space import no_feasible_message
from autotune.specs import AutotuneConfig

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Find the fastest parallel layout to train a transformer on a cluster.",
)
console = Console()
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
    parsed = Layout.parse(layout, cfg.world_size, cfg.train.global_batch_size, cfg.train.framework)
    broken = violations(cfg, parsed, constants_for(cfg.cluster.gpu))
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
