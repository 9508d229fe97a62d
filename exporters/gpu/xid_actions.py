"""XID -> the catalogue's immediate action, the `action` label of the NVML source's XID counter.

Why apart from exporters/gpu/xid_catalogue.py (the typed loader): the NVML source runs where only its pure-Python
dependencies are (bench/gpu_check.py on a lent GPU machine copies nvidia-ml-py, PyYAML and prometheus-client,
and pydantic's compiled core cannot be copied), so this reads the generated catalogue with the bounded YAML
loader alone and checks only the two fields it uses. tests/test_xid_catalogue.py checks it agrees with the
typed loader.
"""

from __future__ import annotations

from pathlib import Path

from exporters.errors import ProfileError
from exporters.safe_yaml import InputError, load_yaml_file

DEFAULT_CATALOGUE = Path(__file__).resolve().parent.parent / "profiles" / "nvml" / "xid-catalogue.yaml"


def immediate_actions(path: Path = DEFAULT_CATALOGUE) -> dict[int, str]:
    """Code -> immediate action ("none" where the catalogue publishes none); ProfileError naming file and entry."""
    try:
        raw = load_yaml_file(path, "XID catalogue")
    except InputError as exc:
        raise ProfileError(str(exc)) from None
    xids = raw.get("xids") if isinstance(raw, dict) else None
    if not isinstance(xids, list):
        raise ProfileError(f"{path}: xids: expected a list of entries")
    out: dict[int, str] = {}
    for i, entry in enumerate(xids):
        code = entry.get("code") if isinstance(entry, dict) else None
        action = entry.get("immediate_action") if isinstance(entry, dict) else None
        if not isinstance(code, int) or isinstance(code, bool) or not (action is None or isinstance(action, str)):
            raise ProfileError(f"{path}: xids.{i}: expected an integer code and a text immediate_action (or null)")
        out[code] = action or "none"
    return out
