"""One rack file shared by every node: the inventory (and the rack's name) written once, not on 18 nodes.

Why: every node's agent needs the whole rack's inventory (who leads, which zone
endangers which node, which outlet feeds which node), and 18 hand-kept copies
drift. A node's config names the file with `inventory_file:`; the file holds
`rack:` (optional: the default of `agent.rack`) and `inventory:`. A relative path
is taken from the directory of the config that names it, so a node config and its
rack file can move together. The file is read at every load, so SIGHUP re-reads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from exporters.safe_yaml import InputError, parse_yaml, read_text_file
from exporters.validation import short_repr

RACK_FILE_KEYS = ("rack", "inventory")


class RackFileError(Exception):
    """A rack file that cannot be used; the message names the file or the field."""


def resolve(ref: Any, config_path: Path | None) -> Path:
    if not isinstance(ref, str) or not ref:
        raise RackFileError(f"inventory_file: expected a file path, got {short_repr(ref)}")
    path = Path(ref)
    if not path.is_absolute() and config_path is not None:
        path = config_path.parent / path
    return path


def with_rack_file(data: dict[str, Any], config_path: Path | None, max_bytes: int) -> tuple[dict[str, Any], Path | None]:
    """The config data with the rack file's inventory (and rack name, as a default) merged in.

    Returns the data unchanged (and None) when the config names no rack file.
    """
    if data.get("inventory_file") is None:
        return data, None
    path = resolve(data["inventory_file"], config_path)
    if "inventory" in data:
        raise RackFileError(f"inventory_file: {str(path)!r} and an inventory section both given; "
                            "keep the inventory in one place")
    try:
        rack = parse_yaml(read_text_file(path, max_bytes, "rack file"), str(path))
    except InputError as exc:
        raise RackFileError(f"inventory_file: {exc}") from None
    if not isinstance(rack, dict):
        raise RackFileError(f"{path}: expected a mapping with {' and '.join(RACK_FILE_KEYS)}, got {type(rack).__name__}")
    unknown = sorted(str(k) for k in rack if k not in RACK_FILE_KEYS)
    if unknown:
        raise RackFileError(f"{path}: unknown field {unknown[0]!r} (a rack file holds {', '.join(RACK_FILE_KEYS)})")
    merged = dict(data, inventory=rack.get("inventory") or {}, inventory_file=str(path))
    agent = data.get("agent", {})
    if "rack" in rack and isinstance(agent, dict):
        if agent.get("rack") not in (None, rack["rack"]):
            raise RackFileError(f"agent.rack: {short_repr(agent['rack'])} but the rack file {str(path)!r} "
                                f"is rack {short_repr(rack['rack'])}")
        merged["agent"] = dict(agent, rack=rack["rack"])
    return merged, path
