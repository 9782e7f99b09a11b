"""Search quality against a truth the model does not know, beside what a user would do without it.

Usage:
    python benchmarks/search.py [--seeds 5] [--budget 30] [--truth alien|perturbed|both]
                                [--scenario NAME ...] [--quick]

Truths (each seed is another hidden cluster):
- alien: `benchmarks/alien_truth.py`, step time and memory written independently of autotune's
  model (other functional forms, 10-20 % more activation memory, a larger runtime reserve and
  allocator fragmentation that autotune cannot see, 1.5 % noise on every measurement); a layout
  that does not fit returns status `oom`. Each scenario adds a `Distortion` (attention 2x
  slower, pipeline fill and drain 1.5x, NICs at half rate, ZeRO-3 gathers 2x slower, 20 % more
  activation memory and 4 GiB more runtime reserve) so the true best is not the model's #1;
  the table prints where the model ranks it.
- perturbed: autotune's own model with perturbed constants and a per-layout jitter (the
  `simulate` runner with noise 0.15): the model's functional form and memory, so it is a
  sanity check, not evidence.

Methods, counting only trials that ran (cluster time):
- autotune: `autotune.search.study.tune` with the truth as its runner (in-memory Optuna storage);
- walk ranking: run autotune's feasible layouts in the model's order (no search);
- random: uniform over the feasible layouts;
- DS autotuner: `benchmarks/deepspeed_autotuner.py`, ZeRO stage × micro-batch with its
  own stop rule, on the other dimensions of the model's best layout that it can profile
  (pp = 1: its profile run uses ZeRO-3); its probes at gradient accumulation 1 change the global
  batch, so they count as trials but cannot be its answer.

The true best is the fastest layout that passes the structural rules and fits the truth.
Regret after k trials is 1 − (true throughput of the best layout measured so far) / (true best)
(simple regret); "to 2 %" counts trials until a layout within 2 % of the true best was measured.
Noise can still make another layout look best: "pick @20" is the regret of the layout with the
highest measured throughput after 20 trials (what `tune` renders as the winner). Printed per
scenario and method: median and worst seed of each ('>B' = not within the budget), OOM trials
per study, trials on rule-rejected layouts and layouts run twice (worst study), trials run.
Targets for autotune on the alien truth: every scenario's median trials to 2 % ≤ 10 and its
worst ≤ 15, regret after 10 trials ≤ 2 %, at most 2 OOM trials per study, no rule-rejected
trial, no layout run twice, and different seeds run different trials.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import optuna
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))

from alien_truth import AlienTruth  # noqa: E402
from alien_truth import Distortion  # noqa: E402
from alien_truth import TruthRunner  # noqa: E402
from deepspeed_autotuner import DeepSpeedAutotuner  # noqa: E402

from autotune.costmodel.constants import constants_for  # noqa: E402
from autotune.costmodel.estimate import evaluate  # noqa: E402
from autotune.costmodel.memory import usable_gpu_bytes  # noqa: E402
from autotune.layout import Layout  # noqa: E402
from autotune.layout import LayoutTable  # noqa: E402
from autotune.measurement import Measurement  # noqa: E402
from autotune.runners.base import Runner  # noqa: E402
from autotune.runners.simulate import SimulateRunner  # noqa: E402
from autotune.runners.simulate import layout_jitter  # noqa: E402
from autotune.search.settings import TuneSettings  # noqa: E402
from autotune.search.study import tune  # noqa: E402
from autotune.space.rules import rules_for  # noqa: E402
from autotune.space.search_space import candidates  # noqa: E402
from autotune.space.search_space import enumerate_layouts  # noqa: E402
from autotune.space.search_space import load_space  # noqa: E402
from autotune.specs.inputs import load_config  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Scenario:
    """A problem and how its hidden cluster departs from any model (`Distortion`)."""

    model: str
    cluster: str
    framework: str
    distortion: Distortion = Distortion()
    seq_length: int | None = None
    global_batch_size: int | None = None

    def config(self):
        return load_config(self.model, self.cluster, framework=self.framework,
                           seq_length=self.seq_length, global_batch_size=self.global_batch_size)


MEMORY = Distortion(activation=1.2, reserve_gib=4.0)
ALL = Distortion(attention=2.0, bubble=1.5, nic=0.5, zero3_gather=2.0, activation=1.2,
                 reserve_gib=4.0)
SCENARIOS = [
    Scenario("llama3-8b", "dgx-h100:1", "megatron", MEMORY),
    Scenario("mixtral-8x7b", "dgx-h100:2", "megatron", ALL),
    Scenario("llama2-13b", "dgx-a100:8", "deepspeed", ALL),
    Scenario("llama3-70b", "dgx-h100:8", "megatron", ALL, seq_length=8192,
             global_batch_size=512),
    Scenario("gpt3-13b", "hgx-h200:16", "deepspeed", ALL),
    Scenario("mixtral-8x22b", "dgx-h100:32", "megatron", ALL),
    Scenario("gpt3-175b", "dgx-a100:64", "megatron", Distortion(nic=0.5)),
    Scenario("llama3-405b", "dgx-h100:128", "megatron", ALL),
]
"""8 to 1,024 GPUs, dense Llama and GPT presets and two Mixtral MoE models, both frameworks;
on the two Mixtral problems the true best sits at the model's rank 200 or lower (the table's
'true best at' column)."""
QUICK = ("llama3-8b", "mixtral-8x7b", "llama3-70b", "mixtral-8x22b")
"""--quick: four scenarios (8 to 256 GPUs, dense and MoE), 2 seeds, budget 20."""
METHODS = ("autotune", "walk ranking", "random", "DS autotuner")
MEMORY_RULES = ("memory_fits",)


@dataclasses.dataclass(frozen=True)
class Trial:
    """One run of a method: what it measured and what it truly is."""

    key: str
    status: str
    measured: float = 0.0
    true: float = 0.0
    answer: bool = True
    """False for runs that cannot be the method's answer (another global batch, a profile)."""


# --- truths ----------------------------------------------------------------------------------


class PerturbedTruth:
    """autotune's model with perturbed constants: today's `simulate --noise` surface."""

    def __init__(self, cfg, seed: int, noise: float = 0.15) -> None:
        self.cfg, self.seed = cfg, seed
        self.runner = SimulateRunner(noise=noise, seed=seed)
        self.k = self.runner.truth_constants(cfg)

    def tokens_per_s(self, t: LayoutTable) -> np.ndarray:
        values = evaluate(self.cfg, t, self.k)
        jitter = np.array([layout_jitter(r, self.runner.noise, self.seed) for r in t.rows()])
        tokens = t.mbs * t.dp * np.maximum(t.gas, 1) * self.cfg.train.seq_length
        return tokens / (values.step_time_s * jitter)

    def oom(self, t: LayoutTable) -> np.ndarray:
        return evaluate(self.cfg, t, self.k).peak_memory_bytes > usable_gpu_bytes(
            self.cfg, self.k
        )

    def forward_activation_bytes(self, t: LayoutTable) -> np.ndarray:
        one = dataclasses.replace(t, gas=np.ones_like(t.gas))
        memory = evaluate(self.cfg, one, self.k).memory.parts
        return memory["activations"] + memory["logits"]

    def measure(self, layout: Layout, repetition: int = 0) -> Measurement:
        table = LayoutTable.from_layouts([layout])
        if bool(self.oom(table)[0]):
            return Measurement("oom", reason="simulated peak memory exceeds the GPU")
        rate = float(self.tokens_per_s(table)[0])
        tokens = layout.global_batch_size * self.cfg.train.seq_length
        return Measurement("ok", step_time_s=tokens / rate, tokens_per_s=rate)

    def runner_for_tune(self) -> Runner:
        return self.runner


def make_truth(kind: str, cfg, seed: int, distortion: Distortion | None = None):
    if kind == "alien":
        return AlienTruth(cfg, seed, distortion)
    return PerturbedTruth(cfg, seed)


def tune_runner(truth) -> Runner:
    return truth.runner_for_tune() if isinstance(truth, PerturbedTruth) else TruthRunner(truth)


# --- the problem -----------------------------------------------------------------------------


def structural_violations(cfg, t: LayoutTable, skip: tuple[str, ...] = ()) -> np.ndarray:
    """True where a row breaks a rule other than the model's memory rule (or `skip`)."""
    k = constants_for(cfg.cluster.gpu, cfg.train.software_stack)
    broken = np.zeros(len(t), dtype=bool)
    with np.errstate(divide="ignore", invalid="ignore"):
        for rule in rules_for(cfg.train.framework):
            if rule.name in MEMORY_RULES or rule.name in skip:
                continue
            broken |= rule.check(cfg, t, k)
    return broken


def true_best(cfg, space, truth) -> float:
    """Fastest layout of the space that passes the structural rules and fits the truth."""
    table = candidates(cfg, space.resolved(cfg))
    table = table.take(~structural_violations(cfg, table))
    rates = np.where(truth.oom(table), 0.0, truth.tokens_per_s(table))
    return float(rates.max())


def model_rank(feasible: LayoutTable, truth, best: float) -> int:
    """Where the model ranks the true best (`true_best`) among the layouts it deems feasible in
    the space the study searches (1 = its own #1); one past the end when the model rules the
    true best out (a memory rule it does not pass)."""
    rates = np.where(truth.oom(feasible), 0.0, truth.tokens_per_s(feasible))
    top = int(np.argmax(rates))
    return top + 1 if rates[top] >= best * (1 - 1e-9) else len(feasible) + 1


def _trial(truth, layout: Layout, key: str, repetition: int, answer: bool = True) -> Trial:
    m = truth.measure(layout, repetition)
    if not m.ok:
        return Trial(key, m.status, answer=answer)
    true = float(truth.tokens_per_s(LayoutTable.from_layouts([layout]))[0])
    return Trial(key, "ok", float(m.tokens_per_s), true, answer)


# --- methods ---------------------------------------------------------------------------------


def run_autotune(cfg, space, truth, budget: int, seed: int) -> tuple[list[Trial], int]:
    """autotune's study; returns the ran trials and how many rule-rejected trials it made."""
    with tempfile.TemporaryDirectory() as folder:
        options = TuneSettings(trials=budget, storage="memory", seed=seed, render=False)
        result = tune(cfg, space, tune_runner(truth), options, Path(folder))
    records = sorted(result.records, key=lambda r: r["number"])
    rejected = sum(1 for r in records if r.get("status") == "infeasible")
    trials = []
    for r in records:
        if not r.get("ran"):
            continue
        layout = Layout(**r["layout_fields"])
        rate = float(r.get("measured_tokens_per_s") or 0.0)
        ok = r.get("status") == "ok" and rate > 0
        true = float(truth.tokens_per_s(LayoutTable.from_layouts([layout]))[0]) if ok else 0.0
        trials.append(Trial(layout.id, str(r.get("status")), rate if ok else 0.0, true))
    return trials, rejected


def run_order(truth, feasible: LayoutTable, order: np.ndarray, budget: int) -> list[Trial]:
    """Run feasible layouts in a fixed order."""
    layouts = [feasible.row(int(i)) for i in order[:budget]]
    return [_trial(truth, layout, layout.id, 0) for layout in layouts]


def run_deepspeed(cfg, space, feasible: LayoutTable, truth) -> list[Trial]:
    """DeepSpeed's autotuner on the structure of the model's best layout with pp = 1."""
    structures = np.flatnonzero(feasible.pp == 1)
    if not len(structures):
        return []
    base = feasible.row(int(structures[0]))
    trials: list[Trial] = []
    runs: dict[str, int] = {}

    def layout_for(stage: int, mbs: int, gas: int) -> Layout:
        return dataclasses.replace(base, zero=stage, mbs=mbs, gas=gas)

    def measure(stage: int, mbs: int, gas: int) -> float | None:
        layout = layout_for(stage, mbs, gas)
        key = f"{layout.id}-gas{gas}"
        runs[key] = runs.get(key, 0) + 1
        answer = layout.global_batch_size == cfg.train.global_batch_size and mbs in space.mbs
        table = LayoutTable.from_layouts([layout])
        if bool(structural_violations(cfg, table, skip=("gbs_divisible_by_mbs_dp",))[0]):
            trials.append(Trial(key, "rejected", answer=answer))
            return None
        trial = _trial(truth, layout, key, runs[key] - 1, answer)
        trials.append(trial)
        return trial.measured or None

    profile = layout_for(3, 1, 1)
    profiled = truth.measure(profile)
    table = LayoutTable.from_layouts([profile])
    broken = bool(structural_violations(cfg, table, skip=("gbs_divisible_by_mbs_dp",))[0])
    trials.append(Trial(f"{profile.id}-profile", "rejected" if broken else profiled.status,
                        answer=False))
    if broken or not profiled.ok:
        return trials
    activation = float(truth.forward_activation_bytes(table)[0])
    mp = base.tp * base.pp * base.cp
    DeepSpeedAutotuner(
        gpu_bytes=cfg.cluster.gpu.memory_bytes,
        num_params=cfg.model.num_params(),
        total_gpus=cfg.world_size,
        mp_size=mp,
        max_train_batch_size=cfg.train.global_batch_size,
        stages=sorted(space.zero),
        measure=measure,
    ).tune(activation)
    return trials


# --- scores ----------------------------------------------------------------------------------


@dataclasses.dataclass
class Score:
    """One study's figures."""

    to_target: int
    regret10: float
    regret20: float
    pick20: float
    oom: int
    rejected: int
    twice: int
    ran: int
    keys: tuple[str, ...] = ()
    """The layouts run, in order (do seeds change the run?)."""


def score(trials: list[Trial], best: float, budget: int, rejected: int = 0) -> Score:
    """Trials to 2 %, regret after 10 and 20 trials, failures and repeats of one study."""
    trials = trials[:budget] if budget else trials
    found: list[float] = []
    picks: list[float] = []
    best_found, pick_true, pick_measured = 0.0, 0.0, 0.0
    for trial in trials:
        if trial.answer and trial.status == "ok":
            best_found = max(best_found, trial.true)
            if trial.measured > pick_measured:
                pick_measured, pick_true = trial.measured, trial.true
        found.append(best_found)
        picks.append(pick_true)

    def regret(values: list[float], k: int) -> float:
        value = values[min(k, len(values)) - 1] if values else 0.0
        return max(0.0, 1 - value / best)

    hit = next((i + 1 for i, v in enumerate(found) if v >= 0.98 * best), budget + 1)
    keys = [t.key for t in trials]
    return Score(
        to_target=hit,
        regret10=regret(found, 10),
        regret20=regret(found, 20),
        pick20=regret(picks, 20),
        oom=sum(t.status == "oom" for t in trials),
        rejected=rejected + sum(t.status == "rejected" for t in trials),
        twice=len(keys) - len(set(keys)),
        ran=len(trials),
        keys=tuple(keys),
    )


def study(method: str, cfg, space, enumeration, truth, budget: int, seed: int) -> Score:
    best = true_best(cfg, space, truth)
    feasible = enumeration.feasible
    if method == "autotune":
        trials, rejected = run_autotune(cfg, space, truth, budget, seed)
        return score(trials, best, budget, rejected)
    if method == "walk ranking":
        return score(run_order(truth, feasible, np.arange(len(feasible)), budget), best, budget)
    if method == "random":
        order = np.random.default_rng(seed).permutation(len(feasible))
        return score(run_order(truth, feasible, order, budget), best, budget)
    return score(run_deepspeed(cfg, space, feasible, truth), best, budget)


# --- the table -------------------------------------------------------------------------------


def _median(values: list[float]) -> float:
    return float(np.median(values))


def table_for(kind: str, seeds: int, budget: int, scenarios, methods, log: Callable[[str], None]):
    table = Table(
        title=f"{kind} truth: {seeds} seeds, budget {budget} trials "
        "(median / worst seed; '>B' = not within the budget)"
    )
    for column in ("scenario", "method", "to 2 %", "regret @10", "regret @20", "pick @20",
                   "OOM", "rejected", "twice", "ran"):
        table.add_column(column, justify="left" if column in ("scenario", "method") else "right")
    results: dict[tuple[str, str], list[Score]] = {}
    for scenario in scenarios:
        model, cluster, framework = scenario.model, scenario.cluster, scenario.framework
        cfg = scenario.config()
        space = load_space(None, framework)
        enumeration = enumerate_layouts(cfg, space)
        truths = [make_truth(kind, cfg, 1000 + seed, scenario.distortion)
                  for seed in range(seeds)]
        searched = enumerate_layouts(cfg, space.resolved(cfg)).feasible  # what tune ranks
        ranks = [model_rank(searched, truth, true_best(cfg, space, truth)) for truth in truths]
        for method in methods:
            scores = [study(method, cfg, space, enumeration, truth, budget, seed)
                      for seed, truth in enumerate(truths)]
            results[(model, method)] = scores
            if method == "autotune" and seeds > 1:  # other --seed values, the first cluster
                results[(model, "autotune seeds")] = [
                    study(method, cfg, space, enumeration, truths[0], budget, seed)
                    for seed in (1, 2)]

            def both(values: list[float], fmt: Callable[[float], str]) -> str:
                return f"{fmt(_median(values))} / {fmt(max(values))}"

            def trials_text(v: float) -> str:
                return f">{budget}" if v > budget else f"{v:g}"

            distortion = scenario.distortion.describe() if kind == "alien" else "none"
            label = (
                f"{model} {framework}\n{cluster} ({cfg.world_size} GPUs), "
                f"{len(searched):,} feasible layouts\ntruth: {distortion}\ntrue best at model "
                f"rank {_median(ranks):g} / {max(ranks)}"
            )
            table.add_row(
                label if method == methods[0] else "",
                method,
                both([s.to_target for s in scores], trials_text),
                both([s.regret10 for s in scores], lambda v: f"{v:.1%}"),
                both([s.regret20 for s in scores], lambda v: f"{v:.1%}"),
                both([s.pick20 for s in scores], lambda v: f"{v:.1%}"),
                both([s.oom for s in scores], lambda v: f"{v:g}"),
                f"{max(s.rejected for s in scores)}",
                f"{max(s.twice for s in scores)}",
                f"{_median([s.ran for s in scores]):g}",
            )
        table.add_section()
        log(f"{kind}: {model} done")
    return table, results


def verdict(kind: str, results, scenarios, methods) -> list[str]:
    """The targets for autotune, and any baseline autotune does not beat."""
    ours = {sc.model: results[(sc.model, "autotune")] for sc in scenarios}
    medians = {m: _median([s.to_target for s in v]) for m, v in ours.items()}
    worst = max(s.to_target for v in ours.values() for s in v)
    regret10 = max(_median([s.regret10 for s in v]) for v in ours.values())
    worst_oom = max(s.oom for v in ours.values() for s in v)
    rejected = max(s.rejected for v in ours.values() for s in v)
    twice = max(s.twice for v in ours.values() for s in v)
    alike = [
        sc.model for sc in scenarios if (sc.model, "autotune seeds") in results
        and {s.keys[:9] for s in results[(sc.model, "autotune seeds")]} == {
            ours[sc.model][0].keys[:9]}
    ]
    checks = [
        (f"worst scenario median trials to 2 % {max(medians.values()):g} (target <= 10)",
         max(medians.values()) <= 10),
        (f"worst study trials to 2 % {worst:g} (target <= 15)", worst <= 15),
        (f"worst scenario median regret after 10 trials {regret10:.2%} (target <= 2 %)",
         regret10 <= 0.02),
        (f"most OOM trials in one study {worst_oom} (target <= 2)", worst_oom <= 2),
        (f"rule-rejected trials {rejected}, layouts run twice {twice} (target 0)",
         rejected == 0 and twice == 0),
        (f"scenarios where --seed 0, 1 and 2 ran the same first 9 trials on one cluster: "
         f"{len(alike)} {', '.join(alike)} (target 0)", not alike),
    ]
    lines = [f"{kind}: {text}: {'met' if ok else 'NOT met'}" for text, ok in checks]
    for method in methods[1:]:
        ties = [
            sc.model for sc in scenarios
            if _median([s.to_target for s in results[(sc.model, method)]]) <= medians[sc.model]
        ]
        if ties:
            lines.append(
                f"{kind}: '{method}' is as fast as autotune (trials to 2 %) on "
                f"{len(ties)} of {len(scenarios)} scenarios: {', '.join(ties)}"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--budget", type=int, default=30)
    parser.add_argument("--truth", choices=("alien", "perturbed", "both"), default="both")
    parser.add_argument("--scenario", action="append", help="model name(s) to run (default all)")
    parser.add_argument("--method", action="append", choices=METHODS, help="default all")
    parser.add_argument("--quick", action="store_true",
                        help="iterate: 4 scenarios, 2 seeds, budget 20, alien truth")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    logging.getLogger("autotune").setLevel(logging.WARNING)
    chosen = args.scenario or (QUICK if args.quick else None)
    scenarios = [s for s in SCENARIOS if not chosen or s.model in chosen]
    seeds, budget = (2, 20) if args.quick else (args.seeds, args.budget)
    truth = "alien" if args.quick else args.truth
    console = Console(width=150)
    kinds = ("alien", "perturbed") if truth == "both" else (truth,)
    for kind in kinds:
        methods = tuple(m for m in METHODS if not args.method or m in args.method)
        table, results = table_for(kind, seeds, budget, scenarios, methods, console.log)
        console.print(table)
        for line in verdict(kind, results, scenarios, methods):
            console.print(line)


if __name__ == "__main__":
    main()
