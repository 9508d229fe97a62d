"""NVLink switch trays as inventory (issue 34): the schema's checks, and a simulated switch tray read over Redfish.

A switch tray has no agent of its own: the rack's agents read its BMC (a shared rack device, like a CDU) for
its health, its temperatures and its leak detectors, and its leak is a leak of its zone. The real-daemon story
(a switch tray leak drains and caps its zone's node) is in test_redfish_sim_agent.py.
"""

from __future__ import annotations

import asyncio
import math

import pytest

from agent.config import parse_config
from agent.coordination.etcd_auth import rack_roles
from agent.coordination.shared import shared_devices
from agent.sources import polled_redfish, redfish_client
from exporters.model import Quality
from exporters.redfish.source import RedfishSource
from sim.demo import agent_config
from sim.harness import sim_rack
from sim.rack import RackModel
from tests.helpers import free_port
from tests.test_config import assert_named
from tests.test_redfish_config import rack

SWITCH = {"name": "bmc-switch01", "kind": "switch", "url": "https://10.0.0.31"}
TRAY = {"name": "switch01", "chips": [0, 1], "zone": "zone-a", "bmc": "bmc-switch01"}


def switch_rack(tmp_path, *trays: dict) -> dict:
    cfg = rack(tmp_path)
    inv = cfg["inventory"]
    inv["redfish"] += [dict(SWITCH), dict(SWITCH, name="bmc-switch02", url="https://10.0.0.32")]
    inv["switch_trays"] = [dict(t) for t in trays] or [dict(TRAY), dict(TRAY, name="switch02", chips=[2, 3],
                                                                        zone="zone-b", bmc="bmc-switch02")]
    return cfg


def _sw(c: dict, i: int = 0) -> dict:
    return c["inventory"]["switch_trays"][i]


def test_switch_trays_load_with_their_zone_and_the_switch_profile(tmp_path):
    inv = parse_config(switch_rack(tmp_path)).config.inventory
    bmc = next(e for e in inv.redfish if e.name == "bmc-switch02")
    assert bmc.profile == "dmtf-switch"  # the default for kind switch: chassis health and temperatures too
    assert inv.redfish_zone(bmc) == "zone-b"  # its switch tray's zone: its leak is a leak there
    assert [t.chips for t in inv.switch_trays] == [[0, 1], [2, 3]]


@pytest.mark.parametrize("mutate, field, expect", [
    (lambda c: _sw(c).update(chips=[0, 18]), "inventory.switch_trays.0.chips.1", "less than 18"),
    (lambda c: _sw(c).update(chips=[-1]), "inventory.switch_trays.0.chips.0", "greater than or equal to 0"),
    (lambda c: _sw(c).update(chips=[]), "inventory.switch_trays.0.chips", "at least 1"),
    (lambda c: _sw(c, 1).update(chips=[1, 2]), "switch_trays.switch02.chips", "chip 1 is already in switch01"),
    (lambda c: _sw(c).update(chips=[4, 4]), "switch_trays.switch01.chips", "chip 4 is already in this tray"),
    (lambda c: _sw(c).update(zone="zone-q"), "switch_trays.switch01.zone", "'zone-q' not in inventory.leak_zones"),
    (lambda c: _sw(c).update(bmc="bmc-nowhere"), "switch_trays.switch01.bmc", "'bmc-nowhere' not in inventory.redfish"),
    (lambda c: _sw(c).update(bmc="node01-bmc"), "switch_trays.switch01.bmc", "of kind tray, expected kind switch"),
    (lambda c: _sw(c, 1).update(bmc="bmc-switch01"), "switch_trays.switch02.bmc", "already the BMC of switch01"),
    (lambda c: _sw(c, 1).update(name="switch01"), "inventory", "switch_trays: name 'switch01' appears twice"),
    (lambda c: _sw(c).pop("zone"), "inventory.switch_trays.0.zone", "required field missing"),
    (lambda c: c["inventory"]["switch_trays"].pop(1), "redfish.bmc-switch02",
     "kind switch but no inventory.switch_trays entry names it"),
    (lambda c: c["inventory"]["redfish"][2].update(node="node01"), "inventory.redfish.2", "only for kind tray"),
    (lambda c: c["inventory"]["redfish"][2].update(zone="zone-a"), "inventory.redfish.2",
     "zone: not for kind switch"),
    (lambda c: c["inventory"]["redfish"][2].update(profile="no-such"), "inventory.redfish.bmc-switch01.profile",
     "no profile 'no-such'"),
])
def test_bad_switch_tray_fields_are_named(tmp_path, mutate, field, expect):
    assert_named(switch_rack(tmp_path), mutate, field, expect, tmp_path)


def test_a_switch_tray_bmc_is_a_shared_safety_device_with_etcd_grants(tmp_path):
    """Every agent of its zone must see its leak: shared (its pollers' facts reach every agent), a safety input
    (read by every agent, bounded, while coordination is lost), and each node's etcd role may write its facts."""
    cfg = parse_config(switch_rack(tmp_path))
    shared = shared_devices(cfg.config.inventory)
    assert shared.jobs["redfish/bmc-switch01"] == "bmc-switch01"
    assert {"redfish/bmc-switch01", "redfish/bmc-switch02"} <= shared.safety
    assert {e.name for e in polled_redfish(cfg)} >= {"bmc-switch01", "bmc-switch02"}
    roles = {role.node: [p.key for p in role.permissions]
             for role in rack_roles(cfg.config.inventory, "r01", "/supernode-agent")}
    for node in ("node01", "node02"):
        assert f"/supernode-agent/r01/facts/redfish/bmc-switch01/{node}" in roles[node], roles[node]


@pytest.mark.parametrize("nodes, trays", [(18, 9), (2, 1), (5, 3), (40, 9)])
def test_the_simulated_rack_has_a_switch_tray_per_two_compute_trays(nodes, trays):
    model = RackModel(nodes=nodes, gpus_per_node=1,
                      leak_zones={f"zone-{i}": [f"node{i + 1:02d}"] for i in range(nodes)})
    assert len(model.switch_trays) == trays
    chips = [c for t in model.switch_trays.values() for c in t.chips]
    assert chips == list(range(2 * trays))  # tray j holds chips 2(j-1), 2(j-1)+1, each once
    assert model.switch_trays["switch01"].zone == "zone-0" and \
        model.switch_trays[f"switch{trays:02d}"].zone == f"zone-{2 * (trays - 1)}"


def _by(readings, name: str) -> dict:
    return {tuple(sorted(r.labels.items())): r for r in readings if r.spec.name == name}


def test_a_simulated_switch_tray_is_read_for_health_temperatures_and_leaks(tmp_path):
    with sim_rack(tmp_path) as r:
        for name in ("admin.token", "webhook.token"):
            (tmp_path / name).write_text("token-for-tests\n")
        loaded = parse_config(agent_config(r.sim, "node01", free_port(), tmp_path))
        inv = loaded.config.inventory
        assert [(t.name, t.chips, t.zone, t.bmc) for t in inv.switch_trays] == \
            [("switch01", [0, 1], "zone-a", "bmc-switch01")]
        ep = next(e for e in inv.redfish if e.kind == "switch")

        async def poll():
            src = RedfishSource(ep.name, redfish_client(loaded, ep), kind=ep.kind, profile=ep.profile,
                                zone=inv.redfish_zone(ep), events="off")
            try:
                return (await src.poll()).readings
            finally:
                await src.close()

        dry = asyncio.run(asyncio.wait_for(poll(), 60))
        supply = r.sim.model.coolant.secondary_supply_c
        temps = {dict(k)["sensor"]: v.value for k, v in _by(dry, "supernode_redfish_temperature_celsius").items()}
        # the chips' and the inlet's sensors, each at the model's value; the power sensor is not a temperature
        assert set(temps) == {"NVSwitch_0_Temp", "NVSwitch_1_Temp", "Inlet_Temp"}
        assert temps["Inlet_Temp"] == pytest.approx(supply, abs=0.2)
        assert temps["NVSwitch_0_Temp"] == pytest.approx(supply + 30, abs=0.2)
        health = {(dict(k)["kind"], dict(k)["resource"]): v.value
                  for k, v in _by(dry, "supernode_redfish_health").items()}
        assert health[("chassis", "Chassis_0")] == 0
        info = [x for x in dry if x.spec.name == "supernode_redfish_service_info"]
        assert info[0].labels["kind"] == "switch" and info[0].labels["profile"] == "dmtf-switch"
        leaks = {dict(k)["sensor"]: v for k, v in _by(dry, "supernode_leak_detected").items()}
        assert set(leaks) == {"bmc-switch01/Chassis_0/Chassis_0_LeakDetector_ColdPlate",
                              "bmc-switch01/Chassis_0/Chassis_0_LeakDetector_Manifold"}
        assert all(v.value == 0 and v.labels["zone"] == "zone-a" for v in leaks.values())

        r.inject("switch-tray-leak", tray="switch01", detector="1")
        wet = asyncio.run(asyncio.wait_for(poll(), 60))
        leaks = {dict(k)["sensor"]: v for k, v in _by(wet, "supernode_leak_detected").items()}
        manifold = leaks["bmc-switch01/Chassis_0/Chassis_0_LeakDetector_Manifold"]
        assert manifold.value == 1 and manifold.quality is Quality.OK and manifold.labels["zone"] == "zone-a"
        assert leaks["bmc-switch01/Chassis_0/Chassis_0_LeakDetector_ColdPlate"].value == 0
        states = {dict(k)["detector"]: v.value for k, v in _by(wet, "supernode_leak_detector_state").items()}
        assert states == {"Chassis_0_LeakDetector_ColdPlate": 0, "Chassis_0_LeakDetector_Manifold": 2}
        health = {(dict(k)["kind"], dict(k)["resource"]): v.value
                  for k, v in _by(wet, "supernode_redfish_health").items()}
        assert health[("chassis", "Chassis_0")] == 2  # the tray's own health rolls its detectors up
        assert not any(math.isnan(x.value) for x in wet if x.spec.name == "supernode_redfish_temperature_celsius")


def test_the_switch_tray_leak_fault_names_what_is_wrong(tmp_path):
    from sim.faults import FaultError

    with sim_rack(tmp_path) as r:
        with pytest.raises(FaultError, match=r"tray: 'switch09' is not a simulated switch tray \(switch01\)"):
            r.inject("switch-tray-leak", tray="switch09")
        with pytest.raises(FaultError, match="detector: 5 out of range 0..1"):
            r.inject("switch-tray-leak", tray="switch01", detector="5")
        assert r.sim.state()["switch_trays"] == {"switch01": {"chips": [0, 1], "zone": "zone-a", "leaks": {}}}
