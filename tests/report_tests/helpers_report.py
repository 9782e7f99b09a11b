"""Shared by the report tests (a unique module name: every test folder has a conftest)."""

from __future__ import annotations

import re

EXTERNAL = re.compile(
    r"""(?:src|href|xlink:href|action|poster|data)\s*=\s*["']?\s*(?:https?:)?//"""
    r"""|<link\b|<script\b[^>]*\bsrc|@import|url\(\s*["']?(?:https?:)?//""",
    re.IGNORECASE,
)
"""Anything in HTML that would make a browser fetch from the network."""

SCHEMA = {
    "": ["schema", "kind", "inputs", "study", "best", "runners_up", "prediction", "failures",
         "scaling", "files"],
    "inputs": ["model", "params_b", "cluster", "nodes", "gpus_per_node", "gpus", "gpu",
               "gpu_memory_gb", "framework", "precision", "seq_length", "global_batch_size",
               "runner", "figures", "study", "storage"],
    "study": ["trials", "ran", "ok", "by_status"],
    "best": ["rank", "trial", "layout", "layout_id", "layout_fields", "tokens_per_s",
             "tokens_per_s_per_gpu", "step_time_s", "tflops_per_gpu", "mfu", "peak_memory_gib",
             "predicted", "error_pct", "configs"],
    "prediction": ["trials", "median_abs_error_pct", "max_abs_error_pct", "bias_pct"],
    "failures": ["status", "rule", "count", "reasons"],
    "scaling": ["mode", "layout", "base_gpus", "largest_gpus", "efficiency_at_largest",
                "flag_at_largest", "points"],
}
"""summary.json's keys by section, in order, as the README documents them ("" is the top level)."""
