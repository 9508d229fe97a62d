"""Rack coordination against a real 3-member etcd cluster: 3 real agent processes on the simulated rack.

One etcd cluster, one simulated rack and three agents for the module (2-core machine); each test
leaves the rack as it found it (agents running, members up, faults cleared). Every wait is on a
condition with a generous deadline; nothing is timed. The agents read the simulator's Redfish services
as the demo configures them (each its own tray BMC, the Redfish CDU shared) and the leader reads every
tray (`watch_rack_trays`).
"""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from tests.agentproc import AgentProcess
from tests.coordination_rack import (NODES, SHARED, TOKEN, TTL, EtcdRack, alive, approve, etcd_rack, incidents,
                                     is_leader, is_up, leaders, metric, polls, restart, results)
from tests.helpers import wait_for

ZONE = {"node01": "zone-a", "node02": "zone-b", "node03": "zone-c"}


class Rack(EtcdRack):
    def clients(self, name: str, within: float) -> int:
        dev = self.device(name)
        return (dev.clients if hasattr(dev, "clients") else dev.agent.clients)(within)

    def requests(self, name: str) -> int:
        dev = self.device(name)
        for attr in ("requests", "requests_total"):  # Modbus, Redfish
            if hasattr(dev, attr):
                return getattr(dev, attr)
        return dev.agent.requests  # SNMP


def _watch_trays(cfg: dict, node: str, sim) -> None:
    cfg["sources"]["redfish"]["watch_rack_trays"] = True
    # These tests count who asks each device within a few seconds: the Redfish services polled at their interval
    # while their streams are up too, not once every confirmed_interval (10 s) as shipped.
    cfg["sources"]["redfish"]["confirmed_interval"] = 0


@pytest.fixture(scope="module")
def rack(tmp_path_factory):
    yield from etcd_rack(tmp_path_factory.mktemp("coordination"), _watch_trays, Rack)


def test_one_leader_and_each_shared_device_sees_at_most_two_clients(rack):
    rack.steady()
    assert sum(is_leader(a) for a in rack.agents) == 1
    before = {d: rack.requests(d) for d in SHARED}
    # A window of several polls: the simulator's own counters say who asked.
    t0 = time.monotonic()
    wait_for(lambda: time.monotonic() - t0 > 6, 30, interval=0.5, what="a window of polls")
    for d in SHARED:
        assert rack.requests(d) > before[d], f"{d} not polled at all"
    # One or two clients at each device in a 5 s window. Waited for rather than read once: an agent whose lease
    # cannot be proven for a moment on a loaded machine degrades and reads the leak inputs itself, as it must
    # (a third client for a few seconds); with every agent polling every device no window ever qualifies.
    wait_for(lambda: all(1 <= rack.clients(d, 5.0) <= 2 for d in SHARED), 60, interval=0.5,
             what="a 5 s window in which every shared device saw one or two clients: "
                  + ", ".join(f"{d} {rack.clients(d, 5.0)}" for d in SHARED))
    assert rack.device("rfcdu1").describe()["sse_streams"] <= 2  # only its pollers hold an event stream
    # Each series of a shared device is exported by its pollers only.
    for d, source in (("leak1", "leak"), ("pdu-a", "pdu"), ("rfcdu1", "redfish")):
        exporting = [a for a in rack.agents if metric(a, "supernode_source_up", device=d, source=source) is not None]
        assert sorted(a.config["agent"]["node"] for a in exporting) == \
            sorted(a.config["agent"]["node"] for a in rack.agents if polls(a, d))


def valve_close_waiting(leader: AgentProcess) -> None:
    """Wait until the leader's zone valve close waits for a person (the leak-response's cdu_write step)."""
    wait_for(lambda: any(p["action"] == "cdu_write" and p["phase"] == "apply"
                         for p in incidents(leader).get("pending_approvals", [])), 30,
             what="the valve close waiting for approval on the leader")


def tray_readers(rack: Rack, node: str) -> list[str]:
    """The agents that export node's tray BMC as a source they read now."""
    return sorted(a.config["agent"]["node"] for a in alive(rack.agents)
                  if metric(a, "supernode_source_up", device=f"bmc-{node}", source="redfish") == 1.0)


def test_each_tray_bmc_is_read_by_its_own_agent_and_the_other_trays_by_the_elected_leader(rack):
    rack.steady()
    leader = rack.leader()
    me = leader.config["agent"]["node"]
    for node in NODES:
        want = sorted({node, me})
        wait_for(lambda: tray_readers(rack, node) == want, 30, what=f"bmc-{node} read by {want}")
        wait_for(lambda: rack.clients(f"bmc-{node}", 8.0) == len(want), 30,
                 what=f"bmc-{node} seeing {len(want)} client(s)")
    # Another agent sees the CDU's Redfish readings from the pollers' facts, not by asking the CDU.
    reader = next(a for a in rack.agents if not polls(a, "rfcdu1"))
    status, body = reader.get("/api/v1/state")
    assert status == 200
    assert any(r["metric"] == "supernode_coolant_pump_speed_ratio" and r["labels"].get("bmc") == "rfcdu1"
               for r in json.loads(body)["readings"])


def test_a_leak_reaches_the_zone_agent_that_does_not_poll_the_controller(rack):
    rack.steady()
    target = next(a for a in rack.agents if not polls(a, "leak1"))
    node = target.config["agent"]["node"]
    root = f"/supernode-test/{target.config['agent']['rack']}"
    first = rack.etcd.get(f"{root}/pollers/leak1/0").decode()
    standby = next(a.config["agent"]["node"] for a in rack.agents
                   if polls(a, "leak1") and a.config["agent"]["node"] != first)
    standby_key = f"{root}/facts/leak/leak1/{standby}"
    rack.sim.inject("leak", zone=ZONE[node])
    try:
        wait_for(lambda: results(target, "drain", result="done", target=f"node={node}"), 30,
                 what=f"{node} drained by its own agent from the pollers' facts")
        wait_for(lambda: results(target, "gpu_power_cap", result="done"), 30, what=f"{node}'s GPUs capped")
        others = [a for a in rack.agents if a is not target]
        assert not any(results(a, "drain", result="done", target=f"node={node}") for a in others)
        # The hot standby publishes its wet polls too (either poller may read the leak first) ...
        wait_for(lambda: fact_wet(rack.etcd.get(standby_key), ZONE[node]), 30, what=f"{standby}'s wet fact in etcd")
    finally:
        rack.clear()
    # ... and its first dry one after them: its key does not go on saying wet.
    wait_for(lambda: fact_wet(rack.etcd.get(standby_key), ZONE[node]) is False, 30, what=f"{standby}'s dry fact")


def fact_wet(raw: bytes | None, zone: str) -> bool | None:
    """Whether a fact in etcd reads a leak in `zone` (None: no such fact)."""
    if raw is None:
        return None
    doc = json.loads(raw)
    return any(name == "supernode_leak_detected" and labels.get("zone") == zone and value >= 0.5
               for name, value, labels, _q, _ts in doc["r"])


def test_one_etcd_member_stopped_changes_nothing(rack):
    rack.steady()
    leader = rack.leader()
    pollers = {d: {a.config["agent"]["node"] for a in rack.agents if polls(a, d)} for d in SHARED}
    member = rack.etcd.members[0]
    member.stop()
    try:
        # Longer than two lease TTLs: every lease was renewed through the other members.
        t0 = time.monotonic()
        while time.monotonic() - t0 < 2.5 * TTL:
            assert all(is_up(a) for a in rack.agents), [a.log()[-2000:] for a in rack.agents if not is_up(a)]
            assert leaders(rack.agents) == [leader]
            time.sleep(0.5)
        assert pollers == {d: {a.config["agent"]["node"] for a in rack.agents if polls(a, d)} for d in SHARED}
    finally:
        member.start()
        wait_for(lambda: rack.etcd.healthy(member), 60, what="member back")


def test_sigkill_of_the_leader_during_a_leak_a_new_leader_drives_the_valve_after_approval(rack):
    rack.steady()
    leader = rack.leader()
    zone = "zone-b"  # cdu1:zone_valve_2
    rack.sim.inject("leak", zone=zone)
    try:
        valve_close_waiting(leader)
        os.kill(leader.proc.pid, signal.SIGKILL)
        leader.proc.wait(10)
        rest = alive(rack.agents)
        wait_for(lambda: len(leaders(rest)) == 1, 4 * TTL, interval=0.2, what="a new leader")
        new = leaders(rest)[0]
        other = next(a for a in rest if a is not new)
        # watch_rack_trays follows the elected leader: the new one reads the dead leader's tray.
        dead = leader.config["agent"]["node"]
        wait_for(lambda: tray_readers(rack, dead) == [new.config["agent"]["node"]], 30,
                 what=f"bmc-{dead} read by the new leader")
        # A person approves on an agent that is not the leader, by that agent's own incident id.
        inc = wait_for(lambda: next((i for i in incidents(other).get("open", []) if i["detector"] == "leak"
                                     and i["targets"]["zone"] == zone), None), 30, what="the leak open on another agent")
        wait_for(lambda: any(p.get("rack") and p["phase"] == "apply" for p in incidents(other)["pending_approvals"]),
                 30, what="the new leader's rack approval visible everywhere")
        assert approve(other, inc["id"]), "nothing approved"
        wait_for(lambda: rack.sim.sim.model.coolant.valve_open[zone] is False, 30, what="zone valve closed")
        wait_for(lambda: results(new, "cdu_write", result="done"), 30, what="the new leader's valve close journaled")
    finally:
        rack.clear()
        with rack.sim.sim.model.lock:
            rack.sim.sim.model.coolant.valve_open[zone] = True
        restart(leader)
        rack.steady()


def test_approve_on_a_followers_status_page_drives_the_leaders_valve(rack):
    """The page's Approve button on an agent that does not lead: the rack approval the leader waits on is listed
    there (the page's view), and approving it there (the button's POST) closes the valve, as
    `supernode-agent approve` on that agent does."""
    rack.steady()
    leader = rack.leader()
    follower = next(a for a in rack.agents if a is not leader)
    seq = {a: max((e["seq"] for e in results(a, "cdu_write")), default=0) for a in (leader, follower)}
    zone = "zone-b"  # cdu1:zone_valve_2
    rack.sim.inject("leak", zone=zone)
    try:
        valve_close_waiting(leader)

        def on_the_page() -> dict | None:
            status, body = follower.get("/api/v1/status", token=TOKEN)
            if status != 200:
                return None
            view = json.loads(body)
            assert view["coordination"]["leader"] == leader.config["agent"]["node"]
            return next((p for p in view["incidents"]["pending_approvals"]
                         if p.get("rack") and p["action"] == "cdu_write" and p["phase"] == "apply"), None)
        pending = wait_for(on_the_page, 30, what="the leader's valve close listed on the follower's page")
        assert pending["target"] == "cdu=cdu1,point=zone_valve_2" and pending["requested_by"] == \
            leader.config["agent"]["node"]
        status, body = follower.request("POST", f"/api/v1/incidents/{pending['id']}/approve", token=TOKEN)
        assert status == 200 and json.loads(body)["approved"] == [pending["id"]], body
        wait_for(lambda: rack.sim.sim.model.coolant.valve_open[zone] is False, 30, what="zone valve closed")
        wait_for(lambda: [e for e in results(leader, "cdu_write", result="done") if e["seq"] > seq[leader]], 30,
                 what="the leader's valve close journaled")
        # the follower never wrote the CDU itself
        assert not [e for e in results(follower, "cdu_write", result="done") if e["seq"] > seq[follower]]
    finally:
        rack.clear()
        with rack.sim.sim.model.lock:
            rack.sim.sim.model.coolant.valve_open[zone] = True
        rack.steady()


def test_two_etcd_members_stopped_every_agent_degrades_then_recovers(rack):
    rack.steady()
    stopped = rack.etcd.members[1:]
    for m in stopped:
        m.stop()
    try:
        wait_for(lambda: not any(is_up(a) for a in rack.agents), 6 * TTL, interval=0.3, what="every agent degraded")
        assert not any(is_leader(a) for a in rack.agents)
        # Degraded: each agent polls the leak inputs itself, at the bounded rate; nothing else shared.
        wait_for(lambda: rack.clients("leak1", 5.0) == 3, 30, what="every agent reading the leak controller")
        wait_for(lambda: rack.clients("pdu-a", 3.0) == 0, 30, what="nobody polling the PDU")
        # Each agent keeps reading its own tray BMC (never gated); nobody leads, so nobody reads another's.
        trays = {n: rack.requests(f"bmc-{n}") for n in NODES}
        for node in NODES:
            wait_for(lambda: tray_readers(rack, node) == [node], 30, what=f"bmc-{node} read by its own agent only")
            wait_for(lambda: rack.requests(f"bmc-{node}") > trays[node], 30, what=f"bmc-{node} polled while degraded")
            wait_for(lambda: rack.clients(f"bmc-{node}", 8.0) == 1, 30, what=f"the ex-leader let go of bmc-{node}")
        target = rack.by_node("node03")
        rack.sim.inject("leak", zone="zone-c")
        wait_for(lambda: results(target, "drain", result="done", target="node=node03"), 30,
                 what="node03 drained by its own agent while degraded")
    finally:
        for m in stopped:
            m.start()
    rack.clear()
    rack.steady()


def test_sigstop_of_the_leader_past_its_ttl_its_late_write_is_fenced(rack, tmp_path):
    """The others run dry-run here: any write that reaches the CDU could only be the stopped leader's."""
    rack.steady()
    leader = rack.leader()
    others = [a for a in rack.agents if a is not leader]
    for a in others:
        a.config["agent"]["mode"] = "dry-run"
        restart(a)
    rack.steady()
    assert leaders(rack.agents) == [leader]
    cdu = rack.device("cdu1")
    writes_before = len(cdu.writes)
    seq_before = max((e["seq"] for e in results(leader, "cdu_write")), default=0)
    zone = "zone-b"
    rack.sim.inject("leak", zone=zone)
    try:
        valve_close_waiting(leader)
        wait_for(lambda: any(p.get("rack") and p["phase"] == "apply" for p in incidents(others[0])["pending_approvals"]),
                 30, what="the rack approval visible on another agent")
        inc = wait_for(lambda: next((i for i in incidents(others[0]).get("open", []) if i["detector"] == "leak"
                                     and i["targets"]["zone"] == zone), None), 30, what="the leak open on another agent")
        leader.signal(signal.SIGSTOP)
        try:
            assert approve(others[0], inc["id"]), "nothing approved"
            wait_for(lambda: len(leaders(others)) == 1, 6 * TTL, interval=0.2, what="a new leader")
        finally:
            leader.signal(signal.SIGCONT)
        def fenced() -> list:
            return [e for e in results(leader, "cdu_write", result="blocked") if e["seq"] > seq_before
                    and e["detail"].get("guardrail") == "fenced"]
        try:
            blocked = wait_for(fenced, 40, what="the late write fenced")[-1]
        except AssertionError as exc:
            said = [line for line in leader.log().splitlines()
                    if "cdu_write" in line or "coordination" in line or "approval" in line or "Error" in line]
            raise AssertionError(f"{exc}\n" + "\n".join(said[-30:])) from None
        assert "leader" in blocked["detail"]["why"] or "lease" in blocked["detail"]["why"], blocked
        assert len(cdu.writes) == writes_before, cdu.writes[writes_before:]
        assert rack.sim.sim.model.coolant.valve_open[zone] is True
        assert metric(leader, "supernode_coordination_fenced_total") >= 1
    finally:
        rack.clear()
        for a in others:
            a.config["agent"]["mode"] = "enforce"
            restart(a)
