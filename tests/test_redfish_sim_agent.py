"""The real daemon against the simulator's Redfish tray BMCs and CDU: sessions, SSE, push, faults, tray leaks.

Each test runs the agent exactly as `supernode-sim demo` configures it (sim.demo.agent_config: the
tray BMC of its own node and the Redfish CDU, over HTTPS with the run's CA and a session login), plus
what the test changes.
"""

from __future__ import annotations

import json
import math
import re
import time

import pytest

from exporters.redfish.events import FORCED_BURST
from sim.demo import agent_config
from tests.agentproc import incidents, metric, running_agent
from tests.helpers import free_port, wait_for
from sim.harness import sim_rack
from tests.slurm import running_cluster

TOKEN = "token-for-tests"
BMC = "bmc-node01"


@pytest.fixture(scope="module")
def cluster():
    yield from running_cluster(["node01", "node02"])


def _config(rack, tmp_path, mode: str = "enforce", slurm_conf=None, **redfish) -> dict:
    for name in ("admin.token", "webhook.token"):
        (tmp_path / name).write_text(TOKEN + "\n")
    cfg = agent_config(rack.sim, "node01", free_port(), tmp_path, mode=mode, slurm_conf=slurm_conf)
    cfg["sources"]["redfish"].update(redfish)
    # Quick clears, so the undo is part of the story.
    cfg["remediation"]["detectors"] = {"leak": {"fire_seconds": 0, "clear_seconds": 0.5},
                                       "leak_tray": {"fire_seconds": 0, "clear_seconds": 0.5},
                                       "leak_sensor_fault": {"fire_seconds": 0, "clear_seconds": 0.5}}
    return cfg


def _metric(agent, name: str, **labels: str) -> float | None:
    return metric(agent, name, **labels)


def _value(agent, name: str, **labels: str) -> float:
    """The series' value, waiting out a moment it is absent (a poll that failed on a loaded host drops it)."""
    def present() -> tuple[float] | None:
        value = _metric(agent, name, **labels)
        return None if value is None else (value,)
    return wait_for(present, 20, what=f"{name} {labels}")[0]


def _incidents(agent) -> dict:
    return incidents(agent, TOKEN)


def _open(agent, detector: str) -> list[dict]:
    return [i for i in _incidents(agent)["open"] if i["detector"] == detector]


def _journal(agent) -> list[dict]:
    status, body = agent.get("/api/v1/journal", token=TOKEN)
    assert status == 200
    return json.loads(body)["entries"]


def _dry(rack, node: str) -> None:
    """The tray's detectors read dry again (the simulator raises their events at its next tick)."""
    model = rack.sim.model
    with model.lock:
        model.nodes[node].tray_leaks.clear()


def _ready(agent) -> None:
    wait_for(lambda: agent.get("/readyz")[0] == 200, 30, what="every source polled once")
    wait_for(lambda: _metric(agent, "supernode_source_up", source="redfish", device=BMC) == 1.0, 20,
             what="the tray BMC polled")


def _stream_up(agent, transport: str = "sse", timeout: float = 20, what: str = "event stream up") -> None:
    wait_for(lambda: _metric(agent, "supernode_redfish_event_stream_up", bmc=BMC, transport=transport) == 1.0,
             timeout, what=what)


def _resume(cluster, *nodes: str) -> None:
    for node in nodes:
        cluster.scontrol("update", f"NodeName={node}", "State=RESUME")
    wait_for(lambda: all(cluster.states().get(n) == "idle" for n in nodes), 30, what=f"{nodes} idle")


def _rows(agent, **match: str) -> list[dict]:
    return [r for r in _journal(agent) if all(r.get(k) == v for k, v in match.items())]


def _approve_pending(agent, **match: str) -> dict:
    """Wait for the one pending step matching `match`, approve it through the API; returns it as listed."""
    (p,) = wait_for(lambda: [p for p in _incidents(agent)["pending_approvals"]
                             if all(p.get(k) == v for k, v in match.items())], 30, what=f"pending {match}")
    assert agent.request("POST", f"/api/v1/incidents/{p['id']}/approve", token=TOKEN)[0] == 200
    return p


def test_a_tray_leak_contains_its_tray_watches_the_tray_below_and_undoes_nothing_before_dry_and_approved(
        cluster, tmp_path):
    """Issue 35's leak story on the demo's rack (node01 at U35 above node02 at U34, rack file from the GB200
    NVL72 elevation): node01's own detector wet -> a tray-scoped leak: node01 drained and capped, its power-off
    waits for a person, node02 below it drained as watched (not capped), the zone valve never asked. Dry again:
    nothing resumes or powers on until every detector of the scope read dry for the hold, then each waits for a
    person, shown the dry history."""
    _resume(cluster, "node01", "node02")
    with sim_rack(tmp_path) as rack, running_agent(_config(rack, tmp_path, slurm_conf=cluster.conf,
                                                           watch_rack_trays=True), tmp_path) as agent:
        _ready(agent)
        rack.inject("tray-leak", node="node01", detector="0")
        gpus = rack.sim.model.nodes["node01"].gpus
        wait_for(lambda: cluster.states().get("node01") == "drained", 20, what="node01 drained in Slurm")
        wait_for(lambda: all(g.power_limit_mw == g.min_limit_mw for g in gpus), 20, what="node01's GPUs capped")
        (leak,) = _open(agent, "leak_tray")
        assert leak["targets"] == {"zone": "zone-a", "tray": "node01"}
        assert leak["detail"]["watched"] == ["node02"]
        # The tray below is watched: drained by the leak-tray playbook, its GPUs left as they are.
        wait_for(lambda: cluster.states().get("node02") == "drained", 20, what="node02 (below) drained")
        (watch,) = wait_for(lambda: _rows(agent, kind="result", action="drain", target="node=node02"), 20,
                            what="the watch drain journaled")
        assert (watch["result"], watch["playbook"], watch["incident_id"]) == ("done", "leak-tray", leak["id"])
        assert all(g.power_limit_mw == g.default_limit_mw for g in rack.sim.model.nodes["node02"].gpus)
        # One tray's word is not the zone's: no zone incident, no valve step, the valve open.
        assert not _open(agent, "leak") and not _rows(agent, action="cdu_write")
        assert rack.sim.model.coolant.valve_open["zone-a"] is True
        # The tray power-off waits for a person; the tray is still on meanwhile.
        pending = wait_for(lambda: [p for p in _incidents(agent)["pending_approvals"] if p["action"] == "tray_power"],
                           20, what="tray power-off pending approval")
        assert pending[0]["target"] == f"bmc={BMC},node=node01"
        assert rack.sim.model.nodes["node01"].host_on is True
        assert agent.request("POST", f"/api/v1/incidents/{pending[0]['id']}/approve", token=TOKEN)[0] == 200
        wait_for(lambda: rack.sim.model.nodes["node01"].host_on is False, 20, what="tray powered off")
        assert [a["reset_type"] for a in rack.sim.model.nodes["node01"].power_actions] == ["ForceOff"]
        wait_for(lambda: any(r["kind"] == "result" and r["action"] == "tray_power" and r["result"] == "done"
                             for r in _journal(agent)), 20, what="tray power-off journaled done")
        assert any(r["kind"] == "intent" and r["action"] == "tray_power" for r in _journal(agent))

        # The leak dries (the detector only: `sim clear` would also power the tray back on). The incident
        # resolves, and its undo first waits for the dry hold (5 s in the demo), then for a person.
        _dry(rack, "node01")
        wait_for(lambda: not _open(agent, "leak_tray"), 20, what="leak incident resolved")
        # Undo in reverse step order: the tray below first. Its resume waited for the hold before it was asked.
        resume = _approve_pending(agent, action="drain", phase="undo", target="node=node02")
        waited = [r["result"] for r in _rows(agent, kind="dry_hold", target="node=node02")]
        assert waited == ["waiting", "dry"]
        history = {r["sensor"]: r for r in resume["dry_history"]}
        sensor = "bmc-node01/Chassis_0/Chassis_0_LeakDetector_0_ColdPlate"
        assert resume["dry_hold_passed"] is True and history[sensor]["last_wet_at"] is not None
        assert all(r["state"] == "dry" and r["dry_seconds"] >= 5.0 for r in history.values())
        # the leader reads every tray (watch_rack_trays): the scope is the tray's detectors and the one below's
        assert {s.split("/")[0] for s in history} == {"bmc-node01", "bmc-node02"}
        wait_for(lambda: cluster.states().get("node02") == "idle", 30, what="node02 resumed after approval")
        # Dry and past the hold, not approved: the tray stays off, node01 stays drained, its GPUs capped.
        _approve_pending(agent, action="tray_power", phase="undo")
        assert cluster.states().get("node01") == "drained" and all(g.power_limit_mw == g.min_limit_mw for g in gpus)
        wait_for(lambda: rack.sim.model.nodes["node01"].host_on is True, 20, what="tray powered on after approval")
        _approve_pending(agent, action="drain", phase="undo", target="node=node01")
        wait_for(lambda: cluster.states().get("node01") == "idle", 30, what="node01 resumed after approval")
        wait_for(lambda: all(g.power_limit_mw == g.default_limit_mw for g in gpus), 30, what="node01's caps lifted")
    _resume(cluster, "node01", "node02")


def test_a_zone_sensor_wet_besides_a_tray_widens_the_leak_to_the_zone_valve(cluster, tmp_path):
    """The zone's own leak rope wet as well as node01's tray: the evidence widens the leak to zone-a, whose
    valve close waits for a person (cdu_write_valve), the incident naming the evidence."""
    _resume(cluster, "node01", "node02")
    with sim_rack(tmp_path) as rack, running_agent(_config(rack, tmp_path, slurm_conf=cluster.conf), tmp_path) as agent:
        _ready(agent)
        rack.inject("tray-leak", node="node01", detector="0")
        wait_for(lambda: _open(agent, "leak_tray"), 20, what="the tray's leak")
        assert not _open(agent, "leak")
        rack.inject("leak", zone="zone-a")
        (zone,) = wait_for(lambda: _open(agent, "leak"), 20, what="the zone's leak")
        assert zone["targets"] == {"zone": "zone-a"} and zone["detail"]["evidence"].startswith("zone sensor wet: ")
        valve = _approve_pending(agent, action="cdu_write", phase="apply", incident_id=zone["id"])
        assert valve["approval"] == "cdu_write_valve"
        wait_for(lambda: rack.sim.model.coolant.valve_open["zone-a"] is False, 20, what="zone valve closed")
    _resume(cluster, "node01", "node02")


def test_a_switch_tray_leak_is_a_leak_of_its_zone_whose_node_is_drained_and_capped(cluster, tmp_path):
    """Issue 34: an NVLink switch tray's BMC (a shared device, read like the CDU) sees water; its zone (zone-a, as
    inventory.switch_trays says) leaks: node01 is drained in Slurm and its GPUs capped, node02 (zone-b) is not,
    and no tray is powered off (a switch tray has no node, and node01's own tray is dry)."""
    cluster.scontrol("update", "NodeName=node01", "State=RESUME")
    wait_for(lambda: cluster.states().get("node01") == "idle", 30, what="node01 idle at the start")
    with sim_rack(tmp_path) as rack, running_agent(_config(rack, tmp_path, slurm_conf=cluster.conf), tmp_path) as agent:
        _ready(agent)
        wait_for(lambda: _metric(agent, "supernode_source_up", source="redfish", device="bmc-switch01") == 1.0, 20,
                 what="the switch tray BMC polled")
        assert _open(agent, "leak") == []
        rack.inject("switch-tray-leak", tray="switch01", detector="1")
        gpus = rack.sim.model.nodes["node01"].gpus
        wait_for(lambda: cluster.states().get("node01") == "drained", 20, what="node01 drained in Slurm")
        wait_for(lambda: all(g.power_limit_mw == g.min_limit_mw for g in gpus), 20, what="node01's GPUs capped")
        leak = _open(agent, "leak")[0]
        assert leak["targets"] == {"zone": "zone-a"}
        assert _value(agent, "supernode_leak_detected", zone="zone-a",
                      sensor="bmc-switch01/Chassis_0/Chassis_0_LeakDetector_Manifold") == 1.0
        assert cluster.states().get("node02") == "idle"
        assert not [p for p in _incidents(agent)["pending_approvals"] if p["action"] == "tray_power"]
        assert rack.sim.model.nodes["node01"].power_actions == []
    cluster.scontrol("update", "NodeName=node01", "State=RESUME")


def test_an_event_brings_a_tray_leak_to_the_detector_long_before_any_poll(tmp_path):
    """Polls 600 s apart: an incident within seconds can only come from the SSE event and its re-read."""
    with sim_rack(tmp_path) as rack, \
            running_agent(_config(rack, tmp_path, mode="observe", interval=600, timeout=2.0), tmp_path) as agent:
        _ready(agent)
        _stream_up(agent)
        before = _value(agent, "supernode_redfish_requests_total", bmc=BMC)
        rack.inject("tray-leak", node="node01", detector="1")
        wait_for(lambda: _open(agent, "leak_tray"), 30, interval=0.05, what="leak incident from the event")
        assert _value(agent, "supernode_redfish_events_total", bmc=BMC, triggered="true") >= 1
        assert _value(agent, "supernode_redfish_requests_total", bmc=BMC) > before  # it read again
        # The stream, the walk, the polls and the re-reads all shared the service's bound: 2 connections.
        assert 1 <= rack.sim.devices[BMC].peak_connections <= 2


def test_until_its_events_are_confirmed_a_tray_bmc_is_polled_at_the_leak_interval(tmp_path):
    """The timer is 600 s apart, and the BMC's EventService holds its SSE stream back (as one still starting):
    every read of its detectors after the first comes from the leak-interval polling, so a tray leak in the
    first seconds is read by polling; once the stream opens, the source says it is back on its timer and the
    next leak arrives by the event (issue 38)."""
    with sim_rack(tmp_path) as rack:
        rack.inject("bmc-events-held", node="node01")
        with running_agent(_config(rack, tmp_path, mode="observe", interval=600, timeout=2.0), tmp_path) as agent:
            _ready(agent)
            assert _value(agent, "supernode_redfish_unconfirmed_polling", bmc=BMC) == 1.0
            first = _detector_reads(rack)
            wait_for(lambda: _detector_reads(rack) >= first + 4, 30, what="four more polls while the events are held")
            rack.inject("tray-leak", node="node01", detector="1")
            wait_for(lambda: _open(agent, "leak_tray"), 30, interval=0.05, what="the leak read by the fast polling")
            assert not _metric(agent, "supernode_redfish_events_total", bmc=BMC, triggered="true")  # no event yet
            rack.inject("bmc-events-held", node="node01", held=0)
            _stream_up(agent, timeout=90, what="the stream opened once released")
            wait_for(lambda: _metric(agent, "supernode_redfish_unconfirmed_polling", bmc=BMC) == 0.0, 20,
                     what="back on the 600 s timer")
            rack.inject("tray-leak", node="node01", detector="2")
            wait_for(lambda: (_metric(agent, "supernode_redfish_events_total", bmc=BMC, triggered="true") or 0) >= 1,
                     30, what="the next leak's event")


def _detector_reads(rack) -> int:
    """How often the simulated tray BMC's busiest leak detector was read (every poll reads each once)."""
    return max((n for p, n in rack.sim.devices[BMC].reads.items() if "/LeakDetectors/" in p), default=0)


def test_a_healthy_stream_slows_the_polls_and_once_it_drops_polling_carries_the_leak_until_it_is_back(tmp_path):
    """The timer ticks every second; while the stream is up its polls are left out (one every confirmed_interval,
    600 s here) and the source is vouched fresh instead; the moment the stream drops, the timer's polls run again
    (unconfirmed_interval 0: the timer alone, so it is the timer's polls that come back) and carry the leak."""
    with sim_rack(tmp_path) as rack, running_agent(
            _config(rack, tmp_path, mode="observe", interval=1.0, timeout=1.0, event_retry_seconds=12,
                    confirmed_interval=600, unconfirmed_interval=0), tmp_path) as agent:
        _ready(agent)
        _stream_up(agent)
        vouched = lambda: _metric(agent, "supernode_source_last_success_timestamp_seconds",  # noqa: E731
                                  source="redfish", device=BMC) or 0.0
        wait_for(lambda: _detector_reads(rack) and vouched(), 20, what="polled once since the stream opened")
        reads, since = _detector_reads(rack), vouched()
        wait_for(lambda: vouched() >= since + 3, 20, what="three timer ticks vouching for the source")
        assert _detector_reads(rack) == reads  # ... and none of them polled
        assert _metric(agent, "supernode_source_up", source="redfish", device=BMC) == 1.0
        logins = _value(agent, "supernode_redfish_logins_total", bmc=BMC)
        rack.inject("bmc-sessions-expire", node="node01")  # the BMC drops its sessions: the stream ends
        wait_for(lambda: _metric(agent, "supernode_redfish_event_stream_up", bmc=BMC, transport="sse") == 0.0, 20,
                 what="stream seen down")
        reads = _detector_reads(rack)
        wait_for(lambda: _detector_reads(rack) >= reads + 3, 20, what="the timer's polls back while the stream is down")
        rack.inject("tray-leak", node="node01", detector="2")
        wait_for(lambda: _open(agent, "leak_tray"), 20, what="leak incident from polling alone")
        assert _value(agent, "supernode_redfish_event_stream_up", bmc=BMC, transport="sse") == 0.0  # still down
        assert _value(agent, "supernode_redfish_logins_total", bmc=BMC) > logins  # polls logged in again
        wait_for(lambda: _metric(agent, "supernode_source_up", source="redfish", device=BMC) == 1.0, 20,
                 what="polling up while the stream is down")
        # 12 s later the stream is opened again (re-subscribed) by itself.
        wait_for(lambda: _metric(agent, "supernode_redfish_event_stream_up", bmc=BMC, transport="sse") == 1.0, 60,
                 what="stream re-opened")


@pytest.mark.parametrize("fault, params, kind", [
    ("bmc-offline", {}, "connection"),
    ("bmc-slow", {"ms": 3000}, "timeout"),
    ("bmc-auth-fail", {}, "auth"),
])
def test_a_failing_bmc_is_a_down_source_with_its_kind_and_an_unknown_zone(tmp_path, fault, params, kind):
    with sim_rack(tmp_path) as rack, running_agent(
            _config(rack, tmp_path, mode="observe", interval=0.5, timeout=1.0, request_timeout=0.8,
                    login_retry_seconds=0.5), tmp_path) as agent:
        _ready(agent)
        sensor = "bmc-node01/Chassis_0/Chassis_0_LeakDetector_0_ColdPlate"
        wait_for(lambda: _metric(agent, "supernode_leak_sensor_fault", fault="source_down", sensor=sensor,
                                 zone="zone-a") == 0.0, 20, what="the leak watch covering the tray")
        rack.inject(fault, node="node01", **params)
        wait_for(lambda: _metric(agent, "supernode_source_up", source="redfish", device=BMC) == 0.0, 20,
                 what="tray BMC source down")
        wait_for(lambda: (_metric(agent, "supernode_source_errors_total", source="redfish", device=BMC, kind=kind)
                          or 0) >= 1, 20, what=f"errors counted as {kind}")
        # Its detectors cannot be read: the zone is unknown (a critical notify-only incident), never a leak.
        wait_for(lambda: _metric(agent, "supernode_leak_sensor_fault", fault="source_down", sensor=sensor,
                                 zone="zone-a") == 1.0, 20, what="tray's detectors unknown")
        wait_for(lambda: _open(agent, "leak_source_down"), 20, what="leak_source_down incident")
        assert not _open(agent, "leak") + _open(agent, "leak_tray")
        assert _metric(agent, "supernode_source_up", source="redfish", device="rfcdu1") == 1.0  # the CDU is fine
        rack.clear()
        wait_for(lambda: _metric(agent, "supernode_source_up", source="redfish", device=BMC) == 1.0, 30,
                 what="tray BMC back by itself")


def test_a_tray_detector_fault_raises_its_own_incident_and_never_acts(tmp_path):
    # confirmed_interval 0: the 0.5 s timer polls with the stream up too, so "several polls later" comes soon
    with sim_rack(tmp_path) as rack, running_agent(_config(rack, tmp_path, interval=0.5, timeout=1.0,
                                                           confirmed_interval=0), tmp_path) as agent:
        _ready(agent)
        rack.inject("tray-leak-sensor-fault", node="node01", detector="3")
        wait_for(lambda: _open(agent, "leak_sensor_fault"), 20, what="leak_sensor_fault incident")
        sensor = "bmc-node01/Chassis_0/Chassis_0_LeakDetector_1_Manifold"
        assert _metric(agent, "supernode_leak_sensor_fault", fault="detector", sensor=sensor, zone="zone-a") == 1.0
        assert _metric(agent, "supernode_leak_detected", sensor=sensor, zone="zone-a") is None  # not a value
        assert re.search(r'^supernode_reading_quality\{device="bmc-node01",quality="sensor_fault",'
                         r'reading="leak_detected,sensor=bmc-node01/Chassis_0/Chassis_0_LeakDetector_1_Manifold,'
                         r'zone=zone-a",source="redfish"\} 1', agent.metrics(), re.M)
        # Several polls later: no leak incident, no action intent, the node's GPUs untouched.
        polls = _value(agent, "supernode_redfish_requests_total", bmc=BMC)
        wait_for(lambda: (_metric(agent, "supernode_redfish_requests_total", bmc=BMC) or 0) >= polls + 20, 20,
                 what="more polls")
        assert not _open(agent, "leak") + _open(agent, "leak_tray")
        assert not [r for r in _journal(agent) if r["kind"] == "intent"]
        gpus = rack.sim.model.nodes["node01"].gpus
        assert all(g.power_limit_mw == g.default_limit_mw for g in gpus)


def test_a_push_subscription_delivers_to_the_agents_own_endpoint_and_triggers_the_read(tmp_path):
    """events: push (as where the BMC has no SSE): the BMC POSTs to the agent, which re-reads at once."""
    with sim_rack(tmp_path) as rack:
        cfg = _config(rack, tmp_path, mode="observe", interval=600, timeout=2.0, events="push")
        (tmp_path / "rf-events.token").write_text("push-token-for-tests\n")
        cfg["secrets"]["rf_events"] = {"file": str(tmp_path / "rf-events.token")}
        cfg["sources"]["redfish"].update(event_destination=f"http://127.0.0.1:{cfg['listen']['port']}",
                                         event_token_secret="rf_events")
        events = rack.sim.devices[BMC].events
        with running_agent(cfg, tmp_path) as agent:
            _ready(agent)
            wait_for(lambda: _metric(agent, "supernode_redfish_event_stream_up", bmc=BMC, transport="push") == 1.0,
                     20, what="push subscription made")
            subs = list(events.subscriptions.values())
            assert [s.destination for s in subs] == [f"{agent.url}/api/v1/redfish/events/{BMC}"]
            assert not events.streams  # no SSE stream besides
            rack.inject("tray-leak", node="node01", detector="0")
            wait_for(lambda: _open(agent, "leak_tray"), 30, interval=0.05, what="leak incident from the pushed event")
            assert subs[0].delivered >= 1
            record = {"Events": [{"MessageId": "Environmental.1.1.LeakDetectedCritical"}]}
            assert agent.request("POST", f"/api/v1/redfish/events/{BMC}", record, token="wrong")[0] == 401
            assert agent.request("POST", f"/api/v1/redfish/events/{BMC}", record)[0] == 401
            assert agent.request("POST", "/api/v1/redfish/events/bmc-node09", record,
                                 token="push-token-for-tests")[0] == 404
            assert agent.request("POST", f"/api/v1/redfish/events/{BMC}", raw=b"[1, 2",
                                 token="push-token-for-tests")[0] == 400
        wait_for(lambda: not events.subscriptions, 10, what="subscription removed when the agent stopped")


def test_more_than_n_leaking_trays_ask_the_rack_leader_to_isolate_the_rack(tmp_path):
    """The leader (node01) watches every tray; two of them leak, more than rack_tray_leaks=1: rack isolation."""
    with sim_rack(tmp_path) as rack:
        cfg = _config(rack, tmp_path, interval=0.5, timeout=1.0, watch_rack_trays=True)
        cfg["remediation"]["detectors"]["rack_tray_leaks"] = 1
        for zone in cfg["inventory"]["leak_zones"]:  # the rack valve is the only valve of this story
            zone.pop("valve", None)
        cfg["inventory"]["rack_valve"] = "cdu1:zone_valve_2"
        with running_agent(cfg, tmp_path) as agent:
            _ready(agent)
            wait_for(lambda: _metric(agent, "supernode_source_up", source="redfish", device="bmc-node02") == 1.0,
                     20, what="the leader reading node02's tray too")
            rack.inject("tray-leak", node="node01", detector="0")
            (own,) = wait_for(lambda: _open(agent, "leak_tray"), 20, what="node01's tray leak")
            assert not _open(agent, "tray_leak_rack")  # one tray: the tray's own response only
            rack.inject("tray-leak", node="node02", detector="1")
            inc = wait_for(lambda: _open(agent, "tray_leak_rack"), 20, what="rack incident")[0]
            assert inc["targets"] == {"rack": "r01"}
            assert sorted(inc["detail"]["trays"]) == ["bmc-node01", "bmc-node02"]
            pending = wait_for(lambda: [p for p in _incidents(agent)["pending_approvals"]
                                        if p["incident_id"] == inc["id"]], 20, what="rack valve close pending")
            assert pending[0]["action"] == "cdu_write" and pending[0]["target"] == "cdu=cdu1,point=zone_valve_2"
            assert rack.sim.model.coolant.valve_open["zone-b"] is True  # nothing closes without a person
            assert agent.request("POST", f"/api/v1/incidents/{inc['id']}/approve", token=TOKEN)[0] == 200
            wait_for(lambda: rack.sim.model.coolant.valve_open["zone-b"] is False, 20, what="rack valve closed")
            # The leader drains and powers off only its own node: node02's tray leak is node02's agent's. It
            # drains node02 only as the tray below node01's leak (watched, from node01's own incident).
            rows = [r for r in _journal(agent) if r["kind"] == "intent" and r["action"] in ("drain", "tray_power")]
            assert {r["target"] for r in rows} <= {"node=node01", f"bmc={BMC},node=node01", "node=node02"}
            assert {r["incident_id"] for r in rows if r["target"] == "node=node02"} <= {own["id"]}


def test_probe_logs_in_with_a_session_and_says_when_the_login_is_refused(tmp_path):
    import subprocess
    import sys

    from tests.helpers import REPO

    def probe(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "agent.cli", "probe", "redfish", *args], cwd=REPO,
                              capture_output=True, text=True, timeout=60)

    with sim_rack(tmp_path) as rack:
        rf = rack.sim.redfish()
        url = rf["bmcs"]["node01"]
        ok = probe("--target", url, "--ca-file", rf["ca_file"], "--user", rf["username"],
                   "--password-file", rf["password_file"], "--name", BMC)
        assert ok.returncode == 0, ok.stderr
        assert re.search(r'^supernode_leak_detector_state\{bmc="bmc-node01",chassis="Chassis_0",'
                         r'detector="Chassis_0_LeakDetector_0_ColdPlate",type="Moisture"\} 0.0$', ok.stdout, re.M)
        assert 'supernode_redfish_logins_total{bmc="bmc-node01"} 1.0' in ok.stdout  # a session, not Basic
        wrong = tmp_path / "wrong.pw"
        wrong.write_text("not-the-password\n")
        refused = probe("--target", url, "--ca-file", rf["ca_file"], "--user", rf["username"],
                        "--password-file", str(wrong))
        assert refused.returncode != 0 and "auth:" in refused.stderr and "--user" in refused.stderr, refused.stderr
        anonymous = probe("--target", url, "--ca-file", rf["ca_file"])
        assert anonymous.returncode != 0 and "no credentials configured" in anonymous.stderr, anonymous.stderr


def _scrape_with(agent, name: str, **labels: str) -> str | None:
    """The whole /metrics text once it carries the series (so other series can be read from the same scrape)."""
    text = agent.metrics()
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return text if re.search(rf"^{name}\{{{re.escape(want)}\}} [1-9]", text, re.M) else None


def test_a_malformed_event_stream_is_counted_dropped_reopened_and_the_next_leak_still_arrives(tmp_path):
    """The BMC writes a 2 MiB line, data that is no JSON, bytes that are no UTF-8 on its SSE stream (a 48 MiB line
    once made aiohttp raise LineTooLong, which ended the watch silently with the stream still counted up). Each
    time: counted by reason, the stream down in the poll that follows at once, reopened with backoff. Polls are
    600 s apart, so the last leak can only come through the reopened stream."""
    with sim_rack(tmp_path) as rack, running_agent(
            _config(rack, tmp_path, mode="observe", interval=600, timeout=2.0, event_retry_seconds=5), tmp_path) \
            as agent:
        _ready(agent)
        _stream_up(agent)
        bus = rack.sim.devices[BMC].events
        for kind, reason in (("long-line", "too_long"), ("not-json", "not_json"), ("not-utf8", "not_utf8")):
            opened = bus.streams_opened
            assert "1 SSE stream" in rack.inject("bmc-event-garbage", node="node01", frame=kind)
            text = wait_for(lambda: _scrape_with(agent, "supernode_redfish_event_stream_errors_total", bmc=BMC,
                                                 reason=reason), 30, interval=0.05, what=f"{kind} counted as {reason}")
            # The poll the failure forced at once says the stream is down (it is reopened 5 s later).
            assert re.search(rf'^supernode_redfish_event_stream_up\{{bmc="{BMC}",transport="sse"\}} 0', text, re.M)
            wait_for(lambda: bus.streams_opened > opened, 30, what=f"stream reopened after {kind}")
            wait_for(lambda: _metric(agent, "supernode_redfish_event_stream_up", bmc=BMC, transport="sse") == 1.0,
                     30, what=f"stream up again after {kind}")
        rack.inject("tray-leak", node="node01", detector="1")
        wait_for(lambda: _open(agent, "leak_tray"), 30, interval=0.05, what="leak incident through the reopened stream")


def test_each_bmc_pushes_with_its_own_token_and_a_burst_of_pushes_is_a_few_polls(tmp_path):
    """events: push with a token per service: BMC A's token is refused on B's path; 100 pushes in a burst (each
    once forced a poll: 100 pushes, 148 detector reads) are a bounded number of detector reads, and a leak pushed
    right after the burst is still read."""
    min_poll = 10.0
    with sim_rack(tmp_path) as rack:
        cfg = _config(rack, tmp_path, mode="observe", interval=600, timeout=2.0, events="push",
                      event_min_poll_seconds=min_poll)
        tokens = {BMC: "push-token-of-the-tray", "rfcdu1": "push-token-of-the-cdu"}
        for ep in cfg["inventory"]["redfish"]:
            if ep["name"] in tokens:
                (tmp_path / f"{ep['name']}.push").write_text(tokens[ep["name"]] + "\n")
                cfg["secrets"][f"push_{ep['name']}"] = {"file": str(tmp_path / f"{ep['name']}.push")}
                ep["event_token_secret"] = f"push_{ep['name']}"
        cfg["sources"]["redfish"].update(event_destination=f"http://127.0.0.1:{cfg['listen']['port']}")
        device = rack.sim.devices[BMC]
        with running_agent(cfg, tmp_path) as agent:
            _ready(agent)
            wait_for(lambda: _metric(agent, "supernode_redfish_event_stream_up", bmc=BMC, transport="push") == 1.0,
                     20, what="push subscription made")
            sub = next(iter(device.events.subscriptions.values()))
            assert sub.headers == {"Authorization": f"Bearer {tokens[BMC]}"}  # its own token, not a shared one
            record = {"Events": [{"MessageId": "Environmental.1.1.LeakDetectedCritical"}]}
            path = "/api/v1/redfish/events/{}"
            assert agent.request("POST", path.format("rfcdu1"), record, token=tokens[BMC])[0] == 401
            assert agent.request("POST", path.format(BMC), record, token=tokens["rfcdu1"])[0] == 401

            before = _detector_reads(rack)
            started = time.monotonic()
            for _ in range(100):
                assert agent.request("POST", path.format(BMC), record, token=tokens[BMC])[0] == 204
            windows = math.ceil((time.monotonic() - started) / min_poll)  # coalescing windows the burst spanned
            # At most FORCED_BURST forced polls a window, and one after the window's last push; nothing else polls
            # (600 s).
            bound = (FORCED_BURST + 1) * windows + 1
            wait_for(lambda: (_metric(agent, "supernode_redfish_event_polls_coalesced_total", bmc=BMC) or 0)
                     >= 100 - bound, 30, what="pushes coalesced")
            # A leak right after the burst: its push lands inside the window, and the poll at the window's end
            # reads it (the last event is never dropped).
            rack.inject("tray-leak", node="node01", detector="0")
            wait_for(lambda: _open(agent, "leak_tray"), 3 * min_poll, interval=0.05, what="leak incident from the push")
            assert _detector_reads(rack) - before <= bound + 1, (_detector_reads(rack) - before, bound)


def test_a_few_events_each_poll_at_once_and_a_flood_shares_one_poll_a_window():
    """The limit on forced polls, on a deterministic clock: the first FORCED_BURST events of a window each start a
    poll at once (a leak's event right after a warning or a clear is never held back: the push path is the fastest
    leak path, p99 84 ms); past that, the window's later events share one poll at its end."""
    import asyncio

    from exporters.redfish.events import EventWatch
    from exporters.redfish.profile import load_profile

    now = [100.0]
    fired: list[float] = []

    async def run() -> tuple[list[float], int]:
        watch = EventWatch(None, load_profile("dmtf"), lambda: fired.append(now[0]),  # type: ignore[arg-type]
                           min_poll_s=1.0, clock=lambda: now[0])
        for _ in range(FORCED_BURST):
            watch.trigger()
            now[0] += 0.1
        at_once = list(fired)
        for _ in range(50):
            watch.trigger()
        assert len(fired) == FORCED_BURST  # the flood waits for the window's end
        await asyncio.sleep(1.1)  # the loop's own timer ends the window (the deferred poll is a loop call_later)
        return at_once, watch.coalesced
    at_once, coalesced = asyncio.run(run())
    assert at_once == pytest.approx([100.0, 100.1, 100.2][:FORCED_BURST])
    assert len(fired) == FORCED_BURST + 1 and coalesced == 50
