"""A plan's report (plan.md, plan.html, plots) and plans in `compare`.

Oracles: the plan's own points (every size appears with its figures formatted as the plan
states them), the documented "uncalibrated" mark, a browser-free check that the HTML fetches
nothing from the network, and compare's contract (one column per folder, a plan's chosen
cluster as its best).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from helpers_report import EXTERNAL

from autotune.numbers import compact
from autotune.numbers import with_interval
from autotune.planning.build import PlanConfig
from autotune.planning.build import make_plan
from autotune.planning.plan import Interval
from autotune.report import compare
from autotune.report.data import read_plan
from autotune.report.plan import write_plan_report

_DDP = "tp: [1, 2, 4, 8]\npp: [1, 2, 4, 8]\nzero: [0]\noffload: [none]\nmbs: [1]\nsp: [true]\n"


@pytest.fixture(scope="module")
def plan_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Llama 3 70B on 2, 8 and 16 DGX H100 with plain DDP: 2 nodes are infeasible."""
    out = tmp_path_factory.mktemp("plan")
    space = out / "ddp.yaml"
    space.write_text(_DDP)
    config = PlanConfig(model="llama3-70b", clusters=("dgx-h100:2,8,16",), tokens="2T",
                        price="2.5", deadline="400d", space=str(space))
    plan = make_plan(config)
    plan.save(out)
    write_plan_report(plan.to_dict(), out)
    return out


def test_every_size_is_in_the_report_with_its_figures(plan_dir: Path) -> None:
    doc = read_plan(plan_dir)
    assert doc is not None
    md = (plan_dir / "plan.md").read_text()
    # H100 + Megatron-Core is calibrated: the column carries its interval, never a bare figure
    assert re.search(r"tokens/s \([+-]\d+%/\+\d+% step time\)", md) and "**predicted**" in md
    assert [p["status"] for p in doc["points"]] == ["infeasible", "ok", "ok"]
    for p in doc["points"]:
        assert f"| {p['name']} |" in md
        if p["status"] == "ok":
            days = with_interval(p["days"], p["days_low"], p["days_high"], 1)
            cost = with_interval(p["cost"], p["cost_low"], p["cost_high"], short=True)
            assert f"| {days} |" in md and f"| {cost} |" in md
        else:
            assert f"infeasible: {p['reason']}" in md
    assert doc["choices"][0]["message"] in md
    chosen = next(p for p in doc["points"] if p["name"] == doc["chosen"])
    assert f"`{chosen['layout']}`" in md


def test_html_is_self_contained_with_both_plots(plan_dir: Path) -> None:
    html = (plan_dir / "plan.html").read_text()
    assert not EXTERNAL.search(html)
    for name in ("plan_days_cost", "plan_efficiency"):
        assert f'id="plot-{name}"' in html
        assert (plan_dir / "plots" / f"{name}.svg").read_text().startswith("<svg")


def test_csv_has_a_row_per_size(plan_dir: Path) -> None:
    lines = (plan_dir / "plan.csv").read_text().splitlines()
    doc = read_plan(plan_dir)
    assert doc is not None
    assert lines[0].startswith("cluster,name,gpu,nodes,gpus,")
    assert [line.split(",")[1] for line in lines[1:]] == [p["name"] for p in doc["points"]]


def test_an_interval_is_printed_low_to_high() -> None:
    assert with_interval(72.44, None, None, 1) == "72.4"
    assert with_interval(72.44, 65.1, 80.2, 1) == "72.4 (65.1–80.2)"
    assert with_interval(71.2e6, 60e6, 80e6, short=True) == "71.2M (60M–80M)"
    assert compact(15.6e12) == "15.6T" and compact(950) == "950"


def test_a_calibrated_plan_drops_the_mark(tmp_path: Path) -> None:
    def band(cfg, prediction):  # type: ignore[no-untyped-def]
        return Interval(0.8 * prediction.tokens_per_s, 1.1 * prediction.tokens_per_s, "±")

    plan = make_plan(PlanConfig(model="llama3-8b", clusters=("dgx-h100:1",), tokens="1T"),
                     interval=band)
    written = write_plan_report(plan.to_dict(), tmp_path)
    md = written["plan.md"].read_text()
    (p,) = plan.points
    assert "uncalibrated" not in md.split("## Inputs")[0]
    assert f"{p.days:,.1f} ({p.days_low:,.1f}–{p.days_high:,.1f})" in md


def test_compare_accepts_a_plan_next_to_a_study(plan_dir: Path, report_dir: Path,
                                                tmp_path: Path) -> None:
    written = compare([plan_dir, report_dir], tmp_path / "cmp")
    doc = json.loads(written["compare.json"].read_text())
    plan_row, tune_row = doc["runs"]
    plan = read_plan(plan_dir)
    assert plan is not None
    assert plan_row["kind"] == "plan" and tune_row["kind"] != "plan"
    assert plan_row["best"]["source"] == f"plan: chosen {plan['chosen']}"
    md = written["compare.md"].read_text()
    chosen = next(p for p in plan["points"] if p["name"] == plan["chosen"])
    assert f"| days to train (plan) | {chosen['days']:,.1f} | – |" in md
    assert "predicted" in md
