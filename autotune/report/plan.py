"""A plan's report: plan.md, plan.html and plots/plan_*.svg from plan.json (as
`autotune.planning.build.Plan.to_dict` writes it), so `autotune report` and `autotune compare`
read a plan folder like any other.

Every figure is the model's prediction; a figure with an interval shows it (low–high), one
without carries the "uncalibrated" mark.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from markupsafe import Markup

from autotune.numbers import compact
from autotune.numbers import num
from autotune.numbers import with_interval
from autotune.report import plots
from autotune.report.render import Table
from autotune.report.render import gib
from autotune.report.render import layout_text
from autotune.report.render import pct
from autotune.report.render import render_template
from autotune.scaling import PART_LABELS

PLAN_PLOTS = {
    "plan_days_cost": "Predicted days to train and cost against GPUs, one line per cluster "
                      "type (shaded: the prediction interval, when calibrated); the star is "
                      "the chosen cluster.",
    "plan_efficiency": "Predicted scaling efficiency (tokens/s per GPU against the type's "
                       "smallest size that fits) with the 0.7 and 0.5 lines; measured points "
                       "come from --verify-sizes.",
}
"""The plan's figures (plots/NAME.svg) with their captions."""


def cause_text(point: dict[str, Any], labels: dict[str, str]) -> str:
    """'pipeline bubble (−12.0%)', or '' at the base and where nothing grew (`labels`: how
    the plan names its causes, plan.json's cause_labels)."""
    if not point.get("cause") or point.get("cause_loss") is None:
        return ""
    label = labels.get(point["cause"], PART_LABELS.get(point["cause"], point["cause"]))
    return f"{label} (−{point['cause_loss']:.1%})"


def plan_table(doc: dict[str, Any]) -> Table:
    """One row per cluster size: layout, throughput, days, GPU-hours, cost, efficiency."""
    ran = [p for p in doc["points"] if p["status"] == "ok"]
    sources = {p["interval"] for p in ran}
    shared = sources.pop() if len(sources) == 1 else None
    batches = len({p["global_batch_tokens"] for p in doc["points"]}) > 1
    columns = ["cluster", "GPUs", *(["batch (tokens)"] if batches else []), "best layout",
               *([] if shared else ["interval"]),
               f"tokens/s ({shared})" if shared else "tokens/s", "days", "GPU-hours", "cost",
               "efficiency", "costs the efficiency"]
    rows = []
    for p in doc["points"]:
        head = [p["name"], num(p["gpus"]),
                *([compact(p["global_batch_tokens"])] if batches else [])]
        if p["status"] != "ok":
            rows.append([*head, f"infeasible: {p['reason']}", *([] if shared else [""]),
                         "–", "–", "–", "–", "–", ""])
            continue
        eff = p.get("efficiency")
        rows.append([
            *head, layout_text(p["layout_fields"]), *([] if shared else [p["interval"]]),
            with_interval(p["tokens_per_s"], p["tokens_per_s_low"], p["tokens_per_s_high"]),
            with_interval(p["days"], p["days_low"], p["days_high"], 1),
            with_interval(p["gpu_hours"], p["gpu_hours_low"], p["gpu_hours_high"], short=True),
            with_interval(p["cost"], p["cost_low"], p["cost_high"], short=True),
            f"{eff:.2f} {p.get('mark') or ''}".strip() if eff is not None else "–",
            cause_text(p, doc.get("cause_labels") or {}),
        ])
    align = "nr" + ("r" if batches else "") + "n" + ("" if shared else "l") + "rrrrrn"
    return Table(columns, rows, align)


def threshold_lines(doc: dict[str, Any]) -> list[str]:
    """Per cluster type and line: how far it stays above, where it falls below, and why."""
    lines = []
    for t in doc["thresholds"]:
        line = f"{t['line']:g}"
        if t["name"]:
            cause = cause_text({"cause": t["cause"], "cause_loss": t["cause_loss"]},
                               doc.get("cause_labels") or {})
            lines.append(f"{t['cluster']}: efficiency falls below {line} at {t['name']} "
                         f"({t['gpus']:,} GPUs, {t['efficiency']:.2f}"
                         + (f"; costs most: {cause}" if cause else "") + ")"
                         + (f"; last size above: {t['last_above']}" if t["last_above"] else ""))
        elif t["last_above"] and not any(
                o["cluster"] == t["cluster"] and o["line"] > t["line"] and not o["name"]
                for o in doc["thresholds"]):
            lines.append(f"{t['cluster']}: efficiency stays at or above {line} up to "
                         f"{t['last_above']}")
    return lines


def inputs_table(doc: dict[str, Any]) -> Table:
    """The plan's inputs and what its figures rest on."""
    i, setup = doc["inputs"], doc.get("setup") or {}
    batch = ("held at the smallest size's" if i.get("max_gbs_tokens") is None
             else f"grown with the GPUs up to {num(i['max_gbs_tokens'])} tokens")
    batches = sorted({p["global_batch_tokens"] for p in doc["points"]})
    if len(batches) == 1:
        batch += f": {num(batches[0])} tokens at every size"
    rows = [
        ["model", i["model"]], ["tokens to train", num(doc["tokens"])],
        ["framework", setup.get("framework", "–")],
        ["sequence length", num(setup.get("seq_length"))],
        ["precision", setup.get("precision", "–")],
        ["global batch", batch], ["prices per GPU-hour", i.get("price") or "–"],
        ["constants", doc["constants"]],
        ["intervals", "calibrated" if doc["calibrated"] else "uncalibrated (no interval for "
                      "these GPUs and stack: figures are the model's point predictions)"],
    ]
    if i.get("deadline") is not None:
        rows.append(["deadline", f"{i['deadline']:g} days"])
    if i.get("budget") is not None:
        rows.append(["budget", num(i["budget"])])
    return Table(["input", "value"], rows, "ll")


def verified_table(doc: dict[str, Any]) -> Table | None:
    """The measured curve of --verify-sizes: measured against predicted per size."""
    verified = doc.get("verified")
    if not verified:
        return None
    rows = []
    for p in verified["points"]:
        rows.append([str(p["gpus"]), p["status"], num(p.get("tokens_per_s")),
                     num(p.get("predicted_tokens_per_s")),
                     f"{p['efficiency']:.2f}" if p.get("efficiency") is not None else "–",
                     f"{p['predicted_efficiency']:.2f}"
                     if p.get("predicted_efficiency") is not None else "–",
                     gib(p.get("peak_memory_bytes")), (p.get("reason") or "")[:80]])
    columns = ["GPUs", "status", f"{verified['label']} tokens/s", "predicted tokens/s",
               "efficiency", "predicted efficiency", "peak GiB", "reason"]
    return Table(columns, rows, "rlrrrrrl")


def verified_lines(doc: dict[str, Any]) -> list[str]:
    """What the verification says about the chosen plan, in words."""
    verified = doc.get("verified")
    if not verified:
        return []
    lines = [f"{verified['label'].capitalize()} with the {verified['runner']} runner: the layout "
             f"of {verified['layout_of']} (`{verified['layout']['text']}`) at "
             + ", ".join(str(p["gpus"]) for p in verified["points"]) + " GPUs (weak scaling: "
             "each replica keeps its batch)."]
    if verified.get("ratio_at_largest"):
        lines.append(
            f"At {verified['largest_gpus']} GPUs the {verified['label']} throughput is "
            f"{verified['ratio_at_largest']:.2f}x the predicted; the chosen size's days scaled "
            f"by it: {num(verified['corrected_days'], 1)} (a corrected prediction, not a "
            "measurement of that size).")
    return lines


def _series(doc: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]]]]:
    clusters = list(dict.fromkeys(p["cluster"] for p in doc["points"]))
    return [(c, [p for p in doc["points"] if p["cluster"] == c and p["status"] == "ok"])
            for c in clusters]


def plan_plots(doc: dict[str, Any]) -> dict[str, str]:
    """SVG text of the plan's figures, by name."""
    series = [(name, points) for name, points in _series(doc) if points]
    if not series:
        return {}
    chosen = next((p for p in doc["points"] if p["name"] == doc.get("chosen")), None)
    measured = [p for p in (doc.get("verified") or {}).get("points", [])
                if p.get("efficiency") is not None]
    return {"plan_days_cost": plots.plan_days_cost(series, chosen),
            "plan_efficiency": plots.plan_efficiency(series, chosen, measured)}


def write_plan_report(doc: dict[str, Any], out_dir: str | Path) -> dict[str, Path]:
    """Write plan.md, plan.html and plots/plan_*.svg for a plan (plan.json's content).

    Returns:
        File name → path of everything written.
    """
    out = Path(out_dir)
    (out / "plots").mkdir(parents=True, exist_ok=True)
    svgs = plan_plots(doc)
    written: dict[str, Path] = {}
    for name, svg in svgs.items():
        written[f"plots/{name}.svg"] = out / "plots" / f"{name}.svg"
        written[f"plots/{name}.svg"].write_text(svg)
    chosen = doc.get("chosen")
    context = {
        "doc": doc,
        "title": f"Training plan: {doc['inputs']['model']}, {compact(doc['tokens'])} tokens",
        "inputs": inputs_table(doc),
        "plan": plan_table(doc),
        "choices": [c["message"] for c in doc["choices"]],
        "chosen": next((p for p in doc["points"] if p["name"] == chosen), None),
        "thresholds": threshold_lines(doc),
        "verified": verified_table(doc),
        "verified_lines": verified_lines(doc),
        "plots": {name: {"svg": Markup(svg), "file": f"plots/{name}.svg",
                         "caption": PLAN_PLOTS[name]} for name, svg in svgs.items()},
        "pct": pct,
    }
    for name in ("plan.md", "plan.html"):
        written[name] = out / name
        written[name].write_text(render_template(f"{name}.j2", **context))
    return written
