"""Component failures, MTBF and MTTR: the class table, the engine's counters, the journal report, the rules."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys

import pytest
import yaml
from prometheus_client import CollectorRegistry

from agent.config import Inventory
from agent.reliability import (CLASSES, RACK_CLASSES, ComponentCollector, ObservedTime, agent_runs, classify,
                               component_counts, format_report, reliability_report)
from agent.remediation.journal import Journal

from tests.helpers import REPO, await_for
from tests.remediation_support import engine

ZONES = {"zone-a": ["node01"], "zone-b": ["node02"], "zone-ab": ["node01", "node02"]}


@pytest.mark.parametrize("detector, targets, detail, expected", [
    ("gpu_lost", {"node": "node01"}, {"gpu": "2"}, ("gpu", "node01/gpu2")),
    ("gpu_lost", {"node": "node01", "gpu": "missing"}, {}, ("gpu", "node01/gpumissing")),
    ("gpu_thermal", {"node": "node01", "gpu": "1"}, {}, ("gpu", "node01/gpu1")),
    ("gpu_reset_required", {"node": "node01", "gpu": "3"}, {}, ("gpu", "node01/gpu3")),
    ("gpu_reboot_required", {"node": "node01"}, {"gpus": [{"gpu": "1"}, {"gpu": "0"}]}, ("gpu", "node01/gpu0,1")),
    ("gpu_pcie_degraded", {"node": "node01", "gpu": "1"}, {}, ("gpu", "node01/gpu1")),
    ("gpu_clock_slowdown", {"node": "node01", "gpu": "2"}, {}, ("gpu", "node01/gpu2")),
    ("nvlink_errors", {"node": "node01", "gpu": "0"}, {"links_down": ["3"]}, ("nvlink", "node01/gpu0/link3")),
    ("nvlink_errors", {"node": "node01", "gpu": "0", "link": "7"}, {}, ("nvlink", "node01/gpu0/link7")),
    ("nvlink_errors", {"node": "node01", "gpu": "0"}, {"links_down": ["1", "2"]}, ("nvlink", "node01/gpu0")),
    ("optic_degraded", {"port": "mlx5_1/1"}, {}, ("optic", "node01/mlx5_1/1")),
    ("coolant_flow_low", {"cdu": "cdu1"}, {"flow_ratio": 0.5}, ("cdu", "cdu1")),
    ("coolant_flow_low", {"cdu": "cdu1"}, {"pumps_stopped": ["2"]}, ("pump", "cdu1/pump2")),
    ("coolant_flow_low", {"cdu": "cdu1"}, {"pump_alarms": ["pump_fail"]}, ("pump", "cdu1/pumps")),
    ("coolant_supply_hot", {"cdu": "cdu1"}, {}, ("cdu", "cdu1")),
    ("leak_sensor_fault", {"zone": "zone-b", "sensor": "rope1"}, {}, ("leak_sensor", "zone-b/rope1")),
    ("leak_source_down", {"zone": "zone-b"}, {}, ("leak_sensor", "zone-b")),
    ("leak", {"zone": "zone-a"}, {}, ("node", "node01")),
    ("leak", {"zone": "zone-ab"}, {}, ("node", "node01")),
    ("pdu_outlet_off", {"pdu": "pdu-a", "outlet": "3"}, {"feeds": "node02"}, ("pdu_outlet", "pdu-a/3")),
    ("sensor_fault", {"reading": "cdu_flow_cubic_meters_per_second,cdu=cdu1,loop=secondary"},
     {"metric": "supernode_cdu_flow_cubic_meters_per_second"},
     ("cdu", "cdu_flow_cubic_meters_per_second,cdu=cdu1,loop=secondary")),
])
def test_each_detector_maps_to_its_class_and_names_the_component(detector, targets, detail, expected):
    f = classify(detector, targets, detail, "node01", ZONES)
    assert f is not None and (f.cls, f.component) == expected


@pytest.mark.parametrize("detector, targets, detail", [
    ("condensation_risk", {"cdu": "cdu1"}, {}),                   # the room's dew point, not a component
    ("rack_power_over_budget", {"rack": "r01"}, {}),              # the load
    ("gpu_straggler", {"node": "node01", "gpu": "3"}, {"cause": "unexplained"}),  # an effect, not a component
    ("gpu_lost", {"node": "node02", "gpu": "1"}, {}),             # node02's GPU: node02's agent counts it
    ("nvlink_errors", {"node": "node02", "gpu": "0", "link": "3"}, {}),
    ("leak", {"zone": "zone-b"}, {}),                             # another node's tray
    ("sensor_fault", {"reading": "leak_detected,sensor=s1,zone=zone-a"}, {"metric": "supernode_leak_detected"}),
    ("SomeAlertname", {"node": "node01"}, {}),
])
def test_conditions_and_other_agents_components_are_not_counted_here(detector, targets, detail):
    assert classify(detector, targets, detail, "node01", ZONES) is None


def test_shared_devices_are_counted_by_every_agent_and_the_rules_take_their_max():
    """A CDU failure seen by node02's agent counts there too; the recording rules partition the classes
    exactly as agent.reliability does (max over agents for shared devices, sum for the others)."""
    assert classify("coolant_supply_hot", {"cdu": "cdu1"}, {}, "node02", ZONES).cls == "cdu"
    rules = {r["record"]: r["expr"] for g in yaml.safe_load((REPO / "alerts" / "recording.rules.yml").read_text())["groups"]
             for r in g["rules"] if "record" in r}
    for name in ("rack_class:supernode_component_failures:increase30d",
                 "rack_class:supernode_component_observed_seconds:increase30d"):
        parts = dict(re.findall(r'(sum|max) by \(rack, class\) \(increase\(\w+\{class=~"([a-z_|]+)"\}', rules[name]))
        assert set(parts["max"].split("|")) == set(RACK_CLASSES), name
        assert set(parts["sum"].split("|")) == set(CLASSES) - RACK_CLASSES, name


def test_component_counts_come_from_the_inventory_and_the_profiles():
    inv = Inventory(nodes=["node01", "node02"], gpus={"count": 4, "nvlinks_per_gpu": 18},
                    ports=[{"name": "eth0"}, {"name": "mlx5_0/1", "kind": "ib"}],
                    cdus=[{"name": "cdu1", "profile": "reference-cdu", "channels": {1: "zone-a", 2: "zone-b"}}],
                    leak_zones=[{"name": "zone-a", "nodes": ["node01"]}, {"name": "zone-b", "nodes": ["node02"]}],
                    pdus=[{"name": "pdu-a", "profile": "raritan-pdu2", "outlets": {"1": "node01", "2": "node02"}}])
    # The reference CDU (exporters/profiles/modbus/reference-cdu.yaml) has two pumps and two leak input channels,
    # both mapped to a zone here: two leak sensors.
    assert component_counts(inv) == {"gpu": 4, "nvlink": 72, "optic": 2, "cdu": 1, "pump": 2, "leak_sensor": 2,
                                     "pdu_outlet": 2, "node": 1}
    # A channel mapped to no zone is no sensor this rack watches.
    one_zone = inv.model_copy(update={"cdus": [inv.cdus[0].model_copy(update={"channels": {1: "zone-a"}})]})
    assert component_counts(one_zone)["leak_sensor"] == 1


def test_observed_component_time_carries_over_a_change_of_counts():
    now = [100.0]
    obs = ObservedTime({"gpu": 4}, clock=lambda: now[0])
    now[0] = 110.0
    obs.update({"gpu": 8})  # a reload: the inventory says 8 GPUs from here
    now[0] = 115.0
    assert obs.seconds()["gpu"] == 4 * 10 + 8 * 5
    reg = CollectorRegistry()
    reg.register(ComponentCollector(obs))
    assert reg.get_sample_value("supernode_component_observed_seconds_total", {"class": "gpu"}) == 80
    assert reg.get_sample_value("supernode_components", {"class": "gpu"}) == 8
    assert reg.get_sample_value("supernode_components", {"class": "pump"}) == 0  # every class, zero-started


def test_engine_counts_a_failure_once_per_incident_and_its_repair_time(tmp_path):
    async def main():
        eng = engine(tmp_path, mode="observe")
        await eng.start()
        reg = CollectorRegistry()
        reg.register(eng.collector())
        for cls in CLASSES:  # zero-started, as the other remediation counters
            assert reg.get_sample_value("supernode_component_failures_total", {"class": cls}) == 0
            assert reg.get_sample_value("supernode_component_repair_duration_seconds_count", {"class": cls}) == 0
        inc = eng.fire("gpu_lost", {"node": "node01", "gpu": "1"}, "critical")
        for _ in range(3):
            assert eng.fire("gpu_lost", {"node": "node01", "gpu": "1"}, "critical") is inc  # refreshes only
        eng.fire("gpu_lost", {"node": "node02", "gpu": "1"}, "critical", source="alertmanager")  # node02's own
        eng.fire("condensation_risk", {"cdu": "cdu1"}, "warning")
        assert inc.detail["component"] == {"class": "gpu", "id": "node01/gpu1"}
        assert reg.get_sample_value("supernode_component_failures_total", {"class": "gpu"}) == 1
        assert sum(reg.get_sample_value("supernode_component_failures_total", {"class": c}) for c in CLASSES) == 1
        await await_for(lambda: inc.state == "observed", what="playbook ran (observe mode)")
        eng.clear("gpu_lost", {"node": "node01", "gpu": "1"})
        assert inc.state == "resolved"
        assert reg.get_sample_value("supernode_component_repair_duration_seconds_count", {"class": "gpu"}) == 1
        assert reg.get_sample_value("supernode_component_repair_duration_seconds_sum", {"class": "gpu"}) == \
            pytest.approx(inc.resolved_at - inc.opened_at)
        await eng.stop()
    asyncio.run(main())


# -- the report ---------------------------------------------------------------------------

DAY = 86400.0


def _incident(j: Journal, iid: str, detector: str, targets: dict, opened: float, resolved: float | None,
              component: dict | None) -> None:
    detail = {"component": component} if component else {}
    row = {"id": iid, "detector": detector, "targets": targets, "opened_at": opened, "detail": detail}
    j.append("incident", incident_id=iid, result="open", detail={**row, "resolved_at": None}, ts=opened)
    if resolved is not None:
        j.append("incident", incident_id=iid, result="resolved", detail={**row, "resolved_at": resolved}, ts=resolved)


def _journal(tmp_path, now: float) -> Journal:
    j = Journal(tmp_path / "journal.db")
    # run 1: 10 days, stopped cleanly; run 2 crashed (no stopped row), restarted 1 s later; run 3 runs now
    j.append("engine", result="started", ts=now - 40 * DAY)
    j.append("engine", result="stopped", ts=now - 30 * DAY)  # before the window: not counted
    j.append("engine", result="started", ts=now - 20 * DAY)
    j.append("engine", result="started", ts=now - 10 * DAY)
    gpu = {"class": "gpu", "id": "node01/gpu2"}
    _incident(j, "x1", "gpu_lost", {"node": "node01"}, now - 15 * DAY, now - 15 * DAY + 600, gpu)
    _incident(j, "x2", "gpu_lost", {"node": "node01"}, now - 5 * DAY, now - 5 * DAY + 1200, gpu)
    _incident(j, "l1", "gpu_lost", {"node": "node01", "gpu": "0"}, now - 2 * DAY, None,
              {"class": "gpu", "id": "node01/gpu0"})
    # a journal row from before components were recorded: classified again from its detector and targets
    _incident(j, "n1", "nvlink_errors", {"node": "node01", "gpu": "1", "link": "4"}, now - 3 * DAY, now - 3 * DAY + 60,
              None)
    _incident(j, "old", "gpu_lost", {"node": "node01", "gpu": "3"}, now - 35 * DAY, now - 35 * DAY + 5, None)
    _incident(j, "c1", "condensation_risk", {"cdu": "cdu1"}, now - 1 * DAY, now - 1 * DAY + 5, None)
    assert j.flush()
    return j


def test_report_mtbf_is_observed_component_time_over_failures(tmp_path):
    now = 1_800_000_000.0
    j = _journal(tmp_path, now)
    entries = j.entries()
    j.close()
    assert agent_runs(entries, now - 30 * DAY, now) == [(now - 20 * DAY, now - 10 * DAY), (now - 10 * DAY, now)]
    counts = dict.fromkeys(CLASSES, 0) | {"gpu": 4, "nvlink": 72, "node": 1}
    rep = reliability_report(entries, counts, now - 30 * DAY, now, "node01", ZONES)
    by = {c["class"]: c for c in rep["classes"]}
    assert rep["watched_seconds"] == 20 * DAY
    assert by["gpu"]["failures"] == 3 and by["gpu"]["mtbf_seconds"] == pytest.approx(4 * 20 * DAY / 3)
    assert by["gpu"]["repairs"] == 2 and by["gpu"]["mttr_seconds"] == pytest.approx(900)
    assert by["nvlink"]["failures"] == 1 and by["nvlink"]["mttr_seconds"] == pytest.approx(60)
    assert by["node"]["failures"] == 0 and by["node"]["mtbf_seconds"] is None  # none observed: > 20 d
    assert rep["worst"][0] == {"class": "gpu", "component": "node01/gpu2", "failures": 2, "down_seconds": 1800.0,
                               "last_opened_at": now - 5 * DAY, "open": False}
    assert [o["component"] for o in rep["worst"]] == ["node01/gpu2", "node01/gpu0", "node01/gpu1/link4"]
    text = format_report(rep, "node01", "r01")
    assert re.search(r"^gpu\s+4\s+3\s+26\.7 d\s+15\.0 min\s+2$", text, re.M), text
    assert re.search(r"^node\s+1\s+0\s+> 20\.0 d\s+-\s+0$", text, re.M), text
    assert re.search(r"^gpu\s+node01/gpu0\s+1\s+2\.0 d \(still open\)", text, re.M), text


def test_report_cli_reads_the_journal_with_the_agent_down(tmp_path):
    import time

    j = _journal(tmp_path, time.time())
    j.close()
    run = subprocess.run([sys.executable, "-m", "agent.cli", "report", "--db", str(tmp_path), "--since", "30d"],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert run.returncode == 0, run.stderr
    # without a config the component counts are unknown: failures and MTTR, no MTBF
    assert re.search(r"^gpu\s+\?\s+3\s+-\s+15\.0 min\s+2$", run.stdout, re.M), run.stdout
    assert "node01/gpu2" in run.stdout
    bad = subprocess.run([sys.executable, "-m", "agent.cli", "report", "--db", str(tmp_path), "--since", "soon"],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert bad.returncode != 0 and "--since 'soon'" in bad.stderr


def test_every_detector_is_a_class_or_said_not_to_be_a_failure():
    """A new detector must be placed: a component class, or named as no component's failure."""
    from agent.reliability import DETECTOR_CLASS, NOT_FAILURES
    from agent.remediation.detectors import Detectors
    from agent.remediation.settings import DetectorSettings

    from agent.remediation.detectors import Context

    names = set(Detectors(DetectorSettings(), Context("n1", "r01")).trackers) - {"sensor_fault"}
    placed = set(DETECTOR_CLASS) | set(NOT_FAILURES)
    assert names - placed == set(), f"detectors with no reliability class: {sorted(names - placed)}"


def test_a_redfish_leak_detector_fault_is_a_leak_sensor_failure():
    from agent.reliability import classify

    f = classify("sensor_fault", {"reading": "supernode_leak_detector_state,bmc=n1-bmc,detector=LD_0"},
                 {"metric": "supernode_leak_detector_state"}, "n1", {})
    assert f is not None and f.cls == "leak_sensor"
    assert classify("tray_leak_rack", {"rack": "r01"}, {}, "n1", {}) is None


def test_report_counts_switch_side_and_tray_side_nvlink_faults_apart(tmp_path):
    """Issue 34: a switch chip's fault (the leader's nvlink_switch_fault) is no tray's NVLink failure; the report
    counts it apart from the trays' own (nvlink_errors), each within the window only."""
    now = 1_800_000_000.0
    j = Journal(tmp_path / "journal.db")
    j.append("engine", result="started", ts=now - 10 * DAY)
    _incident(j, "s1", "nvlink_switch_fault", {"switch_chip": "5", "switch_tray": "switch03"}, now - DAY, None, None)
    _incident(j, "t1", "nvlink_errors", {"node": "node01", "gpu": "0"}, now - 2 * DAY, now - 2 * DAY + 60, None)
    _incident(j, "t2", "nvlink_errors", {"node": "node01", "gpu": "1"}, now - 3 * DAY, None, None)
    _incident(j, "t0", "nvlink_errors", {"node": "node01", "gpu": "1"}, now - 40 * DAY, now - 40 * DAY + 5, None)
    assert j.flush()
    entries = j.entries()
    j.close()
    rep = reliability_report(entries, dict.fromkeys(CLASSES, 1), now - 30 * DAY, now, "node01", ZONES)
    assert rep["nvlink_faults"] == {"switch_side": 1, "tray_side": 2}
    assert {c["class"]: c["failures"] for c in rep["classes"]}["nvlink"] == 2  # the switch is not this tray's link
    assert "NVLink faults: 1 switch-side" in format_report(rep, "node01", "r01")
    assert "2 tray-side" in format_report(rep, "node01", "r01")
