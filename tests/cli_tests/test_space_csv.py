"""`autotune space --all --csv FILE`: every feasible layout, beyond the 10,000 of --top."""

from __future__ import annotations

import contextlib
import csv
import io
import json
from pathlib import Path

from autotune.cli.app import _run
from autotune.cli.app import app
from autotune.frameworks import get_framework
from autotune.layout import Layout


def _invoke(args: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = _run(app, args)
    return code, out.getvalue(), err.getvalue()


def test_every_feasible_layout_is_written(tmp_path: Path) -> None:
    """Oracle: the enumeration's own count (`feasible` in the JSON of the same run, above the
    10,000 that --top and --json stop at) and `Layout.parse`, the reader of --layout: the file
    holds one row per feasible layout, each distinct, fastest first; each row's text reads back
    as the layout of its columns; each estimate lies inside its interval."""
    path = tmp_path / "layouts.csv"
    code, out, err = _invoke(["space", "-m", "llama3-8b", "-c", "dgx-h100:64", "--all",
                              "--csv", str(path), "--json"])
    assert code == 0, err
    feasible = json.loads(out)["feasible"]
    assert feasible > 10_000
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert len(rows) == feasible and f"wrote {feasible:,} of {feasible:,}" in err
    assert len({r["layout_id"] for r in rows}) == len({r["layout"] for r in rows}) == feasible
    tokens = [float(r["tokens_per_s"]) for r in rows]
    assert tokens == sorted(tokens, reverse=True)
    assert [int(r["rank"]) for r in rows] == list(range(1, feasible + 1))
    bundle = get_framework("megatron")
    for r in rows[:: max(1, feasible // 500)]:
        layout = Layout.parse(r["layout"], 512, 512, bundle)
        assert (layout.dp, layout.gas, layout.id) == (int(r["dp"]), int(r["gas"]),
                                                      r["layout_id"])
        assert float(r["tokens_per_s_low"]) <= float(r["tokens_per_s"]) <= float(
            r["tokens_per_s_high"])
        assert float(r["step_time_s_low"]) <= float(r["step_time_s"]) <= float(
            r["step_time_s_high"])
        assert r["interval"].endswith("step time")


def test_all_needs_a_file_and_a_file_must_be_writable(tmp_path: Path) -> None:
    """Oracle: the CLI's error contract (one line naming the option and the fix, exit 2)."""
    code, _, err = _invoke(["space", "-m", "llama3-8b", "-c", "dgx-h100:1", "--all"])
    assert code == 2 and "--all" in err and "--csv FILE" in err and len(err.splitlines()) == 1
    code, _, err = _invoke(["space", "-m", "llama3-8b", "-c", "dgx-h100:1", "--csv",
                            str(tmp_path / "missing" / "x.csv")])
    assert code == 2 and "--csv: cannot write" in err and len(err.splitlines()) == 1
