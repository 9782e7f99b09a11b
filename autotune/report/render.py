"""`write_report`: report.md, report.html, trials.csv, summary.json and plots/ for one folder.

The templates live in `templates/report/` (Jinja, StrictUndefined). The context is built here
from `autotune.report.data` as small tables of already formatted strings, so both templates
only lay them out. report.html is self-contained: its plots are inline SVG and its style is
inline CSS, with no network reference.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import re
from collections import Counter
from pathlib import Path
from typing import Any

from markupsafe import Markup

from autotune import templating
from autotune.costmodel.constants import constants_for
from autotune.costmodel.estimate import estimate
from autotune.costmodel.memory import MEMORY_PARTS
from autotune.costmodel.memory import usable_gpu_bytes
from autotune.costmodel.step_time import TIME_PARTS
from autotune.costmodel.uncertainty import Interval
from autotune.costmodel.uncertainty import prediction_interval
from autotune.costmodel.uncertainty import range_note
from autotune.costmodel.uncertainty import with_range
from autotune.layout import Layout
from autotune.numbers import num
from autotune.report import data
from autotune.report import plots
from autotune.scaling import PART_LABELS
from autotune.scaling import lost_text
from autotune.space.rules import MEMORY_RULE_NAMES
from autotune.templating import register_filters
from autotune.units import GIB
from autotune.verify import read_verify

PLOT_CAPTIONS = {
    "memory_breakdown": "Predicted memory per GPU of the winner and runners-up, by part; "
                        "diamonds are the {label} peaks, the dashed line the usable memory.",
    "time_breakdown": "Predicted step time of the winner and runners-up, by part; diamonds are "
                      "the {label} step times.",
    "throughput_over_trials": "{Label} throughput of every trial in study order; trials that "
                              "yielded none are marked by outcome along the bottom edge; the "
                              "axis starts at 0 only when the throughputs cover most of it.",
    "memory_vs_throughput": "Peak memory per GPU ({label} when known, else predicted) against "
                            "throughput; right of the dashed line a layout does not fit; trials "
                            "without a throughput are marked along the bottom edge. Trials "
                            "rejected by structural rules have no memory and are not shown.",
    "predicted_vs_measured": "The model's throughput prediction against the {label} throughput "
                             "of each trial that ran.",
    "scaling": "Scaling sweep: throughput and efficiency per size (efficiency = throughput per "
               "GPU relative to the smallest size that ran).",
    "scaling_breakdown": "Predicted step-time parts per size, normalised per GPU and per token "
                         "to the base size: perfect scaling keeps the bars flat; the part that "
                         "grows is what costs efficiency.",
    "outcomes": "How many trials ended in each outcome.",
}
"""Every plot a report can hold (file plots/NAME.svg), with its caption ({label}: measured or
simulated, `autotune.runners.factory.figure_label`)."""
FIGURES_NOTE = {
    "measured": "Measured figures come from the runner, predicted ones from autotune's memory "
                "and step-time model; error = (predicted − measured) / measured throughput.",
    "simulated": "Simulated figures: the simulate runner ran no training; its figures are "
                 "autotune's own model with perturbed constants, predicted ones the unperturbed "
                 "model; error = (predicted − simulated) / simulated throughput.",
}
"""The note above the winners' table, by figure label."""


NOT_RAN = {"infeasible": "rejected by rules", "duplicate": "repeats of a layout already run"}
"""How the study line names the trials that did not run, by status."""


def _not_ran(records: list[dict[str, Any]]) -> str:
    """`, the other 5 did not: 3 rejected by rules, 2 repeats ...`, or nothing when every trial
    ran."""
    counts = Counter(str(r.get("status") or "unknown") for r in records if not r.get("ran"))
    if not counts:
        return ""
    parts = ", ".join(f"{n} {NOT_RAN.get(status, status)}"
                      for status, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])))
    total = sum(counts.values())
    return f"; the other {total} did not run: {parts}"


def figures_note(label: str, noise: object = None) -> str:
    """The note above the winners' table: what the figures are. A simulate run at noise 0 ran
    the model's own constants, so its figures are the model's, exactly (errors are 0)."""
    if label == "simulated" and noise is not None and float(str(noise)) == 0:
        return ("Simulated figures at --noise 0: the simulate runner ran no training; its figures "
                "are autotune's own model, exactly, the same as the predicted ones (every error "
                "is 0, and says nothing about the model's accuracy).")
    return FIGURES_NOTE[label]


def caption(name: str, label: str) -> str:
    """The caption of plot `name` for figures that are `label` (measured or simulated)."""
    return PLOT_CAPTIONS[name].format(label=label, Label=label.capitalize())


@dataclasses.dataclass(frozen=True)
class Table:
    """Formatted cells: a header, rows, and per-column alignment ('l' or 'r')."""

    columns: list[str]
    rows: list[list[str]]
    align: str = ""

    def alignment(self, i: int) -> str:
        """'l' or 'r' for column i."""
        return self.align[i] if i < len(self.align) else "l"


# --- formatting -------------------------------------------------------------------------------


def sentence(text: str) -> str:
    """`text` with its first letter capitalised and a full stop."""
    return text[:1].upper() + text[1:] + "."


def pct(value: Any, digits: int = 1) -> str:
    """0.523 → 52.3%."""
    return "–" if value is None else f"{value * 100:.{digits}f}%"


def tflops(value: Any) -> str:
    """TFLOP/s with one decimal, or 3 significant digits below 10 (CPU processes)."""
    if value is None:
        return "–"
    return f"{value:.3g}" if value < 10 else f"{value:,.1f}"


def gib(value: Any) -> str:
    """Bytes as GiB: one decimal, or 2 significant digits below 1 GiB."""
    if value is None:
        return "–"
    v = value / GIB
    return f"{v:.1f}" if v >= 1 or v == 0 else f"{v:.2g}"


def signed_pct(value: Any) -> str:
    """+3.2% / −1.0%."""
    return "–" if value is None else f"{round(value, 1) + 0.0:+.1f}%".replace("-", "−")


def layout_text(fields: dict[str, Any]) -> str:
    """A record's layout fields (extra keys ignored) in the one notation `--layout` reads
    (`Layout.text`)."""
    return Layout(**{f.name: fields[f.name] for f in dataclasses.fields(Layout)
                     if f.name in fields}).text


# --- plots ------------------------------------------------------------------------------------


def _top(run: data.RunData, top_k: int) -> list[dict[str, Any]]:
    return [r for r in run.ranked[: top_k + 1] if r.get("predicted")]


def _memory_points(run: data.RunData) -> list[tuple[float, float, str]]:
    cfg = run.cfg
    k = constants_for(cfg.cluster.gpu, cfg.train.software_stack)
    points = []
    for r in run.records:
        status = r.get("status")
        predicted = (r.get("predicted") or {}).get("peak_memory_bytes")
        memory = r.get("measured_peak_memory_bytes") or predicted
        if status == "ok" and memory and r.get("measured_tokens_per_s"):
            points.append((memory, r["measured_tokens_per_s"], "ok"))
        elif status in data.FAILED and memory:
            points.append((memory, 0.0, status))
        elif status == "infeasible" and r.get("rule") in MEMORY_RULE_NAMES:
            layout = Layout(**r["layout_fields"])
            points.append((estimate(cfg, layout, k).peak_memory_bytes, 0.0, "infeasible"))
    return points


def build_plots(run: data.RunData, top_k: int = 5) -> dict[str, str]:
    """SVG text of every plot the folder has data for, by name (see PLOT_CAPTIONS)."""
    out: dict[str, str] = {}
    cfg = run.cfg
    usable = usable_gpu_bytes(cfg, constants_for(cfg.cluster.gpu, cfg.train.software_stack))
    top = _top(run, top_k)
    if top:
        labels = [f"#{i + 1} {layout_text(r['layout_fields'])}" for i, r in enumerate(top)]
        out["memory_breakdown"] = plots.memory_breakdown(
            labels, [r["predicted"]["memory"]["parts"] for r in top],
            [r.get("measured_peak_memory_bytes") for r in top], usable, run.label)
        out["time_breakdown"] = plots.time_breakdown(
            labels, [r["predicted"]["time"]["parts"] for r in top],
            [r.get("measured_step_time_s") for r in top], run.label)
    if run.records:
        ranked = run.ranked
        out["throughput_over_trials"] = plots.throughput_over_trials(
            [(r["number"], r.get("status", ""), r.get("measured_tokens_per_s"))
             for r in run.records],
            ranked[0]["number"] if ranked else None, run.label)
        memory = _memory_points(run)
        if memory:
            out["memory_vs_throughput"] = plots.memory_vs_throughput(memory, usable, run.label)
        pairs = [(r["measured_tokens_per_s"], r["predicted"]["tokens_per_s"])
                 for r in ranked if r.get("predicted")]
        error = data.prediction_error(run.records)
        if pairs and error:
            winner = pairs[0] if ranked[0].get("predicted") else None
            out["predicted_vs_measured"] = plots.predicted_vs_measured(
                pairs, error["median_abs_error_pct"], winner, run.label)
    if run.scaling:
        ok = [p for p in run.scaling["points"] if p.get("efficiency") is not None]
        if ok:
            out["scaling"] = plots.scaling_curves([("", ok)], label=run.label)
            out["scaling_breakdown"] = plots.scaling_breakdown(ok, ok[0])
    if run.records:
        counts = Counter(r.get("status", "") for r in run.records)
        out["outcomes"] = plots.outcomes(dict(counts))
    return {name: out[name] for name in PLOT_CAPTIONS if name in out}


# --- tables -----------------------------------------------------------------------------------


def _inputs_tables(run: data.RunData) -> dict[str, Table]:
    cfg = run.cfg
    m, c, t = cfg.model, cfg.cluster, cfg.train
    peaks = ", ".join(f"{p} {v:g}" for p, v in c.gpu.peak_tflops.items())
    model = Table(["model", "value"], [
        ["name", m.name], ["parameters", f"{m.num_params() / 1e9:.2f} B"],
        ["layers", str(m.num_layers)], ["hidden size", str(m.hidden_size)],
        ["attention heads / KV groups", f"{m.num_attention_heads} / {m.query_groups}"],
        ["FFN hidden size", str(m.ffn)], ["vocabulary", f"{m.vocab_size:,}"],
        ["activation / norm", f"{m.activation} / {m.normalization}"],
    ])
    cluster = Table(["cluster", "value"], [
        ["name", c.name], ["GPUs", f"{c.world_size} ({c.nodes} nodes × {c.gpus_per_node})"],
        ["GPU", f"{c.gpu.name}, {c.gpu.memory_gb:g} GB, {c.gpu.hbm_tb_s:g} TB/s HBM"],
        ["peak dense TFLOP/s", peaks],
        ["intra-node link (per GPU, per direction)", f"{c.intra_node_gb_s:g} GB/s"],
        ["inter-node link (per GPU, per direction)", f"{c.inter_node_gb_s:g} GB/s"],
        ["host memory per node / PCIe", f"{c.host_memory_gb:g} GB / {c.pcie_gb_s:g} GB/s"],
        *([["cost-model constants", f"calibration {c.gpu.calibration}"]]
          if c.gpu.calibration else []),
    ])
    info = run.run_info
    options = ", ".join(f"{k}={v}" for k, v in sorted((info.get("runner_options") or {}).items()))
    train_rows = [
        ["framework", t.framework], ["precision", t.precision],
        ["sequence length", f"{t.seq_length:,} tokens"],
        ["global batch", f"{t.global_batch_size:,} sequences ({t.tokens_per_step:,} tokens)"],
        ["runner", (run.runner or "–") + (f" ({options})" if options else "")],
    ]
    if run.study_name:
        train_rows.append(["study", f"{run.study_name} in {run.storage}"])
    if info.get("command"):
        train_rows.append(["command", str(info["command"])])
    return {"model": model, "cluster": cluster,
            "train": Table(["training and search", "value"], train_rows)}


def _winners_table(summary: dict[str, Any], label: str, band: Interval | None) -> Table | None:
    rows = [summary["best"], *summary["runners_up"]] if summary["best"] else []
    if not rows:
        return None
    table = Table(
        ["#", "trial", "layout", "dp", "gas", f"tokens/s ({label})", "predicted", "error",
         "TFLOP/s/GPU", "MFU", "pred. MFU", "peak GiB", "pred. GiB"],
        [], "rrlrrrrrrrrrr")
    for h in rows:
        p, f = h["predicted"], h["layout_fields"]
        table.rows.append([
            str(h["rank"]), str(h["trial"]), layout_text(f), str(f["dp"]), str(f["gas"]),
            num(h["tokens_per_s"]), with_range(p["tokens_per_s"], band),
            signed_pct(h["error_pct"]),
            tflops(h["tflops_per_gpu"]), pct(h["mfu"]), pct(p["mfu"]),
            num(h["peak_memory_gib"], 1), num(p["peak_memory_gib"], 1),
        ])
    return table


def _parts_table(record: dict[str, Any], label: str) -> tuple[Table, Table]:
    predicted = record["predicted"]
    memory, time = predicted["memory"], predicted["time"]
    mem = Table(["memory part", "GiB", "share"], [], "lrr")
    for name in MEMORY_PARTS:
        value = memory["parts"].get(name, 0.0)
        if value:
            mem.rows.append([plots.MEMORY_LABELS[name], gib(value), pct(value / memory["total"])])
    mem.rows.append(["total (predicted)", gib(memory["total"]), "100%"])
    if record.get("measured_peak_memory_bytes"):
        mem.rows.append([f"{label} peak", gib(record["measured_peak_memory_bytes"]), ""])
    step = Table(["step-time part", "seconds", "share"], [], "lrr")
    for name in TIME_PARTS:
        value = time["parts"].get(name, 0.0)
        if value:
            step.rows.append([PART_LABELS[name], f"{value:.3f}", pct(value / time["total"])])
    step.rows.append(["total (predicted)", f"{time['total']:.3f}", "100%"])
    if record.get("measured_step_time_s"):
        step.rows.append([label, f"{record['measured_step_time_s']:.3f}", ""])
    return mem, step


MEASURED_PARTS = (
    (("compute",), ("compute",), "compute"),
    (("tp_comm",), ("tp_comm",), "TP collectives"),
    (("cp_comm",), ("cp_comm",), "CP exchange"),
    (("ep_comm",), ("ep_comm",), "EP all-to-all"),
    (("dp_comm", "zero3_gather"), ("dp_comm", "zero3_gather"), "DP reduce + ZeRO gathers"),
    (("pp_p2p",), ("pp_bubble", "pp_p2p"), "pipeline send/recv + bubble wait"),
    (("optimizer",), ("optimizer",), "optimizer step"),
    (("offload",), ("offload",), "CPU offload copies"),
    (("data",), (), "data loading"),
)
"""(measured parts, the predicted parts they cover, label): a trial's instruments cannot tell
a pipeline's bubble from its transfers (a recv waits for both); ZeRO-3 gathers share a row
with gradient reduction (Megatron-LM's timers do not separate them)."""


def measured_parts_table(record: dict[str, Any]) -> Table | None:
    """Predicted beside measured seconds per part of one trial (`breakdown` from its trial
    program or the framework's timers); None when the trial measured no parts."""
    breakdown = record.get("breakdown")
    predicted = (record.get("predicted") or {}).get("time", {}).get("parts", {})
    if not isinstance(breakdown, dict) or not breakdown.get("parts"):
        return None
    measured = breakdown["parts"]
    table = Table(["step-time part", "predicted s", "measured s"], [], "lrr")
    for keys, covers, name in MEASURED_PARTS:
        guess = sum(predicted.get(p, 0.0) for p in covers) if covers else None
        found = [measured[k] for k in keys if k in measured]
        value = sum(found) if found else None
        if guess or value:
            table.rows.append([name, "–" if guess is None else f"{guess:.3f}",
                               "–" if value is None else f"{value:.3f}"])
    table.rows.append(["not covered by a part", "",
                       f"{breakdown.get('unattributed_s', 0.0):.3f}"])
    total = (record.get("predicted") or {}).get("step_time_s")
    table.rows.append(["step time", "–" if total is None else f"{total:.3f}",
                       f"{breakdown['step_time_s']:.3f}"])
    return table


def verify_verdict(result: dict[str, Any] | None) -> str:
    """One sentence on `autotune verify`'s loss-curve comparison ("" when it did not run)."""
    if not result:
        return ""
    steps = len(result.get("winner_losses") or [])
    against = (f"the winner ({result['winner']}) against pure data parallelism "
               f"({result['reference']}) over {steps} measured steps")
    if result.get("passed"):
        return (f"Loss curves agree: {against}, largest relative difference "
                f"{result['max_rel_diff']:.1e} within the {result['tolerance']:g} tolerance.")
    return f"Loss curves DISAGREE: {against}: {result.get('reason', '')}"


def scaling_table(scaling: dict[str, Any], label: str = "measured") -> Table:
    """The sweep's points: shape, outcome, throughput, efficiency, flag and what grew."""
    table = Table(
        ["GPUs", "nodes", "dp", "gas", "global batch", "status", f"tokens/s ({label})",
         "tokens/s/GPU",
         "efficiency", "predicted eff.", "flag or reason", "efficiency lost to",
         "grew most (efficiency lost)"],
        [], "rrrrrlrrrrlll")
    for p in scaling["points"]:
        rate = p.get("tokens_per_s")
        grew = ""
        if p.get("grew"):
            grew = f"{PART_LABELS.get(p['grew'], p['grew'])} (−{p['grew_loss'] * 100:.1f}%)"
        note = p.get("flag") or (f"{p['rule']}: " if p.get("rule") else "") + p.get("reason", "")
        table.rows.append([
            str(p["gpus"]), str(p["nodes"]), str(p["dp"] or "–"), str(p["gas"] or "–"),
            str(p["global_batch_size"] or "–"), p["status"], num(rate),
            num(rate / p["gpus"]) if rate else "–",
            num(p.get("efficiency"), 2) if p.get("efficiency") is not None else "–",
            num(p.get("predicted_efficiency"), 2)
            if p.get("predicted_efficiency") is not None else "–",
            note, lost_text(p.get("lost") or {}), grew,
        ])
    return table


def _scaling_verdict(summary: dict[str, Any]) -> str:
    s = summary["scaling"]
    if not s or s["largest_gpus"] is None:
        return "No size of the sweep ran, so there is no efficiency to report."
    last = next(p for p in s["points"] if p["gpus"] == s["largest_gpus"])
    text = (f"{s['mode'].capitalize()} scaling of `{s['layout']}` from {s['base_gpus']} to "
            f"{s['largest_gpus']} GPUs: efficiency {last['efficiency']:.2f} at the largest size "
            f"({last['flag']}).")
    if last.get("grew"):
        text += (f" The part that grew most is {PART_LABELS.get(last['grew'], last['grew'])}, "
                 f"costing {last['grew_loss'] * 100:.1f}% of efficiency by the model.")
    worst = min((p for p in s["points"] if p["efficiency"] is not None),
                key=lambda p: p["efficiency"])
    if worst["flag"] != "fine":
        cause = worst.get("cause") or ""
        text += (f" At {worst['gpus']} GPUs the efficiency is {worst['efficiency']:.2f} "
                 f"({worst['flag']}): {_REMEDY.get(cause, 'the model predicts no cause')}.")
    return text


_REMEDY = {
    "communication": "look at the collectives (lower tp or cp, keep them inside a node, a "
                     "faster interconnect, overlap)",
    "bubble": "the pipeline bubble grew (more micro-batches per step: a larger global batch "
              "or fewer pp stages, or more virtual stages)",
    "memory": "host-memory traffic grew (less offload)",
    "compute": "compute per token grew (recompute or a smaller micro-batch)",
}
"""What to try when a cause (`autotune.scaling.CAUSES`) limits a sweep."""


def highlights(run: data.RunData, summary: dict[str, Any], band: Interval | None) -> list[str]:
    """The report's opening bullets (Markdown inline code in backticks; `band`: the setup's
    prediction interval)."""
    lines = []
    best, study = summary["best"], summary["study"]
    if best:
        p = best["predicted"]
        lines.append(
            f"Winner ({run.label} figures): `{best['layout']}` (dp={best['layout_fields']['dp']}, "
            f"gas={best['layout_fields']['gas']}), trial {best['trial']}: "
            f"{num(best['tokens_per_s'])} tokens/s ({num(best['tokens_per_s_per_gpu'])} per GPU), "
            f"{tflops(best['tflops_per_gpu'])} TFLOP/s per GPU, MFU {pct(best['mfu'])}, "
            f"peak memory {num(best['peak_memory_gib'], 1)} GiB; predicted "
            f"{with_range(p['tokens_per_s'], band)} tokens/s "
            f"({signed_pct(best['error_pct'])} off).")
    elif run.records:
        lines.append(f"No trial yielded a {run.label} throughput: see the failures below.")
    if study:
        outcomes = ", ".join(f"{n} {s}" for s, n in sorted(
            study["by_status"].items(), key=lambda kv: (-kv[1], kv[0])))
        lines.append(f"Study: {study['trials']} trials ({outcomes}); {study['ran']} ran on the "
                     f"{run.runner or 'the'} runner{_not_ran(run.records)}.")
        if run.confidence:
            lines.append(_confidence_line(run.confidence))
    if summary["prediction"]:
        e = summary["prediction"]
        lines.append(
            f"Prediction: median |error| {e['median_abs_error_pct']:.1f}% over {e['trials']} "
            f"trials (max {e['max_abs_error_pct']:.1f}%, mean {signed_pct(e['bias_pct'])}).")
    if run.scaling:
        lines.append(_scaling_verdict(summary))
    return lines


def _confidence_line(c: dict[str, Any]) -> str:
    """How sure the search is: the chance an untried layout wins, the terms it found off."""
    off = [f"{name} x{scale:.2f}" for name, scale in c.get("term_scales", {}).items()
           if abs(scale - 1) >= 0.1]
    stopped = " (the study stopped early on it)" if c.get("stopped_early") else ""
    return (f"Confidence: an untried layout of the {c['untried']} expected to fit beats the "
            f"winner by more than the noise ({pct(c['noise'])}) with probability "
            f"{pct(c['probability'])}{stopped}, given the model refitted to the trials "
            f"and its residuals; terms the trials found off: {', '.join(off) or 'none'}.")


def _failures_table(summary: dict[str, Any]) -> Table | None:
    if not summary["failures"]:
        return None
    table = Table(["outcome", "rule", "trials", "reasons (most frequent first)"], [], "llrl")
    for f in summary["failures"]:
        reasons = "; ".join(f["reasons"]) or "–"
        table.rows.append([f["status"], f["rule"] or "–", str(f["count"]), reasons])
    return table


def _all_trials_table(run: data.RunData) -> Table:
    table = Table(["trial", "status", "layout", f"tokens/s ({run.label})", "predicted",
                   "peak GiB", "rule / reason"], [], "rllrrrl")
    for row in data.trial_rows(run.records):
        peak = row["measured_peak_memory_gib"] or row["predicted_peak_memory_gib"]
        note = " ".join(filter(None, [row["rule"], row["reason"]]))
        if row["duplicate_of"] is not None:
            note = f"same layout as trial {row['duplicate_of']}"
        table.rows.append([
            str(row["number"]), row["status"], row["layout"] or "–",
            num(row["measured_tokens_per_s"]), num(row["predicted_tokens_per_s"]),
            num(peak, 1), note[:140],
        ])
    return table


def _configs(run: data.RunData, summary: dict[str, Any]) -> dict[str, Any]:
    best = run.directory / "best"
    launch: dict[str, str] = {}
    files: list[str] = []
    if best.is_dir():
        files = sorted(p.name for p in best.iterdir() if p.is_file())
        manifest = best / "manifest.json"
        if manifest.is_file():
            launch = json.loads(manifest.read_text()).get("launch", {})
    folders = Table(["#", "folder", "layout"], [], "rll")
    for h in [summary["best"], *summary["runners_up"]] if summary["best"] else []:
        if h["configs"]:
            folders.rows.append([str(h["rank"]), f"{h['configs']}/", h["layout"]])
    return {"best": "best/" if best.is_dir() else None, "files": files, "launch": launch,
            "folders": folders}


# --- writing ----------------------------------------------------------------------------------


def md_cell(value: Any) -> str:
    """A Markdown table cell: pipes escaped, one line."""
    return " ".join(str(value).split()).replace("|", "\\|")


def md_table(table: Table) -> str:
    """A Markdown pipe table."""
    rule = ["---:" if table.alignment(i) == "r" else ":---" for i in range(len(table.columns))]
    lines = [table.columns, rule, *table.rows]
    return "\n".join("| " + " | ".join(md_cell(c) for c in line) + " |" for line in lines)


def inline_code(text: str) -> Markup:
    """HTML-escape text and turn `backticks` into <code>."""
    escaped = str(Markup.escape(text))
    return Markup(re.sub(r"`([^`]+)`", r"<code>\1</code>", escaped))


register_filters("report", md_cell=md_cell, md_table=md_table, inline_code=inline_code)


def render_template(name: str, **context: Any) -> str:
    """Render templates/report/NAME."""
    return templating.render_template(name, kind="report", **context)


def write_csv(path: Path, columns: tuple[str, ...], rows: list[dict[str, Any]]) -> None:
    """rows as CSV (floats to 6 significant digits, None as empty)."""
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=columns, lineterminator="\n")
        writer.writeheader()
        for row in rows:
            writer.writerow({k: ("" if v is None else f"{v:.6g}" if isinstance(v, float) else v)
                             for k, v in row.items()})


def report_context(run: data.RunData, summary: dict[str, Any], svgs: dict[str, str],
                   top_k: int = 5) -> dict[str, Any]:
    """Everything the report templates show, formatted."""
    cfg = run.cfg
    band = prediction_interval(cfg)
    top = _top(run, top_k)
    memory_table, time_table = _parts_table(top[0], run.label) if top else (None, None)
    return {
        "title": f"{cfg.model.name} on {cfg.cluster.name}",
        "subtitle": (f"{cfg.world_size} × {cfg.cluster.gpu.name} · {cfg.train.framework} · "
                     f"{run.kind} · runner {run.runner or '–'} ({run.label} figures)"),
        "summary": summary,
        "highlights": highlights(run, summary, band),
        "inputs": _inputs_tables(run),
        "winners": _winners_table(summary, run.label, band),
        "interval_note": sentence(range_note(cfg, band)),
        "figures_note": figures_note(
            run.label, (run.run_info.get("runner_options") or {}).get("noise")),
        "winner_memory": memory_table,
        "winner_time": time_table,
        "winner_parts": measured_parts_table(top[0]) if top else None,
        "verify": verify_verdict(read_verify(run.directory)),
        "all_trials": _all_trials_table(run) if run.records else None,
        "failures": _failures_table(summary),
        "scaling": scaling_table(run.scaling, run.label) if run.scaling else None,
        "scaling_verdict": _scaling_verdict(summary) if run.scaling else "",
        "configs": _configs(run, summary),
        "plots": {name: {"svg": Markup(svg), "file": f"plots/{name}.svg",
                         "caption": caption(name, run.label)} for name, svg in svgs.items()},
    }


def write_report(directory: str | Path, out_dir: str | Path | None = None,
                 top_k: int | None = None, records: list[dict[str, Any]] | None = None,
                 config: dict[str, Any] | None = None,
                 confidence: dict[str, Any] | None = None) -> dict[str, Path]:
    """Regenerate the report of a tune and/or scale output folder.

    Args:
        directory: The folder `autotune tune` or `autotune scale` wrote.
        out_dir: Where to write (default: `directory`).
        top_k: Runners-up to show after the winner (default: run.json's options.top_k, else 5).
        records: The study's trial records, when the caller holds them (`data.load_run`).
        config: The study's inputs, with `records`.
        confidence: The search's confidence in its winner, with `records`.

    Returns:
        File name → path: report.md, report.html, summary.json, trials.csv (with a study)
        and plots/NAME.svg.

    Raises:
        AutotuneError: when the folder holds neither a study nor scaling.json.
    """
    run = data.load_run(directory, records, config, confidence)
    if top_k is None:
        top_k = int((run.run_info.get("options") or {}).get("top_k", 5))
    out = Path(out_dir) if out_dir is not None else run.directory
    (out / "plots").mkdir(parents=True, exist_ok=True)
    svgs = build_plots(run, top_k)
    written: dict[str, Path] = {}
    for name, svg in svgs.items():
        path = out / "plots" / f"{name}.svg"
        path.write_text(svg)
        written[f"plots/{name}.svg"] = path
    summary = data.summary(run, {n: f"plots/{n}.svg" for n in svgs}, top_k)
    written["summary.json"] = out / "summary.json"
    written["summary.json"].write_text(json.dumps(summary, indent=2) + "\n")
    if run.records:
        written["trials.csv"] = out / "trials.csv"
        write_csv(written["trials.csv"], data.TRIAL_COLUMNS, data.trial_rows(run.records))
    context = report_context(run, summary, svgs, top_k)
    for name in ("report.md", "report.html"):
        written[name] = out / name
        written[name].write_text(render_template(f"{name}.j2", **context))
    return written
