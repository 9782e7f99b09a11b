"""One search against one hidden cluster, trial by trial: what ran, what the model expected,
what it learned.

Usage:
    python benchmarks/search_trace.py --scenario mixtral-8x7b [--seed 3] [--budget 20]

Runs `autotune.search.proposal.Proposer` (the proposer `autotune tune` uses, without Optuna
around it) against `benchmarks/alien_truth.py` with a scenario of `benchmarks/search.py` and
prints, per trial: why it was chosen, the layout and the model's rank of it, predicted and
measured tokens/s, its true throughput over the true best, its probability of fitting and
memory need (the model's corrected need on the measured scale, and the truth's device need:
its allocator peak with fragmentation plus its runtime reserve); then the refit after it: the
fitted term scales, the discrepancy σ (the residuals' prior σ from the out-of-sample errors)
and where the refitted belief ranks the true best.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from search import SCENARIOS  # noqa: E402
from search import make_truth  # noqa: E402

from autotune.costmodel.constants import constants_for  # noqa: E402
from autotune.search.proposal import Outcome  # noqa: E402
from autotune.search.proposal import Proposer  # noqa: E402
from autotune.search.surrogate import amplitude  # noqa: E402
from autotune.space.search_space import enumerate_layouts  # noqa: E402
from autotune.space.search_space import load_space  # noqa: E402
from autotune.units import GIB  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", required=True, choices=[s.model for s in SCENARIOS])
    parser.add_argument("--seed", type=int, default=0, help="hidden cluster 1000 + seed")
    parser.add_argument("--budget", type=int, default=20)
    args = parser.parse_args()
    scenario = next(s for s in SCENARIOS if s.model == args.scenario)
    cfg = scenario.config()
    space = load_space(None, scenario.framework).resolved(cfg)
    k = constants_for(cfg.cluster.gpu, cfg.train.software_stack)
    feasible = enumerate_layouts(cfg, space, k).feasible
    truth = make_truth("alien", cfg, 1000 + args.seed, scenario.distortion)
    rates = np.where(truth.oom(feasible), 0.0, truth.tokens_per_s(feasible))
    best = int(np.argmax(rates))
    true_need = (truth.peak_allocated_bytes(feasible) * (1 + truth.fragmentation(feasible))
                 + truth.reserve_bytes(feasible))
    console = Console(width=200)
    console.print(f"{args.scenario}, hidden cluster {1000 + args.seed}: {len(feasible):,} "
                  f"feasible layouts; true best {feasible.row(best).text} at model rank "
                  f"{best + 1}, {rates[best]:,.0f} tokens/s; device "
                  f"{cfg.cluster.gpu.memory_bytes / GIB:.1f} GiB")
    proposer = Proposer(cfg, feasible, k, seed=args.seed)
    outcomes: list[Outcome] = []
    table = Table()
    for column in ("#", "reason", "layout", "rank", "status", "predicted", "measured",
                   "true/best", "P(fit)", "need GiB", "true need", "best P(fit) / bar",
                   "term scales off by 10 %+",
                   "discrepancy", "true best ranked"):
        table.add_column(column, justify="left" if column in ("reason", "layout") else "right",
                         overflow="fold")
    for number in range(1, args.budget + 1):
        proposal = proposer.propose(outcomes, [])
        if proposal is None:
            break
        layout = proposal.layout
        i = proposer.index[layout.id]
        p_fits = proposer.memory_and_fit(outcomes)[1]
        p_fit = float(p_fits[i])
        best_fit = f"{p_fits[best]:.2f} / {proposer.bar(outcomes):.2f}"
        m = truth.measure(layout)
        outcomes.append(Outcome(layout, m.status, m.step_time_s, m.peak_memory_bytes,
                                m.step_time_spread))
        belief = proposer.belief(outcomes)
        ok = [o for o in outcomes if o.status == "ok" and o.step_time_s]
        off = ", ".join(f"{name} x{v:.2f}" for name, v in belief.terms.scales().items()
                        if abs(np.log(v)) >= np.log(1.1))
        table.add_row(
            str(number), proposal.reason, layout.text, f"{i + 1:,}", m.status,
            f"{proposal.predicted_tokens_per_s:,.0f}",
            f"{m.tokens_per_s:,.0f}" if m.tokens_per_s else "-",
            f"{rates[i] / rates[best]:.3f}", f"{p_fit:.2f}",
            f"{proposal.need_bytes / GIB:.1f}", f"{true_need[i] / GIB:.1f}", best_fit, off or "-",
            f"{amplitude(proposer.prequential(ok)):.2f}",
            f"{int((belief.mean > belief.mean[best]).sum()) + 1:,}",
        )
    console.print(table)


if __name__ == "__main__":
    main()
