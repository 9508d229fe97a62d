"""Redfish events of a simulated service: registry messages, SSE streams and push subscriptions.

A state change the service sees (a leak detector going Critical, a pump
failing, the host powering off) becomes one Event record built from the
message registry (messages.yaml) and goes at once to every open SSE stream
(`ServerSentEventUri`, DSP0266's `text/event-stream` with an `id:` per event,
so a client reconnecting with `Last-Event-ID` gets what it missed) and to every
push subscription, POSTed to its Destination, in order, with the subscriber's
own HTTP headers (how a subscriber authenticates the BMC's POSTs); a
subscription whose deliveries keep failing is deleted after the retries
(TerminateAfterRetries, the default) or retried for ever (RetryForever).
Subscriptions are filtered the standard way (EventTypes, RegistryPrefixes,
MessageIds, OriginResources), SSE streams by `$filter`.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import logging
import re
import ssl
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit

import aiohttp

from exporters.safe_yaml import load_yaml_file

log = logging.getLogger("supernode.sim.redfish")

MESSAGES: dict[str, dict[str, str]] = load_yaml_file(Path(__file__).resolve().parent / "messages.yaml", "message registry")
EVENT_TYPE = "#Event.v1_11_0.Event"
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def now_iso() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def message(message_id: str, *args: str) -> dict[str, Any]:
    """MessageId, Message, MessageArgs and severity of a registry message (KeyError: not in messages.yaml)."""
    entry = MESSAGES[message_id]
    text = entry["message"]
    for i, arg in enumerate(args, 1):
        text = text.replace(f"%{i}", str(arg))
    return {"MessageId": message_id, "Message": text, "MessageArgs": [str(a) for a in args],
            "MessageSeverity": entry["severity"]}


def condition(message_id: str, origin: str, *args: str) -> dict[str, Any]:
    """A `Status.Conditions` entry for a registry message (what a resource shows while the state lasts)."""
    m = message(message_id, *args)
    return {"MessageId": m["MessageId"], "Message": m["Message"], "MessageArgs": m["MessageArgs"],
            "Severity": m["MessageSeverity"], "Timestamp": now_iso(), "OriginOfCondition": {"@odata.id": origin}}


@dataclass(frozen=True)
class Event:
    id: int
    record: dict[str, Any]

    @property
    def registry_prefix(self) -> str:
        return str(self.record.get("MessageId", "")).split(".")[0]

    @property
    def origin(self) -> str:
        return str((self.record.get("OriginOfCondition") or {}).get("@odata.id", ""))

    def payload(self, context: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"@odata.type": EVENT_TYPE, "Id": str(self.id), "Name": "Event", "Events": [self.record]}
        if context is not None:
            body["Context"] = context
        return body


class FilterError(ValueError):
    """An SSE `$filter` the service does not support; the message says what is."""


_CLAUSE = re.compile(r"^\s*(EventType|MessageId|RegistryPrefix|OriginResource)\s+eq\s+'([^']*)'\s*$")


def parse_sse_filter(text: str | None) -> Callable[[Event], bool]:
    """DSP0266's SSE `$filter`: clauses `PROPERTY eq 'value'` joined by `or` and `and` (and binds tighter)."""
    if not text:
        return lambda e: True
    groups = []
    for alt in re.split(r"\s+or\s+", text.strip()):
        clauses = []
        for part in re.split(r"\s+and\s+", alt):
            m = _CLAUSE.match(part)
            if not m:
                raise FilterError(f"$filter: cannot read {part.strip()!r}; supported: EventType, MessageId, RegistryPrefix "
                                  "and OriginResource with eq, joined by and/or")
            clauses.append((m.group(1), m.group(2)))
        groups.append(clauses)

    def match(e: Event) -> bool:
        values = {"EventType": e.record.get("EventType"), "MessageId": e.record.get("MessageId"),
                  "RegistryPrefix": e.registry_prefix}
        return any(all((e.origin == v or e.origin.startswith(v.rstrip("/") + "/")) if p == "OriginResource"
                       else values[p] == v for p, v in clauses) for clauses in groups)
    return match


@dataclass(eq=False)  # kept in a set: identity, not value
class SseClient:
    match: Callable[[Event], bool]
    session: str | None  # the session id the stream belongs to (closed with it); None for Basic auth
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)

    def close(self) -> None:
        self.queue.put_nowait(None)


@dataclass
class Subscription:
    id: str
    destination: str
    context: str
    headers: dict[str, str]
    event_types: list[str]
    registry_prefixes: list[str]
    message_ids: list[str]
    origin_resources: list[str]
    verify_certificate: bool
    retry_policy: str = "TerminateAfterRetries"
    delivered: int = 0
    failed: int = 0
    queue: asyncio.Queue = field(default_factory=asyncio.Queue)
    task: asyncio.Task | None = None

    def wants(self, e: Event) -> bool:
        if self.event_types and e.record.get("EventType") not in self.event_types:
            return False
        if self.registry_prefixes and e.registry_prefix not in self.registry_prefixes:
            return False
        if self.message_ids and e.record.get("MessageId") not in self.message_ids:
            return False
        if self.origin_resources and not any(e.origin == o or e.origin.startswith(o.rstrip("/") + "/")
                                             for o in self.origin_resources):
            return False
        return True

    def resource(self, uri: str) -> dict[str, Any]:
        return {"@odata.type": "#EventDestination.v1_16_0.EventDestination", "Id": self.id,
                "Name": f"Event subscription {self.id}", "Destination": self.destination, "Protocol": "Redfish",
                "SubscriptionType": "RedfishEvent", "Context": self.context, "EventTypes": self.event_types,
                "RegistryPrefixes": self.registry_prefixes, "MessageIds": self.message_ids,
                "OriginResources": [{"@odata.id": o} for o in self.origin_resources],
                "HttpHeaders": [], "VerifyCertificate": self.verify_certificate, "EventFormatType": "Event",
                "DeliveryRetryPolicy": self.retry_policy,
                "Status": {"State": "Enabled", "Health": "OK"}, "@odata.id": uri}


RETRY_POLICIES = ("TerminateAfterRetries", "RetryForever")


def check_destination(url: str) -> str:
    """A push destination the simulator will POST to: http(s) on the loopback only (it never leaves the host)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("Destination: expected an http:// or https:// URL")
    if parts.hostname not in LOOPBACK:
        raise ValueError(f"Destination: the simulator only delivers to the loopback ({', '.join(sorted(LOOPBACK))}), "
                         f"not {parts.hostname!r}")
    return url


class EventBus:
    """Numbers events, keeps the last `backlog` for `Last-Event-ID`, fans them out to streams and subscribers."""

    def __init__(self, backlog: int = 256, retry_attempts: int = 3, retry_interval: float = 1.0):
        self._ids = itertools.count(1)
        self.backlog: deque[Event] = deque(maxlen=backlog)
        self.log: deque[Event] = deque(maxlen=1000)  # the manager's event log (LogService entries); ClearLog empties it
        self.streams: set[SseClient] = set()
        self.streams_opened = 0  # every SSE stream ever opened (a client's reconnects show here)
        self.subscriptions: dict[str, Subscription] = {}
        self._sub_ids = itertools.count(1)
        self.retry_attempts = retry_attempts
        self.retry_interval = retry_interval
        self._loop: asyncio.AbstractEventLoop | None = None
        self._http: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5))

    async def stop(self) -> None:
        self.close_streams()
        for sub in list(self.subscriptions.values()):
            self.remove(sub.id)
        if self._http is not None:
            await self._http.close()

    # -- raising events -----------------------------------------------------------

    def publish(self, message_id: str, origin: str, *args: str, event_type: str = "Alert") -> Event:
        """Raise one event (from the simulator's loop or any thread); it reaches every stream and subscriber."""
        m = message(message_id, *args)
        event_id = next(self._ids)
        record = {"EventType": event_type, "EventId": str(event_id), "EventTimestamp": now_iso(), "MemberId": "0",
                  "Severity": m["MessageSeverity"], **m, "OriginOfCondition": {"@odata.id": origin}}
        return self.publish_record(record, event_id)

    def publish_record(self, record: dict[str, Any], event_id: int | None = None) -> Event:
        if event_id is None:
            event_id = next(self._ids)
            record = dict(record, EventId=str(event_id))
        event = Event(event_id, record)
        self.log.append(event)
        loop = self._loop
        if loop is None or loop.is_closed():
            self.backlog.append(event)
            return event
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._fan_out(event)
        else:
            loop.call_soon_threadsafe(self._fan_out, event)
        return event

    def _fan_out(self, event: Event) -> None:
        self.backlog.append(event)
        for client in list(self.streams):
            if client.match(event):
                client.queue.put_nowait(event)
        for sub in self.subscriptions.values():
            if sub.wants(event):
                sub.queue.put_nowait(event)

    @staticmethod
    def log_entry(event: Event, uri: str) -> dict[str, Any]:
        """An event as the LogEntry the manager's log shows for it."""
        rec = event.record
        entry = {"@odata.type": "#LogEntry.v1_17_0.LogEntry", "Id": str(event.id), "Name": f"Log Entry {event.id}",
                 "EntryType": "Event", "Created": rec.get("EventTimestamp"), "Severity": rec.get("MessageSeverity"),
                 "Message": rec.get("Message"), "MessageId": rec.get("MessageId"),
                 "MessageArgs": rec.get("MessageArgs", []), "@odata.id": uri}
        if "OriginOfCondition" in rec:
            entry["Links"] = {"OriginOfCondition": rec["OriginOfCondition"]}
        return entry

    def since(self, last_id: int) -> list[Event]:
        return [e for e in self.backlog if e.id > last_id]

    # -- SSE streams --------------------------------------------------------------

    def open_stream(self, match: Callable[[Event], bool], session: str | None) -> SseClient:
        self.streams_opened += 1
        client = SseClient(match, session)
        self.streams.add(client)
        return client

    def send_garbage(self, kind: str, size: int = 2 << 20) -> int:
        """Write a malformed frame to every open SSE stream, as a broken or hostile BMC might: `long-line` (one
        data line of `size` bytes, no newline inside), `not-json` (data that is no JSON), `not-utf8` (bytes
        that are no UTF-8). Returns how many streams got it. Call on the service's loop."""
        frames = {"long-line": b"data: {\"x\": \"" + b"x" * size + b"\"}\n\n",
                  "not-json": b"data: {this is not json\n\n",
                  "not-utf8": b"data: {\"Events\": [\"\xff\xfe\xc3\x28\"]}\n\n"}
        frame = frames[kind]  # KeyError: the fault kind checked it first
        for client in list(self.streams):
            client.queue.put_nowait(frame)
        return len(self.streams)

    def close_stream(self, client: SseClient) -> None:
        self.streams.discard(client)

    def close_streams(self) -> None:
        """End every stream (the BMC going offline or stopping)."""
        for client in list(self.streams):
            self.streams.discard(client)
            client.close()

    def close_session_streams(self, session: str) -> None:
        """End the streams opened with one session (its logout or expiry ends them, as DSP0266 says)."""
        for client in list(self.streams):
            if client.session == session:
                self.streams.discard(client)
                client.close()

    # -- push subscriptions -------------------------------------------------------

    def subscribe(self, destination: str, context: str = "", headers: dict[str, str] | None = None,
                  event_types: list[str] | None = None, registry_prefixes: list[str] | None = None,
                  message_ids: list[str] | None = None, origin_resources: list[str] | None = None,
                  verify_certificate: bool = False, retry_policy: str = "TerminateAfterRetries") -> Subscription:
        if retry_policy not in RETRY_POLICIES:
            raise ValueError(f"DeliveryRetryPolicy: one of {', '.join(RETRY_POLICIES)}")
        sub = Subscription(str(next(self._sub_ids)), check_destination(destination), context, dict(headers or {}),
                           list(event_types or ()), list(registry_prefixes or ()), list(message_ids or ()),
                           list(origin_resources or ()), verify_certificate, retry_policy)
        sub.task = asyncio.get_running_loop().create_task(self._deliver(sub))
        self.subscriptions[sub.id] = sub
        return sub

    def remove(self, sub_id: str) -> bool:
        sub = self.subscriptions.pop(sub_id, None)
        if sub is None:
            return False
        if sub.task is not None:
            sub.task.cancel()
        return True

    async def _post(self, sub: Subscription, body: dict[str, Any], tls: ssl.SSLContext | bool) -> bool:
        try:
            assert self._http is not None
            async with self._http.post(sub.destination, json=body, headers=sub.headers, ssl=tls) as resp:
                if resp.status < 300:
                    return True
                log.info("event delivery refused", extra={"destination": sub.destination, "status": resp.status})
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
            log.info("event delivery failed", extra={"destination": sub.destination, "error": str(exc)})
        return False

    async def _deliver(self, sub: Subscription) -> None:
        """POST each event to the subscriber in order, retrying every `retry_interval` seconds: `retry_attempts`
        times and then the subscription is deleted (TerminateAfterRetries), or until it lands (RetryForever)."""
        tls: ssl.SSLContext | bool = ssl.create_default_context() if sub.verify_certificate else False
        while True:
            event = await sub.queue.get()
            body = event.payload(sub.context)
            attempt = 0
            while not await self._post(sub, body, tls):
                attempt += 1
                if sub.retry_policy == "TerminateAfterRetries" and attempt > self.retry_attempts:
                    sub.failed += 1
                    log.info("event subscription terminated after retries", extra={"destination": sub.destination})
                    self.subscriptions.pop(sub.id, None)
                    return
                await asyncio.sleep(self.retry_interval)
            sub.delivered += 1
