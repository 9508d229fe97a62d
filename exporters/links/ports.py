"""The watched-port description shared by the links, DOM and link-control modules.

The inventory's `Port` lives in `agent.config`, which exporters may not
import (layering); this is the same four facts as a plain dataclass, and
`as_port_specs` accepts either (or `(name, kind)` tuples) so callers pass
what they have.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable, Literal

PortKind = Literal["ib", "eth"]


@dataclass(frozen=True, slots=True)
class PortSpec:
    """One watched port: `name` is a netdev (eth) or `dev/port` (ib: `mlx5_0/1`)."""

    name: str
    kind: PortKind = "eth"
    isolatable: bool = False
    netdev: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("ib", "eth"):
            raise ValueError(f"port {self.name!r}: kind must be 'ib' or 'eth', got {self.kind!r}")
        if self.kind == "ib":
            dev, sep, num = self.name.partition("/")
            if not sep or not dev or not num.isdigit():
                raise ValueError(f"port {self.name!r}: an InfiniBand port is named <device>/<port number>")
        elif "/" in self.name or self.name in ("", ".", ".."):
            raise ValueError(f"port {self.name!r}: not a network interface name")

    @property
    def dom_netdev(self) -> str | None:
        """The interface `ethtool -m` is asked about (an IB port needs its netdev from the inventory)."""
        return self.name if self.kind == "eth" else self.netdev


def as_port_spec(port: Any) -> PortSpec:
    if isinstance(port, PortSpec):
        return port
    if isinstance(port, tuple):
        return PortSpec(*port)
    try:
        return PortSpec(port.name, port.kind, bool(getattr(port, "isolatable", False)), getattr(port, "netdev", None))
    except AttributeError:
        raise ValueError(f"not a port description: {port!r} (needs name and kind)") from None


def as_port_specs(ports: Iterable[Any]) -> list[PortSpec]:
    specs = [as_port_spec(p) for p in ports]
    names = [p.name for p in specs]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise ValueError(f"ports: {sorted(dup)} listed twice")
    return specs
