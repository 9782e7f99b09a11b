"""Measured memory and step time on one H200 GPU beside the model's predictions.

Usage:
    python benchmarks/gpu_check.py [--out FILE.md] [--budget-s 360]   # one CUDA GPU
    python benchmarks/gpu_check.py --dry-run                            # CPU: plan only
    python benchmarks/gpu_check.py --refit FILE.json                    # CPU: suggested constants

Points, all at sequence 4096 in bf16 with two micro-batches per step (gas = 2):
- DeepSpeed workload (`autotune.workloads.deepspeed_gpt`): micro-batch {1, 2, 4, 8} × recompute
  {none, selective, full} × ZeRO 0-3 × optimizer offload {none, optimizer} (offload needs ZeRO
  >= 1);
- megatron-core workload (`autotune.workloads.megatron_gpt`): micro-batch × recompute with the
  distributed optimizer (zero = 1), with and without optimizer offload;
for gpt3-1.3b (its learned positions raised to 4096) and llama2-7b. Each point runs as its own
process with a timeout, so an OOM or a crash costs one row. It records the peak of
``torch.cuda.max_memory_allocated``, the median step time after warm-up, an OOM flag and the
device memory nvidia-smi saw, beside `autotune.costmodel.estimate.estimate` on a one-GPU hgx-h200
whose host
has the device machine's 128 GiB. The predicted memory leaves out the model's ``runtime`` part
(CUDA context and library workspaces, which max_memory_allocated does not count).

Order: every point the model calls feasible before any it does not (those nearest the limit
first); within that, micro-batch 1 at each recompute, then one step along each other axis
(micro-batch 4, ZeRO-3, optimizer offload), then the rest; the megatron-core workload before
DeepSpeed (it is the newer program, and DeepSpeed's JIT ops build meanwhile). A point whose
estimated cost exceeds the time left is skipped, and so are larger micro-batches of a setting
that ran out of memory and points whose offloaded states could exhaust the host. Writes the
table as Markdown (and the raw records as JSON beside it) to
``benchmarks/results/h200-<date>.md`` or ``--out``, and prints it.

Targets: predicted peak within 8 % of measured on every point that ran; no point the
model calls feasible runs out of memory; step time within 10 % after the fit (``--refit``).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from autotune.calibration.fit import Measured  # noqa: E402
from autotune.calibration.fit import fit_constants  # noqa: E402
from autotune.costmodel.constants import Constants  # noqa: E402
from autotune.costmodel.constants import constants_for  # noqa: E402
from autotune.costmodel.estimate import Estimate  # noqa: E402
from autotune.costmodel.estimate import estimate  # noqa: E402
from autotune.costmodel.memory import usable_gpu_bytes  # noqa: E402
from autotune.layout import RECOMPUTES  # noqa: E402
from autotune.layout import Layout  # noqa: E402
from autotune.space.rules import violations  # noqa: E402
from autotune.specs import AutotuneConfig  # noqa: E402
from autotune.specs import Framework  # noqa: E402
from autotune.specs import TrainSpec  # noqa: E402
from autotune.specs.inputs import load_cluster  # noqa: E402
from autotune.specs.inputs import load_model  # noqa: E402
from autotune.units import GIB  # noqa: E402

SEQ = 4096
"""Tokens per sequence of every point."""
GAS = 2
"""Micro-batches per optimizer step (global batch = 2·mbs)."""
MODELS = ("gpt3-1.3b", "llama2-7b")
"""A ~1B and a ~7B preset."""
WORKLOADS = ("megatron", "deepspeed")
"""Trial programs, in run order within a tier."""
MODULES = {"megatron": "autotune.workloads.megatron_gpt",
           "deepspeed": "autotune.workloads.deepspeed_gpt"}
MICRO_BATCHES = (1, 2, 4, 8)
ZEROS = (0, 1, 2, 3)
MEGATRON_ZERO = 1
"""The megatron-core points use the distributed optimizer (Megatron-LM's usual setting)."""
HOST_MEMORY_GB = 128 * GIB / 1e9
"""Host memory of the GPU machine the check was written for (128 GiB)."""
HOST_SAFE_FRACTION = 0.5
"""Points whose predicted offloaded states pass this share of the host are not run: a host OOM
could take the whole machine (and the run's results) with it."""
BUDGET_S = 360.0
"""Default wall-clock budget of the points, seconds (about 8 minutes with setup and tests)."""
NEAR_LIMIT = 1.1
"""Infeasible points predicted under this multiple of usable memory run before the others."""
STARTUP_S = {"megatron": (12.0, 1.5), "deepspeed": (12.0, 4.0)}
"""Rough start-up cost per point: seconds, plus seconds per billion parameters (imports,
process group, weight init; DeepSpeed initialises on the CPU)."""
TAIL_CHARS = 1500
"""Characters of a failed point's log kept in the JSON records."""


@dataclasses.dataclass(frozen=True, slots=True)
class Point:
    """One measurement: a workload training one model with one single-GPU layout."""

    workload: str
    model: str
    layout: Layout

    @property
    def label(self) -> str:
        """Short layout text for the table."""
        lay = self.layout
        off = "+offload" if lay.offload != "none" else ""
        return f"zero={lay.zero}{off} mbs={lay.mbs} rc={lay.recompute}"


@dataclasses.dataclass(frozen=True, slots=True)
class Prediction:
    """What the model says about a point."""

    memory_bytes: float
    """Peak device memory without the `runtime` part (comparable to max_memory_allocated)."""
    step_time_s: float
    host_bytes: float
    broken: tuple[str, ...]
    """Rules the layout breaks (memory_fits among them when it does not fit)."""
    usable_bytes: float
    parts: dict[str, float]

    @property
    def feasible(self) -> bool:
        """The model would let a search run this point."""
        return not self.broken


@dataclasses.dataclass(slots=True)
class Result:
    """What running a point gave (or why it did not run)."""

    status: str
    """ok, oom, nan, crash, timeout, rejected, bad_input, or skipped."""
    peak_bytes: float | None = None
    step_time_s: float | None = None
    device_used_bytes: float | None = None
    wall_s: float = 0.0
    reason: str = ""
    note: str = ""
    log_tail: str = ""


# --- the grid and the model's view -------------------------------------------------------------


def grid(models: Sequence[str] = MODELS, workloads: Sequence[str] = WORKLOADS) -> list[Point]:
    """Every point of the check, unordered."""
    points = []
    for model in models:
        for mbs in MICRO_BATCHES:
            for recompute in RECOMPUTES:
                if "megatron" in workloads:
                    for offload in ("none", "optimizer"):
                        layout = Layout(zero=MEGATRON_ZERO, offload=offload, mbs=mbs, gas=GAS,
                                        recompute=recompute)
                        points.append(Point("megatron", model, layout))
                if "deepspeed" not in workloads:
                    continue
                for zero in ZEROS:
                    for offload in ("none", "optimizer") if zero else ("none",):
                        layout = Layout(zero=zero, offload=offload, mbs=mbs, gas=GAS,
                                        recompute=recompute)
                        points.append(Point("deepspeed", model, layout))
    return points


def problem(point: Point) -> AutotuneConfig:
    """The model, a one-GPU H200 cluster with the device machine's host, and the training setup."""
    spec = load_model(point.model)
    if spec.position_embedding == "learned_absolute" and spec.max_position_embeddings < SEQ:
        spec = spec.model_copy(update={"max_position_embeddings": SEQ})
    cluster = load_cluster("hgx-h200:1").model_copy(
        update={"gpus_per_node": 1, "host_memory_gb": HOST_MEMORY_GB}
    )
    framework: Framework = "megatron" if point.workload == "megatron" else "deepspeed"
    train = TrainSpec(seq_length=SEQ, global_batch_size=point.layout.global_batch_size,
                      precision="bf16", framework=framework, flash_attention=True)
    return AutotuneConfig(model=spec, cluster=cluster, train=train)


def predict(point: Point, k: Constants | None = None) -> Prediction:
    """The model's memory (without runtime), step time and verdict for a point."""
    cfg = problem(point)
    k = k or constants_for(cfg.cluster.gpu)
    est: Estimate = estimate(cfg, point.layout, k)
    return Prediction(
        memory_bytes=est.peak_memory_bytes - est.memory_parts["runtime"],
        step_time_s=est.step_time_s,
        host_bytes=est.host_memory_bytes,
        broken=tuple(name for name, _ in violations(cfg, point.layout, k)),
        usable_bytes=usable_gpu_bytes(cfg, k) - est.memory_parts["runtime"],
        parts=dict(est.memory_parts),
    )


def _role(point: Point) -> tuple[int, int]:
    """(role, rank): which question a point answers, and how early within it (lower first).

    0: micro-batch 1 at each recompute (the activation model); 1: one step along each other
    axis (micro-batch 4, ZeRO-3, optimizer offload; then the rest of micro-batch 4 and of the
    ZeRO/offload settings under full recompute); 3: other micro-batches; 4: everything else.
    """
    lay = point.layout
    base_zero = MEGATRON_ZERO if point.workload == "megatron" else 0
    if lay.offload == "none" and lay.zero == base_zero:
        if lay.mbs == 1:
            return 0, RECOMPUTES.index(lay.recompute)
        if lay.mbs == 4:
            return 1, {"none": 0, "full": 1, "selective": 3}[lay.recompute]
        return 3, 0
    if lay.mbs == 1 and lay.recompute == "full":
        first = (lay.zero == 3 and lay.offload == "none") or (
            lay.offload != "none" and lay.zero == max(base_zero, 1))
        return 1, 0 if first else 2
    return 4, 0


def priority(point: Point, pred: Prediction) -> tuple[Any, ...]:
    """Sort key: feasible first, then role, workload, model and the layout's own order."""
    ratio = (pred.memory_bytes / pred.usable_bytes) if pred.usable_bytes > 0 else 1e9
    near = set(pred.broken) <= {"memory_fits"} and ratio <= NEAR_LIMIT
    feasibility = 0 if pred.feasible else (1 if near else 2)
    if host_unsafe(pred):
        feasibility = 3  # never run
    lay = point.layout
    model = MODELS.index(point.model) if point.model in MODELS else len(MODELS)
    role, rank = _role(point)
    workload = WORKLOADS.index(point.workload)
    # role 0 runs every megatron-core point first: DeepSpeed's JIT ops build meanwhile
    first, second = (workload, rank) if role == 0 else (rank, workload)
    return (feasibility, role, first, second, model, lay.mbs, RECOMPUTES.index(lay.recompute),
            lay.zero, lay.offload, ratio if feasibility else 0.0)


def cost_s(point: Point, pred: Prediction) -> float:
    """Rough seconds one point takes: start-up plus its steps at twice the predicted time."""
    base, per_b = STARTUP_S[point.workload]
    params_b = problem(point).model.num_params() / 1e9
    return base + per_b * params_b + steps_for(pred) * 2 * pred.step_time_s


def steps_for(pred: Prediction) -> int:
    """Optimizer steps of a point (2 of them warm-up): fewer for slow steps."""
    return 6 if pred.step_time_s < 2.0 else 5


def host_unsafe(pred: Prediction) -> bool:
    """Offloaded states large enough to endanger the machine."""
    return pred.host_bytes > HOST_SAFE_FRACTION * HOST_MEMORY_GB * 1e9


def plan(points: Sequence[Point]) -> list[tuple[Point, Prediction]]:
    """Points with their predictions, most informative first."""
    pairs = [(p, predict(p)) for p in points]
    return sorted(pairs, key=lambda pair: priority(*pair))


# --- running one point ----------------------------------------------------------------------


class DeviceMemory:
    """nvidia-smi's used device memory, sampled every 200 ms in the background."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []
        self.process: subprocess.Popen[str] | None = None
        if shutil.which("nvidia-smi") is None:
            return
        self.process = subprocess.Popen(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
             "-lms", "200"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            try:
                self.samples.append((time.monotonic(), float(line.split(",")[0]) * 2**20))
            except ValueError:
                continue

    def peak(self, start: float, end: float) -> float | None:
        """Largest sample between two monotonic times, in bytes."""
        inside = [used for t, used in self.samples if start <= t <= end]
        return max(inside) if inside else None

    def close(self) -> None:
        """Stop sampling."""
        if self.process is not None:
            self.process.terminate()


class OpBuilds:
    """DeepSpeed's JIT ops (FusedAdam, CPU Adam), built in the background while others run."""

    NAMES = {"fused_adam": "FusedAdamBuilder", "cpu_adam": "CPUAdamBuilder"}

    def __init__(self, env: dict[str, str]) -> None:
        self.processes = {
            name: subprocess.Popen(
                [sys.executable, "-c",
                 f"from deepspeed.ops.op_builder import {builder}; {builder}().load()"],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for name, builder in self.NAMES.items()
        }
        self.done: dict[str, tuple[bool, str]] = {}

    def ready(self, name: str, timeout_s: float) -> bool:
        """Wait for one build; True when it succeeded."""
        if name not in self.done:
            process = self.processes[name]
            try:
                out, _ = process.communicate(timeout=max(timeout_s, 1.0))
                self.done[name] = (process.returncode == 0, (out or "")[-TAIL_CHARS:])
            except subprocess.TimeoutExpired:
                process.kill()
                self.done[name] = (False, f"not built within {timeout_s:.0f} s")
        return self.done[name][0]

    def close(self) -> None:
        """Stop builds nobody waited for."""
        for name, process in self.processes.items():
            if name not in self.done and process.poll() is None:
                process.kill()
                self.done[name] = (False, "not needed before the run ended")


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _base_env(ext_dir: Path) -> dict[str, str]:
    paths = [str(ROOT), *filter(None, [os.environ.get("PYTHONPATH", "")])]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), "PYTHONUNBUFFERED": "1",
            "TORCH_EXTENSIONS_DIR": str(ext_dir), "OMP_NUM_THREADS": str(os.cpu_count() or 1),
            "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1"}


def command(point: Point, pred: Prediction, folder: Path, torch_adam: bool) -> list[str]:
    """Write the point's inputs into `folder` and return the workload's argv."""
    cfg = problem(point)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.json").write_text(json.dumps(cfg.model.model_dump(mode="json")))
    (folder / "layout.json").write_text(json.dumps(point.layout.to_dict()))
    steps = steps_for(pred)
    argv = [sys.executable, "-m", MODULES[point.workload], "--model", str(folder / "model.json"),
            "--layout", str(folder / "layout.json"), "--seq", str(SEQ), "--steps", str(steps),
            "--warmup", "2", "--metrics", str(folder / "metrics.jsonl")]
    if point.workload == "megatron":
        return [*argv, "--gbs", str(point.layout.global_batch_size), "--precision", "bf16"]
    from autotune.render import deepspeed_config

    ds = deepspeed_config(cfg, point.layout)
    if torch_adam and point.layout.offload == "none":
        ds.setdefault("optimizer", {"type": "AdamW"}).setdefault("params", {})["torch_adam"] = True
    (folder / "ds_config.json").write_text(json.dumps(ds, indent=1))
    return [*argv, "--ds-config", str(folder / "ds_config.json")]


def _records(text: str) -> list[dict[str, Any]]:
    found = []
    for line in text.splitlines():
        start = line.find("{")
        if start < 0:
            continue
        try:
            record = json.loads(line[start:])
        except json.JSONDecodeError:
            continue
        if isinstance(record, dict) and record.get("event") in ("step", "summary"):
            found.append(record)
    return found


def run_point(
    point: Point, pred: Prediction, folder: Path, env: dict[str, str], timeout_s: float,
    memory: DeviceMemory, torch_adam: bool = False,
) -> Result:
    """Run one point in its own process and classify how it ended."""
    from autotune.runners.failures import classify

    argv = command(point, pred, folder, torch_adam)
    start = time.monotonic()
    timed_out = False
    with (folder / "stdout.log").open("w") as out, (folder / "stderr.log").open("w") as err:
        process = subprocess.Popen(argv, cwd=folder, env={**env, "MASTER_PORT": str(_free_port())},
                                   stdout=out, stderr=err, start_new_session=True)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            os.killpg(process.pid, 9)
            process.wait()
    end = time.monotonic()
    stdout = (folder / "stdout.log").read_text(errors="replace")
    stderr = (folder / "stderr.log").read_text(errors="replace")
    records = _records(stdout)
    summaries = [r for r in records if r["event"] == "summary"]
    steps = [r for r in records if r["event"] == "step"]
    summary = summaries[-1] if summaries else None
    peaks = [float(r["peak_memory_bytes"]) for r in [*steps, *summaries]
             if r.get("peak_memory_bytes")]
    result = Result(status="ok", peak_bytes=max(peaks) if peaks else None,
                    device_used_bytes=memory.peak(start, end), wall_s=end - start)
    failure = classify(returncode=process.returncode, text=stderr[-200_000:] + stdout[-50_000:],
                       timed_out=timed_out, reported=summary, timeout_s=timeout_s)
    if failure is not None:
        result.status, result.reason = failure.status, failure.reason
        result.log_tail = (stderr or stdout)[-TAIL_CHARS:]
    elif summary is not None:
        result.step_time_s = summary.get("median_step_time_s")
    if torch_adam and point.workload == "deepspeed" and point.layout.offload == "none":
        result.note = "torch AdamW (FusedAdam did not build)"
    return result


# --- the run ----------------------------------------------------------------------------------


def _setting(point: Point) -> tuple[str, str, int, str, str]:
    lay = point.layout
    return point.workload, point.model, lay.zero, lay.offload, lay.recompute


def execute(
    planned: Sequence[tuple[Point, Prediction]], budget_s: float, work: Path,
    log: Callable[[str], None] = print,
) -> tuple[list[Result], dict[str, Any]]:
    """Run the planned points in order within the budget; returns results and notes."""
    start = time.monotonic()
    env = _base_env(Path(os.environ.get("TORCH_EXTENSIONS_DIR", work / "torch_extensions")))
    memory = DeviceMemory()
    time.sleep(0.5)
    idle = memory.peak(start, time.monotonic())
    gpu = shutil.which("nvidia-smi") is not None
    wants_builds = gpu and any(p.workload == "deepspeed" for p, _ in planned)
    builds = OpBuilds(env) if wants_builds else None
    results: list[Result] = []
    oom_at: dict[tuple[str, str, int, str, str], int] = {}
    outcomes: dict[str, list[str]] = {w: [] for w in WORKLOADS}
    for number, (point, pred) in enumerate(planned, 1):
        left = budget_s - (time.monotonic() - start)
        cost = cost_s(point, pred)
        skip = _skip_reason(point, pred, cost, left, oom_at, outcomes)
        torch_adam = False
        if skip is None and builds is not None and point.workload == "deepspeed":
            needed = "cpu_adam" if point.layout.offload != "none" else "fused_adam"
            built = builds.ready(needed, min(240.0, left - cost))
            if not built and needed == "cpu_adam":
                skip = "DeepSpeed's CPU Adam did not build"
            torch_adam = not built and needed == "fused_adam"
            left = budget_s - (time.monotonic() - start)
            if skip is None and cost > left:
                skip = f"budget: needs ~{cost:.0f} s, {max(left, 0):.0f} s left"
        if skip is not None:
            results.append(Result(status="skipped", reason=skip))
            log(f"[{number:3d}] skip {point.workload}/{point.model} {point.label}: {skip}")
            continue
        timeout = min(left, max(90.0, 2.5 * cost))
        folder = work / f"{number:03d}-{point.workload}-{point.model}-{point.layout.id}"
        result = run_point(point, pred, folder, env, timeout, memory, torch_adam)
        results.append(result)
        outcomes[point.workload].append(result.status)
        if result.status == "oom":
            key = _setting(point)
            oom_at[key] = min(oom_at.get(key, point.layout.mbs), point.layout.mbs)
        log(f"[{number:3d}] {result.status:8s} {point.workload}/{point.model} {point.label} "
            f"peak={_gib(result.peak_bytes)} GiB (pred {_gib(pred.memory_bytes)}) "
            f"step={_num(result.step_time_s)} s (pred {pred.step_time_s:.4g}) "
            f"wall={result.wall_s:.0f} s {result.reason[:120]}")
    memory.close()
    if builds is not None:
        builds.close()
    notes: dict[str, Any] = {"elapsed_s": round(time.monotonic() - start, 1),
                             "idle_device_used_bytes": idle}
    if builds is not None:
        notes["op_builds"] = {name: {"ok": ok, "tail": tail} for name, (ok, tail)
                              in builds.done.items()}
    return results, notes


def _skip_reason(
    point: Point, pred: Prediction, cost: float, left: float,
    oom_at: dict[tuple[str, str, int, str, str], int], outcomes: dict[str, list[str]],
) -> str | None:
    if host_unsafe(pred):
        return (f"offloaded states {pred.host_bytes / GIB:.0f} GiB could exhaust the "
                f"{HOST_MEMORY_GB * 1e9 / GIB:.0f} GiB host")
    smallest = oom_at.get(_setting(point))
    if smallest is not None and point.layout.mbs >= smallest:
        return f"mbs={smallest} of this setting ran out of memory"
    seen = outcomes[point.workload]
    if len(seen) >= 2 and "ok" not in seen and all(s in ("crash", "rejected") for s in seen[:2]):
        return f"the {point.workload} workload failed on its first points"
    if cost > left:
        return f"budget: needs ~{cost:.0f} s, {max(left, 0):.0f} s left"
    return None


# --- tables -----------------------------------------------------------------------------------


def _gib(value: float | None) -> str:
    return "—" if value is None else f"{value / GIB:.2f}"


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.4g}"


def _err(measured: float | None, predicted: float) -> str:
    return "—" if not measured else f"{(predicted / measured - 1) * 100:+.1f} %"


def plan_table(planned: Sequence[tuple[Point, Prediction]], budget_s: float) -> str:
    """Markdown table of the planned points (dry run): order, predictions, cost, budget."""
    lines = ["| # | workload | model | layout | predicted GiB | usable GiB | predicted step s "
             "| model says | est. cost s | within budget |", "|" + "---|" * 10]
    total = 0.0
    for number, (point, pred) in enumerate(planned, 1):
        cost = cost_s(point, pred)
        runs = not host_unsafe(pred) and total + cost <= budget_s
        total += cost if runs else 0.0
        verdict = "fits" if pred.feasible else ", ".join(pred.broken)
        within = "yes" if runs else ("no: host" if host_unsafe(pred) else "no")
        lines.append(
            f"| {number} | {point.workload} | {point.model} | {point.label} | "
            f"{_gib(pred.memory_bytes)} | {_gib(pred.usable_bytes)} | {_num(pred.step_time_s)} | "
            f"{verdict} | {cost:.0f} | {within} |")
    return "\n".join(lines)


def result_table(rows: Sequence[tuple[Point, Prediction, Result]]) -> str:
    """Markdown table of a run: measured against predicted, one row per point."""
    lines = ["| # | workload | model | layout | status | OOM | peak alloc GiB | predicted GiB | "
             "mem err | device used GiB | step s | predicted s | time err | model says | wall s |",
             "|" + "---|" * 15]
    for number, (point, pred, res) in enumerate(rows, 1):
        verdict = "fits" if pred.feasible else ", ".join(pred.broken)
        status = res.status + (f" ({res.reason[:60]})" if res.status not in ("ok",) else "")
        if res.note:
            status += f"; {res.note}"
        lines.append(
            f"| {number} | {point.workload} | {point.model} | {point.label} | "
            f"{status.replace('|', '/')} | {'yes' if res.status == 'oom' else ''} | "
            f"{_gib(res.peak_bytes)} | {_gib(pred.memory_bytes)} | "
            f"{_err(res.peak_bytes if res.status == 'ok' else None, pred.memory_bytes)} | "
            f"{_gib(res.device_used_bytes)} | {_num(res.step_time_s)} | "
            f"{_num(pred.step_time_s)} | {_err(res.step_time_s, pred.step_time_s)} | {verdict} | "
            f"{res.wall_s:.0f} |")
    return "\n".join(lines)


# --- what the table says about the constants --------------------------------------------------


def _measured_points(records: Sequence[dict[str, Any]]) -> list[tuple[Point, dict[str, Any]]]:
    out = []
    for rec in records:
        lay = Layout(**rec["point"]["layout"])
        out.append((Point(rec["point"]["workload"], rec["point"]["model"], lay), rec))
    return out


def suggestions(records: Sequence[dict[str, Any]], idle_bytes: float = 0.0) -> list[str]:
    """Findings and suggested constants for h200-sxm-141gb from a run's records.

    `idle_bytes` is the device memory nvidia-smi showed before any point ran.
    """
    ran = [(p, r) for p, r in _measured_points(records) if r["result"]["status"] == "ok"]
    lines = []
    errs = [r["prediction"]["memory_bytes"] / r["result"]["peak_bytes"] - 1 for _, r in ran
            if r["result"]["peak_bytes"]]
    if errs:
        within = sum(abs(e) <= 0.08 for e in errs)
        lines.append(f"memory: {within}/{len(errs)} points within 8 %; median |error| "
                     f"{statistics.median(map(abs, errs)) * 100:.1f} %, worst "
                     f"{max(errs, key=abs) * 100:+.1f} %")
    feasible_oom = [p for p, r in _measured_points(records)
                    if r["result"]["status"] == "oom" and not r["prediction"]["broken"]]
    lines.append(f"points the model calls feasible that ran out of memory: {len(feasible_oom)}"
                 + "".join(f"\n  - {p.workload}/{p.model} {p.label}" for p in feasible_oom))
    factor = _activation_factor(ran)
    lines.append(
        "activation_memory_factor: needs points of one setting whose activations differ"
        if factor is None else
        f"activation_memory_factor: {factor:.3f} (slope of measured peak against predicted "
        "activations within each workload/model/ZeRO/offload setting)")
    overhead = [(r["result"]["device_used_bytes"] - idle_bytes - r["result"]["peak_bytes"]) / GIB
                for _, r in ran if r["result"].get("device_used_bytes") and
                r["result"]["peak_bytes"]]
    if overhead:
        lines.append(f"runtime_memory_gib: {min(overhead):.2f} (smallest nvidia-smi used − peak "
                     f"allocated; median {statistics.median(overhead):.2f} includes the "
                     "allocator's cache)")
    lines.extend(_time_fit([(p, r) for p, r in ran if p.layout.offload == "none"]))
    return lines


def _activation_factor(ran: Sequence[tuple[Point, dict[str, Any]]]) -> float | None:
    """The activation factor the measurements imply.

    Measured peak minus the predicted other parts (logits, which grow with the micro-batch,
    included), against predicted activations: the slope within each setting (workload, model,
    ZeRO, offload), pooled. Errors that are constant within a setting (weights, optimizer
    states, buffers) cancel.
    """
    groups: dict[tuple[str, str, int, str], list[tuple[float, float]]] = {}
    for point, rec in ran:
        pred, peak = rec["prediction"], rec["result"]["peak_bytes"]
        if peak:
            act = pred["parts"]["activations"]
            key = (point.workload, point.model, point.layout.zero, point.layout.offload)
            groups.setdefault(key, []).append((act, peak - (pred["memory_bytes"] - act)))
    num = den = 0.0
    for pairs in groups.values():
        mean_a = statistics.fmean(a for a, _ in pairs)
        mean_m = statistics.fmean(m for _, m in pairs)
        num += sum((a - mean_a) * (m - mean_m) for a, m in pairs)
        den += sum((a - mean_a) ** 2 for a, _ in pairs)
    if den < GIB**2:  # less than ~1 GiB of spread in predicted activations
        return None
    factor = ran[0][1]["prediction"]["activation_memory_factor"]
    return float(factor * num / den)


def _time_fit(ran: Sequence[tuple[Point, dict[str, Any]]]) -> list[str]:
    if len(ran) < 3:
        return ["step time: too few points to fit"]
    points = [Measured(name=f"{p.workload}/{p.model} {p.label}", cfg=problem(p),
                       layouts=(p.layout,), step_time_s=float(r["result"]["step_time_s"]),
                       gpu="h200-sxm-141gb") for p, r in ran]
    base = constants_for(points[0].cfg.cluster.gpu)
    names = ("gemm_efficiency", "elementwise_passes")
    fitted = fit_constants(points, base, names)

    def errors(k: Constants) -> list[float]:
        return [float(estimate(m.cfg, m.layouts[0], k).step_time_s / m.step_time_s - 1)
                for m in points]

    before, after = errors(base), errors(fitted)
    return [
        f"step time: median |error| {statistics.median(map(abs, before)) * 100:.1f} % before, "
        f"{statistics.median(map(abs, after)) * 100:.1f} % after the fit (worst "
        f"{max(after, key=abs) * 100:+.1f} %) over {len(points)} points without offload",
        *(f"{name}: {getattr(fitted, name):.4f} (was {getattr(base, name):.4f})"
          for name in names),
    ]


def _record(point: Point, pred: Prediction, res: Result, k: Constants) -> dict[str, Any]:
    return {
        "point": {"workload": point.workload, "model": point.model,
                  "layout": point.layout.to_dict(), "seq": SEQ},
        "prediction": {"memory_bytes": pred.memory_bytes, "step_time_s": pred.step_time_s,
                       "host_bytes": pred.host_bytes, "broken": list(pred.broken),
                       "usable_bytes": pred.usable_bytes, "parts": pred.parts,
                       "activation_memory_factor": k.activation_memory_factor},
        "result": dataclasses.asdict(res),
    }


# --- main -------------------------------------------------------------------------------------


def _default_out() -> Path:
    return ROOT / "benchmarks" / "results" / f"h200-{datetime.date.today().isoformat()}.md"


def _environment() -> str:
    """Versions and the GPU, read without touching CUDA (a context here would cost memory)."""
    from importlib import metadata

    parts = [f"Python {sys.version.split()[0]}"]
    for name in ("torch", "deepspeed", "megatron-core"):
        try:
            parts.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            parts.append(f"{name} missing")
    if shutil.which("nvidia-smi"):
        query = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
             "--format=csv,noheader"], capture_output=True, text=True, check=False)
        parts.append(query.stdout.strip().replace("\n", "; ") or "nvidia-smi failed")
    else:
        parts.append("no nvidia-smi")
    return ", ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path,
                        help="Markdown file (default benchmarks/results/h200-<date>.md)")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S, help="wall-clock budget")
    parser.add_argument("--dry-run", action="store_true", help="list points and predictions")
    parser.add_argument("--refit", type=Path, help="records (.json) of a run: suggest constants")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--workloads", nargs="+", default=list(WORKLOADS), choices=WORKLOADS)
    parser.add_argument("--work", type=Path, default=Path("/tmp/autotune-gpu-check"),
                        help="folder for the points' inputs and logs")
    args = parser.parse_args(argv)
    if args.refit is not None:
        data = json.loads(args.refit.read_text())
        idle = data.get("notes", {}).get("idle_device_used_bytes") or 0.0
        print("\n".join(suggestions(data["records"], idle)))
        return 0
    planned = plan(grid(args.models, args.workloads))
    if args.dry_run:
        print(f"{len(planned)} points, budget {args.budget_s:.0f} s\n")
        print(plan_table(planned, args.budget_s))
        return 0
    k = constants_for(problem(planned[0][0]).cluster.gpu)
    environment = _environment()
    print(f"gpu_check: {len(planned)} points, budget {args.budget_s:.0f} s; {environment}",
          flush=True)
    results, notes = execute(planned, args.budget_s, args.work,
                             log=lambda line: print(line, flush=True))
    rows = [(p, pred, res) for (p, pred), res in zip(planned, results, strict=True)]
    records = [_record(p, pred, res, k) for p, pred, res in rows]
    ran = [row for row in rows if row[2].status != "skipped"]
    out = args.out or _default_out()
    out.parent.mkdir(parents=True, exist_ok=True)
    text = "\n".join([
        f"# H200 check {datetime.date.today().isoformat()}: measured vs predicted",
        "",
        f"{environment}. Sequence {SEQ}, bf16, gas {GAS}; one H200 (predictions: hgx-h200 with "
        f"one GPU and a {HOST_MEMORY_GB:.0f} GB host). Predicted GiB leaves out the model's "
        "runtime part; errors are predicted / measured − 1. "
        f"{len(ran)} of {len(rows)} points ran in {notes['elapsed_s']:.0f} s "
        f"(`benchmarks/gpu_check.py`).",
        "",
        result_table(ran),
        "",
        "## Findings",
        "",
        *(f"- {line}" for line in suggestions(records, notes["idle_device_used_bytes"] or 0.0)),
        "",
        f"Skipped: {len(rows) - len(ran)} points (budget, host memory, or a smaller micro-batch "
        "already ran out of memory); the JSON records beside this file list them.",
        "",
    ])
    out.write_text(text)
    out.with_suffix(".json").write_text(json.dumps(
        {"environment": environment, "notes": notes, "records": records}, indent=1) + "\n")
    print("\n" + text)
    print(f"wrote {out} and {out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
