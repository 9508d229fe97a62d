"""Rack PDU collector over SNMP v2c/v3: inlets, phases, outlets and energy, decoded by a profile.

One `PduSource` per PDU of the inventory. A poll is one multi-column
GETBULK walk of the columns the profile needs (exporters/snmp/reader.py);
the slowly changing scale columns (Raritan decimal digits, ENTITY-SENSOR
scale/precision) are walked on the first poll and then every
`scale_refresh` seconds only. Outlet switching (`set_outlet`) and the
one-shot probe live here too because they share the client and the profile.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Iterable

from exporters.model import MetricSpec, PollResult, Quality, Reading, SourceError
from exporters.power.pdu_metrics import (INLET_POWER, OUTLET_INFO, PDU_INFO, PROFILE_METRICS, RACK_BUDGET,
                                         RACK_POWER)
from exporters.snmp.client import MAX_REQUESTS, MAX_ROWS, SnmpClient, SnmpCredentials, credentials
from exporters.snmp.decode import CounterTracker, decode
from exporters.snmp.profile import Profile, load_profile, template_fields
from exporters.snmp.reader import ProfileReader
from exporters.render import render_probe
from exporters.power.snmp_autodetect import AUTO, Detection, detect

_PENDING = None  # PduSource.profile before `auto` has asked the device


def parse_target(target: str | tuple[str, int], default_port: int = 161) -> tuple[str, int]:
    if isinstance(target, tuple):
        return target
    host, sep, port = target.rpartition(":")
    if not sep:
        return target, default_port
    try:
        return host, int(port)
    except ValueError:
        raise SourceError("config", f"target {target!r}: port {port!r} is not a number") from None


class PduSource:
    """Source protocol implementation for one PDU (name "pdu", device = inventory name)."""

    def __init__(self, device: str, profile: Profile | str, target: str | tuple[str, int],
                 credentials: SnmpCredentials, timeout: float = 1.0, retries: int = 1, max_repetitions: int = 10,
                 outlet_feeds: dict[str, str] | None = None, scale_refresh: float = 300.0, name: str = "pdu",
                 max_rows: int = MAX_ROWS, max_requests: int = MAX_REQUESTS):
        self.name = name
        self.device = device
        # `auto`: chosen from sysObjectID/sysDescr on the first poll (the device may be down at start)
        self.auto = profile == AUTO
        self.detection: Detection | None = None
        self.profile: Profile = _PENDING if self.auto else (
            load_profile(profile) if isinstance(profile, str) else profile)  # type: ignore[assignment]
        self.host, self.port = parse_target(target)
        self.max_repetitions = max_repetitions
        self.outlet_feeds = dict(outlet_feeds or {})
        self.scale_refresh = scale_refresh
        self.client = SnmpClient(self.host, self.port, credentials, timeout=timeout, retries=retries,
                                 max_rows=max_rows, max_requests=max_requests)
        self.counters = CounterTracker()
        self._info: dict[str, str] = {}
        self.reader: ProfileReader | None = None
        if not self.auto:
            self._use(self.profile)

    def _use(self, profile: Profile) -> None:
        if profile.kind != "pdu":
            raise SourceError("config", f"profile {profile.profile!r} is a {profile.kind} profile, not a PDU's")
        self.profile = profile
        self.reader = ProfileReader(self.client, profile, max_repetitions=self.max_repetitions,
                                     refresh=self.scale_refresh)

    async def _resolve(self) -> None:
        """`profile: auto`: ask the device what it is, once (a failed attempt is retried on the next call)."""
        if self.auto and self.detection is None:
            detection = await detect(self.client)
            self._use(load_profile(detection.profile))
            self.detection = detection

    @property
    def requests(self) -> int:
        """SNMP requests sent so far (benchmark and probe figure)."""
        return self.client.requests

    async def poll(self) -> PollResult:
        await self._resolve()
        assert self.reader is not None
        merged, refreshed = await self.reader.read()
        if refreshed:
            self._info = await self.reader.identity(self._info)
        errors: dict[str, int] = {}
        now = time.time()
        try:
            readings = decode(self.profile, merged, self.device, self.counters, errors, now)
        except (ArithmeticError, ValueError) as exc:  # decode faults bad values per reading; this is the backstop
            raise SourceError("decode", f"{self.client.where}: cannot decode the walked values ({exc})") from None
        readings.append(Reading(PDU_INFO, 1.0, {
            "pdu": self.device, "vendor": self.profile.vendor, "model": self._info.get("model", ""),
            "firmware": self._info.get("firmware", ""), "profile": self.profile.profile}, Quality.OK, now))
        for outlet, node in sorted(self.outlet_feeds.items()):
            readings.append(Reading(OUTLET_INFO, 1.0, {"pdu": self.device, "outlet": str(outlet), "feeds": node},
                                    Quality.OK, now))
        return PollResult(readings, errors)

    def declared_families(self) -> dict[str, MetricSpec]:
        """Every family a poll of this PDU can publish: its profile's (any profile's with `auto`, which is not
        known before the device answers), its identity, and the outlet map's. What another agent accepts in
        this PDU's shared facts (agent.coordination.facts)."""
        specs = PROFILE_METRICS.values() if self.auto else (PROFILE_METRICS[m.metric] for m in self.profile.metrics)
        families = {s.name: s for s in specs}
        families[PDU_INFO.name] = PDU_INFO
        if self.outlet_feeds:
            families[OUTLET_INFO.name] = OUTLET_INFO
        return families

    def pinned_labels(self) -> dict[str, frozenset[str]]:
        """Label values this source alone decides: the PDU's name, and which nodes its outlets feed (the
        inventory's). Rows (inlet, phase, outlet, breaker) come from the device and are free."""
        pins = {"pdu": frozenset({self.device})}
        if self.outlet_feeds:
            pins["feeds"] = frozenset(self.outlet_feeds.values())
        return pins

    async def _outlet_oids(self, outlet: str | int) -> tuple[Any, str, str]:
        await self._resolve()
        oc = self.profile.outlet_control
        if oc is None:
            raise SourceError("config", f"profile {self.profile.profile!r} has no outlet_control (not switched)")
        table = self.profile.tables[oc.table]
        if oc.match is None:
            suffix = oc.index.format(**{**oc.defaults, "outlet": outlet})
        else:
            suffix = oc.index.format(**await self._outlet_row(oc.match, table.index, table.columns, str(outlet)))
        return oc, suffix, f"{table.columns[oc.state_column].oid}.{suffix}"

    async def _outlet_row(self, match: str, index: list[str], table_columns: dict[str, Any],
                          outlet: str) -> dict[str, int]:
        """Index parts of the row whose id columns spell `outlet` (row-index tables: APC module.number)."""
        names = sorted(template_fields(match))
        oids = [table_columns[n].oid for n in names]
        walked = await self.client.walk_columns(oids, self.max_repetitions)
        rows = set.intersection(*(set(walked.get(o, {})) for o in oids))
        for row in sorted(rows):
            if match.format(**{n: walked[o][row] for n, o in zip(names, oids)}) == outlet:
                return dict(zip(index, row))
        raise SourceError("config", f"{self.client.where}: no outlet {outlet!r} on this PDU (ids are {match})")

    async def outlet_on(self, outlet: str | int) -> bool:
        """Whether the outlet is on now (read-back and what remediation records before switching)."""
        oc, _, state_oid = await self._outlet_oids(outlet)
        state = (await self.client.get([state_oid])).get(state_oid)
        if state not in (oc.power_on.state, oc.power_off.state):
            raise SourceError("decode", f"outlet {outlet}: state {state!r} is neither on nor off")
        return state == oc.power_on.state

    async def set_outlet(self, outlet: str | int, on: bool, settle: float = 2.0) -> bool:
        """Switch one outlet by SNMP SET (profile's outlet_control) and read the state back.

        Returns True when the read-back state is the one asked for within
        `settle` seconds (PDUs may apply a command with a delay). Raises
        SourceError("config") for a PDU whose profile cannot switch.
        """
        oc, suffix, state_oid = await self._outlet_oids(outlet)
        want = oc.power_on if on else oc.power_off
        await self.client.set_int(f"{oc.command_oid}.{suffix}", want.command)
        deadline = time.monotonic() + settle
        while True:
            state = (await self.client.get([state_oid])).get(state_oid)
            if state == want.state:
                return True
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.1)

    async def close(self) -> None:
        self.client.close()


def pdus_not_summed(readings: Iterable[Reading], pdus: Iterable[str]) -> list[str]:
    """The PDUs of `pdus` whose inlet power cannot be summed now: no inlet reading (their source failing or
    stale), or one that is not OK."""
    seen: dict[str, bool] = {}
    for r in readings:
        if r.spec is INLET_POWER:
            pdu = r.label("pdu")
            seen[pdu] = seen.get(pdu, True) and r.ok
    return sorted(p for p in pdus if not seen.get(p, False))


def rack_power_readings(readings: Iterable[Reading], budget_watts: float | None,
                        pdus: Iterable[str] = ()) -> list[Reading]:
    """`supernode_rack_power_watts` (sum of all PDUs' inlet power) and the budget gauge.

    Only OK inlet readings count; with none at all the rack power is not
    emitted (a missing value, never a false 0 W). Given the rack's PDUs
    (`pdus`, the inventory's), it is emitted only while every one of them has
    its inlets read OK: the sum without one (A/B feeds: half the rack) would
    be the rack's power stated too low as if fresh, and an over-budget rack
    would read within its budget.
    """
    readings = list(readings)
    inlets = [r for r in readings if r.spec is INLET_POWER and r.ok]
    out: list[Reading] = []
    if inlets and not pdus_not_summed(readings, pdus):
        out.append(Reading(RACK_POWER, sum(r.value for r in inlets), {}, Quality.OK,
                           max(r.timestamp for r in inlets)))
    if budget_watts is not None:
        out.append(Reading(RACK_BUDGET, float(budget_watts), {}))
    return out


async def probe_snmp(profile_name: str, host: str, port: int, community: str | None = None,
                     v3_user: str | None = None, auth_key: str | None = None, priv_key: str | None = None,
                     auth_protocol: str = "SHA", priv_protocol: str = "AES", context: str = "",
                     timeout: float = 1.0, retries: int = 1, max_repetitions: int = 10,
                     pdu_name: str = "probe", max_rows: int = MAX_ROWS, max_requests: int = MAX_REQUESTS) -> str:
    """Poll one device once and return what the agent would export (Prometheus text).

    Raises SourceError with kind timeout / auth / decode (profile does not
    match the device) / config, and a message naming the problem.
    """
    creds = credentials(community, v3_user, auth_key, priv_key, auth_protocol, priv_protocol, context)
    source = PduSource(pdu_name, profile_name, (host, port), creds, timeout=timeout, retries=retries,
                       max_repetitions=max_repetitions, max_rows=max_rows, max_requests=max_requests)
    try:
        result = await source.poll()
    finally:
        await source.close()
    readings = result.readings + rack_power_readings(result.readings, None)
    text = render_probe("pdu", pdu_name, readings)
    if source.detection is not None:
        text = f"# profile auto chose {source.detection.profile}: {source.detection.reason}\n{text}"
    return text
