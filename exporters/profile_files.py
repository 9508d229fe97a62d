"""Profiles as named files: `<directory>/<name>.yaml`, safe YAML, validated, the name inside matching the file's.

One loader for every named profile format (Modbus, BACnet, Redfish), so a missing file, a bad one and a renamed
one read the same whatever the protocol, and each format keeps only its own model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, TypeVar

from exporters.errors import ProfileError
from exporters.safe_yaml import InputError, load_yaml_file

P = TypeVar("P")


def list_profiles(directory: Path) -> list[str]:
    return sorted(p.stem for p in directory.glob("*.yaml"))


def load_named(name: str, directory: Path, what: str, parse: Callable[[Any, str], P]) -> P:
    """`parse(data, path)` of `<directory>/<name>.yaml`; ProfileError naming the file when it is missing, not safe
    YAML, invalid (parse's own error) or names another profile."""
    path = directory / f"{name}.yaml"
    if not path.is_file():
        raise ProfileError(f"{what} {name!r} not found in {directory} (known: {', '.join(list_profiles(directory))})")
    try:
        data = load_yaml_file(path, what)
    except InputError as exc:
        raise ProfileError(str(exc)) from None
    profile = parse(data, str(path))
    if getattr(profile, "name", name) != name:
        raise ProfileError(f"{path}: name {getattr(profile, 'name')!r} does not match the file name {name!r}")
    return profile


def point_names(data: Any) -> Callable[[list[Any]], list[Any]]:
    """For a validation error's path: a point's name instead of its index in `points` (when the data has one)."""
    def rename(loc: list[Any]) -> list[Any]:
        if len(loc) >= 2 and loc[0] == "points" and isinstance(loc[1], int) and isinstance(data, dict):
            pts = data.get("points") or []
            if loc[1] < len(pts) and isinstance(pts[loc[1]], dict) and "name" in pts[loc[1]]:
                loc[1] = pts[loc[1]]["name"]
        return loc
    return rename
