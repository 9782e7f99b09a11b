"""Where a CPU DeepSpeed trial's peak resident memory goes, phase by phase, against the model.

`phases` builds the built-in workload's engine (`autotune.workloads.deepspeed_gpt.setup`) from
the ds_config.json and layout.json a trial renders, in 1 or more gloo processes, and runs a
few steps. Before each phase it resets the kernel's high-water mark of the process's resident
memory (`/proc/self/clear_refs`, 5), and after it reads the mark again (`VmHWM`, what a
trial's `peak_memory_bytes` reports): the peak inside the phase. Phases: the imports and
`init_distributed` (the process's base), `deepspeed.initialize` with the model's
construction, then each step's forward with the loss, backward and `step`. The peak over them
is the trial's measured peak. It prints, per layout, each phase's peak and what stayed
resident after it, beside the model's parts (`autotune.costmodel.memory`).

`against DIR` reads a `benchmarks/cpu_validation.py --out DIR` run's trials (each trial's
measured peak in its rows.json) and predicts each again with the current model and the
run's own calibration file, then prints median and max |error| per ZeRO stage and per
parallel family (dp, tp, pp, cp, ep).

`allocators` runs the same trials under three glibc settings (its default, one malloc
arena as the trials set on CPU workers, and a trim threshold of 0, under which the resident
peak is the live allocations') and prints what the differences attribute: the threads'
arenas and the main heap's retained free chunks.

    python benchmarks/cpu_memory.py phases [--workers 1] [--layouts zero=0,mbs=2 ...]
    python benchmarks/cpu_memory.py against cpu-validation
    python benchmarks/cpu_memory.py allocators [--model tiny-gpt] [--layouts zero=1,mbs=2 ...]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

MIB = 1024 * 1024
LAYOUTS = ["zero=0,mbs=2", "zero=1,mbs=2", "zero=2,mbs=2", "zero=3,mbs=2",
           "zero=2,offload=optimizer,mbs=2", "zero=3,offload=optimizer+params,mbs=2",
           "zero=0,mbs=4", "zero=0,mbs=8", "zero=2,mbs=8"]
"""Layouts of `phases` (one process: dp 1, so ZeRO partitions the whole model)."""
PHASES = ("base", "initialize", "forward", "backward", "step")
KINDS = ("RssAnon", "RssFile", "RssShmem")


# --- the probe: runs inside each worker process ------------------------------------------------


def _status_bytes(field: str) -> int:
    from autotune.workloads.common import process_status_bytes  # the trials' own reader

    return process_status_bytes(field) or 0


def _malloc_in_use() -> int:
    """Bytes glibc's malloc has handed out and not had back (main arena and mmapped chunks,
    `mallinfo2`); 0 where there is no glibc."""
    import ctypes

    class Info(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks",
            "fordblks", "keepcost")]

    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallinfo2.restype = Info
        info = libc.mallinfo2()
    except (OSError, AttributeError):
        return 0
    return int(info.uordblks + info.hblkhd)


def _reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


class _Phases:
    """Per phase: the peak resident bytes inside it and the resident bytes after it."""

    def __init__(self) -> None:
        self.peak: dict[str, int] = {}
        self.after: dict[str, int] = {}
        self.trace: list[tuple[str, int, int, int, list[tuple[int, int]]]] = []

    def start(self) -> None:
        _reset_peak()

    def end(self, name: str) -> None:
        from autotune.workloads.common import malloc_arenas

        peak, after = _status_bytes("VmHWM"), _status_bytes("VmRSS")
        self.peak[name] = max(self.peak.get(name, 0), peak)
        self.after[name] = after
        heaps = malloc_arenas() if os.environ.get("CPU_MEMORY_TRACE") else []
        self.trace.append((name, peak, after, _malloc_in_use(), heaps))


def probe(folder: Path, steps: int) -> None:
    """Run the trial in `folder` phase by phase; rank 0 prints one JSON line (max over ranks)."""
    phases = _Phases()
    phases.start()
    import deepspeed
    import torch
    import torch.distributed as dist

    from autotune.workloads.common import read_json
    from autotune.workloads.common import read_problem
    from autotune.workloads.deepspeed_gpt import make_plan
    from autotune.workloads.deepspeed_gpt import parse_args
    from autotune.workloads.deepspeed_gpt import setup

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    deepspeed.utils.logger.setLevel(40)
    args = parse_args(["--problem", str(folder / "problem.json"), "--layout",
                       str(folder / "layout.json"), "--ds-config", str(folder / "ds_config.json"),
                       "--steps", str(steps), "--warmup", "0"])
    given = read_problem(args.problem)
    plan = make_plan(args, read_json(args.ds_config), int(os.environ["WORLD_SIZE"]),
                     seq=given.train.seq_length)
    deepspeed.init_distributed(dist_backend="gloo")
    phases.end("base")
    phases.start()
    trial = setup(given.model, plan, read_json(args.ds_config))
    phases.end("initialize")
    engine = trial.engine
    for step in range(steps):
        if trial.pipeline:  # the engine runs forward, backward and step itself
            phases.start()
            engine.train_batch(data_iter=trial.data.micro_batches(step))
            phases.end("step")
            continue
        for micro in range(plan.gas):
            inputs, labels = trial.data.batch(step, micro)
            phases.start()
            loss = trial.loss_fn(engine(inputs), labels)
            phases.end("forward")
            phases.start()
            engine.backward(loss)
            phases.end("backward")
            del loss
            phases.start()
            engine.step()
            phases.end("step")
    # what the resident memory is made of at the end: private (anonymous) pages, mapped files
    # (libraries) and shared memory (`VmRSS` = RssAnon + RssFile + RssShmem)
    mine = {"peak": phases.peak, "after": phases.after,
            "kinds": {name: _status_bytes(name) for name in KINDS}}
    every: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(every, mine)
    if os.environ.get("CPU_MEMORY_TRACE"):
        for name, peak, after, used, heaps in phases.trace:
            arenas = " ".join(f"{system / MIB:.0f}/{free / MIB:.0f}" for system, free in heaps)
            print(f"TRACE rank {dist.get_rank()} {name:10s} peak {peak / MIB:7.1f} after "
                  f"{after / MIB:7.1f} malloc in use {used / MIB:7.1f} arenas (held/free) "
                  f"{arenas}", flush=True)
    if dist.get_rank() == 0:
        merged = {kind: {name: max(r[kind].get(name, 0) for r in every) for name in names}
                  for kind, names in (("peak", PHASES), ("after", PHASES), ("kinds", KINDS))}
        print("PROBE " + json.dumps(merged), flush=True)
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


# --- phases: one probe per layout ----------------------------------------------------------------


def _config(model: str, workers: int, gbs: int | None = None) -> Any:
    from autotune.specs.inputs import load_config

    return load_config(model, "local", framework="deepspeed", processes=workers,
                       global_batch_size=gbs)


def write_trial(cfg: Any, layout: Any, folder: Path) -> None:
    """The trial's files as `TrialPipeline` renders them (configs, layout.json, problem.json)."""
    from autotune.render import write_artifacts
    from autotune.workloads import write_problem

    write_artifacts(cfg, layout, folder, trial=True)
    write_problem(cfg, folder)


def run_probe(cfg: Any, layout: Any, folder: Path, steps: int = 3,
              allocator: dict[str, str | None] | None = None) -> dict[str, dict[str, int]]:
    """Render `layout` into `folder` and run the probe in the trial's processes (torchrun for
    more than one; the trials' thread count and allocator settings, `allocator`'s variables
    on top, None unsetting one); returns the peaks and residents per phase."""
    from autotune.runners.base import cpu_allocator_env

    write_trial(cfg, layout, folder)
    workers = cfg.cluster.gpus_per_node
    threads = max(1, (os.cpu_count() or 1) // workers)
    command = [sys.executable, __file__, "probe", str(folder), "--steps", str(steps)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1",
           **cpu_allocator_env(cfg, os.environ)}
    for name, value in (allocator or {}).items():
        if value is None:
            env.pop(name, None)
        else:
            env[name] = value
    if workers > 1:
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes",
                   "1", "--nproc_per_node", str(workers), *command[1:]]
    else:
        env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1",
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=600,
                          check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("PROBE ")]
    for line in done.stdout.splitlines():
        if line.startswith("TRACE "):
            print(line[len("TRACE "):])
    if not lines:
        raise RuntimeError(f"probe failed (rc {done.returncode}):\n{done.stderr[-3000:]}")
    result: dict[str, dict[str, int]] = json.loads(lines[-1][len("PROBE "):])
    return result


def _free_port() -> int:
    import socket

    with socket.socket() as probe_socket:
        probe_socket.bind(("127.0.0.1", 0))
        port: int = probe_socket.getsockname()[1]
        return port


def phases_table(model: str, workers: int, layouts: list[str], steps: int,
                 gbs: int | None) -> None:
    """Print each layout's phases, measured, beside the model's parts (MiB)."""
    from autotune.costmodel.estimate import estimate
    from autotune.frameworks import framework_of
    from autotune.layout import Layout

    cfg = _config(model, workers, gbs)
    print(f"{model}, {workers} gloo process(es), seq {cfg.train.seq_length}, "
          f"global batch {cfg.train.global_batch_size}, "
          f"{cfg.model.num_params() / 1e6:.2f} M parameters")
    print("\n| layout | base | initialize | forward | backward | step | measured peak | "
          "after step | predicted | error | predicted parts |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|")
    with tempfile.TemporaryDirectory() as scratch:
        for number, text in enumerate(layouts):
            layout = Layout.parse(text, cfg.world_size, cfg.train.global_batch_size,
                                  framework_of(cfg))
            measured = run_probe(cfg, layout, Path(scratch) / str(number), steps)
            peak = max(measured["peak"].values())
            predicted = estimate(cfg, layout)
            parts = ", ".join(f"{name} {value / MIB:.0f}"
                              for name, value in predicted.memory_parts.items() if value)
            cells = " | ".join(f"{measured['peak'][name] / MIB:.0f}" for name in PHASES)
            print(f"| {text} | {cells} | {peak / MIB:.0f} | "
                  f"{measured['after']['step'] / MIB:.0f} | "
                  f"{predicted.peak_memory_bytes / MIB:.0f} | "
                  f"{predicted.peak_memory_bytes / peak - 1:+.1%} | {parts} |", flush=True)
    print("(MiB; each phase's column is the peak resident memory inside it, the largest over "
          "ranks and steps)")


# --- allocators: the same trials under three glibc settings --------------------------------------

ALLOCATORS: dict[str, dict[str, str | None]] = {
    "glibc default": {"MALLOC_ARENA_MAX": None},
    "one arena": {"MALLOC_ARENA_MAX": "1"},
    "trimmed": {"MALLOC_ARENA_MAX": "1", "MALLOC_TRIM_THRESHOLD_": "0"},
}
"""glibc settings of `allocators`. By default each thread that allocates gets its own arena
(gloo's workers among them); `MALLOC_ARENA_MAX=1` (what the trials set on CPU workers,
`autotune.runners.base.CPU_ALLOCATOR_ENV`) keeps every thread in the main one. A fixed trim
threshold of 0 gives the heap's free top back at every free and, as any fixed setting does
(`mp_.no_dyn_threshold` in glibc's `malloc/malloc.c`), stops the mmap threshold rising, so
every chunk of 128 KiB or more is mapped and unmapped: the resident peak is then the live
allocations' (it changes the step time, so no trial runs with it)."""


def allocators_table(model: str, workers: int, layouts: list[str], steps: int) -> None:
    """Print each layout's measured peak under each of ALLOCATORS and what the differences
    attribute: the threads' arenas (glibc's default less one arena) and the main heap's
    retained free chunks (one arena less trimmed), beside the model's peak (MiB)."""
    from autotune.costmodel.estimate import estimate
    from autotune.frameworks import framework_of
    from autotune.layout import Layout

    cfg = _config(model, workers)
    print(f"{model}, {workers} gloo process(es), {steps} steps")
    print("\n| layout | " + " | ".join(ALLOCATORS) + " | thread arenas | main heap retained | "
          "predicted | error (one arena) | error (trimmed) |")
    print("|---|" + "---:|" * (len(ALLOCATORS) + 5))
    with tempfile.TemporaryDirectory() as scratch:
        for number, text in enumerate(layouts):
            layout = Layout.parse(text, cfg.world_size, cfg.train.global_batch_size,
                                  framework_of(cfg))
            peaks = {name: max(run_probe(cfg, layout, Path(scratch) / f"{number}-{index}",
                                         steps, env)["peak"].values())
                     for index, (name, env) in enumerate(ALLOCATORS.items())}
            predicted = estimate(cfg, layout).peak_memory_bytes
            cells = " | ".join(f"{peak / MIB:.0f}" for peak in peaks.values())
            threads = peaks["glibc default"] - peaks["one arena"]
            heap = peaks["one arena"] - peaks["trimmed"]
            print(f"| {text} | {cells} | {threads / MIB:+.0f} | {heap / MIB:+.0f} | "
                  f"{predicted / MIB:.0f} | {predicted / peaks['one arena'] - 1:+.1%} | "
                  f"{predicted / peaks['trimmed'] - 1:+.1%} |", flush=True)
    print("(MiB; the peak resident memory of the most loaded rank over the run)")


# --- against: a validation run's trials predicted again ----------------------------------------


def _family(layout: Any) -> str:
    """The layout's parallel family: the first of tp, pp, cp, ep above 1, else dp."""
    for name in ("tp", "pp", "cp", "ep"):
        if getattr(layout, name) > 1:
            return f"{name} {getattr(layout, name)}"
    return f"dp {layout.dp}"


def against(out: Path) -> None:
    """Predict each trial of a cpu_validation.py run again; print errors per ZeRO stage and
    per parallel family."""
    from autotune.calibration.file import apply_calibration
    from autotune.calibration.file import load_calibration
    from autotune.costmodel.estimate import estimate
    from autotune.frameworks import framework_of
    from autotune.layout import Layout

    rows = json.loads((out / "rows.json").read_text())
    by_stage: dict[str, list[float]] = {}
    print("| model | layout | measured (MiB) | predicted then | predicted now | error |")
    print("|---|---|---:|---:|---:|---:|")
    configs: dict[str, Any] = {}
    for row in rows:
        if row["status"] != "ok" or not row["peak"]:
            continue
        model = row["model"]
        if model not in configs:
            path = out / model / "calibration.yaml"
            configs[model] = apply_calibration(_config(model, 2), load_calibration(path),
                                               str(path))
        cfg = configs[model]
        layout = Layout.parse(row["layout"], cfg.world_size, cfg.train.global_batch_size,
                              framework_of(cfg))
        now = estimate(cfg, layout).peak_memory_bytes
        error = now / row["peak"] - 1
        stage = f"zero {layout.zero}" + (f", offload {layout.offload}"
                                         if layout.offload != "none" else "")
        by_stage.setdefault(stage, []).append(error)
        by_stage.setdefault(_family(layout), []).append(error)
        by_stage.setdefault("all", []).append(error)
        print(f"| {model} | {row['layout']} | {row['peak'] / MIB:.0f} | "
              f"{float(row['predicted_peak']) / MIB:.0f} | {now / MIB:.0f} | {error:+.1%} |")
    print("\n| trials | count | median \\|error\\| | max \\|error\\| | median error |")
    print("|---|---:|---:|---:|---:|")
    for stage in sorted(by_stage, key=lambda s: (s == "all", not s.startswith("zero"), s)):
        errors = by_stage[stage]
        absolute = [abs(e) for e in errors]
        print(f"| {stage} | {len(errors)} | {statistics.median(absolute):.1%} | "
              f"{max(absolute):.1%} | {statistics.median(errors):+.1%} |")


def main(argv: list[str] | None = None) -> int:
    """phases, against or (inside a worker) probe; see the module docstring."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    phases = commands.add_parser("phases", help="measure each phase of real engines")
    phases.add_argument("--model", default="tiny-gpt")
    phases.add_argument("--workers", type=int, default=1)
    phases.add_argument("--steps", type=int, default=3)
    phases.add_argument("--layouts", nargs="+", default=LAYOUTS)
    phases.add_argument("--gbs", type=int, help="global batch (default: the model's trials')")
    glibc = commands.add_parser("allocators", help="the same trials under glibc settings")
    glibc.add_argument("--model", default="tiny-gpt")
    glibc.add_argument("--workers", type=int, default=2)
    glibc.add_argument("--steps", type=int, default=5)
    glibc.add_argument("--layouts", nargs="+", default=["zero=0,mbs=2", "zero=1,mbs=2"])
    run = commands.add_parser("against", help="a cpu_validation.py --out folder's trials")
    run.add_argument("out", type=Path)
    inner = commands.add_parser("probe", help="(inside a worker) one trial folder")
    inner.add_argument("folder", type=Path)
    inner.add_argument("--steps", type=int, default=3)
    args = parser.parse_args(argv)
    if args.command == "probe":
        probe(args.folder, args.steps)
    elif args.command == "allocators":
        allocators_table(args.model, args.workers, args.layouts, args.steps)
    elif args.command == "phases":
        phases_table(args.model, args.workers, args.layouts, args.steps, args.gbs)
    else:
        against(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
