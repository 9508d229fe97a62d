"""Loads the link and optics profiles (exporters/profiles/links/*.yaml).

Sysfs counter widths, IB state codes and ethtool's DOM labels are device
knowledge, kept in data files so a new HCA or ethtool layout is a data edit.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

from exporters.errors import ProfileError
from exporters.safe_yaml import InputError, load_yaml_file

PROFILE_DIR = Path(__file__).resolve().parent.parent / "profiles" / "links"


@functools.lru_cache(maxsize=None)
def load_links_profile(name: str) -> dict[str, Any]:
    path = PROFILE_DIR / f"{name}.yaml"
    try:
        data = load_yaml_file(path, "links profile")
    except InputError as exc:  # names the file (and line)
        raise ProfileError(str(exc)) from None
    if not isinstance(data, dict):
        raise ProfileError(f"{path}: expected a mapping at the top level")
    return data


def require(data: dict[str, Any], dotted: str, kind: type, where: str) -> Any:
    """The value at `dotted` in `data`, checked to be a `kind`; else a ProfileError naming the field."""
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ProfileError(f"{where}: field {dotted!r} missing")
        node = node[part]
    if not isinstance(node, kind):
        raise ProfileError(f"{where}: field {dotted!r} must be a {kind.__name__}, got {type(node).__name__}")
    return node
