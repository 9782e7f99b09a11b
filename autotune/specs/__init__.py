"""What is trained, where, and how: the validated inputs of every command.

Data flow: `inputs.load_config` reads presets, YAML files and Hugging Face configs into a
`ModelSpec`, a `ClusterSpec` and a `TrainSpec`, joined as one `AutotuneConfig`.
"""

from autotune.specs.cluster import ClusterSpec
from autotune.specs.cluster import GPUSpec
from autotune.specs.config import AutotuneConfig
from autotune.specs.model import ModelSpec
from autotune.specs.model import RopeScaling
from autotune.specs.recipe import JobSpec
from autotune.specs.recipe import Recipe
from autotune.specs.recipe import RecipeSpec
from autotune.specs.recipe import resolve_recipe
from autotune.specs.train import TrainSpec
from autotune.specs.types import MAX_LAYERS
from autotune.specs.types import Activation
from autotune.specs.types import BatchSize
from autotune.specs.types import DevicesPerNode
from autotune.specs.types import ExpertCount
from autotune.specs.types import FiniteFloat
from autotune.specs.types import Framework
from autotune.specs.types import GpuMemoryGiB
from autotune.specs.types import HeadCount
from autotune.specs.types import HostMemoryGB
from autotune.specs.types import Integer
from autotune.specs.types import LayerBlock
from autotune.specs.types import LayerCount
from autotune.specs.types import LayerCountOrZero
from autotune.specs.types import LinkGBs
from autotune.specs.types import LoadBalancing
from autotune.specs.types import MemoryTBs
from autotune.specs.types import NodeCount
from autotune.specs.types import PositionEmbedding
from autotune.specs.types import Precision
from autotune.specs.types import Seed
from autotune.specs.types import SeqLength
from autotune.specs.types import Stack
from autotune.specs.types import TFlops
from autotune.specs.types import VocabSize
from autotune.specs.types import Width
from autotune.specs.types import at_most

__all__ = [
    "Activation",
    "AutotuneConfig",
    "BatchSize",
    "ClusterSpec",
    "DevicesPerNode",
    "ExpertCount",
    "FiniteFloat",
    "Framework",
    "GPUSpec",
    "GpuMemoryGiB",
    "HeadCount",
    "HostMemoryGB",
    "Integer",
    "JobSpec",
    "LayerBlock",
    "LayerCount",
    "LayerCountOrZero",
    "LinkGBs",
    "LoadBalancing",
    "MAX_LAYERS",
    "MemoryTBs",
    "ModelSpec",
    "NodeCount",
    "PositionEmbedding",
    "Precision",
    "Recipe",
    "RecipeSpec",
    "RopeScaling",
    "Seed",
    "SeqLength",
    "Stack",
    "TFlops",
    "TrainSpec",
    "VocabSize",
    "Width",
    "at_most",
    "resolve_recipe",
]
