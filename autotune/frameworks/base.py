"""The framework contract: what one training framework adds to a layout, and named rules.

A `Framework` is a bundle: its named rules, how it splits layers over pipeline stages, pads the
vocabulary and holds model states (the memory terms it adds), how its collectives behave (the
communication terms it adds), its artifacts and the built-in trial program that runs them.
Everything else (the memory and step-time models, the space, render, the runners) asks the bundle
and never compares framework names.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
from collections.abc import Callable
from collections.abc import Mapping
from typing import Any
from typing import ClassVar
from typing import Literal

import numpy as np

from autotune.costmodel.constants import Constants
from autotune.costmodel.sharding import element_bytes
from autotune.costmodel.terms import StageSplit
from autotune.costmodel.terms import Zero3Fetch
from autotune.costmodel.terms import Zero3Live
from autotune.layout import BoolArray
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.specs import AutotuneConfig

Check = Callable[[AutotuneConfig, LayoutTable, Constants], BoolArray]
"""A rule's check: True where a layout of the table breaks the rule (constants for memory)."""


class RuleGroup(enum.IntEnum):
    """Where a rule stands in the order rules are applied (removals are charged to the first)."""

    GRID = 0
    TENSOR = 1
    PIPELINE = 2
    CONTEXT = 3
    EXPERT = 4
    ZERO = 5
    WORKLOAD = 8
    MEMORY = 9


@dataclasses.dataclass(frozen=True, slots=True)
class Rule:
    """A named constraint with a one-line reason.

    `reason` is a format string over m (model), c (cluster), t (train), l (layout), world and
    gpn (GPUs per node), plus any extra values the caller passes (memory rules: need_gib,
    have_gib).
    """

    name: str
    reason: str
    check: Check
    group: RuleGroup

    def explain(self, cfg: AutotuneConfig, layout: Layout, **extra: object) -> str:
        """The reason with this layout's values filled in."""
        return self.reason.format(
            m=cfg.model, c=cfg.cluster, t=cfg.train, l=layout, world=cfg.world_size,
            gpn=cfg.cluster.gpus_per_node, **extra,
        )


def rule(into: list[Rule], name: str, reason: str, group: RuleGroup) -> Callable[[Check], Check]:
    """Register a check as a named rule in the list `into` (decorator)."""

    def register(check: Check) -> Check:
        into.append(Rule(name, reason, check, group))
        return check

    return register


MEGATRON_LM = "/opt/Megatron-LM"
"""Where rendered Megatron scripts look for Megatron-LM when the environment has no
MEGATRON_LM (NVIDIA's PyTorch containers' habit)."""
TRIAL_ITERS = 20
"""Optimizer steps of a rendered trial script by default."""


@dataclasses.dataclass(frozen=True, slots=True)
class RenderOptions:
    """How the artifacts of a layout are rendered (defaults: ready to train, not a trial)."""

    directives: tuple[str, ...]
    """Checked `#SBATCH` options of sbatch.sh (`autotune.templating.sbatch_directives`)."""
    gpus: bool = True
    """sbatch.sh asks for GPUs (False on a CPU-only cluster)."""
    program: Any = None
    """DeepSpeed: the training program the launch scripts run (`TrainProgram`)."""
    megatron_lm: str = MEGATRON_LM
    """Megatron: checkout used when the environment has no MEGATRON_LM."""
    train_iters: int = TRIAL_ITERS
    """Default optimizer steps of a trial script."""
    trial: bool = False
    """Render for autotune's short trials (synthetic data by default), not for training."""
    placeholders: tuple[str, ...] = ()
    """sbatch options the site must fill (`partition`, `account`, `time`): disabled lines."""
    container_image: str = ""
    """pyxis `--container-image` of the srun tasks ('' for none)."""
    container_mounts: str = ""
    """pyxis `--container-mounts` besides the artifacts folder (comma-separated)."""

    @property
    def sbatch(self) -> dict[str, Any]:
        """The template values of sbatch.sh's shared part."""
        return {"directives": list(self.directives), "gpus": self.gpus,
                "placeholders": list(self.placeholders),
                "container_image": self.container_image,
                "container_mounts": self.container_mounts}


class Framework(abc.ABC):
    """One training framework (see the module docstring). Subclasses are stateless singletons,
    obtained with `autotune.frameworks.get_framework(name)`."""

    name: ClassVar[str]
    """The name `--framework` takes."""
    workload: ClassVar[str]
    """The built-in trial program (`autotune.workloads.WORKLOADS`)."""
    launch_script: ClassVar[str]
    """The artifact a user runs to train (it takes the framework's own checkout or script)."""
    artifacts: ClassVar[tuple[str, ...]]
    """Files `render` writes for a layout (besides layout.json and manifest.json)."""
    default_zero: ClassVar[int]
    """ZeRO stage a layout gets when the user does not say."""
    context_parallel: ClassVar[Literal["ring", "all_to_all"]]
    """How cp exchanges data: a K/V ring overlapped with attention, or head all-to-alls."""
    zero2_reduces_every_microbatch: ClassVar[bool] = False
    """ZeRO-2 reduce-scatters gradients after every micro-batch, not once per step."""
    moe_capacity_all_reduces: ClassVar[int] = 0
    """All-reduces over the ep group per MoE layer forward besides the dispatch: DeepSpeed's
    dropless gating agrees on the expert capacity (`sharded_moe.top2gating`: the largest
    expert count, all-reduced with MAX over the ep group when drop_tokens is off)."""
    fp8_amax_reduction: ClassVar[bool] = False
    """FP8 delayed scaling all-reduces the amaxes of every model chunk's forward and backward
    over the tp·dp·cp ranks of its pipeline stage (`autotune.costmodel.step_time.fp8_amax_s`)."""
    tp_async_backward: ClassVar[bool] = False
    """Tensor-parallel collectives of the backward run asynchronously under the GEMMs that do not
    need them (Megatron's LinearWithGradAccumulationAndAsyncCommunication)."""
    tp_comm_overlap: ClassVar[bool] = False
    """Can overlap tensor-parallel collectives with the GEMMs (`TrainSpec.tp_comm_overlap`)."""
    tp_splits_output_layer: ClassVar[bool] = True
    """Tensor parallelism splits the output layer over the vocabulary (Megatron's
    vocabulary-parallel output layer and cross entropy)."""
    param_gather_overlaps_forward: ClassVar[bool] = False
    """With overlapped gradient reduction, the sharded optimizer's parameter all-gather runs
    under the next forward (Megatron's --overlap-param-gather) instead of after the step."""
    tp_may_exceed_query_groups: ClassVar[bool] = False
    """tp may be a multiple of the key/value heads (they are then replicated)."""
    sequence_parallel: ClassVar[bool] = False
    """Megatron-style sequence parallelism (norms and dropout split over the sequence within a
    tensor-parallel group) exists for tp > 1."""
    runs_train_script: ClassVar[bool] = False
    """Its launch scripts run a training program the user names (`JobSpec.train_script`, or
    autotune's built-in one), rather than the framework's own entry point."""
    trains_on_cpu: ClassVar[bool] = False
    """Its trial programs run on CPU processes (gloo) as well as on GPUs."""
    checkout_env: ClassVar[str | None] = None
    """Environment variable naming the user's own checkout of the framework that
    `launch_script` runs (trials then run it instead of the built-in program), if any."""
    rules: ClassVar[tuple[Rule, ...]]
    """The framework's own rules (the shared ones live in `autotune.frameworks.common`)."""

    def default_sp(self, tp: int) -> bool:
        """Whether a layout gets sequence parallelism when the user does not say: whenever the
        framework has it and tp > 1 (Megatron-LM's recommended setting)."""
        return self.sequence_parallel and tp > 1

    def padded_vocab(self, vocab: int, tp: Any) -> Any:
        """The vocabulary as the framework pads it (tp may be a numpy array)."""
        return vocab + 0 * tp

    @abc.abstractmethod
    def split_layers(self, cfg: AutotuneConfig, pp: np.ndarray, vpp: np.ndarray) -> StageSplit:
        """Transformer layers on the first, a middle and the last stage, and legality."""

    @abc.abstractmethod
    def state_bytes(
        self, cfg: AutotuneConfig, t: LayoutTable, params: np.ndarray, live: Zero3Live,
        shard: np.ndarray,
    ) -> dict[str, np.ndarray]:
        """GPU bytes of `weights`, `gradients`, `optimizer` and offloaded `host` bytes of one
        rank that holds `params` parameters (before sharding) and, under ZeRO-3, `live` whole at
        once (`zero3_live`).

        `shard` is the degree ZeRO shards these states over: dp·cp (`t.shard_degree`) for dense
        parameters, the expert data-parallel degree for routed experts."""

    def buffer_bytes(self, cfg: AutotuneConfig, t: LayoutTable, params: np.ndarray) -> np.ndarray:
        """Communication buffers the framework allocates beyond the model states."""
        return np.zeros(len(t))

    def grad_bucket_params(
        self, cfg: AutotuneConfig, t: LayoutTable, params: np.ndarray
    ) -> np.ndarray:
        """Parameters per gradient-reduction bucket (one bucket of everything by default)."""
        per_bucket: np.ndarray = np.maximum(params, 1)
        return per_bucket

    def grad_reduce_bytes(self, cfg: AutotuneConfig) -> int:
        """Bytes per gradient element in the data-parallel reduction: the gradients' own
        dtype (DeepSpeed's `communication_data_type` defaults to it; fp32 training reduces
        4 B)."""
        return element_bytes(cfg)

    def unfused_grad_accumulation(self, t: LayoutTable) -> np.ndarray:
        """Rows whose weight gradients are accumulated by a separate kernel where the
        framework's default layouts fuse it into the weight-gradient GEMM (none by default:
        the fitted constants of a stack include its usual accumulation)."""
        return np.zeros(len(t), dtype=bool)

    def tp_backward_overlaps(self, t: LayoutTable) -> np.ndarray:
        """Rows whose backward tensor-parallel collectives run under the GEMMs that do not need
        them (`tp_async_backward`, on every layout by default)."""
        return np.full(len(t), self.tp_async_backward)

    def zero3_fetch(self, cfg: AutotuneConfig, t: LayoutTable,
                    params: np.ndarray) -> Zero3Fetch:
        """How ZeRO-3 gathers the weights: one unit per layer, prefetched under the previous
        layer (PyTorch FSDP's transformer-block wrapping, Megatron-FSDP's per-layer buckets).
        Under PyTorch FSDP the recompute reuses the backward's gather of its block."""
        return Zero3Fetch(per_module=False,
                          recompute_gathers=cfg.train.software_stack != "pytorch")

    def zero3_live(self, cfg: AutotuneConfig, t: LayoutTable, layer: np.ndarray,
                   largest: np.ndarray, table: np.ndarray) -> Zero3Live:
        """What ZeRO-3 holds whole at once on a rank whose transformer layer has `layer`
        parameters (its largest single module `largest`, its embedding or output table
        `table`): PyTorch FSDP over transformer-block units, the embedding and output their
        own units (torchtitan's `apply_fsdp`). Weights: two consecutive units, the one computing
        and the next, whose all-gather is prefetched: FSDP1's rate limiter (`limit_all_gathers`,
        default True: "GPU memory usage from only two consecutive FSDP instances",
        `torch/distributed/fsdp/fully_sharded_data_parallel.py`; `_FreeEventQueue` allows 2
        in-flight all-gathers, `_limiter_utils.py`) and its `BackwardPrefetch.BACKWARD_PRE`
        ("holds the current set of parameters, next set of parameters, and current set of
        gradients", `api.py`); FSDP2's implicit forward prefetch and its backward prefetch of
        one unit (`FSDPParamGroup._backward_prefetch`, `_fully_shard/_fsdp_param_group.py`).
        Gradients: the computing unit's, in the parameters' dtype, and one reduce-scatter input
        in the reduce dtype (`foreach_reduce` copies the unsharded gradients into it before
        freeing them, `_fsdp_collectives.py`; `reduce_scatter_max_input_buffers` 1 keeps only
        the newest)."""
        unit = np.maximum(layer, table)
        weights: np.ndarray = layer + unit
        grads: np.ndarray = (element_bytes(cfg) + self.grad_reduce_bytes(cfg)) * unit
        return Zero3Live(weights=weights, gradient_bytes=grads)

    def tp_backward_all_reduces(self, cfg: AutotuneConfig) -> int:
        """All-reduces of the input gradient per layer in the backward without sequence
        parallelism: one per column-parallel linear, Megatron's fused QKV and fc1 (2)."""
        return 2

    @abc.abstractmethod
    def render(
        self, cfg: AutotuneConfig, layout: Layout, options: RenderOptions
    ) -> dict[str, str]:
        """File name → text of `artifacts` for a layout that passed the rules."""

    @abc.abstractmethod
    def launch(self) -> Mapping[str, str]:
        """How to run each artifact (one line each, for the manifest)."""

    def notes(self, cfg: AutotuneConfig, layout: Layout) -> list[str]:
        """What a user must know to run this layout (for the manifest)."""
        return []

    def node_command(self, options: RenderOptions) -> str:
        """The bash command that starts one node's processes, as sbatch.sh's srun task does,
        from NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT, GPUS_PER_NODE and ARTIFACTS_DIR (the
        Kubernetes and SkyPilot manifests set them)."""
        raise NotImplementedError(f"{self.name} renders no launcher manifests")

    def checkpoint_format(self, layout: Layout) -> str:
        """The format the layout's training saves its checkpoints in."""
        return "native"

    def carry_over(self, cfg: AutotuneConfig, old: Layout, new: Layout) -> list[str]:
        """How to resume the checkpoints of a run on layout `old` with layout `new`, one step a
        line; a line starting with `WARNING:` when the formats differ."""
        return []

    def checkout_trial_args(self, steps: int) -> list[str]:
        """Arguments that make `launch_script` a short trial of `steps` steps, logging each."""
        raise NotImplementedError(f"{self.name} trials run the built-in program only")

    def log_parser(self) -> Any:
        """A reader of the framework's own training log (for checkout trials)."""
        raise NotImplementedError(f"{self.name} trials run the built-in program only")
