"""The simulated IMEX domain: each tray's IMEX daemon and the connections between them, as a file the fake
`nvidia-imex-ctl` (sim/imex_ctl.py) reads.

Why a file and not an HTTP route: the agent runs a program for IMEX, as it would on a GB200 tray, and the program
must answer at once from the simulator's state. The device `imex` writes `<root>/domain.json` (which daemons are
down, which connections are lost) whenever a fault changes it, written to a temporary name and renamed, so the
tool never reads half a file. Faults: `imex-down --node N` (N's daemon stops: UNAVAILABLE, its connections
INVALID, the domain DEGRADED) and `imex-peer-down --node N --peer P` (the connection between N's and P's daemons
is lost both ways: DISCONNECTED, the domain DEGRADED).
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sim.faults import FaultError, Param, fault
from sim.imex_ctl import STATE_FILE
from sim.rack import RackModel

if TYPE_CHECKING:
    from sim.server import Simulator



def node_ip(index: int) -> str:
    """A tray's address on the simulated IMEX network (what nodes_config.cfg would list)."""
    return f"10.114.0.{11 + index}"


class SimImexDomain:
    """Simulated device `imex`: no network endpoint, one state file every node's fake tool reads."""

    def __init__(self, model: RackModel, root: Path | str):
        self.name = "imex"
        self.root = Path(root)
        self.nodes = list(model.nodes)
        self._lock = threading.Lock()
        self.down: set[str] = set()
        self.lost: set[frozenset[str]] = set()
        self._written = ""

    def describe(self) -> dict[str, Any]:
        return {"root": str(self.root)}

    async def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.write_files()

    def update(self, model: RackModel, write: bool = True) -> None:
        if write:
            self.write_files()

    async def stop(self) -> None:
        return None

    def check_node(self, node: str, what: str = "node") -> str:
        if node not in self.nodes:
            raise FaultError(f"{what}: {node!r} is not a simulated node ({', '.join(self.nodes)})")
        return node

    def set_down(self, node: str, down: bool = True) -> str:
        with self._lock:
            (self.down.add if down else self.down.discard)(self.check_node(node))
        return f"IMEX daemon on {node} {'down' if down else 'up'}"

    def set_lost(self, node: str, peer: str, lost: bool = True) -> str:
        self.check_node(node)
        self.check_node(peer, "peer")
        if node == peer:
            raise FaultError("peer: must differ from node")
        with self._lock:
            (self.lost.add if lost else self.lost.discard)(frozenset((node, peer)))
        return f"IMEX connection {node} <-> {peer} {'lost' if lost else 'restored'}"

    def clear_faults(self) -> None:
        with self._lock:
            self.down.clear()
            self.lost.clear()

    def state(self) -> dict[str, Any]:
        with self._lock:
            return {"nodes": [{"name": n, "host": node_ip(i), "down": n in self.down}
                              for i, n in enumerate(self.nodes)],
                    "lost": sorted(sorted(pair) for pair in self.lost)}

    def write_files(self) -> None:
        text = json.dumps(self.state(), sort_keys=True)
        if text == self._written or not self.root.is_dir():
            return
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=f".{STATE_FILE}.")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, self.root / STATE_FILE)
        self._written = text


def imex_domain(sim: "Simulator") -> SimImexDomain:
    dev = sim.devices.get("imex")
    if not isinstance(dev, SimImexDomain):
        raise FaultError("imex: this simulator runs no IMEX domain")
    return dev


NODE = Param("node", str, True, None, "the node whose IMEX daemon (or connection) fails")


@fault("imex-down", "A tray's IMEX daemon stops: nvidia-imex-ctl -q reads UNAVAILABLE there, every other tray sees "
       "it UNAVAILABLE with its connections INVALID, and the domain DEGRADED.", NODE)
def _imex_down(sim: "Simulator", p: dict[str, Any]) -> str:
    return imex_domain(sim).set_down(p["node"])


@fault("imex-peer-down", "The connection between two trays' IMEX daemons is lost (both ways DISCONNECTED); the "
       "domain reads DEGRADED.", NODE, Param("peer", str, True, None, "the other node of the lost connection"))
def _imex_peer_down(sim: "Simulator", p: dict[str, Any]) -> str:
    return imex_domain(sim).set_lost(p["node"], p["peer"])
