"""Local detectors: read a Snapshot, emit fire/clear events with hysteresis and hold times.

Why apart from action: a detector only says "this condition holds for these
targets"; incidents and playbooks decide what to do. Each detector gives a
tri-state per target: True (set threshold met), False (clear threshold met)
or None (between the two: keep the current state), and `Tracker` turns that
into fire/clear events using the hold times (and, for leaks, the number of
consecutive wet polls, counted on the readings' own timestamps so other
sources' publishes do not count as polls). A reading whose quality is not
ok never satisfies a condition: it feeds a sensor-fault observation instead.
A leak source that stops answering turns its zones' state into "unknown"
(fault="source_down"), a critical incident of its own, never a leak.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping

from exporters.model import Quality, Reading

from agent.snapshot import Snapshot

from .flow_baseline import FlowBaselines
from .settings import DetectorSettings, Hold

Targets = tuple[tuple[str, str], ...]
SOURCE_DOWN = "source_down"  # the leak watch's fault label (agent/derived.py): the sensor cannot be read


def targets_of(**kv: str) -> Targets:
    return tuple(sorted((k, str(v)) for k, v in kv.items()))


@dataclass(frozen=True, slots=True)
class Observation:
    detector: str
    targets: Targets
    severity: str
    cond: bool | None
    sample_ts: float | None = None  # for consecutive-poll counting
    detail: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Event:
    kind: str  # fire | clear
    detector: str
    targets: dict[str, str]
    severity: str
    detail: Mapping[str, Any]


@dataclass(slots=True)
class _KeyState:
    active: bool = False
    set_since: float | None = None
    clear_since: float | None = None
    count: int = 0
    last_ts: float | None = None


class Tracker:
    """Hysteresis in time for one detector, per target key."""

    def __init__(self, hold: Hold, consecutive: int = 1):
        self.hold = hold
        self.consecutive = consecutive
        self.keys: dict[Targets, _KeyState] = {}

    def observe(self, obs: Observation, now: float) -> str | None:
        st = self.keys.setdefault(obs.targets, _KeyState())
        new_sample = obs.sample_ts is None or obs.sample_ts != st.last_ts
        st.last_ts = obs.sample_ts if obs.sample_ts is not None else st.last_ts
        if obs.cond:
            st.clear_since = None
            if new_sample:
                st.count += 1
            if st.set_since is None:
                st.set_since = now
            if not st.active and st.count >= self.consecutive and now - st.set_since >= self.hold.fire_seconds:
                st.active = True
                return "fire"
            return None
        if new_sample or obs.cond is False:
            st.count = 0
        st.set_since = None
        if obs.cond is None or not st.active:
            st.clear_since = None if obs.cond is None else st.clear_since
            return None
        if st.clear_since is None:
            st.clear_since = now
        if now - st.clear_since >= self.hold.clear_seconds:
            st.active = False
            st.clear_since = None
            return "clear"
        return None

    def active(self) -> list[Targets]:
        return [k for k, s in self.keys.items() if s.active]


class _Rates:
    """Per-series rates and deltas from counter values across snapshots.

    Keyed on the reading's own timestamp: a snapshot that carries the same
    sample again (another source published) keeps the last rate; a counter
    reset or a first sighting gives no rate.
    """

    def __init__(self) -> None:
        self.last: dict[tuple, tuple[float, float, float | None]] = {}  # series -> (timestamp, value, rate)
        self.deltas: dict[tuple, tuple[float, float]] = {}  # series -> (timestamp, value)

    @staticmethod
    def _key(r: Reading) -> tuple:
        # Unsorted: a collector builds one series' labels in one order every poll (sorting them was a
        # third of the NVLink detector's time); a series whose label order changed only misses one rate.
        return r.spec.name, tuple(r.labels.items())

    def rate(self, r: Reading) -> float | None:
        key = (r.spec.name, tuple(r.labels.items()))  # _key, inlined: ~300 counters per NVML publish
        prev = self.last.get(key)
        ts, v = r.timestamp, r.value
        if prev is not None and ts <= prev[0]:
            return prev[2]
        rate = None if prev is None or v < prev[1] else (v - prev[1]) / max(ts - prev[0], 1e-6)
        self.last[key] = (ts, v, rate)
        return rate

    def delta(self, r: Reading) -> float | None:
        """Increase since the previous sample (0 for a repeated sample, None on first sighting)."""
        key = self._key(r)
        prev = self.deltas.get(key)
        if prev is not None and r.timestamp <= prev[0]:
            return 0.0
        self.deltas[key] = (r.timestamp, r.value)
        return None if prev is None else max(0.0, r.value - prev[1])


@dataclass
class Context:
    """What detectors need besides the snapshot: this node, the inventory's expectations."""

    node: str
    rack: str
    expected_gpus: int = 0
    power_budget_watts: float | None = None
    # (pdu, outlet) -> the inventory node it feeds: only those outlets are watched (an outlet that feeds
    # nothing the agent knows may be off on purpose)
    outlet_feeds: Mapping[tuple[str, str], str] = field(default_factory=dict)


def _node(r: Reading, ctx: Context) -> str:
    return r.labels.get("node", ctx.node)


class Detectors:
    """The default detector table of PLAYBOOKS.md, evaluated on every snapshot."""

    def __init__(self, settings: DetectorSettings, ctx: Context, clock: Callable[[], float] | None = None):
        self.s = settings
        self.ctx = ctx
        self.rates = _Rates()
        self.flow_baselines = FlowBaselines(settings.flow_baseline_window_seconds,
                                            settings.flow_setpoint_settle_seconds)
        self.flaps: dict[str, list[tuple[float, float]]] = {}
        self.trackers: dict[str, Tracker] = {}
        for name in ("leak", "leak_sensor_fault", "leak_source_down", "coolant_flow_low", "coolant_supply_hot",
                     "condensation_risk", "gpu_thermal", "gpu_xid_critical", "gpu_lost", "nvlink_errors", "optic_degraded",
                     "rack_power_over_budget", "pdu_outlet_off", "tray_leak_rack"):
            hold: Hold = getattr(settings, name)
            self.trackers[name] = Tracker(hold, settings.leak_consecutive_polls if name == "leak" else 1)
        self.trackers["sensor_fault"] = Tracker(Hold(fire_seconds=0.0, clear_seconds=10.0))
        self._fault_keys = 0
        self._faulted: frozenset[str] = frozenset()
        # The NVLink error readings last evaluated and each link's summed rate from them (see `_nvlink`).
        self._nvlink_rates: tuple[list[Reading], dict[tuple[str, str, str], float]] = ([], {})

    # -- entry point -------------------------------------------------------------

    # The metric families each detector reads (a test checks this against what they really select): a
    # publish by one source runs only the detectors it feeds, not all of them on every leak poll.
    INPUTS: dict[str, frozenset[str]] = {
        "_leak": frozenset({"supernode_leak_detected", "supernode_leak_sensor_fault"}),
        "_coolant": frozenset({"supernode_cdu_flow_cubic_meters_per_second", "supernode_cdu_temperature_celsius",
                               "supernode_cdu_dew_point_margin_celsius", "supernode_cdu_pump_speed_setpoint_ratio",
                               "supernode_cdu_pump_running", "supernode_cdu_alarm_active"}),
        "_gpu_thermal": frozenset({"supernode_gpu_temperature_celsius", "supernode_gpu_temperature_threshold_celsius",
                                   "supernode_gpu_clock_event_active"}),
        "_gpu_xid": frozenset({"supernode_gpu_xid_errors_total", "supernode_gpu_recovery_action"}),
        "_gpu_lost": frozenset({"supernode_gpu_up", "supernode_gpu_hung"}),
        "_nvlink": frozenset({"supernode_nvlink_errors_total", "supernode_nvlink_up", "supernode_nvlink_bit_error_rate"}),
        "_optic": frozenset({"supernode_link_errors_total", "supernode_link_flaps_total",
                             "supernode_optic_rx_power_dbm", "supernode_optic_threshold_dbm"}),
        "_rack_power": frozenset({"supernode_rack_power_watts", "supernode_rack_power_budget_watts"}),
        "_outlets": frozenset({"supernode_pdu_outlet_on"}),
        "_tray_rack": frozenset({"supernode_leak_detector_state", "supernode_redfish_service_info"}),
    }

    @classmethod
    def families(cls) -> frozenset[str]:
        """Every metric family some detector reads."""
        return frozenset().union(*cls.INPUTS.values())

    def evaluate(self, snap: Snapshot, families: frozenset[str] | None = None) -> list[Event]:
        """Observations of every detector, or only of those reading one of `families` (what a source published)."""
        events: list[Event] = []
        for obs in self.observe(snap, families):
            tracker = self.trackers[obs.detector]
            if not getattr(tracker.hold, "enabled", True):
                continue
            kind = tracker.observe(obs, snap.monotonic)
            if kind:
                events.append(Event(kind, obs.detector, dict(obs.targets), obs.severity, dict(obs.detail)))
        return events

    def leak_awaiting_confirmation(self) -> bool:
        """A zone read wet but not yet on enough consecutive polls: worth confirming at once.

        Also while this agent's own incident of that zone is still open in its clear hold (a wet reading after
        dry ones): the agents that read this poller's facts may have closed theirs a poll earlier (their clear
        hold counts from the facts' arrival), and their second wet reading is this poller's next poll; without
        the re-read they would wait a whole interval for it."""
        t = self.trackers["leak"]
        return any(0 < st.count < t.consecutive for st in t.keys.values())

    def observe(self, snap: Snapshot, families: frozenset[str] | None = None) -> Iterator[Observation]:
        for fn in (self._leak, self._coolant, self._gpu_thermal, self._gpu_xid, self._gpu_lost, self._nvlink,
                   self._optic, self._rack_power, self._outlets, self._tray_rack):
            if families is None or self.INPUTS[fn.__name__] & families:
                yield from fn(snap)

    def _fault(self, r: Reading) -> Observation:
        return Observation("sensor_fault", targets_of(reading=r.reading_id()), "warning", True,
                           detail={"quality": r.quality.value, "metric": r.spec.name})

    def _ok_or_fault(self, readings: Iterable[Reading]) -> Iterator[Reading | Observation]:
        """Yield ok readings, and a sensor-fault observation for each reading that is not ok.

        An ok reading's observation (the fault cleared) is yielded only for families with a sensor-fault
        key: elsewhere it would change nothing, and building one per reading per pass was most of the
        cost of the cheap detectors."""
        faulted = self._faulted_families()
        for r in readings:
            if r.ok:
                if r.spec.name in faulted:
                    yield Observation("sensor_fault", targets_of(reading=r.reading_id()), "warning", False)
                yield r
            else:
                yield self._fault(r)

    def _faulted_families(self) -> frozenset[str]:
        """Metric families with a reading in the sensor-fault tracker (observed faulty, or restored)."""
        keys = self.trackers["sensor_fault"].keys
        if len(keys) != self._fault_keys:  # keys are only ever added: their count says when to look again
            self._fault_keys = len(keys)
            self._faulted = frozenset("supernode_" + dict(k).get("reading", "").split(",", 1)[0] for k in keys)
        return self._faulted

    # -- leaks -------------------------------------------------------------------

    def _leak(self, snap: Snapshot) -> Iterator[Observation]:
        zones: dict[str, list[Reading]] = {}
        for item in self._ok_or_fault(snap.select("supernode_leak_detected")):
            if isinstance(item, Observation):
                if item.cond:
                    labels = dict(item.targets)
                    yield Observation("leak_sensor_fault", targets_of(**_zone_sensor_from_id(labels["reading"])),
                                      "warning", True, detail={"quality": item.detail.get("quality")})
                yield item
                continue
            zones.setdefault(item.label("zone"), []).append(item)
        for zone, rs in zones.items():
            wet_rs = [r for r in rs if r.value >= 0.5]
            # Consecutive polls are counted on the wet sensors' own readings: another source of the same zone
            # (a tray BMC and the rack's leak rope) publishing in between is not a second poll of the wet one,
            # nor does its newer timestamp hide that wet one's first reading.
            yield Observation("leak", targets_of(zone=zone), "critical", bool(wet_rs),
                              sample_ts=max(r.timestamp for r in (wet_rs or rs)),
                              detail={"sensors": sorted(r.label("sensor") for r in wet_rs)})
        faults: dict[Targets, bool] = {}
        unknown: dict[str, list[str]] = {}
        for r in snap.select("supernode_leak_sensor_fault"):
            on = r.ok and r.value >= 0.5
            if r.label("fault") == SOURCE_DOWN:
                # The agent cannot read this sensor at all: the zone's state is unknown (critical, notify only).
                down = unknown.setdefault(r.label("zone"), [])
                if on:
                    down.append(r.label("sensor"))
                continue
            key = targets_of(zone=r.label("zone"), sensor=r.label("sensor"))
            faults[key] = faults.get(key, False) or on
        for key, on in faults.items():
            yield Observation("leak_sensor_fault", key, "warning", on)
        for zone, sensors in unknown.items():
            yield Observation("leak_source_down", targets_of(zone=zone), "critical", bool(sensors),
                              detail={"sensors": sorted(sensors)})

    # -- coolant -----------------------------------------------------------------

    def _coolant(self, snap: Snapshot) -> Iterator[Observation]:
        s = self.s
        for item in self._ok_or_fault(snap.select("supernode_cdu_flow_cubic_meters_per_second", loop="secondary")):
            if isinstance(item, Observation):
                yield item
                continue
            obs = self._flow_low(snap, item)
            if obs is not None:
                yield obs
        for item in self._ok_or_fault(snap.select("supernode_cdu_temperature_celsius", loop="secondary", point="supply")):
            if isinstance(item, Observation):
                yield item
                continue
            v = item.value
            cond = True if v > s.supply_hot_celsius else False if v <= s.supply_hot_clear_celsius else None
            yield Observation("coolant_supply_hot", targets_of(cdu=item.label("cdu")), "critical", cond,
                              detail={"supply_celsius": v})
        for item in self._ok_or_fault(snap.select("supernode_cdu_dew_point_margin_celsius")):
            if isinstance(item, Observation):
                yield item
                continue
            v = item.value
            cond = True if v < s.condensation_margin_celsius else False if v >= s.condensation_clear_margin_celsius else None
            yield Observation("condensation_risk", targets_of(cdu=item.label("cdu")), "warning", cond,
                              detail={"margin_celsius": v})

    def _flow_low(self, snap: Snapshot, flow: Reading) -> Observation | None:
        """Flow against the configured nominal or the rolling baseline, confirmed by a rising ΔT.

        A pump set point change is not a fault: the baseline restarts once the
        new flow has settled, and no decision is taken meanwhile. Only healthy
        samples (at or above the clear ratio) feed the baseline.
        """
        s, base, now = self.s, self.flow_baselines, snap.monotonic
        cdu = flow.label("cdu")
        setpoint = snap.value("supernode_cdu_pump_speed_setpoint_ratio", cdu=cdu)
        if setpoint is not None:
            base.setpoint(cdu, setpoint, now)
        if base.settling(cdu, now):
            return Observation("coolant_flow_low", targets_of(cdu=cdu), "critical", None,
                               detail={"settling_after_setpoint": setpoint})
        sup = snap.value("supernode_cdu_temperature_celsius", cdu=cdu, loop="secondary", point="supply")
        ret = snap.value("supernode_cdu_temperature_celsius", cdu=cdu, loop="secondary", point="return")
        delta_t = ret - sup if sup is not None and ret is not None else None
        nominal = s.nominal_flow_cubic_meters_per_second or base.flow(cdu, now)
        if nominal is None:  # the first sample starts the baseline
            base.add(cdu, flow.timestamp, flow.value, delta_t, now)
            return None
        if nominal <= 0:
            return None
        ratio = flow.value / nominal
        cond: bool | None = True if ratio < s.flow_low_ratio else False if ratio >= s.flow_clear_ratio else None
        detail: dict[str, Any] = {"flow_ratio": round(ratio, 3), "baseline_cubic_meters_per_second": nominal}
        if cond:  # which part of the loop failed: the reliability report counts a pump or the CDU
            detail.update(_pump_evidence(snap, cdu))
        mean_dt = base.delta_t(cdu, now)
        if cond and s.flow_confirm_delta_t and delta_t is not None and mean_dt is not None:
            detail.update(delta_t_celsius=round(delta_t, 2), baseline_delta_t_celsius=round(mean_dt, 2))
            if delta_t < mean_dt + s.flow_confirm_delta_t_rise_celsius:
                cond = None  # flow reads low but the loop carries heat as before: a meter, not the loop
        if cond is False:
            base.add(cdu, flow.timestamp, flow.value, delta_t, now)
        return Observation("coolant_flow_low", targets_of(cdu=cdu), "critical", cond, detail=detail)

    # -- GPUs --------------------------------------------------------------------

    def _gpu_thermal(self, snap: Snapshot) -> Iterator[Observation]:
        s = self.s
        hw: dict[tuple[str, str], bool] = {}
        reasons = set(s.gpu_thermal_clock_events)
        for r in snap.select("supernode_gpu_clock_event_active"):
            if r.ok and r.label("reason") in reasons:
                key = (_node(r, self.ctx), r.label("gpu"))
                hw[key] = hw.get(key, False) or r.value >= 0.5
        for item in self._ok_or_fault(snap.select("supernode_gpu_temperature_celsius", sensor="gpu")):
            if isinstance(item, Observation):
                yield item
                continue
            node, gpu = _node(item, self.ctx), item.label("gpu")
            slowdown = snap.value("supernode_gpu_temperature_threshold_celsius", gpu=gpu, threshold="slowdown")
            near = slowdown is not None and item.value >= slowdown - s.gpu_thermal_margin_celsius
            far = slowdown is None or item.value < slowdown - s.gpu_thermal_clear_margin_celsius
            throttled = hw.get((node, gpu), False)
            cond = True if (near or throttled) else False if far else None
            yield Observation("gpu_thermal", targets_of(node=node, gpu=gpu), "warning", cond,
                              detail={"temperature_celsius": item.value, "slowdown_celsius": slowdown,
                                      "thermal_clock_event": throttled})

    def _gpu_xid(self, snap: Snapshot) -> Iterator[Observation]:
        critical = set(self.s.xid_critical)
        per_gpu: dict[tuple[str, str], list[str]] = {}
        for r in snap.select("supernode_gpu_xid_errors_total"):
            key = (_node(r, self.ctx), r.label("gpu"))
            per_gpu.setdefault(key, [])
            if not r.ok or not r.label("xid").isdigit() or int(r.label("xid")) not in critical:
                continue
            d = self.rates.delta(r)
            if (d is None and r.value > 0) or (d is not None and d > 0):
                per_gpu[key].append(f"xid {r.label('xid')}")
        for r in snap.select("supernode_gpu_recovery_action"):
            if r.ok and r.value >= 0.5 and r.label("action") not in ("none", ""):
                per_gpu.setdefault((_node(r, self.ctx), r.label("gpu")), []).append(f"recovery {r.label('action')}")
        for (node, gpu), why in per_gpu.items():
            # A critical XID is an event: it holds the condition, and the clear hold time counts from the last one.
            yield Observation("gpu_xid_critical", targets_of(node=node), "critical", bool(why),
                              detail={"gpu": gpu, "why": why})

    def _gpu_lost(self, snap: Snapshot) -> Iterator[Observation]:
        up: dict[str, int] = {}
        hung = _gpus_hung(snap, self.ctx)
        for r in snap.select("supernode_gpu_up"):
            if not r.ok:
                yield self._fault(r)
                continue
            node = _node(r, self.ctx)
            up[node] = up.get(node, 0) + (1 if r.value >= 0.5 else 0)
            # A GPU whose NVML calls hang does not answer either: lost to its jobs, said why in the detail.
            why = "hung" if (node, r.label("gpu")) in hung else "lost"
            yield Observation("gpu_lost", targets_of(node=node, gpu=r.label("gpu")), "critical", r.value < 0.5,
                              detail={"why": why} if r.value < 0.5 else {})
        expected = self.ctx.expected_gpus
        if expected:
            for node, n in up.items():
                yield Observation("gpu_lost", targets_of(node=node, gpu="missing"), "critical",
                                  n < expected and len([r for r in snap.select("supernode_gpu_up")
                                                        if _node(r, self.ctx) == node]) < expected,
                                  detail={"seen": n, "expected": expected})

    def _nvlink(self, snap: Snapshot) -> Iterator[Observation]:
        """Per GPU: its worst link's error rate (summed over the counted types), effective BER, links down."""
        errors = snap.by_name.get("supernode_nvlink_errors_total", [])
        seen, per_link = self._nvlink_rates
        # The NVML source reads error counters every few polls and gives the same readings again between
        # reads: the same readings give the same rates (each is keyed on its own timestamp), so ~1,000 of them
        # are not walked again. The list compare is by identity first, in C.
        if errors != seen:
            per_link = self._link_error_rates(errors)
            self._nvlink_rates = (errors, per_link)
        down: dict[tuple[str, str], list[str]] = {}
        ber: dict[tuple[str, str], list[str]] = {}
        for r in snap.select("supernode_nvlink_bit_error_rate", kind="effective"):
            if r.ok:
                key = (_node(r, self.ctx), r.label("gpu"))
                ber.setdefault(key, [])
                if r.value > self.s.nvlink_effective_ber:
                    ber[key].append(r.label("link"))
        for r in snap.select("supernode_nvlink_up"):
            if r.ok:
                key = (_node(r, self.ctx), r.label("gpu"))
                down.setdefault(key, [])
                if r.value < 0.5:
                    down[key].append(r.label("link"))
        worst: dict[tuple[str, str], float] = {}
        for (node, gpu, _link), rate in per_link.items():
            worst[(node, gpu)] = max(worst.get((node, gpu), 0.0), rate)
        for key in set(worst) | set(down) | set(ber):
            rate = worst.get(key, 0.0)
            links_down, links_ber = down.get(key, []), ber.get(key, [])
            cond = rate > self.s.nvlink_error_rate_per_second or bool(links_down) or bool(links_ber)
            yield Observation("nvlink_errors", targets_of(node=key[0], gpu=key[1]), "critical", cond,
                              detail={"errors_per_second": round(rate, 3), "links_down": links_down,
                                      "links_ber_high": links_ber})

    def _link_error_rates(self, errors: Iterable[Reading]) -> dict[tuple[str, str, str], float]:
        """(node, gpu, link) -> the summed rate of its counted error types."""
        types = set(self.s.nvlink_error_types)
        per_link: dict[tuple[str, str, str], float] = {}
        node, rate_of, ok = self.ctx.node, self.rates.rate, Quality.OK
        for r in errors:  # ~1,000 a publish on a GB200 node: labels read directly
            lab = r.labels
            if r.quality is not ok or lab.get("type") not in types:
                continue
            key = (lab.get("node", node), lab.get("gpu", ""), lab.get("link", ""))
            per_link[key] = per_link.get(key, 0.0) + (rate_of(r) or 0.0)
        return per_link

    # -- optics and links --------------------------------------------------------

    def _optic(self, snap: Snapshot) -> Iterator[Observation]:
        s = self.s
        why: dict[str, list[str]] = {}
        rx_low: dict[str, float] = {}  # port -> its first ok rx_low_warning threshold (what snap.value gives)
        for r in snap.select("supernode_optic_threshold_dbm", kind="rx_low_warning"):
            if r.ok:
                rx_low.setdefault(r.label("port"), r.value)
        for item in self._ok_or_fault(snap.select("supernode_optic_rx_power_dbm")):
            if isinstance(item, Observation):
                yield item
                continue
            port = item.label("port")
            warn = rx_low.get(port)
            why.setdefault(port, [])
            if warn is not None and item.value < warn + s.optic_rx_margin_db:
                why[port].append(f"rx lane {item.label('lane')} {item.value:.2f} dBm < {warn:.2f}")
        for r in snap.select("supernode_link_flaps_total"):
            if not r.ok:
                continue
            port = r.label("port")
            why.setdefault(port, [])
            hist = self.flaps.setdefault(port, [])
            if not hist or hist[-1][1] != r.value:
                hist.append((snap.monotonic, r.value))
            window = [v for t, v in hist if snap.monotonic - t <= s.optic_flap_window_seconds]
            hist[:] = [(t, v) for t, v in hist if snap.monotonic - t <= s.optic_flap_window_seconds] or hist[-1:]
            if len(window) >= 2 and window[-1] - window[0] >= s.optic_flaps:
                why[port].append(f"{int(window[-1] - window[0])} flaps")
        for r in snap.select("supernode_link_errors_total", counter="symbol_error"):
            if not r.ok:
                continue
            port = r.label("port")
            why.setdefault(port, [])
            rate = self.rates.rate(r)
            if rate is not None and rate > s.optic_symbol_error_rate_per_second:
                why[port].append(f"symbol errors {rate:.1f}/s")
        for port, reasons in why.items():
            yield Observation("optic_degraded", targets_of(port=port), "warning", bool(reasons),
                              detail={"why": reasons})

    # -- rack power --------------------------------------------------------------

    def _rack_power(self, snap: Snapshot) -> Iterator[Observation]:
        for item in self._ok_or_fault(snap.select("supernode_rack_power_watts")):
            if isinstance(item, Observation):
                yield item
                continue
            budget = snap.value("supernode_rack_power_budget_watts") or self.ctx.power_budget_watts
            if not budget:
                continue
            ratio = item.value / budget
            cond = True if ratio > self.s.rack_power_over_ratio else False if ratio <= self.s.rack_power_clear_ratio else None
            yield Observation("rack_power_over_budget", targets_of(rack=self.ctx.rack), "warning", cond,
                              detail={"power_watts": item.value, "budget_watts": budget})

    # -- PDU outlets -------------------------------------------------------------

    def _outlets(self, snap: Snapshot) -> Iterator[Observation]:
        """An outlet that feeds an inventory node reads off: a tripped breaker or a person's switch. The node
        may run on its other feed, so nothing else notices that its power is no longer redundant."""
        feeds = self.ctx.outlet_feeds
        if not feeds:
            return
        for item in self._ok_or_fault(snap.select("supernode_pdu_outlet_on")):
            if isinstance(item, Observation):
                yield item
                continue
            pdu, outlet = item.label("pdu"), item.label("outlet")
            node = feeds.get((pdu, outlet))
            if node is None:
                continue
            yield Observation("pdu_outlet_off", targets_of(pdu=pdu, outlet=outlet), "warning", item.value < 0.5,
                              detail={"feeds": node})

    def _tray_rack(self, snap: Snapshot) -> Iterator[Observation]:
        """More than `rack_tray_leaks` trays (Redfish services of kind tray) with a wet detector: the rack.

        Counted on what this agent reads: its own tray, and every tray when it is the rack leader with
        `sources.redfish.watch_rack_trays` (else the alert SupernodeRackTrayLeaks carries the count, rack-wide,
        through the webhook). A detector that is not ok (a sensor fault) never counts.
        """
        trays = {r.label("bmc") for r in snap.select("supernode_redfish_service_info", kind="tray") if r.ok}
        if not trays:
            return
        wet = sorted({r.label("bmc") for r in snap.select("supernode_leak_detector_state")
                      if r.ok and r.value >= 1 and r.label("bmc") in trays})
        yield Observation("tray_leak_rack", targets_of(rack=self.ctx.rack), "critical",
                          len(wet) > self.s.rack_tray_leaks, detail={"trays": wet, "watched": len(trays)})


def _pump_evidence(snap: Snapshot, cdu: str) -> dict[str, Any]:
    """The CDU's own word on its pumps while flow is low: pumps reading stopped, pump alarms active."""
    stopped = sorted(r.label("pump") for r in snap.select("supernode_cdu_pump_running", cdu=cdu)
                     if r.ok and r.value < 0.5)
    alarms = sorted(r.label("alarm") for r in snap.select("supernode_cdu_alarm_active", cdu=cdu)
                    if r.ok and r.value >= 0.5 and "pump" in r.label("alarm"))
    return {k: v for k, v in (("pumps_stopped", stopped), ("pump_alarms", alarms)) if v}


def _gpus_hung(snap: Snapshot, ctx: Context) -> set[tuple[str, str]]:
    """(node, gpu) of the GPUs the NVML collector reports hung (supernode_gpu_hung 1)."""
    return {(_node(r, ctx), r.label("gpu")) for r in snap.select("supernode_gpu_hung") if r.ok and r.value >= 0.5}


def _zone_sensor_from_id(reading_id: str) -> dict[str, str]:
    parts = dict(p.split("=", 1) for p in reading_id.split(",")[1:] if "=" in p)
    return {"zone": parts.get("zone", ""), "sensor": parts.get("sensor", "")}
