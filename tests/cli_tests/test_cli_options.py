"""The CLI's options are pinned (as torchtitan's test_no_new_cli_options pins its flags).

A new option is a change of the public interface: add it to RunConfig (or Problem) first, then
here and to the README's Commands section.
"""

from __future__ import annotations

import typer

from autotune.cli.app import app
from autotune.run import RunnerSettings

PROBLEM = ["--cluster", "--framework", "--gbs", "--model", "--moe-a2a-overlap", "--moe-dispatcher",
           "--no-moe-a2a-overlap", "--precision", "--processes", "--seq", "-c", "-m"]
RUNNER = ["--account", "--command", "--hang-timeout", "--launcher", "--megatron-lm", "--noise",
          "--partition", "--runner", "--seed", "--slurm-opt", "--steps", "--time-limit",
          "--timeout"]
PINNED = {
    "(global)": ["--debug", "--no-debug"],
    "space": sorted([*PROBLEM, "--json", "--space", "--top"]),
    "estimate": sorted([*PROBLEM, "--json", "--layout", "-l"]),
    "render": sorted([*PROBLEM, "--layout", "--out", "-l"]),
    "tune": sorted([*PROBLEM, *RUNNER, "--jobs", "--json", "--no-resume", "--out", "--repeat",
                    "--resume", "--scale", "--scale-gpus", "--scale-mode", "--space", "--storage",
                    "--study", "--top-k", "--trials", "--verify", "--no-verify"]),
    "scale": sorted([*PROBLEM, *RUNNER, "--gpus", "--json", "--layout", "--mode", "--out", "-l"]),
    "report": ["--out"],
    "compare": ["--out"],
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
