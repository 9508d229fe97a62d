"""Pump and loop health detectors (issue 35) on hand-made snapshots, Modbus and Redfish CDUs alike.

The same with the real daemon and the simulator's pump-fail is in tests/test_cdu_loop_agent.py.
"""

from __future__ import annotations

from agent.remediation.detectors import Context, Detectors
from agent.remediation.settings import DetectorSettings
from agent.snapshot import Snapshot
from exporters.cooling import modbus_metrics as mm
from exporters.model import Quality, Reading
from exporters.redfish import metrics as rm

FAST = {"fire_seconds": 0.0, "clear_seconds": 0.0}


def _modbus(t: float, running: tuple[bool, bool], speeds: tuple[float, float], setpoint: float = 0.7) -> list[Reading]:
    out = [Reading(mm.PUMP_SETPOINT, setpoint, {"cdu": "cdu1"}, Quality.OK, t)]
    for i, (on, speed) in enumerate(zip(running, speeds), 1):
        out += [Reading(mm.PUMP_RUNNING, float(on), {"cdu": "cdu1", "pump": str(i)}, Quality.OK, t),
                Reading(mm.PUMP_SPEED, speed, {"cdu": "cdu1", "pump": str(i)}, Quality.OK, t)]
    return out


def _redfish(t: float, pumps: dict[str, tuple[str, float]]) -> list[Reading]:
    """A Redfish CDU's pumps: id -> (Status.State, PumpSpeedPercent as a ratio)."""
    out = [Reading(rm.SERVICE_INFO, 1.0, {"bmc": "rfcdu1", "kind": "cdu", "redfish_version": "1.19.0", "vendor": "v",
                                          "model": "m", "firmware": "f", "profile": "dmtf"}, Quality.OK, t)]
    for pump, (state, speed) in pumps.items():
        offline = state == "UnavailableOffline"
        labels = {"bmc": "rfcdu1", "equipment": "1", "pump": pump}
        out += [Reading(rm.PUMP_SPEED, speed, labels, Quality.SENSOR_FAULT if offline else Quality.OK, t),
                Reading(rm.PUMP_SETPOINT, 0.7, labels, Quality.SENSOR_FAULT if offline else Quality.OK, t),
                Reading(rm.HEALTH, 2.0 if offline else 0.0, {"bmc": "rfcdu1", "equipment": "1", "kind": "pump",
                                                             "resource": pump}, Quality.OK, t)]
    return out


def _events(d: Detectors, t: float, readings: list[Reading]) -> list[tuple[str, dict, dict]]:
    return [(e.kind, e.targets, e.detail) for e in d.evaluate(Snapshot(t, tuple(readings), (), monotonic=t))
            if e.detector == "pump_redundancy_lost"]


def test_a_stopped_pump_of_two_is_redundancy_lost_on_a_modbus_cdu_and_clears_when_it_runs():
    d = Detectors(DetectorSettings(pump_redundancy_lost=FAST), Context("n1", "r01"))
    assert _events(d, 1.0, _modbus(1.0, (True, True), (0.7, 0.7))) == []
    [(kind, targets, detail)] = _events(d, 2.0, _modbus(2.0, (True, False), (0.7, 0.0)))
    assert (kind, targets, detail["pumps_stopped"]) == ("fire", {"cdu": "cdu1"}, ["2"])
    assert [e[0] for e in _events(d, 3.0, _modbus(3.0, (True, True), (0.7, 0.7)))] == ["clear"]


def test_a_pump_below_its_set_point_is_redundancy_lost_with_hysteresis():
    d = Detectors(DetectorSettings(pump_redundancy_lost=FAST), Context("n1", "r01"))
    [(kind, _, detail)] = _events(d, 1.0, _modbus(1.0, (True, True), (0.7, 0.35)))  # half its set point
    assert kind == "fire" and detail["pumps_slow"] == ["2"]
    assert _events(d, 2.0, _modbus(2.0, (True, True), (0.7, 0.6))) == []  # 86 %: between set and clear, held
    assert [e[0] for e in _events(d, 3.0, _modbus(3.0, (True, True), (0.7, 0.69)))] == ["clear"]


def test_a_redfish_cdu_pump_offline_is_the_same_incident():
    d = Detectors(DetectorSettings(pump_redundancy_lost=FAST), Context("n1", "r01"))
    ok = {"1": ("Enabled", 0.7), "2": ("Enabled", 0.7)}
    assert _events(d, 1.0, _redfish(1.0, ok)) == []
    [(kind, targets, detail)] = _events(d, 2.0, _redfish(2.0, {**ok, "2": ("UnavailableOffline", 0.0)}))
    assert (kind, targets, detail["pumps_stopped"]) == ("fire", {"cdu": "rfcdu1"}, ["2"])


def test_a_pump_the_agent_cannot_read_is_unknown_not_fine():
    d = Detectors(DetectorSettings(pump_redundancy_lost=FAST), Context("n1", "r01"))
    assert _events(d, 1.0, _modbus(1.0, (True, False), (0.7, 0.0)))[0][0] == "fire"
    unread = _modbus(2.0, (True, True), (0.7, 0.7))
    unread[3] = Reading(mm.PUMP_RUNNING, 0.0, {"cdu": "cdu1", "pump": "2"}, Quality.SENSOR_FAULT, 2.0)
    assert _events(d, 2.0, unread) == []  # neither clears nor fires while pump 2 cannot be read


def _kinds(d: Detectors, t: float, readings: list[Reading], detector: str) -> list[tuple[str, dict]]:
    return [(e.kind, e.targets) for e in d.evaluate(Snapshot(t, tuple(readings), (), monotonic=t))
            if e.detector == detector]


def test_a_filter_pressure_drop_rising_past_its_limit_fires_and_clears_below_the_clear_level():
    d = Detectors(DetectorSettings(filter_clogging=FAST), Context("n1", "r01"))

    def dp(t: float, pa: float) -> list[Reading]:
        return [Reading(mm.PRESSURE, pa, {"cdu": "cdu1", "loop": "secondary", "point": "filter_differential"},
                        Quality.OK, t)]
    assert _kinds(d, 1.0, dp(1.0, 20_000.0), "filter_clogging") == []
    assert _kinds(d, 2.0, dp(2.0, 55_000.0), "filter_clogging") == [("fire", {"cdu": "cdu1"})]
    assert _kinds(d, 3.0, dp(3.0, 45_000.0), "filter_clogging") == []  # between clear and set: held
    assert _kinds(d, 4.0, dp(4.0, 30_000.0), "filter_clogging") == [("clear", {"cdu": "cdu1"})]


def test_a_low_reservoir_fires_from_a_modbus_level_or_a_redfish_reservoir_health():
    d = Detectors(DetectorSettings(reservoir_low=FAST), Context("n1", "r01"))
    modbus = [Reading(mm.RESERVOIR, 0.2, {"cdu": "cdu1"}, Quality.OK, 1.0)]
    redfish = _redfish(1.0, {}) + [Reading(rm.HEALTH, 1.0, {"bmc": "rfcdu1", "equipment": "1", "kind": "reservoir",
                                                             "resource": "1"}, Quality.OK, 1.0)]
    assert sorted(t["cdu"] for k, t in _kinds(d, 1.0, modbus + redfish, "reservoir_low") if k == "fire") == [
        "cdu1", "rfcdu1"]


def test_a_filter_at_its_rated_service_hours_is_due_and_one_without_a_rating_is_not_judged():
    d = Detectors(DetectorSettings(coolant_service_due=FAST), Context("n1", "r01"))

    def hours(resource: str, served: float, rated: float | None) -> list[Reading]:
        labels = {"bmc": "rfcdu1", "equipment": "1", "kind": "filter", "resource": resource}
        out = [Reading(rm.SERVICE_TIME, served * 3600, labels, Quality.OK, 1.0)]
        if rated is not None:
            out.append(Reading(rm.RATED_SERVICE_TIME, rated * 3600, labels, Quality.OK, 1.0))
        return out
    rs = hours("1", 9500, 10000) + hours("2", 5791, 10000) + hours("3", 99999, None)
    assert _kinds(d, 1.0, rs, "coolant_service_due") == [
        ("fire", {"cdu": "rfcdu1", "kind": "filter", "resource": "1"})]


def test_a_loop_input_that_is_not_ok_or_gone_neither_fires_nor_clears_and_says_sensor_fault():
    """Missing inputs of the loop-health detectors: a filter pressure drop or a reservoir level that is not ok is a
    sensor fault (its own warning), never "clean" or "full"; one that is gone (the CDU stale) is no observation:
    an open incident holds; a service time that is not ok is unknown."""
    loop = ("filter_clogging", "reservoir_low", "coolant_service_due")
    d = Detectors(DetectorSettings(**dict.fromkeys(loop, FAST)), Context("n1", "r01"))
    svc = {"bmc": "rfcdu1", "equipment": "1", "kind": "filter", "resource": "1"}

    def inputs(t: float, q: Quality) -> list[Reading]:
        return [Reading(mm.PRESSURE, 55_000.0, {"cdu": "cdu1", "loop": "secondary", "point": "filter_differential"},
                        q, t),
                Reading(mm.RESERVOIR, 0.2, {"cdu": "cdu1"}, q, t),
                Reading(rm.SERVICE_TIME, 990 * 3600, svc, q, t), Reading(rm.RATED_SERVICE_TIME, 1000 * 3600, svc,
                                                                          Quality.OK, t)]

    def events(t: float, readings: list[Reading]) -> set[tuple[str, str]]:
        return {(e.kind, e.detector) for e in d.evaluate(Snapshot(t, tuple(readings), (), monotonic=t))
                if e.detector in loop + ("sensor_fault",)}

    assert events(1.0, inputs(1.0, Quality.OK)) == {("fire", name) for name in loop}
    faulted = events(2.0, inputs(2.0, Quality.SENSOR_FAULT))
    assert ("fire", "sensor_fault") in faulted and not {e for e in faulted if e[1] in loop}  # held, not cleared
    assert not {e for e in events(3.0, []) if e[1] in loop}  # gone: held too
    assert events(4.0, inputs(4.0, Quality.OK)) <= {("clear", "sensor_fault")}  # back and still bad: still open
