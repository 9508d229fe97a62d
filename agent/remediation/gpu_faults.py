"""The GPU fault judge: per GPU, the recovery ladder class NVIDIA's catalogue and our rules ask for, until proven.

Why a judge and not a threshold: an XID is an event, and what it asks for depends on which XID (the catalogue's
immediate action, after the operator's overrides), on its history (the same XID five times on one GPU is the
GPU, not the job), on its scope (the same XID on several GPUs at once is the job), on the driver's own verdict
(NVML's recovery action, XID 154) and on what the ladder already did (agent/remediation/recovery_ledger.py). So
the judge keeps, per GPU, the XID events inside the longest rule window (bounded) and the outstanding fault:
its class, since when, the catalogue entry, the rule that chose it and the evidence. The four detectors
(detectors_gpu.py) read it; the rules are data (xid_recovery.py, exporters/profiles/nvml/xid-recovery.yaml).

The ladder over time:
- a recovery recorded after the fault's `since` that succeeded clears it (a gpu_reset covers reset; a
  node_reboot covers reset and reboot of every GPU of its node); a failed gpu_reset escalates reset -> reboot, a
  failed node_reboot escalates to service;
- the driver's held verdict (recovery action not none), a pending row remap (reset) and a failed one (service)
  keep the fault at least at their class while their readings say so;
- app is an event: it lapses `app_hold_seconds` after its last XID;
- service never clears by itself: only when the GPU was seen off the bus (a person took it out: reseat, swap)
  and reads healthy again, or answers with another uuid (a new board). The node's drain stays until a person
  resumes it (the service playbook's drain is not undone).

Time is the judge's clock (the engine's), the one the ledger's rows carry; a reading's own timestamp is only
used to tell a verdict read before a recovery from one read after it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from exporters.gpu.xid_catalogue import XidCatalogue, XidEntry

from .recovery_ledger import Recovery, RecoveryLedger
from .xid_recovery import LADDER, RANK, RecoveryRules

Key = tuple[str, str]  # (node, gpu)
HISTORY_SHOWN = 20  # XIDs told to the vendor in a service fault's detail
COVERS = {"gpu_reset": ("reset",), "node_reboot": ("reset", "reboot")}


@dataclass(frozen=True, slots=True)
class Fault:
    """The outstanding fault of one GPU: what the ladder must do, and why (every decision logs this)."""

    klass: str  # app | reset | reboot | service
    since: float
    rule: str
    why: str
    xid: int | None = None
    entry: Mapping[str, Any] = field(default_factory=dict)
    evidence: Mapping[str, Any] = field(default_factory=dict)

    def detail(self) -> dict[str, Any]:
        return {"class": self.klass, "xid": self.xid, **self.entry, "rule": self.rule, "why": self.why,
                "evidence": dict(self.evidence), "since": self.since}


@dataclass(slots=True)
class GpuReadings:
    """What one snapshot says of the GPUs, as the detector extracted it (deltas already taken)."""

    xids: list[tuple[str, str, int, int]] = field(default_factory=list)  # (node, gpu, xid, new events)
    verdicts: dict[Key, tuple[str, float]] = field(default_factory=dict)  # held recovery action: (label, reading ts)
    remap_pending: dict[Key, float] = field(default_factory=dict)  # -> reading ts (only those reading 1)
    remap_failure: dict[Key, float] = field(default_factory=dict)
    up: dict[Key, tuple[bool, str]] = field(default_factory=dict)  # -> (answers, uuid)
    serials: dict[Key, str] = field(default_factory=dict)


@dataclass(slots=True)
class _Gpu:
    events: deque  # (t, xid), oldest first, bounded
    fault: Fault | None = None
    last_xid: tuple[int, float] | None = None
    cleared_at: float = float("-inf")  # the last successful recovery that cleared a fault (its `at`)
    uuid: str = ""
    serial: str = ""
    left_bus: bool = False  # seen off the bus while in service: the person's visit


class GpuFaultJudge:
    def __init__(self, rules: RecoveryRules, catalogue: XidCatalogue, ledger: RecoveryLedger,
                 clock: Callable[[], float], overrides: Mapping[int, Any] | None = None,
                 app_hold_seconds: float = 60.0):
        self.rules = rules
        self.entries: dict[int, XidEntry] = {e.code: e for e in catalogue.xids}
        self.guidance = catalogue.guidance_classes
        self.ledger = ledger
        self.clock = clock
        self.overrides = dict(overrides or {})
        self.app_hold = app_hold_seconds
        self.gpus: dict[Key, _Gpu] = {}

    # -- the catalogue, after overrides -------------------------------------------------------------------

    def actions_of(self, code: int) -> tuple[str | None, str | None, bool]:
        """(immediate, investigatory, overridden) of one XID: the operator's override wins field by field."""
        entry = self.entries.get(code)
        imm = entry.immediate_action if entry else None
        inv = entry.investigatory_action if entry else None
        o = self.overrides.get(code)
        if o is not None:
            imm = o.immediate_action if o.immediate_action is not None else imm
            inv = o.investigatory_action if o.investigatory_action is not None else inv
        return imm, inv, o is not None

    def _entry(self, code: int) -> dict[str, Any]:
        e = self.entries.get(code)
        imm, inv, _ = self.actions_of(code)
        return {"mnemonic": e.mnemonic if e else "unknown", "description": e.description if e else
                "not in NVIDIA's XID catalogue", "immediate_action": imm, "investigatory_action": inv}

    # -- one snapshot --------------------------------------------------------------------------------------

    def _gpu(self, key: Key) -> _Gpu:
        g = self.gpus.get(key)
        if g is None:
            g = self.gpus[key] = _Gpu(deque(maxlen=self.rules.max_events_per_gpu))
        return g

    def update(self, r: GpuReadings) -> set[Key]:
        """Apply one snapshot's readings; returns the GPUs with a new app-class event (the app detector's event)."""
        now = self.clock()
        for key, (ok, uuid) in r.up.items():
            self._presence(key, ok, uuid)
        for key, serial in r.serials.items():
            self._gpu(key).serial = serial
        for key in (*r.verdicts, *r.remap_pending, *r.remap_failure):
            self._gpu(key)
        new = [(node, gpu, xid, n) for node, gpu, xid, n in r.xids if n > 0]
        for node, gpu, xid, n in new:  # every event first: the scope rule sees the whole snapshot, in any order
            g = self._gpu((node, gpu))
            for _ in range(min(n, g.events.maxlen or n)):
                g.events.append((now, xid))
            g.last_xid = (xid, now)
        app_events: set[Key] = set()
        for node, gpu, xid, n in new:
            if self._xid((node, gpu), xid, n, now, r):
                app_events.add((node, gpu))
        for key, g in list(self.gpus.items()):
            self._floors(key, g, r, now)
            self._ladder(key, g, now)
        self._prune(now)
        return {k for k in app_events if (f := self.gpus[k].fault) is not None and f.klass == "app"}

    def _presence(self, key: Key, ok: bool, uuid: str) -> None:
        g = self._gpu(key)
        swapped = bool(g.uuid and uuid and uuid != g.uuid)
        if uuid:
            g.uuid = uuid
        if g.fault is not None and g.fault.klass == "service":
            if not ok:
                g.left_bus = True
            elif g.left_bus or swapped:  # a person's visit: the floors below raise it again if still faulty
                g.fault, g.left_bus, g.events = None, False, deque(maxlen=g.events.maxlen)

    def _xid(self, key: Key, xid: int, n: int, now: float, r: GpuReadings) -> bool:
        g = self._gpu(key)
        imm, _inv, overridden = self.actions_of(xid)
        entry = self.entries.get(xid)
        klass, why = self.rules.class_of(entry, imm)
        rule = "unknown_xid" if entry is None else "override" if overridden else \
            "catalogue" if imm is not None else "no_bucket"
        evidence: dict[str, Any] = {"new_events": n}
        if klass == "driver":  # XID 154: the verdict the driver holds now
            held = r.verdicts.get(key)
            m = self.rules.recovery_actions.get(held[0]) if held else None
            klass, rule = (m.klass, "xid154_driver_verdict") if m else ("ignore", "xid154_no_verdict")
            why = m.why if m else "XID 154 with the driver's recovery action none: the other XID decides"
            evidence["recovery_action"] = held[0] if held else "none"
        others = self._same_xid_elsewhere(key, xid, now)
        spread = len(others) + 1 >= self.rules.spread.min_gpus
        for rep in self.rules.repeats:
            if xid not in rep.xids:
                continue
            count = sum(1 for t, x in g.events if x == xid and t > now - rep.window_seconds)
            if count >= rep.count and RANK[rep.escalate_to] > RANK[klass] and not spread:
                klass, rule, why = rep.escalate_to, rep.name, rep.why
                evidence.update(count=count, threshold=rep.count, window_seconds=rep.window_seconds)
        if spread and klass == "app":
            s = self.rules.spread
            rule, why = s.name, s.why
            evidence.update(gpus=sorted([key[1], *others]), window_seconds=s.window_seconds)
        if klass == "ignore":
            return False
        self._raise(g, Fault(klass, now, rule, why, xid, self._entry(xid), evidence))
        return klass == "app"

    def _same_xid_elsewhere(self, key: Key, xid: int, now: float) -> list[str]:
        since = now - self.rules.spread.window_seconds
        return [k[1] for k, g in self.gpus.items() if k[0] == key[0] and k != key
                and any(x == xid and t > since for t, x in reversed(g.events))]

    @staticmethod
    def _raise(g: _Gpu, fault: Fault) -> None:
        """A fault at the current class or above replaces it (its since moves on: a recovery must follow the
        newest cause); a lower one leaves the higher fault in place."""
        if g.fault is None or RANK[fault.klass] >= RANK[g.fault.klass]:
            g.fault = fault

    def _floors(self, key: Key, g: _Gpu, r: GpuReadings, now: float) -> None:
        """What the readings say now (driver's verdict, row remap): the fault stays at least at their class.
        A reading taken before the last successful recovery is stale and says nothing."""
        floors = []
        held = r.verdicts.get(key)
        if held and held[1] > g.cleared_at and (m := self.rules.recovery_actions.get(held[0])):
            floors.append((m.klass, "driver_recovery_action", m.why, {"recovery_action": held[0]}))
        for readings, m, name in ((r.remap_pending, self.rules.row_remap.pending, "row_remap_pending"),
                                  (r.remap_failure, self.rules.row_remap.failure, "row_remap_failure")):
            ts = readings.get(key)
            if ts is not None and ts > g.cleared_at:
                floors.append((m.klass, name, m.why, {}))
        for klass, rule, why, evidence in floors:
            if klass in LADDER and (g.fault is None or RANK[klass] > RANK[g.fault.klass]):
                g.fault = Fault(klass, now, rule, why, None, {}, evidence)

    def _ladder(self, key: Key, g: _Gpu, now: float) -> None:
        f = g.fault
        if f is None:
            return
        if f.klass == "app":
            if now - f.since >= self.app_hold:
                g.fault = None
            return
        if f.klass == "service":
            return
        for rec in self.ledger.since(key[0], key[1], f.since):
            f = g.fault
            if f is None or f.klass not in COVERS["node_reboot"] or rec.at <= f.since:
                continue
            if rec.ok and f.klass in COVERS.get(rec.action, ()):
                g.fault, g.cleared_at = None, rec.at
            elif not rec.ok and rec.action == "gpu_reset" and f.klass == "reset":
                g.fault = Fault("reboot", rec.at, "reset_failed", "the GPU reset did not recover it: reboot",
                                f.xid, f.entry, {"recovery": _rec(rec), "was": f.rule})
            elif not rec.ok and rec.action == "node_reboot":
                g.fault = Fault("service", rec.at, "reboot_failed", "the node reboot did not recover it: service",
                                f.xid, f.entry, {"recovery": _rec(rec), "was": f.rule})

    def _prune(self, now: float) -> None:
        horizon = now - self.rules.longest_window
        for g in self.gpus.values():
            while g.events and g.events[0][0] <= horizon:
                g.events.popleft()

    # -- what the detectors, the metrics and the status page read -------------------------------------------

    # Read from the loop thread (metrics, status page, resume check) while detection may add GPUs: each reader
    # copies the dict first (list() of a dict holds the GIL throughout).

    def faults(self) -> dict[Key, Fault]:
        return {k: g.fault for k, g in list(self.gpus.items()) if g.fault is not None}

    def klass(self, key: Key) -> str | None:
        g = self.gpus.get(key)
        return g.fault.klass if g is not None and g.fault is not None else None

    def node_fault(self, node: str) -> Fault | None:
        """The worst outstanding fault of a node's GPUs (app excluded: it never holds a node out)."""
        worst = [g.fault for k, g in list(self.gpus.items()) if k[0] == node and g.fault and g.fault.klass != "app"]
        return max(worst, key=lambda f: RANK[f.klass], default=None)

    def vendor_report(self, key: Key) -> dict[str, Any]:
        """For a service fault: what to tell the vendor."""
        g = self.gpus[key]
        inv = g.fault.entry.get("investigatory_action") if g.fault else None
        return {"investigatory_action": inv, "investigatory_text": self.guidance.get(inv or "", ""),
                "uuid": g.uuid, "serial": g.serial,
                "xid_history": [{"xid": x, "at": t} for t, x in list(g.events)[-HISTORY_SHOWN:]]}

    def restore(self, klass: str, node: str, gpu: str | None, since: float) -> None:
        """An incident restored from the journal after a restart: its fault holds again until proven (the XID
        history behind it is lost with the old process)."""
        keys = [k for k in self.gpus if k[0] == node] if gpu is None else [(node, gpu)]
        for key in keys or [(node, gpu or "")]:
            self._raise(self._gpu(key), Fault(klass, since, "restored", "restored from the journal after a restart"))

    def view(self) -> dict[str, dict[str, Any]]:
        """Per "node/gpu": last XID with its catalogue text, the recommended class and rule, the last recovery."""
        out: dict[str, dict[str, Any]] = {}
        for (node, gpu), g in sorted(list(self.gpus.items())):
            last_rec = self.ledger.since(node, gpu, float("-inf"))
            row: dict[str, Any] = {"last_xid": None, "recommended": g.fault.klass if g.fault else "none",
                                   "rule": g.fault.rule if g.fault else None,
                                   "last_recovery": _rec(last_rec[-1]) if last_rec else None}
            if g.last_xid is not None:
                code, at = g.last_xid
                e = self._entry(code)
                row["last_xid"] = {"code": code, "mnemonic": e["mnemonic"], "description": e["description"], "at": at}
            out[f"{node}/{gpu or '*'}"] = row  # '*': a node-wide fault restored before its GPUs were read
        return out


def _rec(r: Recovery) -> dict[str, Any]:
    return {"action": r.action, "ok": r.ok, "at": r.at, "why": r.why}
