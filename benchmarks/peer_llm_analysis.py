"""llm-analysis (PyPI `llm-analysis`, Cheng Li, github.com/cli99/llm-analysis) on a published
run, at its README's training setting: a fixed 50 % of the GEMM peak (`flops_efficiency=0.5`,
`hbm_memory_efficiency=0.9`), no pipeline bubble and no data-parallel communication.

A benchmark-only peer (not a dependency of autotune): `pip install --no-deps
llm-analysis==0.2.2 "fire<0.6" termcolor` to see its column in `benchmarks/accuracy.py`. It is
given the layout autotune's model picks among the run's candidates (the published one where the
source states every setting); llm-analysis has no context parallelism, so cp joins dp (the same
tokens per GPU). bf16/fp16 rows use its w16a16e16 data type, fp8 rows w8a8e16 (its 8-bit peak
is H100's fp8 peak, 1979 TFLOP/s).
"""

from __future__ import annotations

import contextlib
import io
import logging

from autotune.calibration.fit import Measured
from autotune.layout import Layout

GPUS = {"a100-sxm-80gb": "a100-sxm-80gb", "h100-sxm-80gb": "h100-sxm-80gb",
        "h200-sxm-141gb": "h100-sxm-80gb"}
"""autotune GPU preset → llm-analysis GPU config (H200: the H100's, the same peak)."""
RECOMPUTE = {"none": 0, "selective": 1, "full": 2}
"""autotune recompute → llm-analysis `ActivationRecomputation` (NONE, SELECTIVE, FULL)."""
FLOPS_EFFICIENCY = 0.5
HBM_EFFICIENCY = 0.9
"""llm-analysis README, "Quick Example": `--flops_efficiency 0.5 --hbm_memory_efficiency 0.9`."""


def available() -> bool:
    """Whether llm-analysis is installed."""
    try:
        import llm_analysis.analysis  # noqa: F401
    except ImportError:
        return False
    return True


def step_s(point: Measured, layout: Layout) -> float | None:
    """llm-analysis's seconds per optimizer step for `layout`, or None where it cannot say
    (a GPU it has no config for, a MoE model, or an input it rejects)."""
    from llm_analysis.analysis import ActivationRecomputation
    from llm_analysis.analysis import DSZeRO
    from llm_analysis.analysis import LLMAnalysis
    from llm_analysis.config import ModelConfig
    from llm_analysis.config import ParallelismConfig
    from llm_analysis.config import get_dtype_config_by_name
    from llm_analysis.config import get_gpu_config_by_name
    from llm_analysis.logger import logger

    cfg, m = point.cfg, point.cfg.model
    if point.gpu not in GPUS or m.num_experts:
        return None
    model = ModelConfig(name=m.name, num_layers=m.num_layers, n_head=m.num_attention_heads,
                        hidden_dim=m.hidden_size, vocab_size=m.vocab_size,
                        max_seq_len=cfg.train.seq_length, num_key_value_heads=m.query_groups,
                        ffn_embed_dim=m.ffn, expansion_ratio=m.ffn / m.hidden_size)
    dtype = "w8a8e16" if cfg.train.precision == "fp8" else "w16a16e16"
    dp = layout.dp * layout.cp
    parallel = ParallelismConfig(tp_size=layout.tp, pp_size=layout.pp, dp_size=dp,
                                 sp_size=layout.tp)
    logger.setLevel(logging.ERROR)  # its memory warnings: the runs ran
    try:
        analysis = LLMAnalysis(model, get_gpu_config_by_name(GPUS[point.gpu]),
                               get_dtype_config_by_name(dtype), parallel,
                               flops_efficiency=FLOPS_EFFICIENCY,
                               hbm_memory_efficiency=HBM_EFFICIENCY)
        with contextlib.redirect_stdout(io.StringIO()):
            summary = analysis.training(
                batch_size_per_gpu=layout.mbs,
                global_batch_size=cfg.train.global_batch_size,
                seq_len=cfg.train.seq_length,
                activation_recomputation=ActivationRecomputation(RECOMPUTE[layout.recompute]),
                ds_zero=DSZeRO(min(layout.zero, 3)),
                flash_attn=cfg.train.flash_attention,
                mlp_gated_linear_units=m.gated,
            )
    except (AssertionError, ValueError, ZeroDivisionError):
        return None
    return float(summary["latency_per_iter"])
