"""Per-node maintenance: a person is working on the node, so the agent observes it but does not act on it.

Why journaled: maintenance must survive a restart or a reload (an upgrade
in the middle of a fan swap must not let the agent resume the node under
the technician), and the journal says who set it and until when. `until`
is the wall-clock time a person gave ("until 14:00"); it ends by itself.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from .journal import Journal


class Maintenance:
    def __init__(self, journal: Journal, clock: Callable[[], float] = time.time):
        self.journal = journal
        self.clock = clock
        self.nodes: dict[str, dict[str, Any]] = {}  # node -> {"by", "since", "until"}

    def restore(self) -> int:
        """Replay the journal's maintenance rows (the last one per node wins)."""
        for e in self.journal.entries():
            if e.kind != "maintenance" or not e.target:
                continue
            if e.result == "on":
                self.nodes[e.target] = {"by": e.detail.get("by", "?"), "since": e.ts, "until": e.detail.get("until")}
            else:
                self.nodes.pop(e.target, None)
        self._expire()
        return len(self.nodes)

    def set(self, node: str, on: bool, who: str, until: float | None = None) -> dict[str, Any]:
        """Turn maintenance on (optionally until a wall time) or off; journaled with who."""
        if on and until is not None and until <= self.clock():
            raise ValueError(f"until: {until} is in the past")
        self.journal.append("maintenance", target=node, result="on" if on else "off",
                            detail={"by": who, "until": until if on else None})
        if on:
            self.nodes[node] = {"by": who, "since": self.clock(), "until": until}
        else:
            self.nodes.pop(node, None)
        return self.view()

    def _expire(self) -> None:
        now = self.clock()
        for node, m in list(self.nodes.items()):
            if m.get("until") is not None and now >= m["until"]:
                self.journal.append("maintenance", target=node, result="off", detail={"by": "expiry"})
                del self.nodes[node]

    def active(self, node: str | None) -> bool:
        if not node:
            return False
        self._expire()
        return node in self.nodes

    def why(self, node: str) -> str:
        m = self.nodes.get(node, {})
        until = f" until {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(m['until']))}" if m.get("until") else ""
        return f"{node} is in maintenance (set by {m.get('by', '?')}{until}): the agent observes but does not act"

    def view(self) -> dict[str, dict[str, Any]]:
        self._expire()
        return {n: dict(m) for n, m in sorted(self.nodes.items())}
