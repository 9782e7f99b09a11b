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
    when y is a module, else `x`; `from autotune import y` counts the package face, "")."""
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
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            names += [node.module] if node.module != "autotune" else []
        for name in names:
            inner = name.removeprefix("autotune.") if name.startswith("autotune.") else None
            if inner in known:
                found.add(inner)
            elif inner is not None and "." not in inner:
                found.add("")  # a name taken from the package face
    # `from autotune.x import y` listed both x.y (if a module) and x: keep the deepest
    return {m for m in found if not any(o.startswith(m + ".") for o in found if m)}


def _unit(module: str) -> str:
    """The room a module lives in: its first-level subpackage, or itself at the package root."""
    return module.split(".")[0]


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(path, known) - {name} for name, path in modules.items() if name}


def unit_graph() -> dict[str, set[str]]:
    """Subpackages and root modules, and the others each imports (the package face excluded)."""
    units: dict[str, set[str]] = {}
    for module, targets in _graph().items():
        units.setdefault(_unit(module), set()).update(
            _unit(t) for t in targets if t and _unit(t) != _unit(module))
    return units


def layers() -> dict[str, int]:
    """Each subpackage's and root module's layer, derived from the imports: 0 imports nothing
    of the package, otherwise one more than the highest layer it imports (needs no cycle)."""
    graph = unit_graph()
    done: dict[str, int] = {}

    def layer(unit: str, path: tuple[str, ...]) -> int:
        if unit in path:
            raise AssertionError("the folders import in a circle: " + " -> ".join(
                [*path[path.index(unit):], unit]))
        if unit not in done:
            done[unit] = 1 + max((layer(t, (*path, unit)) for t in graph[unit]), default=-1)
        return done[unit]

    for unit in graph:
        layer(unit, ())
    return done


def test_no_module_imports_the_package_face() -> None:
    """Inside the package, code imports the module that owns a name, never `autotune` itself
    (the face imports nearly everything, so such an import would run back up)."""
    offenders = sorted(m for m, targets in _graph().items() if "" in targets)
    assert offenders == [], f"import from the owning module instead: {offenders}"


def test_the_folders_import_one_way() -> None:
    """Oracle: the import statements. Subpackages and root modules form a graph without a
    circle, so each has a layer below everything that imports it (the layers come from the
    folders; docs/development.md prints them)."""
    assert layers()


def test_the_package_root_stays_small() -> None:
    """At most 15 modules at the package root: everything else lives in a subpackage of the
    data flow."""
    root = sorted(p.name for p in PACKAGE.glob("*.py") if p.name != "__init__.py")
    assert len(root) <= 15, root


def test_the_import_graph_has_no_cycle() -> None:
    """Depth-first search over module imports finds no cycle."""
    graph = _graph()
    state: dict[str, int] = {}
    cycles: list[str] = []

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for target in sorted(graph.get(node, ())):
            if not target:
                continue
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
    "calibration_tests": ("calibration",),
    "cli_tests": ("cli", "run", "exceptions", "_version"),
    "cluster_tests": ("runners.slurm", "runners.slurm_client", "search.storage"),
    "costmodel_tests": ("costmodel", "units"),
    "frameworks_tests": ("frameworks",),
    "inputs_tests": ("specs.inputs", "resources"),
    "layout_tests": ("layout",),
    "plan_tests": ("planning",),
    "render_tests": ("render", "templating", "launchers", "frameworks.megatron.args"),
    "repo_tests": (),
    "report_tests": ("report", "numbers"),
    "runners_tests": ("runners", "measurement", "workloads.records", "trial",
                      "testing"),
    "scaling_tests": ("scaling", "verify"),
    "search_tests": ("search",),
    "space_tests": ("space",),
    "specs_tests": ("specs", "frameworks.megatron.model"),
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
