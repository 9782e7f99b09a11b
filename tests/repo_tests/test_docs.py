"""The documentation is current and complete, and the README keeps its promises.

Oracles: the code each generated page is read from (the rule registry, the pydantic models, the
Typer app, the presets, the import layers of the structure test), regenerated in memory and
compared with the files git tracks; `.ci/run` for the README's test command; the files on disk
for every relative link; bounds worked out by hand from the specs' type definitions.
"""

from __future__ import annotations

import difflib
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest
import typer

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_autotune_docs", ROOT / "docs/generate.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def layers() -> dict[str, int]:
    """The structure test's layers (derived from the package's imports)."""
    return dict(_generator()._structure_layers())


@pytest.fixture(scope="module")
def pages(layers: dict[str, int]) -> dict[str, str]:
    return dict(_generator().generated(layers))


def test_generated_pages_are_current(pages: dict[str, str]) -> None:
    """Each generated page equals what the generator writes now (else: `python
    docs/generate.py`)."""
    diffs = []
    for path, text in pages.items():
        on_disk = (ROOT / path).read_text() if (ROOT / path).exists() else ""
        if on_disk != text:
            diffs += list(difflib.unified_diff(on_disk.splitlines(), text.splitlines(), path,
                                               "generated", n=0, lineterm=""))[:12]
    assert diffs == [], "run `python docs/generate.py`:\n" + "\n".join(diffs)


def test_every_rule_option_field_and_constant_is_documented(pages: dict[str, str]) -> None:
    """Oracle: the registries themselves (RULES, the click commands of the Typer app, the
    models' fields, the named parts of the estimates, the trial statuses): each name appears on
    its page, each part is explained in docs/explanation/cost-model.md and each status in
    docs/guide/local-trials.md."""
    from autotune.cli.app import app
    from autotune.costmodel.constants import Constants
    from autotune.costmodel.memory import MEMORY_PARTS
    from autotune.costmodel.step_time import TIME_PARTS
    from autotune.measurement import Status
    from autotune.run import Problem
    from autotune.run import RunConfig
    from autotune.run import ScaleSettings
    from autotune.runners.factory import RunnerSettings
    from autotune.search.settings import TuneSettings
    from autotune.space.rules import RULES
    from autotune.space.search_space import SearchSpace
    from autotune.specs import ClusterSpec
    from autotune.specs import GPUSpec
    from autotune.specs import ModelSpec
    from autotune.specs import TrainSpec

    rules = pages["docs/reference/rules.md"]
    assert [n for n in RULES if f"`{n}`" not in rules] == []
    from autotune.workloads import deepspeed_gpt
    from autotune.workloads import megatron_gpt

    limits = [r.name for r in (*deepspeed_gpt.LIMITS, *megatron_gpt.LIMITS)]
    assert limits and [n for n in limits if f"| `{n}` |" not in rules] == []
    group = typer.main.get_command(app)
    cli = pages["docs/reference/cli.md"]
    for name, command in getattr(group, "commands", {}).items():
        section = cli.split(f"## autotune {name}\n")[1].split("\n## ")[0]
        flags = [o for p in command.params for o in p.opts if o.startswith("--")]
        assert [f for f in flags if f not in section] == [], name
    specs = pages["docs/reference/specs.md"]
    for model in (ModelSpec, ClusterSpec, GPUSpec, TrainSpec, SearchSpace, RunConfig, Problem,
                  RunnerSettings, TuneSettings, ScaleSettings):
        assert [f for f in model.model_fields if f"| `{f}` |" not in specs] == [], model
    constants = pages["docs/reference/constants.md"]
    assert [f for f in Constants.model_fields if f"| `{f}` |" not in constants] == []
    trials = (ROOT / "docs/guide/local-trials.md").read_text()
    assert [s for s in Status if f"`{s.value}`" not in trials] == []
    explained = (ROOT / "docs/explanation/cost-model.md").read_text()
    for part in (*MEMORY_PARTS, *TIME_PARTS):
        assert f"`{part}`" in constants and f"| `{part}` |" in explained, part


def _row(page: str, field: str) -> str:
    return next(line for line in page.splitlines() if line.startswith(f"| `{field}` |"))


def test_bounds_are_read_from_the_types(pages: dict[str, str]) -> None:
    """Oracle: the bounds worked out by hand from autotune/specs/types.py and the Constants
    fields (LayerCount: 1 to 2**14 = 16,384; memory_margin: ge=0, lt=1; gemm_efficiency fit
    bounds 0.5-0.95; a search space's tp: each degree 1 to 2**20 = 1,048,576)."""
    specs = pages["docs/reference/specs.md"]
    assert "≥ 1; ≤ 16,384 (100x the deepest published transformer, 126 layers)" in _row(
        specs, "num_layers")
    assert "each ≥ 1; each ≤ 1,048,576" in _row(specs, "tp")
    constants = pages["docs/reference/constants.md"]
    assert "| ≥ 0; < 1 |" in _row(constants, "memory_margin")
    assert _row(constants, "gemm_efficiency").endswith("| 0.5-0.95 |")
    assert _row(constants, "hbm_efficiency").endswith("| - |")


def test_layers_block_lists_every_unit_once(pages: dict[str, str],
                                            layers: dict[str, int]) -> None:
    """Oracle: the structure test's layers (derived from the imports): every subpackage and
    root module appears under its layer number, in order."""
    block = pages["docs/development.md"]
    current = -1
    seen: dict[str, int] = {}
    for line in block.splitlines():
        if match := re.fullmatch(r"layer (\d+)", line):
            current = int(match.group(1))
        elif match := re.fullmatch(r"  (\S+?)(?:/|\.py)\s.*", line):
            seen[match.group(1)] = current
    assert seen == layers


def test_readme_is_a_short_guide_with_the_ci_test_command() -> None:
    """Oracle: `.ci/run` (what CI runs) and the README's length limit (250 lines): the README's
    second quickstart command is `.ci/run`, and the install and test commands it quotes are the
    ones `.ci/run` runs."""
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    assert "bash .ci/run" in readme
    ci = (ROOT / ".ci/run").read_text()
    for command in ("pip install -q torch==2.13.0 -e '.[test]'", "python -m pytest -q"):
        assert command in ci, command
        assert command.replace(" -q torch", " torch") in readme, command


def test_relative_links_resolve() -> None:
    """Oracle: the files on disk. Every relative Markdown link of the README and docs/ names a
    file or folder that exists."""
    broken = []
    for page in [ROOT / "README.md", ROOT / "benchmarks/README.md",
                 *sorted((ROOT / "docs").rglob("*.md"))]:
        if not page.exists():
            continue
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in target and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert broken == []


def _resolves(dotted: str) -> bool:
    """True when `dotted` names a module of the package, or an attribute of one."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            target: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            if not hasattr(target, name):
                return False
            target = getattr(target, name)
        return True
    return False


def test_named_modules_and_files_exist() -> None:
    """Oracle: the package (importlib) and the files on disk. Every `autotune.x.y` name and every
    repository path in backquotes (autotune/, tests/, benchmarks/, templates/, data/, ...) that
    the README and docs/ mention exists, so a move cannot leave a page pointing nowhere."""
    pages = [ROOT / "README.md", ROOT / "benchmarks/README.md",
             *sorted((ROOT / "docs").rglob("*.md"))]
    missing = []
    for page in pages:
        text = page.read_text()
        for dotted in re.findall(r"`(autotune(?:\.\w+)+)(?![\w/])", text):
            if not _resolves(dotted):
                missing.append(f"{page.relative_to(ROOT)}: {dotted}")
        for path in re.findall(
                r"`((?:autotune|tests|benchmarks|templates|search_spaces|data|reports)/[\w./-]*)",
                text):
            if "<" not in path and not (ROOT / path).exists():
                missing.append(f"{page.relative_to(ROOT)}: {path}")
    assert missing == []
