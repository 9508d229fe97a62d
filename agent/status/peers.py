"""The other nodes of the rack on the status page: this agent asks their agents, never the browser.

Why the agent and not the browser: the page may load nothing but its own origin (its Content
Security Policy says so), the operator's browser may not reach the other nodes' management
addresses, and each agent's TLS and client-certificate rules stay what they are: this agent
fetches `GET /api/v1/status/node` (open, like /api/v1/state: readings /metrics already serves)
from the URLs the inventory names (`inventory.agent_urls`, never a URL from a request), verifies
their certificates (`status.peer_tls.ca_file` or the system's, never skipped) and presents its own
client certificate to peers that require one. It polls only while a page is open.

A peer's answer is outside input: it is read up to a bound and validated into the node-card model
below (types, lengths, closed sets of states); anything else makes the node "not reachable",
with the reason, never a half-trusted card.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from exporters.validation import cut, error_lines

if TYPE_CHECKING:
    from agent.config import PeerTls

log = logging.getLogger("supernode.status")

MAX_ANSWER_BYTES = 1 << 20
NODE_PATH = "/api/v1/status/node"

Short = Annotated[str, Field(max_length=200)]
Num = Annotated[float, Field(allow_inf_nan=False)] | None


class _Card(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class GpuCard(_Card):
    index: Annotated[str, Field(max_length=32)]
    name: Short = ""
    temperature_celsius: Num = None
    slowdown_celsius: Num = None
    power_watts: Num = None
    limit_watts: Num = None
    default_limit_watts: Num = None
    capped: bool = False
    marks: list[Short] = Field(default_factory=list, max_length=16)
    nvlink: list[Literal["ok", "down", "ber", "errors", "unknown"]] = Field(default_factory=list, max_length=64)


class PortCard(_Card):
    port: Annotated[str, Field(max_length=64)]
    kind: Annotated[str, Field(max_length=16)] = ""
    state: Literal["ok", "down", "optic_low", "flapping", "unknown"]
    up: bool | None = None
    flapping: bool = False
    rx_min_dbm: Num = None
    rx_low_warning_dbm: Num = None


class AgentCard(_Card):
    rack: Short = ""
    node: Short = ""
    mode: Short = ""
    version: Short = ""


class NodeCard(_Card):
    """What `GET /api/v1/status/node` answers, and all of it the page shows for a node."""

    name: Short
    agent: AgentCard
    taken_at: float
    expected_gpus: int = Field(default=0, ge=0, le=1024)
    gpus: list[GpuCard] = Field(default_factory=list, max_length=256)
    ports: list[PortCard] = Field(default_factory=list, max_length=256)
    incidents_open: dict[Annotated[str, Field(max_length=16)], int] = Field(default_factory=dict, max_length=8)
    sources_failing: list[Short] = Field(default_factory=list, max_length=64)


def parse_card(data: Any, node: str) -> dict[str, Any]:
    """A peer's answer as a node card (ValueError naming what is wrong)."""
    try:
        card = NodeCard.model_validate(data)
    except ValidationError as err:
        raise ValueError(cut(error_lines(err, "answer is not a node card"), 300)) from None
    if card.name != node:
        raise ValueError(f"answers as node {cut(card.name, 60)!r}, not {node!r} (inventory.agent_urls)")
    return card.model_dump()


def client_ssl(tls: "PeerTls | None") -> ssl.SSLContext:
    """Verified TLS to the peers: their CA (or the system's), and this agent's client certificate if set."""
    ctx = ssl.create_default_context(cafile=str(tls.ca_file) if tls and tls.ca_file else None)
    if tls and tls.cert_file and tls.key_file:
        ctx.load_cert_chain(str(tls.cert_file), str(tls.key_file))
    return ctx


class PeerPoller:
    """Fetches every peer's node card every `interval` seconds while `run()` runs."""

    def __init__(self, urls: dict[str, str], interval: float, timeout: float, tls: "PeerTls | None",
                 on_change: Any = None):
        self.urls = dict(urls)
        self.interval = interval
        self.timeout = timeout
        self.tls = tls
        self.on_change = on_change
        self.results: dict[str, dict[str, Any]] = {}

    async def run(self) -> None:
        import aiohttp

        ctx = None
        said = False
        while any(u.startswith("https:") for u in self.urls.values()):
            try:
                ctx = client_ssl(self.tls)
                break
            except (OSError, ssl.SSLError) as exc:  # a CA or client certificate that does not load (yet)
                why = f"status.peer_tls does not load: {getattr(exc, 'strerror', None) or exc}"
                if not said:
                    log.error("status page: peers cannot be verified", extra={"error": why})
                    said = True
                self.results = {n: {"reach": "unreachable", "why": cut(why, 300), "url": u, "card": None,
                                    "fetched_at": None} for n, u in self.urls.items()}
                if self.on_change is not None:
                    self.on_change()
                await asyncio.sleep(self.interval)
        timeout = aiohttp.ClientTimeout(total=self.timeout)
        async with aiohttp.ClientSession(timeout=timeout, headers={"Accept": "application/json"}) as session:
            while True:
                started = time.monotonic()
                await asyncio.gather(*(self._fetch(session, node, url, ctx) for node, url in self.urls.items()))
                if self.on_change is not None:
                    self.on_change()
                await asyncio.sleep(max(0.1, self.interval - (time.monotonic() - started)))

    async def _fetch(self, session: Any, node: str, url: str, ctx: ssl.SSLContext | None) -> None:
        import aiohttp

        try:
            async with session.get(url + NODE_PATH, ssl=ctx if url.startswith("https:") else None,
                                   allow_redirects=False) as resp:
                body = await resp.content.read(MAX_ANSWER_BYTES + 1)
                if resp.status != 200:
                    raise ValueError(f"answered HTTP {resp.status}")
                if len(body) > MAX_ANSWER_BYTES:
                    raise ValueError(f"answer over {MAX_ANSWER_BYTES} bytes")
                import json

                card = parse_card(json.loads(body), node)
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as exc:
            why = str(exc) or type(exc).__name__
            if isinstance(exc, asyncio.TimeoutError):
                why = f"no answer within {self.timeout:g} s"
            prev = self.results.get(node, {})
            if prev.get("reach") != "unreachable":
                log.warning("status page: peer agent not reachable", extra={"node": node, "url": url, "error": why})
            self.results[node] = {"reach": "unreachable", "why": cut(why, 300), "url": url,
                                  "card": prev.get("card"), "fetched_at": prev.get("fetched_at")}
            return
        self.results[node] = {"reach": "peer", "why": "", "url": url, "card": card, "fetched_at": time.time()}

    def view(self, node: str, now: float) -> dict[str, Any]:
        """The page's entry for a peer node: its card (with its age) or why there is none."""
        if node not in self.urls:
            return {"reach": "not_configured", "why": "no agent URL for this node in inventory.agent_urls"}
        r = self.results.get(node)
        if r is None:
            return {"reach": "waiting", "why": "asking its agent", "url": self.urls[node]}
        age = None if r.get("fetched_at") is None else round(now - r["fetched_at"], 1)
        return {"reach": r["reach"], "why": r["why"], "url": r["url"], "age_seconds": age,
                # the last card it answered stays visible, marked not reachable (and how old it is)
                "card": r.get("card")}
