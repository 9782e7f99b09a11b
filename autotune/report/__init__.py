"""Reports of tune and scale output folders, and comparisons of several (Markdown and HTML)."""

from autotune.report.compare import compare
from autotune.report.data import load_run
from autotune.report.data import write_run_json
from autotune.report.render import write_report

__all__ = ["compare", "load_run", "write_report", "write_run_json"]
