"""The real daemon against the simulator's BACnet/IP CDU (legacy BACpypes, `--cdu-protocol bacnet`) and real Slurm.

The rack's CDU (cdu1) speaks BACnet; the same coolant model, zones and valves as the Modbus one. A leak on it is
pushed (COV) with polling slowed to 600 s, drains its zone's node in Slurm and closes the zone valve through a
priority-array write once a person approves; a CDU that stops answering or answers errors is a down source whose
zones are a critical unknown, as for Modbus; its flow drop opens the same coolant incident as a Modbus CDU's.
"""

from __future__ import annotations

import json
import re

import pytest

from sim.demo import agent_config
from sim.harness import sim_rack
from tests.agentproc import incidents, metric, running_agent
from tests.helpers import free_port, wait_for
from tests.slurm import running_cluster

TOKEN = "token-for-tests"


@pytest.fixture(scope="module")
def cluster():
    yield from running_cluster(["node01", "node02"])


def _config(rack, tmp_path, slurm_conf=None, leak_interval: float = 0.5) -> dict:
    for name in ("admin.token", "webhook.token"):
        (tmp_path / name).write_text(TOKEN + "\n")
    cfg = agent_config(rack.sim, "node01", free_port(), tmp_path, mode="enforce", slurm_conf=slurm_conf)
    if slurm_conf is None:
        cfg["remediation"]["slurm"] = {"backend": "simulated"}
    inv = cfg["inventory"]
    (cdu1,) = [c for c in inv["cdus"] if c["name"] == "cdu1"]
    assert cdu1["protocol"] == "bacnet" and cdu1["channels"]
    # Only the BACnet CDU reads the zones' leak ropes: the Modbus leak controller and the Redfish services are out.
    inv["leak_controllers"], inv["redfish"] = [], []
    for key in ("switch_trays", "rack_units"):  # they name Redfish services
        inv.pop(key, None)
    cfg["sources"]["leak"] = {"interval": leak_interval, "timeout": min(2.0, leak_interval)}
    cfg["remediation"]["detectors"] = {"leak": {"fire_seconds": 0, "clear_seconds": 0.5},
                                       "leak_source_down": {"fire_seconds": 0, "clear_seconds": 0.5}}
    return cfg


def _metric(agent, name: str, **labels: str) -> float | None:
    return metric(agent, name, **labels)


def _incidents(agent) -> dict:
    return incidents(agent, TOKEN)


def _open(agent, detector: str) -> list[dict]:
    return [i for i in _incidents(agent)["open"] if i["detector"] == detector]


def _device(rack):
    return rack.sim.devices["cdu1"].process


def test_a_leak_on_the_bacnet_cdu_is_pushed_and_drains_its_zone_in_slurm(cluster, tmp_path):
    """Leak polls 600 s apart: a drain within the test's minute can only come from the COV notification (and the
    detector's confirmation re-read); the valve close waits for a person, then goes out as a BACnet write."""
    cluster.scontrol("update", "NodeName=node01", "State=RESUME")
    wait_for(lambda: cluster.states().get("node01") == "idle", 30, what="node01 idle at the start")
    with sim_rack(tmp_path, cdu_protocol="bacnet") as rack, \
            running_agent(_config(rack, tmp_path, slurm_conf=cluster.conf, leak_interval=600), tmp_path) as agent:
        wait_for(lambda: _metric(agent, "supernode_bacnet_cov_up", device="cdu1", source="leak") == 1.0, 60,
                 what="cdu1's leak inputs pushed (COV confirmed)")
        assert _metric(agent, "supernode_leak_detected", zone="zone-a", sensor="cdu-leak-1") == 0.0
        reads = rack.call(_device(rack).stats())["ReadPropertyMultipleRequest"]
        rack.inject("leak", zone="zone-a")
        wait_for(lambda: cluster.states().get("node01") == "drained", 60, what="node01 drained in Slurm")
        (leak,) = _open(agent, "leak")
        assert leak["targets"] == {"zone": "zone-a"}
        # The notification, then one confirmation read of the leak inputs (and at most a coolant poll): no timed one.
        assert rack.call(_device(rack).stats())["ReadPropertyMultipleRequest"] - reads <= 3
        assert cluster.states().get("node02") == "idle"

        (p,) = wait_for(lambda: [p for p in _incidents(agent)["pending_approvals"]
                                 if p["action"] == "cdu_write" and p["phase"] == "apply"], 30,
                        what="the zone valve close waiting for a person")
        assert agent.request("POST", f"/api/v1/incidents/{p['id']}/approve", token=TOKEN)[0] == 200
        wait_for(lambda: rack.sim.model.coolant.valve_open["zone-a"] is False, 30,
                 what="zone-a's valve closed by the BACnet write")
        assert rack.sim.model.coolant.valve_open["zone-b"] is True
    cluster.scontrol("update", "NodeName=node01", "State=RESUME")


def _source_down(agent) -> dict[tuple[str, str], float]:
    return {(m.group(2), m.group(1)): float(m.group(3)) for m in re.finditer(
        r'^supernode_leak_sensor_fault\{fault="source_down",sensor="([^"]*)",zone="([^"]*)"\} (\S+)$',
        agent.metrics(), re.M)}


def test_a_bacnet_cdu_that_keeps_silent_or_errs_is_a_down_source_and_its_zones_unknown(tmp_path):
    inputs = {("zone-a", "cdu-leak-1"), ("zone-b", "cdu-leak-2")}
    with sim_rack(tmp_path, cdu_protocol="bacnet") as rack, running_agent(_config(rack, tmp_path), tmp_path) as agent:
        wait_for(lambda: {k: v for k, v in _source_down(agent).items() if k in inputs} == dict.fromkeys(inputs, 0.0),
                 60, what="cdu1's leak inputs known (source_down 0)")
        for mode, kind in (("mute", "timeout"), ("error", "protocol")):
            rack.call(_device(rack).command({"mode": mode}))
            opened = wait_for(lambda: sorted(i["targets"]["zone"] for i in _open(agent, "leak_source_down"))
                              == ["zone-a", "zone-b"] and _open(agent, "leak_source_down"), 60,
                              what=f"a critical unknown per zone of the {mode} CDU")
            assert {i["severity"] for i in opened} == {"critical"}
            wait_for(lambda: all(_source_down(agent).get(k) == 1.0 for k in inputs)
                     and _metric(agent, "supernode_source_up", source="leak", device="cdu1") == 0.0
                     and _metric(agent, "supernode_leak_detected", zone="zone-a", sensor="cdu-leak-1") is None,
                     60, what="source down, its leak series replaced by source_down 1")
            assert _metric(agent, "supernode_source_errors_total", source="leak", device="cdu1", kind=kind) >= 1
            assert not _open(agent, "leak")
            rack.call(_device(rack).command({"mode": "normal"}))
            wait_for(lambda: not _open(agent, "leak_source_down")
                     and _metric(agent, "supernode_source_up", source="leak", device="cdu1") == 1.0, 60,
                     what=f"known again once the CDU answers (after {mode})")
        status, body = agent.get("/api/v1/journal", token=TOKEN)
        acted = {e["action"] for e in json.loads(body)["entries"] if e["kind"] == "intent"}
        assert not acted & {"drain", "cdu_write", "power_cap"}  # an unknown zone only notifies
        assert all(rack.sim.model.coolant.valve_open.values())

        # The coolant detectors read the BACnet CDU as they read a Modbus one (the same families): a flow drop
        # opens the same coolant_flow_low incident, targeted at cdu1.
        rack.inject("flow-drop", percent=40)
        wait_for(lambda: any(i["targets"] == {"cdu": "cdu1"} for i in _open(agent, "coolant_flow_low")), 60,
                 what="coolant_flow_low on the BACnet CDU")
