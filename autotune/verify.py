"""Does the winner train correctly? Its loss curve against a reference layout's, same data.

The reference is pure data parallelism over the same processes (tp = pp = cp = 1, the winner's
micro-batch, the accumulation that keeps the global batch), with the lowest ZeRO stage and
offload that fit; the built-in workloads draw the same sequences per step for every layout with
the same micro-batch size, and start from the same weights. Both run N steps (no warm-up) with
the same runner; the curves must agree step by step within a relative tolerance suited to the
precision (`TOLERANCE`). A layout that splits the model wrongly, scales gradients wrongly or
feeds replicas the same data drifts away from the reference after the first optimizer step.

Example:
    >>> result = verify(cfg, winner, LocalRunner(steps=6, warmup=0), Path("study"))
    >>> result.passed, result.max_rel_diff
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from autotune.exceptions import AutotuneError
from autotune.layout import Layout
from autotune.runners.base import Runner
from autotune.specs import AutotuneConfig
from autotune.trial import TrialPipeline
from autotune.workloads.records import parse_records

VERIFY_JSON = "verify.json"
TOLERANCE = {"fp32": 1e-4, "bf16": 2e-2, "fp16": 1e-2, "fp8": 5e-2}
"""Largest relative loss difference per step between two correct layouts: fp32 differs only in
reduction order (the workload's own tests see < 1e-5 over four steps); 16-bit formats keep 8
(bf16) or 11 (fp16) mantissa bits, so a few ulps at loss ~10 are 1e-2 relative."""


@dataclasses.dataclass(frozen=True)
class VerifyResult:
    """The winner's and the reference's loss curves and whether they agree."""

    winner: str
    reference: str
    winner_losses: list[float]
    reference_losses: list[float]
    tolerance: float
    max_rel_diff: float | None
    worst_step: int | None
    passed: bool
    reason: str

    def to_dict(self) -> dict[str, Any]:
        """JSON form (verify.json)."""
        return dataclasses.asdict(self)


def reference_layout(pipeline: TrialPipeline, winner: Layout) -> Layout:
    """Pure data parallelism on the winner's processes with its micro-batch, the lowest ZeRO
    stage (and offload) that passes the rules.

    Raises:
        AutotuneError: no data-parallel layout of the same global batch fits.
    """
    world, batch = winner.world_size, winner.global_batch_size
    if batch % (winner.mbs * world):
        raise AutotuneError(
            f"verify: global batch {batch} is not a multiple of micro-batch {winner.mbs} × "
            f"{world} data-parallel ranks; verify a winner whose batch splits over pure dp")
    base = Layout(dp=world, mbs=winner.mbs, gas=batch // (winner.mbs * world),
                  recompute=winner.recompute)
    tried = []
    for zero in (0, 1, 2, 3):
        for offload in ("none", "optimizer", "optimizer+params"):
            candidate = dataclasses.replace(base, zero=zero, offload=offload)
            broken = pipeline.violations(candidate)
            if not broken:
                return candidate
            tried.append(f"zero={zero} offload={offload}: {broken[0][0]}")
    raise AutotuneError("verify: no pure data-parallel reference layout fits (" +
                        "; ".join(tried[:3]) + "); verify on a larger cluster")


def loss_curve(directory: Path) -> list[float]:
    """The per-step losses a trial recorded in its metrics.jsonl (NaN for a missing loss)."""
    path = directory / "metrics.jsonl"
    if not path.exists():
        return []
    steps = [r for line in path.read_text().splitlines()
             for r in parse_records(line) if r.get("event") == "step"]
    return [math.nan if s.get("loss") is None else float(s["loss"]) for s in steps]


def compare(winner: list[float], reference: list[float], tolerance: float
            ) -> tuple[float | None, int | None, str]:
    """(largest relative difference, its step, reason when they disagree: "" otherwise)."""
    if not winner or len(winner) != len(reference):
        return None, None, (f"the runs recorded {len(winner)} and {len(reference)} losses; "
                            "both must run the same steps")
    diffs = [abs(a - b) / abs(b) if math.isfinite(a) and math.isfinite(b) and b else math.inf
             for a, b in zip(winner, reference, strict=True)]
    worst = max(range(len(diffs)), key=diffs.__getitem__)
    if diffs[worst] <= tolerance:
        return diffs[worst], worst, ""
    return diffs[worst], worst, (
        f"loss at step {worst} is {winner[worst]:.6g} against the reference's "
        f"{reference[worst]:.6g} ({diffs[worst]:.2e} relative > {tolerance:g}): the winner "
        "does not train the same model; check its parallel split, gradient scaling and that "
        "every data-parallel rank reads its own data")


def verify(cfg: AutotuneConfig, winner: Layout, runner: Runner, out_dir: Path,
           reference: Layout | None = None) -> VerifyResult:
    """Run `winner` and the reference for the runner's steps and compare their loss curves;
    writes DIR/verify.json and the two trials under DIR/verify/."""
    pipeline = TrialPipeline(cfg, runner)
    runner.check(cfg)
    reference = reference or reference_layout(pipeline, winner)
    tolerance = TOLERANCE.get(cfg.train.precision, TOLERANCE["bf16"])
    curves, statuses = [], []
    for number, (name, layout) in enumerate((("winner", winner), ("reference", reference))):
        directory = out_dir / "verify" / f"{name}-{layout.id}"
        m = pipeline.run(layout, number=number, directory=directory).measurement
        statuses.append(f"{name} {m.status}: {m.reason}" if m.status != "ok" else "")
        curves.append(loss_curve(directory))
    worst, step, reason = compare(curves[0], curves[1], tolerance)
    failed = "; ".join(s for s in statuses if s)
    result = VerifyResult(winner.text, reference.text, curves[0], curves[1], tolerance, worst,
                          step, not (failed or reason), failed or reason)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / VERIFY_JSON).write_text(json.dumps(result.to_dict(), indent=2) + "\n")
    return result


def read_verify(out_dir: str | Path) -> dict[str, Any] | None:
    """DIR/verify.json, or None when the folder has none."""
    path = Path(out_dir) / VERIFY_JSON
    return json.loads(path.read_text()) if path.exists() else None
