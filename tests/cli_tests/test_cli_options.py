"""The CLI's options are pinned (as torchtitan's test_no_new_cli_options pins its flags), and
each is generated from one config field.

A new option is a change of the public interface: add the field to its config model (a
`TrainSpec` field becomes a flag of every problem command), then pin it here.
"""

from __future__ import annotations

import typer

from autotune.cli.app import app
from autotune.run import RunnerSettings

PROBLEM = ["--adam-moments-dtype", "--calibration", "--cluster", "--config",
           "--attention-backend", "--flash-attention", "--fp8-recipe", "--framework", "--gbs",
           "--gbs-tokens",
           "--grad-reduce-in-fp32", "--no-grad-reduce-in-fp32",
           "--model", "--moe-a2a-overlap", "--moe-dispatcher", "--no-flash-attention",
           "--moe-force-balance", "--no-moe-force-balance",
           "--ignore-calibration-mismatch", "--no-ignore-calibration-mismatch",
           "--no-moe-a2a-overlap", "--no-overlap-grad-reduce", "--no-overlap-param-gather",
           "--no-tp-comm-overlap", "--overlap-grad-reduce", "--overlap-param-gather",
           "--precision", "--processes", "--seq", "--space", "--stack",
           "--tp-comm-overlap", "--zero3-list-collectives", "--no-zero3-list-collectives",
           "-c", "-m"]
RUNNER = ["--account", "--command", "--hang-timeout", "--launcher", "--megatron-lm", "--noise",
          "--partition", "--runner", "--seed", "--slurm-opt", "--steps", "--time-limit",
          "--timeout"]
RECIPE = ["--decay-style", "--distributed-timeout-minutes", "--lr", "--min-lr", "--train-tokens",
          "--warmup-iters"]
JOB = ["--account", "--container-image", "--partition", "--time", "--train-script"]
PINNED = {
    "(global)": ["--debug", "--no-debug"],
    "space": sorted([*PROBLEM, "--all", "--csv", "--json", "--top"]),
    "estimate": sorted([*PROBLEM, "--json", "--layout", "--vs", "-l"]),
    "render": sorted([*PROBLEM, *RECIPE, *JOB, "--from", "--layout", "--out", "-l"]),
    "tune": sorted([*PROBLEM, *RECIPE, *RUNNER, "--confidence", "--jobs", "--json",
                    "--no-resume", "--no-stop-when-confident", "--no-verify", "--out", "--repeat",
                    "--resume", "--scale", "--scale-gpus", "--scale-mode", "--stop-when-confident",
                    "--storage", "--study", "--top-k", "--trials", "--verify"]),
    "scale": sorted([*PROBLEM, *RUNNER, "--gpus", "--json", "--layout", "--mode", "--out", "-l"]),
    "calibrate": sorted([*PROBLEM, "--account", "--from-runs", "--margin", "--out",
                         "--partition", "--runner", "--slurm-opt", "--time-limit"]),
    "report": ["--out"],
    "compare": ["--out"],
    "plan": sorted([*(o for o in PROBLEM if o not in (
                        "--processes", "--gbs-tokens", "--ignore-calibration-mismatch",
                        "--no-ignore-calibration-mismatch")), *RUNNER, "--budget",
                    "--deadline", "--json", "--max-gbs-tokens", "--out", "--price", "--tokens",
                    "--verify-sizes"]),
    "verify": ["--launcher", "--runner", "--steps", "--timeout"],
}
ARGUMENTS = {"report": ["directory"], "compare": ["dirs"], "verify": ["directory"]}


def _options(command: typer.core.TyperCommand) -> list[str]:
    return sorted(o for p in command.params for o in (*p.opts, *p.secondary_opts)
                  if o.startswith("-"))


def test_no_new_cli_options() -> None:
    """Oracle: the lists above, written by hand (every option documented in the README)."""
    group = typer.main.get_command(app)
    found = {"(global)": _options(group)}
    found.update({name: _options(command) for name, command in group.commands.items()})
    assert found == PINNED
    arguments = {name: [p.name for p in command.params if not p.opts[0].startswith("-")]
                 for name, command in group.commands.items()}
    assert {k: v for k, v in arguments.items() if v} == ARGUMENTS


def test_tune_and_scale_take_every_runner_setting() -> None:
    """Oracle: RunnerSettings' fields, each reachable from both commands (scale used to lack
    the Slurm and local-runner options)."""
    named = {"name": "--runner", "timeout_s": "--timeout", "hang_timeout_s": "--hang-timeout",
             "slurm_opts": "--slurm-opt"}
    flags = {named.get(f, "--" + f.replace("_", "-")) for f in RunnerSettings.model_fields}
    assert flags == set(RUNNER)
    group = typer.main.get_command(app)
    for command in ("tune", "scale"):
        assert flags <= set(_options(group.commands[command])), command


def test_every_option_is_its_config_field() -> None:
    """Oracle: the config models' own fields and docstrings. Every training setting is a flag
    of every problem command, and each generated flag's help is its field's docstring, so an
    option is declared once (in the config) and nowhere else."""
    from autotune.cli.options import PROBLEM as PROBLEM_SECTION
    from autotune.cli.options import TRAIN
    from autotune.specs import TrainSpec

    group = typer.main.get_command(app)
    for name in ("space", "estimate", "render", "tune", "scale"):
        command = group.commands[name]
        helps = {o: p.help or "" for p in command.params for o in p.opts}
        for section in (PROBLEM_SECTION, TRAIN):
            for field, decls in section.options():
                doc = " ".join((TrainSpec.model_fields.get(field) or
                                section.model.model_fields[field]).description.split())
                assert helps[decls[0]].startswith(doc), (name, decls[0])
        assert {f for f, _ in TRAIN.options()} == set(TrainSpec.model_fields)
