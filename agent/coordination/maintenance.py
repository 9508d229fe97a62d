"""Rack-wide maintenance: what this agent knows of the nodes a person put in maintenance on another agent.

Why: maintenance means "a person is working on the node, so no agent acts on
it". Journaled per agent alone, it stopped only the agent it was set on: node01
still drained node03 on a webhook alert while node03's own agent had it in
maintenance. Each coordinator carries the records of the rack here, and the
engine's `Maintenance.active(node)` asks this as well as its own journal.

- etcd: the rack key `maintenance/<node>` (no lease: it outlives the agent
  that wrote it, as a person's word should), written by the agent a person
  set it on after journaling it there, read by every agent through its watch.
- static: each agent serves its own node's maintenance (GET
  /api/v1/coordination/maintenance) and polls its peers' (`inventory.agent_urls`)
  every `coordination.maintenance_poll_seconds`; a peer is believed about its
  own node only.

Every record is validated (agent.coordination.records.maintenance_doc); one
that fails is rejected and counted, and does not put a node in maintenance:
maintenance only ever stops actions, so a forged record must never be what
silences a leak response.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Iterable

from agent.coordination.records import RecordError, Rejections, maintenance_doc

Record = dict[str, Any]  # {"by", "since", "until", "set_via", "seen_at"}


class RackMaintenance:
    """The rack's maintenance records set on other agents (validated), and the hook that publishes this agent's."""

    def __init__(self, node: str, nodes: Iterable[str], skew: float, rejections: Rejections,
                 clock: Callable[[], float] = time.time):
        self.node = node
        self.nodes = frozenset(nodes) | {node}
        self.skew = skew
        self.rejections = rejections
        self.clock = clock
        self.records: dict[str, Record] = {}
        # set by the coordinator: carries this agent's own records to the rack (node, record or None for off)
        self.publisher: Callable[[str, Record | None], None] | None = None
        # set by the engine: a record this agent wrote was removed elsewhere (maintenance off on another agent)
        self.on_cleared: Callable[[str, Record], None] | None = None

    def publish(self, node: str, record: Record | None) -> None:
        if self.publisher is not None:
            self.publisher(node, record)

    def accept(self, node: str, raw: bytes | str, key: str, revision: int = 0, peer: str | None = None) -> bool:
        """Validate and keep one record (etcd key or a peer's answer); a rejected one is counted and drops what
        was known for that node (the node is left to the agents). `peer`: the static peer that answered, who
        may speak for its own node only."""
        now = self.clock()
        try:
            rec = maintenance_doc(raw, node, self.nodes, now, self.skew)
            if peer is not None and (node != peer or rec["set_via"] != peer):
                raise RecordError("not_own_node", f"{peer}'s agent spoke for {node!r} (set via {rec['set_via']!r})")
        except RecordError as exc:
            self.rejections.error("maintenance", key, revision, exc)
            self.records.pop(node, None)
            return False
        self.records[node] = dict(rec, seen_at=now)
        return True

    def forget(self, node: str) -> None:
        """The record is gone from the rack (maintenance off, or deleted): tell the engine if it was ours."""
        rec = self.records.pop(node, None)
        if rec is not None and rec.get("set_via") == self.node and self.on_cleared is not None:
            self.on_cleared(node, rec)

    def seen(self, node: str) -> None:
        """A peer answered that its node is not in maintenance."""
        self.records.pop(node, None)

    def active(self, node: str) -> Record | None:
        """The record that puts `node` in maintenance now, if any (a passed `until` ends it by itself)."""
        rec = self.records.get(node)
        if rec is None or (rec["until"] is not None and self.clock() >= rec["until"]):
            return None
        return rec

    def view(self) -> dict[str, Record]:
        return {n: dict(r) for n in sorted(self.records) if (r := self.active(n)) is not None}
