"""The whole model against real training on this machine: calibrate, then predict real trials.

1. `calibrate` the local CPU cluster (gloo workers): microbenchmarks only, no training step, so
   the calibration never sees the trials it is judged on.
2. Run real DeepSpeed trials (`--runner local`) of two small models over layouts varying dp,
   tp, pp, cp, ZeRO 0-3, offload and mbs.
3. Print predicted (uncalibrated and calibrated) against measured step time and peak memory per
   layout, with median and max |error|.

    python benchmarks/cpu_validation.py [--workers 2] [--steps 5] [--out DIR]

Targets: median |error| <= 10 % (max 25 %) on step time, <= 15 % on peak memory; calibrate in
under 2 minutes. CPU heavy (a few minutes per model): run it niced on a quiet machine. Each trial
also reports how long its most-delayed rank waited for a CPU that other processes held
(`autotune.measurement.cpu_wait_s`): on a shared machine that wait is contention, not
the layout, and the errors are printed against the step less it too. A MoE trial also
records the load its experts ran at (DeepSpeed pads every expert to the busiest one's count);
the step predicted at that load is printed beside, and summarised on its own line: it is read
off the trial being judged, so it is not a prediction. `--layouts N` runs the first N layouts
only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

from autotune.calibration.calibrate import calibrate_cluster
from autotune.calibration.file import apply_calibration
from autotune.costmodel.constants import constants_for
from autotune.costmodel.estimate import estimate as estimate_layout
from autotune.exceptions import AutotuneError
from autotune.layout import Layout
from autotune.runners.local import LocalRunner
from autotune.space.search_space import enumerate_layouts
from autotune.space.search_space import load_space
from autotune.specs import AutotuneConfig
from autotune.specs.inputs import load_config
from autotune.trial import TrialPipeline
from autotune.units import GIB

LAYOUTS = [
    "tp=1,pp=1,cp=1,zero=0,mbs=1", "tp=1,pp=1,cp=1,zero=0,mbs=4", "tp=1,pp=1,cp=1,zero=1,mbs=2",
    "tp=1,pp=1,cp=1,zero=2,mbs=2", "tp=1,pp=1,cp=1,zero=3,mbs=2", "tp=1,pp=1,cp=1,zero=3,mbs=8",
    "tp=1,pp=1,cp=1,zero=2,offload=optimizer,mbs=2",
    "tp=1,pp=1,cp=1,zero=3,offload=optimizer+params,mbs=2",
    "tp=2,pp=1,cp=1,zero=0,mbs=2", "tp=2,pp=1,cp=1,zero=1,mbs=4",
    "tp=1,pp=2,cp=1,zero=0,mbs=2", "tp=1,pp=2,cp=1,zero=1,mbs=1",
    "tp=1,pp=1,cp=2,zero=0,mbs=2", "tp=1,pp=1,cp=2,zero=2,mbs=4",
]
"""Layouts of 2 workers: dp 2 or 1, tp, pp, cp 2, ZeRO 0-3, both offloads, mbs 1-8."""
MOE_LAYOUTS = [text for text in LAYOUTS
               if "tp=2" not in text and "zero=3" not in text and "cp=2" not in text] + [
    "tp=1,pp=1,cp=1,ep=2,zero=0,mbs=2", "tp=1,pp=1,cp=1,ep=2,zero=1,mbs=4",
    "tp=1,pp=1,cp=1,ep=2,zero=2,mbs=1", "tp=1,pp=1,cp=1,ep=2,zero=0,mbs=4",
    "tp=1,pp=1,cp=1,ep=2,zero=1,mbs=1",
]
"""The MoE model's: DeepSpeed's MoE refuses ZeRO-3 and Ulysses, the CPU workload tp > 1; ep 2
instead."""
MODELS = {"tiny-gpt": LAYOUTS, "tiny-moe": MOE_LAYOUTS}


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1%}"


def validate(model: str, workers: int, steps: int, out: Path,
             layouts: list[str]) -> list[dict[str, object]]:
    """Calibrate for `model`, run its trials, return one row per layout."""
    cfg = load_config(model, "local", framework="deepspeed", processes=workers)
    feasible = enumerate_layouts(cfg, load_space(None, "deepspeed")).feasible
    started = time.monotonic()
    calibration = calibrate_cluster(cfg, feasible, out / model / "calibration")
    took = time.monotonic() - started
    calibration.write(out / model / "calibration.yaml")
    print(f"{model}: calibrate took {took:.0f} s ({len(calibration.points)} points); warnings: "
          f"{'; '.join(calibration.warnings) or 'none'}", flush=True)
    calibrated = apply_calibration(cfg, calibration, str(out / model / "calibration.yaml"))
    runner = LocalRunner(steps=steps, warmup=2, hang_timeout_s=300)
    rows = []
    for number, text in enumerate(layouts):
        layout = Layout.parse(text, cfg.world_size, cfg.train.global_batch_size,
                              _framework(cfg))
        plain, fitted = estimate_layout(cfg, layout), estimate_layout(calibrated, layout)
        try:
            result = TrialPipeline(calibrated, runner).run(layout, number=number,
                                                           directory=out / model / "trials")
        except AutotuneError as refused:  # a layout this model cannot run: say so, go on
            print(f"  {text}: refused: {refused}", flush=True)
            continue
        m = result.measurement
        breakdown = m.extra.get("breakdown") or {}
        waited = float(breakdown.get("cpu_wait_s", 0.0))
        load = breakdown.get("moe_load_imbalance")
        at_load = (estimate_layout(_at_load(calibrated, float(load), layout.mbs),
                                   layout).step_time_s if load else None)
        one = constants_for(calibrated.cluster.gpu,
                            calibrated.train.software_stack).moe_load_imbalance
        preset = 1 + (one - 1) / layout.mbs**0.5
        row: dict[str, object] = {"model": model, "layout": text, "status": m.status,
                                  "measured_s": m.step_time_s, "peak": m.peak_memory_bytes,
                                  "plain_s": plain.step_time_s, "calibrated_s": fitted.step_time_s,
                                  "predicted_peak": fitted.peak_memory_bytes,
                                  "predicted_parts": fitted.time_parts,
                                  "predicted_memory": fitted.memory_parts,
                                  "measured_parts": breakdown, "cpu_wait_s": waited,
                                  "quiet_s": (m.step_time_s or 0) - waited,
                                  "expert_load": load, "at_load_s": at_load,
                                  "load": os.getloadavg()[0]}
        rows.append(row)
        print(f"  {text}: {m.status} measured {m.step_time_s or 0:.3f} s ({waited:.3f} s of it "
              f"waiting for a CPU), predicted {fitted.step_time_s:.3f} s (uncalibrated "
              f"{plain.step_time_s:.3f} s)" + (
                  f"; the trial's experts ran {load:.2f}x the balanced rows (calibrated: "
                  f"{preset:.2f}x): {at_load:.3f} s "
                  "predicted at its load" if load and at_load else ""), flush=True)
    return rows


def _at_load(cfg: AutotuneConfig, load: float, mbs: int) -> AutotuneConfig:
    """`cfg` charging the trial's own expert `load` at its micro-batch of `mbs` sequences
    (`moe_load_imbalance` is one sequence's on CPU workers: `kernels.load_imbalance`)."""
    gpu = cfg.cluster.gpu
    one = 1 + (max(load, 1.0) - 1) * mbs**0.5
    constants = {**gpu.constants, "moe_load_imbalance": min(one, 4.0)}
    return cfg.model_copy(update={"cluster": cfg.cluster.model_copy(
        update={"gpu": gpu.model_copy(update={"constants": constants})})})


def _framework(cfg: AutotuneConfig) -> object:
    from autotune.frameworks import framework_of

    return framework_of(cfg)


def _errors(rows: list[dict[str, object]], predicted: str, measured: str) -> list[float]:
    return [float(r[predicted]) / float(r[measured]) - 1  # type: ignore[arg-type]
            for r in rows if r["status"] == "ok" and r[measured] and r.get(predicted)]


def main(argv: list[str] | None = None) -> int:
    """Run the validation and print the table (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("cpu-validation"))
    parser.add_argument("--models", nargs="+", default=list(MODELS))
    parser.add_argument("--layouts", type=int, default=len(LAYOUTS),
                        help="run only the first N layouts of each model (a quicker check)")
    args = parser.parse_args(argv)
    rows = []
    for model in args.models:
        rows += validate(model, args.workers, args.steps, args.out,
                         MODELS.get(model, LAYOUTS)[: args.layouts])
        (args.out / "rows.json").write_text(json.dumps(rows, indent=1, default=str))
    print("\n| model | layout | status | measured step (s) | CPU wait (s) | predicted (s) | "
          "error | uncalibrated (s) | error | measured peak (GiB) | predicted (GiB) | error | "
          "expert load | at that load (s) | error |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        ok = r["status"] == "ok" and bool(r["measured_s"])
        step = float(r["measured_s"] or 0)  # type: ignore[arg-type]
        peak = float(r["peak"] or 0)  # type: ignore[arg-type]
        calibrated, plain = float(r["calibrated_s"]), float(r["plain_s"])  # type: ignore[arg-type]
        predicted_peak = float(r["predicted_peak"])  # type: ignore[arg-type]
        print(f"| {r['model']} | {r['layout']} | {r['status']} | {step:.3f} | "
              f"{float(r['cpu_wait_s']):.3f} | {calibrated:.3f} | "  # type: ignore[arg-type]
              f"{_pct(calibrated / step - 1 if ok else None)} | {plain:.3f} | "
              f"{_pct(plain / step - 1 if ok else None)} | {peak / GIB:.3f} | "
              f"{predicted_peak / GIB:.3f} | "
              f"{_pct(predicted_peak / peak - 1 if ok and peak else None)} | "
              f"{_load_cells(r, step if ok else 0.0)} |")
    for label, predicted, measured in (("step time, calibrated", "calibrated_s", "measured_s"),
                                       ("step time, uncalibrated", "plain_s", "measured_s"),
                                       ("step time, calibrated, against the step less the "
                                        "most-delayed rank's CPU wait", "calibrated_s", "quiet_s"),
                                       ("step time, calibrated, at each MoE trial's own "
                                        "measured expert load (read off the trial it is "
                                        "judged on: not a prediction)", "at_load_s",
                                        "measured_s"),
                                       ("peak memory", "predicted_peak", "peak")):
        errors = [abs(e) for e in _errors(rows, predicted, measured)]
        if errors:
            print(f"{label}: median |error| {statistics.median(errors):.1%}, max "
                  f"{max(errors):.1%} over {len(errors)} trials")
    print_parts(rows)
    return 0


def _load_cells(row: dict[str, object], step: float) -> str:
    """The MoE trial's measured expert load, the step predicted at it and its error."""
    load, at_load = row.get("expert_load"), row.get("at_load_s")
    if not load or not at_load:
        return "- | - | -"
    at = float(at_load)  # type: ignore[arg-type]
    return (f"{float(load):.2f} | {at:.3f} | "  # type: ignore[arg-type]
            f"{_pct(at / step - 1 if step else None)}")


def print_parts(rows: list[dict[str, object]]) -> None:
    """Measured (rank 0) against predicted seconds per part of the step."""
    names = ("compute", "tp_comm", "cp_comm", "ep_comm", "pp_p2p", "pp_bubble", "dp_comm",
             "zero3_gather", "offload", "optimizer")
    print("\n| model | layout | " + " | ".join(names) + " |")
    print("|---|---|" + "---:|" * len(names))
    for r in rows:
        measured = r["measured_parts"].get("parts", {})  # type: ignore[attr-defined]
        predicted = r["predicted_parts"]
        cells = [f"{measured.get(n, 0.0):.2f} / {predicted.get(n, 0.0):.2f}"  # type: ignore
                 for n in names]
        print(f"| {r['model']} | {r['layout']} | " + " | ".join(cells) + " |")
    print("(measured / predicted seconds; the pipeline's measured pp_p2p holds its bubble)")


if __name__ == "__main__":
    sys.exit(main())
