"""Remediation primitives for ports: take a link down or up, and read its state back.

Playbook `isolate_link` (PLAYBOOKS.md) takes a failing port out of service
when the inventory marks it redundant (`isolatable`). This module only does
the act, with argument lists and never a shell: Ethernet/RoCE through
`ip link set dev X down|up`, InfiniBand through `ibportstate ... disable|enable`
on the local port. It refuses ports not marked isolatable, whatever the
caller asks, so a wrong playbook cannot cut a node's only path.

On a simulated tree (sysfs_root other than /sys) there is no kernel to ask:
the request is written to `<port dir>/sim_admin_state` ("down"/"up"), which
the simulator's link tree honours on its next update.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from exporters.links import SysfsReader, port_dir
from exporters.ports import PortSpec, as_port_spec

REAL_SYSFS = Path("/sys")
SIM_ADMIN_FILE = "sim_admin_state"


class LinkControlError(Exception):
    """The action was refused or failed; the message names the port and why."""


@dataclass(frozen=True, slots=True)
class LinkAction:
    """What was done: the command run (kernel) or the file written (simulator)."""

    port: str
    up: bool
    argv: tuple[str, ...] = ()
    written: Path | None = None


def isolate_argv(port: PortSpec, up: bool, ip: str = "ip", ibportstate: str = "ibportstate") -> list[str]:
    """The command that sets `port` down or up (argument list)."""
    if port.kind == "eth":
        return [ip, "link", "set", "dev", port.name, "up" if up else "down"]
    dev, _, num = port.name.partition("/")
    # Local port by direct route "0" (this HCA), on CA `dev` port `num`.
    return [ibportstate, "-C", dev, "-P", num, "-D", "0", num, "enable" if up else "disable"]


def _write_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def isolate_link(port: Any, up: bool, *, sysfs_root: Path | str = REAL_SYSFS, timeout: float = 5.0,
                 ip: str = "ip", ibportstate: str = "ibportstate") -> LinkAction:
    """Set an isolatable port down (`up=False`) or back up (`up=True`); raises LinkControlError.

    Blocking (runs a short command); call it from a worker thread in async code.
    """
    spec = as_port_spec(port)
    if not spec.isolatable:
        raise LinkControlError(f"port {spec.name}: not marked isolatable in the inventory; refusing to touch it")
    root = Path(sysfs_root)
    directory = port_dir(root, spec)
    if root != REAL_SYSFS:
        if not directory.is_dir():
            raise LinkControlError(f"port {spec.name}: {directory} does not exist")
        target = directory / SIM_ADMIN_FILE
        _write_atomic(target, "up\n" if up else "down\n")
        return LinkAction(spec.name, up, written=target)
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
