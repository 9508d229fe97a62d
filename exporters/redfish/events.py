"""Event push from a Redfish service: an SSE stream where offered, else a push subscription to the agent.

Why events only *trigger* a read: an event record says "something changed
here", not the whole state, and records can be lost (a dropped stream, a BMC
that batches). So a relevant record asks the source for an immediate poll of
its detectors (the same confirmation a first wet Modbus reading gets), and the
poll's readings are what the detectors see. Polling keeps running underneath:
when the stream drops, the next timed poll still reads every detector, the
stream is opened again with backoff, and every (re)connect triggers one poll
for what may have been missed meanwhile.

Why the watch survives anything: a stream that fails in any way (an over-long
line, bytes that are not UTF-8, data that is not JSON, the connection, or an
exception nobody foresaw) is counted by reason, marked down at once, followed
by a poll (what it could not read may have been a leak), and reopened with
backoff. Before, one exception type nobody caught (aiohttp's LineTooLong on a
48 MiB line) ended the watch silently with the stream still counted up.

Why forced polls are limited, and how: every relevant event (and every push,
whoever sends it) asks for a read of the detectors; a burst of 100 pushes made
148 detector reads. Up to FORCED_BURST forced polls start at once within
`min_poll_s` (a leak's event right after a warning or a clear is never held
back: the push path is the rack's fastest leak path); beyond that, an event
schedules one poll at the end of the window (all the window's later events
share it), so a flood of events cannot become a flood of BMC reads, and the
last event is always followed by a read that starts after it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Any, Callable, Literal

from exporters.model import SourceError
from exporters.redfish.client import RedfishClient
from exporters.redfish.discovery import Tree
from exporters.redfish.profile import Profile

log = logging.getLogger("supernode.redfish")
FORCED_BURST = 3  # forced polls that start at once within one `min_poll_s` window
Transport = Literal["sse", "push", "none"]
Mode = Literal["auto", "sse", "push"]


def _origin(record: dict[str, Any]) -> str | None:
    origin = record.get("OriginOfCondition")
    uri = origin.get("@odata.id") if isinstance(origin, dict) else origin
    return uri.rstrip("/") if isinstance(uri, str) and uri else None


class EventWatch:
    """One service's event subscription; `trigger()` asks for a poll now (the runtime wires it)."""

    def __init__(self, client: RedfishClient, profile: Profile, trigger: Callable[[], Any], *, mode: Mode = "auto",
                 push_destination: str | None = None, push_token: str | None = None, context: str = "",
                 retry_s: float = 0.5, retry_max_s: float = 30.0, min_poll_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic):
        self.client = client
        self.mode = mode
        self.profile = profile
        self._trigger = trigger
        self.min_poll_s, self.clock = min_poll_s, clock
        self.coalesced = 0  # events whose poll was folded into one already due
        self.failures: Counter[str] = Counter()  # stream failures by reason
        self._forced: list[float] = []  # when the forced polls of the current window started
        self._deferred: asyncio.TimerHandle | None = None
        self.push_destination, self.push_token, self.context = push_destination, push_token, context
        self.retry_s, self.retry_max_s = retry_s, retry_max_s
        self.transport: Transport = "none"
        self.up = False
        self.received: dict[bool, int] = {True: 0, False: 0}
        self.last_error: str | None = None
        self.subscription: str | None = None  # our push subscription's URI
        self._polled: tuple[str, ...] = ()
        self._holders: tuple[str, ...] = ()
        self._keys = frozenset(profile.events.message_keys)
        self._task: asyncio.Task | None = None
        self._sse_uri: str | None = None

    # -- what counts ---------------------------------------------------------------

    def relevant(self, record: dict[str, Any]) -> bool:
        """A record about a polled resource (or a part of one, or its chassis/equipment), or a leak/coolant message."""
        message = record.get("MessageId")
        if isinstance(message, str) and message.rsplit(".", 1)[-1] in self._keys:
            return True
        origin = _origin(record)
        if origin is None:
            return False
        if any(origin == u or origin.startswith(u + "/") for u in self._polled):
            return True
        # An ancestor of a polled resource, no higher than the chassis or equipment that holds it.
        return any(origin == h or origin.startswith(h + "/") for h in self._holders) and \
            any(u.startswith(origin + "/") for u in self._polled)

    def handle(self, payload: dict[str, Any]) -> bool:
        """An Event payload (SSE data or a push body): count its records; one poll if any is relevant."""
        records = payload.get("Events")
        records = [r for r in records if isinstance(r, dict)] if isinstance(records, list) else [payload]
        hit = False
        for rec in records:
            rel = self.relevant(rec)
            self.received[rel] += 1
            hit = hit or rel
        if hit:
            self.trigger()
        return hit

    def trigger(self) -> None:
        """Ask for a poll now, up to FORCED_BURST per `min_poll_s`; past that, one at the window's end for all."""
        if self._deferred is not None:
            self.coalesced += 1
            return
        now = self.clock()
        self._forced = [t for t in self._forced if now - t < self.min_poll_s]
        if len(self._forced) < FORCED_BURST:
            self._fire()
            return
        wait = self._forced[0] + self.min_poll_s - now
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a bare call): nothing to defer to, poll now
            self._fire()
            return
        self.coalesced += 1
        self._deferred = loop.call_later(wait, self._fire)

    def _fire(self) -> None:
        self._deferred = None
        self._forced.append(self.clock())
        self._trigger()

    # -- lifecycle -------------------------------------------------------------------

    async def update(self, tree: Tree) -> None:
        """After each walk: what is polled now, and keep (or start) the subscription the service offers."""
        self._polled = tuple(r.uri.rstrip("/") for r in tree.resources)
        self._holders = tuple(e.uri.rstrip("/") for e in tree.equipment)
        if tree.sse_uri and self.mode in ("auto", "sse"):
            self.transport = "sse"
            if self._sse_uri != tree.sse_uri or self._task is None or self._task.done():
                await self._stop_task()
                self._sse_uri = tree.sse_uri
                self._task = asyncio.get_running_loop().create_task(self._run_sse(tree.sse_uri))
        elif tree.subscriptions_uri and self.push_destination and self.mode in ("auto", "push"):
            self.transport = "push"
            await self._keep_push(tree)
        else:
            self.transport, self.up = "none", False

    async def _run_sse(self, uri: str) -> None:
        delay = self.retry_s
        while True:
            opened = False

            def on_open() -> None:
                nonlocal opened
                opened = True
                self._opened()

            try:
                async for payload in self.client.events(uri, on_open=on_open):
                    self.handle(payload)
                reason, self.last_error = "ended", "the stream ended"
            except asyncio.CancelledError:
                self.up = False
                raise
            except SourceError as exc:
                reason, self.last_error = getattr(exc, "reason", exc.kind), f"{exc.kind}: {exc}"
            except Exception as exc:  # the last line: nothing may end the watch (a bug, the HTTP stack's own error)
                reason, self.last_error = "unexpected", f"{type(exc).__name__}: {exc}"
            self.up = False
            self.failures[reason] += 1
            if opened:
                delay = self.retry_s
                self.trigger()  # what the stream could not deliver may have been a leak: read now
            log.warning("redfish event stream failed; polling carries on, reopening with backoff", extra={
                "service": self.client.origin, "reason": reason, "error": self.last_error, "retry_s": delay})
            await asyncio.sleep(delay)
            delay = min(delay * 2, self.retry_max_s)

    def _opened(self) -> None:
        self.up = True
        self.last_error = None
        self.trigger()  # what happened while we were not listening

    async def _keep_push(self, tree: Tree) -> None:
        """Our push subscription exists (re-made when the service lost it: a BMC reboot drops them)."""
        if self.subscription is not None:
            try:
                await self.client.get(self.subscription)
                self.up = True
                return
            except SourceError:
                self.subscription = None
        body: dict[str, Any] = {"Destination": self.push_destination, "Protocol": "Redfish",
                                "Context": self.context, "EventFormatType": "Event"}
        if self.push_token:
            body["HttpHeaders"] = [{"Authorization": f"Bearer {self.push_token}"}]
        wanted = [t for t in self.profile.events.event_types if not tree.event_types or t in tree.event_types]
        if tree.event_types and wanted:
            body["EventTypes"] = wanted
        try:
            status, _, headers = await self.client.post(str(tree.subscriptions_uri), body)
        except SourceError as exc:
            self.up, self.last_error = False, f"{exc.kind}: {exc}"
            return
        location = headers.get("Location")
        if status in (200, 201) and location:
            self.subscription = location
            self._opened()
        else:
            self.up, self.last_error = False, f"subscription refused: HTTP {status}"

    def push_received(self, payload: dict[str, Any]) -> bool:
        """A push delivery for this service (the agent's endpoint checked its token)."""
        if self.transport == "push" and not self.up:
            self.up = True
        return self.handle(payload)

    async def _stop_task(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except (asyncio.CancelledError, Exception):
                pass
            self._task = None

    async def close(self) -> None:
        if self._deferred is not None:
            self._deferred.cancel()
            self._deferred = None
        await self._stop_task()
        if self.subscription is not None:
            try:
                await self.client.delete(self.subscription)
            except SourceError:
                pass
            self.subscription = None
        self.up = False
