"""Shared-device series are never double-counted by a dashboard, a recording rule or an alert.

A rack's CDU (Modbus or Redfish), leak controller and PDU are polled by up to `pollers_per_device` agents
(every agent without coordination, every agent while degraded), and each exports the device's series under
its own `node` target label. So every query over a shared-device family must first collapse the copies: the
innermost aggregation around it is `max`/`min`/`count`/`avg` over labels without `node` (a `sum` there,
or a bare selector in an alert, would count a device once per poller). Checked on every dashboard query,
every recording rule and every alert expression, against the families the catalogue says come from
Modbus, SNMP or Redfish devices (plus the rack totals derived from them).

A Redfish family serves tray BMCs too (each its own node's, but also read by the rack leader with
`watch_rack_trays`, so a tray has two copies as well) and a Redfish CDU's coolant, pump, health and leak
detector series: every one collapses the copies, by `bmc`. The exceptions describe one agent's own client
of a service, not the service: its requests, logins and walks, and its event subscription (up, events
received); a query may keep `node` on those (an event stream down is that agent's to fix).
"""

from __future__ import annotations

import json
import re

import yaml

from agent.catalogue import declared
from dashboards import build
from tests.helpers import REPO

DERIVED_SHARED = {"supernode_rack_power_watts", "supernode_rack_power_budget_watts"}
REDFISH_PER_CLIENT = {"supernode_redfish_requests_total", "supernode_redfish_logins_total",
                      "supernode_redfish_discoveries_total", "supernode_redfish_event_stream_up",
                      "supernode_redfish_events_total"}
DEDUP = {"max", "min", "count", "avg", "group"}
FUNCS_PASS = {"increase", "rate", "delta", "deriv", "irate", "max_over_time", "min_over_time", "avg_over_time",
              "last_over_time", "changes", "resets", "abs", "clamp_min", "clamp_max", "round", "time"}


def shared_families() -> set[str]:
    # a derived family per GPU (its cold plate's thermal resistance) is the node's own, like the GPU's readings
    # a family fed by several protocols names them all ("modbus, snmp"): any device protocol makes it shared
    devices = {name for name, (spec, source) in declared().items()
               if {s.strip() for s in source.split(",")} & {"modbus", "snmp", "bacnet", "derived"}
               and not (source == "derived" and "gpu" in spec.labels)}
    redfish = {name for name, (_, source) in declared().items() if source == "redfish"} - REDFISH_PER_CLIENT
    return devices | redfish | DERIVED_SHARED


def test_the_redfish_cdu_families_are_checked():
    families = shared_families()
    assert {"supernode_coolant_connector_flow_cubic_meters_per_second", "supernode_coolant_pump_speed_ratio",
            "supernode_redfish_health", "supernode_redfish_service_info", "supernode_leak_detector_state"} <= families
    assert REDFISH_PER_CLIENT <= set(declared()), "a per-client family was renamed: name it here again"
    assert not REDFISH_PER_CLIENT & families


def _exprs() -> list[tuple[str, str]]:
    out = []
    for name in build.DASHBOARDS:
        d = json.loads(build.path_of(name).read_text())
        out += [(f"dashboard {name}: {p['title']}", t["expr"]) for p in d["panels"] for t in p["targets"]]
        out += [(f"dashboard {name}: annotation", a["expr"]) for a in d["annotations"]["list"]]
    for path in sorted((REPO / "alerts").glob("*.yml")):
        for group in (yaml.safe_load(path.read_text()) or {}).get("groups", []):
            for rule in group["rules"]:
                out.append((f"{path.name}: {rule.get('alert') or rule.get('record')}", rule["expr"]))
    return out


_AGG = re.compile(r"(\w+)\s*(?:(by|without)\s*\(([^)]*)\))?\s*$")


def _enclosing(expr: str, pos: int) -> list[tuple[str, str | None, set[str]]]:
    """From the innermost outwards: (function or aggregation name, by/without, its labels) around `pos`."""
    out = []
    depth = 0
    i = pos
    while i > 0:
        i -= 1
        c = expr[i]
        if c == ")":
            depth += 1
        elif c == "(":
            if depth:
                depth -= 1
                continue
            head = expr[:i]
            m = _AGG.search(head)
            if m:
                out.append((m.group(1), m.group(2), {x.strip() for x in (m.group(3) or "").split(",") if x.strip()}))
            else:
                by = re.search(r"(\w+)\s*\(\s*$", head)
                out.append((by.group(1) if by else "", None, set()))
    return out


def _problem(expr: str, family: str, pos: int) -> str | None:
    for name, mode, labels in _enclosing(expr, pos):
        if name in FUNCS_PASS or name == "":
            continue
        if name in DEDUP:
            if mode == "without" and "node" not in labels:
                return f"{name} without (...) keeps node"
            if mode == "by" and "node" in labels:
                return f"{name} by (... node ...) keeps one copy per poller"
            return None
        return f"{name}(...) over the copies of each poller"
    return "no aggregation: one series per poller"


def test_every_query_collapses_the_pollers_copies_of_a_shared_device():
    families = shared_families()
    assert {"supernode_leak_detected", "supernode_pdu_inlet_power_watts",
            "supernode_cdu_flow_cubic_meters_per_second"} <= families
    bad = []
    for where, expr in _exprs():
        for fam in families:
            for m in re.finditer(rf"(?<![:\w]){fam}(?![:\w])", expr):
                problem = _problem(expr, fam, m.start())
                if problem:
                    bad.append(f"{where}: {fam}: {problem}\n    {expr}")
    assert not bad, "\n".join(bad)


def test_the_check_finds_a_double_count():
    expr = "sum by (rack) (increase(supernode_pdu_inlet_energy_joules_total[1h]))"
    assert _problem(expr, "supernode_pdu_inlet_energy_joules_total", expr.index("supernode_pdu")) is not None
    ok = "sum by (rack) (max by (rack, pdu, inlet) (increase(supernode_pdu_inlet_energy_joules_total[1h])))"
    assert _problem(ok, "supernode_pdu_inlet_energy_joules_total", ok.index("supernode_pdu")) is None
    per_node = "max by (rack, node) (supernode_leak_detected)"
    assert _problem(per_node, "supernode_leak_detected", per_node.index("supernode_leak")) is not None
