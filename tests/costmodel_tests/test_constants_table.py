"""The calibration table's writer (`benchmarks/accuracy.py --fit` stores through it) keeps the
file's comments; oracle: the shipped file itself and comments written by hand here."""

from __future__ import annotations

from pathlib import Path

import yaml

from autotune.costmodel.constants import table_path
from autotune.costmodel.constants import write_table


def test_rewriting_the_shipped_table_changes_nothing(tmp_path: Path) -> None:
    """The shipped table, loaded and written back, is the same text, its comments (the header
    and the one above the `cpu:` block) included."""
    path = tmp_path / "constants.yaml"
    text = table_path().read_text()
    path.write_text(text)
    write_table(yaml.safe_load(text), path)
    assert path.read_text() == text


def test_comments_stay_above_their_keys_when_values_change(tmp_path: Path) -> None:
    """A refit that replaces a stack's values and adds a stack after the last one keeps every
    comment above the key it was written above, and the trailing one at the end."""
    path = tmp_path / "constants.yaml"
    path.write_text("# header\ndefault: {}\n# the cpu block\n# second line\ncpu:\n  a: 1.0\n"
                    "gpu:\n  stacks:\n    s:\n      b: 2.0\n# after the gpu\nother: 3\n# end\n")
    table = yaml.safe_load(path.read_text())
    table["gpu"]["stacks"]["s"] = {"b": 5.0}
    table["gpu"]["stacks"]["t"] = {"b": 6.0}
    write_table(table, path)
    assert path.read_text() == (
        "# header\ndefault: {}\n# the cpu block\n# second line\ncpu:\n  a: 1.0\n"
        "gpu:\n  stacks:\n    s:\n      b: 5.0\n    t:\n      b: 6.0\n# after the gpu\n"
        "other: 3\n# end\n")
    assert yaml.safe_load(path.read_text()) == table
