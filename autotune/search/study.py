"""`tune`: an Optuna study over the layout space, measured by a runner.

Reads in order: load the study, sample a layout, check the rules, estimate, run, record. Every
trial stores its layout, the rule that rejected it (if any), the prediction and the measurement
as user attributes, so the study alone (optuna-dashboard opens it) tells the whole story.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import threading
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial
from optuna.trial import Trial
from optuna.trial import TrialState

from autotune.costmodel.constants import Constants
from autotune.costmodel.constants import constants_for
from autotune.costmodel.memory import usable_gpu_bytes
from autotune.exceptions import AutotuneError
from autotune.layout import Layout
from autotune.measurement import Measurement
from autotune.measurement import Status
from autotune.runners.base import Runner
from autotune.search.proposal import Proposer
from autotune.search.record import layout_of
from autotune.search.record import measured_figure
from autotune.search.sampler import FINISHED
from autotune.search.sampler import ModelGuidedSampler
from autotune.search.sampler import NoiseAwarePruner
from autotune.search.sampler import distributions
from autotune.search.sampler import holding_trial
from autotune.search.sampler import layout_from_params
from autotune.search.settings import TuneSettings
from autotune.search.storage import GRACE_PERIOD_S
from autotune.search.storage import HEARTBEAT_INTERVAL_S
from autotune.search.storage import default_storage_url
from autotune.search.storage import has_heartbeat
from autotune.search.storage import open_storage
from autotune.space.search_space import SearchSpace
from autotune.space.search_space import enumerate_layouts
from autotune.space.search_space import no_feasible_message
from autotune.specs import AutotuneConfig
from autotune.trial import TrialPipeline

log = logging.getLogger(__name__)
MIN_CONFIDENT_TRIALS = 3
"""`stop_when_confident` never stops before this many trials (nor before the warm start)."""
INPUTS_ATTR = "autotune_inputs"
CARRIED_ATTRS = ("slurm_job_id", "slurm_trial_dir")
"""User attributes a retried trial keeps (heartbeat retries keep them all): the job of the
interrupted trial, which the slurm runner re-attaches to while it still runs."""


def rank_trials(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Layouts that measured a throughput, fastest first (ties by trial number): one record
    per layout, the first that ran it, with `measured_tokens_per_s` the mean over its ok runs
    and `runs` their count (`--repeat` averages noise out this way)."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for r in sorted(records, key=lambda r: r["number"]):
        if r.get("status") == "ok" and measured_figure(r, "tokens_per_s"):
            runs.setdefault(str(r.get("layout_id") or f"trial {r['number']}"), []).append(r)
    ranked = [{**same[0], "runs": len(same),
               "measured_tokens_per_s": sum(r["measured_tokens_per_s"] for r in same) / len(same)}
              for same in runs.values()]
    return sorted(ranked, key=lambda r: (-r["measured_tokens_per_s"], r["number"]))


@dataclasses.dataclass(frozen=True)
class TuneResult:
    """The finished study: where it lives and its trials as plain records (best first)."""

    study_name: str
    storage: str
    out_dir: Path
    records: list[dict[str, Any]]
    artifacts: dict[str, Path]
    confidence: dict[str, Any] | None = None
    """How sure the search is of its winner (`autotune.search.proposal.Confidence.to_dict`):
    the probability that an untried layout beats it by more than the noise, the fitted term
    scales; None when nothing ran."""

    @property
    def ranked(self) -> list[dict[str, Any]]:
        """Layouts that measured a throughput, fastest first (`rank_trials`)."""
        return rank_trials(self.records)


def inputs_fingerprint(cfg: AutotuneConfig, space: SearchSpace) -> dict[str, Any]:
    """What defines the study: the inputs and the space, with a short hash."""
    data = {"config": cfg.model_dump(mode="json"), "space": space.model_dump(mode="json")}
    same = {"problem": cfg.identity(), "space": data["space"]}
    digest = hashlib.sha256(json.dumps(same, sort_keys=True).encode()).hexdigest()[:12]
    return {**data, "hash": digest}


def default_study_name(cfg: AutotuneConfig) -> str:
    """model-cluster-framework, e.g. llama3-8b-dgx-h100:4-megatron."""
    return f"{cfg.model.name}-{cfg.cluster.name}-{cfg.train.framework}"


# --- one trial -------------------------------------------------------------------------------


class Objective:
    """The study's objective: measured tokens/s of the suggested layout (0 when it cannot run)."""

    def __init__(
        self, cfg: AutotuneConfig, space: SearchSpace, runner: Runner, k: Constants, out_dir: Path,
        repeat: int = 1,
    ) -> None:
        self.cfg, self.space, self.k, self.out_dir = cfg, space, k, out_dir
        self.pipeline = TrialPipeline(cfg, runner, k)
        self.repeat = repeat
        self._claiming = threading.Lock()

    def __call__(self, trial: Trial) -> float:
        with self._claiming:  # threads of one process sample and claim one at a time
            layout = self.sample(trial)
            broken = self.pipeline.violations(layout)
            if broken:
                return self.infeasible(trial, broken)
            earlier = self.claim(trial, layout)
        if earlier is not None:
            return self.reuse(trial, earlier)
        directory = self.out_dir / "trials" / f"{trial.number:04d}-{layout.id}"
        if self.pipeline.runner.needs_artifacts:
            trial.set_user_attr("trial_dir", str(directory))

        def report(step: int, tokens_per_s: float) -> bool:
            trial.report(tokens_per_s, step)
            return trial.should_prune()

        result = self.pipeline.run(layout, number=trial.number, directory=directory,
                                   report=report, attrs=dict(trial.user_attrs),
                                   note=trial.set_user_attr)
        trial.set_user_attr("predicted", _round(result.prediction.to_dict()))
        return self.record(trial, layout, result.prediction.peak_memory_bytes,
                           result.measurement)

    def sample(self, trial: Trial) -> Layout:
        for name, dist in distributions(self.space).items():
            trial.suggest_categorical(name, dist.choices)
        layout = layout_from_params(self.cfg, self.space, trial.params)
        trial.set_user_attr("layout", layout.text)
        trial.set_user_attr("layout_id", layout.id)
        trial.set_user_attr("layout_fields", layout.to_dict())
        return layout

    def infeasible(self, trial: Trial, broken: list[tuple[str, str]]) -> float:
        name, reason = broken[0]
        trial.set_user_attr("status", Status.INFEASIBLE.value)
        trial.set_user_attr("rule", name)
        trial.set_user_attr("reason", reason)
        trial.set_constraint("runs", 1.0)
        return 0.0

    def claim(self, trial: Trial, layout: Layout) -> FrozenTrial | None:
        """Claim the layout for this trial, or return the trial that already has it.

        Two phases make concurrent workers on one study safe: a trial yields to any trial of
        the same layout that finished running or holds a claim; then it claims and re-checks,
        and of two simultaneous claims the lower trial number keeps the layout.
        """
        earlier = self._holder(trial, layout, lower_only=False)
        if earlier is not None:
            return earlier
        trial.set_user_attr("claimed", True)
        return self._holder(trial, layout, lower_only=True)

    def _holder(self, trial: Trial, layout: Layout, lower_only: bool) -> FrozenTrial | None:
        trials = trial.study.get_trials(deepcopy=False)
        return holding_trial(
            trials, trial.number, layout.id, lower_only=lower_only, repeat=self.repeat
        )

    def reuse(self, trial: Trial, earlier: FrozenTrial) -> float:
        trial.set_user_attr("status", Status.DUPLICATE.value)
        trial.set_user_attr("duplicate_of", earlier.number)
        if earlier.state == TrialState.RUNNING:
            raise optuna.TrialPruned(f"layout already running in trial {earlier.number}")
        trial.set_constraint("runs", float(earlier.constraints.get("runs", 0.0)))
        return float(earlier.value or 0.0)

    def record(self, trial: Trial, layout: Layout, predicted_peak: float, m: Measurement) -> float:
        trial.set_user_attr("status", m.status)
        trial.set_user_attr("ran", True)
        if m.reason:
            trial.set_user_attr("reason", m.reason[:500])
        if m.log_tail:
            trial.set_user_attr("log_tail", m.log_tail[-2000:])
        for key in (
            "step_time_s",
            "tokens_per_s",
            "tflops_per_gpu",
            "mfu",
            "peak_memory_bytes",
            "step_time_spread",
        ):
            value = getattr(m, key)
            if value is not None:
                trial.set_user_attr(f"measured_{key}", float(value))
        for key, value in m.extra.items():
            trial.set_user_attr(key, value)
        fits = predicted_peak <= usable_gpu_bytes(self.cfg, self.k)
        if m.status == "oom" and fits:
            trial.set_user_attr("memory_flag", "predicted to fit but ran out of memory")
        if m.status == "pruned":
            raise optuna.TrialPruned(m.reason)
        ok = m.ok
        trial.set_constraint("runs", 0.0 if ok else 1.0)
        if not ok or m.tokens_per_s is None:  # `ok` means a throughput was measured
            return 0.0
        return float(m.tokens_per_s)


def _round(data: Any) -> Any:
    if isinstance(data, dict):
        return {k: _round(v) for k, v in data.items()}
    if isinstance(data, float):
        return float(f"{data:.6g}")
    return data


# --- the study -------------------------------------------------------------------------------


def _open_study(
    cfg: AutotuneConfig,
    space: SearchSpace,
    options: TuneSettings,
    out_dir: Path,
    sampler: optuna.samplers.BaseSampler,
    pruner: optuna.pruners.BasePruner,
) -> tuple[optuna.Study, str, str, bool]:
    url = options.storage or default_storage_url(out_dir)
    name = options.study or default_study_name(cfg)
    storage = open_storage(url)
    exists = name in [s.study_name for s in optuna.get_all_study_summaries(storage)]
    if exists and not options.resume:
        raise AutotuneError(
            f"--study: study {name!r} already exists in {url}; pass --resume to continue it "
            "or --study NEW_NAME for a fresh one"
        )
    study = optuna.create_study(
        storage=storage,
        study_name=name,
        direction="maximize",
        sampler=sampler,
        pruner=pruner,
        load_if_exists=True,
    )
    fingerprint = inputs_fingerprint(cfg, space)
    stored = study.user_attrs.get(INPUTS_ATTR)
    if stored and stored.get("hash") != fingerprint["hash"]:
        raise AutotuneError(
            f"--resume: study {name!r} was created for other inputs (model, cluster, training or "
            "space differ); use the same flags or another --study name"
        )
    if not stored:
        study.set_user_attr(INPUTS_ATTR, fingerprint)
    return study, url, name, exists


def recover_interrupted(study: optuna.Study, wait: bool = True) -> int:
    """Fail and re-enqueue trials left RUNNING by a killed worker; returns how many.

    A trial counts as abandoned once its heartbeat is older than the grace period, so live
    workers on a shared study keep theirs. With `wait`, give killed workers' heartbeats the
    grace period to go stale first.
    """
    running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
    if not running:
        return 0
    storage = study._storage
    if has_heartbeat(storage):  # RDB storages (wrapped in _CachedStorage) and journals
        deadline = time.monotonic() + (GRACE_PERIOD_S + 2 * HEARTBEAT_INTERVAL_S if wait else 0)
        before = {t.number for t in running}
        while True:
            _fail_stale(study)
            still = {
                t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
            }
            if not (still & before) or time.monotonic() > deadline:
                return len(before - still)
            time.sleep(1.0)
    # storages without heartbeats: the user says (by --resume) that no other worker is alive
    for t in running:
        storage.set_trial_state_values(t._trial_id, TrialState.FAIL)
        carried = {k: t.user_attrs[k] for k in CARRIED_ATTRS if k in t.user_attrs}
        study.enqueue_trial(t.params, user_attrs={"retry_of": t.number, **carried})
    return len(running)


def finish_shared(study: optuna.Study, optimize: Callable[[], None]) -> None:
    """Before leaving a shared study, give the trials other workers run the time a dead
    worker's heartbeat takes to go stale, and run the retries of those that do (the storage's
    callback enqueues them). A trial still RUNNING after that has a live worker, which finishes
    it itself; so no trial of a dead worker stays RUNNING once the last worker has left."""
    if not has_heartbeat(study._storage):
        return
    deadline = time.monotonic() + GRACE_PERIOD_S + 2 * HEARTBEAT_INTERVAL_S
    while True:
        retries = [
            t
            for t in study.get_trials(deepcopy=False, states=(TrialState.WAITING,))
            if "failed_trial" in t.system_attrs or "retry_of" in t.user_attrs
        ]
        if retries:
            optimize()
            deadline = time.monotonic() + GRACE_PERIOD_S + 2 * HEARTBEAT_INTERVAL_S
            continue
        running = study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if not running or time.monotonic() > deadline:
            return
        _fail_stale(study)
        time.sleep(HEARTBEAT_INTERVAL_S)


def _fail_stale(study: optuna.Study) -> None:
    """Fail the RUNNING trials whose heartbeat stopped; the storage's callback retries them."""
    with warnings.catch_warnings():  # 'experimental' since Optuna 2.9
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


class _StopAfter:
    """Stop once `n` trials ran (rule rejections and reused duplicates do not count), the
    sampler has nothing left to propose, or `cap` trials exist; with `confident_below`, also
    once `confidence` (the chance an untried layout beats the best) falls below it, after at
    least `least` trials ran."""

    def __init__(self, n: int, remaining: Callable[[optuna.Study], int], cap: int,
                 confidence: Callable[[optuna.Study], float] | None = None,
                 confident_below: float | None = None, least: int = 1) -> None:
        self.n, self.remaining, self.cap = n, remaining, cap
        self.confidence, self.confident_below, self.least = confidence, confident_below, least
        self.stopped_confident: float | None = None

    def ran(self, study: optuna.Study) -> int:
        done = study.get_trials(deepcopy=False, states=FINISHED)
        return sum(1 for t in done if t.user_attrs.get("ran"))

    def __call__(self, study: optuna.Study, trial: FrozenTrial) -> None:
        trials = study.get_trials(deepcopy=False)
        ran = self.ran(study)
        if ran >= self.n or len(trials) >= self.cap or not self.remaining(study):
            study.stop()
            return
        if self.confident_below is None or self.confidence is None or ran < self.least:
            return
        p = self.confidence(study)
        if p < self.confident_below:
            log.info("stopping after %d trials: an untried layout beats the best by more than "
                     "the noise with probability %.3f (< %g)", ran, p, self.confident_below)
            self.stopped_confident = p
            study.stop()


def tune(
    cfg: AutotuneConfig,
    space: SearchSpace,
    runner: Runner,
    settings: TuneSettings,
    out_dir: Path,
    on_trial: Callable[[optuna.Study, FrozenTrial], None] | None = None,
) -> TuneResult:
    """Run (or resume) the study in `out_dir` and render configs for the best layouts.

    This is the search alone; `autotune.tune` (`autotune.run.tune`) adds the policy around it
    (`run.json`, the report, the refit) and is what the CLI runs.

    Args:
        cfg: The model, cluster and training setup.
        space: The search space (ep and etp resolved against the model here).
        runner: Who measures each trial.
        settings: How the study runs.
        out_dir: Where the study, the trials and the rendered configs go.
        on_trial: Called after every trial with (study, trial), e.g. for a progress bar.

    Raises:
        AutotuneError: no feasible layout, a runner that cannot run here, a study that exists
            without `settings.resume` or was made for other inputs.
    """
    options = settings
    space = space.resolved(cfg)  # the study chooses ep and etp among the model's values
    k = constants_for(cfg.cluster.gpu, cfg.train.software_stack)
    enumeration = enumerate_layouts(cfg, space, k)
    if not len(enumeration):
        raise AutotuneError(no_feasible_message(enumeration))
    out_dir.mkdir(parents=True, exist_ok=True)
    runner.check(cfg)
    proposer = Proposer(
        cfg, enumeration.feasible, k, seed=options.seed, warm_start=options.warm_start,
        explore_every=options.explore_every, repeat=options.repeat,
    )
    sampler = ModelGuidedSampler(space, proposer)
    pruner = NoiseAwarePruner(tolerance=options.pruner_tolerance)
    study, url, name, existed = _open_study(cfg, space, options, out_dir, sampler, pruner)
    if existed:
        recovered = recover_interrupted(study)
        if recovered:
            log.info("re-enqueued %d trial(s) left running by an interrupted worker", recovered)
    stop = _StopAfter(options.trials, sampler.remaining,
                      cap=options.trials * 20 + options.warm_start,
                      confidence=lambda s: sampler.confidence(s).probability,
                      confident_below=options.confidence if options.stop_when_confident
                      else None,
                      least=max(options.warm_start, MIN_CONFIDENT_TRIALS))
    callbacks: list[Callable[[optuna.Study, FrozenTrial], None]] = [stop]
    if on_trial is not None:
        callbacks.append(on_trial)
    objective = Objective(cfg, space, runner, k, out_dir, options.repeat)

    def optimize() -> None:
        study.optimize(
            objective,
            n_jobs=options.jobs,
            callbacks=callbacks,
            catch=(Exception,),
            gc_after_trial=False,
        )

    runner.prepare()
    try:
        if stop.ran(study) < options.trials:
            optimize()
        finish_shared(study, optimize)
    finally:
        runner.cleanup()
    records = trial_records(study)
    sure = sampler.confidence(study) if any(r.get("ran") for r in records) else None
    confidence = None if sure is None else {
        **sure.to_dict(), "stopped_early": stop.stopped_confident is not None}
    if confidence is not None:
        study.set_user_attr("confidence", confidence)
    result = TuneResult(name, url, out_dir, records, {}, confidence)
    if not options.render:
        return result
    return dataclasses.replace(result, artifacts=render_winners(cfg, result, options.top_k))


def trial_records(study: optuna.Study) -> list[dict[str, Any]]:
    """Every trial as a flat record: number, state, value, params and autotune's attributes."""
    records = []
    for t in study.get_trials(deepcopy=False):
        records.append(
            {
                "number": t.number,
                "state": t.state.name,
                "value": t.value,
                "datetime_start": t.datetime_start.isoformat() if t.datetime_start else None,
                "datetime_complete": t.datetime_complete.isoformat()
                if t.datetime_complete
                else None,
                "params": dict(t.params),
                # a retry made by the heartbeat (RetryHeartbeatStaleTrialCallback) names its
                # predecessor in a system attribute; recover_interrupted's in a user attribute
                **({"retry_of": t.system_attrs["failed_trial"]}
                   if "failed_trial" in t.system_attrs else {}),
                **t.user_attrs,
                "status": t.user_attrs.get(
                    "status", "pruned" if t.state == TrialState.PRUNED else t.state.name.lower()
                ),
            }
        )
    return records


def render_winners(cfg: AutotuneConfig, result: TuneResult, top_k: int) -> dict[str, Path]:
    """Configs for the best measured layout (DIR/best, rank 1) and its runners-up
    (DIR/top/<rank>-<id>, numbered by rank: the first runner-up is top/2-<id>)."""
    from autotune.render import write_artifacts

    ranked = result.ranked
    written: dict[str, Path] = {}
    for rank, record in enumerate(ranked[: top_k + 1]):
        layout = layout_of(record)
        measured = {
            k.removeprefix("measured_"): v for k, v in record.items() if k.startswith("measured_")
        }
        folder = result.out_dir / ("best" if rank == 0 else f"top/{rank + 1}-{layout.id}")
        write_artifacts(cfg, layout, folder, measured={**measured, "trial": record["number"]})
        written["best" if rank == 0 else f"top{rank + 1}"] = folder
    return written
