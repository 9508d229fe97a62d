"""Reliability per component class: which component an incident says failed, MTBF and MTTR.

Why here, not in the detectors: a detector says "this condition holds"; whether that is a
*component failure*, and of which component, is a judgement made once, in one table, so the
counter (`supernode_component_failures_total`), the recording rules, the status page and
`supernode-agent report` all count the same things.

Definitions (README "Reliability"):

- A **failure** is an incident opened (local detector or Alertmanager) whose detector maps to
  a class below. Conditions that are not a component failing (the room's dew point, the rack
  drawing more than its budget) map to none.
- **Component-time** is the number of components of a class the agent watches (from the
  inventory and the device profiles) times the time it watched them: `supernode_component_
  observed_seconds_total`, and in `report` the agent's runs in the journal (engine started ->
  stopped) inside the window.
- **MTBF** = component-time / failures in the window; none observed: MTBF is "more than the
  component-time" (Prometheus shows +Inf), never a made-up number.
- **MTTR** = mean time from an incident's opening to its resolution (the condition gone for its
  clear hold, or a person closing it), over the class's incidents resolved in the window,
  whoever repaired it. Unlike `supernode_incident_duration_seconds` (the agent's own
  mitigations only) this is the component's time out of service.

Scope: an agent counts failures of what it owns, its node's GPUs, NVLinks, optics and the node
itself (a leak in a zone covering it), and of the rack's shared devices it polls (CDUs, their
pumps, leak sensors, PDU outlets). Every agent polling a shared device sees its failures, so a
rack's count of those classes is the max over its agents, and of the others the sum
(alerts/recording.rules.yml).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterable, Mapping

from exporters.model import counter, gauge

if TYPE_CHECKING:
    from agent.config import Inventory

CLASSES = ("gpu", "nvlink", "optic", "cdu", "pump", "leak_sensor", "pdu_outlet", "node")
# Shared rack devices: every agent that polls them counts them (the rack takes the max over agents).
RACK_CLASSES = frozenset({"cdu", "pump", "leak_sensor", "pdu_outlet"})

# Detector (or the alertname's detector label) -> class; coolant_flow_low is a pump when the CDU says so.
DETECTOR_CLASS: Mapping[str, str] = {
    "gpu_lost": "gpu", "gpu_reset_required": "gpu", "gpu_reboot_required": "gpu", "gpu_service_required": "gpu",
    # One GPU at its slowdown threshold while the loop is fine: its cold plate or thermal interface.
    # (A loop that cannot carry the heat is coolant_flow_low / coolant_supply_hot, a CDU failure.)
    "gpu_thermal": "gpu",
    # A cold plate whose thermal resistance rose (fouling, air, a failing quick-disconnect): the same part, seen
    # before the GPU throttles; a tray whose manifold passes less than its peers': the tray's own plumbing.
    "cold_plate_degraded": "gpu", "tray_flow_low": "node",
    # A link trained down, or a board holding its clocks down without a thermal reason: the GPU's tray (its
    # riser, slot, board or power delivery) no longer does what it should.
    "gpu_pcie_degraded": "gpu", "gpu_clock_slowdown": "gpu",
    "nvlink_errors": "nvlink",
    # A GPU off its NVLink fabric: its NVLink attachment (the GPU's links, or the fabric's route to it) failed.
    "gpu_fabric_degraded": "nvlink",
    "optic_degraded": "optic",
    "coolant_flow_low": "cdu", "coolant_supply_hot": "cdu",
    "leak_sensor_fault": "leak_sensor", "leak_source_down": "leak_sensor",
    "leak": "node",  # the tray whose cold-plate manifold leaked
    "leak_tray": "node",  # a tray's own leak (leak scope tray): that tray's, counted by its own agent
    "pdu_outlet_off": "pdu_outlet",
}
NOT_FAILURES = ("condensation_risk", "rack_power_over_budget",  # the room's dew point; the load
                # a pump short of its spare: the failure is counted once, by coolant_flow_low's pump evidence
                "pump_redundancy_lost",
                # the loop's maintenance: a strainer to change, coolant to top up, a part due for service
                "filter_clogging", "reservoir_low", "coolant_service_due",
                "tray_leak_rack",  # trays leaking at once: each tray is already its own node's leak
                "leak_loop",  # a leak's wider scope (the loop losing coolant): the leak is already counted
                "gpu_app_fault",  # the catalogue's RESTART_APP: the application's fault, not the GPU's
                "gpu_straggler",  # an effect: its cause (link, clock slowdown, thermal) is its own detector's
                # An NVSwitch chip's fault (the rack leader's incident): no tray's component; the report counts
                # it apart, as a switch-side NVLink fault against the trays' own (nvlink_errors).
                "nvlink_switch_fault")
# The report's NVLink faults, switch-side (a switch chip, attributed across the rack) and tray-side (a tray's own).
NVLINK_SIDES: Mapping[str, str] = {"nvlink_switch_fault": "switch_side", "nvlink_errors": "tray_side"}
# A reading that is not ok (sensor_fault) is a failure of the device whose sensor it is.
SENSOR_PREFIX_CLASS = (("supernode_cdu_", "cdu"), ("supernode_gpu_", "gpu"), ("supernode_nvlink_", "nvlink"),
                       ("supernode_optic_", "optic"), ("supernode_pdu_outlet_", "pdu_outlet"),
                       # Redfish: a tray's or a Redfish CDU's leak detector, its coolant connectors and pumps.
                       ("supernode_leak_detector_", "leak_sensor"), ("supernode_coolant_pump_", "pump"),
                       ("supernode_coolant_connector_", "cdu"))

COMPONENTS = gauge("supernode_components", "Components of each class this agent watches, from the inventory and "
                   "the device profiles (count); shared rack devices are counted by every agent polling them.",
                   ("class",))
OBSERVED = counter("supernode_component_observed_seconds_total",
                   "Component-time watched: components of the class times the seconds this agent watched them; "
                   "MTBF = its increase / the failures' increase.", ("class",))


@dataclass(frozen=True, slots=True)
class Failure:
    cls: str
    component: str  # which one, in words an operator finds: node01/gpu2, node01/gpu0/link3, cdu1/pump1

    def as_dict(self) -> dict[str, str]:
        return {"class": self.cls, "id": self.component}


def _nvlink_id(node: str, targets: Mapping[str, str], detail: Mapping[str, Any]) -> str:
    gpu = f"{node}/gpu{targets.get('gpu', '?')}"
    if targets.get("link"):
        return f"{gpu}/link{targets['link']}"
    links = sorted({str(x) for key in ("links_down", "links_ber_high") for x in detail.get(key) or ()})
    return f"{gpu}/link{links[0]}" if len(links) == 1 else gpu


def classify(detector: str, targets: Mapping[str, str], detail: Mapping[str, Any], me: str,
             zones: Mapping[str, Iterable[str]]) -> Failure | None:
    """The component failure an incident means, counted by the agent of node `me`; None when it is not a
    failure, or one another agent counts (another node's GPU, link, optic or tray)."""
    if detector == "sensor_fault":
        metric = str(detail.get("metric", ""))
        cls = next((c for prefix, c in SENSOR_PREFIX_CLASS if metric.startswith(prefix)), None)
        reading = str(targets.get("reading", ""))
        return Failure(cls, reading or metric) if cls else None
    cls = DETECTOR_CLASS.get(detector)
    if cls is None:
        return None
    node = targets.get("node", me)
    if cls == "node":
        if "tray" in targets:  # a tray-scoped leak: that tray alone
            return Failure("node", me) if targets["tray"] == me else None
        covered = list(zones.get(targets.get("zone", ""), ())) if "zone" in targets else [node]
        return Failure("node", me) if me in covered else None
    if cls not in RACK_CLASSES and node != me:
        return None  # another node's component: its own agent counts it
    if cls == "gpu":
        gpu = targets.get("gpu") or detail.get("gpu")
        if not gpu:  # a node-wide GPU fault (a reboot): the GPUs its detail names, else the node's GPUs as one
            named = sorted({str(g.get("gpu")) for g in detail.get("gpus", ()) if isinstance(g, dict) and g.get("gpu")})
            gpu = ",".join(named) if named else "?"
        return Failure("gpu", f"{node}/gpu{gpu}")
    if cls == "nvlink":
        return Failure("nvlink", _nvlink_id(node, targets, detail))
    if cls == "optic":
        return Failure("optic", f"{node}/{targets.get('port', '?')}")
    if cls == "cdu":
        cdu = targets.get("cdu", "?")
        pumps = list(detail.get("pumps_stopped") or ())
        if detector == "coolant_flow_low" and (pumps or detail.get("pump_alarms")):
            return Failure("pump", f"{cdu}/pump{pumps[0]}" if len(pumps) == 1 else f"{cdu}/pumps")
        return Failure("cdu", cdu)
    if cls == "leak_sensor":
        zone = targets.get("zone", "?")
        return Failure("leak_sensor", f"{zone}/{targets['sensor']}" if targets.get("sensor") else zone)
    return Failure("pdu_outlet", f"{targets.get('pdu', '?')}/{targets.get('outlet', '?')}")


# -- how many components -------------------------------------------------------------------


def component_counts(inventory: "Inventory") -> dict[str, int]:
    """Components per class this agent watches: GPUs, NVLinks and ports of its node (identical trays), the
    node, and the rack's CDUs, their pumps and leak inputs (from the profiles) and the outlets feeding nodes.

    A profile that does not load counts no pumps or sensors (check-config refuses such a config anyway).
    """
    counts = dict.fromkeys(CLASSES, 0)
    counts["gpu"] = inventory.gpus.count
    counts["nvlink"] = inventory.gpus.count * inventory.gpus.nvlinks_per_gpu
    counts["optic"] = len(inventory.ports)
    counts["cdu"] = len(inventory.cdus)
    counts["node"] = 1
    counts["pdu_outlet"] = sum(len(p.outlets) for p in inventory.pdus)
    try:
        pumps, sensors = _profile_counts(inventory)
    except Exception:  # an unreadable profile must not stop the agent's metrics
        pumps, sensors = 0, 0
    counts["pump"], counts["leak_sensor"] = pumps, sensors
    return counts


def _profile_counts(inventory: "Inventory") -> tuple[int, int]:
    from exporters.cooling import modbus_metrics as mm
    from exporters.cooling.modbus import ModbusSource, has_leak_points
    from exporters.cooling.modbus_profile import load_profile

    pumps = 0
    sensors: set[tuple[str, str, str]] = set()
    modbus = [d for d in inventory.cdus if d.protocol == "modbus"]
    for d in modbus:
        profile = load_profile(d.profile)
        pumps += len({tuple(sorted(p.labels.items())) for p in profile.expanded()
                      if p.metric == mm.PUMP_RUNNING.name})
    for d in [*modbus, *inventory.leak_controllers]:
        if has_leak_points(d.profile):
            src = ModbusSource("leak", d.name, d.profile, d.host, d.port, d.unit, subset="leak", channels=d.channels)
            sensors |= {(d.name, zone, sensor) for zone, sensor in src.leak_sensors()}
    for d in (c for c in inventory.cdus if c.protocol == "bacnet"):
        from exporters.cooling.bacnet import source as bacnet

        b_profile = bacnet.load_profile(d.profile)
        pumps += len({tuple(sorted(p.labels.items())) for p in b_profile.points if p.metric == mm.PUMP_RUNNING.name})
        if bacnet.has_leak_points(b_profile):  # the sensors follow from the profile and wiring: no I/O here
            src = bacnet.BacnetSource("leak", d.name, b_profile, bacnet.BacnetLink(d.host, d.port), subset="leak",
                                      channels=d.channels, cov=False)
            sensors |= {(d.name, zone, sensor) for zone, sensor in src.leak_sensors()}
    snmp_pumps, snmp_sensors = _snmp_cdu_counts([d for d in inventory.cdus if d.protocol == "snmp"])
    return pumps + snmp_pumps, len(sensors) + snmp_sensors


def _snmp_cdu_counts(cdus: list) -> tuple[int, int]:
    """Pumps and wired leak inputs of SNMP CDUs, from their profiles' fixed labels and channels (a pump or leak
    table's rows are known only from the device: not counted)."""
    from exporters.cooling import modbus_metrics as mm
    from exporters.snmp.profile import load_profile, template_fields

    pumps = sensors = 0
    for d in cdus:
        profile = load_profile(d.profile)
        fixed = [m for m in profile.metrics if not any(template_fields(t) for t in m.templates().values())]
        pumps += len({m.labels["pump"] for m in fixed if m.metric == mm.PUMP_RUNNING.name})
        sensors += len({(m.channel, m.labels["sensor"]) for m in fixed if m.metric == mm.LEAK_DETECTED.name
                        and (not d.channels or m.channel in {str(k) for k in d.channels})})
    return pumps, sensors


class ObservedTime:
    """Component-seconds per class since the agent started, carried over when the counts change (a reload)."""

    def __init__(self, counts: Mapping[str, int], clock=time.monotonic):
        self.clock = clock
        self.counts = dict(counts)
        self.since = clock()
        self.carried = dict.fromkeys(CLASSES, 0.0)

    def update(self, counts: Mapping[str, int]) -> None:
        now = self.clock()
        for cls in CLASSES:
            self.carried[cls] += self.counts.get(cls, 0) * (now - self.since)
        self.counts, self.since = dict(counts), now

    def seconds(self) -> dict[str, float]:
        elapsed = self.clock() - self.since
        return {cls: self.carried[cls] + self.counts.get(cls, 0) * elapsed for cls in CLASSES}


class ComponentCollector:
    """`supernode_components{class}` and `supernode_component_observed_seconds_total{class}`, every class
    exported (zero where the inventory has none), so MTBF rules and panels have data on a quiet rack."""

    def __init__(self, observed: "ObservedTime | Any"):
        self.observed = observed  # an ObservedTime, or a callable returning the current one (reloads)

    def describe(self) -> list:
        return []

    def collect(self) -> Iterable[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        obs = self.observed() if callable(self.observed) else self.observed
        components = GaugeMetricFamily(COMPONENTS.name, COMPONENTS.help, labels=["class"])
        seconds = CounterMetricFamily(OBSERVED.name.removesuffix("_total"), OBSERVED.help, labels=["class"])
        watched = obs.seconds()
        for cls in CLASSES:
            components.add_metric([cls], obs.counts.get(cls, 0))
            seconds.add_metric([cls], watched[cls])
        yield components
        yield seconds


# -- the report, from the journal ------------------------------------------------------------

WORST = 5  # offenders listed


@dataclass
class ClassStats:
    cls: str
    components: int | None  # None: the inventory is not known (`report --db` without a config)
    failures: int = 0
    repairs: int = 0
    repair_seconds: float = 0.0
    observed_seconds: float | None = None

    @property
    def mtbf_seconds(self) -> float | None:
        """Observed component-time / failures; None without failures (MTBF > observed) or without counts."""
        if self.observed_seconds is None or not self.failures:
            return None
        return self.observed_seconds / self.failures

    @property
    def mttr_seconds(self) -> float | None:
        return self.repair_seconds / self.repairs if self.repairs else None

    def as_dict(self) -> dict[str, Any]:
        return {"class": self.cls, "components": self.components, "failures": self.failures,
                "observed_seconds": self.observed_seconds, "mtbf_seconds": self.mtbf_seconds,
                "repairs": self.repairs, "mttr_seconds": self.mttr_seconds}


def agent_runs(entries: Iterable[Any], since: float, now: float) -> list[tuple[float, float]]:
    """The agent's runs from the journal's engine rows, clipped to [since, now].

    A run ends at its `stopped` row; one without (a crash, a power loss) at the next start, and the
    last one without at `now` (the agent is running): such a gap counts as watched, so MTBF errs high
    by it, never low.
    """
    marks = sorted((e.ts, e.result) for e in entries if e.kind == "engine" and e.result in ("started", "stopped"))
    runs: list[tuple[float, float]] = []
    start: float | None = None
    for ts, what in marks:
        if what == "started":
            if start is not None:
                runs.append((start, ts))
            start = ts
        elif start is not None:
            runs.append((start, ts))
            start = None
    if start is not None:
        runs.append((start, now))
    return [(max(a, since), min(b, now)) for a, b in runs if b > since and a < now]


def _incidents(entries: Iterable[Any]) -> dict[str, dict[str, Any]]:
    """incident id -> its latest fields (detector, targets, detail, opened_at, resolved_at) from the journal."""
    out: dict[str, dict[str, Any]] = {}
    for e in entries:
        if e.kind == "incident" and e.incident_id and isinstance(e.detail, dict):
            out.setdefault(e.incident_id, {}).update(e.detail)
    return out


def reliability_report(entries: list[Any], counts: Mapping[str, int] | None, since: float, now: float, me: str,
                       zones: Mapping[str, Iterable[str]]) -> dict[str, Any]:
    """MTBF and MTTR per class and the worst offenders over [since, now], from one agent's journal rows."""
    runs = agent_runs(entries, since, now)
    watched = sum(b - a for a, b in runs)
    seen_until = runs[-1][1] if runs else now  # an incident open when the agent stopped: down until then
    stats = {c: ClassStats(c, None if counts is None else counts.get(c, 0)) for c in CLASSES}
    for s in stats.values():
        s.observed_seconds = None if s.components is None else s.components * watched
    offenders: dict[tuple[str, str], dict[str, Any]] = {}
    sides = dict.fromkeys(NVLINK_SIDES.values(), 0)
    for iid, inc in _incidents(entries).items():
        opened = inc.get("opened_at")
        if not isinstance(opened, (int, float)) or "detector" not in inc:
            continue
        side = NVLINK_SIDES.get(str(inc["detector"]))
        if side is not None and since <= opened <= now:
            sides[side] += 1
        detail = inc.get("detail") if isinstance(inc.get("detail"), dict) else {}
        comp = detail.get("component")
        if isinstance(comp, dict) and comp.get("class") in stats:
            failure: Failure | None = Failure(str(comp["class"]), str(comp.get("id", "")))
        else:  # a journal written before components were recorded
            failure = classify(str(inc["detector"]), inc.get("targets") or {}, detail, me, zones)
        if failure is None:
            continue
        resolved = inc.get("resolved_at") if isinstance(inc.get("resolved_at"), (int, float)) else None
        s = stats[failure.cls]
        if since <= opened <= now:
            s.failures += 1
            o = offenders.setdefault((failure.cls, failure.component), {
                "class": failure.cls, "component": failure.component, "failures": 0, "down_seconds": 0.0,
                "last_opened_at": opened, "open": False})
            o["failures"] += 1
            o["down_seconds"] += max(0.0, (resolved if resolved is not None else seen_until) - opened)
            o["last_opened_at"] = max(o["last_opened_at"], opened)
            o["open"] = o["open"] or resolved is None
        if resolved is not None and since <= resolved <= now:
            s.repairs += 1
            s.repair_seconds += max(0.0, resolved - opened)
    worst = sorted(offenders.values(), key=lambda o: (-o["failures"], -o["down_seconds"], o["component"]))[:WORST]
    return {"since": since, "until": now, "watched_seconds": watched, "runs": len(runs),
            "classes": [stats[c].as_dict() for c in CLASSES], "worst": worst, "nvlink_faults": sides}


def human_seconds(s: float | None) -> str:
    if s is None:
        return "-"
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if s >= size:
            return f"{s / size:.1f} {unit}"
    return f"{s:.0f} s"


def format_report(rep: dict[str, Any], node: str, rack: str) -> str:
    """The report as `supernode-agent report` prints it."""
    days = (rep["until"] - rep["since"]) / 86400
    lines = [f"reliability seen by {node} (rack {rack}) over the last {days:g} d: the agent watched "
             f"{human_seconds(rep['watched_seconds'])} in {rep['runs']} run(s)", ""]
    rows = [["CLASS", "COMPONENTS", "FAILURES", "MTBF", "MTTR", "REPAIRS"]]
    for c in rep["classes"]:
        if c["mtbf_seconds"] is not None:
            mtbf = human_seconds(c["mtbf_seconds"])
        elif c["observed_seconds"] is not None and c["components"]:
            mtbf = f"> {human_seconds(c['observed_seconds'])}"  # none failed: more than what was watched
        else:
            mtbf = "-"
        rows.append([c["class"], "?" if c["components"] is None else str(c["components"]), str(c["failures"]),
                     mtbf, human_seconds(c["mttr_seconds"]), str(c["repairs"])])
    lines += _columns(rows)
    sides = rep.get("nvlink_faults") or {}
    lines += ["", f"NVLink faults: {sides.get('switch_side', 0)} switch-side (an NVSwitch chip, attributed across "
                  f"the rack), {sides.get('tray_side', 0)} tray-side (a tray's own links)", ""]
    if rep["worst"]:
        lines.append("worst offenders:")
        rows = [["CLASS", "COMPONENT", "FAILURES", "DOWN", "LAST FAILURE"]]
        for o in rep["worst"]:
            last = time.strftime("%Y-%m-%d %H:%M", time.localtime(o["last_opened_at"]))
            rows.append([o["class"], o["component"], str(o["failures"]),
                         human_seconds(o["down_seconds"]) + (" (still open)" if o["open"] else ""), last])
        lines += _columns(rows)
    else:
        lines.append("no component failed in the window")
    return "\n".join(lines) + "\n"


def _columns(rows: list[list[str]]) -> list[str]:
    import io

    from agent.remediation.api import _table

    out = io.StringIO()
    _table(rows, out)
    return out.getvalue().splitlines()
