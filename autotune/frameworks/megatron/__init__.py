"""Megatron-LM / Megatron-Core: the bundle, its flags, its model arguments and its log parser.

- `bundle`: the `Megatron` framework (rules, terms, artifacts);
- `args`: a layout and a problem as Megatron-LM's command-line flags;
- `model`: the model's flags and `TransformerConfig` keyword arguments;
- `log`: the training log Megatron-LM prints, parsed.
"""

from autotune.frameworks.megatron.bundle import Megatron

__all__ = ["Megatron"]
