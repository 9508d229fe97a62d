"""The real daemon reading a Redfish service (DMTF's mockup under sushy-static) as node01's tray BMC."""

from __future__ import annotations

import json
import re

import pytest

from tests.agentproc import base_config, running_agent
from tests.helpers import wait_for
from tests.redfish_peer import copy_mockup, edit_resource, sushy_static
from tests.slurm import running_cluster

ADMIN = "admin-token-for-tests"
DETECTOR = "/redfish/v1/Chassis/CDU/LeakDetectors/Moisture"


@pytest.fixture(scope="module")
def cluster():
    yield from running_cluster(["node01", "node02"])


def tray_config(tmp_path, peer, cluster, **redfish) -> dict:
    cfg = base_config(tmp_path)
    cfg["agent"]["mode"] = "enforce"
    cfg["inventory"] = {"nodes": ["node01", "node02"],
                        "leak_zones": [{"name": "zone-a", "nodes": ["node01"]}, {"name": "zone-b", "nodes": ["node02"]}],
                        "redfish": [{"name": "node01-bmc", "kind": "tray", "node": "node01", "url": peer["url"],
                                     "ca_file": str(peer["ca"])}]}
    cfg["sources"]["redfish"] = {"interval": 0.5, "timeout": 1.0, "request_timeout": 0.9, **redfish}
    cfg["remediation"] = {"slurm": {"slurm_conf": str(cluster.conf)},
                          "guardrails": {"max_drained_fraction": 1.0, "cooldown_seconds": 0}}
    return cfg


def _up(text: str) -> float | None:
    m = re.search(r'^supernode_source_up\{device="node01-bmc",source="redfish"\} (\S+)$', text, re.M)
    return float(m.group(1)) if m else None


def test_a_tray_leak_drains_that_node_in_real_slurm(cluster, tmp_path):
    cluster.scontrol("update", "NodeName=node01", "State=RESUME")
    wait_for(lambda: cluster.states().get("node01") == "idle", 30, what="node01 idle at the start")
    mockup = copy_mockup("public-cooling-unit", tmp_path)
    with sushy_static(mockup, tmp_path) as peer, running_agent(tray_config(tmp_path, peer, cluster), tmp_path) as agent:
        wait_for(lambda: _up(agent.metrics()) == 1.0, 20, what="node01-bmc polled")
        assert 'supernode_leak_detected{sensor="node01-bmc/CDU/Moisture",zone="zone-a"} 0.0' in agent.metrics()
        # The leak watch knows the tray's detectors once the tree is walked: an unreadable tray is an unknown zone.
        wait_for(lambda: 'supernode_leak_sensor_fault{fault="source_down",sensor="node01-bmc/CDU/Moisture",'
                         'zone="zone-a"} 0.0' in agent.metrics(), 20, what="the leak watch covering the tray")
        edit_resource(mockup, DETECTOR, DetectorState="Critical", Status={"State": "Enabled", "Health": "Critical"})
        wait_for(lambda: cluster.states().get("node01") == "drained", 30, what="node01 drained by the tray leak")
        status, body = agent.get("/api/v1/incidents", token=ADMIN)
        leak = next(i for i in json.loads(body)["open"] if i["detector"] == "leak_tray")
        assert leak["targets"] == {"zone": "zone-a", "tray": "node01"}  # the tray's own leak (issue 35's scope)
        assert cluster.states().get("node02") == "idle"  # another node's zone: untouched
        status, body = agent.get("/api/v1/journal", token=ADMIN)
        rows = json.loads(body)["entries"]
        assert any(r["kind"] == "intent" and r["action"] == "drain" and r["target"] == "node=node01" for r in rows)
    cluster.scontrol("update", "NodeName=node01", "State=RESUME")
