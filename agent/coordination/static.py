"""The static backend (and the behaviour without a `coordination` section): the config decides, nothing fails over.

The leader is `remediation.rack_leader`, else the first inventory node. A
shared device is polled by the nodes `coordination.pollers` lists for it,
else by every node that lists it (what an agent without coordination does).
A node left out of a device's pollers reads that device's polls from a
poller's fact stream, at the poller's `inventory.agent_urls` (TLS: `status.peer_tls`). Guardrails are counted by each
agent alone (the blast radius from the scheduler's own view), approvals are
each agent's own, and no write is fenced: two agents configured as leader would both drive the valves. This
is the single-node and lab choice; a rack whose leader may die runs `etcd`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from agent.coordination.facts import FactExchange, encode
from agent.coordination.records import Rejections
from agent.coordination.shared import SharedDevices, shared_devices

log = logging.getLogger("supernode.coordination")


class LocalRack:
    """What the remediation engine asks the rack, answered from the config alone."""

    backend = "static"
    shared = False  # approvals and guardrails are this agent's own

    def __init__(self, leader: str, node: str):
        self.leader = leader
        self.node = node

    def is_leader(self) -> bool:
        return self.leader == self.node

    def role(self) -> str:
        return "leader" if self.is_leader() else "follower"

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
    MAX_SUBSCRIBERS = 64
    QUEUE = 256

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
        self.facts = FactExchange(self.node, self.shared.jobs, cfg.sources.stale_after_intervals, time.time,
                                  self.shared.safety)
        self.latest: dict[str, bytes] = {}  # job -> our last fact of it (what a new subscriber gets first)
        self.subscribers: set[asyncio.Queue] = set()
        self.tasks: list[asyncio.Task] = []
        self.streams_up: dict[str, bool] = {}  # peer -> its stream is open
        self.rejections = Rejections()  # records from peers that failed validation (agent.coordination.records)

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

    def on_publish(self, snap: Any, origin: str) -> None:
        device = self.shared.jobs.get(origin)
        fact = self.facts.outgoing(snap, origin, device is not None and self.polls(device))
        if fact is None:
            return
        line = encode(fact) + b"\n"
        self.latest[origin] = line
        self.facts.published += 1
        for q in list(self.subscribers):
            if q.full():  # a slow reader loses the oldest, never holds the poll
                q.get_nowait()
            q.put_nowait(line)

    async def _serve(self, request: Any) -> Any:
        from aiohttp import web

        if len(self.subscribers) >= self.MAX_SUBSCRIBERS:
            return web.json_response({"error": "too many fact subscribers"}, status=503)
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson", "Cache-Control": "no-store"})
        await resp.prepare(request)
        q: asyncio.Queue = asyncio.Queue(self.QUEUE)
        for line in list(self.latest.values()):
            q.put_nowait(line)
        self.subscribers.add(q)
        try:
            while True:
                await resp.write(await q.get())
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.subscribers.discard(q)
        return resp

    # -- reading the pollers we rely on ---------------------------------------------------------------------

    def needed_peers(self) -> list[str]:
        need = set()
        for device in self.shared.devices:
            if not self.polls(device):
                need.update(p for p in self.pollers.get(device, []) if p in self.peers and p != self.node)
        return sorted(need)

    async def _subscribe(self, peer: str) -> None:
        import aiohttp

        from agent.status_peers import client_ssl

        url = f"{self.peers[peer]}/api/v1/coordination/facts"
        delay = 0.2
        async with aiohttp.ClientSession() as http:
            while True:
                try:
                    # The same trust (and client certificate) as the status page's reads of the same agents; made
                    # each try, so a CA or certificate file that does not load yet is retried, not fatal.
                    ssl_ctx = client_ssl(self.peer_tls) if url.startswith("https:") else None
                    async with http.get(url, ssl=ssl_ctx, timeout=aiohttp.ClientTimeout(total=None, sock_connect=2)
                                        ) as resp:
                        if resp.status != 200:
                            raise ConnectionError(f"HTTP {resp.status}")
                        self.streams_up[peer] = True
                        delay = 0.2
                        async for line in resp.content:
                            if line.strip():
                                problem = self.facts.ingest(None, None, line, self.polls)
                                if problem and problem.startswith("unreadable"):
                                    log.warning("bad fact from a peer", extra={"peer": peer, "error": problem})
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # a dead peer: its devices go stale here; try again, quietly
                    if self.streams_up.get(peer, True):
                        log.warning("peer's fact stream lost", extra={"peer": peer, "url": url,
                                                                       "error": f"{type(exc).__name__}: {exc}"[:200]})
                self.streams_up[peer] = False
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)

    async def start(self, agent: Any) -> None:
        self.facts.store = agent.store
        if not self.pollers:
            return  # every node polls every shared device: nothing to share
        agent.store.add_listener(self.on_publish)
        agent.route_mounts.append(lambda app: app.router.add_get("/api/v1/coordination/facts", self._serve))
        loop = asyncio.get_running_loop()
        self.tasks = [loop.create_task(self._subscribe(p)) for p in self.needed_peers()]

    async def stop(self) -> None:
        for t in self.tasks:
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)


def _not_ours() -> None:
    """The gate of a shared device another node polls: never poll it here, and hold nothing open on it."""
    return None
