"""`compare`: several tune/scale/plan output folders side by side (Markdown, HTML, JSON, plots).

Runs may differ in cluster, model, framework or date. Each row shows the run's best layout and
its throughput, MFU and memory (for a sweep without a study: the sweep's layout at the largest
size that ran; for a plan: its chosen cluster, else its fastest, with days and cost), and its
scaling efficiency; one figure overlays the scaling curves.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from markupsafe import Markup

from autotune.numbers import num
from autotune.report import data
from autotune.report import plots
from autotune.report.render import Table
from autotune.report.render import layout_text
from autotune.report.render import pct
from autotune.report.render import render_template
from autotune.report.render import tflops
from autotune.units import GIB

COMPARE_PLOTS = {
    "compare_best": "Best throughput per GPU and MFU of each run.",
    "compare_scaling": "Scaling curves of the runs' sweeps: throughput and efficiency against "
                       "GPUs (each against its own smallest size that ran).",
}
"""The comparison's figures (plots/NAME.svg) with their captions."""


def _names(dirs: Sequence[str | Path]) -> list[str]:
    names: list[str] = []
    for directory in map(Path, dirs):
        name = directory.resolve().name or str(directory)
        names.append(name if name not in names else f"{name} ({len(names) + 1})")
    return names


def _plan_row(name: str, directory: Path, doc: dict[str, Any]) -> dict[str, Any]:
    """A plan folder's row: its chosen cluster (else its fastest), with the predicted curve of
    that cluster type (every size re-optimised)."""
    ran = [p for p in doc["points"] if p["status"] == "ok"]
    chosen = next((p for p in ran if p["name"] == doc.get("chosen")), None)
    point = chosen or min(ran, key=lambda p: p["days"], default=None)
    curve = [{**p, "flag": p.get("mark") or "fine"} for p in ran
             if point is not None and p["cluster"] == point["cluster"]]
    inputs = doc["inputs"]
    best = None
    if point is not None:
        peak = point.get("peak_memory_bytes")
        best = {"layout": layout_text(point["layout_fields"]),
                "source": f"plan: {'chosen' if chosen else 'fastest'} {point['name']}",
                "gpus": point["gpus"], "tokens_per_s": point["tokens_per_s"],
                "tokens_per_s_per_gpu": point["tokens_per_s"] / point["gpus"],
                "tflops_per_gpu": None, "mfu": point.get("mfu"),
                "peak_memory_gib": peak / GIB if peak else None,
                "days": point["days"], "cost": point.get("cost")}
    largest = curve[-1] if curve else None
    return {
        "name": name, "directory": str(directory), "kind": "plan",
        "inputs": {"model": inputs["model"],
                   "cluster": point["name"] if point else ", ".join(inputs["clusters"]),
                   "gpus": point["gpus"] if point else None,
                   "gpu": point["gpu"] if point else "–",
                   "framework": (doc.get("setup") or {}).get("framework", "–"),
                   "runner": None,
                   "figures": "predicted" + ("" if doc.get("calibrated") else ", uncalibrated")},
        "best": best,
        "scaling": {"mode": "plan, re-optimised per size", "base_gpus": curve[0]["gpus"],
                    "largest_gpus": largest["gpus"],
                    "efficiency_at_largest": largest["efficiency"],
                    "flag_at_largest": largest["flag"]} if largest else None,
        "curve": curve,
    }


def _headline(run: data.RunData, summary: dict[str, Any]) -> dict[str, Any] | None:
    """The run's best layout (measured or simulated), or its sweep's largest point that ran."""
    best = summary["best"]
    if best:
        return {"layout": layout_text(best["layout_fields"]),
                "source": f"trial {best['trial']}", "gpus": run.cfg.world_size,
                "tokens_per_s": best["tokens_per_s"],
                "tokens_per_s_per_gpu": best["tokens_per_s_per_gpu"],
                "tflops_per_gpu": best["tflops_per_gpu"], "mfu": best["mfu"],
                "peak_memory_gib": best["peak_memory_gib"]}
    if not run.scaling:
        return None
    ran = [p for p in run.scaling["points"] if p.get("efficiency") is not None]
    if not ran:
        return None
    point = ran[-1]
    fields = {**run.scaling["layout"], "dp": point["dp"], "gas": point["gas"]}
    peak = point.get("peak_memory_bytes")
    return {"layout": layout_text(fields),
            "source": f"sweep at {point['gpus']} GPUs", "gpus": point["gpus"],
            "tokens_per_s": point["tokens_per_s"],
            "tokens_per_s_per_gpu": point["tokens_per_s"] / point["gpus"],
            "tflops_per_gpu": point.get("tflops_per_gpu"), "mfu": point.get("mfu"),
            "peak_memory_gib": peak / GIB if peak else None}


def comparison_rows(dirs: Sequence[str | Path]) -> list[dict[str, Any]]:
    """One flat record per folder: inputs, best layout and figures, scaling efficiency."""
    rows = []
    for name, directory in zip(_names(dirs), dirs, strict=True):
        plan = data.read_plan(directory)
        if plan is not None:
            rows.append(_plan_row(name, Path(directory), plan))
            continue
        run = data.load_run(directory)
        summary = data.summary(run)
        scaling = summary["scaling"]
        rows.append({
            "name": name,
            "directory": str(run.directory),
            "kind": run.kind,
            "inputs": summary["inputs"],
            "best": _headline(run, summary),
            "scaling": scaling,
            "curve": [p for p in (run.scaling or {}).get("points", [])
                      if p.get("efficiency") is not None],
        })
    return rows


def _table(rows: list[dict[str, Any]], out: Path) -> Table:
    """Side by side: one column per run, one row per figure."""
    columns: list[list[str]] = []
    for row in rows:
        i, b, s = row["inputs"], row["best"] or {}, row["scaling"]
        scaling = efficiency = mode = "–"
        if s and s["largest_gpus"]:
            mode = s["mode"]
            scaling = f"{s['mode']}, {s['base_gpus']} → {s['largest_gpus']} GPUs"
            efficiency = f"{s['efficiency_at_largest']:.2f} ({s['flag_at_largest']})"
        page = "plan.md" if row["kind"] == "plan" else "report.md"
        report = Path(os.path.relpath(Path(row["directory"]) / page, out)).as_posix()
        columns.append([
            i["model"], i["cluster"], f"{i['gpus'] or '–'} × {i['gpu']}", i["framework"],
            i["runner"] or "–", i["figures"], mode,
            f"{i['seq_length']:,}" if i.get("seq_length") else "–",
            _batch(row) if i.get("global_batch_size") else "–",
            i.get("precision") or "–", b.get("layout", "–"), b.get("source", "–"),
            num(b.get("tokens_per_s")), num(b.get("tokens_per_s_per_gpu")),
            tflops(b.get("tflops_per_gpu")), pct(b.get("mfu")),
            num(b.get("peak_memory_gib"), 1), num(b.get("days"), 1), num(b.get("cost")),
            scaling, efficiency, report,
        ])
    labels = ["model", "cluster", "GPUs", "framework", "runner", "figures", "scaling mode",
              "sequence length", "global batch (sequences)", "precision", "best layout", "from",
              "tokens/s", "tokens/s per GPU", "TFLOP/s per GPU", "MFU", "peak memory (GiB)",
              "days to train (plan)", "cost (plan)", "scaling sweep",
              "efficiency at largest size", "report"]
    table = Table(["", *[row["name"] for row in rows]], [], "l" + "r" * len(rows))
    for k, label in enumerate(labels):
        table.rows.append([label, *[column[k] for column in columns]])
    return table


def _batch(row: dict[str, Any]) -> str:
    """The run's global batch in sequences; a sweep's at its smallest and largest sizes that ran
    (a weak sweep grows it with the GPUs)."""
    scaling = row["scaling"]
    if not (scaling and scaling["largest_gpus"]):
        return f"{row['inputs']['global_batch_size']:,}"
    ran = [p for p in scaling["points"] if p.get("efficiency") is not None]
    first, last = ran[0]["global_batch_size"], ran[-1]["global_batch_size"]
    return f"{first:,}" if first == last else f"{first:,} → {last:,}"


def caveats(rows: list[dict[str, Any]]) -> list[str]:
    """Why the runs' figures are not like for like: different scaling modes, sequence lengths,
    global batches or precisions (each named with the runs' values)."""
    notes = []
    modes = {row["scaling"]["mode"] for row in rows if row["scaling"]}
    if len(modes) > 1:
        notes.append("weak and strong sweeps side by side: a weak sweep grows the global batch "
                     "with the GPUs, a strong one keeps it, so their efficiencies answer "
                     "different questions")
    for key, label in (("seq_length", "sequence lengths"),
                       ("global_batch_size", "global batches"), ("precision", "precisions")):
        values = sorted({_batch(row) if key == "global_batch_size" else str(row["inputs"][key])
                         for row in rows if row["inputs"].get(key) is not None})
        if len(values) > 1:
            notes.append(f"different {label} ({', '.join(values)}): throughput per GPU and MFU "
                         "are not like for like")
    return notes


def _efficiency_table(rows: list[dict[str, Any]]) -> Table | None:
    sizes = sorted({p["gpus"] for row in rows for p in row["curve"]})
    if not sizes:
        return None
    table = Table(["GPUs", *[row["name"] for row in rows]], [], "r" * (len(rows) + 1))
    for n in sizes:
        cells = [str(n)]
        for row in rows:
            point = next((p for p in row["curve"] if p["gpus"] == n), None)
            cells.append(f"{point['efficiency']:.2f} {point['flag']}" if point else "–")
        table.rows.append(cells)
    return table


def compare(dirs: Sequence[str | Path], out_dir: str | Path) -> dict[str, Path]:
    """Write compare.md, compare.html, compare.json and plots/compare_*.svg into out_dir.

    Args:
        dirs: Output folders of `autotune tune` and/or `autotune scale`.
        out_dir: Destination folder (created).

    Returns:
        File name → path of everything written.

    Raises:
        AutotuneError: when a folder holds neither a study nor scaling.json.
    """
    out = Path(out_dir)
    (out / "plots").mkdir(parents=True, exist_ok=True)
    rows = comparison_rows(dirs)
    svgs: dict[str, str] = {}
    names = [row["name"] for row in rows]
    bests = [row["best"] or {} for row in rows]
    if any(bests):
        svgs["compare_best"] = plots.compare_best(
            names, [b.get("tokens_per_s_per_gpu") for b in bests], [b.get("mfu") for b in bests])
    curves = [(row["name"], row["curve"]) for row in rows if row["curve"]]
    if curves:
        svgs["compare_scaling"] = plots.scaling_curves(curves)
    written: dict[str, Path] = {}
    for name, svg in svgs.items():
        written[f"plots/{name}.svg"] = out / "plots" / f"{name}.svg"
        written[f"plots/{name}.svg"].write_text(svg)
    doc = data.rounded({"schema": "autotune.compare/1", "caveats": caveats(rows),
                        "runs": [{k: v for k, v in row.items() if k not in ("curve", "directory")}
                                 for row in rows]})
    written["compare.json"] = out / "compare.json"
    written["compare.json"].write_text(json.dumps(doc, indent=2) + "\n")
    context = {
        "runs": _table(rows, out),
        "efficiency": _efficiency_table(rows),
        "caveats": caveats(rows),
        "plots": {name: {"svg": Markup(svg), "file": f"plots/{name}.svg",
                         "caption": COMPARE_PLOTS[name]} for name, svg in svgs.items()},
        "layouts": [(row["name"], (row["best"] or {}).get("layout", "–")) for row in rows],
    }
    for name in ("compare.md", "compare.html"):
        written[name] = out / name
        written[name].write_text(render_template(f"{name}.j2", **context))
    return written
