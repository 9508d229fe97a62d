"""Static coordination on real agent processes: pollers from the config, the others read their fact stream.

node01 polls every shared device (the Redfish CDU too); node02 polls none and reads node01's polls from its
/api/v1/coordination/facts stream, at node01's `inventory.agent_urls` (the status page's URL for it too).
A leak in node02's zone still drains and caps node02 (by its own agent); each shared device sees one client;
node02 exports none of those devices' series; node01 leads. Maintenance set on node02's own agent holds on
node01 too (it asks its peers' agents), for node02 only.
"""

from __future__ import annotations

import json
import time

import pytest

from tests import coordination_rack
from tests.coordination_rack import incidents, journal, metric, results, set_maintenance, xid_alert
from tests.helpers import wait_for

SHARED = ("leak1", "cdu1", "rdhx1", "pdu-a", "rfcdu1")


@pytest.fixture
def static_rack(tmp_path):
    yield from coordination_rack.static_rack(tmp_path, ["node01", "node02"], {d: ["node01"] for d in SHARED},
                                             lambda cfg: cfg["coordination"].update(maintenance_poll_seconds=1.0))


def test_a_node_that_polls_nothing_shared_still_drains_on_a_leak_in_its_zone(static_rack):
    sim, (node01, node02) = static_rack
    wait_for(lambda: metric(node02, "supernode_coordination_up", backend="static") == 1.0, 30, what="node02 up")
    assert metric(node01, "supernode_coordination_leader", backend="static") == 1.0
    assert metric(node02, "supernode_coordination_leader", backend="static") == 0.0
    wait_for(lambda: metric(node01, "supernode_source_up", device="leak1", source="leak") == 1.0, 30,
             what="node01 polling leak1")
    for d in SHARED:
        dev = sim.sim.devices[d]
        wait_for(lambda: (dev.clients if hasattr(dev, "clients") else dev.agent.clients)(3.0) == 1, 30,
                 what=f"{d} polled by node01 alone")
        assert metric(node02, "supernode_coordination_polling", device=d) == 0.0
    assert metric(node02, "supernode_source_up", device="leak1", source="leak") is None  # exported by node01 only
    sim.inject("leak", zone="zone-b")
    wait_for(lambda: results(node02, "drain", result="done", target="node=node02"), 30,
             what="node02 drained by its own agent from node01's polls")
    wait_for(lambda: results(node02, "gpu_power_cap", result="done"), 30, what="node02's GPUs capped")
    assert not results(node01, "drain", target="node=node02")
    # node01's real facts all passed node02's checks (its own poll of each device, from its own stream)
    status, body = node02.get("/metrics")
    assert status == 200 and 'supernode_coordination_rejected_records_total{key_kind="fact"' not in body.decode()


def test_maintenance_set_on_a_nodes_own_agent_holds_on_its_peers_for_that_node_only(static_rack):
    _, (node01, node02) = static_rack

    set_maintenance(node02, "node02", True)
    set_maintenance(node02, "node01", True)  # node02's agent cannot speak for node01: that holds on node02 alone
    wait_for(lambda: incidents(node01).get("maintenance", {}).get("node02", {}).get("set_via") == "node02", 30,
             what="node01 knowing node02 is in maintenance, from node02's agent")
    assert "node01" not in incidents(node01)["maintenance"]
    assert xid_alert(node01, "node02", "firing", "2026-12-01T00:00:00Z") == 200
    rows = wait_for(lambda: [e for e in journal(node01) if e.get("kind") == "blocked" and e.get("action") == "drain"
                             and e.get("target") == "node=node02"], 30, what="node01's drain of node02 blocked")
    assert rows[0]["detail"]["guardrail"] == "maintenance" and "node02's agent" in rows[0]["detail"]["why"]
    assert not results(node01, "drain", target="node=node02", result="done")

    assert xid_alert(node01, "node02", "resolved", "2026-12-01T00:00:00Z") == 200
    set_maintenance(node02, "node02", False)
    wait_for(lambda: "node02" not in incidents(node01).get("maintenance", {"node02": 1}), 30,
             what="node01 knowing node02's maintenance is over")
    assert xid_alert(node01, "node02", "firing", "2026-12-01T00:10:00Z") == 200
    wait_for(lambda: results(node01, "drain", target="node=node02", result="done"), 30,
             what="node01 draining node02 once maintenance is off")


def test_a_redfish_cdu_whose_events_stand_in_for_its_polls_stays_fresh_where_its_facts_are_read(static_rack):
    """node01 polls the Redfish CDU; once its event stream is up, node01 leaves out the timer's polls between
    `confirmed_interval`s (10 s) and vouches its own entry fresh instead. node02 reads the CDU only from node01's
    facts: the heartbeat must reach it through those vouched polls too, or node02 counts the CDU stale after two
    heartbeats (its leak detectors unreadable: a leak's undo would wait on a dry hold that never starts). Watched
    on node02's page over longer than node01's deferral and node02's stale window together."""
    _, (node01, node02) = static_rack
    wait_for(lambda: metric(node01, "supernode_redfish_event_stream_up", bmc="rfcdu1", transport="sse") == 1.0, 60,
             what="node01's event stream from the Redfish CDU up")

    def cdu() -> dict:
        status, body = node02.get("/api/v1/status")
        assert status == 200
        return next(s for s in json.loads(body)["sources"] if (s["source"], s["device"]) == ("redfish", "rfcdu1"))
    samples: list[tuple[float, dict]] = []

    def watched_long_enough() -> bool:
        samples.append((time.monotonic(), cdu()))
        return samples[-1][0] - samples[0][0] >= 16.0  # 10 s deferred + 2 heartbeats' window, and margin
    wait_for(watched_long_enough, 60, interval=0.5, what="node02's view of the Redfish CDU sampled for 16 s")
    assert [s for _, s in samples if s["state"] != "up"] == []
