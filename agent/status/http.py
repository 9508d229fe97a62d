"""The status page's HTTP side: the page and its two files, a JSON view, and the live stream (SSE).

Why a stream built only while someone looks: the agent's CPU budget is small. The snapshot
store calls `on_publish` on every poll; with no page open that is one attribute test. With pages
open it wakes one producer task, which builds the view at most every `MIN_INTERVAL` (several
publishes coalesce into one update), once for all pages (at most two variants: with and without
incidents), and hands each page only the latest bytes: a slow browser skips states, it never
queues them. Every `HEARTBEAT` seconds a page gets an update or a ping, so it can tell a quiet
agent from a dead stream.

Who sees what follows the API's rules (agent.auth): readings, sources and the other nodes are
open like /api/v1/state; incidents, approvals and the reliability report need an admin token,
unless `auth.open_reads`. The browser sends the token in the Authorization header (the stream
is read with fetch(), not EventSource, which cannot send one). Approving calls the existing
`POST /api/v1/incidents/ID/approve`.

Every response of the listener carries a Content Security Policy that allows nothing but its
own origin (agent/listener.py): a device string or an alert label that reached the page is text,
never markup, and even injected markup could not load or run anything.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from agent.context import AgentContext
from agent.auth import authorize, caller, token_map
from agent.snapshot import Snapshot
from exporters.model import counter, gauge
from exporters.validation import terminal_safe
from agent.status.peers import PeerPoller
from agent.status.view import ViewBuilder, coordination, incidents, nvlink_attribution, nvlink_domain, sources

log = logging.getLogger("supernode.status")

STATIC = Path(__file__).resolve().parent  # the page's own files live beside this module
FILES = {"status.js": "text/javascript", "status.css": "text/css", "icon.svg": "image/svg+xml"}
MIN_INTERVAL = 0.25   # seconds between two builds: at most 4 updates a second
HEARTBEAT = 5.0       # seconds without a change before a page gets a ping
RELIABILITY_EVERY = 30.0  # seconds between two reliability reports (a read of the whole journal)
RELIABILITY_WINDOW = 30 * 86400.0
STATUS_CLIENTS = gauge("supernode_status_page_clients", "Status pages streaming now (count).")
STATUS_BUILDS = counter("supernode_status_page_updates_total",
                        "Views of the rack the status page stream built (count); none while no page is open.")
def shown(value: Any) -> Any:
    """The view with every string (values and keys) as the CLI prints it (`terminal_safe`): each control or format
    character escaped (`\\u202e`, `\\u200b`, `\\x1b`).

    Why here, on the server, in the one view every page and `/api/v1/status` read: a bidi override (U+202E) in an
    alert summary or a device name reordered what the page showed, and a zero-width character hides text. The
    browser only ever puts these strings in text nodes (never markup); escaping them before they leave the agent
    covers every place the page shows text (cells, titles, the approve dialog) with the CLI's own function, so
    page and CLI show the same characters, and no JavaScript copy of Unicode's categories can drift from it."""
    if isinstance(value, str):
        return terminal_safe(value)
    if isinstance(value, dict):
        return {shown(k): shown(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [shown(v) for v in value]
    return value


def sse(event: str, data: Any) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data, separators=(',', ':'), default=str)}\n\n".encode()


class _Client:
    __slots__ = ("admin", "full", "latest", "ready")

    def __init__(self, full: bool, admin: bool):
        self.full = full
        self.admin = admin  # came with a valid admin token: may take a reserved slot
        self.latest: bytes | None = None
        self.ready = asyncio.Event()

    def offer(self, payload: bytes) -> None:
        self.latest = payload
        self.ready.set()


class StatusHub:
    """Builds the page's state while pages are open and streams it to them."""

    def __init__(self, agent: AgentContext):
        self.agent = agent
        self.builder = ViewBuilder()
        self.clients: set[_Client] = set()
        self.builds = 0  # how many views were built (a test checks none are built with no page open)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: asyncio.Event | None = None
        self._wake_pending = False
        self._producer: asyncio.Task | None = None
        self._peers: PeerPoller | None = None
        self._peer_task: asyncio.Task | None = None
        self._rows: dict[str, tuple[int, list[Any]]] = {}  # incident id -> (last seq read, its journal rows)
        self._reliability: tuple[float, Any, dict[str, Any] | None] = (0.0, None, None)
        self._card_cache: tuple[float, dict[str, Any] | None] = (0.0, None)
        self._last: dict[bool, bytes] = {}
        self.closed = False

    # -- wiring ----------------------------------------------------------------------------

    def on_publish(self, *_: Any) -> None:
        """Snapshot store listener (any thread): nothing to do without a page open; else wake the producer."""
        if not self.clients or self._wake_pending or self._loop is None:
            return
        self._wake_pending = True
        try:
            self._loop.call_soon_threadsafe(self._wake)
        except RuntimeError:  # the loop is closing
            self._wake_pending = False

    def _wake(self) -> None:
        self._wake_pending = False
        if self._changed is not None:
            self._changed.set()

    @property
    def cfg(self) -> Any:
        return self.agent.loaded.config

    def _full_access(self, request: web.Request) -> tuple[bool, web.Response | None, str]:
        """(may read incidents, the refusal to send if a token was given but is wrong, why not readable)."""
        tokens = self.agent.loaded.admin_tokens
        if self.cfg.auth.open_reads:
            return True, None, ""
        if request.headers.get("Authorization"):
            who = authorize(request, tokens)
            if isinstance(who, web.Response):
                return False, who, ""
            return True, None, ""
        if not token_map(tokens):
            return False, None, "no admin token configured (auth.admin_tokens): incidents cannot be shown here"
        return False, None, "incidents and approvals need the admin token (auth.open_reads is off)"

    # -- building ------------------------------------------------------------------------------

    def node_card(self, snap: Snapshot | None = None) -> dict[str, Any]:
        """This node's card: what the page shows for it, and what peers fetch (open, cached briefly)."""
        at, card = self._card_cache
        if card is not None and time.monotonic() - at < MIN_INTERVAL:
            return card
        cfg = self.cfg
        snap = snap or self.agent.store.snapshot()
        engine = self._engine()
        faults = engine.gpu_faults_view() if engine is not None and hasattr(engine, "gpu_faults_view") else None
        card = self.builder.node_card(snap, cfg.inventory, cfg.agent.node, cfg.remediation.detectors,
                                      self.agent.identity(), faults)
        counts: dict[str, int] = {}
        if engine is not None:
            for inc in engine.incidents.open_incidents():
                counts[inc.severity] = counts.get(inc.severity, 0) + 1
        card["incidents_open"] = counts
        card["sources_failing"] = [f"{s['source']}/{s['device']}" for s in sources(snap.sources, snap.taken_at)
                                   if s["state"] in ("failing", "stale")]
        self._card_cache = (time.monotonic(), card)
        return card

    def _coordination_desc(self) -> dict[str, Any] | None:
        coord = getattr(self.agent, "coordination", None)
        return coord.describe() if coord is not None and hasattr(coord, "describe") else None

    def _coordinated_sources(self) -> tuple[frozenset, frozenset]:
        """(shared sources another agent polls for this one, sources idle here now) under rack coordination."""
        coord = getattr(self.agent, "coordination", None)
        if coord is None:
            return frozenset(), frozenset()
        idle = coord.idle()
        return coord.hidden() - idle, idle

    def _engine(self) -> Any:
        hook = self.agent.remediation
        return getattr(hook, "engine", None) if hook is not None else None

    async def build(self, full: bool) -> dict[str, Any]:
        """The whole view: this node and its peers, coolant, power, links, sources; incidents if `full`."""
        self.builds += 1
        cfg = self.cfg
        snap = self.agent.store.snapshot()
        now = snap.taken_at
        me = cfg.agent.node
        card = self.node_card(snap)
        nodes = []
        for node in cfg.inventory.nodes or [me]:
            if node == me:
                nodes.append({"name": node, "reach": "self", "why": "", "card": card})
            elif self._peers is not None:
                nodes.append({"name": node, **self._peers.view(node, time.time())})
            else:
                nodes.append({"name": node, "reach": "not_configured",
                              "why": "no agent URL for this node in inventory.agent_urls"})
        view: dict[str, Any] = {
            "now": now, "agent": self.agent.identity(), "nodes": nodes,
            "nvlink_domain": nvlink_domain(nodes, getattr(cfg.inventory, "switch_trays", None) or [],
                                           nvlink_attribution(snap)),
            "coolant": self.builder.coolant(snap, cfg.inventory), "power": self.builder.power(snap, cfg.inventory),
            "sources": sources(snap.sources, now, *self._coordinated_sources()),
            "coordination": coordination(self._coordination_desc()),
            "remediation_degraded": self.agent.remediation_degraded(),
        }
        drill = getattr(self.agent.remediation, "drill", None)
        # the banner for every page (a drill's leak is not a real one); its report, like incidents, needs the token
        view["drill"] = drill.banner() if drill is not None else None
        engine = self._engine()
        if full and engine is not None:
            rows = await self._incident_rows(engine)
            view["incidents"] = incidents(engine, rows, time.time())
            view["reliability"] = await self._reliability_report(engine)
            if view["drill"] is not None:
                view["drill"]["report"] = drill.page_report()
        return shown(view)

    async def _incident_rows(self, engine: Any) -> dict[str, list[Any]]:
        """Each open incident's journal rows, read incrementally off the event loop."""
        open_ids = [i.id for i in engine.incidents.open_incidents()]
        cache = {iid: self._rows.get(iid, (0, [])) for iid in open_ids}

        def read() -> dict[str, tuple[int, list[Any]]]:
            out = {}
            for iid, (seq, rows) in cache.items():
                new = engine.journal.entries(incident_id=iid, since_seq=seq)
                out[iid] = (max([seq] + [e.seq for e in new]), rows + new)
            return out

        self._rows = await asyncio.to_thread(read) if cache else {}
        return {iid: rows for iid, (_, rows) in self._rows.items()}

    async def _reliability_report(self, engine: Any) -> dict[str, Any] | None:
        """The report of `supernode-agent report`, again every RELIABILITY_EVERY or when incidents open or close."""
        at, key, rep = self._reliability
        incidents_now = (frozenset(i.id for i in engine.incidents.open_incidents()), len(engine.incidents.recent()))
        if rep is not None and key == incidents_now and time.monotonic() - at < RELIABILITY_EVERY:
            return rep
        from agent.reliability import reliability_report

        cfg = self.cfg
        counts = dict(self.agent.remediation.observed.counts) if hasattr(self.agent.remediation, "observed") else None
        zones = {z.name: z.nodes for z in cfg.inventory.leak_zones}
        now = time.time()
        try:
            entries = await asyncio.to_thread(engine.journal.entries)
            rep = reliability_report(entries, counts, now - RELIABILITY_WINDOW, now, cfg.agent.node, zones)
        except Exception as exc:  # a journal that cannot be read costs the page this section, nothing more
            log.warning("status page: reliability report failed", extra={"error": repr(exc)})
            rep = None
        self._reliability = (time.monotonic(), incidents_now, rep)
        return rep

    # -- the producer ------------------------------------------------------------------------

    def _start(self) -> None:
        self._loop = asyncio.get_running_loop()
        if self._changed is None:
            self._changed = asyncio.Event()
        if self._producer is None or self._producer.done():
            self._producer = self._loop.create_task(self._produce())
        self._sync_peers()

    def _sync_peers(self) -> None:
        """Poll the peers the running config names (a reload may have changed them) while pages are open."""
        s, inv = self.cfg.status, self.cfg.inventory
        urls = {n: u for n, u in inv.agent_urls.items() if n != self.cfg.agent.node}
        wanted = (urls, s.peer_interval_seconds, s.peer_timeout_seconds, s.peer_tls)
        current = None if self._peers is None else (self._peers.urls, self._peers.interval, self._peers.timeout,
                                                    self._peers.tls)
        if current == wanted and self._peer_task is not None and not self._peer_task.done():
            return
        if self._peer_task is not None:
            self._peer_task.cancel()
        self._peers, self._peer_task = None, None
        if urls and self._loop is not None:
            self._peers = PeerPoller(urls, s.peer_interval_seconds, s.peer_timeout_seconds, s.peer_tls,
                                     on_change=self._wake)
            self._peer_task = self._loop.create_task(self._peers.run())

    def _stop_if_idle(self) -> None:
        if self.clients:
            return
        for task in (self._producer, self._peer_task):
            if task is not None:
                task.cancel()
        self._producer = self._peer_task = None
        self._peers = None
        self._rows.clear()

    async def _produce(self) -> None:
        assert self._changed is not None
        while self.clients and not self.closed:
            started = time.monotonic()
            try:
                self._sync_peers()
                for full in {c.full for c in self.clients}:
                    payload = sse("state", await self.build(full))
                    if payload != self._last.get(full):
                        self._last[full] = payload
                        for c in list(self.clients):
                            if c.full == full:
                                c.offer(payload)
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug in the view must not end the stream: the pages say they are stale
                log.exception("status page: view build failed")
            await asyncio.sleep(max(0.0, MIN_INTERVAL - (time.monotonic() - started)))
            try:
                async with asyncio.timeout(HEARTBEAT):
                    await self._changed.wait()
            except asyncio.TimeoutError:
                pass  # no publish for a while (every source down?): rebuild anyway, ages move on
            self._changed.clear()

    # -- routes ----------------------------------------------------------------------------------

    def disabled(self) -> web.Response | None:
        if self.cfg.status.enabled:
            return None
        return web.json_response({"error": "the status page is off (status.enabled)"}, status=404)

    def _admit(self, request: web.Request) -> tuple[bool, str] | web.Response:
        """(may see incidents, why not) for a view or a stream, or the answer that refuses it."""
        off = self.disabled()
        if off is not None:
            return off
        full, refusal, locked = self._full_access(request)
        return refusal if refusal is not None else (full, locked)

    def _no_slot(self, admin: bool) -> str | None:
        """Why a new stream gets no slot, or None. Anonymous pages share `max_clients` slots; a page with an admin
        token may take any free one of those or of the `reserved_admin_clients` on top (eight anonymous pages
        once took every slot and the person with the token got a 503)."""
        s = self.cfg.status
        if len(self.clients) >= s.max_clients + s.reserved_admin_clients:
            return (f"too many status pages open (status.max_clients {s.max_clients} and "
                    f"status.reserved_admin_clients {s.reserved_admin_clients} all taken)")
        anonymous = sum(1 for c in self.clients if not c.admin)
        if not admin and anonymous >= s.max_clients:
            return (f"too many status pages open without an admin token (status.max_clients {s.max_clients}); "
                    f"status.reserved_admin_clients {s.reserved_admin_clients} more are kept for the admin token")
        return None

    async def stream(self, request: web.Request) -> web.StreamResponse:
        admitted = self._admit(request)
        if isinstance(admitted, web.Response):
            return admitted
        full, locked = admitted
        admin = caller(request, token_map(self.agent.loaded.admin_tokens)) is not None
        full_up = self._no_slot(admin)
        if full_up is not None:
            return web.json_response({"error": full_up}, status=503)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store",
                                           "X-Accel-Buffering": "no"})
        await resp.prepare(request)
        client = _Client(full, admin)
        self.clients.add(client)
        self._start()
        try:
            if full:
                who = caller(request, token_map(self.agent.loaded.admin_tokens)) or "anonymous (auth.open_reads)"
                await resp.write(sse("hello", {"incidents": True, "who": terminal_safe(who)}))
            else:
                await resp.write(sse("hello", {"incidents": False, "locked": locked}))
            if full in self._last:
                client.offer(self._last[full])
            assert self._changed is not None
            self._changed.set()
            while not self.closed:
                try:
                    async with asyncio.timeout(HEARTBEAT):
                        await client.ready.wait()
                except asyncio.TimeoutError:
                    await resp.write(sse("ping", {"now": time.time()}))
                    continue
                client.ready.clear()
                payload, client.latest = client.latest, None
                if payload is not None:
                    await resp.write(payload)
        except ConnectionResetError:  # the page went away
            pass
        finally:
            self.clients.discard(client)
            self._stop_if_idle()
        return resp

    async def view(self, request: web.Request) -> web.Response:
        admitted = self._admit(request)
        if isinstance(admitted, web.Response):
            return admitted
        full, locked = admitted
        data = await self.build(full)
        if not full:
            data["incidents_locked"] = locked
        return web.json_response(data, dumps=lambda o: json.dumps(o, default=str),
                                 headers={"Cache-Control": "no-store"})

    async def node(self, _: web.Request) -> web.Response:
        if (off := self.disabled()) is not None:
            return off
        return web.json_response(self.node_card(), headers={"Cache-Control": "no-store"})

    def collector(self) -> Any:
        """`supernode_status_page_clients` and `supernode_status_page_updates_total`."""
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        hub = self

        class _Collector:
            def describe(self) -> list:
                return []

            def collect(self) -> Any:
                yield GaugeMetricFamily(STATUS_CLIENTS.name, STATUS_CLIENTS.help, value=len(hub.clients))
                yield CounterMetricFamily(STATUS_BUILDS.name.removesuffix("_total"), STATUS_BUILDS.help,
                                          value=hub.builds)
        return _Collector()

    async def close(self, _: Any = None) -> None:
        """on_shutdown: end every stream, so the listener's clean stop never waits on an open page."""
        self.closed = True
        for c in list(self.clients):
            c.ready.set()
        for task in (self._producer, self._peer_task):
            if task is not None:
                task.cancel()


def _static(hub: StatusHub, name: str, content_type: str) -> Any:
    """A file of the page, read once; one missing from an installation is a 500 that says so, never a crash."""
    body: bytes | None = None

    async def handler(_: web.Request) -> web.Response:
        nonlocal body
        if (off := hub.disabled()) is not None:
            return off
        if body is None:
            try:
                body = (STATIC / name).read_bytes()
            except OSError as exc:
                log.error("status page file missing from this installation", extra={"file": name, "error": str(exc)})
                return web.json_response({"error": f"status page file {name} missing: {exc.strerror}"}, status=500)
        return web.Response(body=body, content_type=content_type, headers={"Cache-Control": "no-cache"})
    return handler


def add_status_routes(app: web.Application, agent: AgentContext) -> StatusHub:
    """Mount the page (`/`), its files (`/status/...`), the view, the stream and the node card."""
    hub = StatusHub(agent)
    agent.store.add_listener(hub.on_publish)
    agent.registry.register(hub.collector())
    app.on_shutdown.append(hub.close)
    app.router.add_get("/", _static(hub, "index.html", "text/html"))
    for name, content_type in FILES.items():
        app.router.add_get(f"/status/{name}", _static(hub, name, content_type))
    app.router.add_get("/api/v1/status", hub.view)
    app.router.add_get("/api/v1/status/stream", hub.stream)
    app.router.add_get("/api/v1/status/node", hub.node)
    return hub
