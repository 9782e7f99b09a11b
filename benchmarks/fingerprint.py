"""Behaviour fingerprint of the enumeration: feasible ids, step times, peaks, removals per rule.

A structural change (moving modules, merging owners) must leave every figure unchanged. Run it
before and after and compare the printed digests (or the JSON written with --out):

    python benchmarks/fingerprint.py --out /tmp/before.json
    ... change ...
    python benchmarks/fingerprint.py --out /tmp/after.json --against /tmp/before.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
from pathlib import Path

import numpy as np

from autotune import enumerate_layouts
from autotune import load_config
from autotune import load_space

PROBLEMS = [
    ("gpt3-175b", "dgx-a100:16", {}),
    ("llama3-70b", "dgx-h100:8", {"seq_length": 8192}),
    ("llama3-8b", "dgx-h100:1", {}),
    ("llama3-405b", "dgx-h100:64", {}),
    ("mixtral-8x7b", "dgx-h100:8", {}),
    ("deepseek-v3", "dgx-h100:32", {}),
    ("tiny-gpt", "dgx-a100:1", {}),
]
FRAMEWORKS = ("megatron", "deepspeed")


def fingerprint(
    model: str, cluster: str, framework: str, extra: dict[str, int]
) -> dict[str, object]:
    """The figures of one enumeration, rounded to 12 significant digits, and their digest."""
    cfg = load_config(model, cluster, framework=framework, **extra)  # type: ignore[arg-type]
    result = enumerate_layouts(cfg, load_space(None, framework))
    ids = [layout.id for layout in result.feasible.rows()]
    step = np.asarray(result.estimates.step_time_s, dtype=float)
    peak = np.asarray(result.estimates.memory.total, dtype=float)
    body = {
        "ids": ids,
        "step": [float(f"{x:.12g}") for x in step],
        "peak": [float(f"{x:.12g}") for x in peak],
        "removed": dict(sorted(result.removed.items())),
        "total": result.total,
    }
    digest = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]
    return {"feasible": len(ids), "digest": digest, **body}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--against", type=Path)
    args = parser.parse_args()
    results: dict[str, dict[str, object]] = {}
    print(f"{'problem':48} {'feasible':>9} {'digest':>17}")
    for model, cluster, extra in PROBLEMS:
        for framework in FRAMEWORKS:
            key = f"{model} on {cluster} ({framework})"
            results[key] = fingerprint(model, cluster, framework, extra)
            print(f"{key:48} {results[key]['feasible']:>9} {results[key]['digest']:>17}")
    if args.out:
        args.out.write_text(json.dumps(results))
    if args.against:
        before = json.loads(args.against.read_text())
        same = sum(before.get(k, {}).get("digest") == v["digest"] for k, v in results.items())
        print(f"unchanged: {same} of {len(results)}")


if __name__ == "__main__":
    main()
