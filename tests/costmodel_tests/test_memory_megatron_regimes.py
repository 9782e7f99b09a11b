"""Memory terms of Megatron-Core + Transformer Engine regimes, each against the code's rule
worked out by hand: the gradient buffer's dtype, fp8 inputs Transformer Engine saves, the
interleaved schedule's in-flight micro-batches, and NVIDIA's MLPerf v4.1 GPT-3 175B run."""

from __future__ import annotations

import pytest

from autotune.calibration.published import published_run
from autotune.calibration.published import read_rows
from autotune.costmodel.constants import Constants
from autotune.costmodel.estimate import estimate
from autotune.costmodel.memory import GIB
from autotune.costmodel.memory import usable_gpu_bytes
from autotune.frameworks import get_framework
from autotune.frameworks.megatron.args import megatron_args
from autotune.layout import Layout
from autotune.specs import AutotuneConfig
from autotune.specs.inputs import load_config

K = Constants()
MLPERF = "tp=4,pp=8,vpp=6,zero=1,mbs=2,recompute=none,sp=on"


def gpt3(**train: object) -> AutotuneConfig:
    """GPT-3 175B on 32 DGX H100, seq 2048, gbs 2048, fp8, with `train` overrides."""
    cfg = load_config("gpt3-175b", "dgx-h100:32", seq_length=2048, global_batch_size=2048,
                      precision="fp8")
    return cfg.model_copy(update={"train": cfg.train.model_copy(update=train)})


def layout(cfg: AutotuneConfig, text: str = MLPERF) -> Layout:
    """A Megatron layout on the config's world."""
    return Layout.parse(text, cfg.world_size, cfg.train.global_batch_size,
                        get_framework("megatron"))


def test_fp8_inputs_saved_by_transformer_engine_worked_example() -> None:
    """TE's `_Linear.forward` saves the fp8-cast input (1 B) for the weight gradient: the QKV
    and fc1 inputs (norm outputs, 2·s·b·h → s·b·h each, sequence-parallel: /t) and the fc2
    input (s·b·f → /2), while the output projection adds an fp8 copy of the attention output
    (+s·b·q/t). GPT-3 175B, s 2048, b 2, h = q = 12288, f = 49152, t 4: per layer and micro-batch
    2·sbh/t + s·b·(f − q)/t = 25,165,824 + 37,748,736 = 62,914,560 B fewer than with 16-bit
    saved inputs (the same run on a stack without TE). The first stage holds 12 layers ×
    (8 + 7/6) micro-batches in flight = 110 layer-micro-batches: 6,920,601,600 B."""
    te = estimate(gpt3(), layout(gpt3()), K).memory_parts["activations"]
    plain = estimate(gpt3(stack="pytorch"), layout(gpt3()), K).memory_parts["activations"]
    assert plain - te == pytest.approx(110 * 62_914_560, rel=1e-9)


def test_gradient_buffer_dtype() -> None:
    """Megatron-LM keeps fp32 main gradients for bf16 (4 B per parameter on the rank, not
    sharded by the distributed optimizer); --grad-reduce-in-bf16 keeps 2 B: the gradient part
    halves, the weights and optimizer parts do not move."""
    fp32 = estimate(gpt3(), layout(gpt3()), K).memory_parts
    bf16 = estimate(gpt3(grad_reduce_in_fp32=False), layout(gpt3()), K).memory_parts
    assert bf16["gradients"] == pytest.approx(fp32["gradients"] / 2, rel=1e-12)
    assert bf16["weights"] == fp32["weights"] and bf16["optimizer"] == fp32["optimizer"]
    assert fp32["gradients"] == pytest.approx(2 * fp32["weights"], rel=1e-12)


@pytest.mark.parametrize(("pp", "vpp"), [(4, 2), (8, 6), (8, 3)])
def test_interleaved_in_flight_follows_megatrons_warmup(pp: int, vpp: int) -> None:
    """megatron/core/pipeline_parallel/schedules.py (interleaved 1F1B): rank 0 runs
    (p − 1)·2 + (v − 1)·p warm-up chunk forwards (microbatch_group_size_per_vp_stage = p) and
    holds those plus the one in its first backward, chunks of L/(p·v) layers; plain 1F1B holds
    p micro-batches of L/p layers. Ratio (2(p − 1) + (v − 1)·p + 1)/(p·v): p 8, v 6 → 55/48."""
    cfg = gpt3(grad_reduce_in_fp32=False)
    chunks = (pp - 1) * 2 + (vpp - 1) * pp + 1
    text = f"tp=4,pp={pp},zero=1,mbs=1,recompute=none,sp=on"
    plain = estimate(cfg, layout(cfg, text), K).memory_parts["activations"]
    interleaved = estimate(cfg, layout(cfg, text + f",vpp={vpp}"), K).memory_parts["activations"]
    assert interleaved / plain == pytest.approx(chunks / (pp * vpp), rel=1e-6)


def test_mlperf_v41_gpt3_175b_fits() -> None:
    """NVIDIA's MLPerf Training v4.1 GPT-3 175B submission ran on 256 H100 80 GB at tp4 pp8
    vpp6, mbs 2, gbs 2048, seq 2048, fp8, no recompute (data/published_runs.csv row
    mlperf41_nvidia_gpt3_175b_256): with TE's fp8-saved inputs and bf16 gradients its predicted
    peak fits the usable memory (before: 84.5 GiB)."""
    row = next(r for r in read_rows() if r["row_id"] == "mlperf41_nvidia_gpt3_175b_256")
    run = published_run(row)
    assert run.skip is None and run.cfg is not None
    peaks = [estimate(run.cfg, lay, K).peak_memory_bytes for lay in run.layouts]
    assert max(peaks) <= usable_gpu_bytes(run.cfg, K)
    assert min(peaks) / GIB < 70


def test_bf16_gradients_render_megatrons_flag() -> None:
    """The rendered pretrain_gpt.py flags carry --grad-reduce-in-bf16 (Megatron-LM's
    arguments.py) exactly when the model charges 2-byte gradients."""
    assert "--grad-reduce-in-bf16" in megatron_args(gpt3(grad_reduce_in_fp32=False),
                                                    layout(gpt3()))
    assert "--grad-reduce-in-bf16" not in megatron_args(gpt3(), layout(gpt3()))


def test_bf16_adam_moments_worked_example() -> None:
    """Megatron's precision-aware optimizer with --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16
    keeps the fp32 master copy (4 B) and two 2-byte moments: 8 B per parameter instead of 12,
    sharded alike; weights and gradients do not move. The flags are rendered with it."""
    fp32 = estimate(gpt3(), layout(gpt3()), K).memory_parts
    bf16_cfg = gpt3(adam_moments_dtype="bf16")
    bf16 = estimate(bf16_cfg, layout(bf16_cfg), K).memory_parts
    assert bf16["optimizer"] == pytest.approx(fp32["optimizer"] * 8 / 12, rel=1e-12)
    assert bf16["weights"] == fp32["weights"] and bf16["gradients"] == fp32["gradients"]
    args = megatron_args(bf16_cfg, layout(bf16_cfg))
    assert "--use-precision-aware-optimizer" in args
    assert args[args.index("--exp-avg-dtype") + 1] == "bf16"
    assert "--exp-avg-dtype" not in megatron_args(gpt3(), layout(gpt3()))


def test_nemotron4_340b_on_128_h100_fits() -> None:
    """NVIDIA's DGX Cloud Benchmarking recipe ran Nemotron-4 340B on 128 H100 80 GB at tp8 pp8
    vpp12, mbs 1, gbs 32, seq 4096, bf16, selective recompute, bf16 gradient sync and Apex Adam
    states in bf16 (row dgxc2411_nemotron4_340b_bf16_128): it is predicted to fit (81.0 GiB
    with fp32 moments)."""
    row = next(r for r in read_rows() if r["row_id"] == "dgxc2411_nemotron4_340b_bf16_128")
    run = published_run(row)
    assert run.skip is None and run.cfg is not None
    assert run.cfg.train.adam_moments_dtype == "bf16"
    peaks = [estimate(run.cfg, lay, K).peak_memory_bytes for lay in run.layouts]
    assert max(peaks) <= usable_gpu_bytes(run.cfg, K)
