"""What the sampler proposes: feasible layouts only, seeded, diverse, uncertainty-aware."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import optuna
import pytest

from autotune.costmodel.constants import constants_for
from autotune.costmodel.estimate import evaluate
from autotune.costmodel.step_time import TIME_PARTS
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.measurement import Measurement
from autotune.runners.base import Runner
from autotune.runners.base import TrialPlan
from autotune.runners.simulate import SimulateRunner
from autotune.search.proposal import grid_keys
from autotune.search.settings import TuneSettings
from autotune.search.study import tune
from autotune.space.rules import violations
from autotune.space.search_space import enumerate_layouts
from autotune.space.search_space import load_space
from autotune.specs.inputs import load_config

CFG = load_config("llama3-8b", "dgx-h100:4")
SPACE = load_space(None, "megatron")
K = constants_for(CFG.cluster.gpu)


def _ran(result) -> list[dict]:
    return [r for r in sorted(result.records, key=lambda r: r["number"]) if r.get("ran")]


def test_exploration_never_spends_a_trial_on_a_rule_breaking_layout(tmp_path: Path) -> None:
    """Oracle: the rules themselves (`violations`) and Optuna's records. Before, the TPE turn
    sampled the raw product space and both exploration turns of 14 in 15 runs hit a rule."""
    result = tune(CFG, SPACE, SimulateRunner(noise=0.1, seed=1),
                  TuneSettings(trials=12, storage="memory", render=False, explore_every=2),
                      tmp_path)
    assert len(result.records) == 12
    assert not [r for r in result.records if r["status"] == "infeasible"]
    explored = [r for r in result.records if r["proposal"]["reason"] == "explore"]
    assert len(explored) >= 3
    for r in result.records:
        assert violations(CFG, Layout(**r["layout_fields"]), K) == []


def _sequence(tmp_path: Path, seed: int, name: str) -> list[str]:
    options = TuneSettings(trials=8, storage="memory", render=False, explore_every=2, seed=seed)
    result = tune(CFG, SPACE, SimulateRunner(noise=0.1, seed=7), options, tmp_path / name)
    return [r["layout_id"] for r in _ran(result)]


def test_the_seed_changes_the_run_and_fixes_it(tmp_path: Path) -> None:
    """Oracle: the layouts Optuna recorded. Before, runs with different --seed were the same."""
    first = _sequence(tmp_path, 0, "a")
    assert _sequence(tmp_path, 0, "b") == first
    assert _sequence(tmp_path, 1, "c") != first


def test_the_warm_start_measures_distinct_structural_families(tmp_path: Path) -> None:
    """Oracle: the definition of a family, restated here: tp·pp·cp, recompute and ZeRO
    family (0 | 1-2 | 3). Before, the warm start was the model's top 4, near-duplicates: on
    GPT-3 175B over 16 DGX A100 the model's top 4 are all one family."""
    cfg = load_config("gpt3-175b", "dgx-a100:16")
    result = tune(cfg, SPACE, SimulateRunner(noise=0.1, seed=2),
                  TuneSettings(trials=4, storage="memory", render=False), tmp_path)
    families = set()
    for r in _ran(result):
        f = r["layout_fields"]
        zero_family = 0 if f["zero"] == 0 else 1 if f["zero"] < 3 else 2
        families.add((f["tp"], f["pp"], f["cp"], f["recompute"], zero_family))
        assert r["proposal"]["reason"] == "warm-start"
    assert len(families) == 4
    top = enumerate_layouts(cfg, SPACE).feasible.rows()[:4]
    top_families = {(t.tp, t.pp, t.cp, t.recompute, min(t.zero, 1) + (t.zero == 3)) for t in top}
    assert len(top_families) < 4, "the model's top 4 should repeat a family (the old warm start)"


class _TermWrong(Runner):
    """The model's own step-time parts, with tensor-parallel communication 3x slower than
    modelled (a hand-set truth: the functional form is right, one term is not)."""

    name = "term-wrong"
    factor = 3.0

    def check(self, cfg) -> None:
        """Runs any problem."""

    def step_s(self, cfg, table: LayoutTable):
        parts = evaluate(cfg, table).time.parts
        return sum(parts[p] * (self.factor if p == "tp_comm" else 1.0) for p in TIME_PARTS)

    def run(self, plan: TrialPlan) -> Measurement:
        table = LayoutTable.from_layouts([plan.layout])
        step = float(self.step_s(plan.cfg, table)[0])
        peak = float(evaluate(plan.cfg, table).peak_memory_bytes[0])
        return Measurement("ok", step_time_s=step, step_time_spread=0.01,
                           tokens_per_s=plan.cfg.train.tokens_per_step / step,
                           peak_memory_bytes=peak)


def test_the_search_learns_which_term_is_wrong(tmp_path: Path, monkeypatch) -> None:
    """Oracle: the hand-set truth above (tp communication 3x). On Llama 3 70B over 4 DGX H100
    the model's favourites use tp = 4; under the truth the first layout within 2 % of the best
    sits below the model's 40th. The search measures one within 8 trials, and its term fit puts
    the error on tp communication (the one scale well above 1, 1.9 after 8 trials: each trial's
    σ holds the model's discrepancy, so the scale is shrunk towards its prior and the residuals
    carry the rest), not on a global factor (compute within 10 %). The scenario was set on the
    H100's own constants: the per-stack calibration is switched off here."""
    monkeypatch.setattr("autotune.costmodel.constants.calibration", lambda gpu, stack: None)
    cfg = load_config("llama3-70b", "dgx-h100:4")
    feasible = enumerate_layouts(cfg, SPACE).feasible
    runner = _TermWrong()
    rates = cfg.train.tokens_per_step / runner.step_s(cfg, feasible)
    first_within = int(np.flatnonzero(rates >= 0.98 * rates.max())[0])
    assert first_within > 40

    result = tune(cfg, SPACE, runner, TuneSettings(trials=8, storage="memory", render=False),
                  tmp_path)

    best = max(r["measured_tokens_per_s"] for r in _ran(result))
    assert best >= 0.98 * rates.max(), [r["layout_id"] for r in _ran(result)]
    assert result.confidence is not None
    scales = result.confidence["term_scales"]
    assert 1.5 < scales["tp_comm"] <= 3.0 * 1.35, scales
    assert max(scales, key=lambda name: abs(np.log(scales[name]))) == "tp_comm", scales
    assert scales["compute"] == pytest.approx(1.0, rel=0.1), scales


def test_repeat_runs_each_layout_the_asked_number_of_times(tmp_path: Path) -> None:
    """Oracle: Optuna's records. --repeat 2 runs every layout twice (back to back), never a
    third time, and ranks each layout by the mean of its runs; without it no layout runs
    twice."""
    result = tune(CFG, SPACE, SimulateRunner(noise=0.1, seed=4),
                  TuneSettings(trials=6, storage="memory", render=False, repeat=2), tmp_path)
    ids = [r["layout_id"] for r in _ran(result)]
    assert len(ids) == 6 and ids[0::2] == ids[1::2] and len(set(ids)) == 3
    study = optuna.load_study(study_name=result.study_name, storage=result.storage) \
        if result.storage != "memory" else None
    assert study is None or len(study.trials) == 6
    # the ranking averages each layout's runs (worked by hand from the two records)
    by_layout: dict[str, list[float]] = {}
    for r in _ran(result):
        by_layout.setdefault(r["layout_id"], []).append(r["measured_tokens_per_s"])
    ranked = result.ranked
    assert len(ranked) == 3 and all(r["runs"] == 2 for r in ranked)
    for r in ranked:
        first, second = by_layout[r["layout_id"]]
        assert r["measured_tokens_per_s"] == pytest.approx((first + second) / 2)
    assert [r["measured_tokens_per_s"] for r in ranked] == sorted(
        (r["measured_tokens_per_s"] for r in ranked), reverse=True)


def _family(fields: dict) -> tuple:
    """The family, restated: tp·pp·cp·ep·etp, recompute, ZeRO family (0 | 1-2 | 3)."""
    zero_family = 0 if fields["zero"] == 0 else 1 if fields["zero"] < 3 else 2
    return (fields["tp"], fields["pp"], fields["cp"], fields.get("ep", 1), fields.get("etp", 1),
            fields["recompute"], zero_family)


def test_families_come_before_refinements(tmp_path: Path) -> None:
    """Oracle: the model's own ranking of families (best row of each, the family restated
    above) and Optuna's records. Before, on Llama 3 70B over 8 DGX H100 at 8,192 tokens and a
    global batch of 512, 12 of 20 trials varied only vpp on one family and the model's #2 and
    #4 families were never tried. Now the model's top 2 families both run within 10 trials,
    and at most 3 of the 10 refine a family already measured (vpp, mbs, sp, offload)."""
    cfg = load_config("llama3-70b", "dgx-h100:8", seq_length=8192, global_batch_size=512)
    ranked: list[tuple] = []
    for row in enumerate_layouts(cfg, SPACE).feasible.rows():
        family = _family(row.to_dict())
        if family not in ranked:
            ranked.append(family)
    result = tune(cfg, SPACE, SimulateRunner(noise=0.05, seed=3),
                  TuneSettings(trials=10, storage="memory", render=False), tmp_path)
    families = [_family(r["layout_fields"]) for r in _ran(result)]
    assert len(families) == 10
    assert set(ranked[:2]) <= set(families), (ranked[:2], families)
    assert len(families) - len(set(families)) <= 3, families


def test_seeds_change_the_first_trials_with_the_default_settings(tmp_path: Path) -> None:
    """Oracle: Optuna's records. Before, --seed 0, 1 and 2 ran the same first 9 trials (the
    exploration turn was the 10th); now layouts tied within the noise are one seeded choice."""
    runs = []
    for seed in (0, 1, 2):
        result = tune(CFG, SPACE, SimulateRunner(noise=0.05, seed=7),
                      TuneSettings(trials=6, storage="memory", render=False, seed=seed),
                      tmp_path / str(seed))
        runs.append(tuple(r["layout_id"] for r in _ran(result)))
    assert len(set(runs)) == 3, runs


class _Exact(Runner):
    """The model's own figures with 1 % noise recorded (a truth the model knows exactly)."""

    name = "exact"

    def check(self, cfg) -> None:
        """Runs any problem."""

    def run(self, plan: TrialPlan) -> Measurement:
        values = evaluate(plan.cfg, LayoutTable.from_layouts([plan.layout]))
        step = float(values.step_time_s[0])
        return Measurement("ok", step_time_s=step, step_time_spread=0.01,
                           tokens_per_s=plan.cfg.train.tokens_per_step / step,
                           peak_memory_bytes=float(values.peak_memory_bytes[0]))


def test_stop_when_confident_ends_early_on_the_best(tmp_path: Path) -> None:
    """Oracle: the model's own ranking, which this truth follows exactly. Once the fastest
    layouts have run, no untried one can beat the winner by more than the 1 % noise: the study
    stops before its 30 trials, says so, and its winner is the model's (true) best. Without the
    option it runs all 30."""
    cfg = load_config("llama3-8b", "dgx-h100:1")
    feasible = enumerate_layouts(cfg, SPACE).feasible
    best = float(evaluate(cfg, feasible).tokens_per_s.max())

    result = tune(cfg, SPACE, _Exact(), TuneSettings(trials=30, storage="memory", render=False,
                                                     stop_when_confident=True), tmp_path / "a")
    ran = _ran(result)
    assert len(ran) < 30
    assert result.confidence is not None and result.confidence["stopped_early"]
    assert result.confidence["probability"] < 0.05
    assert result.ranked[0]["measured_tokens_per_s"] == pytest.approx(best, rel=0.01)

    full = tune(cfg, SPACE, _Exact(), TuneSettings(trials=30, storage="memory", render=False),
                tmp_path / "b")
    assert len(_ran(full)) == 30
    assert full.confidence is not None and not full.confidence["stopped_early"]


def test_the_models_discrepancy_is_learned_out_of_sample() -> None:
    """Oracle: worked by hand. A hand-set truth twice as slow as the model on every layout:
    the first trial is predicted by the model alone (prior term scales, no residual), so its
    out-of-sample log error is exactly log 2; the later trials are predicted by the refit of
    the earlier ones, which has learned the factor, so their errors are smaller. Before, the
    residuals' prior σ came from the refit's in-sample residuals, near 0 after a refit that
    absorbed a 2x miss, and every unmeasured family was held to about ±10 %."""
    from autotune.search.proposal import Outcome
    from autotune.search.proposal import Proposer
    from autotune.search.surrogate import amplitude

    feasible = enumerate_layouts(CFG, SPACE).feasible
    proposer = Proposer(CFG, feasible, K)
    rows = [feasible.row(i) for i in (0, len(feasible) // 3, 2 * len(feasible) // 3)]
    model = evaluate(CFG, LayoutTable.from_layouts(rows), K).step_time_s
    ok = [Outcome(r, "ok", 2.0 * float(s), spread=0.01) for r, s in zip(rows, model, strict=True)]
    errors = proposer.prequential(ok)
    assert errors[0] == pytest.approx(np.log(2.0), rel=1e-6)
    assert abs(errors[1]) < 0.5 * np.log(2.0) and abs(errors[2]) < 0.5 * np.log(2.0)
    assert amplitude(errors) > 0.3
    # the belief's σ of an unmeasured family reflects the discrepancy, not ±10 %
    belief = proposer.belief(ok[:1])
    assert float(np.median(belief.sd)) > 0.3


def test_one_gross_miss_does_not_hold_the_discrepancy_wide() -> None:
    """Oracle: worked by hand. Out-of-sample log errors 0.05, -0.05, 0.1 and 2.0 (one layout
    ran 7.4x slower than predicted, a term the model prices far off there): the robust σ is
    1.4826 · median |error| = 1.4826 · 0.075 = 0.1112, so 2.0 is winsorized at 2.5 · 0.1112 =
    0.2780 and the amplitude is sqrt((0.0025 + 0.0025 + 0.01 + 0.2780² + 2 · 0.01) / 6) =
    0.1368, not the 0.8201 the raw errors give. Before, on Mixtral 8x22B over 32 DGX H100 one
    such miss in the first trial kept every unmeasured family at ±50 % for 20 trials. With
    fewer than 3 errors nothing is clipped (a median of two says nothing)."""
    from autotune.search.surrogate import amplitude
    from autotune.search.surrogate import winsorized

    errors = np.array([0.05, -0.05, 0.1, 2.0])
    assert winsorized(errors)[-1] == pytest.approx(2.5 * 1.4826 * 0.075, rel=1e-6)
    assert amplitude(errors) == pytest.approx(0.1368, abs=5e-4)
    assert amplitude(np.array([2.0, 0.0])) == pytest.approx(np.sqrt((4.0 + 0.02) / 4))


def test_the_residual_level_follows_the_trials_that_agree() -> None:
    """Oracle: worked by hand. Four measured layouts far apart (no kernel overlap to speak
    of) ran 0.3 faster in log than the refit predicts (residual -0.3) and a fifth 1.9 slower
    (6.7x, ZeRO-3 gathers over half-rate NICs): the level an unmeasured layout inherits is
    the median of the five residuals and one pseudo-residual of 0, -0.3, not the winsorized
    mean (-0.3 · 4 + 1.9 clipped at 2.5 robust σ = 1.11) / 6 = -0.015, which left every
    unmeasured family at the slow trial's level while the measured ones were lifted by
    their own residuals. One residual alone is halved (median of it and the 0). The layout
    asked sits at the trials' centre, 40 from each (no squared-exponential overlap) and where
    the linear kernel's trend is 0."""
    from autotune.search.surrogate import fit_residuals

    x = np.diag(np.full(5, 50.0))
    residual = np.array([-0.3, -0.3, -0.3, -0.3, 1.9])
    process = fit_residuals(x, residual, np.zeros(5), 0.2)
    far = np.full((1, 5), 10.0)
    assert process.predict(far)[0][0] == pytest.approx(-0.3, abs=1e-9)
    assert fit_residuals(x[:1], np.array([1.9]), np.zeros(1), 0.2).mean == pytest.approx(0.95)



def test_a_new_grid_comes_before_another_expert_split_of_a_measured_one() -> None:
    """Oracle: the definition of the expert-free family, restated here (tp·pp·cp, recompute
    and ZeRO family 0 | 1-2 | 3, ep and etp left out), and three measurements of
    `benchmarks/search_trace.py --scenario mixtral-8x22b --seed 0` (Mixtral 8x22B over 32
    DGX H100, tokens/s as it printed). After them the old warm start ran ep 4, etp 1 of the
    tp 1, pp 1, full-recompute ZeRO-3 grid it had just measured at ep 4, etp 2 (some rows that
    differ from a measured one only in (ep, etp) may still run, so the rule can fail); now
    the fourth trial is another grid, recompute or ZeRO family. Rows equal but for ep and etp
    share an expert-free family and no full family."""
    from autotune.search.proposal import Outcome
    from autotune.search.proposal import Proposer
    from autotune.search.proposal import family_keys

    cfg = load_config("mixtral-8x22b", "dgx-h100:32")
    k = constants_for(cfg.cluster.gpu)
    feasible = enumerate_layouts(cfg, SPACE.resolved(cfg), k).feasible
    proposer = Proposer(cfg, feasible, k, seed=0)
    coarse, full = family_keys(feasible, experts=False), family_keys(feasible)
    ran = [("tp=2,pp=1,cp=1,vpp=1,zero=3,offload=none,mbs=1,recompute=none,sp=on,ep=8,etp=1",
            48_629),
           ("tp=4,pp=8,cp=1,vpp=7,zero=1,offload=none,mbs=1,recompute=selective,sp=on,ep=8,"
            "etp=1", 148_428),
           ("tp=1,pp=1,cp=1,vpp=1,zero=3,offload=none,mbs=4,recompute=full,sp=off,ep=4,etp=2",
            289_273)]
    tokens = float(cfg.train.tokens_per_step)
    by_text = {row.text: row for row in feasible.rows()}
    outcomes = [Outcome(by_text[text], "ok", tokens / rate, spread=0.015) for text, rate in ran]
    measured = [proposer.index[o.layout.id] for o in outcomes]
    allowed, _, _ = proposer.candidates(outcomes, [])
    split_only = allowed & np.isin(coarse, coarse[measured]) & ~np.isin(full, full[measured])
    assert split_only.any()
    proposal = proposer.propose(outcomes, [])
    assert proposal is not None and proposal.reason == "warm-start"
    assert coarse[proposer.index[proposal.layout.id]] not in set(coarse[measured])
    pairs = LayoutTable.from_layouts([Layout(tp=1, pp=2, dp=8, ep=8, etp=1),
                                      Layout(tp=1, pp=2, dp=8, ep=4, etp=2)])
    assert len(set(family_keys(pairs, experts=False).tolist())) == 1
    assert len(set(family_keys(pairs).tolist())) == 2


def test_residuals_that_fall_along_a_dimension_carry_on_past_the_trials() -> None:
    """Oracle: worked by hand. Three layouts one length scale apart along one input ran
    0.1, 0.2 and 0.3 slower in log than the refit predicts (residuals 0.1, 0.2, 0.3: slower
    the larger, say, tp is). The level is the median of them and a 0, 0.15. Six length scales
    past the last trial the squared exponential carries nothing (exp(-18)), so without a
    trend the prediction there falls back to the level; with the linear kernel it stays on
    the trials' side of the level (above 0.15) and below the unshrunk line (0.9 at x = 9).
    Across the input the trials did not vary (another dimension), the trend says nothing:
    the level."""
    from autotune.search.surrogate import fit_residuals

    x = np.array([[1.0, 0.0], [2.0, 0.0], [3.0, 0.0]])
    process = fit_residuals(x, np.array([0.1, 0.2, 0.3]), np.zeros(3), 0.2)
    assert process.mean == pytest.approx(0.15)
    along = process.predict(np.array([[9.0, 0.0]]))[0][0]
    assert 0.15 + 0.02 < along < 0.9
    assert process.predict(np.array([[2.0, 9.0]]))[0][0] == pytest.approx(0.15, abs=1e-6)


def test_an_oom_shares_its_miss_only_with_layouts_interleaved_like_it() -> None:
    """Oracle: Megatron-LM's interleaved 1F1B schedule holds (p − 1)/v micro-batches more on
    the first stage, and allocates per model chunk, so a layout without interleaving does not
    carry an interleaved neighbour's miss (Llama 3 70B's seed 4 in `search_trace.py`: a vpp 13
    OOM cut its grid's vpp 1 true best from P(fit) 0.81 to 0.36, and it never ran)."""
    rows = LayoutTable.from_layouts([Layout(tp=4, pp=4, cp=2, dp=2, vpp=1),
                                     Layout(tp=4, pp=4, cp=2, dp=2, vpp=2),
                                     Layout(tp=4, pp=4, cp=2, dp=2, vpp=10),
                                     Layout(tp=4, pp=4, cp=2, dp=2, vpp=10, zero=3)])
    keys = grid_keys(rows)
    assert keys[1] == keys[2]  # interleaved alike: one neighbourhood
    assert keys[0] != keys[1]
    assert keys[2] != keys[3]  # another shard of states


def test_another_expert_split_of_a_measured_family_shares_its_residual() -> None:
    """Oracle: worked by hand. ep 1, etp 8 and ep 8, etp 1 of one grid differ by 3 in log2 of
    ep and of etp, one length scale (3) each: squared distance 2, kernel exp(-1). One trial
    with residual 0.4 (prior σ 0.3, noise 0.01): the level is the median of 0.4 and 0, 0.2;
    the linear kernel is centred on the one trial, so it adds nothing. The other split's
    mean is 0.2 + 0.09 · exp(-1) · 0.2 / (0.09 + 0.0001) = 0.27349 (at a length scale of 1,
    exp(-9): 0.2000)."""
    from autotune.search.surrogate import features
    from autotune.search.surrogate import fit_residuals

    rows = features(LayoutTable.from_layouts([Layout(tp=1, pp=4, dp=2, ep=1, etp=8),
                                              Layout(tp=1, pp=4, dp=2, ep=8, etp=1)]))
    process = fit_residuals(rows[:1], np.array([0.4]), np.array([0.01]), 0.3)
    assert process.predict(rows[1:])[0][0] == pytest.approx(
        0.2 + 0.09 * np.exp(-1.0) * 0.2 / 0.0901, rel=1e-6)
