"""The drill's link to the rack: this agent's drill document out through rack coordination, the other agents'
in, each checked (agent/drill/records.py) before anything uses it.

Why through the coordinator: a drill reaches the other agents of its zone the way a real leak controller's
poll does, over the rack's own channel (static: a feed at each agent's `inventory.agent_urls`; etcd: the key
`drill/<node>` under that node's member lease), so what proves a peer's identity there proves it here. The
coordinator hands over each peer's raw document (None when the peer's feed or key is gone) and sends this
agent's; everything else is here.

A rejected document (a garbled one, an announcement whose proof does not check out, a plan that is not valid
on this rack) is ignored for every decision and counted in
`supernode_coordination_rejected_records_total{key_kind="drill",why}` like every rack record. A peer's
announcement that goes (its feed lost, its key deleted with its lease, a rejected one) ends that peer's drill
here: a dead conductor's drill is no drill.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from agent.auth import token_map
from agent.coordination.records import RecordError, Rejections

from .records import Announced, check_announcement, check_progress, node_doc, parse_node_doc
from .scenarios import Rack

log = logging.getLogger("supernode.drill")


class RackChannel:
    """This agent's drill document (`announce`, `progress`) and the peers' (`announced`, `progress_of`)."""

    def __init__(self, coordinator: Any, node: str, nodes: list[str], tokens: Callable[[], Any],
                 rack: Callable[[], Rack], on_announce: Callable[[str, Announced | None], None],
                 clock: Callable[[], float] = time.time):
        self.coordinator, self.node, self.nodes = coordinator, node, nodes
        self.tokens, self.rack, self.on_announce, self.clock = tokens, rack, on_announce, clock
        self.skew = float(getattr(coordinator, "skew", 5.0))
        self.rejections: Rejections = getattr(coordinator, "rejections", None) or Rejections()
        self.announce: dict[str, Any] | None = None  # ours, signed
        self.progress: dict[str, Any] | None = None  # our node's part of the drill it last took part in
        self.announced: dict[str, Announced] = {}  # peer -> its drill, as checked
        self._raw: dict[str, Any] = {}  # peer -> the announcement value checked last (re-checked only on change)
        self.peer_progress: dict[str, dict[str, Any]] = {}  # peer -> its last checked part (kept when it goes)
        self._sent: bytes | None = None

    # -- out -----------------------------------------------------------------------------------------------

    def publish(self, force: bool = False) -> None:
        """Send our document to the rack when it changed (or `force`: a new session lost the old key)."""
        raw = node_doc(self.node, self.announce, self.progress)
        if raw == self._sent and not force:
            return
        self._sent = raw
        self.coordinator.publish_drill(raw)

    def resend(self) -> None:
        if self._sent is not None:
            self.coordinator.publish_drill(self._sent)

    def reachable(self) -> set[str]:
        """The peers whose agents hear this one now (their drill documents come: each follows the others)."""
        return set(self.coordinator.drill_peers())

    def parts(self, drill_id: str) -> dict[str, dict[str, Any]]:
        """The peers' parts of drill `drill_id`, as last published."""
        return {n: p for n, p in self.peer_progress.items() if p.get("drill") == drill_id}

    # -- in ------------------------------------------------------------------------------------------------

    def received(self, peer: str, raw: bytes | None, key: str, revision: int) -> None:
        """A peer's document (None: its feed or key is gone). Never raises for what the peer sent."""
        if peer == self.node:
            return
        if raw is None:
            self._drop(peer)
            return
        try:
            doc = parse_node_doc(raw, peer, self.nodes)
        except RecordError as exc:
            self.rejections.error("drill", key, revision, exc)
            self._drop(peer)
            return
        self._announcement(peer, doc.get("announce"), key, revision)
        if doc.get("progress") is not None:
            try:
                self.peer_progress[peer] = check_progress(doc["progress"], self.clock(), self.skew)
            except RecordError as exc:
                self.rejections.error("drill", key, revision, exc)

    def lost_all(self) -> None:
        """Coordination lost (a new etcd session re-reads everything): every peer's drill ends here."""
        for peer in list(self.announced):
            self._drop(peer)

    def _announcement(self, peer: str, value: Any, key: str, revision: int) -> None:
        if value is None:
            self._drop(peer)
            return
        if peer in self.announced and self._raw.get(peer) == value:
            return  # the same announcement, checked already (a peer's document changes with its progress)
        try:
            ann = check_announcement(value, peer, token_map(self.tokens()), self.rack(), self.clock(), self.skew)
        except RecordError as exc:
            self.rejections.error("drill", key, revision, exc)
            self._drop(peer)
            return
        self.announced[peer], self._raw[peer] = ann, value
        self._tell(peer, ann)

    def _drop(self, peer: str) -> None:
        self._raw.pop(peer, None)
        if self.announced.pop(peer, None) is not None:
            self._tell(peer, None)

    def _tell(self, peer: str, ann: Announced | None) -> None:
        try:
            self.on_announce(peer, ann)
        except Exception:  # the runner's bug must not stop the coordinator's feed or watch
            log.exception("drill announcement handling failed", extra={"peer": peer})
