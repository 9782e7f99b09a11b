"""The repository stands on its own, and the package's imports run one way.

Oracles: the files git tracks (a user's clone has nothing else) and the import statements of
every module, read with Python's own `ast` (top-level and function-level imports alike).
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "autotune"

OUTSIDE = re.compile(
    "|".join([r"\.\./" + "shared", "/" + "work/", "/" + "root/", "/" + "home/[a-z]"]))
"""Paths a user's clone does not have: notes beside the repository, or this machine's home
(spelled in pieces so that this file does not name them itself)."""

LAYERS: dict[str, int] = {
    "exceptions": 0, "resources": 0,
    "specs": 1, "params": 1,
    "layout": 2, "hf": 2, "constants": 2, "flops": 2, "templating": 2,
    "sharding": 3, "inputs": 3, "kernels": 3, "collectives": 3, "expert_dispatch": 3,
    "frameworks": 4,
    "memory": 5,
    "perf": 6, "rules": 6,
    "estimate": 7,
    "space": 8, "calibration": 8, "published": 8,
    "runners.base": 9, "records": 9, "runners.process": 9, "runners.failures": 9,
    "workloads": 9,
    "runners": 10, "storage": 10, "sampler": 10, "refit": 10, "surrogate": 10,
    "memory_learning": 10, "proposal": 10,
    "render": 11, "pipeline": 11,
    "search": 12, "scaling": 12,
    "report": 13, "testing": 13, "run": 13,
    "cli": 14, "workloads.common": 14, "workloads.deepspeed_gpt": 14,
    "workloads.megatron_gpt": 14,
}
"""Each module's layer (the longest matching dotted prefix decides): a module imports only from
its own layer or below, so nothing runs back up (the CLI at the top, plain specs at the bottom).
"""


def tracked_files() -> list[Path]:
    """The files git tracks (skipped outside a git checkout, e.g. an unpacked sdist)."""
    try:
        done = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                              check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [ROOT / name for name in done.stdout.decode().split("\0") if name]


def test_no_tracked_file_points_outside_the_repository() -> None:
    """A clone must not refer to notes beside the repository or to this machine's paths."""
    offenders = []
    for path in tracked_files():
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:100]}")
    assert offenders == [], "\n".join(offenders[:20])


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(p for p in parts if p != "__init__")


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(path: Path, known: set[str]) -> set[str]:
    """The autotune modules a file imports at run time (`from autotune.x import y` counts `x.y`
    when y is a module, else `x`)."""
    found: set[str] = set()
    tree = ast.parse(path.read_text())
    typing_only = {id(inner) for node in ast.walk(tree) if isinstance(node, ast.If)
                   and "TYPE_CHECKING" in ast.unparse(node.test) for inner in ast.walk(node)}
    for node in ast.walk(tree):
        if id(node) in typing_only:  # imports for type hints only never run
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        for name in names:
            if name.startswith("autotune."):
                inner = name.removeprefix("autotune.")
                if inner in known:
                    found.add(inner)
    # `from autotune.x import y` listed both x.y (if a module) and x: keep the deepest
    return {m for m in found if not any(o.startswith(m + ".") for o in found)}


def _layer(module: str) -> int:
    parts = module.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in LAYERS:
            return LAYERS[prefix]
    raise AssertionError(f"autotune.{module} has no layer in LAYERS; add it")


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(path, known) - {name} for name, path in modules.items() if name}


def test_lower_layers_never_import_higher_ones() -> None:
    """Every import goes to the importer's layer or below (lazy imports included)."""
    upward = [f"autotune.{a} (layer {_layer(a)}) imports autotune.{b} (layer {_layer(b)})"
              for a, targets in _graph().items() for b in targets if _layer(b) > _layer(a)]
    assert upward == [], "\n".join(upward)


def test_the_import_graph_has_no_cycle() -> None:
    """Depth-first search over module imports finds no cycle."""
    graph = _graph()
    state: dict[str, int] = {}
    cycles: list[str] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph.get(node, ())):
            if state.get(target) == 1:
                cycles.append(" -> ".join([*path[path.index(target):], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert cycles == [], "\n".join(cycles)


MIRROR: dict[str, tuple[str, ...]] = {
    "calibration_tests": ("calibration", "published"),
    "cli_tests": ("cli", "run", "exceptions"),
    "cluster_tests": ("runners.slurm", "runners.slurm_client", "storage"),
    "frameworks_tests": ("frameworks",),
    "inputs_tests": ("inputs", "resources"),
    "layout_tests": ("layout",),
    "perf_tests": ("perf", "memory", "flops", "kernels", "collectives", "sharding", "estimate",
                   "constants", "expert_dispatch"),
    "render_tests": ("render", "templating", "frameworks.megatron_args"),
    "repo_tests": (),
    "report_tests": ("report",),
    "runners_tests": ("runners", "records", "pipeline", "refit", "testing"),
    "scaling_tests": ("scaling",),
    "search_tests": ("search", "sampler", "proposal", "memory_learning", "surrogate"),
    "space_tests": ("space", "rules"),
    "specs_tests": ("specs", "params", "hf", "frameworks.megatron_model"),
    "workloads_tests": ("workloads",),
}
"""Each test folder and the modules it tests: the suite mirrors the package. repo_tests checks
the repository itself; cluster_tests holds the Slurm and shared-storage tests that start the
localhost services."""


def test_tests_mirror_the_package() -> None:
    """Oracle: the folders under tests/ and the modules under autotune/ on disk. Every test
    folder is in MIRROR, every module it names exists, and every module has a test folder."""
    folders = {p.name for p in (ROOT / "tests").iterdir() if p.name.endswith("_tests")}
    assert folders == set(MIRROR), "add the folder to MIRROR (or move its tests)"
    modules = {m for m in _modules() if m}
    claimed = {m for names in MIRROR.values() for m in names}
    assert claimed - modules == set(), "MIRROR names a module that does not exist"
    homeless = [m for m in modules
                if not any(m == c or m.startswith(c + ".") for c in claimed)]
    assert homeless == [], f"modules with no test folder: {sorted(homeless)}"
