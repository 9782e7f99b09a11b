"""How a Layout maps onto Megatron-LM: command-line flags and megatron-core config objects.

`megatron_args` is the single source of the flags the rendered `pretrain_gpt.sh` passes;
`transformer_config_kwargs`, `ddp_config_kwargs` and `optimizer_config_kwargs` give the same
choices as keyword arguments of megatron-core's `TransformerConfig`,
`DistributedDataParallelConfig` and `OptimizerConfig` (for workloads that build the model with
megatron-core directly). Flag names: Megatron-LM `megatron/training/arguments.py` (NVIDIA/
Megatron-LM at d98e8a64); the layouts reaching these functions passed the Megatron rules
(`autotune.frameworks.megatron.bundle`).

ZeRO stages map to Megatron as: 0 DDP, 1 distributed optimizer, 2 Megatron-FSDP
`optim_grads`, 3 Megatron-FSDP `optim_grads_params`. Optimizer offload needs the distributed
optimizer and the precision-aware optimizer; Megatron has no parameter offload.

Mixture-of-Experts layouts always pass ep and etp (`--expert-tensor-parallel-size` defaults to
tp when absent, arguments.py:587), choose the token dispatcher (`token_dispatcher`) and, when
asked and allowed, the EP all-to-all overlap (`a2a_overlap`). The
script asks for `--moe-grouped-gemm` (Transformer Engine's grouped GEMM, one kernel for all
local experts); Megatron-LM asserts compute capability >= 8 for it (arguments.py:1378), which
every GPU preset has (A100 8.0, H100/H200 9.0). The megatron-core kwargs leave it off: without
Transformer Engine the local layer spec would need the separate `grouped_gemm` package, so the
built-in program runs the experts one after another (`SequentialMLP`). No capacity factor is
rendered: MoE layers run dropless, Megatron's default (a capacity factor would also need an
aux-loss load balancing, transformer_config.py:1836). ep combines with cp: the expert grid
(etp·ep·pp·edp) has no cp axis, so RankGenerator's "EP and CP both > 1" assertion, which is per
grid, never fires (parallel_state.py:479), and with the default pp-last rank order the two grids
share their pipeline groups (parallel_state.py:904).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Any

from autotune.costmodel.expert_dispatch import a2a_overlap_runs
from autotune.exceptions import AutotuneError
from autotune.frameworks.megatron.model import model_args
from autotune.frameworks.megatron.model import transformer_config_kwargs as model_config_kwargs
from autotune.layout import Layout
from autotune.specs import AutotuneConfig
from autotune.specs import resolve_recipe

FSDP_STRATEGY = {2: "optim_grads", 3: "optim_grads_params"}
"""Megatron-FSDP `--data-parallel-sharding-strategy` per ZeRO stage."""


def fsdp(layout: Layout) -> bool:
    """True when the layout runs on Megatron-FSDP (zero 2 or 3)."""
    return layout.zero >= 2


def needs_single_connection(cfg: AutotuneConfig, layout: Layout) -> bool:
    """Whether Megatron requires CUDA_DEVICE_MAX_CONNECTIONS=1 (tp>1 or cp>1, not with FSDP,
    not with the EP all-to-all overlap).

    arguments.py asserts it on pre-Blackwell GPUs; Megatron-FSDP asserts the opposite, and with
    `--overlap-moe-expert-parallel-comm` arguments.py only warns, since the overlap's streams
    need more than one connection (Megatron-Bridge `comm_overlap.py`
    `_set_num_cuda_device_max_connections` unsets it then).
    """
    return (layout.tp > 1 or layout.cp > 1) and not fsdp(layout) and not a2a_overlap(cfg, layout)


def edge_layers(num_layers: int, pp: int, vpp: int = 1) -> tuple[int, int] | None:
    """Layers on the first and on the last stage when both are set explicitly, else None.

    `--decoder-first-pipeline-num-layers` / `--decoder-last-pipeline-num-layers`: megatron-core
    (`TransformerConfig.__post_init__`) wants each at least 1 and divisible by vpp, and the rest
    split evenly over the pp−2 middle stages, each holding at least one layer and a multiple of
    vpp (none left with pp=2). Of the splits that exist: equal edges no heavier than the middle
    stages, the largest (Llama 3 405B's 126 layers on pp=16: 7 + 14·8 + 7, Dubey et al. 2024
    §3.3.2); else the split whose most loaded stage is lightest, then the closest edges, the
    lighter one first (it holds the most activations). None when no split exists.
    """
    if pp < 2 or num_layers % vpp != 0:
        return None
    splits = []  # (first, middle, last) for each middle depth, edges as close as vpp allows
    depths = range(vpp, num_layers, vpp) if pp > 2 else (0,)
    for middle in depths:
        edges = (num_layers - (pp - 2) * middle) // vpp  # the edges' layers, in units of vpp
        if edges < 2:
            break
        first = edges // 2 * vpp
        splits.append((first, middle, edges * vpp - first))
    if not splits:
        return None
    first, _, last = min(splits, key=lambda s: (not s[0] == s[2] <= s[1], max(s), s[2] - s[0]))
    return first, last


def chunk_layers(num_layers: int, pp: int, vpp: int) -> tuple[int, ...] | None:
    """Transformer layers of each of the pp·vpp model chunks, as evenly as possible, in the
    order of Megatron's `--pipeline-model-parallel-layout` (chunk v·pp + s is virtual stage v of
    pipeline stage s); None when some chunk would hold no layer.

    Every chunk holds q or q+1 layers. The stages share the q+1 chunks as evenly as possible, the
    middle stages first, then the last, then the first (the first and last stages also hold the
    embedding and the loss); the first stage's light chunks come first (the embedding's), the
    others' last (the last stage's with the loss).
    """
    chunks = pp * vpp
    if pp < 2 or num_layers < chunks:
        return None
    base, heavy = divmod(num_layers, chunks)
    order = [*range(1, pp), 0]
    per_stage = [heavy // pp + (order.index(s) < heavy % pp) for s in range(pp)]
    layers = [0] * chunks
    for stage, count in enumerate(per_stage):
        light = vpp - count
        for v in range(vpp):
            lighter = v < light if stage == 0 else v >= count
            layers[v * pp + stage] = base + (not lighter)
    return tuple(layers)


@dataclasses.dataclass(frozen=True, slots=True)
class PipelinePlan:
    """Where Megatron puts the transformer layers of a pp x vpp pipeline.

    One of, in the order `pipeline_plan` tries them: an even split; the embedding and/or the
    loss counted as one layer each (`--account-for-embedding-in-pipeline-split`,
    `--account-for-loss-in-pipeline-split`: the layers plus the accounted ones split evenly over
    pp·vpp chunks, and the first chunk of the first stage, or the last chunk of the last stage,
    builds one transformer layer fewer); first and last stages set explicitly (`edge`,
    `--decoder-first/last-pipeline-num-layers`, `edge_layers`); or every chunk's layers listed
    (`chunks`, `--pipeline-model-parallel-layout`, `chunk_layers`) where no flag above splits
    them. Megatron-LM `megatron/training/arguments.py` and megatron-core `transformer_config.py`,
    `pipeline_parallel_layer_layout.py` and `transformer_block.get_num_layers_to_build`
    (NVIDIA/Megatron-LM at d98e8a64).
    """

    first: int
    """Transformer layers on the first stage (all its chunks)."""
    middle: int
    """Transformer layers on the most loaded middle stage (none with pp <= 2: the memory and
    time models then read first and last only)."""
    last: int
    """Transformer layers on the last stage."""
    account_embedding: bool = False
    """The embedding counts as a layer of the first stage."""
    account_loss: bool = False
    """The output layer and loss count as a layer of the last stage."""
    edge: bool = False
    """First and last stage hold `first` and `last` layers, set explicitly."""
    chunks: tuple[int, ...] = ()
    """Layers of each chunk in the layout's order (`chunk_layers`) when the plan lists them."""

    @property
    def most(self) -> int:
        """Layers on the most loaded stage."""
        return max(self.first, self.middle, self.last)

    @property
    def settled(self) -> bool:
        """Even, accounted, or equal first and last stages no heavier than the middle ones.

        `pipeline_plan` keeps such a split even where a layout would load the most loaded stage
        less (96 layers on pp 4 x vpp 16: 16 + 32 + 32 + 16, not 24 each), so that the layouts
        these flags split keep their plans and predictions."""
        return not self.chunks and (not self.edge or self.first == self.last <= self.middle)

    @property
    def layout(self) -> str:
        """`--pipeline-model-parallel-layout` of `chunks`: chunks split by `|`, `E` (embedding)
        opening the first, `L` (loss) closing the last, a `t` per transformer layer, runs of
        equal chunks written `(tt|)*n` (megatron-core's `PipelineParallelLayerLayout` syntax)."""
        last = len(self.chunks) - 1
        names = [("E" if i == 0 else "") + "t" * n + ("L" if i == last else "")
                 for i, n in enumerate(self.chunks)]
        parts = []
        for name, run in itertools.groupby(names):
            repeat = len(list(run))
            parts.append(f"({name}|)*{repeat}," if repeat > 1 else f"{name}|")
        return "".join(parts).rstrip(",|")


_ACCOUNTING = ((True, True), (True, False), (False, True))
"""Embedding/loss accounting tried in order: both (Megatron-Bridge's Llama 3.1 405B recipe),
then the embedding alone (the lighter stage is the first, which holds the most activations)."""


@functools.cache
def pipeline_plan(num_layers: int, pp: int, vpp: int = 1) -> PipelinePlan | None:
    """How Megatron splits `num_layers` over pp stages of vpp chunks, or None when it cannot:
    evenly, else with the embedding/loss accounted as layers, else with explicit first and
    last stages, unless a custom layout (each chunk at least one layer) makes the most loaded
    stage lighter than unequal edges do (126 layers on pp=16, vpp=3: 21 + 14·6 + 21 with the
    flags, at most 8 per stage with a layout)."""
    if pp < 1 or vpp < 1 or (vpp > 1 and pp == 1):
        return None
    if num_layers % (pp * vpp) == 0:
        even = num_layers // pp
        return PipelinePlan(even, even, even)
    for embedding, loss in _ACCOUNTING if pp > 1 else ():
        counted = num_layers + embedding + loss
        if counted % pp == 0 and (counted // pp) % vpp == 0:
            per = counted // pp
            return PipelinePlan(per - embedding, per, per - loss, embedding, loss)
    edged = custom = None
    edges = edge_layers(num_layers, pp, vpp)
    if edges is not None:
        first, last = edges
        middle = (num_layers - first - last) // (pp - 2) if pp > 2 else max(edges)
        edged = PipelinePlan(first, middle, last, edge=True)
    chunks = chunk_layers(num_layers, pp, vpp)
    if chunks is not None:
        stages = [sum(chunks[stage::pp]) for stage in range(pp)]
        custom = PipelinePlan(stages[0], max(stages[1:-1] or stages), stages[-1], chunks=chunks)
    if edged is None or (custom is not None and not edged.settled and custom.most < edged.most):
        return custom
    return edged


def pipeline_split(cfg: AutotuneConfig, layout: Layout) -> PipelinePlan:
    """The layout's pipeline plan; raises AutotuneError when Megatron cannot split the layers."""
    layers, pp, vpp = cfg.model.num_layers, layout.pp, layout.vpp
    plan = pipeline_plan(layers, pp, vpp)
    if plan is None:
        raise AutotuneError(
            f"megatron: {layers} layers do not split over pp·vpp = {pp}·{vpp} chunks of at "
            "least one layer each (layers_divisible_by_pp_vpp); pick pp·vpp <= num_layers"
        )
    return plan


def _number(value: float) -> str:
    return str(value)


def token_dispatcher(cfg: AutotuneConfig, layout: Layout) -> str:
    """`--moe-token-dispatcher-type` of a MoE layout: `TrainSpec.moe_token_dispatcher` (alltoall
    by default, flex for DeepEP) when experts are spread over expert-parallel ranks (ep > 1),
    allgather otherwise.

    Megatron's MoE guide (megatron/core/transformer/moe/README.md, "Token dispatcher") names
    alltoall for EP > 1, flex with DeepEP for cross-node EP (it needs DeepEP installed), and
    allgather for tensor-parallel-only setups.
    """
    return cfg.train.moe_token_dispatcher if layout.ep > 1 else "allgather"


def a2a_overlap(cfg: AutotuneConfig, layout: Layout) -> bool:
    """Whether the layout runs with Megatron's EP all-to-all overlap
    (`expert_dispatch.a2a_overlap_runs`)."""
    return bool(a2a_overlap_runs(cfg, layout.ep, layout.pp, layout.vpp,
                                 layout.recompute == "full"))


def _expert_args(cfg: AutotuneConfig, layout: Layout) -> list[str]:
    if not cfg.model.moe:
        return []
    dispatcher = token_dispatcher(cfg, layout)
    args = ["--expert-model-parallel-size", str(layout.ep),
            "--expert-tensor-parallel-size", str(layout.etp),
            "--moe-token-dispatcher-type", dispatcher]
    if dispatcher == "flex":
        # DeepEP takes fp32 routing probabilities (token_dispatcher.py casts them, warning)
        args += ["--moe-flex-dispatcher-backend", "deepep", "--moe-router-dtype", "fp32"]
    if a2a_overlap(cfg, layout):
        args += ["--overlap-moe-expert-parallel-comm", "--delay-wgrad-compute"]
    if cfg.train.moe_force_balance:
        args.append("--moe-router-force-load-balancing")
    return args + ["--moe-grouped-gemm"]


def _parallel_args(cfg: AutotuneConfig, layout: Layout) -> list[str]:
    args = [
        "--tensor-model-parallel-size", str(layout.tp),
        "--pipeline-model-parallel-size", str(layout.pp),
        "--context-parallel-size", str(layout.cp),
    ]
    plan = pipeline_split(cfg, layout)
    if plan.chunks:  # the layout fixes vpp; arguments.py allows no other pipeline flag with it
        args += ["--pipeline-model-parallel-layout", plan.layout]
    elif plan.edge:
        # arguments.py rejects --num-layers-per-virtual-pipeline-stage with uneven stages
        if layout.vpp > 1:
            args += ["--num-virtual-stages-per-pipeline-rank", str(layout.vpp)]
        args += ["--decoder-first-pipeline-num-layers", str(plan.first),
                 "--decoder-last-pipeline-num-layers", str(plan.last)]
    elif plan.account_embedding or plan.account_loss:
        if layout.vpp > 1:
            args += ["--num-virtual-stages-per-pipeline-rank", str(layout.vpp)]
        if plan.account_embedding:
            args.append("--account-for-embedding-in-pipeline-split")
        if plan.account_loss:
            args.append("--account-for-loss-in-pipeline-split")
    elif layout.vpp > 1:
        args += ["--num-layers-per-virtual-pipeline-stage",
                 str(cfg.model.num_layers // (layout.pp * layout.vpp))]
    if layout.sp:
        args.append("--sequence-parallel")
        if cfg.train.tp_comm_overlap:
            args.append("--tp-comm-overlap")
    return args + _expert_args(cfg, layout)


def _data_parallel_args(cfg: AutotuneConfig, layout: Layout) -> list[str]:
    overlap = cfg.train.overlap_grad_reduce
    args: list[str] = []
    if fsdp(layout):
        args += ["--use-megatron-fsdp",
                 "--data-parallel-sharding-strategy", FSDP_STRATEGY[layout.zero],
                 "--ckpt-format", "fsdp_dtensor", "--no-gradient-accumulation-fusion"]
    if layout.zero >= 1:
        args.append("--use-distributed-optimizer")  # Megatron-FSDP v1 sets it anyway
    if overlap:
        args.append("--overlap-grad-reduce")
    if cfg.train.param_gather_overlapped and layout.zero >= 1:
        args.append("--overlap-param-gather")
    moments = cfg.train.adam_moments_dtype
    if layout.offload == "optimizer":
        args += ["--optimizer-cpu-offload", "--use-precision-aware-optimizer",
                 "--optimizer-offload-fraction", "1.0"]
    elif moments != "fp32":
        args.append("--use-precision-aware-optimizer")
    if moments != "fp32":
        args += ["--exp-avg-dtype", moments, "--exp-avg-sq-dtype", moments]
    return args


def _recompute_args(layout: Layout) -> list[str]:
    if layout.recompute == "selective":
        return ["--recompute-granularity", "selective"]
    if layout.recompute == "full":
        return ["--recompute-granularity", "full", "--recompute-method", "uniform",
                "--recompute-num-layers", "1"]
    return []


def _precision_args(cfg: AutotuneConfig) -> list[str]:
    precision = cfg.train.precision
    if precision == "fp16":
        return ["--fp16"]
    reduce = [] if cfg.train.grad_reduce_in_fp32 else ["--grad-reduce-in-bf16"]
    if precision == "fp8":
        return ["--bf16", "--fp8-format", "hybrid", "--fp8-recipe", cfg.train.fp8_recipe,
                *reduce]
    if precision == "bf16":
        return ["--bf16", *reduce]
    return []


def megatron_args(cfg: AutotuneConfig, layout: Layout) -> list[str]:
    """Every `pretrain_gpt.py` flag that fixes the layout, the model and the optimizer, as
    unquoted argv items (the data, tokenizer, checkpoint and iteration flags are the rendered
    script's: they come from its variables).

    Args:
        cfg: Model, cluster and training setup.
        layout: The parallel layout (must satisfy the Megatron rules).

    Returns:
        The flags, one argv item each, in a fixed order.

    Raises:
        AutotuneError: The layers do not split over the pipeline.
    """
    args = _parallel_args(cfg, layout) + _data_parallel_args(cfg, layout)
    args += _recompute_args(layout)
    args += ["--micro-batch-size", str(layout.mbs),
             "--global-batch-size", str(layout.global_batch_size)]
    args += model_args(cfg.model, cfg.train.seq_length) + _precision_args(cfg)
    if cfg.train.attention_backend != "auto":
        args += ["--attention-backend", cfg.train.attention_backend]
    return args + ["--log-throughput"] + recipe_args(cfg)


def recipe_args(cfg: AutotuneConfig) -> list[str]:
    """The optimizer, schedule, seed and timeout flags of the recipe (`resolve_recipe`); the
    run's length, warm-up and intervals are the rendered script's (its variables may change
    them). Without an explicit decay length the decay follows --train-iters (Megatron-LM's
    default for --lr-decay-iters)."""
    recipe = resolve_recipe(cfg)
    args = [
        "--lr", _number(recipe.lr),
        "--min-lr", _number(recipe.min_lr),
        "--lr-decay-style", recipe.decay_style,
    ]
    if recipe.decay_iters is not None:
        args += ["--lr-decay-iters", str(recipe.decay_iters)]
    return args + [
        "--weight-decay", _number(recipe.weight_decay),
        "--adam-beta1", _number(recipe.adam_beta1),
        "--adam-beta2", _number(recipe.adam_beta2),
        "--adam-eps", _number(recipe.adam_eps),
        "--clip-grad", _number(recipe.clip_grad),
        "--seed", str(recipe.seed),
        "--distributed-timeout-minutes", str(recipe.distributed_timeout_minutes),
    ]


def _dtype(cfg: AutotuneConfig) -> Any:
    import torch

    return {"fp16": torch.float16, "fp32": torch.float32}.get(cfg.train.precision, torch.bfloat16)


def transformer_config_kwargs(cfg: AutotuneConfig, layout: Layout) -> dict[str, Any]:
    """Keyword arguments of megatron-core's `TransformerConfig` for this layout.

    Mirrors `megatron_args` (and Megatron-LM's `core_transformer_config_from_args`): the model's
    architecture (`autotune.frameworks.megatron.model`), tp/pp/vpp/cp/sp, ep/etp and the token
    dispatcher of MoE models (no grouped GEMM: see the module docstring), the pipeline plan
    (explicit first/last stages, accounted embedding/loss or a custom layout), precision and
    recompute. Builds on CPU without torch.distributed. The expert
    degrees also go to `parallel_state.initialize_model_parallel` (`parallel_state_kwargs`).
    """
    precision = cfg.train.precision
    dtype = _dtype(cfg)
    plan = pipeline_split(cfg, layout)
    kwargs: dict[str, Any] = {
        **model_config_kwargs(cfg.model),
        "tensor_model_parallel_size": layout.tp,
        "pipeline_model_parallel_size": layout.pp,
        "virtual_pipeline_model_parallel_size": layout.vpp if layout.vpp > 1 else None,
        "context_parallel_size": layout.cp,
        "sequence_parallel": layout.sp,
        "tp_comm_overlap": layout.sp and cfg.train.tp_comm_overlap,
        "bf16": precision in ("bf16", "fp8"),
        "fp16": precision == "fp16",
        "params_dtype": dtype,
        "pipeline_dtype": dtype if layout.pp > 1 else None,
    }
    if cfg.model.moe:
        kwargs.update(expert_model_parallel_size=layout.ep, expert_tensor_parallel_size=layout.etp,
                      moe_token_dispatcher_type=token_dispatcher(cfg, layout))
        if kwargs["moe_token_dispatcher_type"] == "flex":
            kwargs.update(moe_flex_dispatcher_backend="deepep", moe_router_dtype="fp32")
        if a2a_overlap(cfg, layout):
            kwargs.update(overlap_moe_expert_parallel_comm=True, delay_wgrad_compute=True)
        if cfg.train.moe_force_balance:
            kwargs["moe_router_force_load_balancing"] = True
    if precision == "fp8":
        kwargs.update(fp8="hybrid", fp8_recipe=cfg.train.fp8_recipe)
    if cfg.train.attention_backend != "auto":
        from megatron.core.transformer.enums import AttnBackend

        kwargs["attention_backend"] = AttnBackend[cfg.train.attention_backend]
    if plan.chunks:
        kwargs["pipeline_model_parallel_layout"] = plan.layout
    if plan.edge:
        kwargs["num_layers_in_first_pipeline_stage"] = plan.first
        kwargs["num_layers_in_last_pipeline_stage"] = plan.last
    if plan.account_embedding:
        kwargs["account_for_embedding_in_pipeline_split"] = True
    if plan.account_loss:
        kwargs["account_for_loss_in_pipeline_split"] = True
    if layout.recompute != "none":
        kwargs["recompute_granularity"] = layout.recompute
    if layout.recompute == "full":
        kwargs["recompute_method"] = "uniform"
        kwargs["recompute_num_layers"] = 1
    return kwargs


def parallel_state_kwargs(layout: Layout) -> dict[str, Any]:
    """Keyword arguments of megatron-core's `parallel_state.initialize_model_parallel`: the
    dense grid (tp, pp, vpp, cp) and the expert grid (ep, etp), as Megatron-LM's
    `_initialize_distributed` passes them (megatron/training/initialize.py)."""
    return {
        "tensor_model_parallel_size": layout.tp,
        "pipeline_model_parallel_size": layout.pp,
        "virtual_pipeline_model_parallel_size": layout.vpp if layout.vpp > 1 else None,
        "context_parallel_size": layout.cp,
        "expert_model_parallel_size": layout.ep,
        "expert_tensor_parallel_size": layout.etp,
    }


def ddp_config_kwargs(cfg: AutotuneConfig, layout: Layout) -> dict[str, Any]:
    """Keyword arguments of megatron-core's `DistributedDataParallelConfig` (the zero mapping)."""
    overlap = cfg.train.overlap_grad_reduce
    kwargs: dict[str, Any] = {
        "use_distributed_optimizer": layout.zero >= 1,
        "overlap_grad_reduce": overlap,
        "overlap_param_gather": cfg.train.param_gather_overlapped and layout.zero >= 1,
    }
    if fsdp(layout):
        kwargs["use_megatron_fsdp"] = True
        kwargs["data_parallel_sharding_strategy"] = FSDP_STRATEGY[layout.zero]
    return kwargs


def optimizer_config_kwargs(cfg: AutotuneConfig, layout: Layout) -> dict[str, Any]:
    """Keyword arguments of megatron-core's `OptimizerConfig` (AdamW, precision and offload)."""
    precision = cfg.train.precision
    offload = layout.offload == "optimizer"
    recipe = resolve_recipe(cfg)
    kwargs: dict[str, Any] = {
        "optimizer": "adam",
        "lr": recipe.lr,
        "min_lr": recipe.min_lr,
        "weight_decay": recipe.weight_decay,
        "adam_beta1": recipe.adam_beta1,
        "adam_beta2": recipe.adam_beta2,
        "adam_eps": recipe.adam_eps,
        "clip_grad": recipe.clip_grad,
        "bf16": precision in ("bf16", "fp8"),
        "fp16": precision == "fp16",
        "params_dtype": _dtype(cfg),
        "use_distributed_optimizer": layout.zero >= 1,
    }
    if offload:
        kwargs.update(optimizer_cpu_offload=True, use_precision_aware_optimizer=True,
                      optimizer_offload_fraction=1.0)
    return kwargs
