"""The one Jinja setup (rendered artifacts and reports), and the values every template shows.

Templates live in `templates/` (`autotune.resources`); nothing else reads that folder. Two
kinds of environment share it: `artifacts` (launch scripts, JSON: no escaping; every string that
reaches a shell goes through the `shquote` filter (`shlex.quote`), numbers through `int`, comment
text through `comment` (one line), so a model path with spaces or `$(...)` stays inert;
`#SBATCH` values are checked by `sbatch_directives`) and `report` (`templates/report/`, HTML
autoescaped, with the Markdown filters `autotune.report` registers).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from collections.abc import Mapping
from collections.abc import Sequence
from functools import cache
from typing import Any
from typing import Literal

import jinja2

from autotune._version import __version__
from autotune.exceptions import AutotuneError
from autotune.layout import Layout
from autotune.resources import resource_dir
from autotune.specs import AutotuneConfig

MASTER_PORT = 6000
"""Default rendezvous port of the rendered scripts (the environment's MASTER_PORT wins)."""
_SBATCH_KEY = re.compile(r"[a-z][a-z0-9-]*")
_SBATCH_VALUE = re.compile(r"[^\s'\"\\#$`]+")


def _comment(value: object) -> str:
    """Text safe inside a `#` comment: control characters (newlines) become spaces."""
    return re.sub(r"[\x00-\x1f\x7f]", " ", str(value))


Kind = Literal["artifacts", "report"]
_FILTERS: dict[str, dict[str, Callable[..., Any]]] = {
    "artifacts": {"shquote": lambda value: shlex.quote(str(value)), "comment": _comment},
    "report": {},
}


def register_filters(kind: Kind, **filters: Callable[..., Any]) -> None:
    """Add filters to an environment kind (before its first render)."""
    _FILTERS[kind].update(filters)


@cache
def environment(kind: Kind = "artifacts") -> jinja2.Environment:
    """The Jinja environment of `kind` (StrictUndefined: an undefined value is an error)."""
    if kind == "report":
        env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(resource_dir("templates") / "report"),
            undefined=jinja2.StrictUndefined,
            autoescape=jinja2.select_autoescape(enabled_extensions=("html.j2",),
                                                default_for_string=False),
            keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True,
        )
    else:
        env = jinja2.Environment(
            loader=jinja2.FileSystemLoader(resource_dir("templates")),
            undefined=jinja2.StrictUndefined, keep_trailing_newline=True, autoescape=False,
        )
    env.filters.update(_FILTERS[kind])
    return env


def render_template(template: str, *, kind: Kind = "artifacts", **context: Any) -> str:
    """Render `template` of the `kind` environment (`templates/` or `templates/report/`)."""
    return environment(kind).get_template(template).render(**context)


def version() -> str:
    """autotune's version, as the artifacts record it."""
    return __version__


def header(cfg: AutotuneConfig, layout: Layout) -> dict[str, Any]:
    """Values every launch template shows or checks."""
    return {
        "version": version(),
        "model_name": cfg.model.name,
        "cluster_name": cfg.cluster.name,
        "layout_text": layout.text,
        "world_size": cfg.world_size,
        "nodes": cfg.cluster.nodes,
        "gpus_per_node": cfg.cluster.gpus_per_node,
        "master_port": MASTER_PORT,
    }


def flag_lines(args: Sequence[str]) -> list[list[str]]:
    """Group argv items as one flag and its values per line."""
    lines: list[list[str]] = []
    for arg in args:
        if arg.startswith("--") or not lines:
            lines.append([arg])
        else:
            lines[-1].append(arg)
    return lines


def sbatch_directives(options: Mapping[str, str | None], source: str = "sbatch") -> list[str]:
    """`--key=value` (or `--key` when the value is None) for each option, checked.

    Args:
        options: Option name (with or without `--`) → value, None for a flag.
        source: Where the options came from, for the error (e.g. `--slurm-opt`).

    Raises:
        AutotuneError: A key or value would not survive an #SBATCH line.
    """
    directives = []
    for key, value in options.items():
        key = key.removeprefix("--")
        if not _SBATCH_KEY.fullmatch(key):
            raise AutotuneError(f"{source}: {key!r} is not an sbatch option name "
                                "(e.g. qos=high, constraint=h100, exclusive)")
        if value is None:
            directives.append(f"--{key}")
        elif _SBATCH_VALUE.fullmatch(value):
            directives.append(f"--{key}={value}")
        else:
            raise AutotuneError(f"{source}: {key}={value!r} may not contain spaces, quotes, "
                                "backslashes, '#', '$' or backticks (it goes in an #SBATCH line)")
    return directives
