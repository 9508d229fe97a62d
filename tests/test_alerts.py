"""Alert and recording rules, their promtool unit tests, and the Alertmanager example.

Runs the real `promtool` and `amtool`; checks the conventions the issue asks
for (CamelCase names, severity, summary/description/runbook_url with a
shipped runbook, a firing and a quiet case per alert, remediation routing)
and that every metric name is in the catalogue the code declares (docs/metrics.md).
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from agent.remediation import alert_rules
from agent.remediation.settings import DetectorSettings
from tests.helpers import REPO, require_binary
from tests.metric_names import catalogue, metric_names

ALERTS = REPO / "alerts"
RULE_FILES = [ALERTS / "recording.rules.yml", ALERTS / "supernode.rules.yml"]
TEST_FILES = sorted((ALERTS / "tests").glob("*.yml"))
AM_EXAMPLE = REPO / "examples" / "alertmanager.yml"
RUNBOOK_BASE = "https://github.com/supernode-agent/supernode-agent/blob/main/"
DETECTORS = {"leak", "leak_sensor_fault", "leak_source_down", "coolant_flow_low", "coolant_supply_hot",
             "condensation_risk", "gpu_thermal", "gpu_lost", "nvlink_errors", "optic_degraded",
             "rack_power_over_budget", "pdu_outlet_off", "tray_leak_rack",
             "gpu_pcie_degraded", "gpu_clock_slowdown", "gpu_straggler",
             "gpu_app_fault", "gpu_reset_required", "gpu_reboot_required", "gpu_service_required",
             "gpu_fabric_degraded", "nvlink_switch_fault", "pump_redundancy_lost", "filter_clogging", "reservoir_low",
             "coolant_service_due", "cold_plate_degraded", "tray_flow_low"}


def _rules(kind: str) -> list[dict]:
    return [r for f in RULE_FILES for g in yaml.safe_load(f.read_text())["groups"] for r in g["rules"] if kind in r]


def _run(argv: list[str], cwd: Path = REPO, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=timeout)


def test_promtool_check_rules_passes():
    promtool = require_binary("promtool")
    res = _run([promtool, "check", "rules", *map(str, RULE_FILES)])
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("SUCCESS") == len(RULE_FILES)


def test_promtool_unit_tests_pass():
    promtool = require_binary("promtool")
    assert TEST_FILES, "no promtool test files in alerts/tests"
    res = _run([promtool, "test", "rules", *map(str, TEST_FILES)], cwd=ALERTS / "tests")
    assert res.returncode == 0, res.stdout + res.stderr
    assert res.stdout.count("SUCCESS") == len(TEST_FILES)


@pytest.mark.repeat
def test_promtool_unit_tests_pass_fifty_times_in_a_row():
    """Alert values must not depend on rule-group evaluation order, which promtool picks anew each run.

    `make fuzz` only (the `repeat` marker): `make test` runs the unit tests once (test_promtool_unit_tests_pass)
    and guards the cause itself, structurally (test_alerts_read_no_recording_rule); this loop is the search for
    an order-dependent value that the structural rule would have missed.

    The detector tests (every detector alert; where the NVLink value flaked 1
    run in 5-7) are loaded and evaluated fifty times and the health and
    reliability tests ten times each; a value that depends on which group ran
    first (an alert reading another group's recording rule) fails some of them.
    Two promtool processes share the runs, one per core: each evaluation picks
    its order anew either way, and the test takes half the time.
    """
    promtool = require_binary("promtool")
    half = ["detectors_test.yml"] * 25 + ["health_test.yml"] * 5 + ["reliability_test.yml"] * 5 + ["imex_test.yml"] * 5 \
        + ["goodput_test.yml"] * 5
    assert set(half) == {f.name for f in TEST_FILES}
    procs = [subprocess.Popen([promtool, "test", "rules", *half], cwd=ALERTS / "tests", text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for _ in range(2)]
    outputs = [p.communicate(timeout=600)[0] for p in procs]
    for proc, out in zip(procs, outputs):
        failed = [line for line in out.splitlines() if "alertname" in line or "FAIL" in line]
        assert proc.returncode == 0, "\n".join(failed)[:4000]
        assert out.count("SUCCESS") == len(half)


def test_alerts_read_no_recording_rule():
    """The cause of the flake, as a rule: an alert expression names raw series only."""
    records = {r["record"] for r in _rules("record")}
    for a in _rules("alert"):
        used = {name for name in records if name in a["expr"]}
        assert not used, f"{a['alert']} reads recording rule(s) {used}: its value depends on group order"


def test_rules_file_is_rendered_from_the_detector_defaults():
    """supernode.rules.yml is the template filled with DetectorSettings' defaults; stale = fail."""
    assert (ALERTS / "supernode.rules.yml").read_text() == alert_rules.render(alert_rules.TEMPLATE.read_text()), (
        "alerts/supernode.rules.yml is stale: run python -m agent.remediation.alert_rules")
    assert alert_rules.main(["--check"]) == 0


# Every threshold a detector alert shares with the agent, by the setting that holds it.
SHARED_THRESHOLDS = {
    "SupernodeCoolantFlowLow": {"flow_low_ratio", "flow_baseline_window_seconds", "flow_confirm_delta_t_rise_celsius"},
    "SupernodeCoolantSupplyHot": {"supply_hot_celsius"},
    "SupernodeCondensationRisk": {"condensation_margin_celsius"},
    "SupernodeGpuThermal": {"gpu_thermal_margin_celsius", "gpu_thermal_clock_events"},
    "SupernodeNvlinkErrors": {"nvlink_error_rate_per_second", "nvlink_error_types", "nvlink_effective_ber"},
    "SupernodeOpticDegraded": {"optic_rx_margin_db", "optic_symbol_error_rate_per_second", "optic_flaps",
                               "optic_flap_window_seconds"},
    "SupernodeRackPowerOverBudget": {"rack_power_over_ratio"},
    "SupernodeRackTrayLeaks": {"rack_tray_leaks"},
    "SupernodeGpuPcieDegraded": {"gpu_pcie_generation_min_utilization_ratio"},
    "SupernodeGpuClockSlowdown": {"gpu_clock_slowdown_reasons", "gpu_thermal_clock_events"},
    "SupernodeGpuStraggler": {"gpu_straggler_min_utilization_ratio", "gpu_straggler_min_gpus",
                              "gpu_straggler_clock_band_ratio", "gpu_straggler_power_band_ratio"},
    "SupernodeColdPlateDegraded": {"cold_plate_degraded_ratio", "cold_plate_min_peers"},
    "SupernodeTrayCoolantFlowLow": {"tray_flow_low_ratio", "tray_flow_min_peers"},
}


def _template_alerts() -> dict[str, dict]:
    groups = yaml.safe_load(alert_rules.TEMPLATE.read_text())["groups"]
    return {r["alert"]: r for g in groups for r in g["rules"] if "alert" in r}


def test_alert_thresholds_are_the_detector_settings():
    """Each shared threshold is a placeholder in the alert's expression, never a number typed twice."""
    alerts = _template_alerts()
    for name, fields in SHARED_THRESHOLDS.items():
        assert alert_rules.placeholders(alerts[name]["expr"]) >= fields, name
    # Changing a setting changes the rendered rule: the numbers really come from the settings.
    custom = DetectorSettings(gpu_thermal_margin_celsius=7.5, nvlink_error_rate_per_second=42.0,
                              optic_flap_window_seconds=600.0)
    text = alert_rules.render(alert_rules.TEMPLATE.read_text(), custom)
    rules = {r["alert"]: r for g in yaml.safe_load(text)["groups"] for r in g["rules"] if "alert" in r}
    assert 'threshold="slowdown"} - 7.5)' in rules["SupernodeGpuThermal"]["expr"]
    assert ") > 42 or" in rules["SupernodeNvlinkErrors"]["expr"]
    assert "supernode_link_flaps_total[600s]" in rules["SupernodeOpticDegraded"]["expr"]


def test_template_names_only_existing_settings(tmp_path):
    bad = "expr: x > <<no_such_threshold>>\n"
    try:
        alert_rules.render(bad)
    except alert_rules.TemplateError as exc:
        assert "no_such_threshold" in str(exc) and ":1:" in str(exc)
    else:
        raise AssertionError("an unknown placeholder rendered")


def test_nvlink_recording_rule_counts_the_agent_error_types():
    """The dashboard's per-link rate counts the same error types as the agent and the alert."""
    for name in ("node_gpu_link:supernode_nvlink_errors:rate5m", "node_gpu:supernode_gpu_nvlink_errors:rate5m"):
        rule = next(r for r in _rules("record") if r["record"] == name)
        assert f'type=~"{"|".join(DetectorSettings().nvlink_error_types)}"' in rule["expr"], name


def test_promtool_unit_tests_can_fail(tmp_path):
    """The harness is live: the same test with a wrong expectation exits 1."""
    promtool = require_binary("promtool")
    src = ALERTS / "tests" / "detectors_test.yml"
    (tmp_path / "tests").mkdir()
    for f in RULE_FILES:
        shutil.copy(f, tmp_path / f.name)
    broken = src.read_text().replace("detector: nvlink_errors", "detector: something_else", 1)
    assert broken != src.read_text()
    (tmp_path / "tests" / src.name).write_text(broken)
    res = _run([promtool, "test", "rules", src.name], cwd=tmp_path / "tests")
    assert res.returncode == 1, res.stdout + res.stderr
    assert "SupernodeNvlinkErrors" in res.stdout + res.stderr


def test_alert_conventions_and_runbooks():
    alerts = _rules("alert")
    assert len(alerts) >= 21
    names = [a["alert"] for a in alerts]
    assert len(set(names)) == len(names), "duplicate alert names"
    for a in alerts:
        name = a["alert"]
        assert re.fullmatch(r"(?:[A-Z][a-z0-9]+)+", name), f"{name} is not CamelCase"
        assert a["labels"]["severity"] in ("critical", "warning", "info"), name
        ann = a["annotations"]
        assert ann["summary"] and ann["description"], name
        url = ann["runbook_url"]
        assert url == f"{RUNBOOK_BASE}docs/runbooks/{name}.md", f"{name}: runbook_url {url}"
        runbook = REPO / url.removeprefix(RUNBOOK_BASE)
        assert runbook.exists(), f"{name}: {runbook} missing"
        text = runbook.read_text()
        assert text.startswith(f"# {name}"), runbook
        for section in ("## What it means", "## How to confirm", "## What the agent already did"):  # all: test_runbooks
            assert section in text, f"{runbook}: missing {section!r}"


def test_every_detector_has_an_alert_and_remediation_labels():
    alerts = _rules("alert")
    detectors = {a["labels"].get("detector") for a in alerts} - {None}
    assert detectors == DETECTORS
    routed = {a["alert"] for a in alerts if a["labels"].get("remediation") == "agent"}
    # Alert-only detectors of PLAYBOOKS.md must not reach the agent's webhook.
    assert "SupernodeLeakSensorFault" not in routed and "SupernodeCondensationRisk" not in routed
    assert {"SupernodeNvlinkErrors", "SupernodeGpuLost", "SupernodeRackPowerOverBudget"} <= routed
    # The GPU recovery ladder's classes are the node's own agent's (its ladder detectors act): told to people,
    # never routed back to an agent (another node's agent would drain a node it cannot reset or reboot).
    ladder = {"SupernodeGpuAppFault", "SupernodeGpuResetRequired", "SupernodeGpuRebootRequired",
              "SupernodeGpuServiceRequired"}
    assert ladder <= {a["alert"] for a in alerts} and not ladder & routed
    # An unknown leak state is the agent's own notify-only incident, never a webhook delivery.
    assert "SupernodeLeakSourceDown" not in routed
    # A switch fault is the rack leader's own incident from the rack's verdict: told to people, never routed back.
    assert "SupernodeNvlinkSwitchFault" not in routed
    health = {"SupernodeSourceDown", "SupernodeDataStale", "SupernodeAgentDown", "SupernodeRemediationBlocked",
              "SupernodeRemediationActionFailed",
              "SupernodeRemediationCircuitBreakerOpen", "SupernodeRemediationApprovalsPending",
              "SupernodeGpuDriverDrift", "SupernodeGpuVbiosDrift", "SupernodeCduFirmwareDrift",
              "SupernodePduFirmwareDrift"}
    assert health <= {a["alert"] for a in alerts}


def test_every_alert_has_a_firing_and_a_quiet_case():
    firing, quiet = set(), set()
    for f in TEST_FILES:
        for t in yaml.safe_load(f.read_text())["tests"]:
            for case in t.get("alert_rule_test", []):
                (firing if case.get("exp_alerts") else quiet).add(case["alertname"])
    names = {a["alert"] for a in _rules("alert")}
    assert names - firing == set(), "alerts without a firing case"
    assert names - quiet == set(), "alerts without a non-firing case"


def test_recording_rule_names_follow_level_metric_operations():
    for r in _rules("record"):
        level, metric, ops = r["record"].split(":")
        assert re.fullmatch(r"[a-z_]+", level) and metric.startswith("supernode_") and ops, r["record"]


def test_metric_names_are_in_the_catalogue():
    known = catalogue()
    used = set()
    for r in _rules("expr"):
        used |= metric_names(r["expr"])
    assert used, "no metric names found in rules"
    assert used - known == set()


def test_amtool_check_config_passes():
    amtool = require_binary("amtool")
    res = _run([amtool, "check-config", str(AM_EXAMPLE)])
    assert res.returncode == 0, res.stdout + res.stderr
    assert "SUCCESS" in res.stdout


def _route(amtool: str, labels: list[str], receivers: str) -> subprocess.CompletedProcess:
    return _run([amtool, "config", "routes", "test", f"--config.file={AM_EXAMPLE}",
                 f"--verify.receivers={receivers}", *labels])


def test_remediation_alerts_route_to_the_agent_webhook():
    amtool = require_binary("amtool")
    ok = _route(amtool, ["alertname=SupernodeNvlinkErrors", "remediation=agent", "severity=critical",
                         "rack=r01", "node=n01"], "supernode-agent,operators-critical")
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # An alert without remediation="agent" never reaches the agent.
    no = _route(amtool, ["alertname=SupernodeGpuDriverDrift", "severity=warning", "rack=r01"], "supernode-agent")
    assert no.returncode != 0 and "operators" in no.stdout
    # An unreadable leak zone pages people (critical) and never reaches the agent's webhook.
    unknown = _route(amtool, ["alertname=SupernodeLeakSourceDown", "detector=leak_source_down", "severity=critical",
                              "rack=r01", "zone=zone-a"], "operators-critical")
    assert unknown.returncode == 0, unknown.stdout + unknown.stderr


def test_agent_receiver_settings():
    cfg = yaml.safe_load(AM_EXAMPLE.read_text())
    route = next(r for r in cfg["route"]["routes"] if r["receiver"] == "supernode-agent")
    assert {"rack", "node"} <= set(route["group_by"])
    receiver = next(r for r in cfg["receivers"] if r["name"] == "supernode-agent")
    hook = receiver["webhook_configs"][0]
    assert hook["url"] == "http://127.0.0.1:9877/api/v1/alerts"
    assert hook["send_resolved"] is True
    assert hook["http_config"]["authorization"]["credentials_file"]
    assert "credentials" not in hook["http_config"]["authorization"], "secrets belong in a file"
