"""Scaling sweeps: one layout at several cluster sizes, its efficiency and what limits it.

At every size tp, pp, cp (and vpp, zero, offload, mbs, recompute, sp) stay fixed and dp grows.
Weak scaling keeps the per-replica batch (mbs·gas) so the global batch grows with dp; strong
scaling keeps the global batch so gas shrinks. Efficiency at N GPUs is
(throughput_N / N) / (throughput_base / base), base being the smallest size that ran; the field
notes' thresholds flag each point (>= 0.7 fine, 0.5-0.7 communication-limited, < 0.5
communication-bound). The predicted step-time breakdown, normalised per GPU and per token, names
the part that grew: with parts p_i in GPU·seconds per token, predicted efficiency is
Σ p_i(base) / Σ p_i(N), so part i costs (p_i(N) − p_i(base)) / Σ p_i(N) of efficiency. The
parts fold into the causes a user acts on (`CAUSES`: communication, pipeline bubble, memory
traffic, compute and recompute); a point below the fine threshold is flagged by the cause that
cost most (`bubble-limited`, `communication-bound`, ...), never by communication alone.

Example:
    >>> from autotune import Layout, load_config
    >>> from autotune.runners.simulate import SimulateRunner
    >>> cfg = load_config("llama3-8b", "dgx-h100:1")
    >>> layout = Layout(tp=2, dp=4, zero=1, mbs=1, gas=128, recompute="selective", sp=True)
    >>> result = sweep(cfg, layout, [8, 16, 32], "weak", SimulateRunner(), "/tmp/scale")
    >>> [p.status for p in result.points]
    ['ok', 'ok', 'ok']
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from typing import Literal

from autotune.costmodel.estimate import estimate
from autotune.costmodel.step_time import TIME_PARTS
from autotune.exceptions import AutotuneError
from autotune.layout import Layout
from autotune.runners.base import Runner
from autotune.specs import AutotuneConfig
from autotune.trial import TrialPipeline
from autotune.units import GIB

Mode = Literal["weak", "strong"]
MODES = ("weak", "strong")
SCALING_JSON = "scaling.json"
SCALING_CSV = "scaling.csv"
FINE = "fine"
FINE_AT = 0.7
"""Efficiency at or above which a point is fine (the field notes: below 0.7, look at what grew)."""
BOUND_BELOW = 0.5
"""Efficiency below which a point is bound by its cause (the field notes: change the layout)."""

CAUSES: dict[str, tuple[str, ...]] = {
    "communication": ("tp_comm", "cp_comm", "pp_p2p", "dp_comm", "zero3_gather", "ep_comm"),
    "bubble": ("pp_bubble",),
    "memory": ("offload", "optimizer"),
    "compute": ("compute",),
}
"""The causes of lost efficiency, each the step-time parts (`TIME_PARTS`) it sums: collectives
and sends; the pipeline bubble; host-memory traffic and the optimizer step (memory-bound);
compute, recompute included."""
THRESHOLDS = (
    f"efficiency = (tokens/s per GPU) / (the smallest size's); >= {FINE_AT} fine; "
    f"{BOUND_BELOW}-{FINE_AT} <cause>-limited (look at it); < {BOUND_BELOW} <cause>-bound "
    "(change the layout); the cause is the one whose predicted share per GPU and token grew "
    "most: " + ", ".join(CAUSES)
)
"""The flags' meaning, printed with every scaling table."""

PART_LABELS = {
    "compute": "compute",
    "tp_comm": "TP collectives",
    "cp_comm": "CP K/V exchange",
    "pp_bubble": "pipeline bubble",
    "pp_p2p": "pipeline sends",
    "dp_comm": "DP gradient reduce",
    "zero3_gather": "ZeRO-3 gathers",
    "offload": "CPU offload",
    "optimizer": "optimizer step",
    "ep_comm": "EP all-to-all",
}
"""Readable names of the step-time parts (`autotune.costmodel.step_time.TIME_PARTS`)."""

CSV_COLUMNS = (
    "gpus", "nodes", "gpus_per_node", "dp", "gas", "global_batch_size", "status",
    "tokens_per_s", "tokens_per_s_per_gpu", "step_time_s", "tflops_per_gpu", "mfu",
    "peak_memory_gib", "predicted_tokens_per_s", "efficiency", "predicted_efficiency", "flag",
    "cause", "grew", "grew_loss", *(f"lost_{cause}" for cause in CAUSES), "rule", "reason",
)
"""Columns of scaling.csv, in order (stable)."""


def flag_for(efficiency: float, cause: str = "") -> str:
    """fine (>= 0.7), `<cause>-limited` (0.5-0.7) or `<cause>-bound` (< 0.5); `limited` /
    `bound` alone when the model predicts no cause (the loss is measured only)."""
    if efficiency >= FINE_AT:
        return FINE
    kind = "limited" if efficiency >= BOUND_BELOW else "bound"
    return f"{cause}-{kind}" if cause else kind


def cause_losses(losses: dict[str, float]) -> dict[str, float]:
    """Efficiency (0-1) each cause costs: the sum of its parts' losses (`efficiency_losses`)."""
    return {cause: sum(losses.get(name, 0.0) for name in parts)
            for cause, parts in CAUSES.items()}


@dataclasses.dataclass(frozen=True)
class ScalingPoint:
    """One size of a sweep: its shape, outcome, measurement and diagnosis."""

    gpus: int
    nodes: int
    gpus_per_node: int
    dp: int
    gas: int
    global_batch_size: int
    status: str
    """ok, a failure class of the runner, `infeasible` (a rule) or `skipped` (no such shape)."""
    reason: str = ""
    rule: str = ""
    step_time_s: float | None = None
    tokens_per_s: float | None = None
    tflops_per_gpu: float | None = None
    mfu: float | None = None
    peak_memory_bytes: float | None = None
    predicted_tokens_per_s: float | None = None
    predicted_time_parts: dict[str, float] = dataclasses.field(default_factory=dict)
    """Predicted step-time parts at this size, seconds."""
    efficiency: float | None = None
    predicted_efficiency: float | None = None
    flag: str = ""
    grew: str = ""
    """The step-time part whose per-GPU, per-token share grew most against the base."""
    grew_loss: float | None = None
    """Efficiency (0-1) that the growth of `grew` costs, predicted."""
    lost: dict[str, float] = dataclasses.field(default_factory=dict)
    """Efficiency (0-1) each cause (`CAUSES`) costs against the base, predicted."""
    cause: str = ""
    """The cause that costs most (empty when none grew)."""
    directory: str = ""
    """Where the point's files are, relative to the sweep's output folder."""

    @property
    def ok(self) -> bool:
        """True when the point ran and measured a throughput."""
        return self.status == "ok" and bool(self.tokens_per_s)

    @property
    def tokens_per_s_per_gpu(self) -> float | None:
        """Measured tokens per second per GPU."""
        return self.tokens_per_s / self.gpus if self.tokens_per_s else None

    def to_dict(self) -> dict[str, Any]:
        """Plain fields plus tokens_per_s_per_gpu, for JSON."""
        return {**dataclasses.asdict(self), "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu}


@dataclasses.dataclass(frozen=True)
class ScalingResult:
    """A finished sweep: the layout, the mode, the inputs and every point (by size)."""

    mode: str
    layout: Layout
    config: AutotuneConfig
    runner: str
    points: list[ScalingPoint]

    @property
    def base(self) -> ScalingPoint | None:
        """The smallest size that ran."""
        return next((p for p in self.points if p.ok), None)

    def to_dict(self) -> dict[str, Any]:
        """JSON form (scaling.json)."""
        base = self.base
        return {
            "schema": "autotune.scaling/1",
            "mode": self.mode,
            "runner": self.runner,
            "layout": {**self.layout.to_dict(), "text": self.layout.text, "id": self.layout.id},
            "base_gpus": base.gpus if base else None,
            "thresholds": THRESHOLDS,
            "inputs": self.config.model_dump(mode="json"),
            "points": [p.to_dict() for p in self.points],
        }

    def rows(self) -> list[dict[str, Any]]:
        """One flat dict per point with the CSV columns (peak memory in GiB)."""
        rows = []
        for p in self.points:
            data = p.to_dict()
            peak = data.pop("peak_memory_bytes")
            data["peak_memory_gib"] = peak / GIB if peak else None
            data.update({f"lost_{cause}": p.lost.get(cause) for cause in CAUSES})
            rows.append({key: data.get(key) for key in CSV_COLUMNS})
        return rows

    def save(self, out_dir: str | Path) -> dict[str, Path]:
        """Write scaling.json and scaling.csv into out_dir."""
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        json_path, csv_path = out / SCALING_JSON, out / SCALING_CSV
        json_path.write_text(json.dumps(_rounded(self.to_dict()), indent=2) + "\n")
        with csv_path.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=CSV_COLUMNS, lineterminator="\n")
            writer.writeheader()
            for row in self.rows():
                writer.writerow({k: _cell(v) for k, v in row.items()})
        return {"scaling.json": json_path, "scaling.csv": csv_path}


def _rounded(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _rounded(v) for k, v in data.items()}
    if isinstance(data, list):
        return [_rounded(v) for v in data]
    if isinstance(data, float):
        return float(f"{data:.6g}")
    return data


def _cell(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return value


# --- shapes -----------------------------------------------------------------------------------


def resized(cfg: AutotuneConfig, gpus: int, global_batch_size: int) -> AutotuneConfig:
    """The same cluster with `gpus` GPUs: whole nodes, or one node of `gpus` GPUs if fewer.

    Raises:
        AutotuneError: when `gpus` exceeds one node but does not fill whole nodes.
    """
    per_node = cfg.cluster.gpus_per_node
    if gpus <= per_node:
        nodes, per_node_n = 1, gpus
    elif gpus % per_node:
        raise AutotuneError(
            f"{gpus} GPUs do not fill whole nodes of {per_node}; use a multiple of {per_node}"
        )
    else:
        nodes, per_node_n = gpus // per_node, per_node
    prefix = cfg.cluster.name.partition(":")[0]
    name = f"{prefix}:{nodes}" if per_node_n == per_node else f"{prefix}:1 ({gpus} GPUs)"
    cluster = cfg.cluster.model_copy(
        update={"nodes": nodes, "gpus_per_node": per_node_n, "name": name}
    )
    train = cfg.train.model_copy(update={"global_batch_size": global_batch_size})
    return cfg.model_copy(update={"cluster": cluster, "train": train})


def default_sizes(cfg: AutotuneConfig, layout: Layout) -> list[int]:
    """Powers-of-two GPU counts up to the cluster: sub-node sizes, then 1, 2, 4, … nodes.

    Only sizes that hold one model replica (tp·pp·cp GPUs) are listed.
    """
    per_node, world = cfg.cluster.gpus_per_node, cfg.world_size
    replica = layout.model_parallel
    sizes = {2**i for i in range(int(math.log2(per_node)) + 1)}
    nodes = 1
    while nodes * per_node <= world:
        sizes.add(nodes * per_node)
        nodes *= 2
    sizes.add(world)
    return sorted(n for n in sizes if n >= replica and n <= world)


def _shape(
    cfg: AutotuneConfig, layout: Layout, gpus: int, mode: str
) -> tuple[AutotuneConfig, Layout] | str:
    """The config and layout at `gpus` GPUs, or why that size has no such shape."""
    try:
        sized = layout.resized(gpus, mode, cfg.train.global_batch_size)
        return resized(cfg, gpus, sized.global_batch_size), sized
    except AutotuneError as error:
        return str(error)


# --- the sweep --------------------------------------------------------------------------------


def efficiency_losses(
    base: Mapping[str, float], base_gpus: int, base_tokens: float,
    parts: Mapping[str, float], gpus: int, tokens: float,
) -> tuple[float | None, dict[str, float]]:
    """Predicted efficiency at `gpus` against the base and what each part's growth costs.

    Args:
        base, parts: step-time parts (seconds, any names) at the base size and at `gpus`.
        base_gpus, gpus: the GPU counts; base_tokens, tokens: the tokens per step at each.

    Returns:
        Σ p(base) / Σ p(N) (None when the parts are all zero) and, by name,
        (p(N) − p(base)) / Σ p(N), with p the parts in GPU·seconds per token.
    """
    names = list(dict.fromkeys([*base, *parts]))
    norm_base = {n: base.get(n, 0.0) * base_gpus / base_tokens for n in names}
    norm = {n: parts.get(n, 0.0) * gpus / tokens for n in names}
    total = sum(norm.values())
    if total <= 0:
        return None, {n: 0.0 for n in names}
    return sum(norm_base.values()) / total, {n: (norm[n] - norm_base[n]) / total for n in names}


def _diagnose(points: list[ScalingPoint]) -> list[ScalingPoint]:
    """Fill efficiency, flag and the part that grew, against the smallest size that ran."""
    base = next((p for p in points if p.ok), None)
    if base is None:
        return points
    base_rate = base.tokens_per_s / base.gpus  # type: ignore[operator]
    base_parts = {name: base.predicted_time_parts.get(name, 0.0) for name in TIME_PARTS}
    out = []
    for p in points:
        if not p.ok:
            out.append(p)
            continue
        efficiency = p.tokens_per_s / p.gpus / base_rate  # type: ignore[operator]
        predicted, losses = efficiency_losses(
            base_parts, base.gpus, base.global_batch_size,
            {name: p.predicted_time_parts.get(name, 0.0) for name in TIME_PARTS},
            p.gpus, p.global_batch_size)
        grew = max(losses, key=lambda name: losses[name])
        changed = p.gpus != base.gpus and predicted is not None and losses[grew] >= 1e-3
        lost = cause_losses(losses) if p.gpus != base.gpus and predicted is not None else {}
        cause = max(lost, key=lambda name: lost[name]) if lost else ""
        cause = cause if cause and lost[cause] >= 1e-3 else ""
        out.append(dataclasses.replace(
            p,
            efficiency=efficiency,
            predicted_efficiency=predicted,
            flag=flag_for(efficiency, cause),
            grew=grew if changed else "",
            grew_loss=losses[grew] if changed else None,
            lost=lost,
            cause=cause,
        ))
    return out


def _run_point(
    cfg: AutotuneConfig, layout: Layout, index: int, runner: Runner, out_dir: Path
) -> ScalingPoint:
    gpus = cfg.world_size
    shape: dict[str, Any] = {
        "gpus": gpus, "nodes": cfg.cluster.nodes, "gpus_per_node": cfg.cluster.gpus_per_node,
        "dp": layout.dp, "gas": layout.gas, "global_batch_size": layout.global_batch_size,
        "directory": f"scale/{gpus}",
    }
    pipeline = TrialPipeline(cfg, runner)
    broken = pipeline.violations(layout)
    if broken:
        prediction = estimate(cfg, layout, pipeline.constants)
        rule, reason = broken[0]
        return ScalingPoint(**shape, predicted_tokens_per_s=prediction.tokens_per_s,
                            predicted_time_parts=dict(prediction.time_parts),
                            status="infeasible", rule=rule, reason=reason)
    result = pipeline.run(layout, number=index, directory=out_dir / "scale" / str(gpus))
    prediction, m = result.prediction, result.measurement
    predicted: dict[str, Any] = {
        "predicted_tokens_per_s": prediction.tokens_per_s,
        "predicted_time_parts": dict(prediction.time_parts),
    }
    directory = result.directory
    directory.mkdir(parents=True, exist_ok=True)
    point = ScalingPoint(
        **shape, **predicted, status=m.status, reason=m.reason[:500],
        step_time_s=m.step_time_s, tokens_per_s=m.tokens_per_s,
        tflops_per_gpu=m.tflops_per_gpu, mfu=m.mfu, peak_memory_bytes=m.peak_memory_bytes,
    )
    doc = {"layout": layout.text, "cluster": cfg.cluster.name, "measurement": m.to_dict(),
           "predicted": prediction.to_dict()}
    (directory / "point.json").write_text(json.dumps(_rounded(doc), indent=2) + "\n")
    return point


def sweep(
    cfg: AutotuneConfig,
    layout: Layout,
    gpus: list[int],
    mode: Mode,
    runner: Runner,
    out_dir: str | Path,
) -> ScalingResult:
    """Run `layout` at each GPU count with `runner`; write scaling.json and scaling.csv.

    Args:
        cfg: Model, cluster and training setup; the cluster's node type is resized per point
            (nodes = N / gpus_per_node, or one node of N GPUs below a node).
        layout: The layout to scale; its tp, pp, cp, vpp, zero, offload, mbs, recompute and sp
            stay fixed. Weak mode keeps its per-replica batch mbs·gas; strong mode keeps
            cfg.train.global_batch_size.
        gpus: GPU counts to run (any order; duplicates ignored).
        mode: "weak" or "strong".
        runner: Runs each point (TrialPlan in out_dir/scale/<N>/, rendered configs there when
            the runner needs them).
        out_dir: Folder for scaling.json, scaling.csv and scale/<N>/.

    Returns:
        Every point, in ascending size, with efficiency, flag and the part that grew.

    Raises:
        AutotuneError: on an unknown mode, a GPU count below 1, or a size the runner cannot
            run (`Runner.check`, before any point runs).
    """
    if mode not in MODES:
        raise AutotuneError(f"--mode: {mode!r} must be weak or strong")
    sizes = sorted(set(gpus))
    if not sizes or sizes[0] < 1:
        raise AutotuneError(f"--gpus: {gpus} must be positive GPU counts, e.g. 8,16,32")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    shapes = [_shape(cfg, layout, n, mode) for n in sizes]
    for shape in shapes:  # the runner refuses what it cannot run before the first point
        if not isinstance(shape, str):
            runner.check(shape[0])
    points: list[ScalingPoint] = []
    runner.prepare()
    try:
        for index, (n, shape) in enumerate(zip(sizes, shapes, strict=True)):
            if isinstance(shape, str):
                points.append(_skipped(n, cfg, layout, shape))
                continue
            points.append(_run_point(*shape, index, runner, out))
    finally:
        runner.cleanup()
    result = ScalingResult(mode, layout, cfg, runner.name, _diagnose(points))
    result.save(out)
    return result


def _skipped(gpus: int, cfg: AutotuneConfig, layout: Layout, reason: str) -> ScalingPoint:
    per_node = cfg.cluster.gpus_per_node
    return ScalingPoint(
        gpus=gpus, nodes=max(1, -(-gpus // per_node)), gpus_per_node=min(gpus, per_node),
        dp=gpus // layout.model_parallel, gas=0, global_batch_size=0, status="skipped",
        reason=reason,
    )


def read_scaling(out_dir: str | Path) -> dict[str, Any] | None:
    """scaling.json of an output folder as a dict, or None when the folder has none."""
    path = Path(out_dir) / SCALING_JSON
    if not path.is_file():
        return None
    scaling: dict[str, Any] = json.loads(path.read_text())
    return scaling


def text_table(result: ScalingResult | dict[str, Any]) -> str:
    """The sweep as a fixed-width text table (for logs, benchmarks and notes)."""
    data = result.to_dict() if isinstance(result, ScalingResult) else result
    head = ("GPUs", "nodes", "dp", "gas", "gbs", "status", "tokens/s", "tok/s/GPU", "eff",
            "pred eff", "flag", "grew (eff lost)", "lost to")
    lines = [head]
    for p in data["points"]:
        rate = p.get("tokens_per_s")
        grew = ""
        if p.get("grew"):
            grew = f"{PART_LABELS.get(p['grew'], p['grew'])} (-{p['grew_loss']:.1%})"
        lines.append((
            str(p["gpus"]), str(p["nodes"]), str(p["dp"] or "-"), str(p["gas"] or "-"),
            str(p["global_batch_size"] or "-"), p["status"],
            f"{rate:,.0f}" if rate else "-",
            f"{rate / p['gpus']:,.0f}" if rate else "-",
            f"{p['efficiency']:.2f}" if p.get("efficiency") is not None else "-",
            f"{p['predicted_efficiency']:.2f}" if p.get("predicted_efficiency") is not None
            else "-",
            p.get("flag") or (p.get("rule") or p.get("reason", ""))[:40],
            grew, lost_text(p.get("lost") or {}),
        ))
    widths = [max(len(row[i]) for row in lines) for i in range(len(head))]
    return "\n".join(
        "  ".join(cell.rjust(w) if i not in (5, 10, 11, 12) else cell.ljust(w)
                  for i, (cell, w) in enumerate(zip(row, widths, strict=True))).rstrip()
        for row in lines
    ) + "\n" + THRESHOLDS


def lost_text(lost: dict[str, float]) -> str:
    """The causes that cost at least 0.1% of efficiency, largest first: `bubble 40.0%, ...`."""
    shown = sorted(((v, k) for k, v in lost.items() if v >= 1e-3), reverse=True)
    return ", ".join(f"{cause} {value:.1%}" for value, cause in shown)
