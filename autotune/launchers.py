"""Launchers beyond Slurm: a Kubeflow PyTorchJob manifest and a SkyPilot task per layout.

Both start what sbatch.sh starts, one task per node: the framework's node command
(`Framework.node_command`: pretrain_gpt.sh for Megatron, torchrun of the training program for
DeepSpeed) with node 0 as the rendezvous master on the rendered port and the same environment
(ARTIFACTS_DIR, GPUS_PER_NODE, NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT, the NCCL and
allocator settings; for DeepSpeed TRAIN_ITERS, the token budget's iterations as sbatch.sh
computes them, and with the built-in program DATA_PATH, tokens.npy in this folder). Where each
gets them: the Kubeflow training operator sets MASTER_ADDR,
MASTER_PORT, WORLD_SIZE and RANK in every pod of a PyTorchJob (PET_NNODES / PET_NODE_RANK
when nprocPerNode is set; kubeflow/training-operator pkg/controller.v1/pytorch/envvar.go);
SkyPilot sets SKYPILOT_NUM_NODES, SKYPILOT_NODE_RANK and SKYPILOT_NODE_IPS (its first line is
node 0) on every node (docs.skypilot.co, "Distributed multi-node jobs").
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from autotune.frameworks import framework_of
from autotune.frameworks.base import RenderOptions
from autotune.layout import Layout
from autotune.specs import AutotuneConfig
from autotune.specs import resolve_recipe
from autotune.templating import MASTER_PORT

ARTIFACTS_MOUNT = "/artifacts"
"""Where the pods of the PyTorchJob see this folder (a volume the user provides)."""
IMAGE_PLACEHOLDER = "REPLACE-WITH-YOUR-TRAINING-IMAGE"
"""The container image when the config's job section names none."""
SKYPILOT_ACCELERATORS = {"a100-sxm-80gb": "A100-80GB", "h100-sxm-80gb": "H100",
                         "h200-sxm-141gb": "H200"}
"""SkyPilot's accelerator name of each GPU preset (`sky show-gpus`)."""


LAUNCH = {
    "pytorchjob.yaml": "put this folder on a PersistentVolumeClaim named autotune-artifacts, set "
                       "the image, then kubectl apply -f pytorchjob.yaml (Kubeflow training "
                       "operator)",
    "skypilot.yaml": "cd <this folder> && sky launch -c <cluster name> skypilot.yaml",
}
"""How to run each manifest (one line each, for manifest.json and README.md)."""


TOKENS_FILE = "tokens.npy"
"""The built-in program's token ids, in this folder (DATA_PATH names it; edit to move it)."""


def _environment(cfg: AutotuneConfig, layout: Layout, options: RenderOptions,
                 folder: str) -> dict[str, str]:
    """The variables every node gets (sbatch.sh exports or its scripts read); `folder` is where
    the node sees this folder."""
    env = {"GPUS_PER_NODE": str(cfg.cluster.gpus_per_node),
           "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
           "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    bundle = framework_of(cfg)
    if bundle.checkout_env is not None:  # the framework's checkout that runs the scripts
        env[bundle.checkout_env] = options.megatron_lm
    if bundle.runs_train_script:
        program = options.program
        env["TRAIN_SCRIPT"] = program.script if program is not None else "train.py"
        recipe = resolve_recipe(cfg)
        env["DEEPSPEED_TIMEOUT"] = str(recipe.distributed_timeout_minutes)
        env["TRAIN_ITERS"] = str(recipe.train_iters)  # sbatch.sh's default: the token budget
        if program is not None and program.builtin:
            env["DATA_PATH"] = f"{folder}/{TOKENS_FILE}"
    return env


def _name(layout: Layout) -> str:
    """A Kubernetes object name (RFC 1123 label: lower case, digits, '-')."""
    return re.sub(r"[^a-z0-9-]", "-", f"autotune-{layout.id}".lower())[:63].strip("-")


def pytorchjob(cfg: AutotuneConfig, layout: Layout, options: RenderOptions) -> dict[str, Any]:
    """A kubeflow.org/v1 PyTorchJob: one Master and nodes-1 Worker pods of one container each
    (named `pytorch`, as the operator requires), all GPUs of a node per pod, this folder
    mounted at /artifacts from a PersistentVolumeClaim the user creates, /dev/shm in memory."""
    env = {**_environment(cfg, layout, options, ARTIFACTS_MOUNT), "ARTIFACTS_DIR": ARTIFACTS_MOUNT}
    script = ('export NNODES="${PET_NNODES:-$WORLD_SIZE}" NODE_RANK="${PET_NODE_RANK:-$RANK}"\n'
              + framework_of(cfg).node_command(options) + "\n")
    container = {
        "name": "pytorch",
        "image": cfg.job.container_image or IMAGE_PLACEHOLDER,
        "command": ["bash", "-c", script],
        "env": [{"name": key, "value": value} for key, value in env.items()],
        "resources": {"limits": {"nvidia.com/gpu": cfg.cluster.gpus_per_node}},
        "volumeMounts": [{"name": "artifacts", "mountPath": ARTIFACTS_MOUNT},
                         {"name": "dshm", "mountPath": "/dev/shm"}],
    }
    pod = {"spec": {"containers": [container], "volumes": [
        {"name": "artifacts", "persistentVolumeClaim": {"claimName": "autotune-artifacts"}},
        {"name": "dshm", "emptyDir": {"medium": "Memory"}}]}}
    replicas = {"Master": {"replicas": 1, "restartPolicy": "OnFailure", "template": pod}}
    if cfg.cluster.nodes > 1:
        replicas["Worker"] = {"replicas": cfg.cluster.nodes - 1, "restartPolicy": "OnFailure",
                              "template": pod}
    return {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob",
            "metadata": {"name": _name(layout)},
            "spec": {"runPolicy": {"cleanPodPolicy": "None"}, "pytorchReplicaSpecs": replicas}}


def skypilot_task(cfg: AutotuneConfig, layout: Layout, options: RenderOptions) -> dict[str, Any]:
    """A SkyPilot task: `num_nodes` nodes with all their GPUs, this folder synced as the
    workdir, node 0's IP as master (`sky launch -c NAME skypilot.yaml` from this folder)."""
    gpu = cfg.cluster.gpu.name
    resources: dict[str, Any] = {
        "accelerators": {SKYPILOT_ACCELERATORS.get(gpu, gpu): cfg.cluster.gpus_per_node}}
    if cfg.job.container_image:
        resources["image_id"] = f"docker:{cfg.job.container_image}"
    run = ('export ARTIFACTS_DIR="$PWD" NNODES="$SKYPILOT_NUM_NODES" '
           'NODE_RANK="$SKYPILOT_NODE_RANK"\n'
           'MASTER_ADDR="$(printf \'%s\\n\' "$SKYPILOT_NODE_IPS" | sed -n 1p)"\n'
           'export MASTER_ADDR\n'
           + framework_of(cfg).node_command(options) + "\n")
    return {"name": _name(layout), "num_nodes": cfg.cluster.nodes, "resources": resources,
            "workdir": ".",
            "envs": {**_environment(cfg, layout, options, "."), "MASTER_PORT": str(MASTER_PORT)},
            "run": run}


class _Dumper(yaml.SafeDumper):
    """YAML without anchors (each pod template written out) and scripts as literal blocks."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def _text(dumper: yaml.SafeDumper, value: str) -> yaml.ScalarNode:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _text)


def _dump(data: dict[str, Any]) -> str:
    return yaml.dump(data, Dumper=_Dumper, sort_keys=False)


def manifests(cfg: AutotuneConfig, layout: Layout, options: RenderOptions) -> dict[str, str]:
    """pytorchjob.yaml and skypilot.yaml of a layout, as YAML text."""
    about = re.sub(r"[\x00-\x1f\x7f]", " ", f"{cfg.model.name} on {cfg.cluster.name}")
    head = f"# rendered by autotune for {about}, layout {layout.text}\n"
    return {
        "pytorchjob.yaml": head + "# kubectl apply -f pytorchjob.yaml (after creating the "
        "autotune-artifacts volume with this folder on it)\n"
        + _dump(pytorchjob(cfg, layout, options)),
        "skypilot.yaml": head + "# sky launch -c <cluster name> skypilot.yaml, from this folder\n"
        + _dump(skypilot_task(cfg, layout, options)),
    }
