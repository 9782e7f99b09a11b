"""Shared by the model tests: the published configs and transformers as the counting oracle.

hf_configs/<org>--<name>.json is the config.json of the Hugging Face repository <org>/<name>,
as published, less `auto_map` (remote code) and DeepSeek-V3's fp8 `quantization_config`
(storage format, not architecture).
"""

from __future__ import annotations

import json
import warnings
from functools import cache
from pathlib import Path
from typing import Any

from autotune.specs import ModelSpec
from autotune.specs.hf import hf_to_megatron

HF_CONFIGS = Path(__file__).parent / "hf_configs"
PUBLISHED = sorted(path.stem.replace("--", "/") for path in HF_CONFIGS.glob("*.json"))
"""Hugging Face repositories whose config.json is in hf_configs/."""


@cache
def published(repo: str) -> dict[str, Any]:
    """The config.json of a Hugging Face repository, from hf_configs/."""
    return json.loads((HF_CONFIGS / f"{repo.replace('/', '--')}.json").read_text())


def spec(config: dict[str, Any]) -> ModelSpec:
    """Our ModelSpec for a Hugging Face config."""
    return ModelSpec(**hf_to_megatron(config, "config.json"))


def hf_model(config: dict[str, Any]) -> Any:
    """transformers' causal-LM model for `config`, built on the meta device (no weights)."""
    import torch
    from transformers import AutoConfig
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging

    logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf_config = AutoConfig.for_model(**config)
        with torch.device("meta"):
            return AutoModelForCausalLM.from_config(hf_config)


def hf_param_count(config: dict[str, Any]) -> int:
    """Parameters of transformers' model for `config` (tied weights once, buffers not)."""
    return sum(p.numel() for p in hf_model(config).parameters())
