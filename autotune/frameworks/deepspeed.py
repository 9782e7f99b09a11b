"""DeepSpeed: its rules, model terms and artifacts.

Rules were found by training each combination for real with DeepSpeed 0.19 (see the built-in
trial program `autotune.workloads.deepspeed_gpt`) and read off `deepspeed/runtime/engine.py`,
`runtime/pipe/engine.py`, `runtime/zero/` and `moe/` (0.19.8). Mixture-of-Experts layers are
`deepspeed.moe.layer.MoE(ep_size=ep)`: they train with ZeRO 0-2, pipelines and AutoTP (on
GPUs), not with ZeRO-3 or Ulysses, and never split an expert's matrices (etp = 1). Memory:
DeepSpeed's own estimators (`estimate_zero2/3_model_states_mem_needs`: 2 B of 16-bit weights
plus 18 B/param of 16-bit and fp32 gradients, fp32 master weights and Adam moments) and its
bucket buffers. Artifacts:
ds_config.json (keys DeepSpeed 0.19 reads: `runtime/config.py`, `runtime/zero/config.py`,
`runtime/precision_config.py`, `runtime/tensor_parallel/config.py`; unknown top-level keys would
be ignored silently), launch_deepspeed.sh, hostfile and sbatch.sh.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
from collections.abc import Mapping
from typing import Any
from typing import ClassVar

import numpy as np

from autotune.costmodel.constants import Constants
from autotune.costmodel.sharding import element_bytes
from autotune.costmodel.sharding import largest_module_params
from autotune.costmodel.sharding import params_on_rank
from autotune.costmodel.terms import StageSplit
from autotune.costmodel.terms import Zero3Fetch
from autotune.costmodel.terms import Zero3Live
from autotune.frameworks.base import Framework
from autotune.frameworks.base import RenderOptions
from autotune.frameworks.base import Rule
from autotune.frameworks.base import RuleGroup
from autotune.frameworks.base import rule
from autotune.layout import BoolArray
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.specs import AutotuneConfig
from autotune.specs import resolve_recipe
from autotune.specs.inputs import position_warnings
from autotune.templating import header
from autotune.templating import render_template
from autotune.templating import version

ZERO3_PREFETCH_FRACTION = 0.25
"""ZeRO-3 prefetch bucket as a fraction of the reduce bucket (rendered and counted alike)."""
ZERO3_MAX_LIVE_PARAMETERS = 1_000_000_000
"""stage3_max_live_parameters the rendered ds_config.json sets (DeepSpeed's default)."""
ZERO3_MAX_REUSE_DISTANCE = 1_000_000_000
"""stage3_max_reuse_distance: not rendered, DeepSpeed's default (runtime/zero/config.py)."""

DEEPSPEED_RULES: list[Rule] = []
"""DeepSpeed's own rules."""


@rule(DEEPSPEED_RULES, "deepspeed_no_megatron_sp",
      "DeepSpeed has no Megatron-style sequence parallelism (use cp for Ulysses)",
      RuleGroup.TENSOR)
def _ds_sp(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    return t.sp


@rule(DEEPSPEED_RULES, "deepspeed_no_virtual_pipeline",
      "DeepSpeed's pipeline engine has no interleaved schedule: vpp must be 1",
      RuleGroup.PIPELINE)
def _ds_vpp(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    return t.vpp > 1


@rule(DEEPSPEED_RULES, "seq_divisible_by_cp",
      "Ulysses splits each sequence over cp ranks: seq ({t.seq_length}) must be divisible by "
      "cp ({l.cp})",
      RuleGroup.CONTEXT)
def _seq_ulysses(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    broken: BoolArray = cfg.train.seq_length % t.cp != 0
    return broken


@rule(DEEPSPEED_RULES, "ulysses_heads_divisible_by_cp",
      "Ulysses re-partitions heads over cp: query ({m.num_attention_heads}) and key/value "
      "({m.query_groups}) heads per tp rank must be divisible by cp ({l.cp})",
      RuleGroup.CONTEXT)
def _ulysses_heads(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    m = cfg.model
    broken: BoolArray = ((m.num_attention_heads // t.tp) % t.cp != 0) | (
        (m.query_groups // t.tp) % t.cp != 0
    )
    return broken


@rule(DEEPSPEED_RULES, "deepspeed_pipeline_alone",
      "DeepSpeed's pipeline engine takes no mpu, so AutoTP (tp) and Ulysses (cp) groups cannot "
      "join it: pp={l.pp} needs tp=1 and cp=1",
      RuleGroup.CONTEXT)
def _ds_pp_alone(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    return (t.pp > 1) & ((t.tp > 1) | (t.cp > 1))


@rule(DEEPSPEED_RULES, "deepspeed_autotp_without_ulysses",
      "DeepSpeed AutoTP and Ulysses each build their own groups over the same ranks and cannot be "
      "combined (tp={l.tp}, cp={l.cp})",
      RuleGroup.CONTEXT)
def _ds_tp_cp(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    return (t.tp > 1) & (t.cp > 1)


@rule(DEEPSPEED_RULES, "zero_ge2_with_pp",
      "DeepSpeed: ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism (zero={l.zero}, "
      "pp={l.pp})",
      RuleGroup.ZERO)
def _ds_zero_pp(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    return (t.zero >= 2) & (t.pp > 1)


@rule(DEEPSPEED_RULES, "deepspeed_moe_without_ulysses",
      "DeepSpeed's MoE layer reads the Ulysses group as tensor parallel "
      "(parallel_state_sp.get_model_parallel_world_size) and drops tokens it takes for "
      "duplicates (moe/sharded_moe.py:686), mixing up the cp ranks' different tokens: a MoE "
      "model needs cp=1 (cp={l.cp})",
      RuleGroup.EXPERT)
def _ds_moe_cp(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    return cfg.model.moe & (t.cp > 1)


@rule(DEEPSPEED_RULES, "deepspeed_no_expert_tensor_parallel",
      "DeepSpeed's MoE layer keeps each expert whole on its rank (tensor-sliced experts need "
      "Megatron-DeepSpeed's own parallel layers): etp must be 1, not {l.etp}",
      RuleGroup.EXPERT)
def _ds_etp(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    return t.etp > 1


@rule(DEEPSPEED_RULES, "deepspeed_moe_without_zero3",
      "DeepSpeed: 'Native DeepSpeed MoE is not supported with ZeRO Stage 3' "
      "(runtime/engine.py:2215): a MoE model needs zero <= 2",
      RuleGroup.ZERO)
def _ds_moe_zero3(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    broken: BoolArray = cfg.model.moe & (t.zero == 3)
    return broken


@rule(DEEPSPEED_RULES, "param_offload_needs_zero3",
      "parameter offload (offload_param) needs ZeRO-3",
      RuleGroup.ZERO)
def _param_offload(cfg: AutotuneConfig, t: LayoutTable, k: Constants) -> BoolArray:
    broken: BoolArray = (t.offload == 2) & (t.zero < 3)
    return broken


def bucket_elements(params_per_rank: np.ndarray | int) -> np.ndarray:
    """ZeRO reduce/all-gather bucket size in elements (what the rendered ds_config.json uses)."""
    return np.minimum(200_000_000, np.maximum(params_per_rank, 1_000_000))


def cpu_offload_buffers(t: LayoutTable, partition: np.ndarray, largest: np.ndarray,
                        w: int) -> np.ndarray:
    """Bytes the optimizer offload allocates beside the offloaded states, on the offload
    device (host memory; a CPU worker's own), for `partition` parameters per rank and the
    largest parameter's `largest` (DeepSpeed 0.19.8, `runtime/zero/`):

    - ZeRO 1-2 (`stage_1_and_2.py`): the 16-bit copy of the partition that the step writes
      before the weights (`param_buffer_of_bit16_for_cpu_offload_groups`, `__init__`), with
      gradient accumulation a copy of each owned gradient (`accumulated_grads_in_cpu`,
      `async_accumulate_grad_in_cpu_via_gpu`), and two staging buffers of the largest
      parameter (`temp_grad_buffer_for_cpu_offload` and `_for_gpu_offload`);
    - ZeRO-3 (`stage3.py`, `initialize_optimizer_states`): the fp32 `gradient_buffer` of the
      partition, which the offload allocates although each subgroup's gradient gets its own.
    """
    offloaded = t.offload >= 1
    accumulates = t.micro_batches > 1
    staged = np.where(t.zero >= 3, 4 * partition,
                      w * partition * (1 + accumulates) + 2 * w * largest)
    buffers: np.ndarray = offloaded * staged
    return buffers


@dataclasses.dataclass(frozen=True, slots=True)
class TrainProgram:
    """The DeepSpeed training program the launch scripts run (the user's script by default).

    The scripts run `script` (or `python -m script` when `module`), then `args`, then
    `config_flag DIR/ds_config.json` and, when `layout_flag` is set, `layout_flag DIR/layout.json`,
    then whatever the script itself was given. The environment variable TRAIN_SCRIPT overrides
    `script` at run time.
    """

    script: str = "train.py"
    """Path of the training script (or a module name with `module`)."""
    module: bool = False
    """Run `script` as a Python module (`--module` for torchrun and the deepspeed launcher)."""
    args: tuple[str, ...] = ()
    """Arguments before the config flag."""
    config_flag: str = "--deepspeed_config"
    """Flag that names ds_config.json (`deepspeed.add_config_arguments` reads this one)."""
    layout_flag: str | None = None
    """Flag that names layout.json, for programs that read it (the built-in trial workload)."""
    builtin: bool = False
    """autotune's own program (`--train-script builtin`): the scripts' headers say how to run
    it (DATA_PATH, TRAIN_ITERS) instead of what a script of the user's must do."""

    def context(self) -> dict[str, Any]:
        """The template values of the program."""
        return {
            "train_script": self.script,
            "train_module": self.module,
            "train_args": list(self.args),
            "config_flag": self.config_flag,
            "layout_flag": self.layout_flag,
            "builtin_program": self.builtin,
        }


BUILTIN = "builtin"
"""The `--train-script` value that names autotune's own training program."""
BUILTIN_PROGRAM = TrainProgram(script="autotune.workloads.deepspeed_gpt", module=True,
                               args=("--train",), config_flag="--ds-config",
                               layout_flag="--layout", builtin=True)
"""The built-in workload as a training program: it reads problem.json beside ds_config.json,
DATA_PATH's tokens and TRAIN_ITERS (`autotune.workloads.deepspeed_gpt`, `--train`)."""


BUILTIN_LAUNCH = {
    "launch_deepspeed.sh": "edit hostfile (ssh-reachable hosts), then DATA_PATH=<tokens.npy> "
                           "TRAIN_ITERS=<steps> bash launch_deepspeed.sh",
    "sbatch.sh": "cd <this folder> && DATA_PATH=<tokens.npy> sbatch sbatch.sh",
}
"""How to launch a folder rendered with the built-in program (manifest.json, README.md)."""


def job_program(script: str | None) -> TrainProgram | None:
    """The program a config's `job.train_script` names: the built-in one, a script, or None."""
    if script is None:
        return None
    return BUILTIN_PROGRAM if script == BUILTIN else TrainProgram(script=script)


class DeepSpeed(Framework):
    """DeepSpeed: ZeRO 0-3 with offload, PipelineModule (pp), AutoTP (tp), Ulysses (cp)."""

    name = "deepspeed"
    workload = "deepspeed_gpt"
    launch_script = "launch_deepspeed.sh"
    artifacts = ("ds_config.json", "launch_deepspeed.sh", "hostfile", "sbatch.sh")
    default_zero = 0
    context_parallel = "all_to_all"
    runs_train_script = True
    zero2_reduces_every_microbatch = True
    trains_on_cpu = True
    moe_capacity_all_reduces = 1
    tp_splits_output_layer = False
    """AutoTP's presets (`module_inject/autotp_config.py`, e.g. `AutoTPPresets.llama`) split
    the attention and MLP projections only: the output layer, its loss and the embedding run
    whole on every tensor-parallel rank."""
    rules: ClassVar[tuple[Rule, ...]] = tuple(DEEPSPEED_RULES)

    def split_layers(self, cfg: AutotuneConfig, pp: np.ndarray, vpp: np.ndarray) -> StageSplit:
        """PipelineModule's balanced counts (within one of each other); each bounded by the
        larger, ceil(layers / pp)."""
        num_layers = cfg.model.num_layers
        legal = pp <= num_layers
        heavy = np.where(legal, -(-num_layers // pp), 0).astype(np.int64)
        return StageSplit(first=heavy, middle=heavy.copy(), last=heavy.copy(), legal=legal)

    def state_bytes(
        self, cfg: AutotuneConfig, t: LayoutTable, params: np.ndarray, live: Zero3Live,
        shard: np.ndarray,
    ) -> dict[str, np.ndarray]:
        """w-byte weights and grads (w = 2, or 4 in fp32 training: `element_bytes`) + an fp32
        grad partition; fp32 master + Adam m, v (12 B), sharded over dp·cp (experts: edp,
        DeepSpeed's expert data-parallel group) by ZeRO; CPU offload moves the optimizer (and
        ZeRO-3 parameters). Without ZeRO, fp32 training steps the torch optimizer on the weights
        themselves: no fp32 copies (grads 4 B, Adam m, v 8 B); so does PyTorch FSDP's ZeRO-3
        (`TrainSpec.stack` pytorch) on its fp32 shards (16 B per sharded parameter). On CPU
        workers the offload
        device "cpu" is the worker's own memory, so the offloaded states stay in the process
        (and no host bytes are counted apart)."""
        n, z, off = shard, t.zero, t.offload
        w = element_bytes(cfg)
        copies = 0 if w == 4 else 4  # the fp32 grad and master copies of 16-bit training
        # PyTorch FSDP (ZeRO-3) keeps the shards of the parameters themselves in fp32 and the
        # optimizer steps them: no 16-bit shard beside a master copy (FSDP1's low-precision
        # shard `_mp_shard` is freed once gathered, `_flat_param.py` `post_unshard`; FSDP2
        # casts its fp32 shard for each all-gather), so its fully sharded shard is 4 B and the
        # optimizer's Adam m, v alone 8 B
        fsdp = cfg.train.software_stack == "pytorch"
        shard_width, sharded_optimizer = (4, 8) if fsdp else (w, 12)
        weights = np.where(z >= 3, shard_width * params / n + w * live.weights, w * params)
        grads = np.select(
            [z == 0, z == 1, z == 2],
            [(w + copies) * params, w * params + 4 * params / n, (w + 4) * params / n],
            4 * params / n + live.gradient_bytes,
        )
        optimizer = np.where(z == 0, (8 + copies) * params,
                             np.where(z >= 3, sharded_optimizer, 12) * params / n)
        weights = np.where(off == 2, w * live.weights, weights)
        offloaded = off >= 1
        grads = np.where(offloaded, np.where(z >= 3, live.gradient_bytes, 0.0), grads)
        optimizer = np.where(offloaded, 0.0, optimizer)
        host = offloaded * 16 * params / n + (off == 2) * 2 * params / n
        if cfg.cluster.cpu_processes:
            grads = grads + offloaded * 4 * params / n  # the fp32 gradient partition
            optimizer = optimizer + offloaded * 12 * params / n  # fp32 master, Adam m and v
            weights = weights + (off == 2) * w * params / n  # the parameters' partition
            host = 0 * host
        return {"weights": weights, "gradients": grads, "optimizer": optimizer, "host": host}

    def zero3_live(self, cfg: AutotuneConfig, t: LayoutTable, layer: np.ndarray,
                   largest: np.ndarray, table: np.ndarray) -> Zero3Live:
        """DeepSpeed's coordinator gathers by module: the one computing, whole, and what it
        prefetches, at most `stage3_prefetch_bucket_size` parameters (the prefetch bucket
        `buffer_bytes` counts) and none once `stage3_max_live_parameters` are gathered
        (`PartitionedParameterCoordinator.fetch_sub_module`, deepspeed 0.19
        `runtime/zero/partitioned_param_coordinator.py`); the largest module's weights and its
        gradient in the training dtype, as DeepSpeed's own estimator counts them
        (`estimate_zero3_model_states_mem_needs`: 4 B per parameter of the largest layer). The
        PyTorch FSDP runs this framework also expresses (`TrainSpec.stack` pytorch) hold their
        transformer-block units (`Framework.zero3_live`)."""
        if cfg.train.software_stack != "deepspeed":
            return super().zero3_live(cfg, t, layer, largest, table)
        return Zero3Live(weights=largest, gradient_bytes=element_bytes(cfg) * largest)

    def tp_backward_all_reduces(self, cfg: AutotuneConfig) -> int:
        """AutoTP wraps each Hugging Face projection on its own: every column-parallel
        `LinearLayer` (q, k and v; gate and up, or up alone) all-reduces its input gradient in
        `ColumnParallel.backward` (`module_inject/layers.py`), synchronously."""
        return 3 + (2 if cfg.model.gated else 1)

    def grad_reduce_bytes(self, cfg: AutotuneConfig) -> int:
        """DeepSpeed reduces in the gradients' dtype (`communication_data_type`); the PyTorch
        FSDP runs this framework also expresses (`TrainSpec.stack` pytorch) reduce 16-bit
        training's gradients in fp32, 4 B: FSDP `MixedPrecision(reduce_dtype=torch.float32)`,
        as Composer's `mixed_precision: DEFAULT` (LLM Foundry; `get_mixed_precision` from
        v0.16) and torchtitan's `mixed_precision_reduce` default set it; with
        `grad_reduce_in_fp32` off in the 16-bit dtype (Composer's `mixed_precision: PURE`:
        `reduce_dtype` is the precision's, `get_mixed_precision` @ v0.14.1 and v0.16.4)."""
        if cfg.train.software_stack == "pytorch":
            width = element_bytes(cfg)
            return max(width, 4) if cfg.train.grad_reduce_in_fp32 else width
        return super().grad_reduce_bytes(cfg)

    def grad_bucket_params(
        self, cfg: AutotuneConfig, t: LayoutTable, params: np.ndarray
    ) -> np.ndarray:
        """The reduce bucket the rendered ds_config.json sets (`bucket_elements`)."""
        return bucket_elements(params)

    def zero3_fetch(self, cfg: AutotuneConfig, t: LayoutTable,
                    params: np.ndarray) -> Zero3Fetch:
        """DeepSpeed's coordinator with the rendered ds_config.json (one gather per weight,
        prefetch and reuse within the live and reuse limits, reduce buckets); without
        overlap_comm its gathers run on the compute stream (runtime/zero/parameter_offload.py:
        `__allgather_stream` is the default stream unless overlap_comm). The PyTorch FSDP runs
        this framework also expresses (`TrainSpec.stack` pytorch) gather by layer."""
        if cfg.train.software_stack != "deepspeed":
            return super().zero3_fetch(cfg, t, params)
        bucket = bucket_elements(params)
        return Zero3Fetch(per_module=True, overlap=cfg.train.overlap_grad_reduce,
                          prefetch_numel=ZERO3_PREFETCH_FRACTION * bucket,
                          max_live_numel=ZERO3_MAX_LIVE_PARAMETERS,
                          max_reuse_numel=ZERO3_MAX_REUSE_DISTANCE, reduce_bucket_numel=bucket,
                          list_collectives=cfg.train.zero3_list_collectives)

    def buffer_bytes(self, cfg: AutotuneConfig, t: LayoutTable, params: np.ndarray) -> np.ndarray:
        """overlap_comm double-buffers the reduce bucket; ZeRO-3 adds a prefetch bucket (in the
        training dtype's width); CPU workers also hold the offload's staging buffers
        (`cpu_offload_buffers`). PyTorch FSDP's ZeRO-3 (`TrainSpec.stack` pytorch) has neither
        bucket: its reduce-scatter input is the unit's (`zero3_live`)."""
        bucket = bucket_elements(params)
        w = element_bytes(cfg)
        reduce = np.where(t.zero >= 1, 2 * w * bucket, 0.0)
        buffers = reduce + np.where(t.zero >= 3, w * ZERO3_PREFETCH_FRACTION * bucket, 0.0)
        if cfg.train.software_stack == "pytorch":
            buffers = np.where(t.zero >= 3, 0.0, buffers)
        if cfg.cluster.cpu_processes:
            largest = largest_module_params(cfg.model, t,
                                            self.padded_vocab(cfg.model.vocab_size, t.tp))
            buffers = buffers + cpu_offload_buffers(t, params / t.shard_degree, largest, w)
        return buffers

    def render(
        self, cfg: AutotuneConfig, layout: Layout, options: RenderOptions
    ) -> dict[str, str]:
        """ds_config.json, launch_deepspeed.sh, hostfile and sbatch.sh."""
        program = (options.program or TrainProgram()).context()
        shared = {**header(cfg, layout), **program, "obligations": self.notes(cfg, layout),
                  "recipe": resolve_recipe(cfg), "notices": position_warnings(cfg),
                  "tokens_per_iteration": layout.global_batch_size * cfg.train.seq_length}
        ds_config = config(cfg, layout)
        if options.trial:  # a few steps at the peak lr: a warm-up from 0 would train nothing,
            ds_config.pop("scheduler", None)  # and verify's loss curves could not differ
        return {
            "ds_config.json": json.dumps(ds_config, indent=2) + "\n",
            "launch_deepspeed.sh": render_template("deepspeed/launch_deepspeed.sh.j2", **shared),
            "hostfile": hostfile(cfg),
            "sbatch.sh": render_template("deepspeed/sbatch.sh.j2", **shared, **options.sbatch),
        }

    def launch(self) -> Mapping[str, str]:
        return {
            "ds_config.json": "deepspeed.initialize(model=..., config='ds_config.json') in the "
                              "training script (or --deepspeed_config through "
                              "deepspeed.add_config_arguments)",
            "launch_deepspeed.sh": "edit hostfile (ssh-reachable hosts), then "
                                   "TRAIN_SCRIPT=<your script> bash launch_deepspeed.sh "
                                   "[script args]",
            "sbatch.sh": "cd <this folder> && TRAIN_SCRIPT=<your script> sbatch sbatch.sh",
        }

    def node_command(self, options: RenderOptions) -> str:
        """torchrun of the training program with ds_config.json, node 0 as master (the
        processes, config and layout flags of sbatch.sh's torchrun); TRAIN_SCRIPT names the
        program."""
        program = options.program or TrainProgram()
        parts = ['exec torchrun --nproc_per_node "$GPUS_PER_NODE" --nnodes "$NNODES"',
                 '--node_rank "$NODE_RANK" --master_addr "$MASTER_ADDR"',
                 '--master_port "$MASTER_PORT"']
        if program.module:
            parts.append("--module")
        parts.append('"$TRAIN_SCRIPT"')  # the manifests set it (default: the program's script)
        parts += [shlex.quote(arg) for arg in program.args]
        parts.append(f'{shlex.quote(program.config_flag)} "$ARTIFACTS_DIR/ds_config.json"')
        if program.layout_flag is not None:
            parts.append(f'{shlex.quote(program.layout_flag)} "$ARTIFACTS_DIR/layout.json"')
        return " ".join(parts)

    def checkpoint_format(self, layout: Layout) -> str:
        """engine.save_checkpoint's ZeRO checkpoint, partitioned by this layout's ranks."""
        return f"zero{layout.zero} (dp {layout.dp}, tp {layout.tp}, pp {layout.pp})"

    def carry_over(self, cfg: AutotuneConfig, old: Layout, new: Layout) -> list[str]:
        """A ZeRO checkpoint holds one partition per rank of the layout that saved it; DeepSpeed's
        universal checkpoint (deepspeed/checkpoint/ds_to_universal.py, loaded with
        `"checkpoint": {"load_universal": true}`, runtime/constants.py) re-partitions it for
        another dp, tp, pp or ZeRO stage."""
        if old == new:
            return ["same layout: engine.load_checkpoint(<the old run's folder>) as it is"]
        grid = ("dp", "tp", "pp", "cp", "zero", "ep")
        if all(getattr(old, name) == getattr(new, name) for name in grid):
            return ["same partitioning (dp, tp, pp, cp, zero, ep): engine.load_checkpoint(<the "
                    "old run's folder>) as it is"]
        return [
            f"WARNING: the old run's checkpoint is partitioned for {self.checkpoint_format(old)}, "
            f"this layout needs {self.checkpoint_format(new)}: convert it to a universal "
            "checkpoint first",
            "python -m deepspeed.checkpoint.ds_to_universal --input_folder <old>/<tag> "
            "--output_folder <old>/<tag>_universal (then write <tag>_universal into <old>/latest)",
            'add "checkpoint": {"load_universal": true} to ds_config.json for the first run, '
            "then engine.load_checkpoint(<old>)",
        ]

    def notes(self, cfg: AutotuneConfig, layout: Layout) -> list[str]:
        """What the user's training script must do for this layout: ds_config.json sets the
        engine, not the model code, the data sharding or the process groups (DeepSpeed 0.19:
        runtime/pipe/, sequence/layer.py, module_inject/auto_tp.py, moe/layer.py)."""
        notes = ["initialize: deepspeed.initialize(model=..., model_parameters=..., config=<this "
                 "folder>/ds_config.json) builds the optimizer and the lr scheduler of the recipe "
                 "(pass no optimizer of your own); call engine.step() once per micro-batch"]
        if cfg.train.precision == "fp8":
            notes.append("fp8: DeepSpeed has no fp8 config; ds_config.json trains in bf16, use "
                         "Transformer Engine layers in the model for fp8 GEMMs")
        if layout.tp > 1:
            notes.append("tp: AutoTP needs Hugging Face / Llama-style module names or "
                         "tensor_parallel.preset_model; give deepspeed.initialize an mpu whose "
                         "data-parallel size is dp so train_batch_size = mbs·dp·gas holds")
        if layout.tp > 1 or layout.cp > 1:
            notes.append(f"data: shard the samples by the data-parallel rank (0..{layout.dp - 1}, "
                         "the mpu's get_data_parallel_rank()), not the global rank: the "
                         f"{layout.tp * layout.cp} ranks of one replica must read the same batch "
                         "(DistributedSampler(num_replicas=dp, rank=dp_rank))")
        if layout.cp > 1:
            notes.append("cp: Ulysses needs deepspeed.sequence.layer.DistributedAttention around "
                         "the attention core and deepspeed.runtime.sequence_parallel."
                         "parallel_state_sp as mpu; each cp rank feeds its 1/cp slice of every "
                         "sequence")
        if layout.pp > 1:
            notes.append(f"pp: build deepspeed.pipe.PipelineModule(layers=..., num_stages="
                         f"{layout.pp}, partition_method='uniform', loss_fn=...) and train with "
                         "engine.train_batch(data_iter), which runs the gas micro-batches itself")
        if cfg.model.moe:
            notes.append("MoE: build each MoE MLP as deepspeed.moe.layer.MoE(hidden_size, expert, "
                         f"num_experts={cfg.model.num_experts}, ep_size={layout.ep}, "
                         f"k={cfg.model.moe_router_topk}); DeepSpeed groups ep consecutive ranks "
                         "and splits the optimizer's MoE parameter groups itself")
        if layout.recompute == "full" and layout.pp == 1:
            notes.append("recompute=full: checkpoint every decoder layer in the model code "
                         "(deepspeed.checkpointing.checkpoint or torch.utils.checkpoint, e.g. "
                         "model.gradient_checkpointing_enable() in transformers); ds_config.json "
                         "cannot turn it on outside a PipelineModule")
        return notes


def _params_per_rank(cfg: AutotuneConfig, layout: Layout) -> int:
    """Parameters on the most loaded rank before ZeRO sharding (first or last stage)."""
    table = LayoutTable.from_layouts([layout])
    split = DeepSpeed().split_layers(cfg, table.pp, table.vpp)
    single = np.array([layout.pp == 1])
    vocab = np.array([cfg.model.vocab_size])
    first = params_on_rank(cfg.model, table, vocab, split.first, np.array([True]), single)
    last = params_on_rank(cfg.model, table, vocab, split.last, single, np.array([True]))
    return int(max(first[0], last[0]))


def config(cfg: AutotuneConfig, layout: Layout) -> dict[str, Any]:
    """The ds_config.json of a layout that passed the DeepSpeed rules, as a dict.

    Batch: train_batch_size = mbs·dp·gas, so DeepSpeed's data-parallel size must be dp: pass an
    mpu whose `get_data_parallel_world_size()` is dp when tp (AutoTP) shrinks it (PipelineModule's
    grid does this for pp; for cp alone DeepSpeed divides the world by `sequence_parallel_size`).
    `pipeline.stages`/`partition` are what the training code gives `PipelineModule(num_stages=,
    partition_method=)`; the engine itself reads `activation_checkpoint_interval`.

    The recipe (`resolve_recipe`) becomes the optimizer and a `scheduler`
    (deepspeed/runtime/lr_schedules.py): cosine is `WarmupCosineLR` (linear warm-up from 0,
    cosine down to min_lr/lr of the peak; no warm-up: one step from the peak in each, since they
    refuse 0), linear `WarmupDecayLR` (DeepSpeed decays it to 0, not
    to min_lr), constant `WarmupLR`; each counts `decay_iters` optimizer steps, warm-up included.
    """
    bucket = int(bucket_elements(_params_per_rank(cfg, layout)))
    recipe = resolve_recipe(cfg)
    context: dict[str, Any] = {
        "train_batch_size": layout.global_batch_size,
        "micro_batch": layout.mbs,
        "gas": layout.gas,
        "zero": layout.zero,
        "overlap_comm": cfg.train.overlap_grad_reduce,
        "bucket": bucket,
        "prefetch_bucket": int(bucket * ZERO3_PREFETCH_FRACTION),
        "persistence_threshold": 10 * cfg.model.hidden_size,
        "max_live_parameters": ZERO3_MAX_LIVE_PARAMETERS,
        "offload_optimizer": layout.offload != "none",
        "offload_param": layout.offload == "optimizer+params",
        "precision": cfg.train.precision,
        "pp": layout.pp,
        "tp": layout.tp,
        "cp": layout.cp,
        "full_recompute": layout.recompute == "full",
        "lr": recipe.lr,
        "betas": [recipe.adam_beta1, recipe.adam_beta2],
        "eps": recipe.adam_eps,
        "weight_decay": recipe.weight_decay,
        "clip_grad": recipe.clip_grad,
        "decay_style": recipe.decay_style,
        "warmup_iters": recipe.warmup_iters,
        "decay_iters": recipe.decay_length,
        "min_ratio": recipe.min_lr / recipe.lr,
        "steps_per_print": 1,
        # AutoTP finds Llama-style module names with the llama preset
        "autotp_preset": "llama" if cfg.model.gated else None,
        # on CPU processes use torch's AdamW: DeepSpeed's fused CPU Adam is a 90 s JIT build
        "torch_adam": cfg.cluster.cpu_processes,
    }
    config: dict[str, Any] = json.loads(render_template("deepspeed/ds_config.json.j2", **context))
    return config


def hostfile(cfg: AutotuneConfig) -> str:
    """A DeepSpeed hostfile template: `node-N slots=G` per node (`localhost` for one node).

    Replace the names with the cluster's hosts; the deepspeed launcher reaches them over ssh.
    """
    return render_template("deepspeed/hostfile.j2", nodes=cfg.cluster.nodes,
                           gpus_per_node=cfg.cluster.gpus_per_node, version=version())
