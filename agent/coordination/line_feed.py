"""What the static backend's agents tell each other over their own HTTP listener: a stream of JSON lines.

Why a stream and not a poll: a peer's news (a wet leak poll, a tray's NVLink going down) reaches the agents
that follow it as soon as it is published, while a quiet feed costs one idle connection per follower. Two
feeds use it: the shared devices' polls (GET /api/v1/coordination/facts, agent.coordination.facts) and each
tray's NVLink state vector (GET /api/v1/coordination/links, agent.coordination.link_vectors).

`LineFeed` serves: a new follower gets the latest line of each key first, then every new one; a slow follower
loses its oldest lines, it never holds the publisher. `follow` reads one peer's feed, reconnecting with a
doubling delay (0.2 s up to 5 s), and says when the stream opens and when it is lost, so the caller can forget
what that peer said (a dead peer's news is no news).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Callable

log = logging.getLogger("supernode.coordination")


class LineFeed:
    """The lines this agent publishes on one feed, to every follower (bounded)."""

    MAX_SUBSCRIBERS = 64
    QUEUE = 256

    def __init__(self, what: str):
        self.what = what  # said in the refusal when full
        self.latest: dict[str, bytes] = {}  # key -> its last line (what a new follower gets first)
        self.subscribers: set[asyncio.Queue] = set()
        self.closed = False

    def mount(self, app: Any, path: str) -> None:
        """Serve the feed at `path` of the agent's listener; its streams end when the listener stops."""
        app.router.add_get(path, self.serve)
        app.on_shutdown.append(self.close)

    async def close(self, _: Any = None) -> None:
        """End every follower's stream (the listener's clean stop never waits on a peer that follows us)."""
        self.closed = True
        for q in list(self.subscribers):
            if q.full():
                q.get_nowait()
            q.put_nowait(None)

    def publish(self, key: str, line: bytes) -> None:
        self.latest[key] = line
        for q in list(self.subscribers):
            if q.full():  # a slow reader loses the oldest, never holds the poll
                q.get_nowait()
            q.put_nowait(line)

    async def serve(self, request: Any) -> Any:
        from aiohttp import web

        if len(self.subscribers) >= self.MAX_SUBSCRIBERS or self.closed:
            return web.json_response({"error": f"too many {self.what} subscribers" if not self.closed
                                      else "stopping"}, status=503)
        resp = web.StreamResponse(headers={"Content-Type": "application/x-ndjson", "Cache-Control": "no-store"})
        await resp.prepare(request)
        q: asyncio.Queue = asyncio.Queue(self.QUEUE)
        for line in list(self.latest.values()):
            q.put_nowait(line)
        self.subscribers.add(q)
        try:
            while (line := await q.get()) is not None:
                await resp.write(line)
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            self.subscribers.discard(q)
        return resp


async def follow(url: str, peer: str, peer_tls: Any, on_line: Callable[[bytes, int], None],
                 on_state: Callable[[bool], None], what: str) -> None:
    """Read `peer`'s feed at `url` for ever: each non-empty line to `on_line(line, stream)` (stream: connections
    so far, so a rejection is logged once per connection), `on_state(True)` when a stream opens and
    `on_state(False)` when it is lost (logged once until it opens again)."""
    import aiohttp

    from agent.status.peers import client_ssl

    delay = 0.2
    streams = 0
    was_up = True  # a first failure is logged
    async with aiohttp.ClientSession() as http:
        while True:
            try:
                # The same trust (and client certificate) as the status page's reads of the same agents; made
                # each try, so a CA or certificate file that does not load yet is retried, not fatal.
                ssl_ctx = client_ssl(peer_tls) if url.startswith("https:") else None
                async with http.get(url, ssl=ssl_ctx, timeout=aiohttp.ClientTimeout(total=None, sock_connect=2)
                                    ) as resp:
                    if resp.status != 200:
                        raise ConnectionError(f"HTTP {resp.status}")
                    was_up = True
                    on_state(True)
                    delay = 0.2
                    streams += 1
                    async for line in resp.content:
                        if line.strip():
                            on_line(line, streams)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a dead peer: what it said goes stale here; try again, quietly
                if was_up:
                    log.warning(f"peer's {what} stream lost", extra={
                        "peer": peer, "url": url, "error": f"{type(exc).__name__}: {exc}"[:200]})
            was_up = False
            on_state(False)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
