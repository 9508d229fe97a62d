"""The listening socket's defences: a connection cap under the file limit, header and body deadlines,
and logs that an attack cannot flood.

Why: aiohttp puts no deadline on a request that is never finished, so 1,100
idle half-sent requests used every file descriptor of a 1024-limit process:
the accept loop failed ~2,000 times a second (each one logged) and /metrics
stopped answering. Here every connection is tracked from accept: one that has
not sent its request headers within `header_timeout` (counted from connect or
from its previous response) is closed, one whose body takes longer than
`body_timeout` gets a 408, and over `max_connections` (kept under the
process's RLIMIT_NOFILE) the oldest connection still sending a request is
closed to make room, so a scrape of /metrics or /healthz, which sends its
request at once, is always served.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from typing import Any, Awaitable, Callable, Iterator

from aiohttp import web
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from exporters.model import counter, gauge

log = logging.getLogger("supernode.http")

FD_RESERVE = 128  # descriptors left for the journal, device sockets, subprocess pipes, logs
ACCEPT_BACKLOG = 100  # asyncio accepts up to this many sockets in one go, before any can be closed

HTTP_CONNECTIONS = gauge("supernode_http_connections", "Open HTTP connections (count).")
HTTP_CONNECTIONS_MAX = gauge("supernode_http_connections_max", "Connection cap in force, under the file limit (count).")
HTTP_CLOSED = counter("supernode_http_connections_closed_total",
                      "Connections the listener closed to protect itself, by reason (count).", ("reason",))

# Every answer of the listener carries these: a policy that allows nothing but this origin (no inline script or
# style, nothing fetched from elsewhere), no MIME sniffing, no framing, no referrer. Listener-wide (not the status
# page's): a 404 or a 401 is an answer a browser may render too.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
       "form-action 'none'; base-uri 'none'; frame-ancestors 'none'")
SECURITY_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                    "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY"}


async def add_security_headers(_: Any, response: Any) -> None:
    """on_response_prepare: on every answer of the listener, its own 404s and 401s included."""
    for k, v in SECURITY_HEADERS.items():
        response.headers.setdefault(k, v)


def connection_cap(configured: int) -> int:
    """`configured`, lowered so that open connections can never exhaust the process's file limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return configured
    reserve = FD_RESERVE + ACCEPT_BACKLOG if soft > 4 * (FD_RESERVE + ACCEPT_BACKLOG) else soft // 4
    return max(8, min(configured, soft - reserve))


class RateLimitFilter(logging.Filter):
    """Lets one record per message template through every `every` seconds; says how many it dropped.

    Installed on the loggers an attacker can drive (asyncio's accept errors, aiohttp's bad-request
    logs, the cap's own eviction notices), so a flood costs a few lines, not thousands a second.
    """

    def __init__(self, every: float = 10.0, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.every = every
        self.clock = clock
        self._last: dict[str, float] = {}
        self._dropped: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        key = f"{record.name}:{record.msg}"
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.every:
            self._dropped[key] = self._dropped.get(key, 0) + 1
            return False
        if len(self._last) > 1000:  # templates, not values: this stays small, but never grows without end
            self._last.clear()
        self._last[key] = now
        dropped = self._dropped.pop(key, 0)
        if dropped:
            record.msg = f"{record.msg} ({dropped} similar messages suppressed in the last {self.every:g}s)"
        return True


FLOOD_LOGGERS = ("asyncio", "aiohttp.server", "aiohttp.access", "supernode.http")


def install_log_limits(every: float = 10.0) -> RateLimitFilter:
    """One shared filter on every logger a client can make speak (idempotent)."""
    for name in FLOOD_LOGGERS:
        logger = logging.getLogger(name)
        for f in logger.filters:
            if isinstance(f, RateLimitFilter):
                return f
    limiter = RateLimitFilter(every)
    for name in FLOOD_LOGGERS:
        logging.getLogger(name).addFilter(limiter)
    return limiter


WAITING, BODY, HANDLING = "waiting", "body", "handling"


class _Conn:
    __slots__ = ("transport", "since", "phase")

    def __init__(self, transport: asyncio.Transport, since: float):
        self.transport = transport
        self.since = since  # connect, or the end of its previous response
        # waiting: for request headers (header deadline, evictable); body: reading it (body deadline,
        # evictable); handling: the request is being answered (never evicted)
        self.phase = WAITING


class ConnectionGuard:
    """Tracks the connections of one aiohttp Server and enforces the cap and the deadlines."""

    def __init__(self, max_connections: int, header_timeout: float, body_timeout: float):
        self.cap = connection_cap(max_connections)
        self.header_timeout = header_timeout
        self.body_timeout = body_timeout
        self.conns: dict[Any, _Conn] = {}
        self.closed_total: dict[str, int] = {"header_timeout": 0, "body_timeout": 0, "evicted": 0, "over_capacity": 0}
        self._sweeper: asyncio.Task | None = None

    # -- hooks on the aiohttp Server (its public connection_made/connection_lost) ---------

    def attach(self, server: web.Server) -> None:
        made, lost = server.connection_made, server.connection_lost

        def connection_made(handler: Any, transport: asyncio.Transport) -> None:
            made(handler, transport)
            self._opened(handler, transport)

        def connection_lost(handler: Any, exc: BaseException | None = None) -> None:
            self.conns.pop(handler, None)
            lost(handler, exc)

        server.connection_made = connection_made  # type: ignore[method-assign]
        server.connection_lost = connection_lost  # type: ignore[method-assign]

    def _opened(self, handler: Any, transport: asyncio.Transport) -> None:
        now = time.monotonic()
        self.conns[handler] = _Conn(transport, now)
        if len(self.conns) <= self.cap:
            return
        victim = min((h for h, c in self.conns.items() if c.phase != HANDLING and h is not handler),
                     key=lambda h: self.conns[h].since, default=None)
        if victim is None:  # every other connection is being answered: refuse the newcomer
            self._close(handler, "over_capacity")
        else:
            self._close(victim, "evicted")
        log.warning("connection cap reached; closed the oldest connection still sending its request",
                    extra={"max_connections": self.cap})

    def _close(self, handler: Any, reason: str) -> None:
        conn = self.conns.pop(handler, None)
        if conn is None:
            return
        self.closed_total[reason] += 1
        conn.transport.abort()  # frees the descriptor now: no lingering, no half-close

    # -- request phases (the middleware) --------------------------------------------------

    def middleware(self) -> Callable[..., Awaitable[web.StreamResponse]]:
        @web.middleware
        async def guard(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
                        ) -> web.StreamResponse:
            conn = self.conns.get(request.protocol)
            if conn is not None:
                conn.phase = BODY
            try:
                if request.can_read_body:
                    try:
                        async with asyncio.timeout(self.body_timeout):
                            await request.read()
                    except asyncio.TimeoutError:
                        self.closed_total["body_timeout"] += 1
                        log.warning("request body not received in time; answered 408",
                                    extra={"body_timeout": self.body_timeout})
                        return web.json_response({"error": f"body not received within {self.body_timeout:g}s"},
                                                 status=408, headers={"Connection": "close"})
                if conn is not None:
                    conn.phase = HANDLING
                return await handler(request)
            finally:  # whatever happened (413, 408, an error), the next request has its header deadline
                if conn is not None:
                    conn.phase = WAITING
                    conn.since = time.monotonic()
        return guard

    # -- deadlines ------------------------------------------------------------------------

    def sweep(self) -> int:
        """Close every connection that has not sent its request headers in time; how many were closed."""
        deadline = time.monotonic() - self.header_timeout
        late = [h for h, c in self.conns.items() if c.phase == WAITING and c.since < deadline]
        for handler in late:
            self._close(handler, "header_timeout")
        return len(late)

    async def _sweep_forever(self) -> None:
        every = min(1.0, self.header_timeout / 4)
        while True:
            await asyncio.sleep(every)
            self.sweep()

    def start(self) -> None:
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep_forever())

    def collector(self) -> Collector:
        """`supernode_http_connections`, its cap, and the connections closed to protect the listener."""
        guard = self

        class _Collector(Collector):
            def collect(self) -> Iterator[Metric]:
                yield GaugeMetricFamily(HTTP_CONNECTIONS.name, HTTP_CONNECTIONS.help, value=len(guard.conns))
                yield GaugeMetricFamily(HTTP_CONNECTIONS_MAX.name, HTTP_CONNECTIONS_MAX.help, value=guard.cap)
                closed = CounterMetricFamily(HTTP_CLOSED.name.removesuffix("_total"), HTTP_CLOSED.help,
                                             labels=list(HTTP_CLOSED.labels))
                for reason, n in sorted(guard.closed_total.items()):
                    closed.add_metric([reason], n)
                yield closed
        return _Collector()

    async def stop(self, _: Any = None) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None
