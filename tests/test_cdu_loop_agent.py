"""Issue 35 with the real daemon against the simulated rack: every CDU protocol feeds the coolant detectors.

The simulator's Modbus CDU (cdu1) and its Redfish CDU (rfcdu1, over HTTPS with the run's CA and a session,
as `supernode-sim demo` configures the agent) show one and the same loop, so one injected flow drop appears on
both protocols: each must open the same coolant incident (detector, severity, playbook), targeted at its CDU.
"""

from __future__ import annotations

import json
import re

from sim.demo import agent_config
from sim.harness import sim_rack
from tests.agentproc import running_agent
from tests.helpers import free_port, wait_for

TOKEN = "token-for-tests"


def _config(rack, tmp_path, **detectors) -> dict:
    for name in ("admin.token", "webhook.token"):
        (tmp_path / name).write_text(TOKEN + "\n")
    cfg = agent_config(rack.sim, "node01", free_port(), tmp_path, mode="enforce")
    cfg["remediation"]["detectors"] = {"flow_setpoint_settle_seconds": 0, **detectors}
    return cfg


def _incidents(agent) -> dict:
    status, body = agent.get("/api/v1/incidents", token=TOKEN)
    assert status == 200, body
    return json.loads(body)


def _polls(agent, source: str, device: str) -> float:
    m = re.search(rf'^supernode_source_last_success_timestamp_seconds\{{device="{device}",source="{source}"\}} (\S+)$',
                  agent.metrics(), re.M)
    return float(m.group(1)) if m else 0.0


def _after_two_polls(agent) -> None:
    """Both CDUs polled twice since now: their flow baselines hold a healthy sample each."""
    start = {d: _polls(agent, s, d) for s, d in (("cdu", "cdu1"), ("redfish", "rfcdu1"))}
    for (source, device), t0 in zip((("cdu", "cdu1"), ("redfish", "rfcdu1")), start.values()):
        first = wait_for(lambda: _polls(agent, source, device) > t0 and _polls(agent, source, device), 60,
                         what=f"a {device} poll")
        wait_for(lambda: _polls(agent, source, device) > first, 60, what=f"a second {device} poll")


def test_a_redfish_cdu_flow_drop_opens_the_same_coolant_incident_as_a_modbus_cdu_flow_drop(tmp_path):
    with sim_rack(tmp_path) as rack:
        cfg = _config(rack, tmp_path)
        with running_agent(cfg, tmp_path) as agent:
            _after_two_polls(agent)
            assert not [i for i in _incidents(agent)["open"] if i["detector"] == "coolant_flow_low"]
            rack.inject("flow-drop", percent=40)

            def both() -> dict[str, dict] | None:
                got = {i["targets"].get("cdu"): i for i in _incidents(agent)["open"]
                       if i["detector"] == "coolant_flow_low"}
                return got if {"cdu1", "rfcdu1"} <= set(got) else None
            got = wait_for(both, 60, what="a coolant_flow_low incident from each CDU protocol")
            modbus, redfish = got["cdu1"], got["rfcdu1"]
            assert redfish["targets"] == {"cdu": "rfcdu1"}
            for key in ("detector", "severity", "playbook"):
                assert redfish[key] == modbus[key], key
            assert redfish["playbook"] == "coolant-degraded"
            # the loop evidence the derate reads comes from the Redfish connector too
            assert redfish["detail"]["flow_cubic_meters_per_second"] > 0
            assert redfish["detail"]["flow_ratio"] < 0.7
