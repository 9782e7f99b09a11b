"""megatron-core trial program: train a GPT of the model's shape for a few steps, report times.

Run under ``torchrun --nproc_per_node N``::

    torchrun --nproc_per_node 8 -m autotune.workloads.megatron_gpt --model llama2-7b \\
        --layout DIR/layout.json --seq 4096 --gbs 64 --precision bf16 --steps 6 --warmup 2

The layout maps onto megatron-core the way Megatron-LM's ``pretrain_gpt.py`` maps its flags
(`autotune.frameworks.megatron.args` holds the mapping; `build_configs` makes config objects):

- tp, pp, vpp, cp, ep, etp: ``parallel_state.initialize_model_parallel`` (ep and etp fold the
  same ranks into the expert grid of the MoE layers), one ``GPTModel`` chunk per virtual
  stage (smaller first/last stages where the layers do not divide), trained by the schedule of
  ``get_forward_backward_func`` (no pipelining, 1F1B, or interleaved 1F1B);
- sp: ``TransformerConfig.sequence_parallel``;
- zero: 0 ``DistributedDataParallel``, 1 the distributed optimizer, 2/3 Megatron-FSDP
  (``optim_grads`` / ``optim_grads_params``); offload=optimizer: the precision-aware optimizer
  with ``optimizer_cpu_offload`` (``HybridDeviceOptimizer``);
- recompute: ``recompute_granularity`` selective (core attention) or full (uniform, 1 layer).

The layers come from ``get_gpt_layer_local_spec`` (no Transformer Engine). Its core attention,
``DotProductAttention``, stores the s×s scores; by default it is swapped for `SDPAttention`
(torch's fused scaled-dot-product attention, as Megatron-LM runs with Transformer Engine), and
``--attention local`` keeps it. Without Transformer Engine or Apex, megatron-core falls back to
``torch.optim.AdamW``; its fused kernel is switched on (TE's FusedAdam has no temporaries either).

Rank 0 prints one JSON line per step and a summary line (`autotune.workloads.common`). Exit
codes: 0 ok, 2 bad input, 3 nan, 4 oom, 5 rejected (a combination this workload cannot train,
and any run without CUDA: megatron-core's GPTModel needs it). A run refused before it trained
exits with its code on rank 0 only (the other ranks exit 0, so that the launcher does not kill
rank 0 before it prints the summary); a rank that runs out of memory prints its own summary with
a ``rank`` field and exits 4.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import importlib.util
import math
import os
import sys
import time
import traceback
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from autotune.costmodel.constants import Constants
from autotune.exceptions import AutotuneError
from autotune.frameworks import framework_of
from autotune.frameworks.base import Rule
from autotune.frameworks.base import RuleGroup
from autotune.frameworks.base import rule
from autotune.frameworks.megatron.args import ddp_config_kwargs
from autotune.frameworks.megatron.args import fsdp
from autotune.frameworks.megatron.args import needs_single_connection
from autotune.frameworks.megatron.args import optimizer_config_kwargs
from autotune.frameworks.megatron.args import parallel_state_kwargs
from autotune.frameworks.megatron.args import transformer_config_kwargs
from autotune.frameworks.megatron.model import gpt_model_kwargs
from autotune.frameworks.megatron.model import transformer_config_class
from autotune.layout import BoolArray
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.specs import AutotuneConfig
from autotune.specs.inputs import load_model
from autotune.workloads.common import SEED
from autotune.workloads.common import Reporter
from autotune.workloads.common import check_arguments
from autotune.workloads.common import exit_now
from autotune.workloads.common import inject_failure
from autotune.workloads.common import is_oom
from autotune.workloads.common import read_layout
from autotune.workloads.common import read_problem
from autotune.workloads.common import refusal
from autotune.workloads.common import teardown
from autotune.workloads.common import train_loop
from autotune.workloads.common import trial_config
from autotune.workloads.common import workload_parser

ATTENTIONS = ("sdpa", "local")
"""Core attention: torch SDPA (flash, the default) or the local spec's DotProductAttention."""
PRECISIONS = ("bf16", "fp16", "fp32", "fp8")
"""Values of --precision (fp8 is rejected: it needs Transformer Engine)."""
NO_CUDA = "megatron-core GPTModel needs CUDA"
"""Reason of the rejected summary on a machine without a CUDA device."""


# --- inputs ----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """One trial, resolved from the command line, the model and layout.json."""

    cfg: AutotuneConfig
    """Model and training setup (framework megatron; the cluster is a placeholder)."""
    layout: Layout
    """Parallel degrees, zero, offload, micro-batch and recompute."""
    steps: int
    """Optimizer steps to run, warm-up included."""
    warmup: int
    """Leading steps left out of the summary."""
    attention: str
    """Core attention implementation (one of ATTENTIONS)."""

    @property
    def tokens_per_step(self) -> int:
        """Tokens per optimizer step."""
        return self.layout.global_batch_size * self.cfg.train.seq_length


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Read the command line; launcher arguments such as ``--local_rank`` are ignored."""
    parser = workload_parser("torchrun -m autotune.workloads.megatron_gpt")
    parser.add_argument("--gbs", type=int, help="without --problem: sequences per step")
    parser.add_argument("--precision", choices=PRECISIONS, default="bf16",
                        help="without --problem: compute precision")
    parser.add_argument("--attention", choices=ATTENTIONS, default="sdpa")
    args, _unknown = parser.parse_known_args(argv)
    check_arguments(parser, args)
    if args.problem is None and (args.gbs is None or args.gbs < 1):
        parser.error(f"without --problem, give --gbs >= 1 (got {args.gbs})")
    return args


def make_plan(args: argparse.Namespace, world_size: int) -> Plan:
    """Check that the model, layout.json, the batch and the world agree; resolve the trial.

    Raises:
        AutotuneError: an input cannot be read or contradicts another.
    """
    layout = read_layout(args.layout)
    if args.problem is not None:
        cfg = read_problem(args.problem)
    else:
        cfg = trial_config(load_model(args.model), world_size=world_size, seq_length=args.seq,
                           global_batch_size=args.gbs, precision=args.precision,
                           framework="megatron", flash_attention=args.attention == "sdpa")
    layout.validate(world_size, cfg.train.global_batch_size)
    spec, seq = cfg.model, cfg.train.seq_length
    if seq > spec.max_position_embeddings and spec.position_embedding == "learned_absolute":
        raise AutotuneError(
            f"--seq: {seq} exceeds the model's learned positions "
            f"({spec.max_position_embeddings}); lower --seq or raise max_position_embeddings"
        )
    return Plan(cfg=cfg, layout=layout, steps=args.steps, warmup=args.warmup,
                attention=args.attention)


def _ddp_extra_kwargs(cfg: AutotuneConfig, layout: Layout) -> dict[str, Any]:
    """DDP settings Megatron-LM derives from its defaults (arguments.py, training.get_model)."""
    overlap = cfg.train.overlap_grad_reduce
    return {
        # bf16 accumulates and all-reduces gradients in fp32 (Megatron-LM's validate_args)
        # unless --grad-reduce-in-bf16
        "grad_reduce_in_fp32": (cfg.train.precision in ("bf16", "fp8")
                                and cfg.train.grad_reduce_in_fp32),
        # get_model: buckets of max(40M, 1M·dp·cp) elements; one bucket without overlap
        "bucket_size": max(40_000_000, 1_000_000 * layout.dp * layout.cp) if overlap else None,
        # --align-param-gather is on by default and kept only with interleaving
        "align_param_gather": overlap and layout.zero >= 1 and layout.vpp > 1,
    }


def _transformer_extra_kwargs(layout: Layout) -> dict[str, Any]:
    """TransformerConfig settings core_transformer_config_from_args adds to the flags."""
    interleaved = layout.vpp > 1
    return {
        "deallocate_pipeline_outputs": True,
        "overlap_p2p_comm": interleaved,
        "batch_p2p_comm": not interleaved,
    }


def build_configs(cfg: AutotuneConfig, layout: Layout) -> tuple[Any, Any, Any]:
    """megatron-core's (TransformerConfig, DistributedDataParallelConfig, OptimizerConfig).

    Runs on CPU without torch.distributed.

    Raises:
        AutotuneError: the layout has no Megatron form.
        ValueError, AssertionError: megatron-core's own checks reject it.
    """
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig

    transformer = transformer_config_class(cfg.model)(
        **transformer_config_kwargs(cfg, layout), **_transformer_extra_kwargs(layout)
    )
    ddp = DistributedDataParallelConfig(
        **ddp_config_kwargs(cfg, layout), **_ddp_extra_kwargs(cfg, layout)
    )
    with _te_version_guard():
        optimizer = OptimizerConfig(**optimizer_config_kwargs(cfg, layout))
    return transformer, ddp, optimizer


@contextlib.contextmanager
def _te_version_guard() -> Iterator[None]:
    """Let OptimizerConfig take the precision-aware optimizer (offload) without TE installed.

    Its ``__post_init__`` asks ``is_te_min_version("2.1.0")`` to set ``store_param_remainders``,
    which raises TypeError (None >= Version) when Transformer Engine is missing (megatron-core
    0.16.1 to 0.19.2); without TE the answer is "older", which is what this guard returns.
    """
    from megatron.core.optimizer import optimizer_config

    if importlib.util.find_spec("transformer_engine") is not None:
        yield
        return
    original = optimizer_config.is_te_min_version
    optimizer_config.is_te_min_version = lambda *_args, **_kwargs: False
    try:
        yield
    finally:
        optimizer_config.is_te_min_version = original


LIMITS: list[Rule] = []
"""What this program cannot train although Megatron's rules allow it (no Transformer Engine)."""


@rule(LIMITS, "megatron_gpt_cp_needs_transformer_engine",
      "context parallelism (cp={l.cp}) needs Transformer Engine's attention "
      "(TEDotProductAttention); the local layer spec has none",
      RuleGroup.WORKLOAD)
def _cp_needs_te(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    return t.cp > 1


@rule(LIMITS, "megatron_gpt_fp8_needs_transformer_engine",
      "fp8 needs Transformer Engine; the local layer spec has none",
      RuleGroup.WORKLOAD)
def _fp8_needs_te(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    return np.full(len(t), cfg.train.precision == "fp8")


# --- the model -------------------------------------------------------------------------------


class SDPAttention(torch.nn.Module):
    """Causal core attention through torch's fused ``scaled_dot_product_attention``.

    A drop-in for the local spec's ``DotProductAttention``: query [s, b, heads, d] and key/value
    [s, b, groups, d] in, [s, b, heads·d] out; attention dropout happens inside the kernel, which
    never stores the s×s scores.
    """

    def __init__(self, config: Any, softmax_scale: float | None = None, **_: Any) -> None:
        super().__init__()
        from megatron.core import tensor_parallel

        self.dropout = float(config.attention_dropout)
        self.scale = softmax_scale
        self.fork_rng = not config.sequence_parallel
        self._tracker = tensor_parallel.get_cuda_rng_tracker

    def forward(
        self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *_: Any, **__: Any
    ) -> torch.Tensor:
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        dropout = self.dropout if self.training else 0.0
        # like DotProductAttention: tensor-parallel ranks draw their dropout from the tracker
        rng = self._tracker().fork() if dropout and self.fork_rng else contextlib.nullcontext()
        with rng:
            out = F.scaled_dot_product_attention(
                q, k, v, dropout_p=dropout, is_causal=True, scale=self.scale,
                enable_gqa=q.shape[1] != k.shape[1],
            )
        return out.permute(2, 0, 1, 3).reshape(query.shape[0], query.shape[1], -1)


def layer_spec(config: Any, attention: str) -> Any:
    """The local (non-Transformer-Engine) decoder block spec of the model (dense and MoE layers
    as the config says), with SDPA core attention if asked."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    block = get_gpt_decoder_block_spec(config, use_transformer_engine=False,
                                       normalization=config.normalization)
    if attention == "sdpa":
        for layer in block.layer_specs:
            layer.submodules.self_attention.submodules.core_attention = SDPAttention
    return block


def build_model(plan: Plan, config: Any) -> list[torch.nn.Module]:
    """This rank's GPTModel chunks (one per virtual stage), on the GPU, in 16-bit if asked."""
    from megatron.core import parallel_state
    from megatron.core import tensor_parallel
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.transformer.module import Float16Module

    m, lay, train = plan.cfg.model, plan.layout, plan.cfg.train
    spec = layer_spec(config, plan.attention)
    architecture = {**gpt_model_kwargs(m, train.seq_length),
                    "vocab_size": framework_of(plan.cfg).padded_vocab(m.vocab_size, lay.tp)}
    chunks: list[torch.nn.Module] = []
    for stage in range(lay.vpp):
        vp_stage = stage if lay.vpp > 1 else None
        first = parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage)
        last = parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage)
        chunks.append(GPTModel(
            config=config,
            transformer_layer_spec=spec,
            pre_process=first,
            post_process=last,
            vp_stage=vp_stage,
            **architecture,
        ))
    for chunk in chunks:
        for param in chunk.parameters():
            tensor_parallel.set_defaults_if_not_set_tensor_model_parallel_attributes(param)
        chunk.cuda(torch.cuda.current_device())
    if config.bf16 or config.fp16:
        chunks = [Float16Module(config, chunk) for chunk in chunks]
    return chunks


def _fused_torch_adam(optimizer: Any) -> None:
    """Run megatron-core's torch.optim fallback (no TE/Apex) with its fused CUDA kernel."""
    for part in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(part, "optimizer", None)
        if isinstance(inner, torch.optim.Adam | torch.optim.AdamW):
            for group in inner.param_groups:
                if all(p.is_cuda and p.is_floating_point() for p in group["params"]):
                    group["fused"], group["foreach"] = True, False


# --- data ------------------------------------------------------------------------------------


class SyntheticTokens:
    """Seeded random tokens; every rank of one data-parallel slot sees the same micro-batches."""

    def __init__(self, plan: Plan, dp_rank: int, device: torch.device) -> None:
        self.plan, self.dp_rank, self.device = plan, dp_rank, device
        seq, mbs = plan.cfg.train.seq_length, plan.layout.mbs
        self.position_ids = torch.arange(seq, device=device).unsqueeze(0).expand(mbs, seq)

    def batch(self, step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens, labels), each [micro_batch, seq], of one micro-batch."""
        lay, seq = self.plan.layout, self.plan.cfg.train.seq_length
        index = (step * lay.gas + micro) * lay.dp + self.dp_rank
        generator = torch.Generator().manual_seed(SEED + 7919 * index)
        tokens = torch.randint(self.plan.cfg.model.vocab_size, (lay.mbs, seq + 1),
                               generator=generator).to(self.device, non_blocking=True)
        return tokens[:, :-1], tokens[:, 1:]

    def micro_batches(self, step: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The gas micro-batches of one step (each model chunk reads its own iterator)."""
        return (self.batch(step, micro) for micro in range(self.plan.layout.gas))


# --- the run ---------------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class Trial:
    """Model chunks, optimizer and schedule, ready to train."""

    plan: Plan
    model: list[torch.nn.Module]
    optimizer: Any
    forward_backward: Any
    data: SyntheticTokens
    device: torch.device
    last_stage: bool
    loss_scale: float = 1.0

    def forward_step(self, data_iterator: Iterator[Any], model: torch.nn.Module) -> Any:
        """megatron-core's forward_step_func: per-token losses and the function reducing them."""
        tokens, labels = next(data_iterator)
        return model(tokens, self.data.position_ids, None, labels=labels), self.loss

    def loss(self, output: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Mean token loss (the schedule divides it by the micro-batches in place)."""
        loss = output.float().mean() * self.loss_scale
        return loss, {"lm loss": loss.detach().clone()}


def setup(plan: Plan, configs: tuple[Any, Any, Any]) -> Trial:
    """Initialise model parallelism, build and wrap the model, build the optimizer."""
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel
    from megatron.core.distributed import FullyShardedDataParallel
    from megatron.core.distributed import finalize_model_grads
    from megatron.core.optimizer import get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    config, ddp_config, optimizer_config = configs
    lay = plan.layout
    parallel_state.initialize_model_parallel(**parallel_state_kwargs(lay))
    model_parallel_cuda_manual_seed(SEED)
    torch.manual_seed(SEED)
    wrapper = FullyShardedDataParallel if fsdp(lay) else DistributedDataParallel
    model = [
        wrapper(config=config, ddp_config=ddp_config, module=chunk, disable_bucketing=i > 0)
        for i, chunk in enumerate(build_model(plan, config))
    ]
    optimizer = get_megatron_optimizer(optimizer_config, model)
    _fused_torch_adam(optimizer)
    # the hooks Megatron-LM's train() installs (training.py)
    config.grad_scale_func = optimizer.scale_loss
    config.finalize_model_grads_func = finalize_model_grads
    if ddp_config.overlap_grad_reduce:
        config.no_sync_func = [chunk.no_sync for chunk in model]
        config.grad_sync_func = [chunk.start_grad_sync for chunk in model]
        if len(model) == 1:
            config.no_sync_func, config.grad_sync_func = model[0].no_sync, model[0].start_grad_sync
    if ddp_config.overlap_param_gather and ddp_config.align_param_gather:
        config.param_sync_func = [chunk.start_param_sync for chunk in model]
    device = torch.device("cuda", torch.cuda.current_device())
    data = SyntheticTokens(plan, parallel_state.get_data_parallel_rank(), device)
    last = parallel_state.is_pipeline_last_stage(ignore_virtual=True)
    return Trial(plan, model, optimizer, get_forward_backward_func(), data, device, last)


def train_step(trial: Trial, step: int) -> torch.Tensor:
    """One optimizer step; returns [loss, 1] on the last pipeline stage, [0, 0] elsewhere."""
    plan = trial.plan
    for chunk in trial.model:
        chunk.zero_grad_buffer()  # type: ignore[operator]  # a DDP / FSDP method
    trial.optimizer.zero_grad()
    losses = trial.forward_backward(
        forward_step_func=trial.forward_step,
        data_iterator=[trial.data.micro_batches(step) for _ in trial.model],
        model=trial.model,
        num_microbatches=plan.layout.gas,
        seq_length=plan.cfg.train.seq_length,
        micro_batch_size=plan.layout.mbs,
        decoder_seq_length=plan.cfg.train.seq_length,
        forward_only=False,
    )
    trial.optimizer.step()
    if not (trial.last_stage and losses):
        return torch.zeros(2, device=trial.device)
    loss = torch.stack([item["lm loss"].float() for item in losses]).mean()
    return torch.stack([loss, torch.ones((), device=trial.device)])


def _global_loss(local: torch.Tensor) -> float:
    """The mean over the ranks that computed a loss (the last stage of each replica)."""
    import torch.distributed as dist

    dist.all_reduce(local)
    return float(local[0] / local[1]) if float(local[1]) else math.nan


def train(trial: Trial, reporter: Reporter, inject: str | None) -> dict[str, Any]:
    """Run the steps, emit one record per step, and return the summary record."""

    def timed_step(step: int) -> tuple[float, float]:
        if inject_failure(inject, step, trial.device):
            trial.loss_scale = math.nan  # the injected NaN goes into the loss
        torch.cuda.synchronize()
        start = time.perf_counter()
        local = train_step(trial, step)
        torch.cuda.synchronize()
        step_time_s = time.perf_counter() - start
        return step_time_s, _global_loss(local)

    summary = train_loop(trial.plan, reporter, trial.device, timed_step)
    summary.update(describe(trial))
    return summary


def describe(trial: Trial) -> dict[str, Any]:
    """What megatron-core built: its version, the optimizer, and this rank's weights."""
    import megatron.core

    optimizer = trial.optimizer
    inner = getattr(optimizer, "optimizer", None)
    params = sum(p.numel() for chunk in trial.model for p in chunk.parameters())
    return {
        "megatron_core": getattr(megatron.core, "__version__", "unknown"),
        "attention": trial.plan.attention,
        "optimizer": type(optimizer).__name__ + (f"({type(inner).__name__})" if inner else ""),
        "params_local": int(params),
    }


def _teardown() -> None:
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    teardown()


def run(args: argparse.Namespace) -> int:
    """Check the inputs, set up, train and tear down; returns the exit code."""
    import torch.distributed as dist

    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    reporter = Reporter(rank, args.metrics)
    try:
        plan = make_plan(args, world)
    except AutotuneError as error:
        print(f"error: {error}", file=sys.stderr)
        return reporter.fail("bad_input", str(error), world)
    reason = refusal(plan.cfg, plan.layout, tuple(LIMITS))
    if reason is not None:
        return reporter.fail("rejected", reason, world)
    try:
        configs = build_configs(plan.cfg, plan.layout)
    except (AutotuneError, ValueError, AssertionError) as error:
        return reporter.fail("rejected", f"megatron-core config: {error}", world)
    if needs_single_connection(plan.cfg, plan.layout):
        os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")  # before the CUDA context
    if not torch.cuda.is_available():
        return reporter.fail("rejected", NO_CUDA, world)
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    torch.cuda.set_device(device)
    torch.cuda.reset_peak_memory_stats()
    dist.init_process_group(backend="nccl", device_id=device)
    try:
        try:
            trial = setup(plan, configs)
        except (AssertionError, ValueError, NotImplementedError) as error:
            traceback.print_exc()
            code = reporter.fail("rejected", f"megatron-core setup: {error}", world)
            _teardown()
            return code
        summary = train(trial, reporter, args.inject)
    except BaseException as error:
        if not is_oom(error):
            raise
        # peers may be stuck in a collective: no teardown
        exit_now(reporter.rank_failed("oom", error, world))
    return reporter.finish(summary, _teardown)


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m autotune.workloads.megatron_gpt``."""
    return run(parse_args(argv))


if __name__ == "__main__":
    exit_now(main())  # os._exit: no interpreter teardown after destroy_process_group
