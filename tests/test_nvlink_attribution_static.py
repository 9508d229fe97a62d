"""Issue 34 without etcd: the rack's NVLink attribution in `static` coordination, each agent from its peers' feeds.

Three real agents on a simulated GB200 rack, `static` coordination with `inventory.agent_urls`: every agent serves
its tray's link vector (GET /api/v1/coordination/links, a stream) and follows every peer's, so each computes the
same verdict as with etcd; the configured leader (node01, the first inventory node) opens the switch incident.

- an NVSwitch chip down -> one nvlink_switch_fault incident, on node01, naming the chip and its switch tray;
  every agent holds the verdict; a tray-side link of one tray still drains that tray, and no other tray drains;
- a peer that stops (its feed lost) is silent on the others: counted for nothing.
"""

from __future__ import annotations

import pytest

from tests.coordination_rack import metric, static_rack
from tests.helpers import wait_for
from tests.test_nvlink_attribution_rack import _drained, _incidents, _nvlink_errors_opened, _verdict

NODES = ["node01", "node02", "node03"]


@pytest.fixture(scope="module")
def rack(tmp_path_factory):
    def attributing(cfg: dict) -> None:
        cfg["remediation"].setdefault("detectors", {})["nvlink_switch_attribution"] = True

    rack = static_rack(tmp_path_factory.mktemp("nvlink-static"), NODES, {}, attributing, "gb200")
    sim, agents = next(rack)
    try:
        wait_for(lambda: all(metric(a, "supernode_nvlink_attribution_trays", state="counted") == 3.0
                             for a in agents), 90, what="every agent counting the 3 trays' vectors from the feeds")
        yield sim, agents
    finally:
        rack.close()  # every agent and the simulated rack stopped


def test_a_switch_chip_down_is_one_incident_on_the_configured_leader_and_drains_no_tray(rack):
    sim, agents = rack
    leader, *followers = agents
    sim.inject("nvswitch-down", switch=3)
    wait_for(lambda: _incidents(leader, "nvlink_switch_fault"), 60, what="node01's nvlink_switch_fault incident")
    (inc,) = _incidents(leader, "nvlink_switch_fault")
    assert inc["targets"] == {"switch_chip": "3", "switch_tray": "switch02"}
    wait_for(lambda: all(_verdict(a, 3) == 1.0 for a in agents), 30, what="every agent's verdict on chip 3")
    assert all(_incidents(a, "nvlink_switch_fault") == [] for a in followers)
    # node02's own link 9 fails after the switch's: its drain comes one nvlink_errors hold later, by when every
    # tray's hold for the switch's link 3 (started earlier) has ended too
    node02 = agents[1]
    sim.inject("nvlink-down", node="node02", gpu=1, link=9)
    wait_for(lambda: _drained(node02, "node02"), 90, what="node02 drained for its own link 9")
    (own,) = [i for i in _incidents(node02, "nvlink_errors") if i["targets"] == {"node": "node02", "gpu": "1"}]
    assert own["detail"]["links_down"] == ["9"] and own["detail"]["links_switch_side"] == ["3"]
    for a, node in zip(agents, NODES):
        if node != "node02":
            assert _drained(a, node) == [], f"{node} drained for a switch fault"
            assert _nvlink_errors_opened(a) == [], f"{node} opened nvlink_errors for a switch fault"
    assert len(_incidents(leader, "nvlink_switch_fault")) == 1


def test_a_peer_that_stops_is_silent_on_the_others(rack):
    sim, agents = rack
    sim.clear()
    agents[2].stop()
    wait_for(lambda: all(metric(a, "supernode_nvlink_attribution_trays", state="silent") == 1.0
                         for a in agents[:2]), 30, what="node03 silent on node01 and node02")
    assert all(metric(a, "supernode_nvlink_attribution_trays", state="counted") == 2.0 for a in agents[:2])
