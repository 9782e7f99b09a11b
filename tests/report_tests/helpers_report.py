"""Shared by the report tests (a unique module name: every test folder has a conftest)."""

from __future__ import annotations

import re

EXTERNAL = re.compile(
    r"""(?:src|href|xlink:href|action|poster|data)\s*=\s*["']?\s*(?:https?:)?//"""
    r"""|<link\b|<script\b[^>]*\bsrc|@import|url\(\s*["']?(?:https?:)?//""",
    re.IGNORECASE,
)
"""Anything in HTML that would make a browser fetch from the network."""
