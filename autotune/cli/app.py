"""The `autotune` command line: parse options into a typed config, call the library, print.

The exit codes are set in one place, `_run`: 0 done; 1 the work failed (no trial or sweep point
measured a throughput, or an internal error); 2 bad input or usage, printed as one line that
names the option or field and the fix; 130 interrupted (Ctrl-C), with the command that resumes
the study. `--debug` shows tracebacks instead.
"""

from __future__ import annotations

import json
import logging
import shlex
import signal
import sys
import threading
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Annotated
from typing import Any
from typing import TypeVar

import typer
from pydantic import BaseModel
from pydantic import ValidationError
from rich.console import Console
from rich.logging import RichHandler
from rich.progress import BarColumn
from rich.progress import MofNCompleteColumn
from rich.progress import Progress
from rich.progress import SpinnerColumn
from rich.progress import TextColumn
from rich.progress import TimeElapsedColumn
from rich.text import Text

from autotune.cli.intervals import interval_json
from autotune.cli.intervals import interval_line
from autotune.cli.intervals import tie_title
from autotune.cli.intervals import vs_table
from autotune.cli.options import JOB
from autotune.cli.options import PROBLEM
from autotune.cli.options import RECIPE
from autotune.cli.options import RUNNER
from autotune.cli.options import SCALE
from autotune.cli.options import SWEEP
from autotune.cli.options import TRAIN
from autotune.cli.options import TUNE
from autotune.cli.options import Section
from autotune.cli.options import flag_of
from autotune.cli.options import with_options
from autotune.cli.tables import headline
from autotune.cli.tables import layout_table
from autotune.cli.tables import memory_table
from autotune.cli.tables import records_table
from autotune.cli.tables import rules_table
from autotune.cli.tables import scaling_table
from autotune.cli.tables import time_table
from autotune.costmodel.estimate import estimate as estimate_layout
from autotune.costmodel.uncertainty import prediction_interval
from autotune.exceptions import AutotuneError
from autotune.frameworks import framework_of
from autotune.layout import Layout
from autotune.run import Problem
from autotune.run import RunConfig
from autotune.run import check_layout
from autotune.run import prepare_out
from autotune.run import resume_command
from autotune.runners.factory import figure_label
from autotune.space.export import write_layouts_csv
from autotune.space.search_space import enumerate_layouts
from autotune.space.search_space import load_space
from autotune.space.search_space import no_feasible_message
from autotune.space.ties import rank_with_ties
from autotune.specs import AutotuneConfig
from autotune.specs.inputs import validation_message
from autotune.specs.inputs import validation_problems

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130
"""The exit codes (see the module docstring)."""

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Find the fastest way to train a transformer on a cluster.",
)
console = Console() if sys.stdout.isatty() else Console(width=160)
err_console = Console(stderr=True)
_state: dict[str, Any] = {"debug": False, "resume": ""}
"""Set while a command runs: --debug, and the command that resumes an interrupted study."""

# --- options into configs ---------------------------------------------------------------------

LayoutOpt = Annotated[
    str,
    typer.Option("--layout", "-l", help="e.g. tp=8,pp=4,zero=1,mbs=1,recompute=selective"),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of tables.")]
PROBLEM_OPTIONS = (PROBLEM, TRAIN)
"""The options of every command that takes a problem (the model, cluster and training)."""

_Config = TypeVar("_Config", bound=BaseModel)


def _parsed(cls: type[_Config], data: dict[str, Any], sections: tuple[Section, ...],
            root: tuple[str, ...] = ()) -> _Config:
    """`cls(**data)`, its validation errors told as the options the user typed."""
    try:
        return cls(**data)
    except ValidationError as error:
        problems = []
        for loc, value, message in validation_problems(error):
            flag = flag_of(sections, (*root, *loc)) or ".".join(map(str, (*root, *loc)))
            problems.append(flag + (f" {value}" if value else "") + f": {message}")
        raise AutotuneError("; ".join(problems)) from None


def _problem(config: dict[str, Any]) -> Problem:
    """The Problem of a command's options (and --config file)."""
    return _parsed(Problem, dict(config.get("problem") or {}), PROBLEM_OPTIONS, ("problem",))


def _load(problem: Problem) -> AutotuneConfig:
    """The problem's setup, its warnings printed to stderr."""
    cfg = problem.load()
    for line in problem.warnings(cfg):
        err_console.print(f"[yellow]warning:[/] {line}", soft_wrap=True)
    return cfg


def _run_config(config: dict[str, Any], sections: tuple[Section, ...], out: Path | None,
                default_out: str) -> RunConfig:
    """The RunConfig of tune's or scale's options: --out, else the file's, else `default_out`."""
    data = {key: value for key, value in config.items() if key != "command"}
    data["out"] = out if out is not None else data.get("out", default_out)
    return _parsed(RunConfig, {**data, "command": _command_line()}, sections)


def _command_line() -> str:
    """The command line as the user typed it (under `_run`), else this process's."""
    return shlex.join(["autotune", *_state.get("argv", sys.argv[1:])])


# --- commands ---------------------------------------------------------------------------------


@app.command()
@with_options(*PROBLEM_OPTIONS)
def space(
    top: Annotated[int, typer.Option(help="How many layouts to list.")] = 10,
    as_json: JsonOpt = False,
    csv_file: Annotated[Path | None, typer.Option(
        "--csv", help="Also write the listed layouts, with their estimates and intervals, to "
        "this CSV file (with --all: every feasible layout).")] = None,
    every: Annotated[bool, typer.Option(
        "--all", help="With --csv: write every feasible layout, beyond --top's 10,000.")] = False,
    *,
    config: dict[str, Any],
) -> None:
    """Enumerate the legal layouts, rank them by predicted throughput, and count rule removals."""
    problem = _problem(config)
    if not 0 < top <= 10_000:
        raise AutotuneError(f"--top: {top} must be from 1 to 10,000")
    if every and csv_file is None:
        raise AutotuneError("--all: writes every feasible layout to a file; add --csv FILE")
    cfg = _load(problem)
    search_space = load_space(problem.space, cfg.train.framework)
    result = enumerate_layouts(cfg, search_space)
    if not len(result):
        raise AutotuneError(no_feasible_message(result))
    band = prediction_interval(cfg)
    ranked = rank_with_ties([result.estimates.row(i)
                             for i in range(min(max(top, 500), len(result)))], band)[:top]
    best = [e for e, _ in ranked]
    if csv_file is not None:
        rows = write_layouts_csv(csv_file, result, band, None if every else top)
        print(f"wrote {rows:,} of {len(result):,} feasible layouts to {csv_file}",
              file=sys.stderr)
    if as_json:
        print(json.dumps({
            "model": _model_summary(cfg),
            "inputs": cfg.model_dump(), "space": search_space.model_dump(),
            "candidates": result.total, "feasible": len(result), "removed": result.removed,
            "interval": interval_json(cfg),
            "top": [e.to_dict() | {"tied_with_first": t} for e, t in ranked],
        }, indent=2))
        return
    console.print(headline(cfg))
    console.print(rules_table(result.removed, result.total))
    console.print(layout_table(f"Top {len(best)} of {len(result):,} feasible layouts", best,
                                cfg, [t for _, t in ranked], tie_title(band)))


def _model_summary(cfg: AutotuneConfig) -> dict[str, Any]:
    """The model's name and parameters: all of them, and those one token uses (MoE)."""
    return {"name": cfg.model.name, "params": cfg.model.num_params(),
            "active_params": cfg.model.active_params()}


@app.command()
@with_options(*PROBLEM_OPTIONS)
def estimate(
    layout: LayoutOpt,
    vs: Annotated[str | None, typer.Option(
        "--vs", help="Another layout (e.g. your current recipe): both, part by part.")] = None,
    as_json: JsonOpt = False,
    *,
    config: dict[str, Any],
) -> None:
    """Predict memory and step time of one layout, with both breakdowns.

    A layout that breaks a structural rule is refused (exit 2); one that only runs out of
    memory is estimated and marked infeasible.
    """
    cfg = _load(_problem(config))
    parsed, broken = check_layout(cfg, layout)
    result = estimate_layout(cfg, parsed)
    other = estimate_layout(cfg, check_layout(cfg, vs)[0]) if vs else None
    if as_json:
        print(json.dumps({
            "model": _model_summary(cfg),
            **result.to_dict(),
            "interval": interval_json(cfg),
            **({"vs": other.to_dict()} if other else {}),
            "feasible": not broken,
            "violations": [{"rule": n, "reason": r} for n, r in broken],
        }, indent=2))
        return
    for name, reason in broken:
        console.print(f"[bold red]INFEASIBLE[/] ({name}): {reason}", markup=True)
    console.print(
        f"[bold]{parsed.text}[/] (dp={parsed.dp}, gas={parsed.gas}) — {cfg.model.name} on "
        f"{cfg.cluster.name}"
    )
    console.print(memory_table(result))
    console.print(time_table(result))
    if other:
        console.print(vs_table(result, other))
    console.print(interval_line(cfg, result))
    console.print(
        f"tokens/s {result.tokens_per_s:,.0f} · TFLOP/s/GPU {result.tflops_per_gpu:.1f} "
        f"(hardware {result.hw_tflops_per_gpu:.1f}) · MFU {result.mfu:.1%} "
        f"(HFU {result.hfu:.1%})" + (" · [bold red]infeasible[/]" if broken else "")
    )


@app.command()
@with_options(*PROBLEM_OPTIONS, RECIPE, RUNNER, TUNE, SWEEP)
def tune(
    out: Annotated[Path | None, typer.Option(help="Output folder (study, trials, configs; "
                                             "default: autotune-out).")] = None,
    scale_after: Annotated[
        bool, typer.Option("--scale", help="Sweep the winner over cluster sizes.")
    ] = False,
    as_json: JsonOpt = False,
    *,
    config: dict[str, Any],
) -> None:
    """Search layouts with an Optuna study, measure them with a runner, render the winners."""
    from autotune.run import tune as run_tune

    if scale_after:
        config = {**config, "scale": config.get("scale") or {}}
    run = _run_config(config, (*PROBLEM_OPTIONS, RUNNER, TUNE, SWEEP), out, "autotune-out")
    _load(run.problem)
    _state["resume"] = resume_command(run)
    with Progress(
        SpinnerColumn(), TextColumn("[progress.description]{task.description}"), BarColumn(),
        MofNCompleteColumn(), TimeElapsedColumn(), console=err_console,
        disable=as_json or not sys.stderr.isatty(),
    ) as progress:
        name, trials = run.runner.name, run.tune.trials
        task = progress.add_task(f"tuning ({name})", total=trials)

        def on_trial(current: Any, _: Any) -> None:
            if _state.get("interrupted"):  # a Ctrl-C that landed where Python drops it
                raise KeyboardInterrupt
            done = current.get_trials(deepcopy=False)
            ran = sum(1 for t in done if t.user_attrs.get("ran"))
            best = max((t.value or 0.0 for t in done), default=0.0)
            progress.update(task, completed=min(ran, trials),
                            description=f"tuning ({name}) best {best:,.0f} tok/s")

        outcome = run_tune(run, on_trial=on_trial)
    _state["resume"] = ""
    result, ranked, label = outcome.result, outcome.ranked, figure_label(run.runner.name)
    top_k = run.tune.top_k
    if as_json:
        print(json.dumps({
            "study": result.study_name, "storage": result.storage, "out": str(result.out_dir),
            "figures": label, "statuses": outcome.statuses,
            "best": ranked[0] if ranked else None, "top": ranked[1 : top_k + 1],
            "artifacts": {k: str(v) for k, v in result.artifacts.items()},
            "refit": outcome.refit.to_dict() if outcome.refit and outcome.refit.trials else None,
        }, indent=2, default=str))
    else:
        console.print(
            f"study [bold]{result.study_name}[/] in {result.storage} — trials by status: "
            + ", ".join(f"{k} {v}" for k, v in outcome.statuses.items())
        )
        if ranked:
            console.print(records_table(f"Top layouts ({label} and predicted)",
                                         ranked[: top_k + 1], label, run.problem.load()))
            if outcome.refit is not None and outcome.refit.trials:
                console.print(outcome.refit.table())
            if outcome.scaled is not None:
                console.print(scaling_table(outcome.scaled))
            dashboard = ("" if result.storage == "memory"
                         else f"\nopen the study with: optuna-dashboard {result.storage}")
            console.print(
                f"best configs: [bold]{result.artifacts.get('best')}[/] "
                f"(runner-up of rank N under {result.out_dir / 'top'}/N-<layout id>)\n"
                f"report: {outcome.reports['report.html']}{dashboard}"
            )
    if not outcome.ok:
        dashboard = ("" if result.storage == "memory"
                     else f" or with optuna-dashboard {result.storage}")
        _failed(f"no trial measured a throughput; see the reasons in "
                f"{outcome.reports['report.md']}{dashboard}")


@app.command()
@with_options(*PROBLEM_OPTIONS, RUNNER, SCALE)
def scale(
    out: Annotated[Path | None, typer.Option(help="Output folder (default: autotune-scale).")
                   ] = None,
    as_json: JsonOpt = False,
    *,
    config: dict[str, Any],
) -> None:
    """Run one layout at several cluster sizes and report its scaling efficiency."""
    from autotune.run import scale as run_scale

    run = _run_config({**config, "scale": config.get("scale") or {}},
                      (*PROBLEM_OPTIONS, RUNNER, SCALE), out, "autotune-scale")
    _load(run.problem)
    outcome = run_scale(run)
    if as_json:
        print(json.dumps(outcome.result.to_dict(), indent=2, default=str))
    else:
        console.print(scaling_table(outcome.result))
        console.print(f"report: {outcome.reports['report.html']}")
    if not outcome.ok:
        _failed(f"no size of the sweep measured a throughput; see {outcome.reports['report.md']}")


@app.command()
def report(
    directory: Annotated[Path, typer.Argument(help="A tune, scale or plan output folder.")],
    out: Annotated[Path | None, typer.Option(help="Write here instead of DIRECTORY.")] = None,
) -> None:
    """Regenerate report.md, report.html, summary.json and trials.csv of a folder (plan.md
    and plan.html of a plan folder)."""
    from autotune.report import write_report
    from autotune.report.data import read_plan

    if not directory.is_dir():
        raise AutotuneError(f"report: {directory} is not a folder; give a tune or scale --out")
    doc = read_plan(directory)
    if doc is not None:
        from autotune.report.plan import write_plan_report

        pages = write_plan_report(doc, prepare_out(out) if out is not None else directory)
        for name in ("plan.html", "plan.md"):
            console.print(f"{name}: {pages[name]}")
        return
    written = write_report(directory, prepare_out(out) if out is not None else None)
    for name in ("report.html", "report.md", "summary.json"):
        console.print(f"{name}: {written[name]}")


@app.command("compare")
def compare_command(
    dirs: Annotated[list[Path], typer.Argument(help="tune/scale/plan output folders.")],
    out: Annotated[Path, typer.Option(help="Folder for compare.md/html/json.")] = Path(
        "autotune-compare"
    ),
) -> None:
    """Compare runs side by side: best layouts, throughput, MFU, memory, scaling efficiency."""
    from autotune.report import compare as compare_runs

    for directory in dirs:
        if not directory.is_dir():
            raise AutotuneError(f"compare: {directory} is not a folder; give tune or scale --out")
    written = compare_runs(dirs, prepare_out(out))
    for name in ("compare.html", "compare.md"):
        console.print(f"{name}: {written[name]}")


@app.command()
@with_options(*PROBLEM_OPTIONS, RECIPE, JOB)
def render(
    layout: LayoutOpt,
    out: Annotated[Path, typer.Option(help="Folder for the configs.")],
    *,
    from_layout: Annotated[str | None, typer.Option(
        "--from", help="The layout you train with now (tp=..,pp=..): README.md says how to "
                       "carry its checkpoints over and warns when the formats differ.")] = None,
    config: dict[str, Any],
) -> None:
    """Render ds_config.json / pretrain_gpt.sh / sbatch.sh and a manifest for one layout."""
    from autotune.render import write_artifacts

    cfg = _load(_problem(config))
    parsed, broken = check_layout(cfg, layout)
    if broken:
        raise AutotuneError(
            "--layout: does not fit: " + "; ".join(f"{n}: {r}" for n, r in broken)
        )
    current = None
    if from_layout is not None:
        current = Layout.parse(from_layout, cfg.world_size, cfg.train.global_batch_size,
                               framework_of(cfg))
    written = write_artifacts(cfg, parsed, prepare_out(out), from_layout=current)
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
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # its INFO notes are not ours
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("optuna.study._optimize").addFilter(_QUIET_INTERRUPT)


class _QuietInterrupt(logging.Filter):
    """Drop Optuna's two warnings (one with a traceback) about the trial that Ctrl-C stopped:
    the exit message says what happened and how to resume."""

    def __init__(self) -> None:
        super().__init__()
        self.trial = ""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[0] is KeyboardInterrupt:
            self.trial = record.getMessage().split(" failed", 1)[0]  # "Trial 3"
            return False
        return not (self.trial and record.getMessage().startswith(f"{self.trial} failed"))


_QUIET_INTERRUPT = _QuietInterrupt()


# --- the one place of exit codes --------------------------------------------------------------


class _WorkFailed(Exception):
    """The command ran but its work failed (exit 1)."""


def _failed(message: str) -> None:
    raise _WorkFailed(message)


def _print_error(message: str, prefix: str = "error") -> None:
    """One line on stderr, however long or multi-line the message."""
    line = " ".join(str(message).split())
    if len(line) > 1000:
        line = line[:600] + " … " + line[-300:]
    err_console.print(Text.assemble((f"{prefix}: ", "bold red"), line), soft_wrap=True)


def _usage_message(error: typer.TyperException) -> str:
    text = error.format_message()
    ctx = getattr(error, "ctx", None)
    if ctx is not None:
        text += f" (see {ctx.command_path} --help)"
    return text


def _run(entry: Callable[..., Any], args: list[str] | None = None) -> int:
    """Run the app on `args` (default: the process's) and return the exit code."""
    args = list(sys.argv[1:] if args is None else args)
    _state.update(debug="--debug" in args, resume="", argv=args, interrupted=False)
    previous = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, _on_interrupt)
    try:
        return _exit_code(entry, args)
    finally:
        del _state["argv"]
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGINT, previous)


def _on_interrupt(number: int, frame: Any) -> None:
    """Ctrl-C: remember it, then interrupt as Python does, except inside a weakref callback,
    where CPython would print and drop the KeyboardInterrupt: the study's next callback raises
    it then."""
    _state["interrupted"] = True
    if frame is not None and frame.f_code.co_filename.endswith("weakref.py"):
        return
    signal.default_int_handler(number, frame)


def _exit_code(entry: Callable[..., Any], args: list[str]) -> int:
    """The one place that turns outcomes into exit codes and error lines."""
    try:
        code = entry(args=args, prog_name="autotune", standalone_mode=False)
    except (AutotuneError, ValidationError, typer.TyperException, _WorkFailed) as error:
        if _state["debug"]:
            raise
        if isinstance(error, _WorkFailed):
            _print_error(str(error))
            return EXIT_FAILED
        if isinstance(error, ValidationError):
            _print_error(validation_message(error, "input"))
        elif isinstance(error, typer.TyperException):
            if error.format_message():  # else typer printed the help (no command given)
                _print_error(_usage_message(error))
        else:
            _print_error(str(error))
        return EXIT_USAGE
    except (KeyboardInterrupt, typer.Abort):
        code = EXIT_INTERRUPTED
    except Exception:
        if _state["debug"]:
            raise
        err_console.print(
            "internal error (a bug in autotune; please report it with this traceback):",
            style="bold red",
        )
        traceback.print_exc()
        return EXIT_FAILED
    code = code if isinstance(code, int) else EXIT_OK
    if code == EXIT_INTERRUPTED:
        hint = _state["resume"]
        message = f"the study is resumable; continue it with: {hint}" if hint else "stopped"
        _print_error(message, prefix="interrupted")
    return code


def main() -> None:
    """Console entry point."""
    sys.exit(_run(app))


if __name__ == "__main__":
    main()
