"""The published-runs data, its FLOPs conventions and the cross-validation folds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from autotune.calibration.fit import at_bounds
from autotune.calibration.fit import leave_one_source_out
from autotune.calibration.fit import published_points
from autotune.calibration.published import CONVENTIONS
from autotune.calibration.published import KNOWN_REGRESSIONS
from autotune.calibration.published import PUBLISHED_RUNS
from autotune.calibration.published import candidates
from autotune.calibration.published import label
from autotune.calibration.published import measured_step_s
from autotune.calibration.published import megatron_causal_flops
from autotune.calibration.published import megatron_noncausal_flops
from autotune.calibration.published import model_spec
from autotune.calibration.published import open_dimensions
from autotune.calibration.published import palm_flops
from autotune.calibration.published import problem
from autotune.calibration.published import published_flops
from autotune.calibration.published import published_run
from autotune.calibration.published import read_rows
from autotune.calibration.published import sc21_eq3_flops
from autotune.costmodel.constants import FIT_BOUNDS
from autotune.costmodel.constants import Constants
from autotune.costmodel.terms import terms_for
from autotune.specs import ModelSpec

ROWS = {row["row_id"]: row for row in read_rows()}
TINY = ModelSpec(num_layers=2, hidden_size=64, num_attention_heads=4, vocab_size=1000)
"""A plain GPT (MHA, 4h GELU MLP): B=2, s=128, V=1000 below."""


@pytest.mark.parametrize(
    ("convention", "expected"),
    [
        # 96·B·s·l·h² = 96·2·128·2·4096 = 201,326,592; × (1 + 128/384 + 1000/2048) = 366,739,456
        (lambda: sc21_eq3_flops(TINY, 128, 2, 1000), 366_739_456),
        # 72·B·s·l·h² = 150,994,944; × (1 + 128/384 + 1000/1536) = 299,630,592
        (lambda: megatron_noncausal_flops(TINY, 128, 2, 1000), 299_630_592),
        # 150,994,944 × (1 + 128/768 + 1000/1536) = 274,464,768
        (lambda: megatron_causal_flops(TINY, 128, 2, 1000), 274_464_768),
        # B·s·(6N + 12·l·h·s) = 256·(600,000 + 196,608) = 203,931,648 for N = 100,000
        (lambda: palm_flops(TINY, 128, 2, 100_000), 203_931_648),
    ],
    ids=["SC21_EQ3", "MCORE_R080", "MCORE", "PALM"],
)
def test_conventions_against_hand_worked_values(convention, expected) -> None:
    """Oracle: each convention's closed form evaluated by hand (in the comments) for a tiny GPT."""
    assert convention() == pytest.approx(expected, rel=1e-12)


# Narayanan et al. 2021, Table 2, last column: days to train on 300B tokens at that throughput.
TABLE2_DAYS = {"sc21_t2_01": 90, "sc21_t2_02": 74, "sc21_t2_03": 74, "sc21_t2_04": 169,
               "sc21_t2_05": 137, "sc21_t2_06": 140, "sc21_t2_07": 84, "sc21_t2_08": 43,
               "sc21_t2_09": 23, "sc21_t2_10": 156, "sc21_t2_11": 80, "sc21_t2_12": 42}


@pytest.mark.parametrize("row_id", sorted(TABLE2_DAYS))
def test_sc21_eq3_reproduces_the_papers_training_days(row_id: str) -> None:
    """Oracle: SC21 Table 2 publishes both TFLOP/s per GPU and the days for 300B tokens; Eq. 3
    per token at that throughput gives the days to within the table's rounding."""
    row = ROWS[row_id]
    model = model_spec(row)
    per_token = published_flops(row, model) / (int(row["global_batch_size"]) * 2048)
    seconds = 300e9 * per_token / (float(row["tflops_per_gpu"]) * 1e12 * int(row["num_gpus"]))
    assert seconds / 86400 == pytest.approx(TABLE2_DAYS[row_id], abs=1.0)


@pytest.mark.parametrize("row_id", ["mtnlg_01", "mtnlg_02", "mtnlg_03", "bloom_176b"])
def test_sc21_eq3_links_iteration_time_and_tflops(row_id: str) -> None:
    """Oracle: MT-NLG §2.4 and the BLOOM log line publish both the iteration time and the
    TFLOP/s per GPU, which their authors computed with Eq. 3."""
    row = ROWS[row_id]
    flops = published_flops(row, model_spec(row))
    tflops = flops / float(row["iteration_time_s"]) / int(row["num_gpus"]) / 1e12
    assert tflops == pytest.approx(float(row["tflops_per_gpu"]), rel=0.01)


@pytest.mark.parametrize("row_id", ["kor22_sel_01", "kor22_sel_02", "kor22_sel_03",
                                    "kor22_sel_04", "kor22_sel_dp8"])
def test_noncausal_count_reproduces_korthikanti_mfu(row_id: str) -> None:
    """Oracle: Korthikanti et al. 2022 Table 5 / §6.3 publish the iteration time and the MFU
    (Eq. 7, the non-causal count) of each configuration; A100 peak 312 TFLOP/s."""
    row = ROWS[row_id]
    flops = published_flops(row, model_spec(row))
    mfu = flops / float(row["iteration_time_s"]) / int(row["num_gpus"]) / 312e12
    assert 100 * mfu == pytest.approx(float(row["mfu_pct"]), abs=0.3)


@pytest.mark.parametrize(
    "row_id",
    ["nemo2407_gpt3_175b_128", "nemo2407_llama2_70b_64", "nemo2407_llama3_8b_8",  # MCORE_R080
     "mbridge_2511_h100_llama38b_8", "mbridge_2511_h100_llama370b_64",  # MCORE
     "tt_a100_l3_8b_sel_op", "tt_a100_l2_70b_full", "llmfoundry_a100_7b_2048_8",  # PALM
     "llmfoundry_h100_70b_2048_512"],
)
def test_conventions_link_published_tokens_and_flops(row_id: str) -> None:
    """Oracle: the source publishes tokens/s per GPU and TFLOP/s (or MFU) of the same run; the
    row's convention must turn one into the other (NeMo 24.07 and Megatron-Bridge 25.11 tables,
    torchtitan and LLM Foundry benchmark tables)."""
    row = ROWS[row_id]
    flops = published_flops(row, model_spec(row))
    tokens = int(row["global_batch_size"]) * int(row["seq_length"])
    tflops = flops / tokens * float(row["tokens_per_sec_per_gpu"]) / 1e12
    published = (float(row["tflops_per_gpu"]) if row["tflops_per_gpu"]
                 else float(row["mfu_pct"]) / 100 * float(row["peak_tflops_basis"]))
    assert tflops == pytest.approx(published, rel=0.01)


def test_measured_step_prefers_the_most_direct_figure() -> None:
    """Oracle: MT-NLG §2.4 publishes 60.1 s per iteration next to 126 TFLOP/s: the iteration
    time is taken as is; a row with tokens/s only gives gbs·seq/(tokens/s · GPUs)."""
    step, basis = measured_step_s(ROWS["mtnlg_01"], model_spec(ROWS["mtnlg_01"]))
    assert (step, basis) == (60.1, "iteration time")
    row = ROWS["tt_a100_l3_70b_full"]  # 64 GPUs, gbs 64, seq 8192, 331 tokens/s per GPU
    step, basis = measured_step_s(row, model_spec(row))
    assert basis == "tokens/s"
    assert step == pytest.approx(64 * 8192 / (331 * 64))


def test_every_row_names_its_source_and_obeys_the_layout_identities() -> None:
    """Oracle: data/README.md's promises: a source, location and tier on every row, a measured
    figure (with its FLOPs convention when it is a FLOP rate) on every measured row, world =
    tp·pp·cp·dp and gbs = mbs·dp·gas wherever they are given, and every source listed."""
    readme = (PUBLISHED_RUNS.parent / "README.md").read_text()
    assert len(ROWS) == len(read_rows())  # row ids are unique
    for row in ROWS.values():
        assert row["source"] and row["source_location"] and row["tier"] in ("A", "B")
        assert f"`{row['source_id']}`" in readme, row["source_id"]
        assert row["flops_definition"] in ("", *CONVENTIONS)
        degrees = int(row["tp"]) * int(row["pp"]) * int(row["cp"] or 1) * int(row["dp"])
        assert degrees == int(row["num_gpus"]), row["row_id"]
        if row["micro_batch_size"] and row["grad_accum"]:
            assert int(row["micro_batch_size"]) * int(row["dp"]) * int(row["grad_accum"]) == (
                int(row["global_batch_size"])), row["row_id"]
        figures = [row[c] for c in ("iteration_time_s", "tokens_per_sec_per_gpu",
                                    "tflops_per_gpu", "mfu_pct")]
        assert any(figures) == (row["kind"] == "measured"), row["row_id"]
        if row["kind"] == "measured" and not (row["iteration_time_s"]
                                              or row["tokens_per_sec_per_gpu"]):
            assert row["flops_definition"], row["row_id"]


def test_data_files_point_only_upstream() -> None:
    """Oracle: the provenance rule: cite the paper, repo file at a commit or docs page, never a
    local path (no parent-relative path, no absolute path outside a URL)."""
    local = re.compile(r"(?<![\w:/.~-])/[A-Za-z_]+/|\.\./")
    for path in Path(PUBLISHED_RUNS.parent).iterdir():
        assert local.findall(path.read_text()) == [], path.name


@pytest.mark.parametrize(
    ("row_id", "reason"),
    [
        ("mbridge_2511_b200_llama38b_8", "no cluster preset for GPU B200"),
        ("tt_a100_l3_8b_sel_layer", "recompute policy"),
        ("tt_a100_l2_70b_sel_op", "recompute policy 'selective-op'"),
    ],
)
def test_rows_the_model_cannot_express_are_skipped_with_the_reason(row_id, reason) -> None:
    """Oracle: the row's own cells (GPU type, torchtitan's every-2nd-layer and per-op
    checkpointing) against what autotune can express."""
    run = published_run(ROWS[row_id])
    assert run.skip and reason in run.skip


def test_deepseek_v3_on_its_custom_pipeline_layout_is_expressed() -> None:
    """Oracle: the row's own cells: Megatron-Bridge ran DeepSeek-V3's 61 layers on pp8·vpp4
    with --pipeline-model-parallel-layout, so no rule may reject the published layout."""
    run = published_run(ROWS["mbridge_2509_h100_deepseekv3_1024"])
    assert (run.skip, run.broken_rule) == (None, None)
    assert {(lay.pp, lay.vpp) for lay in run.layouts} == {(8, 4)}


@pytest.mark.parametrize(("row_id", "total_b", "active_b"), [
    ("mbridge_2511_h100_qwen330ba3b_16", 30.5, 3.3),
    ("mbridge_2509_h100_deepseekv3_1024", 671, 37),
])
def test_moe_rows_are_read_with_their_experts(row_id: str, total_b: float,
                                              active_b: float) -> None:
    """Oracle: the published sizes (Qwen3 model card: 30.5B total, 3.3B activated; DeepSeek-V3
    report: 671B total, 37B activated per token), and the row's published ep in its layouts."""
    row = ROWS[row_id]
    model = model_spec(row)
    assert model.num_params() / 1e9 == pytest.approx(total_b, rel=0.005)
    assert model.active_params() / 1e9 == pytest.approx(active_b, rel=0.03)
    layouts, _ = candidates(row, problem(row))
    assert {lay.ep for lay in layouts} == {int(row["ep"])}


def test_the_2602_01_qwen3_30b_row_runs_the_layout_of_its_release_script() -> None:
    """Oracle: NVIDIA-NeMo/Megatron-Bridge scripts/performance/configs/qwen/
    qwen3_workload_base_configs.py @ cfeddcd94 (and v0.3.1): the H100 fp8 Qwen3-30B-A3B config
    sets expert_model_parallel_size=16, gbs 1024, no pipeline (WorkloadBaseConfig's defaults: tp
    1, pp 1, no virtual stages, mbs 1), and HybridEP as the flex dispatcher's backend."""
    run = published_run(ROWS["mbridge_26021_h100_qwen330ba3b_16"])
    assert {(lay.tp, lay.pp, lay.vpp, lay.ep, lay.dp, lay.mbs) for lay in run.layouts} == {
        (1, 1, 1, 16, 16, 1)}
    assert run.cfg is not None and run.cfg.train.moe_token_dispatcher == "flex"
    assert run.cfg.train.global_batch_size == 1024


def test_known_regressions_are_the_slow_runs_of_the_replaced_recipe() -> None:
    """Oracle: the tables' own cells (tokens/s per GPU): the two Qwen3-30B-A3B runs of the pp2
    ep8 recipe with the EP overlap (25.11: 5,275; 26.02: 5,113) against every run of the recipe
    that replaced it (8,826-9,058), all on 16 H100 in fp8."""
    speed = {row_id: float(ROWS[row_id]["tokens_per_sec_per_gpu"]) for row_id in ROWS
             if ROWS[row_id]["model"] == "Qwen3-30B-A3B" and ROWS[row_id]["num_gpus"] == "16"}
    assert set(KNOWN_REGRESSIONS) == {"mbridge_2511_h100_qwen330ba3b_16",
                                      "mbridge_2602_h100_qwen330ba3b_16"}
    slow = [speed[row_id] for row_id in KNOWN_REGRESSIONS]
    fast = [v for row_id, v in speed.items() if row_id not in KNOWN_REGRESSIONS]
    assert sorted(slow) == [5113, 5275] and len(fast) == 4
    assert min(fast) / max(slow) > 1.6
    assert all(ROWS[row_id]["pp"] == "2" and ROWS[row_id]["ep"] == "8"
               for row_id in KNOWN_REGRESSIONS)


def test_gpt_oss_rows_are_read_with_their_experts_and_windows() -> None:
    """Oracle: OpenAI's gpt-oss-120b model card (Table 1: 116.83B parameters, 5.13B active per
    token, the embedding table not counted) and openai/gpt-oss-120b's config.json (a 128-token
    sliding window on every other layer, head_dim 64)."""
    row = ROWS["mbridge_2602_h100_gptoss120b_64"]
    model = model_spec(row)
    assert model.num_params() / 1e9 == pytest.approx(116.83, abs=0.005)
    embedding = model.vocab_size * model.hidden_size
    assert (model.active_params() - embedding) / 1e9 == pytest.approx(5.13, abs=0.005)
    assert (model.window_size, model.window_attn_skip_freq, model.head_dim) == (127, 2, 64)


def test_llama3_fsdp_without_reshard_is_expressed_as_the_distributed_optimizer() -> None:
    """Oracle: Llama 3 §3.3.2 shards optimizer states and gradients with pp=16; Megatron-FSDP
    (zero 2) needs pp=1, so the nearest expressible sharding is zero 1, and it is recorded."""
    run = published_run(ROWS["llama3_t4_1"])
    assert run.skip is None
    assert {lay.zero for lay in run.layouts} == {1}
    assert any("zero2" in note for note in run.substitutions)


def test_llm_foundry_rows_reduce_in_the_dtype_of_their_published_mp_mode() -> None:
    """Oracle: the README table's 'MP Mode' column (kept in each row's notes: the A100 MPT-70B
    rows 'bf16 (PURE)', the others amp_bf16 with DEFAULT) and Composer's `get_mixed_precision`:
    PURE reduces in bf16 (2 B), DEFAULT in float32 (4 B)."""
    rows = [row for row in ROWS.values() if row["source_id"] == "llmfoundry"
            and row["precision"] == "bf16"]
    pure = {row["row_id"] for row in rows if "(PURE)" in row["notes"]}
    assert pure == {"llmfoundry_a100_70b_2048_32", "llmfoundry_a100_70b_2048_64"}
    for row in rows:
        cfg = problem(row)
        expected = 2 if row["row_id"] in pure else 4
        assert terms_for(cfg).grad_reduce_bytes(cfg) == expected, row["row_id"]


def test_leave_one_source_out_never_fits_on_the_held_out_source() -> None:
    """Oracle: the definition of leave-one-source-out: each fold trains on every other source
    and holds out all of one, and every point is held out exactly once."""
    points = published_points()
    held = []
    for source, train, test in leave_one_source_out(points):
        assert {p.source for p in test} == {source}
        assert source not in {p.source for p in train}
        assert len(train) + len(test) == len(points)
        held += [p.name for p in test]
    assert sorted(held) == sorted(p.name for p in points)
    assert len({p.source for p in points}) >= 6


def test_constants_on_a_fit_bound_are_flagged() -> None:
    """Oracle: the fit bounds as written in autotune/costmodel/constants.py: comm_efficiency
    0.5-0.95,
    elementwise_passes 0.5-4; within 1 % of a limit is on the bound."""
    on = Constants(comm_efficiency=0.945, elementwise_passes=0.504)
    off = Constants(comm_efficiency=0.9, elementwise_passes=0.6)
    assert at_bounds(on, ("comm_efficiency", "elementwise_passes")) == [
        ("comm_efficiency", "upper", 0.95), ("elementwise_passes", "lower", 0.5)]
    assert at_bounds(off, ("comm_efficiency", "elementwise_passes")) == []


def test_every_constant_documents_unit_source_and_bounds() -> None:
    """Oracle: the rule this model keeps: each constant states its unit and source, and each one
    the fit may move the same bounds its metadata holds (the default inside them)."""
    for name, field in Constants.model_fields.items():
        doc = field.description or ""
        assert "Unit:" in doc and "Source:" in doc, name
        if name in FIT_BOUNDS:
            low, high = FIT_BOUNDS[name]
            assert f"Fit bounds {low:g}-{high:g}" in doc, name
            assert low <= getattr(Constants(), name) <= high, name


def test_torchtitan_per_op_checkpointing_is_not_megatron_selective() -> None:
    """Oracle: torchtitan `train_configs/llama3_8b.toml` @ e7c0cae sets selective_ac_option = "op"
    (the benchmark's own commit); the rows record that policy, which autotune cannot express, so
    they are skipped instead of being read as Megatron's selective recompute."""
    rows = [row for row in ROWS.values() if row["recompute"] == "selective-op"]
    assert {row["source_id"] for row in rows} == {"torchtitan"}
    assert len(rows) == 5
    assert all("selective-op" in published_run(row).skip for row in rows)


def test_benchmark_labels_are_the_layout_text_users_type() -> None:
    """Oracle: `Layout.parse`, the reader of `--layout`: every candidate of a published run
    whose settings are open is labelled in the one notation, its open dimensions starred, and
    the label without its stars parses back to the same layout."""
    from autotune.frameworks import framework_of
    from autotune.layout import Layout

    runs = [published_run(row) for row in read_rows(PUBLISHED_RUNS)]
    run = next(r for r in runs if len(open_dimensions(r.layouts)) >= 2)
    cfg = problem(run.row)
    opened = open_dimensions(run.layouts)
    for layout in run.layouts:
        text = label(layout, opened)
        starred = {item.split("=")[0] for item in text.split(",") if item.endswith("*")}
        assert starred == opened
        back = Layout.parse(text.replace("*", ""), cfg.world_size,
                            cfg.train.global_batch_size, framework_of(cfg))
        assert back == layout
