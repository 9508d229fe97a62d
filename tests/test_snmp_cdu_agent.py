"""The SNMP CDU in the real daemon, against the simulated rack whose CDU speaks SNMP (`--cdu-protocol snmp`) and a
real Slurm: its loop reaches /metrics in the Modbus CDU's families, a leak on it drains its zone's node, and a CDU
that stops answering makes its leak input unknown, never dry."""

from __future__ import annotations

import json

import pytest

from sim.demo import agent_config
from sim.harness import sim_rack
from tests.agentproc import running_agent
from tests.helpers import free_port, wait_for
from tests.slurm import node_states, running_cluster

TOKEN = "token-for-tests"


@pytest.fixture(scope="module")
def cluster():
    yield from running_cluster(["node01", "node02"])


def test_a_leak_on_the_snmp_cdu_drains_its_zone_and_a_silent_cdu_is_unknown(cluster, tmp_path):
    with sim_rack(tmp_path, cdu_protocol="snmp") as rack:
        for name in ("admin.token", "webhook.token"):
            (tmp_path / name).write_text(TOKEN + "\n")
        cfg = agent_config(rack.sim, "node01", free_port(), tmp_path, mode="enforce", slurm_conf=cluster.conf)
        inv = cfg["inventory"]
        # the SNMP CDU is the one leak source: no leak controller, no Modbus door, no Redfish detector
        (cdu1,) = [c for c in inv["cdus"] if c["name"] == "cdu1"]
        assert cdu1["protocol"] == "snmp" and cdu1["channels"] == {1: "zone-a", 2: "zone-b"}
        inv.update(cdus=[cdu1], leak_controllers=[], redfish=[], switch_trays=[])
        inv.pop("rack_units", None)
        cfg["remediation"]["guardrails"].update(cooldown_seconds=0)
        with running_agent(cfg, tmp_path) as agent:
            def both_up() -> str | None:
                t = agent.metrics()
                up = 'supernode_source_up{device="cdu1",source="leak"} 1.0' in t and 'supernode_cdu_info{cdu="cdu1"' in t
                return t if up else None
            text = wait_for(both_up, 60, what="both cdu1 sources up")
            assert 'supernode_cdu_temperature_celsius{cdu="cdu1",loop="secondary",point="supply"}' in text
            assert 'supernode_leak_detected{sensor="inrow-leak",zone="zone-a"} 0.0' in text
            assert 'profile="apc-inrow-rc"' in text
            rack.inject("leak", zone="zone-a")

            def incident() -> dict | None:
                status, body = agent.get("/api/v1/incidents", token=TOKEN)
                return next((i for i in json.loads(body)["open"] if i["detector"] == "leak"), None)
            inc = wait_for(incident, 30, what="a leak incident from the SNMP CDU")
            assert inc["targets"]["zone"] == "zone-a"
            assert "inrow-leak" in json.dumps(inc["detail"])
            wait_for(lambda: node_states(cluster)["node01"] in ("drained", "draining"), 30, what="node01 drained")
            assert node_states(cluster)["node02"] == "idle"  # zone-b's node: its channel is dry
            # the CDU stops answering: its leak input is unknown (source_down 1), never read as dry
            rack.inject("cdu-offline", device="cdu1")
            wait_for(lambda: 'supernode_leak_sensor_fault{fault="source_down",sensor="inrow-leak",zone="zone-a"} 1.0'
                     in agent.metrics(), 30, what="the silent SNMP CDU's leak input unknown")
    for node in ("node01", "node02"):
        cluster.scontrol("update", f"NodeName={node}", "State=RESUME")
