"""A simulated rack with its Redfish services, and a plain aiohttp client that verifies them with the run's CA.

The client side is deliberately ordinary (aiohttp, TLS verified against the
simulator's CA file, sessions by POST to the Sessions collection, SSE read
line by line), so the tests check what the simulator serves on the wire, not
how some Redfish library reads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any, AsyncIterator

import aiohttp

from sim.server import Simulator

SESSIONS = "/redfish/v1/SessionService/Sessions"
SSE = "/redfish/v1/EventService/SSE"
TRAY_DETECTORS = "/redfish/v1/Chassis/Chassis_0/ThermalSubsystem/LeakDetection/LeakDetectors"
LONG = 30.0  # seconds: deadlines for conditions on a loaded 2-core machine; a pass never waits this long


@dataclass
class Rig:
    sim: Simulator
    rf: dict[str, Any]
    password: str
    http: aiohttp.ClientSession

    def url(self, service: str = "node01") -> str:
        return self.rf["bmcs"].get(service) or self.rf["cdus"][service]

    def basic(self) -> dict[str, str]:
        return {"Authorization": aiohttp.encode_basic_auth(self.rf["username"], self.password)}

    async def login(self, service: str = "node01") -> tuple[str, str]:
        """(token, session Location) of a new session."""
        async with self.http.post(self.url(service) + SESSIONS,
                                  json={"UserName": self.rf["username"], "Password": self.password}) as r:
            assert r.status == 201, await r.text()
            return r.headers["X-Auth-Token"], r.headers["Location"]

    async def get(self, path: str, service: str = "node01", token: str | None = None) -> tuple[int, Any]:
        headers = {"X-Auth-Token": token} if token else self.basic()
        async with self.http.get(self.url(service) + path, headers=headers) as r:
            body = await r.json(content_type=None) if r.content_type.endswith("json") else await r.text()
            return r.status, body

    def inject(self, kind: str, **params: Any) -> str:
        return self.sim.inject(kind, params)


@contextlib.asynccontextmanager
async def rig(workdir: Path, **sim_kwargs: Any) -> AsyncIterator[Rig]:
    """A 2-node simulator in this event loop and a client session that trusts its CA (and nothing else)."""
    sim = Simulator(nodes=2, gpus=2, workdir=workdir, advertise=False, **sim_kwargs)
    await sim.start()
    try:
        rf = sim.state()["redfish"]
        ctx = ssl.create_default_context(cafile=rf["ca_file"])
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx),
                                         timeout=aiohttp.ClientTimeout(total=LONG)) as http:
            yield Rig(sim, rf, Path(rf["password_file"]).read_text().strip(), http)
    finally:
        await sim.stop()


class SseReader:
    """An open SSE stream: `next_event(match)` returns the next (id, Event payload) the predicate accepts."""

    def __init__(self, resp: aiohttp.ClientResponse):
        self.resp = resp
        self.seen: list[tuple[int, dict]] = []

    async def _read(self) -> tuple[int, dict] | None:
        event_id, data = 0, []
        while True:
            raw = await self.resp.content.readline()
            if not raw:
                return None  # the stream ended
            line = raw.decode().rstrip("\r\n")
            if line.startswith(":"):
                continue  # keep-alive comment
            if line.startswith("id:"):
                event_id = int(line[3:].strip())
            elif line.startswith("data:"):
                data.append(line[5:].strip())
            elif not line and data:
                item = (event_id, json.loads("\n".join(data)))
                self.seen.append(item)
                return item

    async def next_event(self, match=lambda payload: True, timeout: float = LONG) -> tuple[int, dict]:
        async def find() -> tuple[int, dict]:
            while True:
                item = await self._read()
                if item is None:
                    raise AssertionError(f"SSE stream ended before the event came (seen: {self.seen})")
                if match(item[1]):
                    return item
        return await asyncio.wait_for(find(), timeout)

    async def ended(self, timeout: float = LONG) -> bool:
        """True once the service closed the stream (events before the end are kept in `seen`)."""
        async def drain() -> bool:
            while await self._read() is not None:
                pass
            return True
        try:
            return await asyncio.wait_for(drain(), timeout)
        except (aiohttp.ClientPayloadError, aiohttp.ServerDisconnectedError, ConnectionError):
            return True


@contextlib.asynccontextmanager
async def sse(r: Rig, service: str = "node01", token: str | None = None, query: str = "",
              last_event_id: int | None = None) -> AsyncIterator[SseReader]:
    headers = {"X-Auth-Token": token} if token else r.basic()
    if last_event_id is not None:
        headers["Last-Event-ID"] = str(last_event_id)
    async with r.http.get(r.url(service) + SSE + query, headers=headers,
                          timeout=aiohttp.ClientTimeout(total=None, sock_connect=LONG)) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        yield SseReader(resp)


def record(payload: dict) -> dict:
    """The one record of an Event payload the simulator sends."""
    assert payload["@odata.type"].startswith("#Event.")
    (rec,) = payload["Events"]
    return rec


def message_is(message_id: str, origin: str | None = None):
    def match(payload: dict) -> bool:
        rec = record(payload)
        return rec["MessageId"] == message_id and (origin is None or rec["OriginOfCondition"]["@odata.id"] == origin)
    return match
