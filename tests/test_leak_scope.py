"""Leak containment by scope (issue 35): tray -> the trays below -> zone, each widening only on evidence, and
nothing undone after a leak before the scope's dry hold plus a person's approval.

The detector and the engine run on a test clock (the readings carry its timestamps, the engine reads it for
the hold); the drains are real, in a single-host Slurm. The daemon's story is in test_redfish_sim_agent.py.
"""

from __future__ import annotations

import asyncio

import pytest

from agent.config import Inventory
from agent.remediation.actions.slurm import SlurmScheduler
from agent.remediation.detectors import Context, Detectors
from agent.remediation.dry_hold import DryHistory
from agent.remediation.engine import Executors, RemediationEngine
from agent.remediation.leak_scope import trays_below
from agent.remediation.settings import DetectorSettings, RemediationSettings
from exporters.model import Quality, Reading, gauge
from tests.helpers import await_for
from tests.remediation_support import identity, reading, results, snap
from tests.slurm import node_states, running_cluster

NODES = ("node01", "node02", "node03", "node04")
# A GB200 NVL72-like slice: node01 on top, then node02, node03 (in zone-a), node04 (zone-b) below.
UNITS = {"node01": 40, "node02": 39, "node03": 38, "node04": 37}
ZONES = {"node01": "zone-a", "node02": "zone-a", "node03": "zone-a", "node04": "zone-b"}
HOLD = 100.0


def det(node: str) -> str:
    return f"bmc-{node}/Chassis_0/Chassis_0_LeakDetector_0_ColdPlate"


ROPE = "rope-zone-a"
SENSORS = [det(n) for n in NODES] + [ROPE]


def _inventory() -> Inventory:
    return Inventory(nodes=list(NODES), gpus={"count": 4}, rack_units=UNITS,
                     leak_zones=[{"name": "zone-a", "nodes": ["node01", "node02", "node03"], "valve": "cdu1:zone_valve_1"},
                                 {"name": "zone-b", "nodes": ["node04"]}],
                     redfish=[{"name": f"bmc-{n}", "kind": "tray", "node": n, "url": f"https://127.0.0.1:{9000 + i}"}
                              for i, n in enumerate(NODES)])


def leak_snap(t: float, *wet: str, unreadable: tuple[str, ...] = (), missing: tuple[str, ...] = ()):
    rows = []
    for s in SENSORS:
        if s in missing:
            continue
        zone = "zone-a" if s == ROPE else ZONES[s.split("/")[0].removeprefix("bmc-")]
        q = Quality.SENSOR_FAULT if s in unreadable else Quality.OK
        rows.append(reading("supernode_leak_detected", 1.0 if s in wet else 0.0, ts=t, quality=q, zone=zone, sensor=s))
    return snap(*rows, at=t)


# -- the scopes, at the detector -------------------------------------------------------------------------


def _detectors() -> Detectors:
    fast = {"fire_seconds": 0, "clear_seconds": 0}
    return Detectors(DetectorSettings(leak=fast, leak_tray=fast),
                     Context("node01", "r01", tray_bmcs={f"bmc-{n}": n for n in NODES}, rack_units=UNITS))


def _fired(d: Detectors, s) -> dict[str, list]:
    out: dict[str, list] = {}
    for e in d.evaluate(s):
        if e.kind == "fire":
            out.setdefault(e.detector, []).append((e.targets, e.detail))
    return out


def test_one_trays_leak_stays_its_own_scope_and_a_second_wet_detector_widens_it_to_the_zone():
    d = _detectors()
    assert _fired(d, leak_snap(1, det("node02"))) == {}  # one poll: not yet confirmed
    fired = _fired(d, leak_snap(2, det("node02")))
    (targets, detail), = fired.pop("leak_tray")
    assert targets == {"zone": "zone-a", "tray": "node02"} and fired == {}  # no zone leak on one tray's word
    assert detail["watched"] == ["node03"] and detail["sensors"] == [det("node02")]
    for t in (3, 4, 5):  # still only that tray: the zone stays out
        assert "leak" not in _fired(d, leak_snap(t, det("node02")))
    # A second detector of the zone (another tray's) is the evidence that widens it.
    assert _fired(d, leak_snap(6, det("node02"), det("node01"))) == {}
    fired = _fired(d, leak_snap(7, det("node02"), det("node01")))
    (targets, detail), = fired["leak"]
    assert targets == {"zone": "zone-a"} and detail["evidence"] == "2 trays wet at once: node01, node02"
    assert [t for t, _ in fired["leak_tray"]] == [{"zone": "zone-a", "tray": "node01"}]


def test_a_zone_sensor_is_the_zones_leak_and_a_tray_in_another_zone_never_widens_this_one():
    d = _detectors()
    for t in (1, 2):
        fired = _fired(d, leak_snap(t, det("node04"), det("node01")))
    assert "leak" not in fired  # one tray in each zone: each its own tray's leak
    assert sorted(t["tray"] for t, _ in fired["leak_tray"]) == ["node01", "node04"]
    d = _detectors()
    _fired(d, leak_snap(1, ROPE))
    (targets, detail), = _fired(d, leak_snap(2, ROPE))["leak"]
    assert targets == {"zone": "zone-a"} and detail["evidence"] == f"zone sensor wet: {ROPE}"


def test_trays_below_are_the_nearest_positions_under_the_tray_and_none_without_positions():
    units = {"c1": 35, "c2": 34, "s1": 25, "c11": 16}
    assert trays_below(units, "c1", 2) == ["c2", "s1"]
    assert trays_below(units, "c2", 2) == ["s1", "c11"]  # a switch tray below is watched (flagged) too
    assert trays_below(units, "c11", 3) == [] and trays_below({}, "c1", 2) == [] and trays_below(units, "c1", 0) == []


def test_the_dry_history_restarts_on_a_wet_or_unreadable_reading_and_a_vanished_detector_is_not_dry():
    h = DryHistory()
    h.observe("z", "a", "wet", 10.0)
    h.observe("z", "a", "dry", 11.0)
    h.observe("z", "a", "dry", 50.0)
    everything = lambda zone, sensor: True  # noqa: E731
    assert h.verdict(everything, [], 111.0, 100.0)[0] is True
    assert h.verdict(everything, [], 110.0, 100.0)[0] is False
    h.observe("z", "a", "unreadable", 0.0)
    h.observe("z", "a", "dry", 60.0)
    dry, (row,) = h.verdict(everything, [], 111.0, 100.0)
    assert not dry and row["dry_since"] == 60.0 and row["last_wet_at"] == 10.0
    h.vanished([])
    assert h.verdict(everything, [], 1000.0, 100.0)[1][0]["state"] == "unreadable"
    # a detector that fired the leak but was never read here is not dry either
    assert h.verdict(lambda z, s: False, [("z", "b")], 1000.0, 100.0) == (False, [
        {"zone": "z", "sensor": "b", "state": "unreadable", "last_wet_at": None, "dry_since": None,
         "dry_seconds": 0.0, "last_read_at": None}])


def test_a_bmc_stand_in_unreadable_before_its_first_walk_is_superseded_by_its_named_detectors():
    """A tray BMC that timed out before its first walk: the leak watch reported the service as a whole (sensor =
    the BMC) unreadable. Once its detectors are read by name, that stand-in no longer holds the tray's dry hold."""
    h = DryHistory()
    h.observe("z", "bmc-n1", "unreadable", 0.0)
    h.vanished([("z", "bmc-n1")])
    h.observe("z", "bmc-n1/Chassis/LD1", "dry", 10.0)
    h.vanished([("z", "bmc-n1/Chassis/LD1")])
    tray = lambda zone, sensor: sensor.split("/", 1)[0] == "bmc-n1"  # noqa: E731
    dry, rows = h.verdict(tray, [], 20.0, 5.0)
    assert dry and [r["sensor"] for r in rows] == ["bmc-n1/Chassis/LD1"]
    # a BMC whose detectors are still unnamed stays unreadable, as does a named one that vanished
    h.observe("z", "bmc-n2", "unreadable", 0.0)
    h.vanished([("z", "bmc-n1/Chassis/LD1")])
    assert h.rows[("z", "bmc-n2")].state == "unreadable"
    h.vanished([])
    assert h.rows[("z", "bmc-n1/Chassis/LD1")].state == "unreadable"


# -- the engine with real Slurm, on the test clock ---------------------------------------------------------


@pytest.fixture(scope="module")
def cluster():
    yield from running_cluster(list(NODES))


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _engine(tmp_path, clock: Clock, cluster) -> RemediationEngine:
    fast = {"fire_seconds": 0, "clear_seconds": 0}
    settings = RemediationSettings.model_validate({
        "detectors": {"leak": fast, "leak_tray": fast},
        "guardrails": {"cooldown_seconds": 0, "retry_backoff_seconds": 0.01, "max_drained_nodes": 4,
                       "max_drained_fraction": 1.0, "automatic": ["leak_watch_below"]},
        "leak_scope": {"watch_below_trays": 1, "dry_hold_seconds": HOLD},
        "resume_health_check": "none"})
    return RemediationEngine(settings, "enforce", identity(), _inventory(), tmp_path / "journal.db",
                             Executors(scheduler=SlurmScheduler(slurm_conf=cluster.conf)), clock=clock)


def _resume_all(cluster) -> None:
    for n in NODES:
        cluster.scontrol("update", f"NodeName={n}", "State=RESUME")


def _pending(eng: RemediationEngine, **match: str) -> list[dict]:
    return [p for p in eng.incidents_view()["pending_approvals"] if all(p.get(k) == v for k, v in match.items())]


def test_a_tray_leak_drains_the_tray_below_and_nothing_resumes_before_the_dry_hold_and_approval(cluster, tmp_path):
    """Leak on node01's own detectors (the rack leader's tray): node01 drained (its own), node02 below it
    drained as watched, node03 (two down) and node04 untouched, no zone valve step. After it dries: nothing
    before the hold; past it, approvals with the dry history; an approval while a detector read wet again within
    the hold resumes nothing; dry hold passed plus approval resumes."""
    async def main():
        clock = Clock(1000.0)
        eng = _engine(tmp_path, clock, cluster)
        await eng.start()
        for t in (1000.0, 1000.5):
            clock.t = t
            eng._evaluate(leak_snap(t, det("node01")))
        (inc,) = [i for i in eng.incidents.open_incidents() if i.detector == "leak_tray"]
        assert inc.targets == {"zone": "zone-a", "tray": "node01"} and inc.detail["watched"] == ["node02"]
        await await_for(lambda: node_states(cluster)["node02"] == "drained" and node_states(cluster)["node01"]
                        in ("drained", "draining"), 30, what="node01 and the tray below drained")
        assert {n: node_states(cluster)[n] for n in ("node03", "node04")} == {"node03": "idle", "node04": "idle"}
        watch = await await_for(lambda: [e for e in results(eng, kind="result", action="drain")
                                         if e.target == "node=node02"], 10, what="the watch drain journaled")
        assert [(e.result, e.playbook, e.incident_id) for e in watch] == [("done", "leak-tray", inc.id)]
        assert not [e for e in eng.journal.entries() if e.action == "cdu_write"]  # the zone valve: never asked
        assert not [i for i in eng.incidents.open_incidents() if i.detector == "leak"]

        # Dry from t=1001: the incident clears, its undo waits for the hold; nothing is pending, both drained.
        clock.t = 1001.0
        eng._evaluate(leak_snap(1001.0))
        await await_for(lambda: [e for e in eng.journal.entries() if e.kind == "dry_hold" and e.result == "waiting"],
                        10, what="undo waiting for the dry hold")
        clock.t = 1001.0 + HOLD - 1
        eng._evaluate(leak_snap(clock.t))
        assert eng.leak_scope_verdict(inc, "tray")[0] is False
        assert not _pending(eng) and node_states(cluster)["node02"] == "drained"

        # A detector that cannot be read during the hold is not dry: its hold starts again at its next dry reading.
        eng._evaluate(leak_snap(clock.t, unreadable=(det("node02"),)))
        clock.t = redry = 1001.0 + HOLD + 1
        eng._evaluate(leak_snap(clock.t))
        assert eng.leak_scope_verdict(inc, "tray")[0] is False and not _pending(eng)
        clock.t = redry + HOLD
        eng._evaluate(leak_snap(clock.t))
        pend = await await_for(lambda: _pending(eng, target="node=node02"), 10, what="resume of node02 pending")
        # The approval shows each detector's dry history: node01 last wet at 1000.5 and dry since 1001, node02
        # (never wet) dry since it could be read again.
        rows = {r["sensor"]: r for r in pend[0]["dry_history"]}
        assert set(rows) == {det("node01"), det("node02")} and pend[0]["dry_hold_passed"] is True
        assert (rows[det("node01")]["last_wet_at"], rows[det("node01")]["dry_since"]) == (1000.5, 1001.0)
        assert (rows[det("node02")]["last_wet_at"], rows[det("node02")]["dry_since"]) == (None, redry)
        assert rows[det("node02")]["dry_seconds"] == HOLD
        assert pend[0]["approval"] == "resume_after_leak" and pend[0]["phase"] == "undo"
        assert node_states(cluster)["node02"] == "drained"  # dry, but nobody approved: still drained

        # Wet again on one poll (not confirmed: no new incident) before the person approves: approval void.
        eng._evaluate(leak_snap(clock.t, det("node02")))
        eng._evaluate(leak_snap(clock.t + 0.5))
        assert eng.approve(pend[0]["id"], who="test") == [pend[0]["id"]]
        await await_for(lambda: [e for e in eng.journal.entries() if e.kind == "dry_hold" and e.result == "wet_again"
                                 and e.target == "node=node02"], 10, what="approval voided by the wet reading")
        assert node_states(cluster)["node02"] == "drained"

        # The hold passes again from the new dry reading; approval then resumes, and node01's too.
        clock.t += 0.5 + HOLD
        eng._evaluate(leak_snap(clock.t))
        for node in ("node02", "node01"):
            p = await await_for(lambda: _pending(eng, target=f"node={node}"), 10, what=f"{node} resume pending")
            eng.approve(p[0]["id"], who="test")
            await await_for(lambda: node_states(cluster)[node] == "idle", 30, what=f"{node} resumed")
        await eng.stop()
    try:
        asyncio.run(main())
    finally:
        _resume_all(cluster)


def test_a_second_wet_detector_in_the_zone_widens_the_leak_to_the_zone_valve(cluster, tmp_path):
    async def main():
        clock = Clock(2000.0)
        eng = _engine(tmp_path, clock, cluster)
        await eng.start()
        for t in (2000.0, 2000.5):
            eng._evaluate(leak_snap(t, det("node01"), det("node03")))
        (zone,) = [i for i in eng.incidents.open_incidents() if i.detector == "leak"]
        assert zone.detail["evidence"] == "2 trays wet at once: node01, node03"
        valve = await await_for(lambda: [e for e in eng.journal.entries() if e.action == "cdu_write"], 10,
                                what="the zone valve step")
        assert {(e.incident_id, e.playbook) for e in valve} == {(zone.id, "leak-response")}
        await await_for(lambda: all(i.state not in ("open", "mitigating") for i in eng.incidents.open_incidents()),
                        30, what="every playbook done")
        await eng.stop()
    try:
        asyncio.run(main())
    finally:
        _resume_all(cluster)


# -- the loop: a leak with coolant loss -------------------------------------------------------------------

PRESSURE = gauge("supernode_cdu_pressure_pascals", "Pa.", ["cdu", "loop", "point"])


def _loop_snap(t: float, flow: float, *wet: str, pressure: float | None = None):
    rows = list(leak_snap(t, *wet).readings)
    rows.append(reading("supernode_cdu_flow_cubic_meters_per_second", flow, ts=t, cdu="cdu1", loop="secondary"))
    if pressure is not None:
        rows.append(Reading(PRESSURE, pressure, {"cdu": "cdu1", "loop": "secondary", "point": "supply"}, timestamp=t))
    return snap(*rows, at=t)


def _loop_fired(d: Detectors, s) -> list[dict]:
    return [e.detail for e in d.evaluate(s) if e.detector == "leak_loop" and e.kind == "fire"]


def test_a_leak_widens_to_the_loop_only_with_flow_or_pressure_loss_named_in_the_evidence():
    fast = {"fire_seconds": 0, "clear_seconds": 0}
    d = Detectors(DetectorSettings(leak_loop=fast, nominal_flow_cubic_meters_per_second=0.01,
                                   leak_loop_pressure_floor_pascals=150_000.0), Context("node01", "r01"))
    assert _loop_fired(d, _loop_snap(1, 0.01, det("node02"), pressure=200_000)) == []  # a leak, the loop holds
    assert _loop_fired(d, _loop_snap(2, 0.005, pressure=200_000)) == []  # flow loss, nothing wet: not a leak
    (detail,) = _loop_fired(d, _loop_snap(3, 0.005, det("node02"), pressure=200_000))
    assert detail["flow_ratio"] == 0.5 and detail["sensors"] == [det("node02")] and "supply_pressure_pascals" not in detail
    d2 = Detectors(DetectorSettings(leak_loop=fast, nominal_flow_cubic_meters_per_second=0.01,
                                    leak_loop_pressure_floor_pascals=150_000.0), Context("node01", "r01"))
    (detail,) = _loop_fired(d2, _loop_snap(1, 0.01, ROPE, pressure=100_000))
    assert detail["supply_pressure_pascals"] == 100_000 and "flow_ratio" not in detail
    # No baseline yet (no nominal configured, first flow sample) and no pressure floor: no evidence, no widening.
    d3 = Detectors(DetectorSettings(leak_loop=fast), Context("node01", "r01"))
    assert _loop_fired(d3, _loop_snap(1, 0.001, ROPE)) == []


def test_the_status_view_names_the_active_leak_scopes_widest_first_with_the_trays_watched(tmp_path):
    from agent.status.view import incidents

    async def main():
        clock = Clock(3000.0)
        settings = RemediationSettings.model_validate({"detectors": {"leak": {"fire_seconds": 0}, "leak_tray": {
            "fire_seconds": 0}}, "leak_scope": {"watch_below_trays": 2}})
        eng = RemediationEngine(settings, "observe", identity(mode="observe"), _inventory(), tmp_path / "j.db",
                                Executors(), clock=clock)
        await eng.start()
        for t in (3000.0, 3000.5):
            eng._evaluate(leak_snap(t, det("node01")))
        (tray,) = incidents(eng, {}, clock.t)["leak_scope"]
        assert (tray["scope"], tray["targets"], tray["watched"]) == ("tray", {"zone": "zone-a", "tray": "node01"},
                                                                    ["node02", "node03"])
        for t in (3001.0, 3001.5):
            eng._evaluate(leak_snap(t, det("node01"), ROPE))
        zone, tray = incidents(eng, {}, clock.t)["leak_scope"]
        assert (zone["scope"], zone["targets"], zone["evidence"]) == ("zone", {"zone": "zone-a"},
                                                                     f"zone sensor wet: {ROPE}")
        assert tray["scope"] == "tray"
        await eng.stop()
    asyncio.run(main())


def test_a_leak_whose_scope_this_agent_reads_no_detector_of_always_waits_for_a_person(tmp_path):
    """A zone leak from the webhook, its zone's sensors read nowhere here: the hold cannot be judged, so the
    resume waits for a person even with resume_after_leak automatic, the pending step saying why."""
    from sim.scheduler import SimulatedScheduler

    async def main():
        settings = RemediationSettings.model_validate({
            "guardrails": {"cooldown_seconds": 0, "automatic": ["resume_after_leak", "cdu_write_valve"]},
            "resume_health_check": "none"})
        sched = SimulatedScheduler(list(NODES))
        eng = RemediationEngine(settings, "enforce", identity(), _inventory(), tmp_path / "j.db",
                                Executors(scheduler=sched))
        await eng.start()
        inc = eng.fire("leak", {"zone": "zone-a"}, "critical", source="alertmanager")
        await await_for(lambda: sched.nodes["node01"].drained, 10, what="node01 drained")
        eng.clear("leak", {"zone": "zone-a"})
        (p,) = await await_for(lambda: _pending(eng, target="node=node01"), 10, what="resume waits for a person")
        assert (p["approval"], p["dry_hold_passed"], p["dry_history"]) == ("always", False, [])
        assert "a person must confirm it is dry" in p["dry_hold_note"]
        assert sched.nodes["node01"].drained
        assert [e.result for e in results(eng, kind="dry_hold", incident_id=inc.id, target="node=node01")] == ["unjudged"]
        eng.approve(p["id"], who="test")
        await await_for(lambda: not sched.nodes["node01"].drained, 10, what="node01 resumed once approved")
        await eng.stop()
    asyncio.run(main())


@pytest.mark.parametrize("section, named", [
    ({"leak_scope": {"dry_hold": 5}}, "remediation.leak_scope.dry_hold"),
    ({"leak_scope": {"dry_hold_seconds": -1}}, "remediation.leak_scope.dry_hold_seconds"),
    ({"leak_scope": {"watch_below_trays": 99}}, "remediation.leak_scope.watch_below_trays"),
    ({"detectors": {"zone_leak_trays": 1}}, "remediation.detectors.zone_leak_trays"),
    ({"guardrails": {"automatic": ["leak_watch_everything"]}}, "remediation.guardrails.automatic"),
])
def test_a_bad_leak_scope_setting_is_refused_naming_its_field(section, named):
    from agent.config import ConfigError, parse_config

    with pytest.raises(ConfigError) as exc:
        parse_config({"agent": {"rack": "r01", "node": "node01"}, "remediation": section})
    assert named in str(exc.value), str(exc.value)


def test_the_trays_watched_below_a_leak_are_read_at_the_leak_interval_until_it_resolves(tmp_path):
    """The runtime's poll-now hook (what a first wet reading's confirmation uses) is asked for the watched trays'
    BMC sources, again and again while the tray leaks, and no more once its incident resolved."""
    async def main():
        fast = {"fire_seconds": 0, "clear_seconds": 0}
        settings = RemediationSettings.model_validate({
            "detectors": {"leak": fast, "leak_tray": fast},
            "leak_scope": {"watch_below_trays": 2, "watch_poll_seconds": 0.05}})
        eng = RemediationEngine(settings, "observe", identity(mode="observe"), _inventory(), tmp_path / "j.db",
                                Executors())
        asked: list[str] = []
        eng.repoll = asked.append
        await eng.start()
        for t in (1.0, 1.5):
            eng._evaluate(leak_snap(t, det("node01")))
        await await_for(lambda: asked.count("redfish/bmc-node03") >= 3, 10, what="the watched trays polled, often")
        assert set(asked) == {"redfish/bmc-node02", "redfish/bmc-node03"}  # the two below node01, no other
        eng._evaluate(leak_snap(2.0))  # dry: the incident resolves, the watch ends
        (inc,) = [i for i in eng.incidents.all() if i.detector == "leak_tray"]
        assert inc.state == "resolved"
        await await_for(lambda: not [t for t in eng.tasks if "watch_below" in repr(t.get_coro())], 10,
                        what="the watch ended")
        await eng.stop()
    asyncio.run(main())
