"""Published measured runs (`data/published_runs.csv`): FLOPs conventions, measured step time,
and the autotune problem and candidate layouts each row stands for.

`data/README.md` describes the columns, the sources and the conventions. Each published figure is
turned into a step time with the FLOPs convention it was computed with, so every row can then be
compared in autotune's own convention (Megatron-Core's causal count, `autotune.costmodel.flops`).
A row the model cannot express (MoE, a GPU without a preset, a recompute policy or pipeline
layout it lacks) carries the reason in `PublishedRun.skip`.
"""

from __future__ import annotations

import csv
import dataclasses
from collections.abc import Callable
from collections.abc import Set as AbstractSet
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import ValidationError

from autotune.costmodel.constants import Constants
from autotune.costmodel.constants import constants_for
from autotune.costmodel.flops import attention_flops_per_token_per_layer
from autotune.costmodel.flops import model_flops
from autotune.costmodel.memory import estimate_memory
from autotune.costmodel.memory import usable_gpu_bytes
from autotune.frameworks import framework_of
from autotune.frameworks.base import RuleGroup
from autotune.layout import DIMS
from autotune.layout import RECOMPUTES
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.space.rules import first_broken
from autotune.space.rules import rules_for
from autotune.specs import AutotuneConfig
from autotune.specs import ModelSpec
from autotune.specs import TrainSpec
from autotune.specs.inputs import load_cluster
from autotune.specs.inputs import load_model

PUBLISHED_RUNS = Path(__file__).resolve().parents[2] / "data" / "published_runs.csv"
"""The published runs of a source checkout."""

GPU_CLUSTERS = {"A100-SXM-80GB": "dgx-a100", "H100-SXM-80GB": "dgx-h100",
                "H200-SXM-141GB": "hgx-h200"}
"""GPU types of the data that have a cluster preset (others are skipped)."""

FRAMEWORKS = {
    "Megatron-LM": "megatron", "Megatron-DeepSpeed": "megatron", "NeMo": "megatron",
    "Megatron-Bridge": "megatron", "Meta 4D": "megatron",
    "DeepSpeed": "deepspeed", "torchtitan": "deepspeed", "LLM Foundry": "deepspeed",
}
"""Framework column prefix → the autotune framework whose rules and formulas express it:
Megatron-style 3D parallelism or FSDP/ZeRO-style sharded data parallelism."""

STACKS = {
    "Megatron-LM": "megatron-core", "NeMo": "megatron-core", "Megatron-Bridge": "megatron-core",
    "Megatron-DeepSpeed": "deepspeed", "DeepSpeed": "deepspeed",
    "Meta 4D": "pytorch", "torchtitan": "pytorch", "LLM Foundry": "pytorch",
}
"""Framework column prefix → the software stack that ran it (`autotune.specs.types.Stack`):
its constants are fitted on its own rows."""

_SHARDING = {"none": 0, "zero1": 1, "zero2": 2, "zero3": 3}
_PRECISION = {"16-bit": "bf16", "bf16": "bf16", "fp16": "fp16", "fp8": "fp8"}
RELEASED_PRESETS = {"DeepSeek-V3": "deepseek-v3"}
"""Rows whose model the CSV's columns cannot describe (multi-latent attention, shared experts,
dense first layers), by the `model` column: the preset built from its released config.json."""
RELEASED_FIELDS: dict[str, dict[str, Any]] = {
    # Qwen/Qwen3-30B-A3B config.json: head_dim 128 (not hidden/heads), q/k norms, rope_theta 1e6
    "Qwen3-30B-A3B": {"kv_channels": 128, "qk_layernorm": True, "rotary_base": 1.0e6},
    # Qwen/Qwen3-235B-A22B config.json: the same head_dim, q/k norms and rope_theta
    "Qwen3-235B-A22B": {"kv_channels": 128, "qk_layernorm": True, "rotary_base": 1.0e6},
    # openai/gpt-oss-120b config.json: head_dim 64, sliding_window 128 on every other layer
    # (Megatron-Bridge's GPT-OSS bridge: window_size (127, 0), window_attn_skip_freq 2),
    # rope_theta 150000
    "GPT-OSS-120B": {"kv_channels": 64, "window_size": 127, "window_attn_skip_freq": 2,
                     "rotary_base": 1.5e5},
}
"""Fields of the released config.json that the CSV has no column for, by the `model` column."""
RUN_SETTINGS: dict[str, dict[str, Any]] = {
    # NVIDIA-NeMo/Megatron-Bridge scripts/performance/run_script.py @
    # bf71eba07bae8d36f08b796c106d1197d46ad541 (v0.1.0rc3, the 25.09 scripts): DeepSeek-V3 on
    # H100 enables DeepEP (flex dispatcher), the EP all-to-all 1F1B overlap with delayed weight
    # gradients, and turns the gradient-reduce overlap off
    "mbridge_2509_h100_deepseekv3_1024": {"moe_token_dispatcher": "flex",
                                          "moe_a2a_overlap": True,
                                          "overlap_grad_reduce": False},
    # NVIDIA/dgxc-benchmarking nemotron/nemotron4-340b-synth.yaml @
    # 35a9aecc8d5b17d99d80f52f38c75ade0dbab7ae: Apex distributed Adam with `optim.dtype: bf16`;
    # nemotron/configure.sh exports NVTE_FUSED_ATTN=0 for the 340B runs (below)
    **{f"dgxc2411_nemotron4_340b_{p}_{g}": {"adam_moments_dtype": "bf16",
                                            "attention_backend": "flash"}
       for p in ("bf16", "fp8") for g in (128, 512, 2048)},
    # NVIDIA-NeMo/Megatron-Bridge scripts/performance/configs/qwen/qwen3_workload_base_configs.py
    # @ 21d102f5e (26.04.01) and 63b08b397 (26.06): Qwen3-30B-A3B on H100 in fp8 runs the flex
    # dispatcher (HybridEP), Qwen3-235B-A22B the EP all-to-all overlap (both also @ cfeddcd94,
    # 26.02.01, where the 30B recipe took its ep16 layout: data/README.md)
    "mbridge_26021_h100_qwen330ba3b_16": {"moe_token_dispatcher": "flex"},
    "mbridge_26041_h100_qwen330ba3b_16": {"moe_token_dispatcher": "flex"},
    "mbridge_2606_h100_qwen330ba3b_16": {"moe_token_dispatcher": "flex"},
    "mbridge_26041_h100_qwen3235ba22b_256": {"moe_a2a_overlap": True},
    # NVIDIA-NeMo/Megatron-Bridge src/megatron/bridge/perf_recipes/llama/h100/llama3.py and
    # llama31.py @ 067f987df (2026-08-22): the H100 Llama 3 70B (64 GPUs, gbs 256) and Llama 3.1
    # 405B (1,024 GPUs, gbs 1536) fp8 recipes the 26.x tables ran use current scaling (fp8_cs)
    **{f"mbridge_{release}_h100_{model}": {"fp8_recipe": "tensorwise"}
       for release, model in (("2602", "llama370b_64"), ("2602", "llama31405b_1024"),
                              ("26021", "llama370b_64"), ("2604", "llama370b_64"),
                              ("26041", "llama370b_64"), ("26041", "llama31405b_1024"),
                              ("2606", "llama31405b_1024"))},
    "mbridge_26021_h100_qwen3235ba22b_256": {"moe_a2a_overlap": True},
    # the same file @ 0c7aef186 (26.02): Qwen3-30B-A3B on H100 runs DeepEP with the EP overlap,
    # Qwen3-235B-A22B the overlap; @ 74695a06d (26.04): HybridEP without the overlap, and the
    # overlap; @ 5776a6d90 (25.11): Qwen3-235B-A22B the overlap
    "mbridge_2602_h100_qwen330ba3b_16": {"moe_token_dispatcher": "flex", "moe_a2a_overlap": True},
    "mbridge_2602_h100_qwen3235ba22b_256": {"moe_a2a_overlap": True},
    "mbridge_2604_h100_qwen330ba3b_16": {"moe_token_dispatcher": "flex"},
    "mbridge_2604_h100_qwen3235ba22b_256": {"moe_a2a_overlap": True},
    "mbridge_2511_h100_qwen3235ba22b_256": {"moe_a2a_overlap": True},
    # scripts/performance/configs/gpt_oss/gpt_oss_llm_pretrain.py set_gpt_oss_common_configs
    # (@ 0c7aef186, 74695a06d, cfeddcd94, 21d102f5e): gradients reduced in bf16, alltoall
    **{f"mbridge_{tag}_h100_gptoss120b_64": {"grad_reduce_in_fp32": False}
       for tag in ("2602", "26021", "2604", "26041")},
    # Transformer Engine's FlashAttention-2 backend instead of cuDNN's fused attention:
    # NVIDIA/NeMo-Framework-Launcher `launcher_scripts/conf/config.yaml` @ 24.03.01 (the release
    # of NeMo's long-sequence table's container) sets `NVTE_FUSED_ATTN: 0 # Disable cudnn FA
    # until we've tested it more` (from 24.01 to 24.07); NVIDIA/dgxc-benchmarking @ 35a9aecc8
    # (v24.11.1) `nemo_megatron/launch.sh` (GPT-3 175B) and `nemotron/configure.sh` (340B, set
    # above) export NVTE_FUSED_ATTN=0 (15B: 1; llama3.1/configure.sh: 1)
    **{f"nemo_longseq_l2_7b_{k}k": {"attention_backend": "flash"}
       for k in (4, 8, 16, 32, 64, 128, 256, 512, 1024)},
    **{f"dgxc2411_gpt3_175b_{p}_{g}": {"attention_backend": "flash"} for p in ("bf16", "fp8")
       for g in (128, 512, 2048)},
    # SC21 Table 2's ZeRO-3 rows ran a DeepSpeed between ZeRO-3's first release (v0.3.12,
    # March 2021) and the paper's last revision (August 2021, v0.5.0): microsoft/DeepSpeed
    # `runtime/zero/partition_parameters.py` @ v0.3.13, v0.4.0 and v0.5.0 all-gathers into
    # `partitions` (one tensor per rank) and `_reduce_scatter_gradient` reduce-scatters from
    # `input_list`; `_all_gather_base` came in v0.5.6 (commit c0eeb69df)
    **{f"sc21_t2_0{i}": {"zero3_list_collectives": True} for i in range(1, 7)},
    # LLM Foundry's A100 MPT-70B rows ran Precision bf16 with MP Mode PURE (mosaicml/llm-foundry
    # scripts/train/benchmarking/README.md @ 495218376, the same figures as @ 300cc5c58 of
    # 2023-05-03; the table's other rows ran amp_bf16 with DEFAULT): Composer's
    # `get_mixed_precision` gives PURE `reduce_dtype` = the bf16 `param_dtype` (@ v0.14.1 and
    # v0.16.4), so FSDP reduce-scatters their gradients in bf16
    **{f"llmfoundry_a100_70b_2048_{g}": {"grad_reduce_in_fp32": False} for g in (32, 64)},
}
"""Training settings of a run that its launch script sets and the CSV has no column for, by
`row_id`."""
FP8_BF16_GRADS = frozenset({"nemo_docs", "megatron_bridge", "mlperf_v41", "dgxc_2504",
                            "mbridge_2602", "mbridge_26021", "mbridge_2604",
                            "mbridge_26041", "mbridge_2606"})
"""Sources whose fp8 runs reduce gradients in bf16 (`TrainSpec.grad_reduce_in_fp32` false):
NVIDIA's performance scripts. NVIDIA/NeMo `scripts/performance` sets
`plugins.grad_reduce_in_fp32 = False` with fp8; NVIDIA-NeMo/Megatron-Bridge
`scripts/performance` sets `mixed_precision.grad_reduce_in_fp32 = False` and
`ddp.grad_reduce_in_fp32 = False`; the MLPerf v4.1 submission's precision file is not in the
stored copy and is taken to follow the same scripts (data/README.md)."""
FORCE_BALANCED = frozenset({"megatron_bridge", "mbridge_2602", "mbridge_26021", "mbridge_2604",
                            "mbridge_26041", "mbridge_2606"})
"""Sources whose MoE runs force-balance their routing (`TrainSpec.moe_force_balance`): the
Megatron-Bridge performance summary's footnote ("we force-balance the token distribution among
experts"; the scripts set `moe_router_force_load_balancing = True`)."""
KNOWN_REGRESSIONS: dict[str, str] = {
    "mbridge_2511_h100_qwen330ba3b_16": (
        "Megatron-Bridge's maintainers filed 25.11's dropless Qwen3-30B-A3B runs on H100 and "
        "B200 as 2x slower than 25.09 (upstream issue '[Regression] Low QWEN3 30B B200 and "
        "H100 performance with dropless', 2026-01-20: 'we need to fix this in 26.02')"),
    "mbridge_2602_h100_qwen330ba3b_16": (
        "26.02 (v0.3.0) still ran 25.11's pp2 ep8 recipe with the EP all-to-all overlap "
        "(vpp12, DeepEP: 5,113 tokens/s per GPU against 25.11's 5,275); the recipe that "
        "replaced it after v0.3.0 (tp1 pp1 ep16, HybridEP, no overlap: Megatron-Bridge "
        "4a6450755) ran 8,826-9,058 from 26.02.01 to 26.06"),
}
"""Measured rows of a recipe its publisher filed as a performance regression and replaced, by
`row_id`, with the evidence: `benchmarks/accuracy.py` predicts and prints them but leaves them
out of the fits, the stored intervals and the judged figures (data/README.md)."""
BF16_GRAD_SYNC = ("dgxc2411_", "dgxc2504_gpt3")
"""Row-id prefixes of runs whose gradients are reduced in bf16 at every precision: NeMo 1.0
launcher configs of NVIDIA/dgxc-benchmarking (`optim.grad_sync_dtype: bf16`)."""
FP8_RECIPES = {"FP8-CS": "tensorwise", "FP8 (blockwise)": "blockwise", "FP8-MX": "mxfp8"}
"""The fp8 recipe (`TrainSpec.fp8_recipe`) of a row whose notes say 'Precision as published:
<name>.' (Megatron-Bridge's tables: FP8-CS is current scaling, per tensor); other fp8 rows
(NeMo 24.x and the DGX Cloud recipes: Transformer Engine's default) run delayed scaling."""
_POSITIONS = {"alibi": "rope"}  # position schemes without weights map onto rope
RUN_MEMORY_TOLERANCE = 0.03
"""A run that happened may be predicted this fraction over the usable memory and still count as
fitting (the memory model's error margin, as the published-layouts benchmark allows)."""


# --- FLOPs conventions (FLOPs of one iteration of `batch` sequences) -----------------------------


def sc21_eq3_flops(model: ModelSpec, seq: float, batch: float, vocab: float) -> float:
    """Narayanan et al. 2021, Eq. 3: 96·B·s·l·h²·(1 + s/6h + V/16lh), full recompute included.

    Defined for plain GPT layers (MHA, 4h two-matrix MLP); raises ValueError for other shapes.
    """
    h, layers = model.hidden_size, model.num_layers
    if model.gated or model.ffn != 4 * h or model.query_groups != model.num_attention_heads:
        raise ValueError(f"SC21 Eq. 3 assumes a plain GPT layer; {model.name} is not one")
    return 96.0 * batch * seq * layers * h * h * (1 + seq / (6 * h) + vocab / (16 * layers * h))


def megatron_noncausal_flops(model: ModelSpec, seq: float, batch: float, vocab: float) -> float:
    """Megatron-Core r0.8.0 / NeMo before August 2025: the causal count with the attention-score
    term not halved (for GPT: 72·B·s·l·h²·(1 + s/6h + V/12lh), Korthikanti et al. 2022 Eq. 7)."""
    scores = batch * seq * model.num_layers * attention_flops_per_token_per_layer(model, seq)
    return float(model_flops(model, seq, batch, vocab) + scores)


def megatron_causal_flops(model: ModelSpec, seq: float, batch: float, vocab: float) -> float:
    """Megatron-Core's current `num_floating_point_operations`: autotune's own convention."""
    return float(model_flops(model, seq, batch, vocab))


def palm_flops(model: ModelSpec, seq: float, batch: float, params: float) -> float:
    """PaLM (Chowdhery et al. 2022, App. B): per token 6·N + 12·L·H·Q·T, with N the parameters
    the source counts and H·Q the attention width (torchtitan, LLM Foundry, Llama 3)."""
    width = model.num_attention_heads * model.head_dim
    return batch * seq * (6.0 * params + 12.0 * model.num_layers * width * seq)


CONVENTIONS: dict[str, Callable[..., float]] = {
    "SC21_EQ3": sc21_eq3_flops,
    "MCORE_R080": megatron_noncausal_flops,
    "MCORE": megatron_causal_flops,
    "PALM": palm_flops,
}
"""`flops_definition` values of the data and their formulas."""


def published_flops(row: dict[str, str], model: ModelSpec) -> float:
    """FLOPs of one iteration in the row's own convention (`flops_definition`)."""
    name = row["flops_definition"]
    if name not in CONVENTIONS:
        raise ValueError(f"{row['row_id']}: unknown flops_definition {name!r}")
    seq, batch = float(row["seq_length"]), float(row["global_batch_size"])
    last = float(row["flops_params"]) if name == "PALM" else float(row["vocab_size"])
    return CONVENTIONS[name](model, seq, batch, last)


def measured_step_s(row: dict[str, str], model: ModelSpec) -> tuple[float, str] | None:
    """The measured step time and the figure it comes from, most direct figure first:
    iteration time, tokens/s per GPU, TFLOP/s per GPU, then MFU (both in the row's convention)."""
    gpus = float(row["num_gpus"])
    if row["iteration_time_s"]:
        return float(row["iteration_time_s"]), "iteration time"
    tokens = float(row["global_batch_size"]) * float(row["seq_length"])
    if row["tokens_per_sec_per_gpu"]:
        return tokens / (float(row["tokens_per_sec_per_gpu"]) * gpus), "tokens/s"
    if row["flops_definition"] not in CONVENTIONS:
        return None
    if row["tflops_per_gpu"]:
        tflops, basis = float(row["tflops_per_gpu"]), "TFLOP/s"
    elif row["mfu_pct"] and row["peak_tflops_basis"]:
        tflops, basis = float(row["mfu_pct"]) / 100 * float(row["peak_tflops_basis"]), "MFU"
    else:
        return None
    step = published_flops(row, model) / (tflops * 1e12 * gpus)
    return step, f"{basis} ({row['flops_definition']})"


# --- rows as autotune problems -------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class PublishedRun:
    """One row of the data as an autotune problem.

    `layouts` are the published layout's candidates (every choice of the dimensions the source
    left unpublished) that break no structural rule, the memory-fitting ones when any fits.
    `skip` says why the model cannot express the row (then cfg and layouts may be empty).
    """

    row: dict[str, str]
    cfg: AutotuneConfig | None
    layouts: tuple[Layout, ...]
    step_time_s: float | None
    basis: str
    skip: str | None
    substitutions: tuple[str, ...] = ()
    broken_rule: str | None = None
    """The first structural rule every candidate breaks (the layout is then skipped)."""
    published_zero: int | None = None
    """The sharding as published where the rules made the candidates use another (Llama 3's
    FSDP zero2 with pp>1 runs as zero1): memory is judged with the published one."""

    def as_published(self, layout: Layout) -> Layout:
        """The candidate with the published sharding (what ran, for its memory)."""
        if self.published_zero is None:
            return layout
        return dataclasses.replace(layout, zero=self.published_zero)

    @property
    def name(self) -> str:
        """The row id."""
        return self.row["row_id"]

    @property
    def source(self) -> str:
        """The publication the row comes from (`source_id`)."""
        return self.row["source_id"]


def read_rows(path: str | Path = PUBLISHED_RUNS) -> list[dict[str, str]]:
    """The CSV rows as dicts of strings."""
    with open(path, newline="") as handle:
        return list(csv.DictReader(handle))


def autotune_framework(row: dict[str, str]) -> str:
    """The autotune framework that expresses the row's framework."""
    for prefix, framework in FRAMEWORKS.items():
        if row["framework"].startswith(prefix):
            return framework
    raise ValueError(f"{row['row_id']}: framework {row['framework']!r} has no mapping")


def software_stack(row: dict[str, str]) -> str:
    """The software stack that ran the row (`STACKS`)."""
    for prefix, stack in STACKS.items():
        if row["framework"].startswith(prefix):
            return stack
    raise ValueError(f"{row['row_id']}: framework {row['framework']!r} has no stack")


def model_spec(row: dict[str, str]) -> ModelSpec:
    """The row's model in autotune's vocabulary (ValueError when the shape is invalid)."""
    if row["model"] in RELEASED_PRESETS:
        return load_model(RELEASED_PRESETS[row["model"]])
    experts: dict[str, Any] = {}
    if row["num_experts"]:
        experts = {"num_experts": int(row["num_experts"]),
                   "moe_router_topk": int(row["moe_topk"]),
                   "moe_ffn_hidden_size": int(row["moe_ffn_hidden_size"])}
    return ModelSpec(
        name=row["model"],
        num_layers=int(row["num_layers"]),
        hidden_size=int(row["hidden_size"]),
        num_attention_heads=int(row["num_attention_heads"]),
        num_query_groups=int(row["num_kv_heads"] or row["num_attention_heads"]),
        ffn_hidden_size=int(row["ffn_hidden_size"] or 4 * int(row["hidden_size"])),
        vocab_size=int(row["vocab_size"]),
        activation=row["activation"],
        tied_embeddings=row["tied_embeddings"] == "yes",
        max_position_embeddings=int(row["seq_length"]),
        normalization=row["normalization"],
        position_embedding=_POSITIONS.get(row["position_embedding"], row["position_embedding"]),
        add_bias_linear=row["add_bias_linear"] == "yes",
        **({"hidden_dropout": float(row["dropout"]), "attention_dropout": float(row["dropout"])}
           if row["dropout"] else {}),
        **experts,
        **RELEASED_FIELDS.get(row["model"], {}),
    )


def problem(row: dict[str, str]) -> AutotuneConfig:
    """Model, cluster (the GPU's preset, with the published network where given) and setup."""
    gpus = int(row["num_gpus"])
    cluster = load_cluster(f"{GPU_CLUSTERS[row['gpu_type']]}:{max(-(-gpus // 8), 1)}")
    update: dict[str, Any] = {"gpus_per_node": gpus} if gpus < 8 else {}
    if row["inter_node_gb_s_per_gpu"]:
        update["inter_node_gb_s"] = float(row["inter_node_gb_s_per_gpu"])
    setup: dict[str, Any] = {
        "seq_length": int(row["seq_length"]),
        "global_batch_size": int(row["global_batch_size"]),
        "precision": _PRECISION[row["precision"]],
        "framework": autotune_framework(row),
        "stack": software_stack(row),
        "flash_attention": row["fused_attention"] != "no",
        "overlap_grad_reduce": row["overlap_grad_reduce"] != "no",
        "tp_comm_overlap": row["tp_comm_overlap"] == "yes",
    }
    if setup["precision"] == "fp8":
        stated = row["notes"].partition("Precision as published: ")[2].partition(". ")[0]
        setup["fp8_recipe"] = FP8_RECIPES.get(stated.rstrip("."), "delayed")
    if (row["source_id"] in FP8_BF16_GRADS and setup["precision"] == "fp8"
            or row["row_id"].startswith(BF16_GRAD_SYNC)):
        setup["grad_reduce_in_fp32"] = False
    if row["num_experts"] and row["source_id"] in FORCE_BALANCED:
        setup["moe_force_balance"] = True
    train = TrainSpec(**(setup | RUN_SETTINGS.get(row["row_id"], {})))
    return AutotuneConfig(
        model=model_spec(row), cluster=cluster.model_copy(update=update), train=train
    )


def _published_zero(row: dict[str, str], cfg: AutotuneConfig) -> int | None:
    """The published ZeRO stage where the framework's ZeRO rules refuse it with the row's
    pipeline (zero2 with pp>1: `_options` then runs zero1), else None."""
    if _SHARDING.get(row["sharding"]) != 2 or int(row["pp"]) == 1:
        return None
    probe = LayoutTable.from_layouts([Layout(pp=int(row["pp"]), zero=2)])
    k = constants_for(cfg.cluster.gpu, cfg.train.software_stack)
    zero_rules = [r for r in rules_for(cfg.train.framework) if r.group == RuleGroup.ZERO]
    return 2 if any(bool(r.check(cfg, probe, k)[0]) for r in zero_rules) else None


def _options(row: dict[str, str], cfg: AutotuneConfig) -> tuple[dict[str, list[Any]], list[str]]:
    """Candidate values of each layout dimension, and the substitutions made to express it."""
    framework = cfg.train.framework
    tp, pp, dp = int(row["tp"]), int(row["pp"]), int(row["dp"])
    notes: list[str] = []
    if row["vpp"]:
        vpp = [int(row["vpp"])]
    else:  # every vpp the framework can split the layers with (the rules drop the others)
        tries = np.arange(1, cfg.model.num_layers // pp + 2)
        split = framework_of(cfg).split_layers(cfg, np.full(len(tries), pp), tries)
        vpp = [int(v) for v in tries[split.legal]] or [1]
    gbs = cfg.train.global_batch_size
    mbs = ([int(row["micro_batch_size"])] if row["micro_batch_size"]
           else [m for m in (1, 2, 4, 8) if gbs % (m * dp) == 0])
    if row["sharding"]:
        zero = _SHARDING[row["sharding"]]
        if _published_zero(row, cfg) is not None:
            notes.append("zero2 with pp>1 expressed as zero1 (the framework's ZeRO rules refuse "
                         "it); memory judged as zero2")
            zero = 1
        zeros = [zero]
    else:
        zeros = [0, 1]
    recompute = [row["recompute"]] if row["recompute"] else list(RECOMPUTES)
    has_sp = framework_of(cfg).sequence_parallel
    if not has_sp or tp == 1:
        if row["sequence_parallel"] == "yes" and not has_sp:
            notes.append(f"sequence parallelism dropped (autotune's {framework} has none)")
        sp = [False]
    else:
        sp = [row["sequence_parallel"] == "yes"] if row["sequence_parallel"] else [True, False]
    options: dict[str, list[Any]] = {
        "tp": [tp], "pp": [pp], "cp": [int(row["cp"] or 1)], "vpp": vpp, "zero": zeros,
        "mbs": mbs, "recompute": recompute, "sp": sp, "ep": [int(row["ep"] or 1)],
    }
    return options, notes


def candidates(row: dict[str, str], cfg: AutotuneConfig) -> tuple[list[Layout], list[str]]:
    """Every layout the published one may have been (unpublished dimensions enumerated)."""
    options, notes = _options(row, cfg)
    world, gbs = cfg.world_size, cfg.train.global_batch_size
    layouts = [
        Layout.derived(world, gbs, tp=options["tp"][0], pp=options["pp"][0], cp=options["cp"][0],
                       vpp=v, zero=z, mbs=m, recompute=r, sp=s, ep=options["ep"][0])
        for v in options["vpp"] for z in options["zero"] for m in options["mbs"]
        for r in options["recompute"] for s in options["sp"]
    ]
    return layouts, notes


def _skip_reason(row: dict[str, str]) -> str | None:
    if row["gpu_type"] not in GPU_CLUSTERS:
        return f"no cluster preset for GPU {row['gpu_type']}"
    if row["recompute"] and row["recompute"] not in RECOMPUTES:
        return f"recompute policy {row['recompute']!r} not expressible"
    return None


def published_run(row: dict[str, str]) -> PublishedRun:
    """The row as an autotune problem, its candidate layouts and its measured step time."""
    skip = _skip_reason(row)
    if skip:
        return PublishedRun(row, None, (), None, "", skip)
    try:
        cfg = problem(row)
    except (ValidationError, ValueError) as error:
        message = str(error).splitlines()[0]
        return PublishedRun(row, None, (), None, "", f"model not expressible: {message}")
    measured = measured_step_s(row, cfg.model) if row["kind"] == "measured" else None
    step, basis = measured if measured else (None, "")
    layouts, notes = candidates(row, cfg)
    k = constants_for(cfg.cluster.gpu, cfg.train.software_stack)
    table = LayoutTable.from_layouts(layouts)
    first = first_broken(cfg, table, k, memory=False)
    legal = [lay for lay, broken in zip(layouts, first, strict=True) if broken < 0]
    if not legal:
        rule = rules_for(cfg.train.framework)[int(first.min())].name
        if row["pipeline_layout"] and rule == "layers_divisible_by_pp_vpp":
            reason = f"needs pipeline accounting the model lacks ({rule})"
            return PublishedRun(row, cfg, (), step, basis, reason, tuple(notes))
        reason = f"published layout breaks rule {rule}"
        return PublishedRun(row, cfg, (), step, basis, reason, tuple(notes), rule)
    zero = _published_zero(row, cfg)
    published = [lay if zero is None else dataclasses.replace(lay, zero=zero) for lay in legal]
    fits = memory_fits(cfg, published, k)
    if fits.any():
        legal = [lay for lay, ok in zip(legal, fits, strict=True) if ok]
    return PublishedRun(row, cfg, tuple(legal), step, basis, None, tuple(notes),
                        published_zero=zero)


def memory_fits(cfg: AutotuneConfig, layouts: list[Layout], k: Constants) -> np.ndarray:
    """Whether each layout's predicted peak memory fits the usable GPU memory (within
    RUN_MEMORY_TOLERANCE: these layouts ran)."""
    peak = estimate_memory(cfg, LayoutTable.from_layouts(layouts), k).total
    return peak <= usable_gpu_bytes(cfg, k) * (1 + RUN_MEMORY_TOLERANCE)


def open_dimensions(layouts: tuple[Layout, ...]) -> set[str]:
    """The dimensions that differ between candidates (the ones the source left unpublished)."""
    dims = [d.name for d in DIMS if d.kind in ("structure", "refinement")]
    return {d for d in dims if len({getattr(lay, d) for lay in layouts}) > 1}


def label(layout: Layout, open_dims: AbstractSet[str] = frozenset()) -> str:
    """The layout's `--layout` text (`Layout.text`), with '*' after each dimension the source
    left open and the model chose (`open_dims`)."""
    fields = (item.partition("=") for item in layout.text.split(","))
    return ",".join(f"{k}={v}{'*' if k in open_dims else ''}" for k, _, v in fields)


def published_runs(path: str | Path = PUBLISHED_RUNS) -> list[PublishedRun]:
    """Every row of the published-runs CSV as a PublishedRun."""
    return [published_run(row) for row in read_rows(path)]
