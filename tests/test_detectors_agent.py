"""Issue 16 items 5 and 6 with the real daemon against the simulated rack (real Modbus devices).

A leak source that stops answering becomes a critical "unknown" incident per
zone with explicit `fault="source_down"` series (never silence, never a
destructive action); lowering a CDU's pump set point is not a flow fault,
while a real flow drop after it still is.
"""

from __future__ import annotations

import asyncio
import json
import re
from types import SimpleNamespace

from sim.demo import agent_config
from exporters.cooling.modbus import ModbusSource
from exporters.cooling.modbus_control import write_control_point
from tests.agentproc import running_agent
from tests.helpers import free_port, wait_for
from sim.harness import sim_rack

TOKEN = "token-for-tests"


def _config(rack, tmp_path, **detectors):
    for name in ("admin.token", "webhook.token"):
        (tmp_path / name).write_text(TOKEN + "\n")
    cfg = agent_config(rack.sim, "node01", free_port(), tmp_path, mode="enforce")
    cfg["remediation"]["slurm"] = {"backend": "simulated"}
    if detectors:
        cfg["remediation"]["detectors"] = detectors
    return cfg


def _incidents(agent) -> dict:
    status, body = agent.get("/api/v1/incidents", token=TOKEN)
    assert status == 200, body
    return json.loads(body)


def _source_down(text: str) -> dict[tuple[str, str], float]:
    out = {}
    for m in re.finditer(r'^supernode_leak_sensor_fault\{fault="source_down",sensor="([^"]*)",zone="([^"]*)"\} (\S+)$',
                         text, re.M):
        out[(m.group(2), m.group(1))] = float(m.group(3))
    return out


def _last_success(text: str, source: str, device: str) -> float:
    m = re.search(rf'^supernode_source_last_success_timestamp_seconds\{{device="{device}",source="{source}"\}} (\S+)$',
                  text, re.M)
    return float(m.group(1)) if m else 0.0


def test_a_dead_leak_source_is_a_critical_unknown_zone_not_silence(tmp_path):
    with sim_rack(tmp_path) as rack:
        cfg = _config(rack, tmp_path)
        leak1 = next(d for d in cfg["inventory"]["leak_controllers"] if d["name"] == "leak1")
        zones = sorted(set(leak1["channels"].values()))
        assert zones
        gpus = rack.sim.model.nodes["node01"].gpus
        limits = [g.power_limit_mw for g in gpus]
        with running_agent(cfg, tmp_path) as agent:
            # While it answers, every leak1 input is explicitly "not unknown" (0), next to its real series.
            inputs = ModbusSource("leak", "leak1", leak1["profile"], channels=leak1["channels"]).leak_sensors()
            assert sorted({z for z, _ in inputs}) == zones
            def answering() -> dict[tuple[str, str], float]:
                found = {k: v for k, v in _source_down(agent.metrics()).items() if k in inputs}
                return found if sorted(found) == inputs and set(found.values()) == {0.0} else {}

            known = wait_for(answering, 60, what="source_down 0 for each of leak1's inputs")
            sensors = sorted({s for _, s in known})
            assert all(f'sensor="{s}"' in agent.metrics() for s in sensors)

            rack.inject("cdu-offline", device="leak1")

            def unknown_incidents() -> list[dict]:
                found = [i for i in _incidents(agent)["open"] if i["detector"] == "leak_source_down"]
                return found if sorted(i["targets"]["zone"] for i in found) == zones else []

            opened = wait_for(unknown_incidents, 60, what="a leak_source_down incident per zone of leak1")
            assert {i["severity"] for i in opened} == {"critical"}

            def unknown_not_silent() -> bool:
                text = agent.metrics()
                down = _source_down(text)
                leak_lines = [l for l in text.splitlines() if l.startswith("supernode_leak_detected{")
                              and any(f'sensor="{s}"' in l for s in sensors)]
                return all(down.get(k) == 1.0 for k in known) and not leak_lines

            # The stale leak series are gone; in their place each input says "source_down" 1.
            wait_for(unknown_not_silent, 60, what="leak1's leak series replaced by source_down=1")
            assert not any(i["detector"] == "leak" for i in _incidents(agent)["open"])

            rack.clear()
            wait_for(lambda: not any(i["detector"] == "leak_source_down" for i in _incidents(agent)["open"]), 60,
                     what="the unknown state clears when leak1 answers again")
            wait_for(lambda: set(_source_down(agent.metrics()).get(k) for k in known) == {0.0}, 60,
                     what="leak1's inputs known again")
            status, body = agent.get("/api/v1/journal", token=TOKEN)
            entries = json.loads(body)["entries"]
            view = _incidents(agent)
            ids = {i["id"] for i in view["open"] + view["recent"] if i["detector"] == "leak_source_down"}
            assert {i["id"] for i in opened} <= ids
            acted = {e["action"] for e in entries if e.get("incident_id") in ids and e["kind"] == "intent"}
            # Notify only: an unknown state never caps, drains or closes a valve.
            assert acted <= {"notify"}, acted
            assert not [e for e in entries if e["kind"] == "intent" and e["action"] in ("drain", "cdu_write")]
            assert [g.power_limit_mw for g in gpus] == limits
            assert all(rack.sim.model.coolant.valve_open.values())


def test_lowering_the_pump_set_point_is_not_a_flow_fault_but_a_later_drop_is(tmp_path):
    settle = 2.0
    with sim_rack(tmp_path) as rack:
        cfg = _config(rack, tmp_path, flow_setpoint_settle_seconds=settle)
        cdu1 = next(d for d in cfg["inventory"]["cdus"] if d["name"] == "cdu1")
        gpus = rack.sim.model.nodes["node01"].gpus
        limits = [g.power_limit_mw for g in gpus]
        with running_agent(cfg, tmp_path) as agent:
            first = wait_for(lambda: _last_success(agent.metrics(), "cdu", "cdu1"), 60, what="a cdu1 poll")
            wait_for(lambda: _last_success(agent.metrics(), "cdu", "cdu1") > first + 2, 60, what="a flow baseline")
            before = rack.sim.model.coolant.flow_lpm
            device = SimpleNamespace(profile=cdu1["profile"], host=cdu1["host"], port=cdu1["port"], unit=None)
            assert asyncio.run(write_control_point(device, "pump_speed_setpoint", 40.0)) == 40.0
            assert rack.sim.model.coolant.flow_lpm < 0.7 * before  # as deep as a failing pump
            changed = wait_for(lambda: 'supernode_cdu_pump_speed_setpoint_ratio{cdu="cdu1"} 0.4' in agent.metrics()
                               and _last_success(agent.metrics(), "cdu", "cdu1"), 60, what="the agent saw the change")
            # Polls well past settle + the flow hold time (2 s) at the new, lower flow.
            wait_for(lambda: _last_success(agent.metrics(), "cdu", "cdu1") > changed + settle + 6, 60,
                     what="cdu1 polled long after the change")
            view = _incidents(agent)
            assert not [i for i in view["open"] + view["recent"] if i["detector"] == "coolant_flow_low"]
            assert [g.power_limit_mw for g in gpus] == limits  # the rack is not capped

            rack.inject("flow-drop", percent=40)
            wait_for(lambda: any(i["detector"] == "coolant_flow_low" and i["targets"] == {"cdu": "cdu1"}
                                 for i in _incidents(agent)["open"]), 60,
                     what="a real drop from the new baseline fires")
