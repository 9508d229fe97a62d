"""What the status page shows, as JSON built from the snapshot, the inventory and the remediation engine.

Why the page gets a view and not the raw snapshot: one GB200 node is ~2,500 readings; the page needs
a few hundred numbers and a word for each state (wet, capped, down, failing). Computing them here,
once per update for every open page, keeps the browser's work small and the judgement in one place
(the same thresholds the detectors use). Every string a device or an alert supplied is passed on as
data; the page only ever puts it in text nodes (agent/status/status.js).

States carry a word, never only a colour: `ok`, `wet`, `fault`, `unknown`, `down`, `capped`...

The builder remembers counter values between builds (NVLink errors, link flaps), so "errors rising"
and "flapping" mean "seen rising in the last minute(s) while a page was open"; everything else is
read from the snapshot as it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Mapping

from agent.snapshot import Snapshot, SourceState
from agent.remediation.leak_scope import SCOPE_OF_DETECTOR, SCOPES
from agent.remediation.xid_recovery import xid_class

if TYPE_CHECKING:
    from agent.config import Inventory
    from agent.remediation.settings import DetectorSettings

NVLINK_ERRORS_RECENT = 60.0  # seconds an NVLink error counter rise keeps its link marked
FLAP_WINDOW = 300.0          # seconds a flap keeps its port marked "flapping"
M3S_TO_LPM = 60000.0


def _num(v: float | None, digits: int = 1) -> float | None:
    return None if v is None else round(v, digits)


def _by(snap: Snapshot, metric: str, *keys: str) -> dict[tuple[str, ...], float]:
    """OK readings of one family keyed by the given labels (the last one wins)."""
    out: dict[tuple[str, ...], float] = {}
    for r in snap.select(metric):
        if r.ok:
            out[tuple(r.label(k) for k in keys)] = r.value
    return out


NOT_READ = "not read"  # a GPU's mark when no fresh reading of it exists (status.js counts these apart)
_NO_PLATE = {"thermal_resistance": None, "thermal_resistance_baseline": None, "thermal_resistance_over_baseline": None,
             "thermal_resistance_degraded": False, "thermal_resistance_unavailable": None}


def _plates(snap: Snapshot, ratio: float) -> dict[str, dict[str, Any]]:
    """GPU -> its cold plate's thermal resistance (K/W) now, its learnt baseline, how far above it (a share), whether
    that is more than cold_plate_degraded_ratio, and why R is missing (the reason of
    supernode_gpu_thermal_resistance_unavailable), from the derived source (agent/derived_thermal.py)."""
    r = _by(snap, "supernode_gpu_thermal_resistance_kelvin_per_watt", "gpu")
    base = _by(snap, "supernode_gpu_thermal_resistance_baseline_kelvin_per_watt", "gpu")
    why = {k[0]: k[1] for k, v in _by(snap, "supernode_gpu_thermal_resistance_unavailable", "gpu", "reason").items()
           if v >= 0.5}
    out = {}
    for gpu in {k[0] for k in r} | {k[0] for k in base} | set(why):
        now, b = r.get((gpu,)), base.get((gpu,))
        over = now / b - 1 if now is not None and b else None
        out[gpu] = {"thermal_resistance": _num(now, 4), "thermal_resistance_baseline": _num(b, 4),
                    "thermal_resistance_over_baseline": _num(over, 3),
                    "thermal_resistance_degraded": over is not None and over > ratio,
                    "thermal_resistance_unavailable": None if now is not None else why.get(gpu)}
    return out


def _gpu_order(gpu: str) -> tuple[bool, int, str]:
    """GPUs in index order (numbers first, as numbers)."""
    return (not gpu.isdigit(), int(gpu) if gpu.isdigit() else 0, gpu)


def _fault(row: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The GPU fault judge's word on one GPU for the page: its last XID with NVIDIA's catalogue text, the recovery
    the ladder recommends (and the rule that chose it), and the last recovery it took; None when there is none."""
    if not row or (row.get("last_xid") is None and row.get("recommended") in (None, "none")
                   and row.get("last_recovery") is None):
        return None
    xid = row.get("last_xid") or {}
    rec = row.get("last_recovery") or {}
    return {"xid": xid.get("code"), "mnemonic": xid.get("mnemonic", ""), "description": xid.get("description", ""),
            "recommended": row.get("recommended") or "none", "rule": row.get("rule") or "",
            "taken": (f"{rec['action']} {'done' if rec.get('ok') else 'failed'}" if rec.get("action") else ""),
            "taken_why": rec.get("why", "")}


class Rising:
    """Remembers when each counter last increased: `recent(key, value, now, window)`."""

    def __init__(self) -> None:
        self._last: dict[Any, tuple[float, float | None]] = {}

    def recent(self, key: Any, value: float, now: float, window: float) -> bool:
        prev = self._last.get(key)
        if prev is None:
            self._last[key] = (value, None)
            return False
        old, changed = prev
        if value > old:
            changed = now
        self._last[key] = (value, changed)
        return changed is not None and now - changed <= window

    def prune(self, keep: Iterable[Any]) -> None:
        keep = set(keep)
        for k in [k for k in self._last if k not in keep]:
            del self._last[k]


class ViewBuilder:
    """Builds the page's node card and rack view; one per agent (it keeps the counters' history)."""

    def __init__(self) -> None:
        self.nvlink_errors = Rising()
        self.flaps = Rising()

    # -- this node ------------------------------------------------------------------------

    def node_card(self, snap: Snapshot, inventory: "Inventory", node: str, detectors: "DetectorSettings",
                  identity: Mapping[str, str],
                  gpu_faults: Mapping[str, Mapping[str, Any]] | None = None) -> dict[str, Any]:
        """This node's GPUs (temperature, power vs limit, capped, marks, NVLink cells) and ports."""
        now = snap.taken_at
        return {"name": node, "agent": dict(identity), "taken_at": now,
                "gpus": self._gpus(snap, inventory, detectors, now, node, gpu_faults or {}),
                "ports": self._ports(snap, now),
                "expected_gpus": inventory.gpus.count}

    def _gpus(self, snap: Snapshot, inventory: "Inventory", s: "DetectorSettings", now: float, node: str,
              gpu_faults: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
        up = _by(snap, "supernode_gpu_up", "gpu")
        # an index NVML no longer enumerates: the exporter fills it with supernode_gpu_up 0 and an empty uuid
        unnamed = {r.label("gpu") for r in snap.select("supernode_gpu_up") if r.ok and not r.label("uuid")}
        hung = _by(snap, "supernode_gpu_hung", "gpu")
        temp = _by(snap, "supernode_gpu_temperature_celsius", "gpu", "sensor")
        slowdown = _by(snap, "supernode_gpu_temperature_threshold_celsius", "gpu", "threshold")
        power = _by(snap, "supernode_gpu_power_watts", "gpu")
        limits = _by(snap, "supernode_gpu_power_limit_watts", "gpu", "limit")
        last_xid = _by(snap, "supernode_gpu_last_xid", "gpu")
        plates = _plates(snap, s.cold_plate_degraded_ratio)
        names = {r.label("gpu"): r.label("name") for r in snap.select("supernode_gpu_info") if r.ok}
        recovery = {k[0]: k[1] for k, v in _by(snap, "supernode_gpu_recovery_action", "gpu", "action").items()
                    if v >= 0.5 and k[1] not in ("none", "")}
        links: dict[str, dict[int, str]] = {}
        for (gpu, link), v in _by(snap, "supernode_nvlink_up", "gpu", "link").items():
            if link.isdigit():
                links.setdefault(gpu, {})[int(link)] = "ok" if v >= 0.5 else "down"
        for r in snap.select("supernode_nvlink_bit_error_rate", kind="effective"):
            cells = links.setdefault(r.label("gpu"), {})
            link = r.label("link")
            if r.ok and link.isdigit() and r.value > s.nvlink_effective_ber and cells.get(int(link)) != "down":
                cells[int(link)] = "ber"
        counted = set(s.nvlink_error_types)
        totals: dict[tuple[str, str], float] = {}
        for r in snap.select("supernode_nvlink_errors_total"):
            if r.ok and r.label("type") in counted:
                key = (r.label("gpu"), r.label("link"))
                totals[key] = totals.get(key, 0.0) + r.value
        for (gpu, link), total in totals.items():
            if self.nvlink_errors.recent((gpu, link), total, now, NVLINK_ERRORS_RECENT) and link.isdigit():
                cells = links.setdefault(gpu, {})
                if cells.get(int(link)) == "ok":
                    cells[int(link)] = "errors"
        self.nvlink_errors.prune(totals)
        seen = {k[0] for k in up} | set(names) | {k[0] for k in power}
        out = []
        for gpu in seen:  # listed in index order below, with the inventory's unread ones
            default = limits.get((gpu, "default"))
            enforced = limits.get((gpu, "enforced")) or limits.get((gpu, "current"))
            capped = default is not None and enforced is not None and enforced < default - 0.5
            marks = []
            if hung.get((gpu,), 0.0) >= 0.5:
                marks.append("hung")
            elif up.get((gpu,), 1.0) < 0.5:
                marks.append("missing" if gpu in unnamed else "lost")
            xid = int(last_xid.get((gpu,), 0.0))
            if xid:
                marks.append(f"XID {xid} ({xid_class(xid)})")
            if gpu in recovery:
                marks.append(f"recovery: {recovery[gpu]}")
            cells = links.get(gpu, {})
            width = max(cells, default=-1) + 1
            out.append({
                "index": gpu, "name": names.get(gpu, ""),
                "temperature_celsius": _num(temp.get((gpu, "gpu"))),
                "slowdown_celsius": _num(slowdown.get((gpu, "slowdown"))),
                "power_watts": _num(power.get((gpu,)), 0), "limit_watts": _num(enforced, 0),
                "default_limit_watts": _num(default, 0), "capped": capped, "marks": marks,
                # one state per link, in link order: ok | down | ber | errors | unknown (not reported)
                "nvlink": [cells.get(i, "unknown") for i in range(width)],
                "fault": _fault(gpu_faults.get(f"{node}/{gpu}")),
                **plates.get(gpu, _NO_PLATE),
            })
        # Inventory GPUs with no fresh reading at all: NVML has said nothing of them (its source failing or stale,
        # or not polled yet), which is not knowing, never "missing" (a GPU NVML answered without: marked above).
        unread = [str(i) for i in range(inventory.gpus.count) if str(i) not in seen]
        for gpu in unread[:max(0, inventory.gpus.count - len(out))]:
            out.append({"index": gpu, "name": "", "temperature_celsius": None, "slowdown_celsius": None,
                        "power_watts": None, "limit_watts": None, "default_limit_watts": None, "capped": False,
                        "marks": [NOT_READ], "nvlink": [], "fault": _fault(gpu_faults.get(f"{node}/{gpu}")), **_NO_PLATE})
        return sorted(out, key=lambda g: _gpu_order(g["index"]))

    def _ports(self, snap: Snapshot, now: float) -> list[dict[str, Any]]:
        up = {r.label("port"): (r.value >= 0.5, r.label("kind")) for r in snap.select("supernode_link_up") if r.ok}
        flaps = _by(snap, "supernode_link_flaps_total", "port")
        rx: dict[str, float] = {}
        for r in snap.select("supernode_optic_rx_power_dbm"):
            if r.ok:
                rx[r.label("port")] = min(rx.get(r.label("port"), r.value), r.value)
        warn = _by(snap, "supernode_optic_threshold_dbm", "port", "kind")
        out = []
        for port in sorted(set(up) | set(rx)):
            is_up, kind = up.get(port, (None, ""))
            flapping = self.flaps.recent(port, flaps.get((port,), 0.0), now, FLAP_WINDOW)
            low = warn.get((port, "rx_low_warning"))
            rx_min = rx.get(port)
            below = rx_min is not None and low is not None and rx_min < low
            state = "down" if is_up is False else "optic_low" if below else "flapping" if flapping else \
                "ok" if is_up else "unknown"
            out.append({"port": port, "kind": kind, "state": state, "up": is_up, "flapping": flapping,
                        "rx_min_dbm": _num(rx_min, 2), "rx_low_warning_dbm": _num(low, 2)})
        self.flaps.prune(up)
        return out

    # -- the rack's shared devices (as this agent polls them) ---------------------------------

    def coolant(self, snap: Snapshot, inventory: "Inventory") -> dict[str, Any]:
        temps = _by(snap, "supernode_cdu_temperature_celsius", "cdu", "loop", "point")
        flow = _by(snap, "supernode_cdu_flow_cubic_meters_per_second", "cdu", "loop")
        margin = _by(snap, "supernode_cdu_dew_point_margin_celsius", "cdu")
        heat = _by(snap, "supernode_cdu_heat_removed_watts", "cdu")
        running = _by(snap, "supernode_cdu_pump_running", "cdu", "pump")
        speed = _by(snap, "supernode_cdu_pump_speed_ratio", "cdu", "pump")
        alarms = _by(snap, "supernode_cdu_alarm_active", "cdu", "alarm")
        position = _by(snap, "supernode_cdu_valve_position_ratio", "cdu")
        models = {r.label("cdu"): r.label("model") for r in snap.select("supernode_cdu_info") if r.ok}
        cdus = []
        for d in inventory.cdus:
            n = d.name
            f = flow.get((n, "secondary"))
            pumps = sorted({p for (c, p) in running if c == n} | {p for (c, p) in speed if c == n})
            cdus.append({
                "name": n, "model": models.get(n, ""),
                "supply_celsius": _num(temps.get((n, "secondary", "supply"))),
                "return_celsius": _num(temps.get((n, "secondary", "return"))),
                "flow_lpm": _num(f * M3S_TO_LPM if f is not None else None),
                "dew_point_margin_celsius": _num(margin.get((n,))),
                "heat_removed_watts": _num(heat.get((n,)), 0),
                "pumps": [{"pump": p, "running": None if (n, p) not in running else running[(n, p)] >= 0.5,
                           "speed_ratio": _num(speed.get((n, p)), 2)} for p in pumps],
                "alarms": sorted(a for (c, a), v in alarms.items() if c == n and v >= 0.5),
                "valve_position_ratio": _num(position.get((n,)), 2),
                "reporting": any(k[0] == n for k in temps) or any(k[0] == n for k in flow),
            })
        return {"cdus": cdus, "zones": self._zones(snap, inventory)}

    def _zones(self, snap: Snapshot, inventory: "Inventory") -> list[dict[str, Any]]:
        wet = _by(snap, "supernode_leak_detected", "zone", "sensor")
        faults = _by(snap, "supernode_leak_sensor_fault", "zone", "sensor", "fault")
        valves = _by(snap, "supernode_cdu_valve_open", "cdu", "zone")
        bad_quality = {(r.label("zone"), r.label("sensor")) for r in snap.select("supernode_leak_detected") if not r.ok}
        zones = []
        for z in inventory.leak_zones:
            sensors: dict[str, dict[str, Any]] = {}
            for (zone, sensor), v in wet.items():
                if zone == z.name:
                    sensors.setdefault(sensor, {"sensor": sensor, "state": "dry", "faults": []})
                    if v >= 0.5:
                        sensors[sensor]["state"] = "wet"
            for zone, sensor in bad_quality:
                if zone == z.name:
                    sensors.setdefault(sensor, {"sensor": sensor, "state": "fault", "faults": []})["faults"].append(
                        "unreadable value")
            for (zone, sensor, fault), v in faults.items():
                if zone == z.name and v >= 0.5:
                    entry = sensors.setdefault(sensor, {"sensor": sensor, "state": "dry", "faults": []})
                    entry["faults"].append(fault)
                    if entry["state"] != "wet":
                        entry["state"] = "unknown" if fault == "source_down" else "fault"
            states = {e["state"] for e in sensors.values()}
            state = next((s for s in ("wet", "unknown", "fault", "dry") if s in states), "unknown")
            valve = None
            if z.valve and ":" in z.valve:
                cdu = z.valve.split(":", 1)[0]
                v = valves.get((cdu, z.name))
                valve = {"ref": z.valve, "state": "unknown" if v is None else "open" if v >= 0.5 else "closed"}
            zones.append({"name": z.name, "nodes": list(z.nodes), "state": state,
                          "sensors": sorted(sensors.values(), key=lambda e: e["sensor"]), "valve": valve})
        return zones

    def power(self, snap: Snapshot, inventory: "Inventory") -> dict[str, Any]:
        phase_a = _by(snap, "supernode_pdu_phase_current_amperes", "pdu", "inlet", "phase")
        phase_lim = _by(snap, "supernode_pdu_phase_current_limit_amperes", "pdu", "inlet", "phase")
        phase_w = _by(snap, "supernode_pdu_phase_power_watts", "pdu", "inlet", "phase")
        inlet_w = _by(snap, "supernode_pdu_inlet_power_watts", "pdu", "inlet")
        outlet_on = _by(snap, "supernode_pdu_outlet_on", "pdu", "outlet")
        models = {r.label("pdu"): r.label("model") for r in snap.select("supernode_pdu_info") if r.ok}
        pdus = []
        for p in inventory.pdus:
            phases = [{"inlet": i, "phase": ph, "current_amperes": _num(a, 2),
                       "limit_amperes": _num(phase_lim.get((pdu, i, ph)), 1),
                       "power_watts": _num(phase_w.get((pdu, i, ph)), 0)}
                      for (pdu, i, ph), a in sorted(phase_a.items()) if pdu == p.name]
            # An outlet with no fresh reading is not known to be on: said apart, never counted as "all on".
            off = [{"outlet": o, "feeds": n} for o, n in sorted(p.outlets.items())
                   if outlet_on.get((p.name, o), 1.0) < 0.5]
            unread = [{"outlet": o, "feeds": n} for o, n in sorted(p.outlets.items()) if (p.name, o) not in outlet_on]
            pdus.append({"name": p.name, "model": models.get(p.name, ""), "phases": phases,
                         "inlet_watts": _num(sum(w for (pdu, _), w in inlet_w.items() if pdu == p.name), 0)
                         if any(pdu == p.name for pdu, _ in inlet_w) else None,
                         "outlets_off": off, "outlets_unread": unread, "outlets_watched": len(p.outlets)})
        return {"rack_watts": _num(snap.value("supernode_rack_power_watts"), 0),
                "budget_watts": _num(snap.value("supernode_rack_power_budget_watts") or inventory.power_budget_watts, 0),
                "pdus": pdus}


def sources(states: Iterable[SourceState], now: float, remote: frozenset[tuple[str, str]] = frozenset(),
            idle: frozenset[tuple[str, str]] = frozenset()) -> list[dict[str, Any]]:
    """Every source's health in a word: up, stale (answered, but too long ago), failing (and why), waiting, idle.

    Rack coordination: a `remote` source is a shared device another agent polls (its polls reach this one, so
    its health is the device's); an `idle` one is read only by the rack leader, which this agent is not now."""
    out = []
    for st in sorted(states, key=lambda s: (s.source, s.device)):
        key = (st.source, st.device)
        if key in idle:
            state, why = "idle", "read by the rack leader only (this agent does not lead now)"
        elif st.last_attempt is None:
            state, why = "waiting", "polled by another agent: waiting for its polls" if key in remote else "not polled yet"
        elif not st.up:
            state, why = "failing", st.last_error or "last poll failed"
        elif not st.fresh(now):
            state, why = "stale", f"no answer for {now - (st.last_success or now):.0f} s"
        else:
            state, why = "up", "polled by another agent, its polls shared here" if key in remote else ""
        out.append({"source": st.source, "device": st.device, "state": state, "why": why,
                    "age_seconds": None if st.last_success is None else round(now - st.last_success, 1),
                    "interval_seconds": st.interval, "errors": sum(st.errors.values())})
    return out


def coordination(desc: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The rack coordination line: backend, up or degraded (why), the leader, the live agents, what is polled here."""
    if desc is None:
        return None
    return {"backend": desc["backend"], "state": "up" if desc["up"] else "degraded", "leader": desc.get("leader"),
            "this_agent_leads": bool(desc.get("leads")), "members": desc.get("members"),
            "polls_here": sorted(d for d, on in (desc.get("polling") or {}).items() if on),
            "polled_elsewhere": sorted(d for d, on in (desc.get("polling") or {}).items() if not on),
            "why": desc.get("why") or ""}


# -- incidents and their playbook steps -----------------------------------------------------

def _row_state(e: Any, pending_ids: set[str]) -> dict[str, Any] | None:
    """What one journal row says about its step on its target (None: nothing to show)."""
    d = e.detail or {}
    if e.kind == "intent":
        return {"state": "running", "why": ""}
    if e.kind == "blocked":
        return {"state": "blocked", "guardrail": d.get("guardrail", ""), "why": d.get("why", "")}
    if e.kind == "approval":
        if e.result == "pending":
            if e.action_id in pending_ids:
                return {"state": "waiting_approval", "approval": d.get("approval", ""), "why": ""}
            return None  # answered or expired: the next row says what happened
        if e.result == "approved":
            return {"state": "running", "why": f"approved by {d.get('approved_by', d.get('by', '?'))}"}
        if e.result == "refused" and e.action_id in pending_ids:  # a forged or stale approval: still waiting
            return {"state": "waiting_approval", "approval": d.get("approval", ""),
                    "why": f"an approval was refused ({d.get('why', '?')})"}
        return {"state": "blocked", "guardrail": "approval", "why": f"approval {e.result}"}
    if e.kind == "result":
        if e.result == "failed":
            return {"state": "failed", "why": str(d.get("error", ""))}
        if e.result in ("not_configured", "unknown"):
            return {"state": e.result, "why": str(d.get("why", ""))}
        return {"state": "done", "result": e.result, "why": str(d.get("message", ""))}
    return None


def step_states(incident_id: str, steps: list[Any], rows: Iterable[Any], pending_ids: set[str]) -> list[dict[str, Any]]:
    """Each playbook step of an incident with the state of each of its targets, from the journal rows."""
    from agent.remediation.steps import action_id

    out = [{"index": i, "action": s.action, "approval": s.approval, "targets": {}} for i, s in enumerate(steps)]
    ids: dict[str, tuple[int, str, str]] = {}
    for e in rows:
        if not e.action_id:
            continue
        key = ids.get(e.action_id)
        if key is None:
            target = e.target or ""
            for i in range(len(steps)):
                for phase in ("apply", "undo"):
                    if action_id(incident_id, i, target, phase) == e.action_id:
                        key = (i, target, phase)
            if key is None:
                continue
            ids[e.action_id] = key
        state = _row_state(e, pending_ids)
        if state is not None:
            i, target, phase = key
            out[i]["targets"][f"{phase}|{target}"] = {"target": target, "phase": phase, "action_id": e.action_id,
                                                      **state}
    for step in out:
        step["targets"] = list(step["targets"].values())
    return out


def incidents(engine: Any, rows_by_incident: Mapping[str, list[Any]], now: float) -> dict[str, Any]:
    """Open incidents with their steps' states, pending approvals, recently resolved, mode and breaker."""
    # This agent's own steps, then the rack's (etcd) that the leader waits on elsewhere: approving one of those
    # here (the page's Approve button) approves it in the rack's state, as `supernode-agent approve` does.
    pending = engine.pending_view()
    pending_ids = {p.id for p in engine.pending.values()}
    books = {b.name: b for b in engine.playbooks}
    open_ = []
    for inc in sorted(engine.incidents.open_incidents(), key=lambda i: i.opened_at):
        d = inc.as_dict(now)
        book = books.get(inc.playbook or "")
        d["steps"] = step_states(inc.id, list(book.steps), rows_by_incident.get(inc.id, []), pending_ids) \
            if book else []
        d["summary"] = str(inc.detail.get("summary", ""))
        open_.append(d)
    recent = [{"id": i.id, "detector": i.detector, "targets": i.targets, "severity": i.severity,
               "opened_at": i.opened_at, "resolved_at": i.resolved_at,
               "duration_seconds": round(i.duration(now), 1), "outcome": i.detail.get("resolution") or "resolved"}
              for i in engine.incidents.recent()[-10:]]
    return {"open": open_, "pending_approvals": pending, "recent": list(reversed(recent)), "mode": engine.mode,
            "breaker_open": engine.guard.breaker_open or engine.rack.breaker_open(),
            "maintenance": engine.maintenance.view(), "leak_scope": leak_scopes(engine.incidents.open_incidents())}


def leak_scopes(open_incidents: Iterable[Any]) -> list[dict[str, Any]]:
    """The leak scopes active now, widest first: each with what it covers, the trays it watches and its evidence."""
    out = [{"scope": SCOPE_OF_DETECTOR[i.detector], "incident_id": i.id, "targets": dict(i.targets),
            "watched": list(i.detail.get("watched") or []), "evidence": str(i.detail.get("evidence", ""))}
           for i in open_incidents if i.detector in SCOPE_OF_DETECTOR]
    return sorted(out, key=lambda d: -SCOPES.index(d["scope"]))


# Worst first: a cell shows the worst state of that link index over the tray's GPUs.
_LINK_RANK = {"down": 4, "ber": 3, "errors": 2, "unknown": 1, "ok": 0}


def nvlink_attribution(snap: Snapshot) -> dict[str, Any] | None:
    """This agent's verdict on the rack's NVLink failures (agent.coordination.link_share), or None where it does not
    attribute (no rack-scale NVLink domain, or its verdict aged out: coordination lost). The page says from it
    which switch chips, and so which switch trays, the rack calls at fault (the column the matrix shows)."""
    faults = [r for r in snap.select("supernode_nvlink_switch_fault") if r.ok]
    if not faults:
        return None
    tray_side = next((r.value for r in snap.select("supernode_nvlink_tray_side_links") if r.ok), 0.0)
    side = sorted(((int(r.label("switch_chip")), r.label("switch_tray")) for r in faults if r.value >= 0.5))
    return {"switch_side": [{"chip": k, "switch_tray": t} for k, t in side], "tray_side_links": int(tray_side)}


def nvlink_domain(nodes: Iterable[Mapping[str, Any]], switch_trays: Iterable[Any] = (),
                  attribution: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The NVLink domain as one matrix: a row per compute tray (this node and its peers, from the node cards the
    page already has), a column per NVLink index, which on GB200 NVL72 is the NVSwitch chip every GPU's link k
    reaches; each cell the worst state of that link over the tray's GPUs (down > ber > errors > unknown > ok).

    Why a matrix: a failing switch chip reads "link k down" on every tray at once, a column; a failing tray reads
    on its own row. `switch_trays` (inventory.switch_trays: name and chips) labels the columns by switch tray;
    without it, by chip only. A tray whose card is missing (agent unreachable, not configured) is a row of
    `unknown`, never a row of `ok`. `attribution` (nvlink_attribution) is the rack's verdict, passed through."""
    per_node = [(n, [list(g.get("nvlink") or []) for g in (n.get("card") or {}).get("gpus", [])]) for n in nodes]
    width = max((len(links) for _, gpus in per_node for links in gpus), default=0)
    trays = []
    for t in switch_trays:
        chips = sorted(int(c) for c in (getattr(t, "chips", None) or []))
        trays.append({"name": str(getattr(t, "name", "")), "chips": chips})
        width = max(width, max(chips, default=-1) + 1)
    chip_tray = {c: t["name"] for t in trays for c in t["chips"]}

    def worst(gpus: list[list[str]], k: int) -> str:
        states = [links[k] if k < len(links) and links[k] in _LINK_RANK else "unknown" for links in gpus]
        return max(states, key=_LINK_RANK.__getitem__, default="unknown")  # no GPU reported: unknown

    return {"chips": [{"index": k, "switch_tray": chip_tray.get(k, "")} for k in range(width)],
            "switch_trays": trays, "attribution": attribution,
            "rows": [{"node": n.get("name", ""), "reach": n.get("reach", ""),
                      "cells": [worst(gpus, k) for k in range(width)]} for n, gpus in per_node]}
