"""Issue 34 with real agents: switch-side vs tray-side NVLink faults across 3 agents on a simulated GB200 rack,
coordinated by a real etcd (each agent publishes its tray's link vector under links/<node>).

- an NVSwitch chip down (link K down on every GPU of the rack) -> exactly one nvlink_switch_fault incident, on
  the rack leader, naming the chip; no compute tray drained (and no nvlink_errors incident on any tray);
- one tray's link down -> that tray drained, no switch incident;
- a whole tray running slow under load (every GPU alike, so its own median shows nothing) -> gpu_straggler on
  that tray's GPUs against the rack's median busy clock, which every agent computes from the trays' vectors.

The attribution latency (the fault's injection to the leader's incident) is printed, not asserted (run with -s).
Every wait is on a condition with a generous deadline (loaded 2-core machine).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.agentproc import AgentProcess
from tests.coordination_rack import EtcdRack, etcd_rack, incidents, journal, leaders, metric, results
from tests.helpers import wait_for


def _attributing(cfg: dict[str, Any], node: str, sim: Any) -> None:
    """The rack is one NVLink domain (GB200): its rack file lists the switch trays, which turns attribution on;
    said here too, so the test does not hang on that default."""
    cfg["remediation"].setdefault("detectors", {})["nvlink_switch_attribution"] = True
    # gpu_straggler's hold short, for the rack-median straggler test (a steady rack never fires it)
    cfg["remediation"]["detectors"]["gpu_straggler"] = {"fire_seconds": 1.0, "clear_seconds": 1.0}


@pytest.fixture(scope="module")
def rack(tmp_path_factory):
    yield from etcd_rack(tmp_path_factory.mktemp("nvlink-attrib"), _attributing, personality="gb200")


def _incidents(agent: AgentProcess, detector: str) -> list[dict[str, Any]]:
    """Open and recent incidents of `detector` on `agent` (one incident may be in both lists)."""
    view = incidents(agent)
    seen = {i["id"]: i for i in view.get("recent", []) + view.get("open", []) if i["detector"] == detector}
    return list(seen.values())


def _drained(agent: AgentProcess, node: str) -> list[dict[str, Any]]:
    return results(agent, "drain", result="done", target=f"node={node}")


def _nvlink_errors_opened(agent: AgentProcess) -> list[dict[str, Any]]:
    return [e for e in journal(agent) if e.get("kind") == "incident" and e.get("result") == "open"
            and (e.get("detail") or {}).get("detector") == "nvlink_errors"]


def _verdict(agent: AgentProcess, chip: int) -> float | None:
    """The agent's verdict on chip K, whatever switch tray the inventory names for it (none: "")."""
    for line in agent.metrics().splitlines():
        if line.startswith("supernode_nvlink_switch_fault{") and f'switch_chip="{chip}"' in line:
            return float(line.rsplit(" ", 1)[1])
    return None


def _cleared(rack: EtcdRack) -> None:
    rack.sim.clear()
    wait_for(lambda: all(_verdict(a, k) == 0.0 for a in rack.agents for k in range(18)), 60,
             what="no switch-side verdict on any agent")


def test_a_switch_chip_down_is_one_switch_incident_on_the_leader_and_drains_no_tray(rack):
    _cleared(rack)
    (leader,) = leaders(rack.agents)
    followers = [a for a in rack.agents if a is not leader]
    t0 = time.time()
    rack.sim.inject("nvswitch-down", switch=3)
    wait_for(lambda: _incidents(leader, "nvlink_switch_fault"), 60, what="the leader's nvlink_switch_fault incident")
    (inc,) = _incidents(leader, "nvlink_switch_fault")
    assert inc["targets"] == {"switch_chip": "3", "switch_tray": "switch02"}  # the rack file names its tray
    assert inc["playbook"] == "nvlink-switch-fault"
    print(f"\nattribution latency (nvswitch-down -> the leader's incident): {inc['opened_at'] - t0:.2f} s")
    assert all(_verdict(a, 3) == 1.0 for a in rack.agents)  # every agent holds the verdict; one tells
    assert all(_incidents(a, "nvlink_switch_fault") == [] for a in followers)
    # A tray-side link of one tray fails after the switch did: its drain comes one nvlink_errors hold later,
    # so by then every tray's hold for the switch's links (started earlier) has ended too.
    victim = next(a for a in rack.agents if a.config["agent"]["node"] == "node02")
    rack.sim.inject("nvlink-down", node="node02", gpu=1, link=9)
    wait_for(lambda: _drained(victim, "node02"), 90, what="node02 drained for its own link 9")
    (own,) = [i for i in _incidents(victim, "nvlink_errors") if i["targets"] == {"node": "node02", "gpu": "1"}]
    assert own["detail"]["links_down"] == ["9"] and own["detail"]["links_switch_side"] == ["3"]
    for a in rack.agents:
        node = a.config["agent"]["node"]
        if node != "node02":
            assert _drained(a, node) == [], f"{node} drained for a switch fault"
            assert _nvlink_errors_opened(a) == [], f"{node} opened nvlink_errors for a switch fault"
    assert len(_incidents(leader, "nvlink_switch_fault")) == 1


def test_one_trays_link_down_drains_that_tray_and_opens_no_switch_incident(rack):
    _cleared(rack)
    before = {a.config["agent"]["node"]: {i["id"] for i in _incidents(a, "nvlink_switch_fault")} for a in rack.agents}
    victim = next(a for a in rack.agents if a.config["agent"]["node"] == "node03")
    rack.sim.inject("nvlink-down", node="node03", gpu=0, link=3)
    wait_for(lambda: _drained(victim, "node03"), 90, what="node03 drained for its link 3")
    wait_for(lambda: all(metric(a, "supernode_nvlink_tray_side_links") == 1.0 for a in rack.agents), 30,
             what="every agent's attribution calls node03's link tray-side")
    for a in rack.agents:
        node = a.config["agent"]["node"]
        assert _verdict(a, 3) == 0.0
        new = [i for i in _incidents(a, "nvlink_switch_fault") if i["id"] not in before[node]]
        assert new == [], f"{node}: a switch incident for one tray's link"


def test_a_whole_tray_slower_than_the_rack_is_a_straggler_by_the_racks_median(rack):
    _cleared(rack)
    before = {a.config["agent"]["node"]: {i["id"] for i in _incidents(a, "gpu_straggler")} for a in rack.agents}
    rack.sim.inject("workload", ratio=0.9)
    wait_for(lambda: all(metric(a, "supernode_gpu_rack_load_trays") == 3.0 for a in rack.agents), 60,
             what="every agent counts the 3 busy trays in the rack's median")
    gpus = len(rack.sim.sim.model.nodes["node03"].gpus)
    for gpu in range(gpus):  # every GPU of node03 alike: node03's own median moves with them
        rack.sim.inject("clock-slowdown", node="node03", gpu=gpu, reason="none", ratio=0.8)
    victim = next(a for a in rack.agents if a.config["agent"]["node"] == "node03")

    def slow() -> list[dict[str, Any]]:
        return [i for i in _incidents(victim, "gpu_straggler") if i["id"] not in before["node03"]]

    try:
        wait_for(lambda: len(slow()) == gpus, 60, what="node03's GPUs stragglers against the rack")
        for inc in slow():
            assert inc["detail"]["off"] == ["sm_clock_vs_rack"], inc["detail"]
            assert inc["detail"]["rack_median_sm_clock_hertz"] > inc["detail"]["sm_clock_hertz"]
        for a in rack.agents:
            node = a.config["agent"]["node"]
            if node != "node03":
                assert [i for i in _incidents(a, "gpu_straggler") if i["id"] not in before[node]] == [], node
    finally:
        rack.sim.clear()  # the simulator's own load again (0.85 on every GPU)
