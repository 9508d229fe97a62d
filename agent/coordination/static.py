"""The static backend (and the behaviour without a `coordination` section): the config decides, nothing fails over.

The leader is `remediation.rack_leader`, else the first inventory node. A
shared device is polled by the nodes `coordination.pollers` lists for it,
else by every node that lists it (what an agent without coordination does).
A node left out of a device's pollers reads that device's polls from a
poller's fact stream, at the poller's `inventory.agent_urls` (TLS: `status.peer_tls`): a fact there is
taken only when it is that peer's own poll (its node is the peer) of a device `pollers` names the peer for,
and its payload is one this agent's own source of that device could publish (agent.coordination.facts).
Guardrails are counted by each agent alone (the blast radius from the scheduler's own view), approvals are
each agent's own, and no write is fenced: two agents configured as leader would both drive the valves. This
is the single-node and lab choice; a rack whose leader may die runs `etcd`.

Maintenance is rack-wide here too, from the node's own agent: each agent serves whether its own node is in
maintenance (GET /api/v1/coordination/maintenance, open like the status page's node card) and asks its peers every
`coordination.maintenance_poll_seconds`. A peer is believed about its own node only: node03's agent can put node03
in maintenance for the rack, never node01 (maintenance of another node set on an agent holds on that agent alone).
A peer that does not answer keeps its last known state, which ends by its `until`.

The rack's NVLink attribution (a rack-scale NVLink domain: inventory.switch_trays) runs here too, each agent from
its peers' feeds: every agent serves its tray's link vector (GET /api/v1/coordination/links, a stream of one
line a change and every refresh, agent.coordination.line_feed) and follows every peer's at `inventory.agent_urls`;
a vector is taken only as the peer's own tray's (agent.coordination.link_vectors.decode), and a peer whose feed
is lost is silent (agent.coordination.attribution). The configured leader opens the switch incident. The same
feeds carry each tray's load and cooling summaries (agent.coordination.tray_cooling) on any rack with peers.

A fault drill of a zone reaches the zone's other agents the same way (agent/drill/rack.py): every agent serves
its drill document (GET /api/v1/coordination/drill, a stream of one line a change) and follows every peer's; a
document is taken only as the peer's own, and a drill announcement only with its admin token's proof. A peer
whose feed is lost has no drill here.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import zlib
from typing import Any

from agent.coordination.exchange import FactExchange, detector_counters
from agent.coordination.facts import encode, parse
from agent.coordination.line_feed import LineFeed, follow
from agent.coordination.link_share import INTERVAL, LinkShare
from agent.coordination.maintenance import RackMaintenance, Record
from agent.coordination.records import RecordError, Rejections, as_object, parse_json
from agent.coordination.settings import Coordination
from agent.coordination.shared import SharedDevices, shared_devices

log = logging.getLogger("supernode.coordination")
MAINTENANCE_PATH = "/api/v1/coordination/maintenance"
LINKS_PATH = "/api/v1/coordination/links"
DRILL_PATH = "/api/v1/coordination/drill"
MAX_MAINTENANCE_ANSWER = 16 << 10


class LocalRack:
    """What the remediation engine asks the rack, answered from the config alone."""

    backend = "static"
    shared = False  # approvals and guardrails are this agent's own
    maintenance: RackMaintenance | None = None  # the rack's maintenance records (set by the static coordinator)

    def __init__(self, leader: str, node: str):
        self.leader = leader
        self.node = node

    def is_leader(self) -> bool:
        return self.leader == self.node

    def role(self) -> str:
        return "leader" if self.is_leader() else "follower"

    def leader_node(self) -> str | None:
        return self.leader

    def up(self) -> bool:
        return True

    async def check_drain(self, node: str, drained: list[str], rack_nodes: int, guard: Any) -> tuple[str, str] | None:
        return guard.check_blast_radius(drained, rack_nodes, node)

    async def reserve_action(self, kind: str, guard: Any) -> tuple[str, str] | None:
        return None

    def pending_added(self, pending: Any, incident: Any) -> None:
        return None

    def pending_removed(self, pending: Any, approved: bool) -> None:
        return None

    def incident_closed(self, incident: Any) -> None:
        return None

    def approval_candidates(self, ident: str, incidents: list[Any]) -> tuple[bool, list[dict[str, Any]]]:
        return False, []

    async def approve(self, rids: list[str], who: str, subject: str | None = None, all_: bool = False) -> list[str]:
        return []

    def pending_view(self) -> list[dict[str, Any]]:
        return []

    async def reset_breaker(self, who: str) -> bool:
        return False

    def breaker_open(self) -> bool:
        return False

    def bind(self, engine: Any) -> None:
        return None

    async def fence(self, what: str) -> None:
        return None

    def fence_now(self) -> None:
        return None


def static_leader(loaded) -> str:
    cfg = loaded.config
    return cfg.remediation.rack_leader or (cfg.inventory.nodes[0] if cfg.inventory.nodes else cfg.agent.node)


class StaticCoordinator:
    """Pollers and leader from the config; see the module docstring.

    A node that `pollers` leaves out of a device reads that device from its pollers: each agent serves the
    polls it makes of shared devices as a stream (GET /api/v1/coordination/facts, one JSON fact a line, the
    latest of each first) and subscribes to the streams of the pollers it needs (`inventory.agent_urls`).
    No failover: a poller that dies leaves its device unread by the nodes that relied on it (their leak
    watch says "unknown", `source_down`) until it is back.
    """

    backend = "static"

    def __init__(self, loaded):
        cfg = loaded.config
        self.node = cfg.agent.node
        self.shared: SharedDevices = shared_devices(cfg.inventory)
        coord = cfg.coordination
        self.pollers: dict[str, list[str]] = dict(coord.pollers) if coord is not None else {}
        self.peers: dict[str, str] = dict(cfg.inventory.agent_urls)  # coordination.peers folded in (deprecated)
        self.peer_tls = cfg.status.peer_tls
        self.rack = LocalRack(static_leader(loaded), self.node)
        # Every static poller publishes every poll: a wet one is taken from whichever poller read it first.
        skew = (coord or Coordination()).max_clock_skew_seconds
        heartbeat = (coord or Coordination()).fact_heartbeat_seconds
        self.facts = FactExchange(self.node, self.shared.jobs, cfg.sources.stale_after_intervals, time.time,
                                  self.shared.safety, skew, heartbeat, detector_counters())
        self.feed = LineFeed("fact")  # our polls of shared devices, to the nodes that read them from us
        self.tasks: list[asyncio.Task] = []
        self.streams_up: dict[str, bool] = {}  # peer -> its stream is open
        self.rejections = Rejections()  # records from peers that failed validation (agent.coordination.records)
        self.maintenance = RackMaintenance(self.node, cfg.inventory.nodes,
                                           coord.max_clock_skew_seconds if coord is not None else 5.0, self.rejections)
        self.maintenance.publisher = self._own_maintenance
        self.rack.maintenance = self.maintenance
        self.own_maintenance: Record | None = None  # what this agent serves: its own node's maintenance
        self.maintenance_poll = coord.maintenance_poll_seconds if coord is not None else 10.0
        self.peer_timeout = cfg.status.peer_timeout_seconds
        self.maintenance_reach: dict[str, bool] = {}  # peer -> its last maintenance answer came
        # The rack's tray vectors (NVLink attribution on an NVLink domain; everywhere the trays' load and cooling
        # summaries): every peer's vector from its feed. With no peer to follow (no inventory.agent_urls) there is
        # nothing to share: each tray judges its own links and plates.
        self.stale_after = cfg.sources.stale_after_intervals
        self.links = LinkShare.of(cfg, cfg.inventory.nodes, skew, time.time) \
            if any(n != self.node for n in self.peers) else None
        self.link_feed = LineFeed("links")
        self.link_streams_up: dict[str, bool] = {}  # peer -> its links feed is open
        # Fault drills (agent/drill/rack.py): this agent's drill document served, every peer's followed.
        self.skew = skew
        self.drill_channel: Any = None  # set by the drill runner before start
        self.drill_feed = LineFeed("drill")
        self.drill_streams_up: dict[str, bool] = {}  # peer -> its drill feed is open

    def polls(self, device: str) -> bool:
        nodes = self.pollers.get(device)
        return nodes is None or self.node in nodes

    def gate_runners(self, runners: dict[str, Any]) -> None:
        self.facts.runners = runners
        for job_id, runner in runners.items():
            device = self.shared.jobs.get(job_id)
            if device is not None and not self.polls(device):
                runner.gate = _not_ours

    def hidden(self) -> frozenset[tuple[str, str]]:
        return frozenset(tuple(j.split("/", 1)) for j, d in self.shared.jobs.items() if not self.polls(d))

    def idle(self) -> frozenset[tuple[str, str]]:
        """Sources held but not polled for a role: none (only the configured leader has the other trays' sources)."""
        return frozenset()

    def up(self) -> bool:
        return True

    def is_leader(self) -> bool:
        return self.rack.is_leader()

    def polling(self) -> dict[str, bool]:
        return {d: self.polls(d) for d in self.shared.devices}

    def describe(self) -> dict[str, Any]:
        """What the status page says of the rack's coordination: from the config, always up, no failover."""
        return {"backend": "static", "up": True, "leader": self.rack.leader, "leads": self.is_leader(),
                "members": None, "polling": self.polling(), "why": ""}

    # -- serving our polls ----------------------------------------------------------------------------------

    def on_publish(self, snap: Any, origin: str, beat: bool = False) -> None:
        device = self.shared.jobs.get(origin)
        fact = self.facts.outgoing(snap, origin, device is not None and self.polls(device))
        if fact is None or not self.facts.due(origin, fact, beat):  # a new follower gets the latest line first
            return
        self.feed.publish(origin, encode(fact) + b"\n")
        self.facts.published += 1

    # -- reading the pollers we rely on ---------------------------------------------------------------------

    def needed_peers(self) -> list[str]:
        need = set()
        for device in self.shared.devices:
            if not self.polls(device):
                need.update(p for p in self.pollers.get(device, []) if p in self.peers and p != self.node)
        return sorted(need)

    async def _subscribe(self, peer: str) -> None:
        await follow(f"{self.peers[peer]}/api/v1/coordination/facts", peer, self.peer_tls,
                     lambda line, stream: self._from_peer(peer, line, stream),
                     lambda up: self.streams_up.__setitem__(peer, up), "fact")

    # -- the rack's NVLink attribution: our link vector served, every peer's followed -----------------------

    def _on_nvml(self, snap: Any, origin: str) -> None:
        """Store listener: after our own NVML poll, our link vector counts here at once (the verdict published
        now) and goes to our followers when it changed or is due (agent.coordination.link_share)."""
        if not origin.startswith("nvml/") or self.links is None:
            return
        raw = self.links.own(snap)
        self.links.publish()
        if raw is not None:
            self.link_feed.publish("links", raw + b"\n")

    def _link_from_peer(self, peer: str, line: bytes, stream: int) -> None:
        """One line of `peer`'s links feed: taken only as that tray's own vector (link_vectors.decode)."""
        assert self.links is not None
        try:
            self.links.accept(peer, line.strip())
        except RecordError as exc:
            self.links.forget(peer)
            self.rejections.error("links", f"peer {peer}", stream, exc)
        self.links.publish()

    def _link_stream(self, peer: str, up: bool) -> None:
        """A peer whose feed is lost says nothing of its links any more: silent, as a key gone with its lease."""
        self.link_streams_up[peer] = up
        if not up and self.links is not None:
            self.links.forget(peer)

    async def _follow_links(self, peer: str) -> None:
        await follow(f"{self.peers[peer]}{LINKS_PATH}", peer, self.peer_tls,
                     lambda line, stream: self._link_from_peer(peer, line, stream),
                     lambda up: self._link_stream(peer, up), "links")

    async def _publish_verdict(self) -> None:
        """The verdict stays fresh in the store while this agent attributes; it ages out as vectors go stale."""
        assert self.links is not None
        while True:
            self.links.publish()
            await asyncio.sleep(INTERVAL)

    # -- fault drills: our drill document served, every peer's followed ------------------------------------

    def publish_drill(self, raw: bytes) -> None:
        self.drill_feed.publish("drill", raw + b"\n")

    def drill_peers(self) -> set[str]:
        """The peers whose drill feed this agent follows now (each agent of a static rack follows every other's,
        so these hear this one too)."""
        return {p for p, up in self.drill_streams_up.items() if up}

    def _drill_stream(self, peer: str, up: bool) -> None:
        """A peer whose feed is lost says nothing of its drills any more: its drill ends here."""
        self.drill_streams_up[peer] = up
        if not up and self.drill_channel is not None:
            self.drill_channel.received(peer, None, f"peer {peer}", 0)

    async def _follow_drill(self, peer: str) -> None:
        await follow(f"{self.peers[peer]}{DRILL_PATH}", peer, self.peer_tls,
                     lambda line, stream: self.drill_channel.received(peer, line.strip(), f"peer {peer}", stream),
                     lambda up: self._drill_stream(peer, up), "drill")

    # -- maintenance: ours served, the peers' asked for ------------------------------------------------------

    def _own_maintenance(self, node: str, record: Record | None) -> None:
        """The engine's publisher: only this node's own maintenance is served to the rack."""
        if node == self.node:
            self.own_maintenance = record

    async def _serve_maintenance(self, request: Any) -> Any:
        from aiohttp import web

        return web.json_response({"node": self.node, "maintenance": self.own_maintenance},
                                 headers={"Cache-Control": "no-store"})

    async def _poll_maintenance(self, peers: dict[str, str]) -> None:
        """Ask each peer for its node's maintenance, slowly (one small GET per peer per poll)."""
        import aiohttp

        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.peer_timeout)) as http:
            while True:
                await asyncio.gather(*(self._ask_maintenance(http, n, u) for n, u in peers.items()))
                await asyncio.sleep(self.maintenance_poll)

    async def _ask_maintenance(self, http: Any, peer: str, url: str) -> None:
        from agent.status.peers import client_ssl

        key = f"{url}{MAINTENANCE_PATH}"
        try:
            ssl_ctx = client_ssl(self.peer_tls) if url.startswith("https:") else None
            async with http.get(key, ssl=ssl_ctx, allow_redirects=False) as resp:
                body = await resp.content.read(MAX_MAINTENANCE_ANSWER + 1)
                if resp.status != 200:
                    raise ConnectionError(f"HTTP {resp.status}")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # silent peer: its last known state holds, ending by its `until`
            if self.maintenance_reach.get(peer, True):
                log.warning("peer's maintenance not known now; its last known state holds",
                            extra={"peer": peer, "url": key, "error": f"{type(exc).__name__}: {exc}"[:200]})
            self.maintenance_reach[peer] = False
            return
        self.maintenance_reach[peer] = True
        revision = zlib.crc32(body)  # log a rejected answer once per distinct answer
        try:
            doc = as_object(parse_json(body), "maintenance answer")
            if doc.get("node") != peer:
                raise RecordError("not_own_node", f"{peer}'s agent answers as {str(doc.get('node'))[:60]!r}")
        except RecordError as exc:
            self.rejections.error("maintenance", key, revision, exc)
            self.maintenance.seen(peer)
            return
        record = doc.get("maintenance")
        if record is None:
            self.maintenance.seen(peer)
        else:
            self.maintenance.accept(peer, json.dumps(record), key, revision, peer=peer)

    def _from_peer(self, peer: str, line: bytes, stream: int) -> None:
        """One line of `peer`'s fact stream: taken only if it is the peer's own poll of a device the config has
        it poll, and passes its checks; otherwise rejected and counted (`key_kind="fact"`)."""
        try:
            doc = parse(line)
            source, device = doc.get("source"), doc.get("device")
            job = f"{source}/{device}" if isinstance(source, str) and isinstance(device, str) else ""
            shared = self.shared.jobs.get(job)
            if shared is None:
                raise RecordError("unknown_job", f"{job[:80]!r} is no shared device of this rack")
            pollers = self.pollers.get(shared)
            if pollers is None:
                return  # every node polls it itself: nobody needs this fact
            if peer not in pollers:
                raise RecordError("not_poller", f"{peer} is not one of {shared}'s configured pollers {pollers}")
            if self.facts.wanted(job, peer, self.polls):
                self.facts.take(job, peer, self.facts.check(job, peer, doc))
        except RecordError as exc:
            self.rejections.error("fact", f"peer {peer}", stream, exc)

    async def start(self, agent: Any) -> None:
        self.facts.store = agent.store
        loop = asyncio.get_running_loop()
        agent.route_mounts.append(lambda app: app.router.add_get(MAINTENANCE_PATH, self._serve_maintenance))
        peers = {n: u for n, u in self.peers.items() if n != self.node}
        if peers:
            self.tasks.append(loop.create_task(self._poll_maintenance(peers)))
        if self.drill_channel is not None:
            agent.route_mounts.append(lambda app: self.drill_feed.mount(app, DRILL_PATH))
            self.tasks += [loop.create_task(self._follow_drill(p)) for p in sorted(peers)]
        if self.links is not None:
            self.links.attach(agent.store, self.stale_after)
            agent.store.add_listener(self._on_nvml)
            agent.route_mounts.append(lambda app: self.link_feed.mount(app, LINKS_PATH))
            self.tasks.append(loop.create_task(self._publish_verdict()))
            self.tasks += [loop.create_task(self._follow_links(p)) for p in sorted(peers) if p in self.links.nodes]
        if not self.pollers:
            return  # every node polls every shared device: nothing to share
        agent.store.add_listener(self.on_publish)
        agent.store.add_touch_listener(lambda origin: self.facts.touched(origin, self.on_publish))
        agent.route_mounts.append(lambda app: self.feed.mount(app, "/api/v1/coordination/facts"))
        self.tasks += [loop.create_task(self._subscribe(p)) for p in self.needed_peers()]

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def _not_ours() -> None:
    """The gate of a shared device another node polls: never poll it here, and hold nothing open on it."""
    return None
