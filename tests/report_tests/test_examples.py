"""The example reports in reports/ are current: regenerating them gives the same files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from helpers_report import EXTERNAL

from autotune.report import examples

REPORTS = Path(__file__).resolve().parents[2] / "reports"
COMPARED = ("summary.json", "report.md", "trials.csv", "scaling.json", "scaling.csv")
"""Deterministic outputs (the study journal and rendered configs' library versions are not)."""
HINT = "reports/ is stale: run `python -m autotune.report.examples` and commit reports/"


@pytest.fixture(scope="module")
def regenerated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("reports")
    for example in examples.EXAMPLES.values():
        examples.generate(example, out)
    if (REPORTS / examples.LOCAL / "summary.json").exists():
        shutil.copytree(REPORTS / examples.LOCAL, out / examples.LOCAL)
    examples.comparison(out)
    return out


@pytest.mark.parametrize("name", list(examples.EXAMPLES))
@pytest.mark.parametrize("file", COMPARED)
def test_example_is_current(regenerated: Path, name: str, file: str) -> None:
    fresh = (regenerated / name / file).read_text()
    assert (REPORTS / name / file).read_text() == fresh, f"{name}/{file}: {HINT}"


def test_comparison_is_current(regenerated: Path) -> None:
    fresh = json.loads((regenerated / examples.COMPARISON / "compare.json").read_text())
    kept = json.loads((REPORTS / examples.COMPARISON / "compare.json").read_text())
    assert kept == fresh, HINT


@pytest.mark.parametrize("name", [*examples.EXAMPLES, examples.COMPARISON])
def test_example_html_is_self_contained(name: str) -> None:
    for page in (REPORTS / name).glob("*.html"):
        assert not EXTERNAL.search(page.read_text()), page


def test_simulate_example_sweeps_1_to_128_nodes() -> None:
    for name in examples.EXAMPLES:
        scaling = json.loads((REPORTS / name / "scaling.json").read_text())
        nodes = [p["nodes"] for p in scaling["points"]]
        assert nodes == [1, 2, 4, 8, 16, 32, 64, 128]
