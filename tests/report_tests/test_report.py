"""write_report: the files, their stable keys, self-contained HTML and every plot."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest
from helpers_report import EXTERNAL
from helpers_report import SCHEMA

from autotune.exceptions import AutotuneError
from autotune.frameworks import get_framework
from autotune.layout import Layout
from autotune.report import load_run
from autotune.report import write_report
from autotune.report.data import TRIAL_COLUMNS
from autotune.report.render import PLOT_CAPTIONS
from autotune.runners.simulate import SimulateRunner
from autotune.scaling import sweep
from autotune.specs.inputs import load_config


def test_summary_has_stable_keys(report_dir: Path) -> None:
    """Oracle: the summary.json schema documented in the README, and what the fixture study was
    made to do (every fourth trial crashes with a scripted NCCL error; a strong sweep from 8
    GPUs)."""
    summary = json.loads((report_dir / "summary.json").read_text())
    assert list(summary) == SCHEMA[""]
    assert summary["schema"] == "autotune.report/1" and summary["kind"] == "tune+scale"
    assert list(summary["best"]) == SCHEMA["best"]
    assert summary["best"]["configs"] == "best"
    assert summary["best"]["tokens_per_s"] >= max(r["tokens_per_s"]
                                                  for r in summary["runners_up"])
    assert summary["inputs"]["storage"] == "journal:study.journal"
    assert summary["study"]["by_status"]["crash"] >= 1
    crash = next(f for f in summary["failures"] if f["status"] == "crash")
    assert crash["reasons"] == ["NCCL error: unhandled system error"]
    assert summary["scaling"]["mode"] == "strong" and summary["scaling"]["base_gpus"] == 8
    assert summary["prediction"]["trials"] == summary["study"]["ok"]


def test_trials_csv(report_dir: Path) -> None:
    """Oracle: the documented trials.csv contract (one row per trial, in order, the columns the
    README lists) and the fixture's scripted crashes."""
    with (report_dir / "trials.csv").open() as handle:
        rows = list(csv.DictReader(handle))
    assert tuple(rows[0]) == TRIAL_COLUMNS
    assert [int(r["number"]) for r in rows] == list(range(len(rows)))
    assert {r["status"] for r in rows} >= {"ok", "crash"}
    ok = next(r for r in rows if r["status"] == "ok")
    assert float(ok["measured_tokens_per_s"]) > 0 and ok["error_pct"] != ""


def test_html_is_self_contained(report_dir: Path) -> None:
    """Oracle: the HTML standard's fetching attributes (helpers_report.EXTERNAL): nothing reaches
    the network, plots are inline SVG."""
    html = (report_dir / "report.html").read_text()
    assert not EXTERNAL.search(html), EXTERNAL.search(html)
    assert "<img" not in html  # plots are inline SVG, not files


@pytest.mark.parametrize("name", list(PLOT_CAPTIONS))
def test_every_plot_is_present(report_dir: Path, name: str) -> None:
    """Oracle: the documented contract of report.html and report.md: every plot inline as SVG in
    the page and linked as a file from the Markdown."""
    html = (report_dir / "report.html").read_text()
    start = html.index(f'<figure id="plot-{name}"')
    figure = html[start:html.index("</figure>", start)]
    assert "<svg" in figure and "</svg>" in figure and "<path" in figure
    assert f"](plots/{name}.svg)" in (report_dir / "report.md").read_text()
    assert (report_dir / "plots" / f"{name}.svg").read_text().startswith("<svg")


def test_markdown_sections(report_dir: Path) -> None:
    """Oracle: the documented sections of report.md, and the fixture's scripted crash reason."""
    md = (report_dir / "report.md").read_text()
    for heading in ("## Inputs", "## Winner and runners-up", "## The study", "## Scaling",
                    "## Failures by class", "## Configs and how to launch them", "## All trials"):
        assert heading in md
    assert "pretrain_gpt.sh" in md and "best/" in md
    assert "NCCL error: unhandled system error" in md


def test_report_is_deterministic(report_dir: Path, tmp_path: Path) -> None:
    """Property: rendering the same folder twice gives the same files (what lets reports/ be
    checked for staleness)."""
    again = write_report(report_dir, out_dir=tmp_path)
    for name in ("report.md", "summary.json", "trials.csv", "report.html"):
        assert again[name].read_text() == (report_dir / name).read_text(), name


def test_moved_folder_still_reports(study_dir: Path, tmp_path: Path) -> None:
    """Oracle: the documented contract that a study folder stores its storage relative to itself,
    so a copy elsewhere still loads."""
    moved = tmp_path / "moved"
    shutil.copytree(study_dir, moved)
    run = load_run(moved)
    assert run.kind == "tune+scale" and run.records


def test_scale_only_folder(tmp_path: Path) -> None:
    """Oracle: the documented summary.json contract for a scale-only folder: no study section, no
    best, the two scaling plots."""
    cfg = load_config("llama3-8b", "dgx-h100:1")
    layout = Layout.parse("tp=2,zero=1,recompute=selective", 8, 512, get_framework("megatron"))
    sweep(cfg, layout, [2, 4, 8, 16], "weak", SimulateRunner(), tmp_path)
    written = write_report(tmp_path)
    summary = json.loads(written["summary.json"].read_text())
    assert summary["kind"] == "scale" and summary["best"] is None and summary["study"] is None
    assert set(summary["files"]["plots"]) == {"scaling", "scaling_breakdown"}
    assert "trials.csv" not in written
    html = written["report.html"].read_text()
    assert 'id="plot-scaling"' in html and not EXTERNAL.search(html)


def test_folder_without_results(tmp_path: Path) -> None:
    """Oracle: the documented error contract: a folder with nothing to report is one AutotuneError
    naming the problem."""
    with pytest.raises(AutotuneError, match="no study"):
        write_report(tmp_path)


def test_external_reference_detector() -> None:
    """Oracle: hand-written HTML: four ways a page fetches from the network are found; an SVG
    namespace and a local reference are not."""
    for bad in ('<img src="https://x/y.png">', "<link rel=stylesheet href=a.css>",
                '<script src="//cdn/x.js"></script>', "a { background: url(http://x) }"):
        assert EXTERNAL.search(bad), bad
    assert not EXTERNAL.search('<svg xmlns="http://www.w3.org/2000/svg"><use xlink:href="#a"/>')


class _AlwaysOOM(SimulateRunner):
    def run(self, plan):  # type: ignore[no-untyped-def]
        from autotune.measurement import Measurement

        return Measurement("oom", peak_memory_bytes=90e9, reason="CUDA out of memory")


def test_study_where_nothing_ran_ok(tmp_path: Path) -> None:
    """Oracle: what the fake runner was made to do (every trial out of memory, 3 trials, 2 sweep
    sizes): no winner, one failure class of 3, and every plot still present with its empty-state
    text."""
    from autotune.report import write_run_json
    from autotune.search.settings import TuneSettings
    from autotune.search.study import tune
    from autotune.space.search_space import load_space

    cfg = load_config("llama3-8b", "dgx-h100:1")
    storage = f"journal:{tmp_path / 'study.journal'}"
    write_run_json(tmp_path, study_name="all-oom", storage=storage, runner="simulate")
    tune(cfg, load_space(None, "megatron"), _AlwaysOOM(),
         TuneSettings(trials=3, storage=storage, study="all-oom"), tmp_path)
    layout = Layout.parse("tp=2,zero=1", 8, 512, get_framework("megatron"))
    sweep(cfg, layout, [8, 16], "weak", _AlwaysOOM(), tmp_path)
    written = write_report(tmp_path)
    summary = json.loads(written["summary.json"].read_text())
    assert summary["best"] is None and summary["scaling"]["largest_gpus"] is None
    assert summary["failures"][0] == {"status": "oom", "rule": "", "count": 3,
                                      "reasons": ["CUDA out of memory"]}
    md = written["report.md"].read_text()
    assert "No trial yielded a simulated throughput" in md and "No size of the sweep ran" in md
    html = written["report.html"].read_text()
    for name in summary["files"]["plots"]:
        assert f'id="plot-{name}"' in html and f"](plots/{name}.svg)" in md
