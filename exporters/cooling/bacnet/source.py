"""The BACnet/IP collector of a CDU: one ReadPropertyMultiple per poll, COV push for its leak and alarm points.

A `BacnetSource` polls one device through its profile into the cooling
families every CDU protocol shares (`supernode_cdu_*`, `supernode_leak_*`),
so the coolant and leak detectors, the leak zones' channels and rack
coordination treat it as they treat a Modbus CDU: the same source names
(`cdu`, `leak`), the same subsets (a CDU's leak inputs run on the fast leak
schedule; both polls share one client), the same derived readings.

COV: a notification carries the object's new present value and status
flags, the whole state of that object, so it becomes that reading at once:
the source asks the runtime for a poll (`poll_trigger`), and that poll hands
out the last read with the pushed values in it, without asking the device
(one round trip from the change to the snapshot, whatever the poll
interval). Each reading keeps the time it was read or pushed. The leak
detector's confirmation of a first wet reading is a real read (the next
poll). Timed polls always read the device.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Literal, Mapping

from bacpypes3.primitivedata import ObjectIdentifier

from exporters.base import PollTrigger
from exporters.cooling import coolant as cool
from exporters.cooling import modbus_metrics as mm
from exporters.cooling.bacnet import metrics as bm
from exporters.cooling.bacnet.client import BacnetLink, release_link
from exporters.cooling.bacnet.cov import CovWatch
from exporters.cooling.bacnet.decode import LEAK_FAULT_LABELS, PointPlan, PropertyProblem, cast_value
from exporters.cooling.bacnet.profile import Point, Profile, ProfileError, load_profile
from exporters.cooling.coolant_readings import derived_readings
from exporters.model import MetricSpec, PollResult, Reading, SourceError

Subset = Literal["all", "leak", "cdu"]
LEAK_METRICS = {mm.LEAK_DETECTED.name, mm.LEAK_FAULT.name, mm.LEAK_LOCATION.name}


def has_leak_points(profile: Profile | str) -> bool:
    prof = load_profile(profile) if isinstance(profile, str) else profile
    return any(p.metric in LEAK_METRICS for p in prof.points)


class BacnetSource:
    def __init__(self, name: str, device: str, profile: Profile | str, link: BacnetLink, *,
                 channels: Mapping[int, str] | None = None, subset: Subset = "all",
                 coolant: cool.CoolantProperties = cool.PG25, rack_power_w: Callable[[], float | None] | None = None,
                 cov: bool = True, cov_lifetime: int = 300, client_metrics: bool = True):
        self.name, self.device = name, device
        self.profile = load_profile(profile) if isinstance(profile, str) else profile
        self.link = link
        self.channels = {int(k): v for k, v in (channels or {}).items()}
        self.subset = subset
        # The client's counters are the device's (its polls share one client): one of its sources publishes them.
        self.client_metrics = client_metrics
        self.coolant, self.rack_power_w = coolant, rack_power_w
        points = [p for p in self.profile.points if self.wired(p)]
        if subset == "leak":
            points = [p for p in points if p.metric in LEAK_METRICS]
        elif subset == "cdu":
            points = [p for p in points if p.metric not in LEAK_METRICS]
        if not points:
            raise ProfileError(f"BACnet profile {self.profile.name}: no points for subset {subset!r}")
        self.plans = {ObjectIdentifier(p.object): PointPlan(p, self._labels(p)) for p in points}
        self._objects = [(objid, plan.props) for objid, plan in self.plans.items()]
        self.poll_trigger = PollTrigger()
        self.cov = CovWatch(link, [o for o, plan in self.plans.items() if plan.point.cov], self._pushed_value,
                            lifetime=cov_lifetime, enabled=cov)
        self._state: dict[ObjectIdentifier, dict[str, Any]] | None = None
        self._at: dict[ObjectIdentifier, float] = {}
        self._push_pending = False
        self._fire_scheduled = False

    # -- Source protocol ----------------------------------------------------------------

    async def poll(self) -> PollResult:
        try:
            if self._push_pending and self._state is not None:
                self._push_pending = False  # the pushed values, no request: the leak's one round trip
                return self._result()
            info = await self.link.identify()
            got = await self.link.read(self._objects, info)
            now = time.time()
            if got and all(isinstance(g.get("present-value"), PropertyProblem) and g["present-value"].kind == "error"
                           for g in got.values()) and len(got) == len(self._objects):
                raise SourceError("protocol", f"{self.device}: every object refused "
                                              f"({next(iter(got.values()))['present-value']})")
            self._state = {objid: dict(got.get(objid, {})) for objid, _ in self._objects}
            self._at = {objid: now for objid in self._state}
            self._push_pending = False
        except BaseException:
            self._state = None
            self.link.forget()
            self.cov.lost()
            raise
        await self.cov.maintain()
        return self._result()

    def _result(self) -> PollResult:
        now = time.time()
        readings: list[Reading] = []
        assert self._state is not None
        for objid, plan in self.plans.items():
            readings.extend(plan.readings(self._state.get(objid, {}), self._at.get(objid, now)))
        info = self.link.info
        if self._is_cdu_poll():
            readings.append(Reading(mm.CDU_INFO, 1.0, {"cdu": self.device, "vendor": self.profile.vendor,
                                                        "model": self.profile.model,
                                                        "firmware": info.firmware if info else "unknown",
                                                        "profile": self.profile.name}, timestamp=now))
            readings.extend(derived_readings(self.device, readings, self.coolant,
                                             self.rack_power_w() if self.rack_power_w else None, now))
        readings.extend(self._client_readings(now))
        return PollResult(readings)

    def _client_readings(self, now: float) -> list[Reading]:
        dev = {"device": self.device}
        out: list[Reading] = []
        if self.cov.enabled:
            out.append(Reading(bm.COV_UP, 1.0 if self.cov.up else 0.0, {**dev, "source": self.name}, timestamp=now))
        if not self.client_metrics:
            return out
        stats = self.link.stats
        out += [Reading(bm.REQUESTS, float(n), {**dev, "service": s}, timestamp=now)
                for s, n in sorted(stats.requests.items())]
        out += [Reading(bm.ERRORS, float(n), {**dev, "kind": k}, timestamp=now) for k, n in sorted(stats.errors.items())]
        out.append(Reading(bm.COV_NOTIFICATIONS, float(stats.notifications), dev, timestamp=now))
        return out

    def _pushed_value(self, objid: ObjectIdentifier, prop: str, value: Any) -> None:
        """One value of a COV notification: into the object's state, and a poll asked for (once per notification)."""
        self.link.stats.notifications += 1 if prop == "present-value" else 0
        plan = self.plans.get(objid)
        if plan is None or self._state is None or prop not in plan.props:
            return  # not ours, or no read yet to stand on: the next poll reads it
        self._state.setdefault(objid, {})[prop] = cast_value(plan.point.object_type, prop, value)
        self._at[objid] = time.time()
        if not self._fire_scheduled:
            self._fire_scheduled = True
            asyncio.get_running_loop().call_soon(self._fire)

    def _fire(self) -> None:
        self._fire_scheduled = False
        self._push_pending = True
        self.poll_trigger.fire()

    async def release(self) -> None:
        """Another agent polls this device now (rack coordination): cancel the subscriptions, so the device notifies
        only its pollers. The next poll here subscribes again."""
        await self.cov.close()
        self.cov.lost()

    async def close(self) -> None:
        self.poll_trigger.detach()
        await self.cov.close()
        await release_link(self.link)

    # -- wiring ---------------------------------------------------------------------------

    def wired(self, p: Point) -> bool:
        """False for a zone channel the inventory's `channels` map leaves out: nothing is wired there."""
        if not self.channels or p.channel is None or p.channel in self.channels:
            return True
        return "zone" not in mm.ALL[p.metric].labels

    def zone(self, channel: int | None) -> str:
        if channel is None:
            return self.device
        return self.channels.get(channel, f"{self.device}-ch{channel}")

    def _labels(self, p: Point) -> dict[str, str]:
        return mm.auto_labels(mm.ALL[p.metric], p.labels, self.device, self.zone(p.channel))

    def _is_cdu_poll(self) -> bool:
        return self.profile.kind == "cdu" and self.subset != "leak"

    # -- for the agent ----------------------------------------------------------------------

    def leak_sensors(self) -> list[tuple[str, str]]:
        """(zone, sensor) of every wired leak input this source polls: named unknown while the device is down."""
        return sorted((plan.labels["zone"], plan.labels.get("sensor", "")) for plan in self.plans.values()
                      if plan.spec is mm.LEAK_DETECTED)

    def declared_families(self) -> dict[str, MetricSpec]:
        """Every family a poll of this source can publish (what another agent accepts in its shared facts)."""
        families = {s.name: s for s in bm.ALL.values()}
        families.update((plan.spec.name, plan.spec) for plan in self.plans.values())
        if any(plan.fault_labels is not None for plan in self.plans.values()):
            families[mm.LEAK_FAULT.name] = mm.LEAK_FAULT
        if self._is_cdu_poll():
            families.update((spec.name, spec) for spec in (mm.CDU_INFO, *mm.DERIVED))
        return families

    def pinned_labels(self) -> dict[str, frozenset[str]]:
        """Label values this source alone decides: device, zones, the profile's labels, leak fault names."""
        values: dict[str, set[str]] = {"device": {self.device}, "cdu": {self.device}, "source": {self.name}}
        for plan in self.plans.values():
            for k, v in plan.labels.items():
                values.setdefault(k, set()).add(v)
        if any(plan.fault_labels is not None for plan in self.plans.values()):
            values["fault"] = set(LEAK_FAULT_LABELS)
        if self._is_cdu_poll():
            values.update(vendor={self.profile.vendor}, model={self.profile.model}, profile={self.profile.name})
        return {k: frozenset(v) for k, v in values.items()}
