"""Where the data files that ship with autotune live (templates, search spaces, presets)."""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent


def resource_dir(name: str) -> Path:
    """Return the folder `templates`, `search_spaces` or `presets`.

    A wheel carries `templates/` and `search_spaces/` inside the package (`autotune/_resources/`);
    a source checkout or editable install finds them at the repository's top level.
    """
    if name == "presets":
        return _PACKAGE / "presets"
    for candidate in (_PACKAGE / "_resources" / name, _PACKAGE.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"autotune resource folder {name!r} not found next to {_PACKAGE}")
