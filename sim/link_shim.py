"""The simulator's stand-in for `ip link set` and `ibportstate`: the agent's link isolation runs it.

Why a program and not a special case in the agent: the agent always runs
a command to isolate a port, whatever its sysfs root. The demo configures
`remediation.link_control.ip` (and `ibportstate`) as
`[python, -m, sim.link_shim, TREE_ROOT]`; this program then takes the
very argument list the real tool would get and leaves the wanted state in
`<port dir>/sim_admin_state`, which the simulated link tree honours on its
next update, as the kernel honours `ip link set`.

    python -m sim.link_shim ROOT link set dev NAME up|down
    python -m sim.link_shim ROOT -C DEV -P NUM -D 0 NUM enable|disable
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from sim.links_tree import SIM_ADMIN_FILE


def port_dir_and_state(root: Path, argv: list[str]) -> tuple[Path, str]:
    """Which port directory and which state ("up"/"down") an `ip` or `ibportstate` argument list asks for."""
    if argv[:3] == ["link", "set", "dev"] and len(argv) == 5 and argv[4] in ("up", "down"):
        return root / "class" / "net" / argv[3], argv[4]
    if len(argv) == 8 and argv[0] == "-C" and argv[2] == "-P" and argv[7] in ("enable", "disable"):
        return root / "class" / "infiniband" / argv[1] / "ports" / argv[3], "up" if argv[7] == "enable" else "down"
    raise ValueError(f"unsupported arguments: {' '.join(argv)}")


def main(args: list[str]) -> int:
    if len(args) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    root = Path(args[0])
    try:
        directory, state = port_dir_and_state(root, args[1:])
    except ValueError as exc:
        print(f"link_shim: {exc}", file=sys.stderr)
        return 2
    if not directory.is_dir():
        print(f"link_shim: {directory} does not exist", file=sys.stderr)
        return 1
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{SIM_ADMIN_FILE}.")
    with os.fdopen(fd, "w") as f:
        f.write(state + "\n")
    os.replace(tmp, directory / SIM_ADMIN_FILE)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
