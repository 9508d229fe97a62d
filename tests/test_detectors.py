"""Detector rules that must agree with the alert rules: flow baseline, NVLink per link, thermal clock events.

Pure detector tests on hand-made snapshots (no devices); the same behaviour
with the real daemon is in tests/test_detectors_agent.py.
"""

from __future__ import annotations

import asyncio
import time

from hypothesis import given
from hypothesis import strategies as st

from agent.remediation.detectors import Context, Detectors
from agent.remediation.flow_baseline import FlowBaselines
from agent.remediation.settings import DetectorSettings
from agent.snapshot import Snapshot
from exporters.cooling import modbus_metrics
from exporters.gpu import nvml_metrics
from exporters.model import Quality, Reading
from exporters.power import pdu_metrics

from tests.remediation_support import engine, inventory

SPECS = {**modbus_metrics.ALL, **{m.name: m for m in nvml_metrics.ALL}}


def reading(metric: str, value: float, ts: float | None = None, **labels: str) -> Reading:
    """A reading of the exporters' own metric family (their label sets are the real ones)."""
    return Reading(SPECS[metric], value, labels, Quality.OK, time.time() if ts is None else ts)


def snap(*readings: Reading, at: float, monotonic: float | None = None) -> Snapshot:
    return Snapshot(at, tuple(readings), (), monotonic=monotonic)

FAST = {"fire_seconds": 0.0, "clear_seconds": 0.0}


def _cdu(t: float, flow: float, setpoint: float | None = None, supply: float = 30.0, ret: float = 35.0,
         monotonic: float | None = None):
    """A CDU snapshot at wall time `t`; `monotonic` apart from it as on a host (default: the same clock)."""
    rs = [reading("supernode_cdu_flow_cubic_meters_per_second", flow, t, cdu="cdu1", loop="secondary"),
          reading("supernode_cdu_temperature_celsius", supply, t, cdu="cdu1", loop="secondary", point="supply"),
          reading("supernode_cdu_temperature_celsius", ret, t, cdu="cdu1", loop="secondary", point="return")]
    if setpoint is not None:
        rs.append(reading("supernode_cdu_pump_speed_setpoint_ratio", setpoint, t, cdu="cdu1"))
    return snap(*rs, at=t, monotonic=monotonic)


def _flow_events(d: Detectors, s) -> list[str]:
    return [e.kind for e in d.evaluate(s) if e.detector == "coolant_flow_low"]


def test_lowering_the_pump_set_point_is_not_a_flow_fault():
    """Issue 16.6: the peak since start made a set point change cap the rack until restart."""
    d = Detectors(DetectorSettings(coolant_flow_low=FAST, flow_setpoint_settle_seconds=5.0), Context("n1", "r01"))
    for t in range(10):
        assert _flow_events(d, _cdu(float(t), 0.005, setpoint=0.7)) == []
    # The operator lowers the set point: flow falls to 57 % and ΔT rises, as with a failing pump.
    for t in range(10, 40):
        assert _flow_events(d, _cdu(float(t), 0.00285, setpoint=0.4, ret=38.8)) == [], t
    # The baseline now follows the new set point: a real 40 % drop from there fires.
    assert _flow_events(d, _cdu(40.0, 0.0017, setpoint=0.4, ret=44.0)) == ["fire"]


def test_flow_drop_fires_only_with_rising_delta_t_by_default():
    d = Detectors(DetectorSettings(coolant_flow_low=FAST), Context("n1", "r01"))
    for t in range(5):
        _flow_events(d, _cdu(float(t), 0.005))
    # Flow reads 60 % but ΔT is flat: a meter failing low, not the loop.
    assert _flow_events(d, _cdu(5.0, 0.003, ret=35.2)) == []
    assert _flow_events(d, _cdu(6.0, 0.003, ret=38.0)) == ["fire"]


def test_a_lasting_flow_drop_never_becomes_the_new_baseline():
    d = Detectors(DetectorSettings(coolant_flow_low=FAST, flow_baseline_window_seconds=60.0), Context("n1", "r01"))
    for t in range(5):
        _flow_events(d, _cdu(float(t), 0.005))
    assert _flow_events(d, _cdu(5.0, 0.003, ret=39.0)) == ["fire"]
    # Ten windows later the loop is still starved: still firing, never cleared.
    for t in range(6, 600, 7):
        assert _flow_events(d, _cdu(float(t), 0.003, ret=39.0)) == [], t
    assert _flow_events(d, _cdu(700.0, 0.0049)) == ["clear"]


def test_the_flow_baseline_window_expires_when_wall_and_monotonic_clocks_differ():
    """The window ran on the monotonic clock against the readings' wall-clock times, so no sample ever left it: a
    high flow of the agent's first minute stayed the baseline for good (a slow healthy drift then fired), and the
    samples held grew by one a poll for the agent's whole life."""
    window = 60.0
    d = Detectors(DetectorSettings(coolant_flow_low=FAST, flow_baseline_window_seconds=window,
                                   flow_confirm_delta_t=False), Context("n1", "r01"))
    wall0, mono0 = 1.8e9, 5_000.0  # as on a host: the epoch against seconds since boot
    flows = [(0, 0.005), (10, 0.0044), (100, 0.0039), (200, 0.0034), (300, 0.0030)]
    for (start, flow), (end, _) in zip(flows, flows[1:] + [(400, None)]):
        # Each step keeps 88 % of the last window's highest flow: healthy throughout. Against the first
        # minute's 0.005 the step to 0.0034 reads 68 %, below the 70 % that fires.
        for t in range(start, end):
            events = _flow_events(d, _cdu(wall0 + t, flow, monotonic=mono0 + t))
            assert events == [], (t, flow, events)
        assert d.flow_baselines.retained("cdu1") <= 2 * (window + 2), (end, d.flow_baselines.retained("cdu1"))
    assert d.flow_baselines.flow("cdu1", mono0 + 399) == 0.0030


def test_configured_nominal_flow_is_the_baseline():
    d = Detectors(DetectorSettings(coolant_flow_low=FAST, nominal_flow_cubic_meters_per_second=0.01),
                  Context("n1", "r01"))
    # Flow has never been higher than 0.006, but that is 60 % of the configured nominal.
    assert _flow_events(d, _cdu(1.0, 0.006)) == ["fire"]


def _link(t: float, gpu: str, link: str, kind: str, value: float):
    return reading("supernode_nvlink_errors_total", value, t, gpu=gpu, uuid=f"u{gpu}", link=link, type=kind)


def test_nvlink_rate_is_per_link_summed_over_types_like_the_alert():
    d = Detectors(DetectorSettings(nvlink_errors=FAST), Context("n1", "r01"))
    first = [_link(0.0, "0", "1", "crc_flit", 0), _link(0.0, "0", "1", "replay", 0),
             _link(0.0, "0", "2", "crc_flit", 0), _link(0.0, "0", "2", "recovery_failed", 0)]
    assert d.evaluate(snap(*first, at=0.0)) == []
    # link 1: 6/s + 6/s = 12/s (above 10/s only summed); link 2: 5/s + 4/s.
    second = [_link(1.0, "0", "1", "crc_flit", 6), _link(1.0, "0", "1", "replay", 6),
              _link(1.0, "0", "2", "crc_flit", 5), _link(1.0, "0", "2", "recovery_failed", 4)]
    ev = d.evaluate(snap(*second, at=1.0))
    assert [(e.kind, e.targets, e.detail["errors_per_second"]) for e in ev] == [
        ("fire", {"node": "n1", "gpu": "0"}, 12.0)]


def test_nvlink_rate_at_the_alert_threshold_does_not_fire_and_high_ber_does():
    d = Detectors(DetectorSettings(nvlink_errors=FAST), Context("n1", "r01"))
    d.evaluate(snap(_link(0.0, "1", "3", "crc_flit", 0), at=0.0))
    assert d.evaluate(snap(_link(1.0, "1", "3", "crc_flit", 10), at=1.0)) == []  # 10/s is not above 10/s
    ber = reading("supernode_nvlink_bit_error_rate", 3e-12, 2.0, gpu="1", uuid="u1", link="3", kind="effective")
    ev = d.evaluate(snap(_link(2.0, "1", "3", "crc_flit", 10), ber, at=2.0))
    assert [(e.kind, e.detail["links_ber_high"]) for e in ev] == [("fire", ["3"])]


def test_nvlink_counters_given_again_between_reads_keep_their_rate_until_the_next_read():
    """The NVML source reads error counters every few polls and gives the same readings again in between (with
    their own timestamps): the rate stays the one of the last read, and the next read moves it, both ways."""
    d = Detectors(DetectorSettings(nvlink_errors=FAST), Context("n1", "r01"))

    def up(t: float) -> Reading:
        return reading("supernode_nvlink_up", 1.0, t, gpu="0", uuid="u0", link="1")

    def rate(events_and_snapshot) -> float:
        (obs,) = [o for o in d.observe(events_and_snapshot, frozenset({"supernode_nvlink_up"}))]
        return obs.detail["errors_per_second"]

    read0 = [_link(0.0, "0", "1", "crc_flit", 0)]
    assert d.evaluate(snap(*read0, up(0.0), at=0.0)) == []
    assert d.evaluate(snap(*list(read0), up(1.0), at=1.0)) == []  # the same reading again: no rate from it
    read5 = [_link(5.0, "0", "1", "crc_flit", 60)]  # 60 in 5 s: 12/s
    ev = d.evaluate(snap(*read5, up(5.0), at=5.0))
    assert [(e.kind, e.detail["errors_per_second"]) for e in ev] == [("fire", 12.0)]
    again = snap(*list(read5), up(6.0), at=6.0)
    assert d.evaluate(again) == [] and rate(again) == 12.0  # still the last read's rate, not 0 or None
    read10 = [_link(10.0, "0", "1", "crc_flit", 60)]  # nothing more: 0/s
    ev = d.evaluate(snap(*read10, up(10.0), at=10.0))
    assert [(e.kind, e.detail["errors_per_second"]) for e in ev] == [("clear", 0.0)]
    # an equal but newer-read reading (same value, later timestamp) is a new read: 0/s, no stale 12/s
    assert rate(snap(_link(11.0, "0", "1", "crc_flit", 60), up(11.0), at=11.0)) == 0.0


def test_sw_thermal_slowdown_counts_like_the_alert():
    d = Detectors(DetectorSettings(gpu_thermal=FAST), Context("n1", "r01"))
    cool = reading("supernode_gpu_temperature_celsius", 60, 1.0, gpu="0", uuid="u", sensor="gpu")
    ev = reading("supernode_gpu_clock_event_active", 1, 1.0, gpu="0", uuid="u", reason="sw_thermal")
    power = reading("supernode_gpu_clock_event_active", 1, 1.0, gpu="0", uuid="u", reason="sw_power_cap")
    assert d.evaluate(snap(cool, power, at=1.0)) == []
    assert [(e.kind, e.detector) for e in d.evaluate(snap(cool, power, ev, at=2.0))] == [("fire", "gpu_thermal")]


def _unknown(t: float, zone: str, sensor: str, down: float):
    return reading("supernode_leak_sensor_fault", down, t, zone=zone, sensor=sensor, fault="source_down")


def test_an_unreadable_leak_source_is_a_critical_incident_per_zone_never_a_leak():
    d = Detectors(DetectorSettings(), Context("n1", "r01"))
    assert d.evaluate(snap(_unknown(1.0, "zone-a", "rope", 0), _unknown(1.0, "zone-a", "spot", 0), at=1.0)) == []
    ev = d.evaluate(snap(_unknown(2.0, "zone-a", "rope", 1), _unknown(2.0, "zone-a", "spot", 1),
                         _unknown(2.0, "zone-b", "rope", 0), at=2.0))
    assert [(e.kind, e.detector, e.targets, e.severity, e.detail["sensors"]) for e in ev] == [
        ("fire", "leak_source_down", {"zone": "zone-a"}, "critical", ["rope", "spot"])]
    # Not a sensor fault of its own (that one is a warning for a broken rope), and never a leak.
    later = d.evaluate(snap(_unknown(3.0, "zone-a", "rope", 1), at=3.0))
    assert later == [] and "leak" not in {k for k, t in d.trackers.items() if t.active()}
    assert [e.kind for e in d.evaluate(snap(_unknown(20.0, "zone-a", "rope", 0), at=20.0))] == []
    assert [e.kind for e in d.evaluate(snap(_unknown(31.0, "zone-a", "rope", 0), at=31.0))] == ["clear"]


def test_leak_watch_marks_every_input_unknown_once_its_source_is_stale():
    import asyncio

    from agent.derived import LeakWatchSource
    from agent.snapshot import SnapshotStore
    from exporters.cooling.modbus import ModbusSource

    now = [1000.0]
    store = SnapshotStore(clock=lambda: now[0])
    src = ModbusSource("leak", "leak1", "rle-ld2100", channels={1: "zone-a", 2: "zone-b"})
    store.register("leak", "leak1", 0.5, 2.0)
    watch = LeakWatchSource(store, [src])

    def values() -> dict[tuple[str, str], float]:
        result = asyncio.run(watch.poll())
        assert {r.label("fault") for r in result.readings} <= {"source_down"}
        return {(r.label("zone"), r.label("sensor")): r.value for r in result.readings}

    assert values() == {}  # never polled: nothing to say yet
    store.fail("leak", "leak1", "connection", "refused", 0.01)
    assert set(values().values()) == {0.0}  # one failed try is not yet "unknown"...
    now[0] += 1.1
    store.fail("leak", "leak1", "connection", "refused", 0.01)
    assert set(values().values()) == {1.0}  # ...never answering for two intervals is
    store.publish("leak", "leak1", [], 0.01)
    assert values() == {("zone-a", "zone-1"): 0.0, ("zone-b", "zone-2"): 0.0}
    now[0] += 0.6
    store.fail("leak", "leak1", "timeout", "slow", 0.01)
    assert set(values().values()) == {0.0}  # one slow poll: its readings are still fresh, not unknown
    now[0] += 0.6
    store.fail("leak", "leak1", "timeout", "slow", 0.01)
    assert set(values().values()) == {1.0}  # stale: the leak series leave /metrics, "unknown" takes their place


def test_leak_watch_says_nothing_of_a_source_this_agent_does_not_read_now():
    """Rack coordination: another tray's BMC read only while this agent leads is not 'unknown' once it stops."""
    import asyncio

    from agent.derived import LeakWatchSource
    from agent.snapshot import SnapshotStore
    from exporters.cooling.modbus import ModbusSource

    now = [1000.0]
    store = SnapshotStore(clock=lambda: now[0])
    src = ModbusSource("leak", "leak1", "rle-ld2100", channels={1: "zone-a"})
    store.register("leak", "leak1", 0.5, 2.0)
    idle: set = set()
    watch = LeakWatchSource(store, [src], lambda: frozenset(idle))
    store.publish("leak", "leak1", [], 0.01)
    now[0] += 5.0
    assert {r.value for r in asyncio.run(watch.poll()).readings} == {1.0}  # stale while it is ours: unknown
    idle.add(("leak", "leak1"))
    assert asyncio.run(watch.poll()).readings == []  # not ours now: nothing said of it


def test_each_detector_declares_exactly_the_families_it_reads():
    """Detectors run only for the sources that feed them, so INPUTS must name every family a detector reads:
    collected from the code (string literals in the method and in the helpers it calls), not from memory."""
    import ast
    import inspect
    import textwrap

    import sys

    from agent.remediation.detectors import Detectors

    # The detectors are defined by domain, one module each (the classes Detectors combines): read them all.
    modules = {sys.modules[c.__module__] for c in Detectors.__mro__ if c is not object}
    modules.add(sys.modules["agent.remediation.cdu_view"])  # the CDU view the coolant detectors read through
    functions = {n.name: n for m in modules for n in ast.walk(ast.parse(inspect.getsource(m)))
                 if isinstance(n, ast.FunctionDef)}

    def families(fn: ast.FunctionDef, seen: set[str]) -> set[str]:
        found = {n.value for n in ast.walk(fn) if isinstance(n, ast.Constant) and isinstance(n.value, str)
                 and n.value.startswith("supernode_")}
        for call in (n for n in ast.walk(fn) if isinstance(n, ast.Call)):
            f = call.func
            name = f.attr if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "self" \
                else f.id if isinstance(f, ast.Name) else None
            if name in functions and name not in seen and name not in ("_ok_or_fault", "_fault"):
                seen.add(name)
                found |= families(functions[name], seen)
        return found

    assert set(Detectors.INPUTS) == {"_leak", "_coolant", "_pump_health", "_filter", "_reservoir", "_service_hours",
                                     "_gpu_thermal", "_gpu_faults", "_gpu_lost", "_nvlink",
                                     "_nvlink_switch",
                                     "_optic", "_rack_power", "_outlets", "_tray_rack", "_leak_loop",
                                     "_gpu_pcie", "_gpu_clock_slowdown", "_gpu_straggler", "_gpu_fabric",
                                     "_cold_plate", "_tray_flow"}
    for name, declared in Detectors.INPUTS.items():
        read = families(functions[name], {name})
        assert read, textwrap.dedent(f"{name}: found no family; the check would pass vacuously")
        assert read == set(declared), (name, sorted(read ^ set(declared)))


def test_hold_times_follow_the_monotonic_clock_not_a_wall_clock_step():
    """A wall clock stepped an hour ahead between two polls must not satisfy a 60 s clear hold."""
    d = Detectors(DetectorSettings(gpu_thermal={"fire_seconds": 0.0, "clear_seconds": 60.0}), Context("n1", "r01"))

    def at(wall: float, mono: float, celsius: float) -> Snapshot:
        temp = reading("supernode_gpu_temperature_celsius", celsius, wall, gpu="0", uuid="u", sensor="gpu")
        limit = reading("supernode_gpu_temperature_threshold_celsius", 90.0, wall, gpu="0", uuid="u",
                        threshold="slowdown")
        return Snapshot(wall, (temp, limit), (), monotonic=mono)

    assert [e.kind for e in d.evaluate(at(1000.0, 50.0, 89.0))] == ["fire"]
    assert d.evaluate(at(1001.0, 51.0, 40.0)) == []
    assert d.evaluate(at(4602.0, 52.0, 40.0)) == []  # NTP stepped an hour ahead; 1 s passed really: held
    assert [e.kind for e in d.evaluate(at(4700.0, 112.0, 40.0))] == ["clear"]


def _outlet(outlet: str, on: float, t: float, quality: Quality = Quality.OK) -> Reading:
    return Reading(pdu_metrics.OUTLET_ON, on, {"pdu": "pdu-a", "outlet": outlet}, quality, t)


def test_pdu_outlet_off_fires_only_for_an_outlet_feeding_a_node():
    hold = {"fire_seconds": 0.0, "clear_seconds": 0.0}
    d = Detectors(DetectorSettings(pdu_outlet_off=hold),
                  Context("node01", "r01", outlet_feeds={("pdu-a", "1"): "node01"}))
    assert d.evaluate(snap(_outlet("1", 1, 1.0), _outlet("9", 0, 1.0), at=1.0)) == []  # outlet 9 feeds nothing
    ev = d.evaluate(snap(_outlet("1", 0, 2.0), _outlet("9", 0, 2.0), at=2.0))
    assert [(e.kind, e.detector, e.targets, dict(e.detail)) for e in ev] == [
        ("fire", "pdu_outlet_off", {"pdu": "pdu-a", "outlet": "1"}, {"feeds": "node01"})]
    faulty = d.evaluate(snap(_outlet("1", 0, 3.0, Quality.SENSOR_FAULT), at=3.0))
    assert all(e.detector != "pdu_outlet_off" or e.kind != "fire" for e in faulty)  # a bad reading never fires
    assert [e.kind for e in d.evaluate(snap(_outlet("1", 1, 4.0), at=4.0)) if e.detector == "pdu_outlet_off"] == ["clear"]


def test_an_outlet_the_agent_switched_off_itself_is_not_a_failure(tmp_path):
    async def main():
        eng = engine(tmp_path, mode="observe", inv=inventory(pdus=[
            {"name": "pdu-a", "profile": "raritan-pdu2", "outlets": {"1": "node01"}}]))
        await eng.start()
        eng.effects[("pdu_outlet", "outlet=1,pdu=pdu-a")] = {"before": {}, "after": {}, "params": {},
                                                               "holders": {"leak-1": "a1"}}
        assert eng.fire("pdu_outlet_off", {"pdu": "pdu-a", "outlet": "1"}, "warning") is None
        assert eng.incidents.open_incidents() == [] and eng.component_failures == {}
        del eng.effects[("pdu_outlet", "outlet=1,pdu=pdu-a")]
        assert eng.fire("pdu_outlet_off", {"pdu": "pdu-a", "outlet": "1"}, "warning") is not None
        assert eng.component_failures == {"pdu_outlet": 1}
        await eng.stop()
    asyncio.run(main())


def test_flow_low_says_which_pumps_the_cdu_reports_stopped():
    """The reliability report counts a pump, not the CDU, when the CDU itself says a pump stopped."""
    d = Detectors(DetectorSettings(coolant_flow_low=FAST, nominal_flow_cubic_meters_per_second=0.005,
                                   flow_confirm_delta_t=False), Context("n1", "r01"))
    pumps = [reading("supernode_cdu_pump_running", 1.0, 1.0, cdu="cdu1", pump="1"),
             reading("supernode_cdu_pump_running", 0.0, 1.0, cdu="cdu1", pump="2"),
             reading("supernode_cdu_alarm_active", 1.0, 1.0, cdu="cdu1", alarm="pump_fail")]
    flow = reading("supernode_cdu_flow_cubic_meters_per_second", 0.002, 1.0, cdu="cdu1", loop="secondary")
    ev = [e for e in d.evaluate(snap(flow, *pumps, at=1.0)) if e.detector == "coolant_flow_low"]
    assert [(e.kind, e.detail.get("pumps_stopped"), e.detail.get("pump_alarms")) for e in ev] == [
        ("fire", ["2"], ["pump_fail"])]


def _trays(t: float, states: dict[str, float], faulty: set[str] = frozenset()) -> Snapshot:
    """Tray BMCs (kind tray) and a CDU (kind cdu) with one detector each, in the Redfish source's families."""
    from exporters.redfish import metrics as rm

    rs = []
    for bmc, state in states.items():
        kind = "cdu" if bmc.startswith("cdu") else "tray"
        rs.append(Reading(rm.SERVICE_INFO, 1.0, {"bmc": bmc, "kind": kind, "redfish_version": "1.17.0",
                                                 "vendor": "x", "model": "y", "firmware": "z", "profile": "dmtf"},
                          Quality.OK, t))
        rs.append(Reading(rm.DETECTOR_STATE, state, {"bmc": bmc, "chassis": "Chassis_0", "detector": "LD_0",
                                                     "type": "Moisture"},
                          Quality.SENSOR_FAULT if bmc in faulty else Quality.OK, t))
    return snap(*rs, at=t)


def _rack_events(d: Detectors, s) -> list[tuple[str, dict]]:
    return [(e.kind, e.targets) for e in d.evaluate(s) if e.detector == "tray_leak_rack"]


def test_more_than_n_leaking_trays_is_a_rack_incident_and_faults_or_cdus_never_count():
    d = Detectors(DetectorSettings(tray_leak_rack=FAST), Context("n1", "r01"))
    dry = {"n1-bmc": 0.0, "n2-bmc": 0.0, "n3-bmc": 0.0, "cdu-r": 0.0}
    assert _rack_events(d, _trays(1.0, dry)) == []
    # Two trays and the CDU leak: not more than 2 trays.
    assert _rack_events(d, _trays(2.0, {**dry, "n1-bmc": 2.0, "n2-bmc": 1.0, "cdu-r": 2.0})) == []
    # A third tray reads a leak, but its detector is a sensor fault: it does not count.
    three = {**dry, "n1-bmc": 2.0, "n2-bmc": 1.0, "n3-bmc": 2.0}
    assert _rack_events(d, _trays(3.0, three, faulty={"n3-bmc"})) == []
    assert _rack_events(d, _trays(4.0, three)) == [("fire", {"rack": "r01"})]
    assert _rack_events(d, _trays(5.0, dry)) == [("clear", {"rack": "r01"})]
    # The threshold is the setting.
    d1 = Detectors(DetectorSettings(tray_leak_rack=FAST, rack_tray_leaks=1), Context("n1", "r01"))
    assert _rack_events(d1, _trays(1.0, {**dry, "n1-bmc": 2.0, "n2-bmc": 2.0})) == [("fire", {"rack": "r01"})]


def test_consecutive_wet_polls_are_the_wet_sensors_own_not_another_source_of_the_zone():
    """A tray BMC and the zone's leak rope share zone-a: the rope's polls neither hide the tray's first wet
    reading (its poll started earlier, published later) nor count as the tray's second one."""
    d = Detectors(DetectorSettings(leak=FAST), Context("n1", "r01"))

    def at(t: float, rope_ts: float, tray: float | None = None, tray_ts: float = 0.0):
        rs = [reading("supernode_leak_detected", 0, rope_ts, zone="zone-a", sensor="rope1")]
        if tray is not None:
            rs.append(reading("supernode_leak_detected", tray, tray_ts, zone="zone-a", sensor="bmc-n1/Chassis_0/LD_0"))
        return [e.kind for e in d.evaluate(snap(*rs, at=t)) if e.detector == "leak"]

    assert at(1.5, rope_ts=1.5, tray=0.0, tray_ts=1.0) == []
    assert at(1.6, rope_ts=1.5, tray=1.0, tray_ts=1.2) == []  # the tray's first wet poll: counted, not yet two
    assert d.leak_awaiting_confirmation()
    assert at(2.0, rope_ts=2.0, tray=1.0, tray_ts=1.2) == []  # the rope polled again: not the tray's second poll
    assert at(2.1, rope_ts=2.0, tray=1.0, tray_ts=2.1) == ["fire"]  # the tray's re-read


def test_a_leak_back_within_its_clear_hold_is_still_confirmed_at_once():
    """This agent's leak incident is still open in its clear hold when the zone reads wet again: the wet poll
    after the dry ones still asks for the immediate re-read (the agents reading its facts may have closed
    theirs already and need the second wet poll now), and a zone wet on every poll asks no more."""
    d = Detectors(DetectorSettings(leak={"fire_seconds": 0.0, "clear_seconds": 60.0}), Context("n1", "r01"))

    def at(t: float, wet: float) -> list[str]:
        s = snap(reading("supernode_leak_detected", wet, t, zone="zone-a", sensor="rope1"), at=t)
        return [e.kind for e in d.evaluate(s) if e.detector == "leak"]

    assert at(1.0, 1.0) == [] and d.leak_awaiting_confirmation()
    assert at(1.1, 1.0) == ["fire"] and not d.leak_awaiting_confirmation()
    assert at(1.5, 1.0) == [] and not d.leak_awaiting_confirmation()  # still wet: nothing to confirm
    assert at(2.0, 0.0) == [] and at(2.5, 0.0) == []  # dry, the clear hold not over: the incident stays open
    assert not d.leak_awaiting_confirmation()
    assert at(3.0, 1.0) == [] and d.leak_awaiting_confirmation()  # wet again after dry: confirm at once
    assert at(3.1, 1.0) == [] and not d.leak_awaiting_confirmation()


_SAMPLES = st.lists(st.tuples(st.floats(0.0, 40.0), st.floats(0.0, 0.01), st.one_of(st.none(), st.floats(-5.0, 15.0))),
                    max_size=80)


@given(_SAMPLES)
def test_the_flow_baseline_agrees_with_every_sample_kept_and_scanned(samples):
    """The falling run and the running sum give what a scan of every sample of the window gives (the newest one
    kept when all are older), with each query made right after its sample as the detector makes it."""
    window = 30.0
    base, kept_flow, kept_dt, now = FlowBaselines(window, 0.0), [], [], 0.0
    for step, (gap, flow, delta_t) in enumerate(samples):
        now += gap
        base.add("c", float(step), flow, delta_t, now)
        kept_flow.append((now, flow))
        if delta_t is not None:
            kept_dt.append((now, delta_t))
        in_flow = [v for t, v in kept_flow if now - t <= window] or [kept_flow[-1][1]]
        assert base.flow("c", now) == max(in_flow)
        in_dt = [v for t, v in kept_dt if now - t <= window] or [v for _, v in kept_dt[-1:]]
        got = base.delta_t("c", now)
        if not in_dt:
            assert got is None
        else:
            assert abs(got - sum(in_dt) / len(in_dt)) <= 1e-9, (got, in_dt)


def test_each_detector_declares_the_one_severity_its_observations_carry():
    """Detectors.SEVERITY (what the remediation families start at zero for) against every Observation the detector
    modules build, read from their code: a detector name or severity that is not a literal fails here too, since
    the table could not be checked for it."""
    import ast
    import inspect
    import sys

    from agent.remediation.detectors import Detectors

    modules = {sys.modules[c.__module__] for c in Detectors.__mro__ if c is not object}
    built: dict[str, set[str]] = {}
    for module in modules:
        for node in ast.walk(ast.parse(inspect.getsource(module))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Observation":
                name, severity = node.args[0], node.args[2]
                assert isinstance(name, ast.Constant) and isinstance(severity, ast.Constant), ast.unparse(node)
                built.setdefault(name.value, set()).add(severity.value)
    assert len(built) > 20  # the scan found the detectors (it would pass vacuously otherwise)
    assert {d: {s} for d, s in Detectors.SEVERITY.items()} == built


def test_the_remediation_families_start_at_zero_for_each_detectors_own_severity(tmp_path):
    from prometheus_client import CollectorRegistry, generate_latest

    from tests.remediation_support import engine

    eng = engine(tmp_path)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(eng.collector())
    text = generate_latest(registry).decode()
    assert 'supernode_incident_open{detector="leak",severity="critical"} 0.0' in text
    assert 'supernode_incident_open{detector="leak",severity="warning"}' not in text  # a leak is never a warning
    assert 'supernode_incidents_total{detector="gpu_thermal",severity="warning"} 0.0' in text
    assert 'supernode_incidents_total{detector="gpu_thermal",severity="critical"}' not in text
