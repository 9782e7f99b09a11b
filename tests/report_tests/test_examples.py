"""The committed example reports in reports/ agree with their own Optuna studies.

Each study folder keeps its Optuna study (study.journal) and run.json. The tests read that study
with Optuna itself and check the report against it and against the documented summary.json
schema (README); they do not rerun the study (that would only compare the code with itself).
Rendering the report again from the folder's own storage must give the committed files: a stale
report fails here after a change to the report code.
"""

from __future__ import annotations

import collections
import csv
import json
from pathlib import Path

import optuna
import pytest
from helpers_report import EXTERNAL
from helpers_report import SCHEMA
from optuna.storages import JournalStorage
from optuna.storages.journal import JournalFileBackend

from autotune.report import write_report

REPORTS = Path(__file__).resolve().parents[2] / "reports"
STUDIES = sorted(path.parent.name for path in REPORTS.glob("*/run.json"))
COMPARISON = "comparison"
HINT = "reports/ is stale: run `python -m autotune.report.examples` and commit reports/"
SWEEPS = {  # README and reports/README.md: what each example sweeps
    "simulate-llama3-70b-dgx-h100-16": ("strong", [1, 2, 4, 8, 16, 32, 64, 128]),
    "simulate-llama3-70b-dgx-a100-16": ("strong", [1, 2, 4, 8, 16, 32, 64, 128]),
    "local-cpu-tiny-gpt": ("weak", [1, 1, 1]),
}
"""Sweep mode and nodes per point (the local sweep runs 1, 2 and 4 processes on one node)."""


def summary(name: str) -> dict:
    return json.loads((REPORTS / name / "summary.json").read_text())


def trials(name: str) -> list[optuna.trial.FrozenTrial]:
    """The example's trials, read by Optuna from the folder's own journal."""
    run = json.loads((REPORTS / name / "run.json").read_text())
    assert run["storage"] == "journal:study.journal"
    storage = JournalStorage(JournalFileBackend(str(REPORTS / name / "study.journal")))
    return optuna.load_study(study_name=run["study_name"], storage=storage).get_trials()


def test_every_example_is_checked() -> None:
    """Oracle: reports/README.md lists these three study folders."""
    assert STUDIES == sorted(SWEEPS)


@pytest.mark.parametrize("name", STUDIES)
def test_summary_follows_the_documented_schema(name: str) -> None:
    """Oracle: the summary.json schema documented in the README (keys in this order, figures
    `simulated` for the simulate runner and `measured` otherwise)."""
    doc = summary(name)
    assert list(doc) == SCHEMA[""] and doc["schema"] == "autotune.report/1"
    for section in ("inputs", "study", "best", "prediction", "scaling"):
        assert list(doc[section]) == SCHEMA[section], section
    assert all(list(row) == SCHEMA["best"] for row in doc["runners_up"])
    assert all(list(row) == SCHEMA["failures"] for row in doc["failures"])
    figures = "simulated" if doc["inputs"]["runner"] == "simulate" else "measured"
    assert doc["inputs"]["figures"] == figures


@pytest.mark.parametrize("name", STUDIES)
def test_summary_agrees_with_its_optuna_study(name: str) -> None:
    """Oracle: Optuna's reading of the example's own study.journal: the trial count and
    statuses, the best trial (highest measured tokens/s among those that ran ok) and its
    figures, the runners-up in order, and trials.csv's one row per trial."""
    doc, found = summary(name), trials(name)
    statuses = collections.Counter(t.user_attrs["status"] for t in found)
    ok = sorted((t for t in found if t.user_attrs["status"] == "ok"),
                key=lambda t: -t.user_attrs["measured_tokens_per_s"])
    assert doc["study"] == {"trials": len(found), "ran": sum(bool(t.user_attrs.get("ran"))
                                                             for t in found),
                            "ok": len(ok), "by_status": dict(sorted(statuses.items()))}
    ranked = [doc["best"], *doc["runners_up"]]
    assert [row["trial"] for row in ranked] == [t.number for t in ok[:len(ranked)]]
    for row, trial in zip(ranked, ok, strict=False):
        assert row["layout_id"] == trial.user_attrs["layout_id"]
        assert row["tokens_per_s"] == pytest.approx(trial.value, rel=1e-5)
        assert row["step_time_s"] == pytest.approx(trial.user_attrs["measured_step_time_s"],
                                                   rel=1e-5)
    assert doc["prediction"]["trials"] == len(ok)
    with (REPORTS / name / "trials.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert [(int(r["number"]), r["state"], r["status"]) for r in rows] == [
        (t.number, t.state.name, t.user_attrs["status"]) for t in found]


@pytest.mark.parametrize("name", STUDIES)
def test_scaling_follows_its_definition(name: str) -> None:
    """Oracle: the README's definition, worked out from each point's own throughput:
    efficiency = (tokens/s at N / N) / (tokens/s at base / base), base the smallest size that
    ran; flagged fine at >= 0.7, communication-limited at 0.5-0.7, communication-bound below."""
    scaling = json.loads((REPORTS / name / "scaling.json").read_text())
    mode, nodes = SWEEPS[name]
    assert scaling["mode"] == mode and [p["nodes"] for p in scaling["points"]] == nodes
    ran = [p for p in scaling["points"] if p["status"] == "ok"]
    assert ran and scaling["base_gpus"] == ran[0]["gpus"]
    base = ran[0]["tokens_per_s"] / ran[0]["gpus"]
    for point in ran:
        efficiency = point["tokens_per_s"] / point["gpus"] / base
        assert point["efficiency"] == pytest.approx(efficiency, rel=1e-4)
        flag = "fine" if efficiency >= 0.7 else "limited" if efficiency >= 0.5 else "bound"
        assert flag in point["flag"]
    assert summary(name)["scaling"]["efficiency_at_largest"] == pytest.approx(
        ran[-1]["efficiency"], rel=1e-4)


@pytest.mark.parametrize("name", STUDIES)
def test_report_renders_again_from_its_own_storage(name: str, tmp_path: Path) -> None:
    """Freshness check, not an oracle: the report rendered now from the folder's own study and
    sweep equals the committed files (fails when the report code changed and reports/ was not
    regenerated)."""
    written = write_report(REPORTS / name, out_dir=tmp_path)
    for file in ("summary.json", "report.md", "trials.csv"):
        assert written[file].read_text() == (REPORTS / name / file).read_text(), (
            f"{name}/{file}: {HINT}")


def test_comparison_agrees_with_the_examples() -> None:
    """Oracle: each example's own summary.json: the comparison shows every study folder with its
    best throughput and scaling mode."""
    runs = json.loads((REPORTS / COMPARISON / "compare.json").read_text())["runs"]
    assert sorted(run["name"] for run in runs) == STUDIES
    for run in runs:
        doc = summary(run["name"])
        assert run["best"]["tokens_per_s"] == doc["best"]["tokens_per_s"]
        assert run["scaling"]["mode"] == doc["scaling"]["mode"]


@pytest.mark.parametrize("name", [*STUDIES, COMPARISON])
def test_example_html_is_self_contained(name: str) -> None:
    """Oracle: the HTML standard's fetching attributes (helpers_report.EXTERNAL): no page makes
    a browser reach the network."""
    pages = list((REPORTS / name).glob("*.html"))
    assert pages
    for page in pages:
        assert not EXTERNAL.search(page.read_text()), page
