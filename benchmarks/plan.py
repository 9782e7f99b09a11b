"""Plan benchmark: how long a plan takes, and planned time to train against published runs.

1. Speed: a plan for Llama 3 405B over 7 sizes (8 to 512 nodes) of 3 GPU types (DGX A100,
   DGX H100, HGX H200): 21 full enumerations. Target: under 10 s.
2. Accuracy: every row of data/published_durations.csv (a published token count with a
   published duration or GPU-hours) planned at its published GPU count (or, where the count
   is not published, at --gpus-unknown GPUs, printed), with the planned days and GPU-hours
   against the published ones, and whether the published figure lies inside the plan's
   prediction interval ("uncalibrated" where the plan has none).

    python benchmarks/plan.py
"""

from __future__ import annotations

import argparse
import csv
import tempfile
import time
from pathlib import Path

import yaml

from autotune.planning.build import PlanConfig
from autotune.planning.build import make_plan
from autotune.planning.plan import PlanPoint

ROOT = Path(__file__).resolve().parents[1]
DURATIONS = ROOT / "data" / "published_durations.csv"
CLUSTER_OF = {"A100-SXM-80GB": "dgx-a100", "H100-SXM-80GB": "dgx-h100",
              "H200-SXM-141GB": "hgx-h200"}
SPEED_CLUSTERS = tuple(f"{name}:8,16,...,512" for name in ("dgx-a100", "dgx-h100", "hgx-h200"))


def speed(repeats: int) -> None:
    """Time the 405B plan (wall and CPU seconds of this process), `repeats` times."""
    config = PlanConfig(model="llama3-405b", clusters=SPEED_CLUSTERS, tokens="15.6T")
    print("plan speed: llama3-405b, 7 sizes (8-512 nodes) x 3 GPU types")
    print(f"{'run':>4} {'sizes':>6} {'feasible':>9} {'wall s':>8} {'cpu s':>7}")
    for i in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        plan = make_plan(config)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        ok = sum(p.ok for p in plan.points)
        print(f"{i + 1:>4} {len(plan.points):>6} {ok:>9} {wall:>8.2f} {cpu:>7.2f}")
    print("target: under 10 s\n")


def _model_ref(row: dict[str, str], folder: Path) -> str:
    """The row's preset, or a model YAML of its published shape (Llama layers)."""
    if row["model_preset"]:
        return row["model_preset"]
    shape = {key: int(row[key]) for key in ("num_layers", "hidden_size", "num_attention_heads",
                                            "ffn_hidden_size", "vocab_size")}
    shape.update(num_query_groups=int(row["num_kv_heads"]), activation="swiglu",
                 normalization="rmsnorm", position_embedding="rope", add_bias_linear=False,
                 tied_embeddings=False, max_position_embeddings=int(row["seq_length"]),
                 hidden_dropout=0.0, attention_dropout=0.0)
    path = folder / f"{row['row_id']}.yaml"
    path.write_text(yaml.safe_dump(shape))
    return str(path)


def _inside(published: float, low: float | None, high: float | None) -> str:
    if low is None or high is None:
        return "uncalibrated"
    return "yes" if low <= published <= high else "no"


def accuracy(gpus_unknown: int) -> None:
    """Planned days and GPU-hours against each published run."""
    rows = list(csv.DictReader(DURATIONS.open()))
    head = (f"{'row':<13} {'GPUs':>6} {'planned tok/s/GPU':>17} {'days':>7} {'pub days':>9} "
            f"{'GPU-hours':>11} {'published':>11} {'ratio':>6} {'inside':>13}  layout")
    print(f"planned vs published time to train ({DURATIONS.relative_to(ROOT)})")
    print(head)
    with tempfile.TemporaryDirectory() as folder:
        for row in rows:
            gpus = int(row["num_gpus"]) if row["num_gpus"] else gpus_unknown
            seq = int(row["seq_length"])
            gbs = int(row["global_batch_tokens"]) // seq if row["global_batch_tokens"] else None
            config = PlanConfig(model=_model_ref(row, Path(folder)),
                                clusters=(f"{CLUSTER_OF[row['gpu_type']]}:{gpus // 8}",),
                                tokens=row["tokens"],
                                train={"seq_length": seq, "global_batch_size": gbs})
            (p,) = make_plan(config).points
            _print_row(row, gpus, p)
    print("GPUs marked * are not published: the plan's assumption (--gpus-unknown).")
    print("ratio = planned / published GPU-hours; 'inside' tells whether the published "
          "GPU-hours lie in the plan's interval.")


def _print_row(row: dict[str, str], gpus: int, p: PlanPoint) -> None:
    published_hours = float(row["published_gpu_hours"])
    mark = "" if row["num_gpus"] else "*"
    if not p.ok:
        print(f"{row['row_id']:<13} {gpus:>5}{mark:1} infeasible: {p.reason}")
        return
    days = row["published_days"] or "-"
    print(f"{row['row_id']:<13} {gpus:>5}{mark:1} {p.tokens_per_s / gpus:>17,.0f} "  # type: ignore[operator]
          f"{p.days:>7.1f} {days:>9} {p.gpu_hours:>11,.0f} {published_hours:>11,.0f} "
          f"{p.gpu_hours / published_hours:>6.2f} "  # type: ignore[operator]
          f"{_inside(published_hours, p.gpu_hours_low, p.gpu_hours_high):>13}  {p.layout}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=2, help="timed runs of the speed plan")
    parser.add_argument("--gpus-unknown", type=int, default=2048,
                        help="GPUs to plan rows whose GPU count is not published")
    args = parser.parse_args()
    speed(args.repeats)
    accuracy(args.gpus_unknown)


if __name__ == "__main__":
    main()
