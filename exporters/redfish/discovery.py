"""Walk a Redfish service from its root by following links, as the profile says, into a cached `Tree`.

Why a walk and a cache: vendors put the same resource in different places
(a GB200 tray BMC under Chassis_0/ThermalSubsystem/LeakDetection, DMTF's CDU
mockup straight under Chassis/CDU/LeakDetectors), so nothing is a built path;
and a walk costs tens of requests, so it runs once, again after a 404 on a
cached resource, and every few minutes. Steady-state polls then read only
the resources the tree lists (leak detectors, connectors, pumps...).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

from exporters.model import SourceError
from exporters.redfish.client import SERVICE_ROOT, NotFound, RedfishClient
from exporters.redfish.profile import Chain, Profile


@dataclass(frozen=True, slots=True)
class Found:
    """One resource a poll reads, with the labels its readings carry."""

    kind: str  # leak_detector | connector | pump | filter | reservoir | chassis | sensor
    uri: str
    equipment: str  # "Chassis/Chassis_0", "CDUs/1": where it was found
    chassis: str  # the chassis Id (a CDU's detectors: the chassis the CDU links, else its equipment label)
    rid: str  # the resource's own Id
    loop: str | None = None
    type: str = ""  # LeakDetectorType of a detector


@dataclass(frozen=True, slots=True)
class Equipment:
    kind: str  # chassis | cdu | heat_exchanger | immersion_unit
    uri: str
    label: str
    vendor: str
    model: str
    firmware: str


@dataclass(frozen=True, slots=True)
class System:
    uri: str
    reset_target: str | None
    reset_types: tuple[str, ...]


@dataclass
class Tree:
    root: dict[str, Any]
    resources: list[Found] = field(default_factory=list)
    equipment: list[Equipment] = field(default_factory=list)
    systems: list[System] = field(default_factory=list)
    sse_uri: str | None = None
    subscriptions_uri: str | None = None
    event_types: tuple[str, ...] = ()
    walked_at: float = field(default_factory=time.monotonic)
    requests: int = 0

    def of(self, kind: str) -> list[Found]:
        return [r for r in self.resources if r.kind == kind]

    @property
    def redfish_version(self) -> str:
        return str(self.root.get("RedfishVersion", "unknown"))


def _link(obj: Any, prop: str) -> str | None:
    value = obj.get(prop) if isinstance(obj, dict) else None
    uri = value.get("@odata.id") if isinstance(value, dict) else None
    return uri if isinstance(uri, str) and uri else None


def _id(res: dict[str, Any], uri: str) -> str:
    rid = res.get("Id")
    return str(rid) if isinstance(rid, (str, int)) and str(rid) else uri.rstrip("/").rsplit("/", 1)[-1]


def check_root(root: Any, origin: str) -> dict[str, Any]:
    """The service root, or SourceError(protocol) saying this is not a Redfish service."""
    if not isinstance(root, dict) or not ("RedfishVersion" in root or "@odata.id" in root):
        raise SourceError("protocol", f"{origin}{SERVICE_ROOT} is not a Redfish service (no RedfishVersion or "
                                      f"@odata.id in its root)")
    return root


class Walker:
    """Follows chains with one client; a chain that ends in a 404 or a missing link is simply not there."""

    def __init__(self, client: RedfishClient):
        self.client = client

    async def _get(self, uri: str) -> dict[str, Any] | None:
        try:
            return await self.client.get(uri)
        except NotFound:
            return None

    async def _expand(self, res: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        """A collection's members (each read, unless already expanded), or the resource itself."""
        members = res.get("Members")
        if not isinstance(members, list):
            return [(str(res.get("@odata.id", "")), res)]
        uris = [m.get("@odata.id") for m in members if isinstance(m, dict) and isinstance(m.get("@odata.id"), str)]
        got = await asyncio.gather(*(self._get(u) for u in uris))
        return [(u, r) for u, r in zip(uris, got) if r is not None]

    async def follow(self, start: dict[str, Any], chain: Chain) -> list[tuple[str, dict[str, Any]]]:
        current = [(str(start.get("@odata.id", "")), start)]
        for prop in chain:
            links = [u for u in (_link(res, prop) for _, res in current) if u]
            fetched = await asyncio.gather(*(self._get(u) for u in links))
            current = []
            for uri, res in zip(links, fetched):
                if res is not None:
                    current.extend((m_uri or uri, m) for m_uri, m in await self._expand(res))
        return current

    async def first(self, start: dict[str, Any], chains: list[Chain]) -> list[tuple[str, dict[str, Any]]]:
        out: list[tuple[str, dict[str, Any]]] = []
        for chain in chains:
            out.extend(await self.follow(start, chain))
        return out


def _equipment(kind: str, uri: str, res: dict[str, Any], label: str) -> Equipment:
    return Equipment(kind, uri, label, str(res.get("Manufacturer") or "unknown"), str(res.get("Model") or "unknown"),
                     str(res.get("FirmwareVersion") or "unknown"))


async def discover(client: RedfishClient, profile: Profile) -> Tree:
    """The whole tree the agent needs, walked from the service root; SourceError when the walk cannot finish."""
    start_requests = client.stats.requests
    try:
        root = check_root(await client.get(SERVICE_ROOT, authenticated=False), client.origin)
    except NotFound:
        raise SourceError("protocol", f"{client.origin} is not a Redfish service: {SERVICE_ROOT} not found") from None
    except SourceError as exc:
        if exc.kind != "decode":
            raise
        raise SourceError("protocol", f"{client.origin} is not a Redfish service: {exc}") from None
    sessions = _link(root.get("Links"), "Sessions")
    if sessions is None:
        ss = _link(root, "SessionService")
        sessions = f"{ss.rstrip('/')}/Sessions" if ss else None  # only a hint: the login reads it as a link
    client.sessions_uri = sessions
    walk = Walker(client)
    tree = Tree(root=root)
    holders: list[tuple[str, str, dict[str, Any], str]] = []  # (under, label, resource, chassis id)
    for uri, res in await walk.first(root, profile.walk.chassis):
        cid = _id(res, uri)
        tree.equipment.append(_equipment("chassis", uri, res, f"Chassis/{cid}"))
        holders.append(("chassis", f"Chassis/{cid}", res, cid))
    for kind, chains in profile.walk.equipment.items():
        for chain in chains:
            for uri, res in await walk.follow(root, chain):
                label = f"{chain[-1]}/{_id(res, uri)}"
                linked = [u for u in (c.get("@odata.id") for c in (res.get("Links") or {}).get("Chassis") or []
                                      if isinstance(c, dict)) if isinstance(u, str)]
                chassis = linked[0].rstrip("/").rsplit("/", 1)[-1] if linked else label
                tree.equipment.append(_equipment(kind, uri, res, label))
                holders.append(("equipment", label, res, chassis))
    seen_uri: set[str] = set()
    seen_detector: set[tuple[str, str]] = set()
    for under, label, res, chassis in holders:
        for rule in profile.rules(under):
            for uri, item in await walk.follow(res, rule.path):
                rid = _id(item, uri)
                if uri in seen_uri or (rule.reading_type is not None and item.get("ReadingType") != rule.reading_type):
                    continue
                if rule.kind == "leak_detector":
                    # One physical detector shown twice (a CDU's LeakDetection and its chassis' LeakDetectors).
                    if (chassis, rid) in seen_detector:
                        continue
                    seen_detector.add((chassis, rid))
                seen_uri.add(uri)
                tree.resources.append(Found(rule.kind, uri, label, chassis, rid, rule.loop,
                                            str(item.get("LeakDetectorType") or "unknown")))
    for uri, res in await walk.first(root, profile.walk.systems):
        action = (res.get("Actions") or {}).get(profile.power.action) or {}
        target = action.get("target") if isinstance(action, dict) else None
        types = action.get("ResetType@Redfish.AllowableValues") if isinstance(action, dict) else None
        tree.systems.append(System(uri, target if isinstance(target, str) else None,
                                   tuple(str(t) for t in types) if isinstance(types, list) else ()))
    for _, es in await walk.first(root, profile.walk.event_service):
        if es.get("ServiceEnabled") is False:
            continue
        sse = es.get("ServerSentEventUri")
        tree.sse_uri = sse if isinstance(sse, str) and sse else None
        tree.subscriptions_uri = _link(es, "Subscriptions")
        types = es.get("EventTypesForSubscription")
        tree.event_types = tuple(str(t) for t in types) if isinstance(types, list) else ()
    tree.requests = client.stats.requests - start_requests
    return tree
