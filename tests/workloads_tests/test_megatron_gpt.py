"""The megatron-core workload: arguments, config building against the rules, the CPU path.

The training loop needs CUDA; `test_trains_tiny_gpt_on_gpu` runs it where a GPU exists.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from autotune.calibration.microbench import bench_plan
from autotune.exceptions import AutotuneError
from autotune.layout import Layout
from autotune.space.rules import violations
from autotune.space.search_space import SearchSpace
from autotune.space.search_space import enumerate_layouts
from autotune.space.search_space import load_space
from autotune.specs.inputs import load_config
from autotune.workloads import megatron_gpt as mg
from autotune.workloads.records import EXIT_CODES

ROOT = Path(__file__).resolve().parents[2]
NO_CUDA = not torch.cuda.is_available()


def _layout_file(tmp_path: Path, **fields: Any) -> Path:
    path = tmp_path / "layout.json"
    path.write_text(json.dumps(Layout(**fields).to_dict()))
    return path


def _run(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str],
    world: int = 1,
) -> tuple[int, dict[str, Any], str]:
    """main() in this process; returns the exit code, the summary record and stderr."""
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", str(world))
    code = mg.main(argv)
    captured = capsys.readouterr()
    lines = [json.loads(line) for line in captured.out.splitlines() if line.startswith("{")]
    return code, lines[-1], captured.err


def _argv(layout: Path, model: str = "tiny-gpt", seq: int = 256, gbs: int = 2) -> list[str]:
    return ["--model", model, "--layout", str(layout), "--seq", str(seq), "--gbs", str(gbs)]


# --- arguments and inputs ----------------------------------------------------------------------


def test_parse_args_defaults_and_ignores_launcher_flags(tmp_path: Path) -> None:
    args = mg.parse_args(_argv(tmp_path / "l.json") + ["--local_rank=3"])
    assert (args.steps, args.warmup, args.precision, args.attention) == (6, 2, "bf16", "sdpa")


@pytest.mark.parametrize("extra", [["--steps", "2", "--warmup", "2"], ["--gbs", "0"],
                                   ["--precision", "int8"], ["--attention", "te"]])
def test_parse_args_rejects_bad_values(tmp_path: Path, extra: list[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        mg.parse_args(_argv(tmp_path / "l.json") + extra)
    assert exit_info.value.code == 2


def test_parse_args_needs_model_and_layout() -> None:
    with pytest.raises(SystemExit):
        mg.parse_args(["--seq", "16", "--gbs", "2"])


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        (lambda d: d / "missing.json", "cannot read"),
        (lambda d: (d / "bad.json").write_text("{tp: 1") and d / "bad.json", "not valid JSON"),
        (lambda d: (d / "list.json").write_text("[1]") and d / "list.json", "JSON object"),
        (lambda d: (d / "x.json").write_text('{"tp": 1, "pp": 1, "bogus": 3, "mbs": 1,'
                                             ' "gas": 2, "dp": 1}') and d / "x.json", None),
    ],
)
def test_bad_layout_file_is_bad_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    setup: Any, message: str | None,
) -> None:
    code, summary, _ = _run(monkeypatch, capsys, _argv(setup(tmp_path)))
    if message is None:  # unknown keys are ignored, as in the DeepSpeed workload
        assert summary["status"] == ("rejected" if NO_CUDA else summary["status"])
        return
    assert code == EXIT_CODES["bad_input"]
    assert summary["status"] == "bad_input" and message in summary["reason"]


def test_unknown_model_lists_presets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    layout = _layout_file(tmp_path, mbs=1, gas=2)
    code, summary, err = _run(monkeypatch, capsys, _argv(layout, model="gpt-5"))
    assert code == 2 and summary["status"] == "bad_input"
    assert "neither a preset nor a file" in summary["reason"] and "llama2-7b" in err


@pytest.mark.parametrize(
    ("fields", "argv_extra", "world", "message"),
    [
        ({"tp": 2, "mbs": 1, "gas": 2}, [], 1, "but the cluster has 1 GPUs"),
        ({"mbs": 1, "gas": 2}, ["--gbs", "8"], 1, "but the global batch is 8"),
        ({"mbs": 1, "gas": 2}, ["--seq", "4096", "--model", "gpt3-1.3b"], 1,
         "exceeds the model's learned positions"),
    ],
)
def test_inputs_that_disagree_are_bad_input(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    fields: dict[str, Any], argv_extra: list[str], world: int, message: str,
) -> None:
    code, summary, _ = _run(monkeypatch, capsys,
                            _argv(_layout_file(tmp_path, **fields)) + argv_extra, world)
    assert code == 2 and summary["status"] == "bad_input"
    assert message in summary["reason"]


def test_refusal_exits_nonzero_on_rank_0_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Rank 1 refuses like rank 0 but exits 0, so a launcher cannot kill rank 0 first."""
    layout = _layout_file(tmp_path, mbs=1, gas=2)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert mg.main(_argv(layout)) == 0
    assert capsys.readouterr().out == ""
    code, summary, _ = _run(monkeypatch, capsys, _argv(layout), world=2)
    assert code == 2 and summary["status"] == "bad_input"  # layout dp=1 on 2 ranks


# --- the CPU path ------------------------------------------------------------------------------


@pytest.mark.skipif(not NO_CUDA, reason="the CPU path only runs without CUDA")
def test_without_cuda_the_summary_is_rejected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    metrics = tmp_path / "metrics.jsonl"
    layout = _layout_file(tmp_path, mbs=1, gas=2, zero=1, recompute="selective")
    code, summary, _ = _run(monkeypatch, capsys, _argv(layout) + ["--metrics", str(metrics)])
    assert code == EXIT_CODES["rejected"] == 5
    assert summary == {"event": "summary", "status": "rejected", "reason": mg.NO_CUDA,
                       "world_size": 1}
    assert json.loads(metrics.read_text()) == summary


@pytest.mark.skipif(not NO_CUDA, reason="the CPU path only runs without CUDA")
def test_module_entry_point_exits_rejected(tmp_path: Path) -> None:
    layout = _layout_file(tmp_path, mbs=1, gas=2)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RANK": "0", "WORLD_SIZE": "1"}
    done = subprocess.run([sys.executable, "-m", "autotune.workloads.megatron_gpt",
                           *_argv(layout)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 5, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1])["reason"] == mg.NO_CUDA


@pytest.mark.parametrize(
    ("fields", "argv_extra", "world", "reason"),
    [
        ({"cp": 2, "mbs": 1, "gas": 2}, [], 2, "needs Transformer Engine's attention"),
        ({"mbs": 1, "gas": 2}, ["--precision", "fp8"], 1, "fp8 needs Transformer Engine"),
        ({"tp": 2, "pp": 2, "vpp": 2, "mbs": 1, "gas": 3, "sp": True}, ["--gbs", "3"], 4,
         "groups of pp"),
        ({"offload": "optimizer+params", "zero": 3, "mbs": 1, "gas": 2}, [], 1,
         "megatron_no_param_offload"),
        ({"tp": 3, "mbs": 1, "gas": 2}, [], 3, "heads_divisible_by_tp"),
    ],
)
def test_combinations_it_cannot_train_are_rejected(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    fields: dict[str, Any], argv_extra: list[str], world: int, reason: str,
) -> None:
    code, summary, _ = _run(monkeypatch, capsys,
                            _argv(_layout_file(tmp_path, **fields)) + argv_extra, world)
    assert code == 5 and summary["status"] == "rejected"
    assert reason in summary["reason"]


# --- config building against the rules -------------------------------------------------------

_PROBLEMS = [
    ("llama2-7b", "dgx-h100:4", 256),
    ("gpt3-1.3b", "dgx-a100:1", 64),
    ("llama3-70b", "dgx-h100:8", 512),
    ("llama3-405b", "dgx-h100:16", 1024),
    ("tiny-gpt", "dgx-h100:1", 16),
    ("mixtral-8x7b", "dgx-h100:8", 1024),
]


DIMS = ("tp", "pp", "vpp", "cp", "zero", "offload", "recompute", "sp", "ep", "etp")
"""Layout dimensions whose every value the sample shows."""


def _sample(rows: list[Layout], size: int = 24) -> list[Layout]:
    """Layouts that show every value of every dimension at least once, plus a spread."""
    chosen: dict[str, Layout] = {}
    for lay in rows:
        for dim in DIMS:
            chosen.setdefault(f"{dim}={getattr(lay, dim)}", lay)
    step = max(1, len(rows) // size)
    return list({lay: None for lay in [*chosen.values(), *rows[::step]]})


@pytest.mark.parametrize(("model", "cluster", "gbs"), _PROBLEMS)
def test_feasible_layouts_build_configs_that_match(model: str, cluster: str, gbs: int) -> None:
    cfg = load_config(model, cluster, framework="megatron", global_batch_size=gbs)
    feasible = enumerate_layouts(cfg, load_space(None, "megatron")).feasible.rows()
    assert feasible
    for lay in _sample(feasible):
        transformer, ddp, optimizer = mg.build_configs(cfg, lay)
        m = cfg.model
        assert (transformer.num_layers, transformer.hidden_size, transformer.num_attention_heads,
                transformer.num_query_groups, transformer.ffn_hidden_size) == (
            m.num_layers, m.hidden_size, m.num_attention_heads, m.query_groups, m.ffn)
        assert transformer.gated_linear_unit == m.gated
        assert (transformer.tensor_model_parallel_size, transformer.pipeline_model_parallel_size,
                transformer.context_parallel_size, transformer.sequence_parallel) == (
            lay.tp, lay.pp, lay.cp, lay.sp)
        assert transformer.virtual_pipeline_model_parallel_size == (
            lay.vpp if lay.vpp > 1 else None)
        assert transformer.recompute_granularity == (
            None if lay.recompute == "none" else lay.recompute)
        assert transformer.recompute_method == ("uniform" if lay.recompute == "full" else None)
        bf16 = cfg.train.precision == "bf16"  # tiny-gpt trains in fp32
        assert transformer.bf16 == optimizer.bf16 == bf16
        assert transformer.params_dtype == (torch.bfloat16 if bf16 else torch.float32)
        assert transformer.deallocate_pipeline_outputs
        assert transformer.overlap_p2p_comm == (lay.vpp > 1)
        if m.num_layers % (lay.pp * lay.vpp):  # uneven: edges, embedding/loss counted, layout
            assert (transformer.num_layers_in_first_pipeline_stage is not None
                    or transformer.account_for_embedding_in_pipeline_split
                    or transformer.account_for_loss_in_pipeline_split
                    or transformer.pipeline_model_parallel_layout is not None)
        assert ddp.use_distributed_optimizer == (lay.zero >= 1)
        assert ddp.use_megatron_fsdp == (lay.zero >= 2)
        if lay.zero >= 2:
            assert ddp.data_parallel_sharding_strategy == {
                2: "optim_grads", 3: "optim_grads_params"}[lay.zero]
        assert ddp.grad_reduce_in_fp32 == bf16
        assert ddp.bucket_size == max(40_000_000, 1_000_000 * lay.dp * lay.cp)
        assert optimizer.use_distributed_optimizer == (lay.zero >= 1)
        assert optimizer.optimizer_cpu_offload == (lay.offload == "optimizer")
        assert optimizer.use_precision_aware_optimizer == (lay.offload == "optimizer")
        assert transformer.num_moe_experts == m.num_experts
        if m.moe:
            assert (transformer.expert_model_parallel_size,
                    transformer.expert_tensor_parallel_size) == (lay.ep, lay.etp)
            assert transformer.moe_token_dispatcher_type == (
                "alltoall" if lay.ep > 1 else "allgather")
            assert not transformer.moe_grouped_gemm  # the local spec's experts run one by one


def test_sample_covers_every_dimension() -> None:
    seen: dict[str, set[Any]] = {}
    for model, cluster, gbs in _PROBLEMS:
        cfg = load_config(model, cluster, framework="megatron", global_batch_size=gbs)
        for lay in _sample(enumerate_layouts(cfg, load_space(None, "megatron")).feasible.rows()):
            for dim in DIMS:
                seen.setdefault(dim, set()).add(getattr(lay, dim))
    assert seen["zero"] == {0, 1, 2, 3} and seen["offload"] == {"none", "optimizer"}
    assert seen["recompute"] == {"none", "selective", "full"} and seen["sp"] == {True, False}
    assert {2, 4, 8} <= seen["tp"] and {2, 4} <= seen["pp"] and len(seen["vpp"]) > 1
    assert len(seen["cp"]) > 1
    assert {1, 2, 4, 8} <= seen["ep"] and {1, 2} <= seen["etp"]


@pytest.mark.parametrize(
    ("model", "layout", "rule", "error"),
    [
        ("gpt3-1.3b", Layout(tp=3, dp=1, mbs=1, gas=2), "heads_divisible_by_tp", ValueError),
        ("gpt3-1.3b", Layout(dp=3, mbs=1, gas=2, sp=True), "sp_needs_tp", ValueError),
        ("llama2-7b", Layout(pp=2, vpp=18, dp=1, mbs=1, gas=2), "layers_divisible_by_pp_vpp",
         AutotuneError),
    ],
)
def test_layouts_the_rules_refuse_do_not_build(
    model: str, layout: Layout, rule: str, error: type[Exception]
) -> None:
    """Oracle: megatron-core's own TransformerConfig checks refuse what the rule refuses."""
    cfg = load_config(model, "dgx-h100:1", framework="megatron", global_batch_size=6)
    cfg = cfg.model_copy(update={"cluster": cfg.cluster.model_copy(
        update={"gpus_per_node": layout.world_size})})
    names = [name for name, _ in violations(cfg, layout, _constants(cfg))]
    assert rule in names
    with pytest.raises(error):
        mg.build_configs(cfg, layout)


def _constants(cfg: Any) -> Any:
    from autotune.costmodel.constants import constants_for

    return constants_for(cfg.cluster.gpu)


def test_uneven_pipeline_stages_reach_the_config() -> None:
    """Oracle: the Llama 3 paper (sec. 3.3.2) trains 126 layers over 16 stages with one layer
    fewer on the first and last stage; megatron-core's get_num_layers_to_build, given the built
    config, puts 7 layers on the edge ranks and 8 on the others."""
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    cfg = load_config("llama3-405b", "dgx-h100:16", framework="megatron", global_batch_size=64)
    transformer, _, _ = mg.build_configs(cfg, Layout(tp=8, pp=16, dp=1, mbs=1, gas=64, sp=True))
    built = [get_num_layers_to_build(transformer, pp_rank=rank) for rank in range(16)]
    assert built == [7] + [8] * 14 + [7]


def test_custom_space_of_fsdp_and_offload_builds() -> None:
    cfg = load_config("llama2-7b", "dgx-h100:2", framework="megatron", global_batch_size=32)
    space = SearchSpace(tp=[1, 8], pp=[1], zero=[1, 2, 3], offload=["none", "optimizer"],
                        mbs=[1], recompute=["full"], sp=[False, True])
    rows = enumerate_layouts(cfg, space).feasible.rows()
    assert {lay.zero for lay in rows} == {1, 2, 3} and any(lay.offload != "none" for lay in rows)
    for lay in rows:
        mg.build_configs(cfg, lay)


# --- the model pieces that run without a GPU --------------------------------------------------


@pytest.mark.parametrize("preset", ["tiny-gpt", "tiny-moe"])
def test_layer_spec_swaps_core_attention(preset: str, model_parallel: None) -> None:
    """Oracle: megatron-core's own decoder block spec (dense or MoE layers, local modules)."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    cfg = load_config(preset, "dgx-h100:1", framework="megatron")
    layout = Layout(dp=8, zero=1, gas=cfg.train.global_batch_size // 8)
    config, _, _ = mg.build_configs(cfg, layout)
    for attention, expected in (("sdpa", mg.SDPAttention), ("local", DotProductAttention)):
        block = mg.layer_spec(config, attention)
        assert len(block.layer_specs) == cfg.model.num_layers
        for layer in block.layer_specs:
            assert layer.submodules.self_attention.submodules.core_attention is expected


def test_sdpa_attention_matches_causal_softmax_with_gqa() -> None:
    torch.manual_seed(0)
    s, b, heads, groups, d = 6, 2, 4, 2, 8
    q = torch.randn(s, b, heads, d)
    k, v = torch.randn(s, b, groups, d), torch.randn(s, b, groups, d)
    config = SimpleNamespace(attention_dropout=0.1, sequence_parallel=True)
    attention = mg.SDPAttention(config, softmax_scale=None).eval()
    out = attention(q, k, v, None, attn_mask_type=None)
    assert out.shape == (s, b, heads * d)
    k_full, v_full = k.repeat_interleave(2, dim=2), v.repeat_interleave(2, dim=2)
    scores = torch.einsum("qbhd,kbhd->bhqk", q, k_full) / math.sqrt(d)
    scores = scores.masked_fill(torch.ones(s, s, dtype=torch.bool).triu(1), float("-inf"))
    expected = torch.einsum("bhqk,kbhd->qbhd", scores.softmax(-1), v_full).reshape(s, b, -1)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_train_glue_without_a_gpu(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """train() on the shared loop, the model stubbed: an injected NaN ends the run at its step."""
    from autotune.workloads import common

    args = mg.parse_args(_argv(_layout_file(tmp_path, mbs=1, gas=2), gbs=2) + ["--warmup", "1"])
    plan = mg.make_plan(args, 1)
    trial = mg.Trial(plan, [], None, None, None, torch.device("cpu"), True)  # type: ignore[arg-type]
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(common, "max_over_ranks", lambda value, device: value)
    monkeypatch.setattr(mg, "train_step",
                        lambda trial, step: torch.tensor([9.0 * trial.loss_scale, 1.0]))
    monkeypatch.setattr(mg, "_global_loss", lambda local: float(local[0] / local[1]))
    monkeypatch.setattr(mg, "describe", lambda trial: {"params_local": 1})
    summary = mg.train(trial, common.Reporter(0, None), "nan")
    steps = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["loss"] for r in steps] == [9.0, 9.0, None]
    assert steps[0]["tokens"] == 2 * 256 and steps[0]["warmup"] and not steps[2]["warmup"]
    assert (summary["status"], summary["steps"], summary["params_local"]) == ("nan", 3, 1)
    assert summary["median_step_time_s"] == steps[1]["step_time_s"]  # step 1 alone measured


# --- the real run -----------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.mark.gpu
@pytest.mark.skipif(NO_CUDA, reason="needs a CUDA GPU")
@pytest.mark.parametrize("recompute", ["selective", "full"])
def test_trains_tiny_gpt_on_gpu(tmp_path: Path, recompute: str) -> None:
    layout = _layout_file(tmp_path, mbs=2, gas=2, zero=1, recompute=recompute)
    metrics = tmp_path / "metrics.jsonl"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH",
           "")]), "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())}
    done = subprocess.run(
        [sys.executable, "-m", "autotune.workloads.megatron_gpt", *_argv(layout, gbs=4),
         "--steps", "2", "--warmup", "1", "--metrics", str(metrics)],
        capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    steps, summary = records[:-1], records[-1]
    assert [r["step"] for r in steps] == [0, 1] and steps[0]["warmup"]
    assert all(math.isfinite(r["loss"]) and r["peak_memory_bytes"] > 0 for r in steps)
    assert summary["status"] == "ok" and summary["median_step_time_s"] > 0
    assert summary["tokens_per_s"] == pytest.approx(4 * 256 / summary["median_step_time_s"])


# --- the device script's plan (runs on CPU) ---------------------------------------------------


def _gpu_check() -> Any:
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks/gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module  # dataclasses resolve annotations through it
    spec.loader.exec_module(module)
    return module


def test_gpu_check_plan_runs_feasible_points_first() -> None:
    gc = _gpu_check()
    planned = gc.plan(gc.grid())
    assert len(planned) == 2 * (4 * 3 * 2) + 2 * (4 * 3 * 7)  # megatron, deepspeed
    runnable = [(p, pred) for p, pred in planned if not gc.host_unsafe(pred)]
    assert planned[:len(runnable)] == runnable  # points that could hurt the host come last
    verdicts = [pred.feasible for _, pred in runnable]
    assert verdicts == sorted(verdicts, reverse=True)  # every feasible point before the others
    first = planned[0][0]
    assert (first.workload, first.model, first.layout.mbs) == ("megatron", "gpt3-1.3b", 1)
    assert {p.workload for p, _ in planned[:8]} == {"megatron", "deepspeed"}
    for point, pred in planned:
        assert pred.memory_bytes > 0 and pred.step_time_s > 0
        assert point.layout.global_batch_size == gc.GAS * point.layout.mbs
        assert not (point.layout.offload != "none" and point.layout.zero == 0)
    assert all(gc.host_unsafe(pred) for p, pred in planned
               if p.model == "llama2-7b" and p.layout.offload != "none")


def test_gpu_check_dry_run_prints_the_plan() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks/gpu_check.py"), "--dry-run",
                           "--models", "gpt3-1.3b", "--workloads", "megatron"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    assert len(lines) == 1 + 24  # header; 4 micro-batches × 3 recomputes × 2 offloads
    assert "predicted GiB" in lines[0] and "| megatron | gpt3-1.3b |" in lines[1]


def test_gpu_check_writes_the_table_and_refits_from_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    gc = _gpu_check()

    def fake_execute(planned: Any, budget_s: float, work: Path, log: Any = print) -> Any:
        results = []
        for number, (_point, pred) in enumerate(planned):
            if number >= 8:
                results.append(gc.Result(status="skipped", reason="budget"))
            elif number == 7:
                results.append(gc.Result(status="oom", reason="CUDA out of memory", wall_s=9))
            else:
                results.append(gc.Result(status="ok", peak_bytes=pred.memory_bytes * 1.05,
                                         step_time_s=pred.step_time_s * 1.2, wall_s=20,
                                         device_used_bytes=pred.memory_bytes * 1.05 + 2 * 2**30))
        return results, {"elapsed_s": 170.0, "idle_device_used_bytes": 0.5 * 2**30}

    def small_calibrate(cfg: Any, layouts: Any, folder: Path, **options: Any) -> Any:
        """The real calibrate on this CPU with the GPU plan cut to CPU-sized kernels (the
        plan's bf16 8192-squares and 1.3B GEMMs take minutes here)."""
        plan = bench_plan(cfg, layouts)
        plan.update(gemms=sorted(plan["gemms"], key=math.prod)[:3] + [[s, s, s] for s in
                                                                      (64, 128, 256)],
                    attention=[[1, 2, 256, 64]], message_bytes=[4096, 65536],
                    screen={**plan["screen"], "n": 256, "rounds": 3, "calls": 2})
        return real_calibrate(cfg, layouts, folder, plan=plan, **options)

    real_calibrate = gc.calibrate_cluster
    monkeypatch.setattr(gc, "execute", fake_execute)
    monkeypatch.setattr(gc, "calibrate_cluster", small_calibrate)
    out = tmp_path / "h200-test.md"
    assert gc.main(["--out", str(out)]) == 0
    text = out.read_text()
    # the results table and the with/without-calibration table, a header and 8 rows each
    assert text.count("\n| ") == 2 * (1 + 8) and "| ok |" in text
    assert "| oom (CUDA out of memory) | yes |" in text
    assert "-4.8 %" in text  # predicted / measured - 1 for a peak 5 % above the prediction
    assert "memory: 7/7 points within 8 %" in text
    records = json.loads(out.with_suffix(".json").read_text())["records"]
    assert len(records) == 216 and records[0]["result"]["status"] == "ok"
    capsys.readouterr()
    assert gc.main(["--refit", str(out.with_suffix(".json"))]) == 0
    refit = capsys.readouterr().out
    assert "runtime_memory_gib: 1.50" in refit and "gemm_efficiency:" in refit
    assert "activation_memory_factor:" in refit
