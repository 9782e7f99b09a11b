"""The command runner: any launcher plugs in through a command template.

The template is a shell command line with placeholders, each replaced by a shell-quoted value:
{layout_json}, {ds_config}, {megatron_script}, {sbatch}, {trial_dir}, {layout} (text form),
{world_size}; other braces are left alone. The command prints JSON: optional intermediate lines
`{"event": "step", "tokens_per_s": ...}` and, last, one object with `step_time_s` or
`tokens_per_s` (optional `peak_memory_gb`, `status`). Exit code, bad JSON or a timeout make a
failed trial with the reason; the study goes on.
"""

from __future__ import annotations

import json
import re
import shlex
from typing import Any

from autotune.exceptions import AutotuneError
from autotune.frameworks import framework_of
from autotune.measurement import Measurement
from autotune.measurement import validated
from autotune.runners.base import Runner
from autotune.runners.base import TrialOptions
from autotune.runners.base import TrialPlan
from autotune.runners.process import run_process
from autotune.specs import AutotuneConfig
from autotune.workloads.records import measured

PLACEHOLDERS = (
    "layout_json",
    "ds_config",
    "megatron_script",
    "sbatch",
    "trial_dir",
    "layout",
    "world_size",
)
_ARTIFACT_OF = {"layout_json": "layout.json", "ds_config": "ds_config.json",
                "megatron_script": "pretrain_gpt.sh", "sbatch": "sbatch.sh"}
"""The rendered file each file placeholder names."""
_PLACEHOLDER = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")
"""Only these names are replaced; other braces (JSON, shell) stay as written."""


def parse_json_line(line: str) -> dict[str, Any] | None:
    """The JSON object on a line, or None."""
    line = line.strip()
    if not (line.startswith("{") and line.endswith("}")):
        return None
    try:
        value = json.loads(line)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, dict) else None


def measurement_from_metrics(plan: TrialPlan, metrics: dict[str, Any]) -> Measurement:
    """Turn the command's final JSON object into a Measurement (figures as every runner computes
    them: tokens/s from the step time, TFLOP/s per GPU and MFU from the model's FLOPs). Figures
    that are not positive finite numbers make a `crash` naming them (`validated`)."""
    status = str(metrics.get("status", "ok"))
    raw = validated(Measurement(status, step_time_s=metrics.get("step_time_s"),
                                tokens_per_s=metrics.get("tokens_per_s")))
    if raw.status != "ok":
        return raw
    tokens = plan.cfg.train.tokens_per_step
    if raw.step_time_s is not None:
        step = raw.step_time_s
    else:
        assert raw.tokens_per_s is not None  # `validated`: an ok trial measured one of the two
        step = tokens / raw.tokens_per_s
    peak = metrics.get("peak_memory_bytes")
    if peak is None and metrics.get("peak_memory_gb") is not None:
        peak = metrics["peak_memory_gb"] * 1e9
    figures = measured(plan.cfg, plan.layout, step, peak_memory_bytes=peak,
                       step_time_spread=metrics.get("step_time_spread", 0.0))
    return validated(figures)


class CommandSettings(TrialOptions):
    """What the command runner reads."""

    command: str | None = None
    """command: the command template (placeholders {layout_json}, {trial_dir}, ...)."""


class CommandRunner(Runner):
    """Runs a user command per trial and reads its JSON metrics."""

    name = "command"
    needs_artifacts = True

    @classmethod
    def from_settings(cls, settings: CommandSettings, resume: bool = False) -> CommandRunner:
        """The runner `settings` describe.

        Raises:
            AutotuneError: no command template.
        """
        if not settings.command:
            raise AutotuneError("--runner command needs --command 'TEMPLATE' (placeholders: "
                                "{layout_json} {ds_config} {megatron_script} {trial_dir} ...)")
        return cls(settings.command, timeout_s=settings.timeout_s)

    def __init__(self, template: str, timeout_s: float = 3600.0) -> None:
        if not _PLACEHOLDER.search(template):
            raise AutotuneError(
                f"--command: the template names no placeholder; use some of "
                f"{', '.join('{' + p + '}' for p in PLACEHOLDERS)}"
            )
        self.template = template
        self.timeout_s = timeout_s

    def check(self, cfg: AutotuneConfig) -> None:
        """Refuse a template that names a file the framework does not render."""
        framework = framework_of(cfg)
        rendered = {*framework.artifacts, "layout.json"}
        for name in sorted(set(_PLACEHOLDER.findall(self.template))):
            artifact = _ARTIFACT_OF.get(name)
            if artifact is not None and artifact not in rendered:
                raise AutotuneError(
                    f"--command: {{{name}}} names {artifact}, which --framework {framework.name} "
                    f"does not render ({', '.join(sorted(rendered))}); change the template or "
                    "--framework"
                )

    def command_line(self, plan: TrialPlan) -> str:
        """The template with every placeholder replaced by a quoted value."""
        values = {
            "layout_json": plan.artifacts.get("layout.json", plan.directory / "layout.json"),
            "ds_config": plan.artifacts.get("ds_config.json", plan.directory / "ds_config.json"),
            "megatron_script": plan.artifacts.get(
                "pretrain_gpt.sh", plan.directory / "pretrain_gpt.sh"
            ),
            "sbatch": plan.artifacts.get("sbatch.sh", plan.directory / "sbatch.sh"),
            "trial_dir": plan.directory,
            "layout": plan.layout.text,
            "world_size": plan.cfg.world_size,
        }
        return _PLACEHOLDER.sub(lambda match: shlex.quote(str(values[match[1]])), self.template)

    def run(self, plan: TrialPlan) -> Measurement:
        command = self.command_line(plan)
        (plan.directory / "command.sh").write_text(command + "\n")
        last: list[dict[str, Any]] = []
        step = [0]

        def on_line(line: str) -> bool:
            data = parse_json_line(line)
            if data is None:
                return False
            if data.get("event") == "step" and data.get("tokens_per_s"):
                step[0] += 1
                return plan.report(step[0], float(data["tokens_per_s"]))
            last.append(data)
            return False

        outcome = run_process(
            ["bash", "-c", command],
            cwd=plan.directory,
            timeout_s=self.timeout_s,
            on_line=on_line,
            stdout_path=plan.directory / "stdout.log",
            stderr_path=plan.directory / "stderr.log",
        )
        if outcome.stopped:
            return Measurement("pruned", reason="stopped by the pruner", log_tail=outcome.tail)
        if outcome.timed_out:
            return Measurement(
                "timeout", reason=f"exceeded {self.timeout_s:g} s", log_tail=outcome.tail
            )
        if outcome.returncode != 0:
            return Measurement(
                "crash", reason=f"exit code {outcome.returncode}", log_tail=outcome.tail
            )
        if not last:
            return Measurement(
                "crash", reason="the command printed no JSON object", log_tail=outcome.tail
            )
        result = measurement_from_metrics(plan, last[-1])
        return Measurement(**{**result.to_dict(), "log_tail": outcome.tail})
