"""Megatron-Core's performance options in the step-time model, each against a value worked out by
hand here from the cited Megatron-LM / Transformer Engine code, not by the model."""

from __future__ import annotations

import numpy as np
import pytest

from autotune.costmodel.constants import constants_for
from autotune.costmodel.estimate import Estimates
from autotune.costmodel.estimate import evaluate
from autotune.costmodel.kernels import elementwise_bytes
from autotune.costmodel.kernels import head_times
from autotune.frameworks import framework_of
from autotune.frameworks.megatron.args import megatron_args
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.specs import AutotuneConfig
from autotune.specs.inputs import load_config
from tests.cli_tests.helpers_cli import assert_usage_error
from tests.cli_tests.helpers_cli import cli


def _layout(cfg: AutotuneConfig, text: str) -> Layout:
    return Layout.parse(text, cfg.world_size, cfg.train.global_batch_size, framework_of(cfg))


def _evaluate(cfg: AutotuneConfig, text: str) -> Estimates:
    k = constants_for(cfg.cluster.gpu, cfg.train.software_stack)
    return evaluate(cfg, LayoutTable.from_layouts([_layout(cfg, text)]), k)


def _train(cfg: AutotuneConfig, **update: object) -> AutotuneConfig:
    return cfg.model_copy(update={"train": cfg.train.model_copy(update=update)})


def test_param_gather_overlap_is_its_own_switch() -> None:
    """Oracle: megatron-core's DDP buckets of max(40M, 1M·dp) parameters
    (distributed_data_parallel.py) and the ring's bytes. Llama 3 8B (8.03e9 parameters) on 16
    H100 (2 nodes), dp 16, zero 1, one micro-batch: 201 buckets, each all-gathering its 2-byte
    weights over 16 ranks, 8 per node, through 8 NICs of 50 GB/s at 80 %: 15/16 · 2 · 8.03e9
    / 201 B / 320 GB/s = 234 µs of transfer per bucket, plus NCCL's ring latency (tuning.cc:
    8.4 µs base, 14 NVLink steps of 3.4 µs, one network step of 14 µs). Without
    `--overlap-param-gather` all 201 run after the step; with it, 200 of them run under the
    next forward (which is longer) and only the NCCL share (1 − overlap_fraction) of them
    still costs. Megatron-LM
    asserts `--overlap-grad-reduce` with `--overlap-param-gather` (arguments.py), so turning
    the reduce overlap off turns this one off too, in the model and in the flags."""
    cfg = load_config("llama3-8b", "dgx-h100:2", seq_length=4096, global_batch_size=16)
    text = "tp=1,pp=1,cp=1,zero=1,mbs=1,recompute=none"
    k = constants_for(cfg.cluster.gpu, cfg.train.software_stack)
    on = _evaluate(cfg, text).time.parts["dp_comm"][0]
    off = _evaluate(_train(cfg, overlap_param_gather=False), text).time.parts["dp_comm"][0]
    params = cfg.model.num_params(128256)
    buckets = np.ceil(params / 40e6)
    transfer = 15 / 16 * 2 * params / buckets / (8 * 50e9 * k.comm_efficiency)
    hidden = k.overlap_fraction * (buckets - 1)
    latency = 8.4e-6 + 14 * 3.4e-6 + 14e-6  # NCCL ring: base, 14 NVLink steps, 1 network step
    assert off - on == pytest.approx(hidden * (transfer + latency), rel=1e-6)
    assert "--overlap-param-gather" in megatron_args(cfg, _layout(cfg, text))
    for train in ({"overlap_param_gather": False}, {"overlap_grad_reduce": False}):
        quiet = _train(cfg, **train)
        assert not quiet.train.param_gather_overlapped
        assert "--overlap-param-gather" not in megatron_args(quiet, _layout(quiet, text))


def test_megatron_fsdp_exposes_the_tensor_parallel_backward() -> None:
    """Oracle: megatron/core/tensor_parallel/layers.py
    (`LinearWithGradAccumulationAndAsyncCommunication.backward`) launches the sequence-parallel
    all-gather and reduce-scatter of the backward asynchronously and "relies on
    CUDA_DEVICE_MAX_CONNECTIONS=1" to have them scheduled before the GEMM they overlap;
    Megatron-LM refuses that setting with Megatron-FSDP (arguments.py). Worked by hand per layer
    with sequence parallelism, in units of one all-gather g: forward 4g (exposed, both
    frameworks), backward 2g exposed + 4g under the column-parallel weight gradients, of
    which (1 − overlap_fraction) still costs; on Megatron-FSDP the backward is 4g like the
    forward. The ratio FSDP / distributed optimizer is 8 / (6 + 4 · (1 − overlap_fraction))."""
    cfg = load_config("llama3-8b", "dgx-h100:1", seq_length=4096, global_batch_size=8)
    k = constants_for(cfg.cluster.gpu, cfg.train.software_stack)
    zero1 = _evaluate(cfg, "tp=2,pp=1,cp=1,zero=1,mbs=1,recompute=none,sp=on")
    fsdp = _evaluate(cfg, "tp=2,pp=1,cp=1,zero=3,mbs=1,recompute=none,sp=on")
    ratio = fsdp.time.parts["tp_comm"][0] / zero1.time.parts["tp_comm"][0]
    assert ratio == pytest.approx(8 / (6 + 4 * (1 - k.overlap_fraction)), rel=1e-9)


@pytest.mark.parametrize(("recipe", "stack", "normed", "other"), [
    ("delayed", "megatron-core", 2.0, 4.0), ("tensorwise", "megatron-core", 6.0, 6.0),
    ("blockwise", "megatron-core", 4 + 8 / 128, 4 + 8 / 128),
    ("mxfp8", "megatron-core", 4 + 2 / 32, 4 + 2 / 32), ("delayed", "pytorch", 4.0, 4.0)])
def test_fp8_recipes_pay_their_cast_kernels(recipe: str, stack: str, normed: float,
                                            other: float) -> None:
    """Oracle: Transformer Engine's quantizers, bytes per GEMM-input element worked out by hand.
    Delayed scaling knows each scale in advance: `LayerNormLinear` writes the FP8 copy and
    transpose from its own norm (2 B: megatron-core's QKV and MLP up,
    `TELayerNormColumnParallelLinear`); a `Linear` whose input another kernel wrote in 16 bits
    (the output projection after attention, MLP down after megatron-core's activation; every
    linear on a stack without TE's fused norms) runs `fp8_cast_transpose_fused`, which reads it
    too (4 B). Current (tensorwise) scaling needs the tensor's amax first: the producer writes
    16 bits, an amax pass reads them, the cast reads them again and writes both (6 B).
    Blockwise and MXFP8 compute each block's scale inside the cast, which reads the 16-bit
    tensor once and writes both copies (4 B) and a 4-byte scale per 128 elements or a 1-byte
    scale per 32, in each direction. Llama 3 8B at tp 1, 4,096 tokens: the normed inputs of QKV
    and MLP up are 4096 · 2 · 4096 elements, those of the output projection (q) and MLP down
    (f) 4096 · (4096 + 14336)."""
    cfg = load_config("llama3-8b", "dgx-h100:1", seq_length=4096, global_batch_size=8)
    cfg = _train(cfg, stack=stack)
    layout = _layout(cfg, "tp=1,pp=1,cp=1,zero=1,mbs=1")
    table = LayoutTable.from_layouts([layout])
    k = constants_for(cfg.cluster.gpu, cfg.train.software_stack)
    sixteen = elementwise_bytes(cfg, table, k)[0]
    fp8 = elementwise_bytes(_train(cfg, precision="fp8", fp8_recipe=recipe), table, k)[0]
    expected = 4096 * (normed * 2 * 4096 + other * (4096 + 14336))
    assert fp8 - sixteen == pytest.approx(expected, rel=1e-9)
    if stack == "megatron-core":
        args = megatron_args(_train(cfg, precision="fp8", fp8_recipe=recipe), layout)
        assert args[args.index("--fp8-recipe") + 1] == recipe


def test_fp8_training_runs_the_output_layer_at_16_bits() -> None:
    """Oracle: megatron-core's `GPTModel.output_layer` is a `tensor_parallel.ColumnParallelLinear`
    (megatron/core/models/gpt/gpt_model.py), not a Transformer Engine module, so
    `fp8_autocast` leaves its GEMM in bf16. Worked by hand for Llama 3 8B on one H100, tp 1,
    one 4,096-token sequence: forward and both gradients, 3 · 2 · 4096 · 128256 · 4096 FLOPs at
    the bf16 peak, 989.4 TFLOP/s, times gemm_efficiency · x / (x + gemm_half_size),
    x = (4096 · 128256 · 4096)^(1/3); the cross entropy's 32 B per logit at the HBM's 3.35 TB/s
    times hbm_efficiency, elementwise_passes times. The old model ran the logits at the FP8
    peak (1,978.9 TFLOP/s)."""
    cfg = load_config("llama3-8b", "dgx-h100:1", seq_length=4096, global_batch_size=8,
                      precision="fp8")
    table = LayoutTable.from_layouts([_layout(cfg, "tp=1,pp=1,cp=1,zero=1,mbs=1")])
    k = constants_for(cfg.cluster.gpu, cfg.train.software_stack)
    n, vocab, h = 4096, 128256, 4096
    x = np.cbrt(n * vocab * h)
    gemm = 6 * n * vocab * h / (989.4e12 * k.gemm_efficiency * x / (x + k.gemm_half_size))
    loss = k.elementwise_passes * 32 * n * vocab / (3.35e12 * k.hbm_efficiency)
    seconds, _ = head_times(cfg, table, np.array([vocab]), k)
    assert seconds[0] == pytest.approx(gemm + loss, rel=1e-9)


def test_fp8_recipe_refusals_are_one_line() -> None:
    """Oracle: megatron-core's `TransformerConfig.fp8_recipe` ("'mxfp8' for Blackwell
    architecture only") and `--fp8-recipe` meaning nothing without fp8: exit 2, one line
    naming the option, the value and the fix."""
    mxfp8 = cli("estimate", "-m", "llama3-8b", "-c", "dgx-h100:1", "--precision", "fp8",
                "--fp8-recipe", "mxfp8", "-l", "tp=1,pp=1,zero=1,mbs=1")
    assert_usage_error(mxfp8, "mxfp8", "h100-sxm-80gb", "delayed")
    bf16 = cli("estimate", "-m", "llama3-8b", "-c", "dgx-h100:1", "--fp8-recipe",
               "tensorwise", "-l", "tp=1,pp=1,zero=1,mbs=1")
    assert_usage_error(bf16, "--fp8-recipe", "tensorwise", "--precision fp8")


def test_flash_backend_runs_attention_at_flashattention2s_rate() -> None:
    """Oracle: Transformer Engine's backend choice (`--attention-backend`, before Megatron-Core
    0.10 `NVTE_FUSED_ATTN=0`, which NeMo-Framework-Launcher 24.01-24.07's conf/config.yaml set:
    "Disable cudnn FA until we've tested it more") and FlashAttention-2's rate on H100 (the
    FA3 paper's FA2 baseline, ~0.3 of the bf16 peak forward plus backward). Worked by hand:
    Llama 3 8B (32 heads of 128) at 8,192 tokens, tp 1, one sequence: the causal forward of one
    layer's scores and values is 2 · 4096 · 8192² = 5.50e11 FLOPs, at 0.3 · 989.4 TFLOP/s
    1.852 ms; the fused backend runs it at the stack's fitted `attention_efficiency`. The flag
    and megatron-core's `TransformerConfig` field carry the choice."""
    from megatron.core.transformer.enums import AttnBackend

    from autotune.costmodel.kernels import layer_times
    from autotune.frameworks.megatron.args import transformer_config_kwargs
    from autotune.frameworks.megatron.model import transformer_config_class

    cfg = load_config("llama3-8b", "dgx-h100:1", seq_length=8192, global_batch_size=8)
    layout = _layout(cfg, "tp=1,pp=1,cp=1,zero=1,mbs=1,recompute=none")
    table = LayoutTable.from_layouts([layout])
    k = constants_for(cfg.cluster.gpu, cfg.train.software_stack)
    flash = _train(cfg, attention_backend="flash")
    causal = 2 * 4096 * 8192**2
    assert layer_times(flash, table, k).attention_forward[0] == pytest.approx(
        causal / (0.3 * 989.4e12), rel=1e-9)
    for backend in ("auto", "fused"):
        assert layer_times(_train(cfg, attention_backend=backend), table,
                           k).attention_forward[0] == pytest.approx(
            causal / (k.attention_efficiency * 989.4e12), rel=1e-9)
    args = megatron_args(flash, layout)
    assert args[args.index("--attention-backend") + 1] == "flash"
    assert "--attention-backend" not in megatron_args(cfg, layout)
    config = transformer_config_class(flash.model)(**transformer_config_kwargs(flash, layout))
    assert config.attention_backend == AttnBackend.flash


def test_attention_backend_refusals_are_one_line() -> None:
    """Oracle: an attention backend is a fused kernel's; without flash attention there is none
    to choose (exit 2, one line naming the option and the fix)."""
    result = cli("estimate", "-m", "llama3-8b", "-c", "dgx-h100:1", "--attention-backend",
                 "flash", "--no-flash-attention", "-l", "tp=1,pp=1,zero=1,mbs=1")
    assert_usage_error(result, "attention_backend", "flash", "--flash-attention")
