"""Goodput: how long each node was out of service, to what cause, and what that cost in GPU-hours and jobs.

Why from the journal: the journal is where the agent wrote, before and after, every drain and reboot it made
and every maintenance window a person set, so "what took node01 out, when, for how long, and which jobs were
on it" has one answer that survives restarts; the report and the agent's own counters
(`supernode_node_out_of_service_seconds_total`, agent/goodput_metrics.py) derive it here, the same way.

Definitions (README "Goodput"):

- An **outage** is an interval a node was out of service: `drained` (a drain the agent made and owned, from its
  result until its undo's `undone` row, or the `released` row of the last incident holding it: a person rejected
  them and took the node over), `rebooting` (a node_reboot from its intent until its
  result, done or failed) or `maintenance` (a person's maintenance window, on -> off or its `until`). A drain
  found already in place (someone else's, or another incident of ours) took nothing out: no outage.
- Its **cause** is the cause class of the incident behind it (`cause_of`: one table, `DETECTOR_CAUSE`; a
  detector not in it is `other`; a drill's incident, marked `drill` in its detail, is `drill`), or
  `maintenance`.
- **Overlaps are counted once**: while outages overlap on a node, the time goes to the one that started first
  (the one that took the node out), then to the next still running when it ends. A window clips outages at its
  edges; an outage still open runs up to now.
- **Observed time** of a node: from the agent's first start in the window (its journal's first `engine started`
  row, or the window's start if earlier) to now. **Availability** = 1 - out of service / observed.
  **GPU-hours lost** = the node's GPU count (inventory) x out-of-service hours.
- **Jobs interrupted**: the jobs on the node when the agent drained or rebooted it, listed in the step's plan
  (so in the intent on disk before the write), and the jobs a job_notify step requeued; `None` when the journal
  did not record them (a journal from before this), never 0.
- **MTBF / MTTR per cause** rest on `events` (outages that started in the window) and `repairs` (that ended in
  it): MTBF = the nodes' observed time / events; MTTR = mean outage length (whole, unclipped) over repairs.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

# The cause classes, in the report's order; `other` is a detector with no class below (an Alertmanager alert
# named after no detector of ours, a detector added without a class: tests/test_goodput.py refuses the latter).
CAUSES = ("leak", "cooling", "gpu_app", "gpu_reset", "gpu_reboot", "gpu_service", "gpu_other", "nvlink", "power",
          "links", "maintenance", "drill", "other")
DETECTOR_CAUSE: Mapping[str, str] = {
    "leak": "leak", "tray_leak_rack": "leak", "leak_sensor_fault": "leak", "leak_source_down": "leak",
    "leak_tray": "leak", "leak_loop": "leak",  # a tray's own leak, a leak with loss on the loop (leak scope)
    "coolant_flow_low": "cooling", "coolant_supply_hot": "cooling", "condensation_risk": "cooling",
    "gpu_thermal": "cooling",  # a GPU at its slowdown threshold: its cold plate, the loop's heat
    # the loop's own health (issue 35): a pump short of its spare, a clogging strainer, a low reservoir, a part due
    "pump_redundancy_lost": "cooling", "filter_clogging": "cooling", "reservoir_low": "cooling",
    "coolant_service_due": "cooling",
    # a fouling cold plate, a blocked tray manifold (issue 35): the GPU's cooling, not the GPU
    "cold_plate_degraded": "cooling", "tray_flow_low": "cooling",
    # The GPU recovery ladder's classes (exporters/profiles/nvml/xid-recovery.yaml: app, reset, reboot, service).
    "gpu_app_fault": "gpu_app", "gpu_reset_required": "gpu_reset", "gpu_reboot_required": "gpu_reboot",
    "gpu_service_required": "gpu_service",
    # GPU faults with no catalogue recovery class: a GPU gone from NVML, a degraded PCIe link, clocks held down.
    "gpu_lost": "gpu_other", "gpu_pcie_degraded": "gpu_other", "gpu_clock_slowdown": "gpu_other",
    "gpu_straggler": "gpu_other",
    "nvlink_errors": "nvlink", "gpu_fabric_degraded": "nvlink", "nvlink_switch_fault": "nvlink",
    "pdu_outlet_off": "power", "rack_power_over_budget": "power",
    "optic_degraded": "links",
    "sensor_fault": "other",  # a reading the agent could not take: no cause of its own, said as other
}
STATES = ("drained", "rebooting", "maintenance")


class GoodputError(Exception):
    """A journal row the report cannot read as what it says (named by its seq): no figure is printed."""


def cause_of(detector: str | None, detail: Mapping[str, Any] | None = None) -> str:
    """The cause class of an incident: `drill` when its detail marks it so, else the detector's, else other."""
    if isinstance(detail, Mapping) and (detail.get("drill") or (isinstance(detail.get("detail"), Mapping)
                                                                 and detail["detail"].get("drill"))):
        return "drill"
    return DETECTOR_CAUSE.get(detector or "", "other")


@dataclass
class Outage:
    node: str
    start: float
    end: float | None  # None: still out of service
    state: str
    cause: str
    seq: int  # the row that took the node out (ties in start go to the earlier row)
    incident_id: str | None = None
    detector: str | None = None
    jobs: list[str] | None = None  # None: not recorded
    attributed_seconds: float = 0.0  # its share of the node's out-of-service time in the window

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "start": self.start, "end": self.end, "state": self.state, "cause": self.cause,
                "incident_id": self.incident_id, "detector": self.detector, "jobs": self.jobs,
                "attributed_seconds": self.attributed_seconds}


def _number(e: Any, value: Any, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise GoodputError(f"journal row seq {e.seq} ({e.kind} {e.action or e.result or ''}): {what} {value!r} "
                           "is not a time")
    return float(value)


def _node(e: Any) -> str | None:
    target = dict(p.split("=", 1) for p in (e.target or "").split(",") if "=" in p)
    return target.get("node")


def _jobs(plan: Any) -> list[str] | None:
    jobs = plan.get("jobs") if isinstance(plan, Mapping) else None
    return [str(j) for j in jobs] if isinstance(jobs, list) else None


def incident_rows(entries: Iterable[Any]) -> dict[str, Mapping[str, Any]]:
    """incident id -> its latest journal row's detail (detector, targets, its own detail)."""
    return {e.incident_id: e.detail for e in entries
            if e.kind == "incident" and e.incident_id and isinstance(e.detail, Mapping)}


def _detector(inc: Mapping[str, Any]) -> str | None:
    return inc.get("detector") if isinstance(inc.get("detector"), str) else None


def check_times(entries: Iterable[Any]) -> None:
    """Every row's time is a number (SQLite stores what it is given): else GoodputError naming the row."""
    for e in entries:
        _number(e, e.ts, "ts")


def outages(entries: Iterable[Any]) -> list[Outage]:
    """Every outage the journal records, in the order the rows took the nodes out."""
    rows = list(entries)
    check_times(rows)
    incidents = incident_rows(rows)
    intents: dict[str, Any] = {}
    out: list[Outage] = []
    open_drain: dict[str, tuple[Outage, set[str]]] = {}  # target -> the drain outage still open, its holders
    open_reboot: dict[str, Outage] = {}  # action id -> the reboot outage still open
    maint: dict[str, Outage] = {}

    def made(e: Any, state: str, start: float, jobs: list[str] | None) -> Outage:
        inc = incidents.get(e.incident_id or "", {})
        detector = _detector(inc)
        o = Outage(_node(e) or "?", start, None, state, cause_of(detector, inc), e.seq, e.incident_id, detector, jobs)
        out.append(o)
        return o

    for e in rows:
        d = e.detail if isinstance(e.detail, Mapping) else {}
        phase = d.get("phase", "apply")
        if e.kind == "intent" and e.action_id:
            intents[e.action_id] = e
            if e.action == "node_reboot" and phase == "apply" and e.action_id not in open_reboot:
                open_reboot[e.action_id] = made(e, "rebooting", e.ts, _jobs(d.get("plan")))
        elif e.kind == "result" and e.action == "node_reboot" and e.action_id in open_reboot:
            open_reboot.pop(e.action_id).end = e.ts
        elif e.kind == "result" and e.action == "drain" and phase == "apply" and e.result == "done":
            before = d.get("before") if isinstance(d.get("before"), Mapping) else {}
            if e.target in open_drain:  # our drain in place: this incident holds it too, it took nothing out
                open_drain[e.target or ""][1].add(e.incident_id or "")
                continue
            if not before.get("owned"):
                continue  # someone else's drain in place: no outage of ours
            intent = intents.get(e.action_id or "")
            start = intent.ts if d.get("reconciled") and intent is not None else e.ts  # a crash: from the intent
            plan = intent.detail.get("plan") if intent is not None and isinstance(intent.detail, Mapping) else None
            open_drain[e.target or ""] = (made(e, "drained", start, _jobs(plan)), {e.incident_id or ""})
        elif e.kind == "result" and e.action == "drain" and phase == "undo" and e.target in open_drain:
            o, holders = open_drain[e.target or ""]
            if e.result in ("released", "kept"):  # one incident let go: the drain stays while another holds it
                holders.discard(e.incident_id or "")
            if e.result == "undone" or (e.result == "released" and not holders):
                o.end = e.ts
                del open_drain[e.target or ""]
        elif e.kind == "maintenance" and e.target:
            o = maint.pop(e.target, None)
            if o is not None:
                o.end = min(o.end, e.ts) if o.end is not None else e.ts
            if e.result == "on":
                until = d.get("until")
                o = Outage(e.target, e.ts, None if until is None else _number(e, until, "until"), "maintenance",
                           "maintenance", e.seq)
                out.append(o)
                maint[e.target] = o
    return out


def requeued_jobs(entries: Iterable[Any]) -> dict[str, list[str]]:
    """incident id -> the jobs its job_notify steps put back in the queue (an interruption without an outage)."""
    out: dict[str, list[str]] = {}
    for e in entries:
        d = e.detail if isinstance(e.detail, Mapping) else {}
        after = d.get("after") if isinstance(d.get("after"), Mapping) else {}
        if e.kind == "result" and e.action == "job_notify" and e.result == "done" and after.get("done") == "requeue":
            out.setdefault(e.incident_id or "?", []).extend(str(j) for j in after.get("told") or ())
    return out


def attribute(node_outages: list[Outage], lo: float, hi: float) -> float:
    """Split [lo, hi]'s out-of-service time among one node's outages, once: each piece to the earliest-started
    outage covering it. Sets `attributed_seconds`; returns the total (the union's length).

    A sweep over the outages' edges with a heap of those begun, earliest start on top (an ended one is dropped
    when it reaches the top): n log n, so a long-running agent's tracker stays cheap at every scrape."""
    spans = []
    for o in node_outages:
        o.attributed_seconds = 0.0
        a, b = max(o.start, lo), min(hi if o.end is None else o.end, hi)
        if b > a:
            spans.append((a, b, o))
    spans.sort(key=lambda s: s[0])
    cuts = sorted({t for a, b, _ in spans for t in (a, b)})
    begun: list[tuple[float, int, int, float, Outage]] = []  # (start, seq, i: a unique tie-break, end, outage)
    i = 0
    total = 0.0
    for a, b in zip(cuts, cuts[1:]):
        while i < len(spans) and spans[i][0] <= a:
            heapq.heappush(begun, (spans[i][2].start, spans[i][2].seq, i, spans[i][1], spans[i][2]))
            i += 1
        while begun and begun[0][3] <= a:
            heapq.heappop(begun)
        if begun:
            begun[0][4].attributed_seconds += b - a
            total += b - a
    return total


@dataclass
class CauseStats:
    out_of_service_seconds: float = 0.0
    gpu_seconds: float = 0.0
    events: int = 0
    repairs: int = 0
    repair_seconds: float = 0.0

    def add(self, other: "CauseStats") -> None:
        self.out_of_service_seconds += other.out_of_service_seconds
        self.gpu_seconds += other.gpu_seconds
        self.events += other.events
        self.repairs += other.repairs
        self.repair_seconds += other.repair_seconds

    def as_dict(self, observed: float, gpus_known: bool = True) -> dict[str, Any]:
        return {"out_of_service_seconds": self.out_of_service_seconds,
                "gpu_hours_lost": self.gpu_seconds / 3600 if gpus_known else None,
                "events": self.events, "repairs": self.repairs,
                "mtbf_seconds": observed / self.events if self.events and observed else None,
                "mttr_seconds": self.repair_seconds / self.repairs if self.repairs else None}


@dataclass
class JournalRead:
    """One agent's journal as the report reads it: its rows and the node it is the agent of (None: unknown)."""

    entries: list[Any]
    node: str | None = None
    source: str = ""


def first_start(entries: Iterable[Any]) -> float | None:
    starts = [e.ts for e in entries if e.kind == "engine" and e.result == "started"]
    return min(starts) if starts else None


def own_node(entries: Iterable[Any]) -> str | None:
    """The node whose agent wrote the journal, from its `engine started` rows (older journals: None)."""
    nodes = {e.detail.get("node") for e in entries if e.kind == "engine" and e.result == "started"
             and isinstance(e.detail, Mapping) and isinstance(e.detail.get("node"), str)}
    return nodes.pop() if len(nodes) == 1 else None


def goodput_report(journals: list[JournalRead], gpus_per_node: int | None, since: float, now: float,
                   nodes: Iterable[str] = ()) -> dict[str, Any]:
    """Per node and for the rack over [since, now]: out of service by cause and state, GPU-hours lost,
    availability, the incidents with their interrupted jobs, MTBF/MTTR per cause. `nodes` (the inventory's) are
    listed even when no journal read covers them: observed none, availability unknown (null), never 100 %."""
    per_node: dict[str, list[Outage]] = {}
    observed_from: dict[str, float] = {}
    requeued: dict[str, list[str]] = {}
    known: dict[str, Mapping[str, Any]] = {}
    for j in journals:
        known.update(incident_rows(j.entries))
        found = outages(j.entries)
        start = first_start(j.entries)
        covered = {o.node for o in found} | ({j.node} if j.node else set())
        for n in covered:
            if start is not None:
                observed_from[n] = min(observed_from.get(n, math.inf), max(start, since))
        for o in found:
            per_node.setdefault(o.node, []).append(o)
        for iid, jobs in requeued_jobs(j.entries).items():
            requeued.setdefault(iid, []).extend(jobs)
    gpus = gpus_per_node or 0  # unknown (no inventory): the GPU-hours are None below, never 0
    names = sorted(set(nodes) | set(per_node) | set(observed_from))
    node_out: dict[str, Any] = {}
    rack = {c: CauseStats() for c in CAUSES}
    rack_observed = rack_oos = 0.0
    incidents: dict[str, dict[str, Any]] = {}
    for n in names:
        mine = sorted(per_node.get(n, []), key=lambda o: (o.start, o.seq))
        lo = observed_from.get(n)
        if lo is None or lo >= now:
            node_out[n] = {"observed_seconds": 0.0, "availability": None, "gpu_hours_lost": None,
                           "out_of_service_seconds": None, "by_cause": {}, "by_state": {}}
            continue
        oos = attribute(mine, lo, now)
        stats = {c: CauseStats() for c in CAUSES}
        by_state = dict.fromkeys(STATES, 0.0)
        for o in mine:
            s = stats[o.cause]
            s.out_of_service_seconds += o.attributed_seconds
            s.gpu_seconds += o.attributed_seconds * gpus
            by_state[o.state] += o.attributed_seconds
            if lo <= o.start <= now:
                s.events += 1
                if o.incident_id:
                    inc = incidents.setdefault(o.incident_id, {"incident_id": o.incident_id, "cause": o.cause,
                                                                "detector": o.detector, "nodes": [], "jobs": None})
                    inc["nodes"] = sorted(set(inc["nodes"]) | {n})
                    if o.jobs is not None:
                        inc["jobs"] = sorted(set(inc["jobs"] or []) | set(o.jobs))
            if o.end is not None and lo <= o.end <= now:
                s.repairs += 1
                s.repair_seconds += o.end - o.start
        observed = now - lo
        for c in CAUSES:
            rack[c].add(stats[c])
        rack_observed += observed
        rack_oos += oos
        node_out[n] = {"observed_seconds": observed, "out_of_service_seconds": oos, "availability": 1 - oos / observed,
                       "gpu_hours_lost": None if gpus_per_node is None else oos * gpus / 3600, "by_state": by_state,
                       "by_cause": {c: stats[c].as_dict(observed, gpus_per_node is not None) for c in CAUSES if stats[c].events
                                    or stats[c].out_of_service_seconds},
                       "outages": [o.as_dict() for o in mine if o.attributed_seconds or lo <= o.start <= now]}
    for iid, jobs in requeued.items():
        row = known.get(iid, {})
        inc = incidents.setdefault(iid, {"incident_id": iid, "cause": cause_of(_detector(row), row),
                                         "detector": _detector(row), "nodes": [], "jobs": None})
        inc["jobs"] = sorted(set(inc["jobs"] or []) | set(jobs))
    for inc in incidents.values():
        inc["jobs_interrupted"] = None if inc["jobs"] is None else len(inc["jobs"])
    observed_nodes = [n for n in names if node_out[n]["availability"] is not None]
    return {"since": since, "until": now, "gpus_per_node": gpus_per_node,
            "rack": {"nodes": len(names), "nodes_observed": len(observed_nodes), "observed_seconds": rack_observed,
                     "out_of_service_seconds": rack_oos if observed_nodes else None,
                     "availability": 1 - rack_oos / rack_observed if rack_observed else None,
                     "gpu_hours_lost": rack_oos * gpus / 3600 if observed_nodes and gpus_per_node is not None
                     else None,
                     "by_cause": {c: rack[c].as_dict(rack_observed, gpus_per_node is not None) for c in CAUSES}},
            "nodes": node_out, "incidents": sorted(incidents.values(), key=lambda i: i["incident_id"])}
