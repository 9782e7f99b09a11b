"""Megatron-LM / megatron-core: its rules, model terms and artifacts.

Rules: Megatron-LM `megatron/training/arguments.py`, megatron-core `transformer_config.py` and
`transformer/moe/` (NVIDIA/Megatron-LM at d98e8a64). Memory: Megatron-LM
`theoretical_memory_usage.py` (fp32 main gradients, 18 B/param, 6 + 12/d with the distributed
optimizer). Artifacts: `pretrain_gpt.sh` (torchrun of the user's checkout's `pretrain_gpt.py`) and
`sbatch.sh`; the flags come from `autotune.frameworks.megatron.args`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from typing import ClassVar

import numpy as np

from autotune.costmodel.constants import Constants
from autotune.costmodel.sharding import element_bytes
from autotune.costmodel.terms import StageSplit
from autotune.costmodel.terms import Zero3Live
from autotune.frameworks.base import MEGATRON_LM
from autotune.frameworks.base import TRIAL_ITERS
from autotune.frameworks.base import Framework
from autotune.frameworks.base import RenderOptions
from autotune.frameworks.base import Rule
from autotune.frameworks.base import RuleGroup
from autotune.frameworks.base import rule
from autotune.frameworks.megatron.args import fsdp
from autotune.frameworks.megatron.args import megatron_args
from autotune.frameworks.megatron.args import needs_single_connection
from autotune.frameworks.megatron.args import pipeline_plan
from autotune.frameworks.megatron.args import pipeline_split
from autotune.frameworks.megatron.args import token_dispatcher
from autotune.frameworks.megatron.log import MegatronLog
from autotune.layout import BoolArray
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.specs import AutotuneConfig
from autotune.specs import resolve_recipe
from autotune.specs.inputs import position_warnings
from autotune.templating import flag_lines
from autotune.templating import header
from autotune.templating import render_template

MEGATRON_RULES: list[Rule] = []
"""Megatron's own rules."""


@rule(MEGATRON_RULES, "sp_needs_tp",
      "sequence parallelism splits along tp: it needs tp > 1 (Megatron turns it off)",
      RuleGroup.TENSOR)
def _sp_tp(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    broken: BoolArray = t.sp & (t.tp == 1)
    return broken


@rule(MEGATRON_RULES, "seq_divisible_by_tp_with_sp",
      "with sequence parallelism seq/cp ({t.seq_length}/{l.cp}) must be divisible by tp ({l.tp})",
      RuleGroup.TENSOR)
def _seq_sp(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    broken: BoolArray = t.sp & ((cfg.train.seq_length // t.cp) % t.tp != 0)
    return broken


@rule(MEGATRON_RULES, "vpp_needs_pp",
      "virtual pipeline stages interleave a pipeline: vpp={l.vpp} needs pp > 1",
      RuleGroup.PIPELINE)
def _vpp_pp(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    broken: BoolArray = (t.vpp > 1) & (t.pp == 1)
    return broken


@rule(MEGATRON_RULES, "interleave_microbatches_divisible_by_pp",
      "Megatron's interleaved schedule runs micro-batches in groups of pp: micro-batches "
      "gbs/(mbs·dp) = {t.global_batch_size}/({l.mbs}·{l.dp}) must be a multiple of pp ({l.pp})",
      RuleGroup.PIPELINE)
def _interleave_m(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    broken: BoolArray = (t.vpp > 1) & (t.gas % t.pp != 0)
    return broken


@rule(MEGATRON_RULES, "seq_divisible_by_2cp",
      "context parallelism splits each sequence into 2·cp chunks: seq ({t.seq_length}) must be "
      "divisible by 2·cp = {l.cp}·2",
      RuleGroup.CONTEXT)
def _seq_cp(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    broken: BoolArray = (t.cp > 1) & (cfg.train.seq_length % (2 * t.cp) != 0)
    return broken


@rule(MEGATRON_RULES, "moe_tp_needs_sp",
      "MoE layers refuse to train with tensor parallelism (tp={l.tp}) but without sequence "
      "parallelism (megatron/core/transformer/moe/moe_layer.py:636): sp must be on",
      RuleGroup.EXPERT)
def _moe_sp(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    return cfg.model.moe & (t.tp > 1) & ~t.sp


@rule(MEGATRON_RULES, "moe_bias_needs_etp1",
      "megatron-core supports biases in MoE layers only with etp=1 "
      "(transformer_config.py:2612), not etp={l.etp}",
      RuleGroup.EXPERT)
def _moe_bias(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    m = cfg.model
    return (m.moe and m.add_bias_linear) & (t.etp > 1)


@rule(MEGATRON_RULES, "megatron_no_param_offload",
      "Megatron-LM offloads optimizer states only (--optimizer-cpu-offload), not parameters",
      RuleGroup.ZERO)
def _mlm_param_offload(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    broken: BoolArray = t.offload == 2
    return broken


@rule(MEGATRON_RULES, "offload_needs_distributed_optimizer",
      "Megatron --optimizer-cpu-offload needs --use-precision-aware-optimizer, which needs the "
      "distributed optimizer (zero=1)",
      RuleGroup.ZERO)
def _mlm_offload(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    broken: BoolArray = (t.offload >= 1) & (t.zero != 1)
    return broken


@rule(MEGATRON_RULES, "megatron_fsdp_without_pp",
      "Megatron-FSDP (zero=2/3: --use-megatron-fsdp) is not tested upstream with pipeline "
      "parallelism (no test or example); autotune keeps it to pp=1",
      RuleGroup.ZERO)
def _fsdp_pp(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    return (t.zero >= 2) & (t.pp > 1)


class Megatron(Framework):
    """Megatron-LM: 3D parallelism with sequence parallelism, interleaving and a K/V ring for cp.

    ZeRO stages map to Megatron as 0 DDP, 1 the distributed optimizer, 2 Megatron-FSDP
    `optim_grads`, 3 `optim_grads_params`.
    """

    name = "megatron"
    workload = "megatron_gpt"
    launch_script = "pretrain_gpt.sh"
    artifacts = ("pretrain_gpt.sh", "sbatch.sh")
    default_zero = 1
    context_parallel = "ring"
    sequence_parallel = True
    tp_async_backward = True
    tp_comm_overlap = True
    fp8_amax_reduction = True
    param_gather_overlaps_forward = True
    tp_may_exceed_query_groups = True
    checkout_env = "MEGATRON_LM"
    rules: ClassVar[tuple[Rule, ...]] = tuple(MEGATRON_RULES)

    def padded_vocab(self, vocab: int, tp: Any) -> Any:
        """A multiple of 128·tp (`--make-vocab-size-divisible-by 128`, times tp)."""
        multiple = 128 * tp
        return -(-vocab // multiple) * multiple

    def split_layers(self, cfg: AutotuneConfig, pp: np.ndarray, vpp: np.ndarray) -> StageSplit:
        """Megatron's placement (`pipeline_plan`): even over pp·vpp chunks, the embedding/loss
        counted as layers, explicit first and last stages, or a custom layout (middle: the
        most loaded middle stage)."""
        n = pp.shape[0]
        first, middle, last = (np.zeros(n, dtype=np.int64) for _ in range(3))
        legal = np.zeros(n, dtype=bool)
        heaviest = np.zeros(n, dtype=np.int64)
        width = int(vpp.max(initial=0)) + 1
        keys = pp * width + vpp  # one per (pp, vpp) pair; bincount finds those present
        for key in np.flatnonzero(np.bincount(keys)).tolist():
            p, v = divmod(key, width)
            plan = pipeline_plan(cfg.model.num_layers, p, v)
            if plan is None:
                continue
            rows = keys == key
            first[rows], middle[rows], last[rows] = plan.first, plan.middle, plan.last
            legal[rows] = True
            heaviest[rows] = max(plan.chunks) if plan.chunks else -(-plan.most // v)
        return StageSplit(first=first, middle=middle, last=last, legal=legal,
                          heaviest_chunk=heaviest)

    def state_bytes(
        self, cfg: AutotuneConfig, t: LayoutTable, params: np.ndarray, live: Zero3Live,
        shard: np.ndarray,
    ) -> dict[str, np.ndarray]:
        """16-bit weights, main gradients in the buffer's dtype (`grad_reduce_bytes`: 4 B fp32,
        2 B with --grad-reduce-in-bf16), fp32 master + Adam moments (12 B; 8 B with bf16
        moments, `adam_moments_dtype`); sharded over dp·cp (experts: edp) by the distributed
        optimizer (zero 1) or Megatron-FSDP (2, 3)."""
        n, z = shard, t.zero
        g = self.grad_reduce_bytes(cfg)
        state = 4 + 2 * (4 if cfg.train.adam_moments_dtype == "fp32" else 2)
        weights = np.where(z >= 3, 2 * params / n + 2 * live.weights, 2 * params)
        grads = np.where(z >= 2, g * params / n + (z >= 3) * live.gradient_bytes, g * params)
        optimizer = np.where(z >= 1, state * params / n, state * params)
        offloaded = t.offload >= 1
        optimizer = np.where(offloaded, 0.0, optimizer)
        host = offloaded * state * params / n
        return {"weights": weights, "gradients": grads, "optimizer": optimizer, "host": host}

    def zero3_live(self, cfg: AutotuneConfig, t: LayoutTable, layer: np.ndarray,
                   largest: np.ndarray, table: np.ndarray) -> Zero3Live:
        """Megatron-FSDP `optim_grads_params` (megatron-core 0.16.1,
        `distributed/fsdp/src/megatron_fsdp/`), its units the transformer layers
        (`mcore_fsdp_adapter.py`) and `suggested_communication_unit_size` unset (autotune does
        not render it): `MegatronFSDP` then takes S = max(1e9, 2·U) elements, U the mean unit
        (`megatron_fsdp.py`: "twice the number of elements in the FSDP modules ... the current
        FSDP module and ... the next"), prefetches S/2 and lets S of gradients wait for their
        reduce-scatter.

        Weights: `AllGatherPipeline.all_gather_params` (`param_and_grad_buffer.py`) gathers the
        module's own buckets (a layer, or the embedding or output layer), then adds the next
        units' while the prefetched elements are below S/2: ceil(max(5e8, U)/U) more layers,
        forward and backward alike. Gradients (`GradReducePipeline`): each unit's main-gradient
        bucket (in `grad_reduce_bytes`) is allocated when its backward ends and stays until
        `wait_for_previous_grad_reduce` pops it, which happens only while the queue holds more
        than S elements before the next unit's reduce-scatter is queued: floor(S/U) waiting
        units, the one just queued and the new one, plus that unit's 16-bit autograd gradients
        being copied in (`--no-gradient-accumulation-fusion`, which Megatron-FSDP requires). For
        U of at least 5e8 that is 2 layers of weights and 4 of main gradients."""
        comm = np.maximum(1e9, 2 * layer)
        prefetched = np.ceil(comm / 2 / layer)
        weights: np.ndarray = np.maximum(layer, table) + prefetched * layer
        waiting = np.floor(comm / layer)
        grads: np.ndarray = (self.grad_reduce_bytes(cfg) * (waiting + 2) * layer
                             + element_bytes(cfg) * layer)
        return Zero3Live(weights=weights, gradient_bytes=grads)

    def grad_bucket_params(
        self, cfg: AutotuneConfig, t: LayoutTable, params: np.ndarray
    ) -> np.ndarray:
        """max(40M, 1M · dp·cp) parameters: megatron-core DistributedDataParallel's default
        `bucket_size` (megatron/core/distributed/distributed_data_parallel.py)."""
        return np.maximum(40_000_000, 1_000_000 * t.shard_degree)

    def unfused_grad_accumulation(self, t: LayoutTable) -> np.ndarray:
        """Megatron-FSDP rows (zero 2-3): `validate_args` requires
        `--no-gradient-accumulation-fusion` with `--use-megatron-fsdp`, so the weight-gradient
        GEMMs write a 16-bit gradient that a second kernel adds into the fp32 `main_grad`
        (instead of the GEMM accumulating into it: `fused_weight_gradient_mlp_cuda`)."""
        unfused: np.ndarray = t.zero >= 2
        return unfused

    def tp_backward_overlaps(self, t: LayoutTable) -> np.ndarray:
        """Rows not on Megatron-FSDP (zero < 2). With tp > 1, the asynchronous all-gather and
        reduce-scatter of `LinearWithGradAccumulationAndAsyncCommunication.backward`
        (megatron/core/tensor_parallel/layers.py) "rely on CUDA_DEVICE_MAX_CONNECTIONS=1" to be
        scheduled before the GEMM they should overlap ("necessary for a speedup but not for
        correctness"), and Megatron-FSDP must run with more than one connection (arguments.py
        refuses CUDA_DEVICE_MAX_CONNECTIONS=1 with --use-megatron-fsdp): those collectives are
        charged as exposed there."""
        overlaps: np.ndarray = t.zero < 2
        return overlaps

    def grad_reduce_bytes(self, cfg: AutotuneConfig) -> int:
        """fp32: Megatron accumulates and reduces gradients in fp32 (`validate_args` for bf16),
        unless `grad_reduce_in_fp32` is off (--grad-reduce-in-bf16): 2 B."""
        return 4 if cfg.train.grad_reduce_in_fp32 else 2

    def render(
        self, cfg: AutotuneConfig, layout: Layout, options: RenderOptions
    ) -> dict[str, str]:
        """pretrain_gpt.sh and sbatch.sh."""
        return {
            "pretrain_gpt.sh": launch_script(cfg, layout, megatron_lm=options.megatron_lm,
                                             train_iters=options.train_iters,
                                             trial=options.trial),
            "sbatch.sh": render_template("megatron/sbatch.sh.j2", **header(cfg, layout),
                                         **options.sbatch),
        }

    def launch(self) -> Mapping[str, str]:
        return {
            "pretrain_gpt.sh": "on every node: MEGATRON_LM=<Megatron-LM checkout> "
                               "DATA_PATH=<dataset prefix> TOKENIZER_MODEL=<tokenizer> "
                               "CHECKPOINT_DIR=<dir> TRAIN_TOKENS=<tokens> NNODES=<nodes> "
                               "NODE_RANK=<0..nodes-1> MASTER_ADDR=<node 0> bash pretrain_gpt.sh "
                               "[extra pretrain_gpt.py flags]",
            "sbatch.sh": "cd <this folder> && MEGATRON_LM=<checkout> sbatch sbatch.sh",
        }

    def node_command(self, options: RenderOptions) -> str:
        """pretrain_gpt.sh, which reads the rendezvous variables itself."""
        return 'exec bash "$ARTIFACTS_DIR/pretrain_gpt.sh"'

    def checkpoint_format(self, layout: Layout) -> str:
        """`--ckpt-format`: fsdp_dtensor under Megatron-FSDP (arguments.py requires it), else
        Megatron-LM's default torch_dist (distributed checkpointing)."""
        return "fsdp_dtensor" if fsdp(layout) else "torch_dist"

    def carry_over(self, cfg: AutotuneConfig, old: Layout, new: Layout) -> list[str]:
        """Megatron-LM's distributed checkpoints (megatron/core/dist_checkpointing) reshard on
        load; the optimizer state of the distributed optimizer reshards over a changed tp, pp
        or ep only when it was saved fully reshardable; torch_dist converts to Megatron-FSDP's
        fsdp_dtensor with tools/checkpoint/checkpoint_inspector.py (Megatron-LM's Megatron-FSDP
        user guide, "Checkpoint Conversion from 3D-Parallel to Megatron-FSDP")."""
        before, after = self.checkpoint_format(old), self.checkpoint_format(new)
        if old == new:
            return [f"same layout: resume with CHECKPOINT_DIR=<the old run's folder> ({after})"]
        steps = []
        if before != after:
            steps.append(f"WARNING: the old run saved --ckpt-format {before}, this layout saves "
                         f"and loads {after}: the checkpoints are not interchangeable")
        if (before, after) == ("torch_dist", "fsdp_dtensor"):
            swiglu = " --swiglu" if cfg.model.gated else ""
            steps.append("convert once (the Megatron-FSDP user guide runs it on one 8-GPU node): "
                         "torchrun --nproc_per_node=8 $MEGATRON_LM/tools/checkpoint/"
                         "checkpoint_inspector.py convert-torch-dist-to-fsdp-dtensor "
                         f"<old checkpoint> <new checkpoint>{swiglu}"
                         ", then CHECKPOINT_DIR=<new checkpoint>")
        elif (before, after) == ("fsdp_dtensor", "torch_dist"):
            steps.append("Megatron-LM has no converter from fsdp_dtensor back to torch_dist that "
                         "autotune knows of: keep a Megatron-FSDP layout (zero 2/3), or restart "
                         "from an exported Hugging Face checkpoint (Megatron-Bridge)")
        else:
            steps.append(f"{after} reshards on load: CHECKPOINT_DIR=<the old run's folder>, "
                         "nothing to convert")
            moved = [name for name in ("tp", "pp", "cp", "ep", "etp")
                     if getattr(old, name) != getattr(new, name)]
            if moved and after == "torch_dist" and old.zero >= 1:
                steps.append(f"{'/'.join(moved)} changed: the distributed optimizer's state "
                             "reshards only if the old run saved it with "
                             "--dist-ckpt-optim-fully-reshardable; otherwise add --no-load-optim "
                             "--no-load-rng (the Adam moments restart)")
        return steps

    def checkout_trial_args(self, steps: int) -> list[str]:
        """pretrain_gpt.py flags appended last (argparse keeps the last value); timers at
        level 2 give the measured parts of each step (`MegatronLog.breakdown`)."""
        return ["--train-iters", str(steps), "--log-interval", "1", "--timing-log-level", "2"]

    def log_parser(self) -> MegatronLog:
        """Reads `training_log` iteration lines and `report_memory` lines."""
        return MegatronLog()

    def notes(self, cfg: AutotuneConfig, layout: Layout) -> list[str]:
        notes = []
        if fsdp(layout) and (layout.tp > 1 or layout.cp > 1):
            notes.append("Megatron-FSDP with tp/cp: CUDA_DEVICE_MAX_CONNECTIONS stays unset "
                         "(FSDP forbids 1); Megatron warns that tp/cp overlap less")
        if cfg.model.moe:
            dispatcher = token_dispatcher(cfg, layout)
            notes.append(f"MoE: the experts run on an etp·ep·pp grid ({layout.etp}·{layout.ep}·"
                         f"{layout.pp}) with the {dispatcher} token dispatcher; "
                         "--moe-grouped-gemm needs Transformer Engine and a GPU of compute "
                         "capability >= 8")
            if dispatcher == "flex":
                notes.append("flex: the DeepEP backend must be installed "
                             "(github.com/deepseek-ai/DeepEP, NVSHMEM for cross-node ep)")
        plan = pipeline_split(cfg, layout)
        if plan.chunks:
            notes.append("pipeline: no split flag fits the layers to pp·vpp chunks as evenly, "
                         "so --pipeline-model-parallel-layout lists each chunk's layers (the "
                         "embedding on the first chunk, the loss on the last)")
        elif plan.edge:
            notes.append("pipeline: layers do not divide over pp·vpp, so the first and last "
                         "stages hold their own layer counts "
                         "(--decoder-first/last-pipeline-num-layers)")
        elif plan.account_embedding or plan.account_loss:
            notes.append("pipeline: the embedding and/or the loss count as pipeline layers "
                         "(--account-for-embedding/loss-in-pipeline-split), so the first/last "
                         "stage builds one transformer layer fewer")
        return notes


def launch_script(
    cfg: AutotuneConfig,
    layout: Layout,
    *,
    megatron_lm: str = MEGATRON_LM,
    train_iters: int = TRIAL_ITERS,
    trial: bool = False,
) -> str:
    """pretrain_gpt.sh: torchrun of Megatron-LM's `pretrain_gpt.py` with every layout flag.

    The data, tokenizer, checkpoints and iteration count come from the script's variables
    (documented at its top: DATA_PATH, TOKENIZER_MODEL, CHECKPOINT_DIR, TRAIN_ITERS or
    TRAIN_TOKENS, ...). A trial script (`trial`) is a benchmark: `train_iters` iterations on
    synthetic data unless told otherwise, no warm-up; a training script runs the recipe's token
    budget (`resolve_recipe`), needs DATA_PATH (or MOCK_DATA=1) and lists in its header every
    recipe value autotune chose.

    Args:
        cfg: Model, cluster and training setup.
        layout: The layout (Megatron rules).
        megatron_lm: Megatron-LM checkout used when the environment has no MEGATRON_LM.
        train_iters: Default iterations of a trial script.
        trial: Render for a short trial on synthetic data (what autotune's runners run).
    """
    plan = pipeline_split(cfg, layout)
    recipe = resolve_recipe(cfg)
    return render_template(
        "megatron/pretrain_gpt.sh.j2", **header(cfg, layout), megatron_lm=megatron_lm,
        flag_lines=flag_lines(megatron_args(cfg, layout)),
        single_connection=needs_single_connection(cfg, layout), fsdp=fsdp(layout), plan=plan,
        trial=trial, train_iters=train_iters, vocab_size=cfg.model.vocab_size,
        tokens_per_iteration=layout.global_batch_size * cfg.train.seq_length, recipe=recipe,
        default_iters=train_iters if trial else recipe.train_iters,
        warmup_iters=0 if trial else recipe.warmup_iters, notices=position_warnings(cfg),
    )
