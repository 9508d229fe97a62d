"""Per-node maintenance: a person is working on the node, so the agent observes it but does not act on it.

Why journaled: maintenance must survive a restart or a reload (an upgrade
in the middle of a fan swap must not let the agent resume the node under
the technician), and the journal says who set it and until when. `until`
is the wall-clock time a person gave ("until 14:00"); it ends by itself.

Why rack-wide: maintenance set on one agent must stop every agent of the
rack (node01 must not drain node03 on a webhook alert while node03's
technician has it open). The coordinator's `RackMaintenance`
(agent.coordination.maintenance) carries this agent's records to the rack
and the rack's to this agent; `active(node)` asks both, so every path that
acts on a node (a step, an undo, whatever triggered it) asks one place.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from .journal import Journal


class Maintenance:
    def __init__(self, journal: Journal, clock: Callable[[], float] = time.time, node: str = ""):
        self.journal = journal
        self.clock = clock
        self.node = node  # this agent's node: where a record set here was set
        self.nodes: dict[str, dict[str, Any]] = {}  # node -> {"by", "since", "until"} set on this agent
        self.rack: Any = None  # agent.coordination.maintenance.RackMaintenance, when the coordinator has one

    def bind_rack(self, rack: Any) -> None:
        """Use the coordinator's rack records; a record this agent set that is removed on another agent ends here."""
        self.rack = rack
        if rack is not None:
            rack.on_cleared = self._cleared_by_rack

    def publish_all(self) -> None:
        """Carry every record set here to the rack (at start: the journal's; the rack may have missed them)."""
        for node, m in list(self.nodes.items()):
            self._publish(node, m)

    def _publish(self, node: str, m: dict[str, Any] | None) -> None:
        if self.rack is not None:
            self.rack.publish(node, None if m is None else {"by": m["by"], "since": m["since"], "until": m["until"],
                                                            "set_via": self.node})

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
        """Turn maintenance on (optionally until a wall time) or off; journaled with who, then told to the rack
        (etcd: off removes the rack's record, wherever it was set; static: only this node's own is served)."""
        if on and until is not None and until <= self.clock():
            raise ValueError(f"until: {until} is in the past")
        self.journal.append("maintenance", target=node, result="on" if on else "off",
                            detail={"by": who, "until": until if on else None})
        if on:
            self.nodes[node] = {"by": who, "since": self.clock(), "until": until}
        else:
            self.nodes.pop(node, None)
        self._publish(node, self.nodes.get(node))
        return self.view()

    def _cleared_by_rack(self, node: str, record: dict[str, Any]) -> None:
        """Our record was removed from the rack (off on another agent): off here too, unless a person set it on
        again here since (a newer `since` than the record that went)."""
        m = self.nodes.get(node)
        if m is not None and m["since"] <= record.get("since", 0):
            del self.nodes[node]
            self.journal.append("maintenance", target=node, result="off", detail={"by": "rack", "until": None})

    def _expire(self) -> None:
        now = self.clock()
        for node, m in list(self.nodes.items()):
            if m.get("until") is not None and now >= m["until"]:
                self.journal.append("maintenance", target=node, result="off", detail={"by": "expiry"})
                del self.nodes[node]
                self._publish(node, None)

    def _rack_record(self, node: str) -> dict[str, Any] | None:
        return self.rack.active(node) if self.rack is not None else None

    def active(self, node: str | None) -> bool:
        """In maintenance here or anywhere in the rack (the node's own agent, or the rack's etcd record)."""
        if not node:
            return False
        self._expire()
        return node in self.nodes or self._rack_record(node) is not None

    def why(self, node: str) -> str:
        """The blocked row's words: who set it and where (this agent, or the agent of the rack it was set on)."""
        m = self.nodes.get(node)
        where = "on this agent"
        if m is None:
            m = self._rack_record(node) or {}
            where = f"on {m.get('set_via', '?')}'s agent, rack-wide"
        until = f" until {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(m['until']))}" if m.get("until") else ""
        return (f"{node} is in maintenance (set by {m.get('by', '?')} {where}{until}): "
                "the agent observes but does not act")

    def view(self) -> dict[str, dict[str, Any]]:
        """Every node in maintenance, with where it was set (`set_via`) and whether this agent holds it (`local`)."""
        self._expire()
        out = {n: dict(r, local=False) for n, r in (self.rack.view() if self.rack is not None else {}).items()}
        for n, m in self.nodes.items():
            out[n] = dict(m, set_via=self.node, local=True)
        return {n: out[n] for n in sorted(out)}
