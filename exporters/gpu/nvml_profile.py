"""Loads exporters/profiles/nvml.yaml: the NVML ids the GPU exporter reads, kept out of code.

Every entry carries the pynvml constant name next to its numeric id so a
reader can check it against nvml.h, and a test checks it against the
installed nvidia-ml-py. A malformed entry is refused with its path.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporters.errors import ProfileError
from exporters.safe_yaml import InputError, load_yaml_file

DEFAULT_PROFILE = Path(__file__).resolve().parent.parent / "profiles" / "nvml.yaml"
NVLINK_METRICS = ("errors", "transmit_bytes", "receive_bytes", "bit_error_rate")
ENCODINGS = ("plain", "ber_packed")


@dataclass(frozen=True, slots=True)
class Named:
    """One label value bound to one NVML id (enum value, bit, field id)."""

    label: str
    name: str
    id: int


@dataclass(frozen=True, slots=True)
class LinkField:
    """A per-link field read with scopeId = link."""

    name: str
    id: int
    metric: str
    label: str = ""
    scale: float = 1.0
    encoding: str = "plain"  # ber_packed: NVML_NVLINK_ERROR_COUNTER_BER_GET layout, decoded by decode_ber


def decode_ber(raw: float) -> float:
    """A packed NVLink5 BER field (220, 222) as a ratio: mantissa x 10^-exponent.

    nvml.h packs it (NVML_NVLINK_ERROR_COUNTER_BER_GET): bits 0-7 the exponent,
    bits 8-11 the mantissa; the raw integer is not a rate of anything.
    """
    n = int(raw)
    return ((n >> 8) & 0xF) * 10.0 ** -(n & 0xFF)


@dataclass(frozen=True, slots=True)
class NvmlProfile:
    temperature_thresholds: tuple[Named, ...]
    clock_event_reasons: tuple[Named, ...]
    recovery_actions: tuple[Named, ...]
    gpu_fields: dict[str, Named]
    nvlink_fields: tuple[LinkField, ...]
    c2c_fields: tuple[Named, ...]
    nvlink_error_counters: tuple[Named, ...]
    xid_event_types: tuple[Named, ...]
    fabric_states: tuple[Named, ...] = ()
    fabric_health: tuple[Named, ...] = ()
    nvlink_remote_types: tuple[Named, ...] = ()

    @property
    def xid_event_mask(self) -> int:
        mask = 0
        for n in self.xid_event_types:
            mask |= n.id
        return mask

    def all_named(self) -> list[tuple[str, str, int]]:
        """(path, pynvml name, id) for every entry: what the profile test checks against pynvml."""
        out: list[tuple[str, str, int]] = []
        for section in ("temperature_thresholds", "clock_event_reasons", "recovery_actions", "c2c_fields",
                        "nvlink_error_counters", "xid_event_types", "fabric_states", "fabric_health",
                        "nvlink_remote_types"):
            out += [(f"{section}.{n.label}", n.name, n.id) for n in getattr(self, section)]
        out += [(f"gpu_fields.{k}", n.name, n.id) for k, n in self.gpu_fields.items()]
        out += [(f"nvlink_fields[{i}]", f.name, f.id) for i, f in enumerate(self.nvlink_fields)]
        return out


def _named(section: str, raw: Any) -> tuple[Named, ...]:
    if not isinstance(raw, dict) or not raw:
        raise ProfileError(f"{section}: expected a non-empty mapping of label -> {{name, id}}")
    out = []
    for label, entry in raw.items():
        name, ident = _name_id(f"{section}.{label}", entry)
        out.append(Named(str(label), name, ident))
    return tuple(out)


def _name_id(path: str, entry: Any) -> tuple[str, int]:
    if not isinstance(entry, dict):
        raise ProfileError(f"{path}: expected a mapping with name and id, got {entry!r}")
    name, ident = entry.get("name"), entry.get("id")
    if not isinstance(name, str) or not name:
        raise ProfileError(f"{path}.name: expected the pynvml constant name, got {name!r}")
    if not isinstance(ident, int) or isinstance(ident, bool) or ident < 0:
        raise ProfileError(f"{path}.id: expected a non-negative integer, got {ident!r}")
    return name, ident


def _link_fields(raw: Any) -> tuple[LinkField, ...]:
    if not isinstance(raw, list):
        raise ProfileError("nvlink_fields: expected a list")
    out = []
    for i, entry in enumerate(raw):
        path = f"nvlink_fields[{i}]"
        name, ident = _name_id(path, entry)
        metric = entry.get("metric")
        if metric not in NVLINK_METRICS:
            raise ProfileError(f"{path}.metric: expected one of {', '.join(NVLINK_METRICS)}, got {metric!r}")
        label = entry.get("label", "")
        if metric in ("errors", "bit_error_rate") and not label:
            raise ProfileError(f"{path}.label: required for metric {metric}")
        scale = entry.get("scale", 1)
        if not isinstance(scale, (int, float)) or scale <= 0:
            raise ProfileError(f"{path}.scale: expected a positive number, got {scale!r}")
        encoding = entry.get("encoding", "plain")
        if encoding not in ENCODINGS:
            raise ProfileError(f"{path}.encoding: expected one of {', '.join(ENCODINGS)}, got {encoding!r}")
        out.append(LinkField(name, ident, metric, str(label), float(scale), encoding))
    return tuple(out)


def load_profile(path: Path = DEFAULT_PROFILE) -> NvmlProfile:
    try:
        raw = load_yaml_file(path, "NVML profile")
    except InputError as e:  # names the file (and line)
        raise ProfileError(str(e)) from None
    if not isinstance(raw, dict):
        raise ProfileError(f"{path}: expected a mapping at the top")
    gpu_fields = {n.label: n for n in _named("gpu_fields", raw.get("gpu_fields"))}
    for key in ("memory_temp", "recovery_action"):
        if key not in gpu_fields:
            raise ProfileError(f"gpu_fields.{key}: missing")
    return NvmlProfile(
        temperature_thresholds=_named("temperature_thresholds", raw.get("temperature_thresholds")),
        clock_event_reasons=_named("clock_event_reasons", raw.get("clock_event_reasons")),
        recovery_actions=_named("recovery_actions", raw.get("recovery_actions")),
        gpu_fields=gpu_fields,
        nvlink_fields=_link_fields(raw.get("nvlink_fields", [])),
        c2c_fields=_named("c2c_fields", raw.get("c2c_fields")),
        nvlink_error_counters=_named("nvlink_error_counters", raw.get("nvlink_error_counters")),
        xid_event_types=_named("xid_event_types", raw.get("xid_event_types")),
        fabric_states=_named("fabric_states", raw.get("fabric_states")),
        fabric_health=_named("fabric_health", raw.get("fabric_health")),
        nvlink_remote_types=_named("nvlink_remote_types", raw.get("nvlink_remote_types")),
    )
