"""A CDU over SNMP (v2c/v3): its loop, pumps and leak inputs decoded by a `kind: cdu` SNMP profile.

The same families and labels as the Modbus CDU (`supernode_cdu_*{cdu, loop,
point}`, `supernode_leak_detected{zone, sensor}`), so the coolant and leak
detectors, the CDU view, the status page and the derived readings (heat
removed, dew point, approach, flow per watt) read it with no translation; the
transport, walks and decoding are the PDU's (exporters/snmp/). Like the Modbus
CDU it runs as two sources on the one device: `subset="leak"` reads only the
objects that feed leak families, on the fast leak schedule, and `subset="cdu"`
everything else every few seconds. `channels` maps the profile's leak
channels to inventory leak zones; with a map, a channel it leaves out is not
wired (no reading); without one a channel is labelled `<cdu>-ch<n>`.
"""

from __future__ import annotations

import time
from typing import Callable, Literal, Mapping

from exporters.cooling import coolant as cool
from exporters.cooling import modbus_metrics as mm
from exporters.cooling.coolant_readings import derived_readings
from exporters.cooling.leak import LEAK_METRICS, apply_leak_faults
from exporters.model import MetricSpec, PollResult, Reading, SourceError
from exporters.render import render_probe
from exporters.snmp.client import MAX_REQUESTS, MAX_ROWS, SnmpClient, SnmpCredentials
from exporters.snmp.decode import CounterTracker, decode
from exporters.snmp.profile import Profile, load_profile, template_fields
from exporters.snmp.reader import ProfileReader

Subset = Literal["all", "leak", "cdu"]


class SnmpCduSource:
    """One CDU read over SNMP through its profile; `name` is the source kind ("cdu" or "leak")."""

    def __init__(self, name: str, device: str, profile: Profile | str, target: tuple[str, int],
                 credentials: SnmpCredentials, timeout: float = 1.0, retries: int = 1, max_repetitions: int = 10,
                 channels: Mapping[int | str, str] | None = None, subset: Subset = "all",
                 coolant: cool.CoolantProperties = cool.PG25, rack_power_w: Callable[[], float | None] | None = None,
                 max_rows: int = MAX_ROWS, max_requests: int = MAX_REQUESTS, info_refresh: float = 300.0):
        self.name = name
        self.device = device
        self.profile = load_profile(profile) if isinstance(profile, str) else profile
        if self.profile.kind != "cdu":
            raise SourceError("config", f"profile {self.profile.profile!r} is a {self.profile.kind} profile, not a "
                                        f"CDU's")
        self.channels = {str(k): v for k, v in (channels or {}).items()}
        self.subset = subset
        self.coolant, self.rack_power_w = coolant, rack_power_w
        self.maps = frozenset(i for i, m in enumerate(self.profile.metrics)
                              if subset == "all" or (m.metric in LEAK_METRICS) == (subset == "leak"))
        if not self.maps:
            raise SourceError("config", f"profile {self.profile.profile!r}: nothing to read for subset {subset!r}")
        host, port = target
        self.client = SnmpClient(host, port, credentials, timeout=timeout, retries=retries, max_rows=max_rows,
                                 max_requests=max_requests)
        self.reader = ProfileReader(self.client, self.profile, [self.profile.metrics[i] for i in sorted(self.maps)],
                                    max_repetitions=max_repetitions, refresh=info_refresh)
        self.counters = CounterTracker()
        self.info: dict[str, str] = {}
        self._seen_leaks: set[tuple[str, str]] = set()

    @property
    def requests(self) -> int:
        return self.client.requests

    def zone(self, channel: str) -> str | None:
        """The leak zone of a channel: the inventory's map (None: a channel it leaves out is not wired), else
        `<cdu>-ch<channel>`."""
        if not self.channels:
            return f"{self.device}-ch{channel}"
        return self.channels.get(channel)

    def _is_cdu_poll(self) -> bool:
        return self.subset != "leak"

    async def poll(self) -> PollResult:
        columns, refreshed = await self.reader.read()
        if refreshed and self._is_cdu_poll():
            self.info = await self.reader.identity(self.info)
        now = time.time()
        errors: dict[str, int] = {}
        try:
            readings = decode(self.profile, columns, self.device, self.counters, errors, now, maps=self.maps,
                              zone_of=self.zone)
        except (ArithmeticError, ValueError) as exc:  # decode faults bad values per reading; this is the backstop
            raise SourceError("decode", f"{self.client.where}: cannot decode the read values ({exc})") from None
        readings = apply_leak_faults(readings)
        self._seen_leaks |= {(r.label("zone"), r.label("sensor")) for r in readings if r.spec is mm.LEAK_DETECTED}
        if self._is_cdu_poll():
            readings.append(Reading(mm.CDU_INFO, 1.0, {
                "cdu": self.device, "vendor": self.profile.vendor, "model": self.info.get("model", self.profile.model),
                "firmware": self.info.get("firmware", "unknown"), "profile": self.profile.profile}, timestamp=now))
            readings.extend(derived_readings(self.device, readings, self.coolant,
                                             self.rack_power_w() if self.rack_power_w else None, now))
        return PollResult(readings, errors)

    def _static(self, template: str | None) -> bool:
        return template is not None and not template_fields(template)

    @property
    def leak_sensors_known(self) -> bool:
        """Whether every leak input is known from the profile and the wiring alone (scalar objects with fixed
        channel and sensor); a leak table's rows are known only once a poll has read them."""
        return all(self._static(m.channel) and self._static(m.labels.get("sensor"))
                   for i, m in enumerate(self.profile.metrics) if i in self.maps and m.metric == mm.LEAK_DETECTED.name)

    def leak_sensors(self) -> list[tuple[str, str]]:
        """(zone, sensor) of every wired leak input: the profile's fixed ones, and the rows polls have read. The
        agent names these "unknown" (fault="source_down") when the CDU stops answering."""
        out = set(self._seen_leaks)
        for i, m in enumerate(self.profile.metrics):
            if i in self.maps and m.metric == mm.LEAK_DETECTED.name and self._static(m.channel) \
                    and self._static(m.labels.get("sensor")):
                zone = self.zone(m.channel or "")
                if zone is not None:
                    out.add((zone, m.labels["sensor"]))
        return sorted(out)

    def declared_families(self) -> dict[str, MetricSpec]:
        """Every family a poll of this source can publish: its maps', and a CDU poll's identity and derived
        families. What another agent accepts in this CDU's shared facts (agent.coordination.facts)."""
        fam = self.profile.families
        out = {fam.specs[self.profile.metrics[i].metric].name: fam.specs[self.profile.metrics[i].metric]
               for i in self.maps}
        if self._is_cdu_poll():
            out.update((s.name, s) for s in (mm.CDU_INFO, *mm.DERIVED))
        return out

    def pinned_labels(self) -> dict[str, frozenset[str]]:
        """Label values this source alone decides: the CDU's name, the zones its wiring gives, the profile's fixed
        labels (loop, point, sensor...), the CDU's vendor and profile. Labels templated on rows are free."""
        values: dict[str, set[str]] = {"cdu": {self.device}}
        if self.channels:
            values["zone"] = set(self.channels.values())
        templated: set[str] = set()
        for i in self.maps:
            for k, t in self.profile.metrics[i].labels.items():
                (values.setdefault(k, set()).add(t) if self._static(t) else templated.add(k))
        for k in templated:
            values.pop(k, None)
        if self._is_cdu_poll():
            values.update(vendor={self.profile.vendor}, profile={self.profile.profile})
        return {k: frozenset(v) for k, v in values.items()}

    async def close(self) -> None:
        self.client.close()


async def probe_snmp_cdu(profile: Profile, host: str, port: int, credentials: SnmpCredentials,
                         timeout: float = 1.0, retries: int = 1, max_repetitions: int = 10, name: str = "probe",
                         max_rows: int = MAX_ROWS, max_requests: int = MAX_REQUESTS) -> str:
    """Read a CDU once through a `kind: cdu` profile and return what the agent would export (Prometheus text).

    Raises SourceError (timeout / auth / decode: the profile matches nothing on the device / config)."""
    source = SnmpCduSource("cdu", name, profile, (host, port), credentials, timeout=timeout, retries=retries,
                           max_repetitions=max_repetitions, max_rows=max_rows, max_requests=max_requests)
    try:
        result = await source.poll()
    finally:
        await source.close()
    return render_probe("cdu", name, result.readings)
