"""Modbus collectors for CDUs and leak controllers (probe: modbus_probe; control points: modbus_control).

A `ModbusSource` polls one device through its profile: it reads the
profile's register blocks over the shared gateway connection, decodes each
point, and judges its quality. A sentinel, an out-of-range value or an
unknown enum is `sensor_fault` (never a real zero flow or a real leak); a
leak input whose cable is broken or contaminated reports the fault, and its
leak reading becomes `sensor_fault`, never `supernode_leak_detected 1`.
CDU sources add the derived readings (heat removed, dew point, margins).
"""

from __future__ import annotations

import math
import time
from collections import Counter
from typing import Callable, Literal, Mapping

from exporters.cooling import coolant as cool
from exporters.cooling.coolant_readings import derived_readings
from exporters.cooling.leak import LEAK_METRICS, apply_leak_faults
from exporters.cooling import modbus_metrics as mm
from exporters.model import MetricSpec, PollResult, Quality, Reading, SourceError, make_reading
from exporters.cooling.modbus_client import Gateway, GatewayStats, ModbusExceptionReply, gateway_for, release_gateway
from exporters.cooling.modbus_codec import decode
from exporters.cooling.modbus_profile import Block, Point, Profile, ProfileError, load_profile, plan_blocks

Subset = Literal["all", "leak", "cdu"]


def _feeds_leak(p: Point) -> bool:
    return p.metric in LEAK_METRICS or any(b.metric in LEAK_METRICS for b in (p.bits or {}).values())


def has_leak_points(profile: Profile | str) -> bool:
    """Whether a profile has leak inputs (then the agent adds a fast `subset="leak"` source for it)."""
    prof = load_profile(profile) if isinstance(profile, str) else profile
    return any(_feeds_leak(p) for p in prof.expanded())


class ModbusSource:
    """One Modbus device (CDU or leak controller) polled through its profile.

    `name` is the source kind ("cdu" or "leak"), `device` the inventory name.
    `channels` maps the profile's leak/valve channels to inventory leak zones;
    with a map, unmapped channels are not reported (nothing is wired there);
    without one, a channel is labelled `<device>-ch<n>`. `subset="leak"` polls
    only the points that feed leak metrics, so a CDU's leak inputs can run on
    the fast leak schedule while the rest polls every few seconds (both share
    the one connection to the gateway).
    """

    def __init__(self, name: str, device: str, profile: Profile | str, host: str = "127.0.0.1", port: int = 502,
                 unit: int | None = None, timeout: float = 2.0, channels: Mapping[int, str] | None = None,
                 subset: Subset = "all", coolant: cool.CoolantProperties = cool.PG25,
                 rack_power_w: Callable[[], float | None] | None = None, busy_retries: int = 3,
                 backoff_s: float = 0.05):
        self.name = name
        self.device = device
        self.profile = load_profile(profile) if isinstance(profile, str) else profile
        self.host, self.port, self.timeout = host, port, timeout
        self.unit = self.profile.device.unit if unit is None else unit
        self.channels = {int(k): v for k, v in (channels or {}).items()}
        self.coolant = coolant
        self.rack_power_w = rack_power_w
        self.busy_retries, self.backoff_s = busy_retries, backoff_s
        points = [p for p in self.profile.expanded() if p.metric is not None or p.bits or p.info]
        if subset == "leak":
            points = [p for p in points if _feeds_leak(p)]
        elif subset == "cdu":
            points = [p for p in points if not _feeds_leak(p)]
        if not points:
            raise ProfileError(f"profile {self.profile.name}: no points for subset {subset!r}")
        self.subset = subset
        self.blocks: list[Block] = plan_blocks(self.profile, points)
        self.stats = GatewayStats()
        self.info: dict[str, str] = {}  # static facts read from the device (firmware), for the _info metric
        self._gateway: Gateway | None = None
        self._plans: list[tuple[Block, list[Point], list[_PointPlan]]] | None = None
        self._leak_sensors: list[tuple[str, str]] | None = None

    # -- Source protocol ----------------------------------------------------------

    async def poll(self) -> PollResult:
        gw = self._gw()
        now = time.time()
        readings: list[Reading] = []
        partial: Counter = Counter()
        failed = 0
        last_exc: ModbusExceptionReply | None = None
        gap_s = self.profile.device.gap_ms / 1000.0
        for block, infos, plans in self._block_plans():
            try:
                values = await gw.read(block.fc, block.start, block.count, self.unit, gap_s=gap_s,
                                       busy_retries=self.busy_retries, backoff_s=self.backoff_s, stats=self.stats)
            except ModbusExceptionReply as exc:
                failed += 1
                last_exc = exc
                partial[f"exception_{exc.code}"] += 1
                continue
            for p in infos:
                self.info[p.info] = self._info_value(p, block, values)
            for plan in plans:
                plan.read(values, now, readings)
        if failed == len(self.blocks) and last_exc is not None:
            raise SourceError("protocol", f"{self.device}: every request refused; last: {last_exc}")
        readings = apply_leak_faults(readings)
        if self.profile.kind == "cdu" and self.subset != "leak":
            readings.append(Reading(mm.CDU_INFO, 1.0, {"cdu": self.device, "vendor": self.profile.vendor,
                                                        "model": self.profile.model,
                                                        "firmware": self.info.get("firmware", "unknown"),
                                                        "profile": self.profile.name}, timestamp=now))
            readings.extend(derived_readings(self.device, readings, self.coolant,
                                             self.rack_power_w() if self.rack_power_w else None, now))
        readings.extend(self._counter_readings(now))
        return PollResult(readings, dict(partial))

    def declared_families(self) -> dict[str, MetricSpec]:
        """Every family a poll of this source can publish: its wired points' (profile, subset, wiring), its
        request counters, and a CDU's identity and derived families. What another agent accepts in this
        device's shared facts (agent.coordination.facts): a family outside it was never polled here."""
        families = {mm.REQUESTS.name: mm.REQUESTS, mm.EXCEPTIONS.name: mm.EXCEPTIONS}
        families.update((spec.name, spec) for spec, _ in self._series())
        if self._is_cdu_poll():
            families.update((spec.name, spec) for spec in (mm.CDU_INFO, *mm.DERIVED))
        return families

    def pinned_labels(self) -> dict[str, frozenset[str]]:
        """The values each label of this source's series can take where the source alone decides them: its
        device name, the zones its wiring gives, the profile's own labels (sensor, loop, fault...), the CDU's
        vendor, model and profile. Labels not named here (a Modbus exception code, the firmware) are free."""
        values: dict[str, set[str]] = {"device": {self.device}, "cdu": {self.device}}
        for _, labels in self._series():
            for k, v in labels.items():
                values.setdefault(k, set()).add(v)
        if self._is_cdu_poll():
            values.update(vendor={self.profile.vendor}, model={self.profile.model}, profile={self.profile.name})
        return {k: frozenset(v) for k, v in values.items()}

    def _is_cdu_poll(self) -> bool:
        return self.profile.kind == "cdu" and self.subset != "leak"

    def _series(self) -> list[tuple[MetricSpec, Mapping[str, str]]]:
        """(family, labels) of every reading a poll decodes from the device (before the derived ones)."""
        out: list[tuple[MetricSpec, Mapping[str, str]]] = []
        for _, _, plans in self._block_plans():
            for plan in plans:
                out.extend((spec, labels) for _, spec, labels in plan.bits)
                if plan.spec is not None:
                    out.append((plan.spec, plan.labels))
        return out

    def _block_plans(self) -> list[tuple[Block, list[Point], list["_PointPlan"]]]:
        """Per block: its info points and a plan of each wired point, built at the first poll.

        A leak source polls twice a second: working out each point's families,
        labels and wiring again on every poll was most of what its poll cost
        beyond the request itself."""
        plans = self._plans
        if plans is None:
            plans = self._plans = [
                (block, [p for p in block.points if p.info is not None],
                 [_PointPlan(self, p, block) for p in block.points if p.info is None and self.wired(p)])
                for block in self.blocks]
        return plans

    async def close(self) -> None:
        if self._gateway is not None:
            release_gateway(self._gateway)
            self._gateway = None

    # -- internals ------------------------------------------------------------------

    def _gw(self) -> Gateway:
        if self._gateway is None:
            self._gateway = gateway_for(self.host, self.port, self.timeout)
        return self._gateway

    def _labels(self, metric: str, point: Point, extra: Mapping[str, str]) -> dict[str, str]:
        return mm.auto_labels(mm.ALL[metric], {**point.labels, **extra}, self.device, self.zone(point.channel))

    def leak_sensors(self) -> list[tuple[str, str]]:
        """(zone, sensor) of every wired leak input this source polls, known without asking the device.

        The agent names these as "unknown" (fault="source_down") when the
        device stops answering, instead of letting their series fall silent.
        The leak watch asks twice a second: they follow from the profile and the wiring alone, so worked
        out once (a copy each time: the caller may keep it).
        """
        if self._leak_sensors is None:
            self._leak_sensors = self._wired_leak_sensors()
        return list(self._leak_sensors)

    def _wired_leak_sensors(self) -> list[tuple[str, str]]:
        out: set[tuple[str, str]] = set()
        for block in self.blocks:
            for p in block.points:
                if not self.wired(p):
                    continue
                extras = [bit.labels for bit in (p.bits or {}).values() if bit.metric == mm.LEAK_DETECTED.name]
                if p.metric == mm.LEAK_DETECTED.name:
                    extras.append({})
                for extra in extras:
                    labels = self._labels(mm.LEAK_DETECTED.name, p, extra)
                    out.add((labels["zone"], labels.get("sensor", "")))
        return sorted(out)

    def wired(self, p: Point) -> bool:
        """False for a zone channel the inventory's `channels` map leaves out: nothing is wired there."""
        if not self.channels or p.channel is None or p.channel in self.channels:
            return True
        metrics = [p.metric] + [b.metric for b in (p.bits or {}).values()]
        return not any(m is not None and "zone" in mm.ALL[m].labels for m in metrics)

    def zone(self, channel: int | None) -> str:
        if channel is None:
            return self.device
        return self.channels.get(channel, f"{self.device}-ch{channel}")

    @staticmethod
    def _info_value(p: Point, block: Block, values: list[int]) -> str:
        off = p.address - block.start
        raw = values[off] if p.type == "bit" else decode(values[off:off + p.width], p.type, p.order)
        if p.is_sentinel(raw):
            return "unknown"
        return f"{raw * p.scale + p.offset:g}"

    def _counter_readings(self, now: float) -> list[Reading]:
        out = [Reading(mm.REQUESTS, float(self.stats.requests), {"device": self.device}, timestamp=now)]
        for code, n in sorted(self.stats.exceptions.items()):
            out.append(Reading(mm.EXCEPTIONS, float(n), {"device": self.device, "code": str(code)}, timestamp=now))
        return out


class _PointPlan:
    """One wired point as every poll reads it: where it sits in its block, and the family and labels of each
    reading it gives (label sets built once, shared by every poll's readings and never mutated)."""

    __slots__ = ("point", "off", "end", "is_bit", "bits", "spec", "labels")

    def __init__(self, source: ModbusSource, p: Point, block: Block):
        self.point = p
        self.off = p.address - block.start
        self.end = self.off + p.width
        self.is_bit = p.type == "bit"
        self.bits: tuple[tuple[int, MetricSpec, Mapping[str, str]], ...] = tuple(
            (n, mm.ALL[bit.metric], source._labels(bit.metric, p, bit.labels)) for n, bit in sorted((p.bits or {}).items()))
        self.spec: MetricSpec | None = mm.ALL[p.metric] if p.metric is not None else None
        self.labels: Mapping[str, str] = source._labels(p.metric, p, {}) if p.metric is not None else {}

    def read(self, values: list[int], now: float, out: list[Reading]) -> None:
        """Append this point's readings decoded from its block's `values`.

        A sentinel, an unknown enum or an out-of-range value is sensor_fault, never a value; the bits of a
        status word that is a sentinel are sensor_fault too."""
        p = self.point
        raw: float = values[self.off] if self.is_bit else decode(values[self.off:self.end], p.type, p.order)
        fault = p.is_sentinel(raw)
        if self.bits:
            word = int(raw) & 0xFFFF
            q = Quality.SENSOR_FAULT if fault else Quality.OK
            for n, spec, labels in self.bits:
                out.append(make_reading(spec, float((word >> n) & 1), labels, q, now))
        if self.spec is None:
            return
        device_value = raw * p.scale + p.offset
        if p.enum is not None and int(raw) not in p.enum:
            fault = True
        if p.range is not None and not fault and not (p.range[0] <= device_value <= p.range[1]):
            fault = True
        value = p.to_base(device_value) if not math.isnan(device_value) else device_value
        out.append(make_reading(self.spec, value, self.labels, Quality.SENSOR_FAULT if fault else Quality.OK, now))
