"""The simulator's stand-in for `nvidia-imex-ctl`: answers `-q` and `-N [-j] [-H]` from the simulated domain.

The demo (and the tests) configure `sources.imex.command` as `[python, -m, sim.imex_ctl, ROOT, NODE]`; the agent
adds the very arguments it gives the real tool. The answer is the simulator's IMEX state (sim/imex.py writes
ROOT/domain.json) in the layouts NVIDIA documents (exporters/profiles/imex/): `-q` one word, `-N -j` the JSON
payload, `-N` the formatted table.

    python -m sim.imex_ctl ROOT NODE -q
    python -m sim.imex_ctl ROOT NODE -N [-j] [-H]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

STATE_FILE = "domain.json"  # what sim/imex.py writes; kept here so the tool imports nothing of the simulator

LEGEND = """Connectivity Table Legend:
I - Invalid - Node wasn't reachable, no connection status available
N - Never Connected
R - Recovering - Connection was lost, but clean up has not yet been triggered.
D - Disconnected - Connection was lost, and clean up has been triggered.
A - Authenticating - If GSSAPI enabled, client has initiated mutual authentication.
!V! - Version mismatch, communication disabled.
!M! - Node map mismatch, communication disabled.
C - Connected - Ready for operation
"""
LETTERS = {"CONNECTED": "C", "INVALID": "I", "DISCONNECTED": "D"}
TIMESTAMP = "12/3/2026 20:31:07.412"
VERSION = "570.172"


def connection(state: dict[str, Any], a: dict[str, Any], b: dict[str, Any]) -> str:
    if a["down"] or b["down"]:
        return "INVALID"
    if sorted((a["name"], b["name"])) in state["lost"]:
        return "DISCONNECTED"
    return "CONNECTED"


def domain(state: dict[str, Any], hostnames: bool) -> dict[str, Any]:
    """The `-N -j` payload: every node's status and its view of every connection, the domain's state."""
    nodes = state["nodes"]
    out: dict[str, Any] = {}
    for i, a in enumerate(nodes):
        entry: dict[str, Any] = {"status": "UNAVAILABLE" if a["down"] else "READY", "host": a["host"],
                                 "version": VERSION,
                                 "connections": {str(j): {"host": b["host"], "status": connection(state, a, b),
                                                          "changed": False} for j, b in enumerate(nodes)}}
        if hostnames:
            entry["hostName"] = a["name"]
        out[str(i)] = entry
    broken = any(n["down"] for n in nodes) or bool(state["lost"])
    every = all(n["down"] for n in nodes)
    return {"nodes": out, "timestamp": TIMESTAMP, "status": "DOWN" if every else "DEGRADED" if broken else "UP"}


def table(payload: dict[str, Any]) -> str:
    """The formatted `-N` output: legend, node table, connectivity matrix, domain state."""
    nodes = payload["nodes"]
    lines = [LEGEND, TIMESTAMP, "Nodes:"]
    for i, n in nodes.items():
        host = n["host"] + (f" ({n['hostName']})" if "hostName" in n else "")
        lines.append(f"Node #{i:<3} - {host:<15} - {n['status']:<20} - Version: {n['version']}")
    lines.append("")
    lines.append(" Nodes From\\To  " + "".join(f"{i:<4}" for i in nodes))
    for i, n in nodes.items():
        lines.append(f"{i:>8}        " + "".join(f"{LETTERS.get(c['status'], '?'):<4}"
                                                 for c in n["connections"].values()).rstrip())
    lines += ["", f"Domain State: {payload['status']}"]
    return "\n".join(lines) + "\n"


def answer(state: dict[str, Any], node: str, args: list[str]) -> str:
    me = next((n for n in state["nodes"] if n["name"] == node), None)
    if me is None:
        raise ValueError(f"node {node!r} is not in the simulated domain")
    if args == ["-q"]:
        return ("UNAVAILABLE" if me["down"] else "READY") + "\n"
    if args and args[0] == "-N" and set(args[1:]) <= {"-j", "-H"}:
        payload = domain(state, "-H" in args)
        return json.dumps(payload) + "\n" if "-j" in args else table(payload)
    raise ValueError(f"unsupported arguments: {' '.join(args)} (this stand-in answers -q and -N [-j] [-H])")


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        print(__doc__, file=sys.stderr)
        return 2
    root, node, args = Path(argv[0]), argv[1], argv[2:]
    try:
        state = json.loads((root / STATE_FILE).read_text())
    except (OSError, ValueError) as exc:  # what the real tool says when it cannot reach the command service
        print(f"nvidia-imex-ctl: cannot read the IMEX domain state ({exc})", file=sys.stderr)
        return 1
    try:
        sys.stdout.write(answer(state, node, args))
    except ValueError as exc:
        print(f"nvidia-imex-ctl: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
