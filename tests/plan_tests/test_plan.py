"""Planning every size: best layout re-optimised per size, days, GPU-hours, cost, efficiency.

Oracles: the enumeration `autotune space` runs on the resized cluster (an independent call per
size), arithmetic worked out in each test (days = tokens / (tokens/s · 86,400), GPU-hours,
cost), the efficiency identity (the causes' losses sum to 1 − efficiency), and hand-made
intervals injected through the interval hook.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import pytest

from autotune.costmodel.estimate import Estimate
from autotune.costmodel.estimate import estimate
from autotune.exceptions import AutotuneError
from autotune.layout import Layout
from autotune.planning.build import PlanConfig
from autotune.planning.build import cluster_sizes
from autotune.planning.build import make_plan
from autotune.planning.plan import UNCALIBRATED
from autotune.planning.plan import Interval
from autotune.planning.plan import mark_for
from autotune.scaling import resized
from autotune.space.search_space import enumerate_layouts
from autotune.space.search_space import load_space
from autotune.specs import AutotuneConfig
from autotune.specs.inputs import load_config

TOKENS = 1e12


@pytest.fixture(scope="module")
def plan_8b():  # type: ignore[no-untyped-def]
    config = PlanConfig(model="llama3-8b", clusters=("dgx-h100:1,2,4",), tokens="1T",
                        price="2.5")
    return make_plan(config)


def test_each_size_gets_the_best_layout_of_its_own_enumeration(plan_8b) -> None:  # type: ignore[no-untyped-def]
    space = load_space(None, "megatron")
    base = load_config("llama3-8b", "dgx-h100:1")
    for point in plan_8b.points:
        cfg = resized(base, point.gpus, base.train.global_batch_size)
        found = enumerate_layouts(cfg, space)
        assert point.layout == found.feasible.row(0).text
        assert point.tokens_per_s == pytest.approx(float(found.estimates.tokens_per_s[0]))
        assert point.feasible == len(found) and point.candidates == found.total


def test_days_gpu_hours_and_cost_follow_from_tokens_per_second(plan_8b) -> None:  # type: ignore[no-untyped-def]
    for p in plan_8b.points:
        seconds = TOKENS / p.tokens_per_s
        assert p.days == pytest.approx(seconds / 86_400)
        assert p.gpu_hours == pytest.approx(p.gpus * seconds / 3600)
        assert p.cost == pytest.approx(p.gpus * seconds / 3600 * 2.5)
        # H100 + Megatron-Core is calibrated: the interval brackets the days and the cost
        assert p.interval != UNCALIBRATED
        assert p.days_low is not None and p.days_high is not None and p.cost_high is not None
        assert p.days_low <= p.days <= p.days_high and p.cost <= p.cost_high


def test_global_batch_is_held_in_tokens(plan_8b) -> None:  # type: ignore[no-untyped-def]
    preset = load_config("llama3-8b", "dgx-h100:1").train
    assert {p.global_batch_tokens for p in plan_8b.points} == {preset.tokens_per_step}


def test_efficiency_against_the_smallest_size_and_what_costs_it(plan_8b) -> None:  # type: ignore[no-untyped-def]
    base = plan_8b.points[0]
    assert base.gpus == 8 and base.efficiency == 1.0 and base.cause == ""
    for p in plan_8b.points[1:]:
        expected = (p.tokens_per_s / p.gpus) / (base.tokens_per_s / base.gpus)
        assert p.efficiency == pytest.approx(expected)
        assert sum(p.losses.values()) == pytest.approx(1 - p.efficiency, abs=1e-9)
        if p.cause:
            assert p.losses[p.cause] == max(p.losses.values()) == p.cause_loss


def test_marks_at_the_field_lines() -> None:
    assert (mark_for(0.71), mark_for(0.7), mark_for(0.69), mark_for(0.5), mark_for(0.49)) == (
        "", "", "< 0.7", "< 0.7", "< 0.5")


def test_recompute_is_charged_as_its_own_cause() -> None:
    """Llama 3 8B at seq 32,768 on 8 H100 without offload needs full recompute; the recompute
    cause is the compute the layout spends over the same layout without recompute (two
    independent `estimate` calls)."""
    plan = make_plan(PlanConfig(model="llama3-8b", clusters=("dgx-h100:1",), tokens="1T",
                                train={"seq_length": 32768, "global_batch_size": 64},
                                space=str(_space("tp: [1, 2]\npp: [1]\nzero: [1]\n"
                                                 "mbs: [1]\nsp: [true]\n"))))
    (point,) = plan.points
    assert point.layout_fields["recompute"] == "full", point.layout
    cfg = load_config("llama3-8b", "dgx-h100:1", seq_length=32768, global_batch_size=64)
    layout = Layout(**point.layout_fields)
    full = estimate(cfg, layout)
    plain = estimate(cfg, dataclasses.replace(layout, recompute="none"))
    added = full.time_parts["compute"] - plain.time_parts["compute"]
    assert added > 0
    assert point.causes["recompute"] == pytest.approx(added)
    assert point.causes["compute"] == pytest.approx(plain.time_parts["compute"])


def _space(text: str) -> Path:
    path = Path(tempfile.mkdtemp()) / "space.yaml"
    path.write_text("offload: [none]\nrecompute: [none, selective, full]\n" + text)
    return path


def test_an_infeasible_size_names_the_rule_and_the_rest_is_planned() -> None:
    """Llama 3 70B with plain data parallelism (ZeRO 0) and no offload: 16 GPUs give each at
    least 70.6e9 · 18 B / 16 = 79 GB of states before activations, nothing fits; 64 do."""
    space = _space("tp: [1, 2, 4, 8]\npp: [1, 2, 4, 8]\nzero: [0]\nmbs: [1, 2]\n"
                   "sp: [true]\n")
    plan = make_plan(PlanConfig(model="llama3-70b", clusters=("dgx-h100:2,8",), tokens="1T",
                                space=str(space)))
    small, large = plan.points
    cfg = load_config("llama3-70b", "dgx-h100:2")
    removed = enumerate_layouts(cfg, load_space(str(space), "megatron")).removed
    assert small.status == "infeasible" and small.tokens_per_s is None
    assert small.rule == max(removed, key=lambda name: removed[name])
    assert "memory_fits" in small.reason
    assert large.ok and large.efficiency == 1.0, "the smallest size that fits is the base"


def test_max_gbs_tokens_grows_the_batch_with_the_gpus_up_to_the_cap() -> None:
    """llama3-8b preset: 512 sequences of 8192 = 4.19M tokens at 8 GPUs; with a 10M cap, 16
    GPUs get 1,024 sequences and 32 GPUs floor(10e6 / 8192) = 1,220."""
    config = PlanConfig(model="llama3-8b", clusters=("dgx-h100:1,2,4",), tokens="1T",
                        max_gbs_tokens="10M")
    points = make_plan(config).points
    seq = load_config("llama3-8b", "dgx-h100:1").train.seq_length
    base = load_config("llama3-8b", "dgx-h100:1").train.global_batch_size
    assert [p.global_batch_size for p in points] == [base, 2 * base, int(10e6 // seq)]


def test_an_injected_interval_bounds_days_and_cost() -> None:
    """A ±10 % throughput interval: days between tokens/(1.1·r) and tokens/(0.9·r)."""
    def ten_percent(cfg: AutotuneConfig, prediction: Estimate) -> Interval:
        r = prediction.tokens_per_s
        return Interval(0.9 * r, 1.1 * r, "test ±10 %")

    config = PlanConfig(model="llama3-8b", clusters=("dgx-h100:1",), tokens="1T", price="2")
    plan = make_plan(config, interval=ten_percent)
    (p,) = plan.points
    assert p.interval == "test ±10 %" and plan.calibrated
    assert p.days_low == pytest.approx(TOKENS / (1.1 * p.tokens_per_s) / 86_400)
    assert p.days_high == pytest.approx(TOKENS / (0.9 * p.tokens_per_s) / 86_400)
    assert p.cost_high == pytest.approx(8 * TOKENS / (0.9 * p.tokens_per_s) / 3600 * 2)


def test_prices_come_from_the_option_the_file_or_the_blanket(tmp_path: Path) -> None:
    cluster = tmp_path / "mine.yaml"
    cluster.write_text("nodes: 2\ngpus_per_node: 8\ngpu: h100-sxm-80gb\nintra_node_gb_s: 450\n"
                       "inter_node_gb_s: 50\nhost_memory_gb: 2048\npcie_gb_s: 64\n"
                       "price_per_gpu_hour: 1.75\n")
    config = PlanConfig(model="llama3-8b", tokens="1T", price="3,hgx-h200=4",
                        clusters=("dgx-h100:1", "hgx-h200:1", str(cluster), f"{cluster}:4,8"))
    with pytest.raises(AutotuneError, match="mine is given twice"):
        cluster_sizes(config)
    config = config.model_copy(update={"clusters": ("dgx-h100:1", "hgx-h200:1",
                                                    f"{cluster}:4,8")})
    sizes = {c.name: c for c in cluster_sizes(config)}
    assert {n: c.price_per_gpu_hour for n, c in sizes.items()} == {
        "dgx-h100": 3.0, "hgx-h200": 4.0, "mine": 1.75}
    assert sizes["mine"].nodes == (4, 8)


def test_a_price_for_a_cluster_not_in_the_plan_is_refused() -> None:
    config = PlanConfig(model="llama3-8b", clusters=("dgx-h100:1",), tokens="1T",
                        price="dgx-h10=2")
    with pytest.raises(AutotuneError, match=r"--price: dgx-h10 is not a cluster of the plan"):
        cluster_sizes(config)


def test_a_deadline_without_prices_is_refused_before_planning() -> None:
    config = PlanConfig(model="llama3-8b", clusters=("dgx-h100:1",), tokens="1T",
                        deadline="30d")
    with pytest.raises(AutotuneError, match="--deadline: needs a price per GPU-hour for "
                                            "dgx-h100"):
        make_plan(config)


def test_the_default_interval_is_the_cost_models_own_or_uncalibrated() -> None:
    """Oracle: the uncertainty module's own `prediction_interval` where this build has it;
    without the module every figure is uncalibrated."""
    import importlib

    from autotune.planning.plan import UNCERTAINTY_MODULE
    from autotune.planning.plan import model_interval

    cfg = load_config("llama3-8b", "dgx-h100:1")
    prediction = estimate(cfg, Layout(tp=1, dp=8, zero=1, mbs=1, gas=64))
    try:
        module = importlib.import_module(UNCERTAINTY_MODULE)
    except ModuleNotFoundError:
        assert model_interval(cfg, prediction) is None
        return
    found = module.prediction_interval(cfg)
    band = model_interval(cfg, prediction)
    if found is None:
        assert band is None
    else:
        assert band is not None
        assert (band.low, band.high) == pytest.approx(found.throughput(prediction.tokens_per_s))


@pytest.mark.parametrize("price", ["-1", "0", ".inf", "true"])
def test_a_cluster_file_price_must_be_positive_and_finite(tmp_path: Path, price: str) -> None:
    cluster = tmp_path / "mine.yaml"
    cluster.write_text("nodes: 1\ngpus_per_node: 8\ngpu: h100-sxm-80gb\nintra_node_gb_s: 450\n"
                       "inter_node_gb_s: 50\nhost_memory_gb: 2048\npcie_gb_s: 64\n"
                       f"price_per_gpu_hour: {price}\n")
    config = PlanConfig(model="llama3-8b", clusters=(str(cluster),), tokens="1T")
    with pytest.raises(AutotuneError, match="price_per_gpu_hour"):
        cluster_sizes(config)
