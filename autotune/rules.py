"""Every constraint a layout must satisfy, as a named rule with a one-line reason.

A rule's check takes the problem and a LayoutTable and returns a boolean array, True where the
layout breaks the rule. Rules run in registration order; enumeration charges each removed
candidate to the first rule it breaks. Sources for the framework rules:
../shared/reference/megatron-lm.md (Megatron-LM `arguments.py`, `transformer_config.py`) and
../shared/reference/deepspeed.md (DeepSpeed engine and config checks).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from autotune.constants import Constants
from autotune.layout import Layout
from autotune.layout import LayoutTable
from autotune.memory import GIB
from autotune.memory import estimate_memory
from autotune.memory import usable_gpu_bytes
from autotune.memory import usable_host_bytes
from autotune.specs import AutotuneConfig
from autotune.stages import split_layers

Check = Callable[[AutotuneConfig, LayoutTable, Constants], np.ndarray]
BOTH = ("megatron", "deepspeed")


@dataclasses.dataclass(frozen=True, slots=True)
class Rule:
    """A named constraint. `reason` is a format string over m (model), c (cluster), t (train), l
    (layout), world and gpn (GPUs per node)."""

    name: str
    reason: str
    check: Check
    frameworks: tuple[str, ...]

    def explain(self, cfg: AutotuneConfig, layout: Layout, **extra: object) -> str:
        """The reason with this layout's values filled in."""
        return self.reason.format(
            m=cfg.model,
            c=cfg.cluster,
            t=cfg.train,
            l=layout,
            world=cfg.world_size,
            gpn=cfg.cluster.gpus_per_node,
            **extra,
        )


RULES: dict[str, Rule] = {}
"""All rules by name, in the order they are applied."""


def rule(name: str, reason: str, frameworks: tuple[str, ...] = BOTH) -> Callable[[Check], Check]:
    """Register a rule (decorator)."""

    def register(check: Check) -> Check:
        RULES[name] = Rule(name, reason, check, frameworks)
        return check

    return register


def rules_for(framework: str) -> list[Rule]:
    """The rules that apply to a framework, in order."""
    return [r for r in RULES.values() if framework in r.frameworks]


# --- grid and batch --------------------------------------------------------------------------


@rule(
    "world_divisible_by_tp_pp_cp",
    "world = tp·pp·cp·dp: tp·pp·cp = {l.tp}·{l.pp}·{l.cp} must divide the {world} GPUs",
)
def _world(cfg, t, k):
    return (cfg.world_size % (t.tp * t.pp * t.cp) != 0) | (t.dp < 1)


@rule(
    "tp_within_node",
    "tensor parallelism needs NVLink: tp={l.tp} must divide the {gpn} GPUs of one node",
)
def _tp_node(cfg, t, k):
    return cfg.cluster.gpus_per_node % t.tp != 0


@rule(
    "gbs_divisible_by_mbs_dp",
    "global batch {t.global_batch_size} must be divisible by mbs·dp = {l.mbs}·{l.dp}",
)
def _gbs(cfg, t, k):
    return cfg.train.global_batch_size % (t.mbs * t.dp) != 0


# --- tensor parallelism ----------------------------------------------------------------------


@rule(
    "heads_divisible_by_tp",
    "num_attention_heads ({m.num_attention_heads}) must be divisible by tp ({l.tp})",
)
def _heads(cfg, t, k):
    return cfg.model.num_attention_heads % t.tp != 0


@rule(
    "query_groups_divisible_by_tp",
    "num_query_groups ({m.query_groups}) must be divisible by tp ({l.tp}) "
    "(Megatron also accepts tp divisible by the groups)",
)
def _groups(cfg, t, k):
    g = cfg.model.query_groups
    if cfg.train.framework == "megatron":
        return (g % t.tp != 0) & (t.tp % g != 0)
    return g % t.tp != 0


@rule("ffn_divisible_by_tp", "ffn_hidden_size ({m.ffn}) must be divisible by tp ({l.tp})")
def _ffn(cfg, t, k):
    return cfg.model.ffn % t.tp != 0


@rule("hidden_divisible_by_tp", "hidden_size ({m.hidden_size}) must be divisible by tp ({l.tp})")
def _hidden(cfg, t, k):
    return cfg.model.hidden_size % t.tp != 0


@rule(
    "sp_needs_tp",
    "sequence parallelism splits along tp: it needs tp > 1 (Megatron turns it off)",
    ("megatron",),
)
def _sp_tp(cfg, t, k):
    return t.sp & (t.tp == 1)


@rule(
    "seq_divisible_by_tp_with_sp",
    "with sequence parallelism seq/cp ({t.seq_length}/{l.cp}) must be divisible by tp ({l.tp})",
    ("megatron",),
)
def _seq_sp(cfg, t, k):
    return t.sp & ((cfg.train.seq_length // t.cp) % t.tp != 0)


@rule(
    "deepspeed_no_megatron_sp",
    "DeepSpeed has no Megatron-style sequence parallelism (use cp for Ulysses)",
    ("deepspeed",),
)
def _ds_sp(cfg, t, k):
    return t.sp


# --- pipeline --------------------------------------------------------------------------------


@rule(
    "layers_divisible_by_pp_vpp",
    "num_layers ({m.num_layers}) must split over pp·vpp = {l.pp}·{l.vpp} chunks, evenly or with "
    "smaller first/last stages as Megatron allows",
)
def _layers(cfg, t, k):
    return ~split_layers(cfg, t.pp, t.vpp).legal


@rule(
    "vpp_needs_pp",
    "virtual pipeline stages interleave a pipeline: vpp={l.vpp} needs pp > 1",
    ("megatron",),
)
def _vpp_pp(cfg, t, k):
    return (t.vpp > 1) & (t.pp == 1)


@rule(
    "interleave_microbatches_divisible_by_pp",
    "Megatron's interleaved schedule runs micro-batches in groups of pp: micro-batches "
    "gbs/(mbs·dp) = {t.global_batch_size}/({l.mbs}·{l.dp}) must be a multiple of pp ({l.pp})",
    ("megatron",),
)
def _interleave_m(cfg, t, k):
    return (t.vpp > 1) & (t.gas % t.pp != 0)


@rule(
    "deepspeed_no_virtual_pipeline",
    "DeepSpeed's pipeline engine has no interleaved schedule: vpp must be 1",
    ("deepspeed",),
)
def _ds_vpp(cfg, t, k):
    return t.vpp > 1


# --- context parallelism ---------------------------------------------------------------------


@rule(
    "seq_divisible_by_2cp",
    "context parallelism splits each sequence into 2·cp chunks: seq ({t.seq_length}) must be "
    "divisible by 2·cp = {l.cp}·2",
    ("megatron",),
)
def _seq_cp(cfg, t, k):
    return (t.cp > 1) & (cfg.train.seq_length % (2 * t.cp) != 0)


@rule(
    "seq_divisible_by_cp",
    "Ulysses splits each sequence over cp ranks: seq ({t.seq_length}) must be divisible by "
    "cp ({l.cp})",
    ("deepspeed",),
)
def _seq_ulysses(cfg, t, k):
    return cfg.train.seq_length % t.cp != 0


@rule(
    "ulysses_heads_divisible_by_cp",
    "Ulysses re-partitions heads over cp: query ({m.num_attention_heads}) and key/value "
    "({m.query_groups}) heads per tp rank must be divisible by cp ({l.cp})",
    ("deepspeed",),
)
def _ulysses_heads(cfg, t, k):
    m = cfg.model
    return ((m.num_attention_heads // t.tp) % t.cp != 0) | ((m.query_groups // t.tp) % t.cp != 0)


@rule("deepspeed_pipeline_alone",
      "DeepSpeed's pipeline engine takes no mpu, so AutoTP (tp) and Ulysses (cp) groups cannot "
      "join it: pp={l.pp} needs tp=1 and cp=1", ("deepspeed",))
def _ds_pp_alone(cfg, t, k):
    return (t.pp > 1) & ((t.tp > 1) | (t.cp > 1))


@rule("deepspeed_autotp_without_ulysses",
      "DeepSpeed AutoTP and Ulysses each build their own groups over the same ranks and cannot be "
      "combined (tp={l.tp}, cp={l.cp})", ("deepspeed",))
def _ds_tp_cp(cfg, t, k):
    return (t.tp > 1) & (t.cp > 1)


# --- ZeRO, distributed optimizer and offload -------------------------------------------------


@rule(
    "zero_ge2_with_pp",
    "DeepSpeed: ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism (zero={l.zero}, "
    "pp={l.pp})",
    ("deepspeed",),
)
def _ds_zero_pp(cfg, t, k):
    return (t.zero >= 2) & (t.pp > 1)


@rule("offload_needs_zero", "CPU offload moves ZeRO-partitioned states: offload needs zero >= 1")
def _offload_zero(cfg, t, k):
    return (t.offload >= 1) & (t.zero == 0)


@rule(
    "param_offload_needs_zero3", "parameter offload (offload_param) needs ZeRO-3", ("deepspeed",)
)
def _param_offload(cfg, t, k):
    return (t.offload == 2) & (t.zero < 3)


@rule(
    "megatron_no_param_offload",
    "Megatron-LM offloads optimizer states only (--optimizer-cpu-offload), not parameters",
    ("megatron",),
)
def _mlm_param_offload(cfg, t, k):
    return t.offload == 2


@rule(
    "offload_needs_distributed_optimizer",
    "Megatron --optimizer-cpu-offload needs --use-precision-aware-optimizer, which needs the "
    "distributed optimizer (zero=1)",
    ("megatron",),
)
def _mlm_offload(cfg, t, k):
    return (t.offload >= 1) & (t.zero != 1)


@rule(
    "megatron_fsdp_without_pp",
    "Megatron-FSDP (zero=2/3: --use-megatron-fsdp) is not tested upstream with pipeline "
    "parallelism (no test or example); autotune keeps it to pp=1",
    ("megatron",),
)
def _fsdp_pp(cfg, t, k):
    return (t.zero >= 2) & (t.pp > 1)


# --- memory ----------------------------------------------------------------------------------


@rule(
    "memory_fits",
    "peak memory {need_gib:.1f} GiB exceeds the usable {have_gib:.1f} GiB of a "
    "{c.gpu.memory_gb:g} GB GPU (after the fragmentation margin)",
)
def _memory(cfg, t, k):
    return estimate_memory(cfg, t, k)["total"] > usable_gpu_bytes(cfg, k)


@rule(
    "host_memory_fits",
    "offloaded states need {need_gib:.1f} GiB of host memory per node; {have_gib:.1f} GiB usable",
)
def _host(cfg, t, k):
    return estimate_memory(cfg, t, k)["host"] > usable_host_bytes(cfg, k)


def violations(cfg: AutotuneConfig, layout: Layout, k: Constants) -> list[tuple[str, str]]:
    """Every rule (name, explained reason) that one layout breaks, in order."""
    table = LayoutTable.from_layouts([layout])
    memory = None
    found = []
    for r in rules_for(cfg.train.framework):
        if r.name in ("memory_fits", "host_memory_fits") and found:
            break  # memory of a structurally broken layout means nothing
        with np.errstate(divide="ignore", invalid="ignore"):  # dp = 0 when the grid is broken
            if not bool(r.check(cfg, table, k)[0]):
                continue
        extra: dict[str, float] = {}
        if r.name in ("memory_fits", "host_memory_fits"):
            memory = memory or estimate_memory(cfg, table, k)
            host = r.name == "host_memory_fits"
            extra["need_gib"] = float(memory["host" if host else "total"][0]) / GIB
            extra["have_gib"] = (usable_host_bytes if host else usable_gpu_bytes)(cfg, k) / GIB
        found.append((r.name, r.explain(cfg, layout, **extra)))
    return found
