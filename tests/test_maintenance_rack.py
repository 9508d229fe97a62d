"""Rack-wide maintenance over a real 3-member etcd cluster: 3 real agent processes on the simulated rack.

Maintenance set on node03's own agent holds on every agent of the rack: node01 does not drain node03 on a
webhook alert, no agent acts on node03 in a leak of its zone (while node01's zone still works), and once it is
off the same kind of alert drains. A forged maintenance record written straight to etcd is rejected, counted,
and silences nothing. One etcd cluster, one simulated rack and three agents for the module; every wait is on a
condition with a generous deadline.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.agentproc import AgentProcess
from tests.coordination_rack import (EtcdRack, etcd_rack, incidents, journal, metric, results, set_maintenance,
                                     xid_alert)
from tests.helpers import wait_for

NODES = ("node01", "node02", "node03")


class Rack(EtcdRack):
    def key(self, node: str) -> str:
        return f"/supernode-test/{self.agents[0].config['agent']['rack']}/maintenance/{node}"


@pytest.fixture(scope="module")
def rack(tmp_path_factory):
    yield from etcd_rack(tmp_path_factory.mktemp("maintenance"), rack=Rack)




def blocked_by_maintenance(agent: AgentProcess, action: str, target: str) -> list[dict]:
    return [e for e in journal(agent) if e.get("kind") == "blocked" and e.get("action") == action
            and e.get("target") == target and e["detail"].get("guardrail") == "maintenance"]


def test_maintenance_set_on_a_nodes_own_agent_stops_every_agent_acting_on_it(rack):
    node01, node02, node03 = (rack.by_node(n) for n in NODES)
    set_maintenance(node03, "node03", True)
    for a in (node01, node02):
        wait_for(lambda: incidents(a).get("maintenance", {}).get("node03", {}).get("set_via") == "node03", 30,
                 what=f"{a.config['agent']['node']} knowing node03 is in maintenance, set on node03's agent")
    assert incidents(node01)["maintenance"]["node03"]["local"] is False
    assert metric(node01, "supernode_remediation_maintenance", node="node03") == 1.0

    # A webhook alert about node03 to node01: node01 does not drain node03, and its journal says why and where.
    assert xid_alert(node01, "node03", "firing", "2026-12-01T00:00:00Z") == 200
    rows = wait_for(lambda: blocked_by_maintenance(node01, "drain", "node=node03"), 30,
                    what="node01's drain of node03 blocked by maintenance")
    assert "node03's agent" in rows[0]["detail"]["why"] and "set by admin" in rows[0]["detail"]["why"]
    assert not results(node01, "drain", target="node=node03", result="done")

    # A leak in node03's zone: no agent drains or caps node03; it is loudly visible (an open incident on node03);
    # a leak in node01's zone at the same time is acted on as ever.
    rack.sim.inject("leak", zone="zone-c")
    rack.sim.inject("leak", zone="zone-a")
    try:
        wait_for(lambda: blocked_by_maintenance(node03, "drain", "node=node03"), 30,
                 what="node03's own drain blocked by maintenance")
        wait_for(lambda: blocked_by_maintenance(node03, "gpu_power_cap", "gpu=0,node=node03"), 30,
                 what="node03's GPU caps blocked by maintenance")
        assert any(i["detector"] == "leak" and i["targets"].get("zone") == "zone-c"
                   for i in incidents(node03)["open"])
        wait_for(lambda: results(node01, "drain", target="node=node01", result="done"), 30,
                 what="node01 drained in its own zone's leak")
        for a in rack.agents:
            assert not results(a, "drain", target="node=node03", result="done")
            assert not [e for e in results(a, "gpu_power_cap", result="done") if "node=node03" in e["target"]]
    finally:
        rack.sim.clear()

    # Off on node03's agent: the same alert drains node03 from node01.
    assert xid_alert(node01, "node03", "resolved", "2026-12-01T00:00:00Z") == 200
    set_maintenance(node03, "node03", False)
    wait_for(lambda: "node03" not in incidents(node01).get("maintenance", {"node03": 1}), 30,
             what="node01 knowing node03's maintenance is over")
    assert rack.etcd.get(rack.key("node03")) is None
    assert xid_alert(node01, "node03", "firing", "2026-12-01T00:10:00Z") == 200
    wait_for(lambda: results(node01, "drain", target="node=node03", result="done"), 30,
             what="node01 draining node03 once maintenance is off")


def rejected(agent: AgentProcess, why: str) -> float:
    return metric(agent, "supernode_coordination_rejected_records_total", key_kind="maintenance", why=why) or 0.0


def test_a_forged_maintenance_record_is_rejected_counted_and_silences_nothing(rack):
    node01 = rack.by_node("node01")
    forged = {rack.key("node02"): b"{not json",
              rack.key("node09"): json.dumps({"by": "x", "since": 1.0, "until": None, "set_via": "node01"}),
              rack.key("node02") + "x": json.dumps({"by": "x", "since": 1.0, "until": None, "set_via": "node01"})}
    for key, value in forged.items():
        rack.etcd.put(key, value)
    wait_for(lambda: all(rejected(a, "not_json") >= 1 and rejected(a, "unknown_node") >= 2 for a in rack.agents),
             30, what="garbage and unknown nodes rejected by every agent")
    far = json.dumps({"by": "x", "since": 4_000_000_000.0, "until": None, "set_via": "node01"})
    rack.etcd.put(rack.key("node02"), far)
    wait_for(lambda: all(rejected(a, "future") >= 1 for a in rack.agents), 30,
             what="a since far in the future rejected by every agent")
    assert "node02" not in incidents(node01)["maintenance"]
    # The forged record silences nothing: a webhook alert about node02 drains it.
    assert xid_alert(node01, "node02", "firing", "2026-12-01T00:20:00Z") == 200
    wait_for(lambda: results(node01, "drain", target="node=node02", result="done"), 30,
             what="node01 draining node02 despite the forged record")
    for key in forged:
        rack.etcd.delete(key)


# -- the validator and a static peer's word, without a daemon ------------------------------------------------

JSON = st.recursive(st.none() | st.booleans() | st.floats() | st.integers() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
                    max_leaves=12)
RECORD = st.fixed_dictionaries({}, optional={"by": JSON | st.text(max_size=20), "since": JSON | st.floats(0, 2000),
                                             "until": JSON | st.floats(0, 4000), "set_via": JSON | st.sampled_from(NODES)})


@given(node=st.sampled_from(NODES) | st.text(max_size=10), doc=RECORD | JSON)
def test_a_maintenance_record_is_a_valid_record_or_a_counted_rejection_never_a_crash(node, doc):
    from agent.coordination.maintenance import RackMaintenance
    from agent.coordination.records import Rejections

    rejections = Rejections()
    rack = RackMaintenance("node01", NODES, 5.0, rejections, clock=lambda: 1000.0)
    if rack.accept(node, json.dumps(doc), "k"):
        rec = rack.records[node]
        assert node in NODES and rec["set_via"] in NODES and rec["since"] <= 1005.0
        assert rec["until"] is None or rec["until"] > rec["since"]
        assert isinstance(rec["by"], str) and 0 < len(rec["by"]) <= 200
    else:
        assert node not in rack.records and rejections.total("maintenance") == 1


def test_a_static_peer_is_believed_about_its_own_node_only():
    from agent.coordination.maintenance import RackMaintenance
    from agent.coordination.records import Rejections

    rejections = Rejections()
    rack = RackMaintenance("node01", NODES, 5.0, rejections, clock=lambda: 1000.0)
    own = {"by": "alice", "since": 990.0, "until": 2000.0, "set_via": "node03"}
    assert rack.accept("node03", json.dumps(own), "k", peer="node03")
    assert rack.active("node03")["by"] == "alice"
    assert not rack.accept("node02", json.dumps(own), "k", peer="node03")  # node03's agent speaking for node02
    assert not rack.accept("node03", json.dumps(dict(own, set_via="node02")), "k", peer="node03")
    assert rejections.counts == {("maintenance", "not_own_node"): 2}
    assert rack.active("node02") is None and rack.active("node03") is None  # a bad answer drops what was known
    assert rack.accept("node03", json.dumps(own), "k", peer="node03")
    rack.clock = lambda: 2000.0  # its `until`: over by itself, even with the peer silent
    assert rack.active("node03") is None and rack.view() == {}
