"""Ties between layouts the model cannot tell apart (autotune.space.ties), and the CLI's
interval, tie marks and `estimate --vs`."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from autotune.cli.app import _run
from autotune.cli.app import app
from autotune.costmodel.constants import Constants
from autotune.costmodel.estimate import estimate
from autotune.costmodel.uncertainty import Interval
from autotune.costmodel.uncertainty import between_summary
from autotune.frameworks import get_framework
from autotune.layout import Layout
from autotune.space.ties import rank_with_ties
from autotune.specs.inputs import load_config

CFG = load_config("llama3-8b", "dgx-h100:1", seq_length=4096, global_batch_size=64)


def _estimates(*texts: str) -> list:
    layouts = [Layout.parse(t, 8, 64, get_framework("megatron")) for t in texts]
    found = [estimate(CFG, lay, Constants()) for lay in layouts]
    return sorted(found, key=lambda e: e.step_time_s)


def test_ties_go_to_the_simpler_layout() -> None:
    """With low 0.9, high 1.1 two predictions tie when their ratio is at most 1.1/0.9 = 1.22
    (ranges [0.9a, 1.1a] and [0.9b, 1.1b] overlap): the tied group comes first, simplest first
    (fewer pipeline stages before more, no interleaving before interleaving); a layout more than
    1.22x slower keeps its place after the group."""
    found = _estimates("tp=1,pp=1,zero=1,mbs=1", "tp=1,pp=2,zero=1,mbs=1",
                       "tp=1,pp=2,vpp=2,zero=1,mbs=1", "tp=8,pp=1,zero=0,mbs=1,recompute=full")
    band = Interval(0.9, 1.1, rows=3, sources=2, key="test")
    best = found[0].step_time_s
    expect_tied = [e.step_time_s / best <= 1.1 / 0.9 for e in found]
    ranked = rank_with_ties(found, band)
    assert [t for _, t in ranked] == sorted(expect_tied, reverse=True)
    tied = [e.layout for e, t in ranked if t]
    keys = [(lay.zero >= 2, lay.vpp, lay.cp, lay.pp, lay.tp) for lay in tied]
    assert keys == sorted(keys)
    assert rank_with_ties(found, None) == [(e, False) for e in found]


def _invoke(args: list[str]) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = _run(app, args)
    return code, out.getvalue()


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_estimate_json_carries_interval_and_vs(precision: str) -> None:
    """`estimate --json` carries the stored interval of H100 + megatron-core for its regime and,
    with --vs, the other layout's parts; their step times differ as the two estimates do."""
    code, out = _invoke(["estimate", "-m", "llama3-8b", "-c", "dgx-h100:1", "--seq", "4096",
                         "--gbs", "64", "--precision", precision, "-l", "tp=1,zero=1,mbs=1",
                         "--vs", "tp=2,zero=1,mbs=1", "--json"])
    assert code == 0
    data = json.loads(out)
    assert data["interval"]["key"] == f"h100-sxm-80gb/megatron-core/{precision}"
    assert data["interval"]["low"] <= 1 <= data["interval"]["high"]
    assert data["vs"]["layout"]["tp"] == 2 and data["vs"]["step_time_s"] != data["step_time_s"]


def test_space_json_marks_ties_and_custom_gpus_are_uncalibrated(tmp_path) -> None:
    """`space --json` marks each top layout tied or not (tied ones first); a custom GPU without
    `like` has the uncalibrated mark instead of an interval."""
    code, out = _invoke(["space", "-m", "llama3-8b", "-c", "dgx-h100:1", "--seq", "4096",
                         "--gbs", "64", "--top", "5", "--json"])
    assert code == 0
    marks = [row["tied_with_first"] for row in json.loads(out)["top"]]
    assert marks == sorted(marks, reverse=True)
    cluster = tmp_path / "c.yaml"
    cluster.write_text("nodes: 1\ngpus_per_node: 8\ngpu: {memory_gb: 80, peak_tflops: "
                       "{bf16: 989.4}, hbm_tb_s: 3.35}\nintra_node_gb_s: 450\n"
                       "inter_node_gb_s: 50\nhost_memory_gb: 2048\npcie_gb_s: 64\n")
    code, out = _invoke(["estimate", "-m", "llama3-8b", "-c", str(cluster), "--seq", "4096",
                         "--gbs", "64", "-l", "tp=1,zero=1,mbs=1", "--json"])
    assert code == 0 and json.loads(out)["interval"] == "uncalibrated"


def test_the_between_layout_error_decides_ties_where_it_is_known() -> None:
    """Oracle, by hand: with between 1.05 two layouts tie when the slower is at most 1.05x the
    faster, though their ranges [0.9x, 1.3x] overlap up to 1.3/0.9 = 1.44x; the stored ratio is
    the largest max/min within one group of held-out ratios: 1.1/0.95 over 3 + 1 pairs (a
    group of one has no pair)."""
    band = Interval(0.9, 1.3, rows=9, sources=3, key="test", between=1.05)
    assert band.overlaps(1.0, 1.049) and band.overlaps(1.049, 1.0)
    assert not band.overlaps(1.0, 1.06)
    assert Interval(0.9, 1.3, rows=9, sources=3, key="test").overlaps(1.0, 1.4)
    assert between_summary([[1.0, 1.1, 0.95], [1.2], [0.8, 0.84]]) == {
        "ratio": round(1.1 / 0.95, 4), "pairs": 4}
    assert between_summary([[1.2], [0.9]]) is None
