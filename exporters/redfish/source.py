"""The Redfish collector: one service (a tray's BMC, a CDU), walked once, then polled for what the walk found.

A poll reads only the resources the cached tree lists (leak detectors,
coolant connectors, pumps, filters, reservoirs), in parallel over at most
`max_connections` connections. The tree is walked again after a 404 on a
cached resource (the BMC rebuilt its tree) and every `rediscover_s`; a
periodic walk that fails keeps the old tree (the detectors are still read).
Tray detectors feed `supernode_leak_detected{zone, sensor}` in the tray's
zone (the same series as a Modbus leak input); the leak detectors tell a
tray's own leak from its zone's by the sensor's BMC (agent/remediation/leak_scope.py). Events (SSE or push) ask for
an immediate poll through `poll_trigger`; polling stays the fallback.

Until the event subscription is confirmed (the SSE stream opened, the push subscription made) and whenever it is
lost, the source asks for a poll every `unconfirmed_poll_s` (the leak interval), from a task of its own so that a
failed poll does not end it (the runtime's backoff still spaces the polls of a failing service): before, a tray
leak in the first seconds after a start waited for the 2 s poll, three to six times a Modbus leak's time to a
drain, because the event path that makes the slow interval safe was not there yet.

Once the SSE stream is open it is the fast path, and the timer's polls are the fallback: the
runtime leaves a timed poll out (`defer_timed_poll`, the store entry vouched fresh) until `confirmed_poll_s` has
passed since the last poll, so a healthy stream costs one poll every `confirmed_poll_s` instead of one every
interval (issue 38: the two Redfish services were half the polls' CPU of a demo node). The moment the stream is
lost every timed poll runs again, and the unconfirmed polling starts with the poll the watch asks for.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections import Counter
from typing import Any, Callable

from exporters.base import PollTrigger
from exporters.cooling import modbus_metrics as mm
from exporters.model import MetricSpec, PollResult, Reading, SourceError
from exporters.redfish import metrics as rm
from exporters.redfish.client import SERVICE_ROOT, NotFound, RedfishClient
from exporters.redfish.decode import DETECTOR_FAULT, detector_readings, resource_readings, sensor_name
from exporters.redfish.discovery import Tree, discover
from exporters.redfish.events import EventWatch
from exporters.redfish.profile import Profile, load_profile

log = logging.getLogger("supernode.redfish")


class RedfishSource:
    """One Redfish service polled through a profile; `device` is its inventory name (the `bmc` label)."""

    name = "redfish"

    def __init__(self, device: str, client: RedfishClient, *, kind: str = "tray", profile: Profile | str = "dmtf",
                 zone: str | None = None, rediscover_s: float = 600.0, events: str = "auto",
                 push_destination: str | None = None, push_token: str | None = None, event_retry_s: float = 0.5,
                 event_min_poll_s: float = 1.0, unconfirmed_poll_s: float = 0.0, confirmed_poll_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic):
        self.device = device
        self.kind = kind
        self.client = client
        self.profile = load_profile(profile) if isinstance(profile, str) else profile
        self.zone = zone or device
        self.rediscover_s = rediscover_s
        self.clock = clock
        self.poll_trigger = PollTrigger()
        self.events = EventWatch(client, self.profile, self.poll_trigger.fire, mode=events,  # type: ignore[arg-type]
                                 push_destination=push_destination, push_token=push_token, context=device,
                                 retry_s=event_retry_s, retry_max_s=max(60.0, event_retry_s),
                                 min_poll_s=event_min_poll_s) \
            if events != "off" else None
        self.tree: Tree | None = None
        self.discoveries: Counter[str] = Counter()
        self._walk_lock = asyncio.Lock()
        self._released = False  # let go of the service (another agent polls it): re-subscribe at the next poll
        self.unconfirmed_poll_s = unconfirmed_poll_s  # 0: the timer alone, events or not
        self._fast: asyncio.Task | None = None  # asks for polls while events are not confirmed
        self.confirmed_poll_s = confirmed_poll_s  # 0: every timed poll runs, events or not
        self._polled_at = -math.inf  # clock() when the last poll started (timed, forced or an event's)

    # -- Source protocol ------------------------------------------------------------

    async def poll(self) -> PollResult:
        self._polled_at = self.clock()
        self._ensure_fast()
        partial: Counter[str] = Counter()
        tree = await self._tree(partial)
        if self._released:  # polling again after a release: the event subscription was closed with it
            self._released = False
            self._ensure_fast()
            if self.events is not None:
                await self.events.update(tree)
        now = time.time()
        readings, missing = await self._read(tree, partial, now)
        if missing:  # a cached resource is gone: the service rebuilt its tree; walk it again, read again
            tree = await self._walk("not_found")
            readings, missing = await self._read(tree, partial, now)
            partial["not_found"] += len(missing)
        readings.extend(self._meta(tree, now))
        return PollResult(readings, dict(partial))

    @property
    def unconfirmed_polling(self) -> bool:
        """Whether the source polls itself every `unconfirmed_poll_s`: events on, not confirmed, not released."""
        return bool(self.unconfirmed_poll_s) and self.events is not None and not self.events.up \
            and not self._released

    def defer_timed_poll(self) -> bool:
        """Whether the timer's poll may be left out (the runtime asks at each tick): while the SSE stream is open,
        a change arrives as an event and its poll at once, so the timer's polls are only the fallback and the
        check that the service still answers, one every `confirmed_poll_s`. The moment the stream is lost this is
        False again (and the unconfirmed polling starts: the watch asks for a poll when its stream drops). SSE
        only: its connection says when it is lost, while a push subscription a rebooted BMC forgot is silent until
        the next walk re-makes it, so a push service keeps its timer."""
        ev = self.events
        return bool(self.confirmed_poll_s) and ev is not None and ev.up and ev.transport == "sse" \
            and not self._released and self.clock() - self._polled_at < self.confirmed_poll_s

    def _ensure_fast(self) -> None:
        """At each poll: while events are not confirmed, a task asks for a poll every `unconfirmed_poll_s`; it
        ends once the stream is up (the timer alone from then on), and the next poll after events are lost
        starts it again (the watch asks for one at once when its stream drops)."""
        if self.unconfirmed_polling and (self._fast is None or self._fast.done()):
            self._fast = asyncio.get_running_loop().create_task(self._fast_polls())

    async def _fast_polls(self) -> None:
        while self.unconfirmed_polling:
            await asyncio.sleep(self.unconfirmed_poll_s)
            if self.unconfirmed_polling:
                self.poll_trigger.fire()

    def _disarm_fast(self) -> None:
        if self._fast is not None:
            self._fast.cancel()  # not awaited: it only sleeps and fires the trigger
            self._fast = None

    async def close(self) -> None:
        self._disarm_fast()
        self.poll_trigger.detach()
        if self.events is not None:
            await self.events.close()
        await self.client.close()

    async def release(self) -> None:
        """Let go of the service while another agent polls it (rack coordination): close the event subscription
        and log out, so a CDU or BMC, which serves few clients, sees only its pollers. The tree is kept (its leak
        detectors stay known); the next poll logs in again and re-subscribes."""
        async with self._walk_lock:
            self._released = True
            self._disarm_fast()
            if self.events is not None:
                await self.events.close()
            await self.client.close()

    # -- discovery ----------------------------------------------------------------------

    async def _tree(self, partial: Counter[str]) -> Tree:
        tree = self.tree
        if tree is None:
            return await self._walk("first")
        if self.clock() - tree.walked_at >= self.rediscover_s:
            try:
                return await self._walk("periodic")
            except SourceError as exc:  # keep reading what we know; the next poll walks again
                partial[f"discovery_{exc.kind}"] += 1
                tree.walked_at = self.clock() - self.rediscover_s + min(self.rediscover_s, 30.0)
        return tree

    async def _walk(self, why: str) -> Tree:
        async with self._walk_lock:
            tree = await discover(self.client, self.profile)
            self.discoveries[why] += 1
            tree.walked_at = self.clock()
            self.tree = tree
            self._released = False
            if self.events is not None:
                await self.events.update(tree)
            log.info("redfish tree walked", extra={"device": self.device, "why": why,
                                                    "resources": len(tree.resources), "requests": tree.requests,
                                                    "events": self.events.transport if self.events else "off"})
            return tree

    # -- reading --------------------------------------------------------------------------

    async def _read(self, tree: Tree, partial: Counter[str], now: float) -> tuple[list[Reading], list[str]]:
        if not tree.resources:  # nothing to read: the root says whether the service is there at all
            await self.client.get(SERVICE_ROOT, authenticated=False)
            return [], []
        got = await asyncio.gather(*(self.client.get(r.uri) for r in tree.resources), return_exceptions=True)
        readings: list[Reading] = []
        missing: list[str] = []
        errors: list[SourceError] = []
        for found, res in zip(tree.resources, got):
            if isinstance(res, NotFound):
                missing.append(found.uri)
            elif isinstance(res, SourceError):
                errors.append(res)
                partial[res.kind] += 1
            elif isinstance(res, BaseException):
                raise res
            elif found.kind == "leak_detector":
                readings.extend(detector_readings(self.device, self.zone, found, res, self.profile, now))
            else:
                readings.extend(resource_readings(self.device, found, res, self.profile, now))
        if errors and len(errors) + len(missing) == len(tree.resources):
            raise errors[0]  # nothing answered: the service is down (the kind says how)
        return readings, missing

    def _meta(self, tree: Tree, now: float) -> list[Reading]:
        bmc = {"bmc": self.device}
        eq = next((e for e in tree.equipment if e.kind != "chassis"), None) or \
            next(iter(tree.equipment), None)
        vendor = str(tree.root.get("Vendor") or (eq.vendor if eq else "unknown"))
        out = [Reading(rm.SERVICE_INFO, 1.0, {**bmc, "kind": self.kind, "redfish_version": tree.redfish_version,
                                              "vendor": vendor, "model": eq.model if eq else "unknown",
                                              "firmware": eq.firmware if eq else "unknown",
                                              "profile": self.profile.name}, timestamp=now),
               Reading(rm.REQUESTS, float(self.client.stats.requests), bmc, timestamp=now),
               Reading(rm.LOGINS, float(self.client.stats.logins), bmc, timestamp=now)]
        out += [Reading(rm.DISCOVERIES, float(n), {**bmc, "why": why}, timestamp=now)
                for why, n in sorted(self.discoveries.items())]
        if self.events is not None:
            ev = self.events
            out.append(Reading(rm.EVENT_STREAM_UP, 1.0 if ev.up else 0.0, {**bmc, "transport": ev.transport},
                               timestamp=now))
            out += [Reading(rm.EVENTS, float(n), {**bmc, "triggered": str(hit).lower()}, timestamp=now)
                    for hit, n in sorted(ev.received.items())]
            out += [Reading(rm.EVENT_STREAM_ERRORS, float(n), {**bmc, "reason": reason}, timestamp=now)
                    for reason, n in sorted(ev.failures.items())]
            out.append(Reading(rm.EVENT_POLLS_COALESCED, float(ev.coalesced), bmc, timestamp=now))
            if self.unconfirmed_poll_s:
                out.append(Reading(rm.UNCONFIRMED_POLLING, 1.0 if self.unconfirmed_polling else 0.0, bmc,
                                   timestamp=now))
        return out

    # -- for the agent ----------------------------------------------------------------------

    def declared_families(self) -> dict[str, MetricSpec]:
        """Every family a poll of this service can publish: its profile's fields, its leak detectors' (their
        state, health and leak series), its identity and client counters, its event stream's (whatever this
        agent's own `events` setting: the poller's may differ). What another agent accepts in this service's
        shared facts (agent.coordination.facts)."""
        families = {rule.metric: rm.ALL[rule.metric] for rules in self.profile.fields.values()
                    for rule in rules.values()}
        families.update((s.name, s) for s in (rm.DETECTOR_STATE, rm.HEALTH, mm.LEAK_DETECTED, mm.LEAK_FAULT,
                                              rm.SERVICE_INFO, rm.REQUESTS, rm.LOGINS, rm.DISCOVERIES, rm.EVENTS,
                                              rm.EVENT_STREAM_UP, rm.EVENT_STREAM_ERRORS, rm.EVENT_POLLS_COALESCED,
                                              rm.UNCONFIRMED_POLLING))
        return families

    def pinned_labels(self) -> dict[str, frozenset[str]]:
        """Label values this source alone decides: the service's name, its leak zone (the inventory's), the
        detector fault and the profile. Resource ids and names come from the service and are free."""
        return {"bmc": frozenset({self.device}), "zone": frozenset({self.zone}),
                "fault": frozenset({DETECTOR_FAULT}), "profile": frozenset({self.profile.name})}

    @property
    def leak_sensors_known(self) -> bool:
        """Whether `leak_sensors` names the detectors (walked) or stands in for the service as a whole."""
        return self.tree is not None

    def leak_sensors(self) -> list[tuple[str, str]]:
        """(zone, sensor) of every leak detector the walk found; before a first walk, the service as a whole.

        The leak watch exports these as unknown (fault="source_down") while the service does not answer.
        """
        if self.tree is None:
            return [(self.zone, self.device)]
        return sorted((self.zone, sensor_name(self.device, d)) for d in self.tree.of("leak_detector"))

    def push_received(self, payload: dict[str, Any]) -> bool:
        """An event pushed to the agent's endpoint for this service; True when it triggered a re-read."""
        if self.events is None or not isinstance(payload, dict):
            return False
        return self.events.push_received(payload)
