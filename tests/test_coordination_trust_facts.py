"""Forged shared facts in a real etcd, against 3 real agents on the simulated rack (issue 31, finding 3).

A fact is taken only from the agent that holds a poller slot of its device (the key's node, under the slot's
lease), for the job its key names, with families, labels and times that device's source can publish. Each
test writes what an attacker with write access to etcd would (`EtcdCluster.put`, with a lease of its own or
the real poller's) and shows that no agent acts on it or exports it, and that every agent that read it counts
it in `supernode_coordination_rejected_records_total{key_kind="fact"}`. One etcd cluster, one simulated rack
and three agents for the module; every wait is on a condition with a generous deadline.
"""

from __future__ import annotations

import json
import re
import threading
import time
from typing import Any

import pytest

from tests.agentproc import AgentProcess
from tests.coordination_rack import SHARED, EtcdRack, etcd_rack, incidents, metric, polls, results
from tests.helpers import wait_for

ZONE = {"node01": "zone-a", "node02": "zone-b", "node03": "zone-c"}


class Rack(EtcdRack):
    def reader(self, device: str) -> AgentProcess:
        """The agent that does not poll `device`: it reads the device from the pollers' facts."""
        return next(a for a in self.agents if not polls(a, device))

    def pollers(self, device: str) -> list[tuple[str, int]]:
        """(node, lease) of each slot holder of `device`, as etcd has them."""
        out = []
        for i in range(2):
            key = f"{self.root}/pollers/{device}/{i}"
            node = self.etcd.get(key)
            if node is not None:
                out.append((node.decode(), self.etcd.lease_of(key)))
        return out

    def forge(self, job: str, poller: str, doc: dict[str, Any], lease: int = 0) -> None:
        """Write a fact straight into etcd, as an attacker with write access would."""
        self.etcd.put(f"{self.root}/facts/{job}/{poller}", json.dumps(doc), lease)


def _with_dom(cfg: dict[str, Any], node: str, sim: Any) -> None:
    """Each node's own DOM source on (slowly): a source of the node's own that a forged fact aims at."""
    cfg["sources"]["dom"] = {"interval": 60.0, "timeout": 20.0, "dom_dir": str(sim.devices[f"links-{node}"].dom_dir)}


@pytest.fixture(scope="module")
def rack(tmp_path_factory):
    yield from etcd_rack(tmp_path_factory.mktemp("trust-facts"), _with_dom, Rack)


def rejected(agent: AgentProcess, why: str) -> float:
    return metric(agent, "supernode_coordination_rejected_records_total", key_kind="fact", why=why) or 0.0


def leak_fact(node: str, zone: str, wet: bool, at: float, sensor: str = "zone-1", device: str = "leak1",
              source: str = "leak", rows: list[list[Any]] | None = None) -> dict[str, Any]:
    """A fact document as an agent encodes it (agent.coordination.facts.encode), with any payload."""
    rows = rows if rows is not None else [
        ["supernode_leak_detected", 1.0 if wet else 0.0, {"zone": zone, "sensor": sensor}, "ok", at]]
    specs = {r[0]: ["gauge", "forged", sorted(r[2]), ""] for r in rows}
    return {"v": 1, "node": node, "source": source, "device": device, "up": True, "duration": 0.01, "at": at,
            "specs": specs, "r": rows}


def leak_open(agent: AgentProcess, zone: str) -> bool:
    return any(i["detector"] == "leak" and i["targets"].get("zone") == zone for i in incidents(agent).get("open", []))


def fact_rejections(agent: AgentProcess) -> dict[str, float]:
    """Every `why` of the agent's rejected facts so far, with its count."""
    status, body = agent.get("/metrics")
    assert status == 200
    return {m.group(1): float(m.group(2)) for m in re.finditer(
        r'^supernode_coordination_rejected_records_total\{key_kind="fact",why="([^"]*)"\} (\S+)$', body.decode(), re.M)}


def test_the_real_pollers_facts_are_all_taken(rack):
    """Before any forgery: every agent takes the real pollers' facts of the devices it does not poll (each device
    has one such reader: Modbus leak and CDU, SNMP PDU, Redfish CDU) and rejects none, so each later count of a
    rejection is the forger's."""
    rack.steady()
    readers = {rack.reader(d) for d in SHARED}
    taken = {a: metric(a, "supernode_coordination_facts_total", direction="in") or 0.0 for a in readers}
    for a in readers:
        wait_for(lambda: (metric(a, "supernode_coordination_facts_total", direction="in") or 0.0) >= taken[a] + 5,
                 60, what=f"{a.config['agent']['node']} taking the pollers' facts")
    for a in rack.agents:
        assert fact_rejections(a) == {}, a.config["agent"]["node"]


def test_a_wet_fact_from_a_node_that_holds_no_slot_moves_nobody(rack):
    rack.steady()
    target = rack.reader("leak1")
    node = target.config["agent"]["node"]
    zone = ZONE[node]
    before = {a: rejected(a, "not_member") for a in rack.agents}
    acted = {a: (len(results(a, "drain")), len(results(a, "gpu_power_cap"))) for a in rack.agents}
    forger = rack.etcd.lease_grant(60)  # its own lease: alive, but no member's and no slot's
    for i in range(10):
        rack.forge("leak/leak1", "ghost", leak_fact("ghost", zone, True, time.time()), forger)
        rack.forge("leak/leak1", "intruder", leak_fact("intruder", zone, True, time.time()))  # and without one
        time.sleep(0.1)  # pacing a forger's rewrites, not waiting for anything
    for a in rack.agents:
        wait_for(lambda: rejected(a, "not_member") >= before[a] + 20, 30,
                 what=f"{a.config['agent']['node']} counting the 20 forged facts")
    # Each forged fact was read and refused by then; a wet one taken would have opened the zone's leak at once.
    for a in rack.agents:
        assert not leak_open(a, zone), a.config["agent"]["node"]
        assert (len(results(a, "drain")), len(results(a, "gpu_power_cap"))) == acted[a]
    rack.etcd.delete(f"{rack.root}/facts/leak/leak1/ghost")
    rack.etcd.delete(f"{rack.root}/facts/leak/leak1/intruder")


def test_dry_facts_dated_in_the_future_do_not_hide_a_real_leak(rack):
    """The forger rewrites dry facts dated an hour ahead every 0.1 s, under a name of its own and under each real
    poller's key with that poller's own lease, while the simulator's leak controller reads a real leak."""
    rack.steady()
    target = rack.reader("leak1")
    node = target.config["agent"]["node"]
    zone = ZONE[node]
    pollers = rack.pollers("leak1")
    assert len(pollers) == 2
    before = {why: rejected(target, why) for why in ("future", "not_member")}
    seq = max((e["seq"] for e in results(target, "drain")), default=0)
    stop = threading.Event()

    def forger() -> None:
        for _ in range(1200):  # at most two minutes of rewrites
            if stop.is_set():
                return
            ahead = time.time() + 3600
            rack.forge("leak/leak1", "ghost", leak_fact("ghost", zone, False, ahead))
            for poller, lease in pollers:
                rack.forge("leak/leak1", poller, leak_fact(poller, zone, False, ahead), lease)
            stop.wait(0.1)

    writer = threading.Thread(target=forger, name="forger", daemon=True)
    writer.start()
    try:
        wait_for(lambda: rejected(target, "future") > before["future"], 30, what="a future-dated fact rejected")
        rack.sim.inject("leak", zone=zone)
        wait_for(lambda: [e for e in results(target, "drain", result="done", target=f"node={node}")
                          if e["seq"] > seq], 30, what=f"{node} drained while the forger writes")
        wait_for(lambda: results(target, "gpu_power_cap", result="done"), 30, what=f"{node}'s GPUs capped")
        assert writer.is_alive(), "the forger wrote all along"
        assert rejected(target, "not_member") > before["not_member"]
    finally:
        stop.set()
        writer.join(10)
        rack.etcd.delete(f"{rack.root}/facts/leak/leak1/ghost")
        rack.clear()


def test_a_fact_filed_under_the_leak_controller_cannot_write_a_nodes_own_source(rack):
    rack.steady()
    target = rack.reader("leak1")
    node = target.config["agent"]["node"]
    poller, lease = rack.pollers("leak1")[0]
    before = rejected(target, "mismatch")
    rows = [["supernode_transceiver_temperature_celsius", 99.0, {"port": "forged"}, "ok", time.time()]]
    rack.forge("leak/leak1", poller, leak_fact(poller, "", False, time.time(), source="dom", device=node, rows=rows),
               lease)
    wait_for(lambda: rejected(target, "mismatch") > before, 30, what="the foreign fact rejected")
    status, body = target.get("/api/v1/state")
    assert status == 200
    assert not [r for r in json.loads(body)["readings"] if r["labels"].get("port") == "forged"]


def test_forged_metric_and_label_names_never_reach_metrics(rack):
    """Under the real poller's key and lease: only the payload checks stand between these and the agents' stores
    (a reader keeps a shared device's series off its /metrics, but its detectors read them) or, filed as a
    node's own source, its /metrics."""
    rack.steady()
    target = rack.reader("leak1")
    node = target.config["agent"]["node"]
    poller, lease = rack.pollers("leak1")[0]
    now = time.time()
    wet = ["supernode_leak_detected", 1.0, {"sensor": "forged", "zone": "zone-a"}, "ok", now]
    forged = {
        "label_value": leak_fact(poller, "zone-a", True, now, rows=[wet]),
        "unknown_family": leak_fact(poller, "zone-a", True, now,
                                    rows=[["supernode_forged_celsius", 1.0, {"zone": "zone-a"}, "ok", now]]),
        "labels": leak_fact(poller, "zone-a", True, now, rows=[
            ["supernode_leak_detected", 1.0, {"sensor": "zone-1", "zone": "zone-a", "forged": "x"}, "ok", now]]),
        "mismatch": leak_fact(poller, "zone-a", True, now, source="dom", device=node, rows=[wet]),
    }
    before = {why: rejected(target, why) for why in forged}
    for doc in forged.values():
        rack.forge("leak/leak1", poller, doc, lease)
    for why in forged:
        wait_for(lambda: rejected(target, why) > before[why], 30, what=f"the forged fact rejected ({why})")
    for a in rack.agents:
        status, body = a.get("/metrics")
        assert status == 200
        text = body.decode()
        assert 'sensor="forged"' not in text and "supernode_forged_celsius" not in text and 'forged="x"' not in text
        status, body = a.get("/api/v1/state")
        assert status == 200
        assert not [r for r in json.loads(body)["readings"] if "forged" in json.dumps([r["metric"], r["labels"]])]
        assert not leak_open(a, "zone-a")
