"""Remediation primitives for ports: take a link down or up, and read its state back.

Playbook `isolate_link` (PLAYBOOKS.md) takes a failing port out of service
when the inventory marks it redundant (`isolatable`). This module only does
the act, with argument lists and never a shell: Ethernet/RoCE through
`ip link set dev X down|up`, InfiniBand through `ibportstate ... disable|enable`
on the local port. It refuses ports not marked isolatable, whatever the
caller asks, so a wrong playbook cannot cut a node's only path.

The programs are argument-list prefixes from the config (default `ip` and
`ibportstate`), so the same code path works against any sysfs root: a
containerised agent reading the host's sysfs at /host/sys, or the
simulator, whose own `ip`/`ibportstate` stand-in is configured instead.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from exporters.links.links import SysfsReader
from exporters.links.ports import PortSpec, as_port_spec

REAL_SYSFS = Path("/sys")


class LinkControlError(Exception):
    """The action was refused or failed; the message names the port and why."""


@dataclass(frozen=True, slots=True)
class LinkAction:
    """What was done: the command that was run."""

    port: str
    up: bool
    argv: tuple[str, ...] = ()


def isolate_argv(port: PortSpec, up: bool, ip: Sequence[str] = ("ip",),
                 ibportstate: Sequence[str] = ("ibportstate",)) -> list[str]:
    """The command that sets `port` down or up (argument list; each program is an argv prefix)."""
    if port.kind == "eth":
        return [*ip, "link", "set", "dev", port.name, "up" if up else "down"]
    dev, _, num = port.name.partition("/")
    # Local port by direct route "0" (this HCA), on CA `dev` port `num`.
    return [*ibportstate, "-C", dev, "-P", num, "-D", "0", num, "enable" if up else "disable"]


def isolate_link(port: Any, up: bool, *, timeout: float = 5.0, ip: Sequence[str] = ("ip",),
                 ibportstate: Sequence[str] = ("ibportstate",)) -> LinkAction:
    """Set an isolatable port down (`up=False`) or back up (`up=True`); raises LinkControlError.

    Blocking (runs a short command); call it from a worker thread in async code.
    """
    spec = as_port_spec(port)
    if not spec.isolatable:
        raise LinkControlError(f"port {spec.name}: not marked isolatable in the inventory; refusing to touch it")
    argv = isolate_argv(spec, up, ip, ibportstate)
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise LinkControlError(f"port {spec.name}: {argv[0]} not found") from None
    except subprocess.TimeoutExpired:
        raise LinkControlError(f"port {spec.name}: {' '.join(argv)} did not finish in {timeout:.0f}s") from None
    if done.returncode != 0:
        raise LinkControlError(f"port {spec.name}: {' '.join(argv)} failed ({done.returncode}): "
                               f"{done.stderr.strip() or done.stdout.strip()}")
    return LinkAction(spec.name, up, argv=tuple(argv))


def read_link_state(port: Any, sysfs_root: Path | str = REAL_SYSFS) -> str:
    """The port's state for read-back after an action: "up", "down", "absent" or "unknown"."""
    sample = SysfsReader(sysfs_root).read(as_port_spec(port))
    if not sample.present:
        return "absent"
    if sample.up is None:
        return "unknown"
    return "up" if sample.up else "down"
