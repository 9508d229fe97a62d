"""The remediation engine: detectors -> incidents -> playbooks -> guarded, journaled actions.

Why one object: the order matters and must hold under crashes and
concurrency. `start()` reconciles unfinished intents against real device
state before anything else; `on_snapshot` only hands work to the asyncio
loop (it runs on the publishing source's thread); each playbook runs as a
task; every decision (done, dry-run, blocked and by which guardrail,
failed, undone) lands in the journal before it is counted in metrics.
"""

from __future__ import annotations

import asyncio
import contextvars
import hashlib
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from agent.reliability import classify
from agent.snapshot import Snapshot

from .actions import ActionError, ActionResult, parse_target, target_str
from .calls import NVML
from .blast import SCHEDULER_UNREACHABLE, check_drain
from .decisions import LoggedJournal
from .journal import Journal, Retention
from .detectors import Context, Detectors
from .guardrails import MONOTONIC, Guardrails, Reservation
from .incidents import DURATION_BUCKETS, Incident, IncidentBook
from .maintenance import Maintenance
from .restored import seed_restored
from .resume import ResumeCheck
from .playbooks import Playbook, Step, find_playbook, load_playbooks
from .settings import RemediationSettings
from .ownership import carry_ownership, flip_for_undo, planned_after, rebuild_effects, verdict_result
from .steps import outcome, run_graph

log = logging.getLogger("supernode.remediation")
# Step targets on shared rack devices: the rack leader drives them.
SHARED_TARGETS = ("valve", "rack_valve", "outlets")
COORDINATION_LOST = "coordination_lost"  # guardrail and approval key of a shared step queued while degraded
# Set while a person approved a queued shared step in degraded mode: its write goes out without a leader's fence.
UNFENCED: contextvars.ContextVar[bool] = contextvars.ContextVar("supernode_unfenced", default=False)
UNKNOWN_RECHECK_SECONDS = 5.0  # how often an action reconciled as `unknown` is read again
MODES = ("observe", "dry-run", "enforce")
LEAK_SOURCES = ("leak", "redfish")  # source kinds whose first wet reading is re-read at once


@dataclass
class Executors:
    """What actions act through; the runtime fills the ones this node has.

    scheduler: SlurmScheduler or SimulatedScheduler; gpu_libs: node -> pynvml-like
    object; link_isolate/link_read, cdu_write/cdu_read, pdu_set/pdu_get: device callables.
    """

    scheduler: Any = None
    gpu_libs: dict[str, Any] = field(default_factory=dict)
    link_isolate: Any = None
    link_read: Any = None
    cdu_write: Any = None
    cdu_read: Any = None
    pdu_set: Any = None
    pdu_get: Any = None
    tray_power_set: Any = None  # (bmc, on) -> None: Redfish ComputerSystem.Reset of a tray
    tray_power_get: Any = None  # bmc -> bool (powered)


@dataclass
class Pending:
    """A step waiting for a person's approval."""

    id: str
    incident_id: str
    playbook: str
    action: str
    target: str
    phase: str  # apply | undo
    approval: str
    created_at: float
    expires_at: float
    future: asyncio.Future
    # a shared step the rack leader waits on (agent.coordination.rack_state): its record in etcd
    rack_id: str | None = None
    rack_revision: int | None = None  # create revision of the pending record: what an approval must name
    rack_created_at: float = 0.0
    rack_doc: dict[str, Any] | None = None
    refused: set[tuple[str, int]] = field(default_factory=set)  # (key, revision) of approvals refused already

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "incident_id": self.incident_id, "playbook": self.playbook, "action": self.action,
                "target": self.target, "phase": self.phase, "approval": self.approval,
                "created_at": self.created_at, "expires_at": self.expires_at}


class AmbiguousApproval(Exception):
    """An incident id names several pending steps: a person approves one by its id, or all of them (`all`)."""

    def __init__(self, steps: list[dict[str, Any]]):
        super().__init__(f"{len(steps)} steps pending")
        self.steps = steps


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:500]


def action_id(incident_id: str, step: int, target: str, phase: str = "apply") -> str:
    return hashlib.sha1(f"{incident_id}|{step}|{target}|{phase}".encode()).hexdigest()[:16]


class RemediationEngine:
    def __init__(self, settings: RemediationSettings, mode: str, identity: Any, inventory: Any,
                 journal_path: Path | str, executors: Executors | None = None, clock=time.time,
                 monotonic: Callable[[], float] = MONOTONIC):
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.settings = settings
        self.mode = mode
        self.repoll: Callable[[str], None] | None = None  # set by the agent: poll a source now
        self.identity = identity
        self.inventory = inventory
        self.clock = clock
        days = settings.journal_retention
        self.journal = LoggedJournal(journal_path, retention=Retention(
            *(None if d is None else d * 86400.0 for d in (days.resolved_incident_days, days.webhook_dedup_days))))
        self.incidents = IncidentBook(self.journal, clock)
        self.guard = Guardrails(settings.guardrails, monotonic)
        self.maintenance = Maintenance(self.journal, clock, identity.node)
        self.retries: dict[str, int] = {}  # action id -> scheduler_unreachable retries so far
        self.executors = executors or Executors()
        from agent.coordination.static import LocalRack  # the rack as the config alone says (no coordination)
        leader = settings.rack_leader or (inventory.nodes[0] if inventory.nodes else identity.node)
        self.rack: Any = LocalRack(leader, identity.node)
        self.playbooks: list[Playbook] = load_playbooks(settings.playbook_dir)
        self.detectors = Detectors(settings.detectors, Context(
            node=identity.node, rack=identity.rack, expected_gpus=inventory.gpus.count,
            power_budget_watts=inventory.power_budget_watts,
            outlet_feeds={(p.name, o): n for p in inventory.pdus for o, n in p.outlets.items()}), clock)
        self.actions = self._build_actions()
        self.resume_check = ResumeCheck(settings.resume_health_check, self.executors.gpu_libs, inventory.gpus.count,
                                        settings.exec_allow, self._xid_active)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.tasks: set[asyncio.Task] = set()
        self.pending: dict[str, Pending] = {}
        # (kind, target) -> {"before", "after", "params", "holders": {incident_id: action_id}}
        self.effects: dict[tuple[str, str], dict[str, Any]] = {}
        self.started = False
        self._reconciled = asyncio.Condition()  # notified when _recheck_unknown learnt something
        self.unknown_recheck_seconds = UNKNOWN_RECHECK_SECONDS
        # metrics
        self.actions_total: dict[tuple[str, str, str], int] = {}
        self.blocked_total: dict[tuple[str, str], int] = {}
        self.webhook_total: dict[str, int] = {}
        self.webhook_ignored: dict[str, int] = {}  # alerts (not requests) dropped by reason
        self.first_action_at: float | None = None
        self.component_failures: dict[str, int] = {}  # class -> failures counted (agent.reliability)
        self.repairs: dict[str, tuple[list[int], float, int]] = {}  # class -> duration histogram, opened -> resolved

    # -- construction ------------------------------------------------------------

    def _build_actions(self) -> dict[str, Any]:
        from .actions.device_adapters import CduWriteAction, IsolateLinkAction, PduOutletAction, TrayPowerAction
        from .actions.drain import DrainAction
        from .actions.exec import ExecAction
        from .actions.gpu_power_cap import GpuPowerCapAction
        from .actions.notify import NotifyAction

        ex, s = self.executors, self.settings
        acts: dict[str, Any] = {
            "gpu_power_cap": GpuPowerCapAction(ex.gpu_libs, s.device_timeout_seconds),
            "exec": ExecAction(s.exec_allow),
        }
        if s.notify_url:  # without a URL, notify steps are journaled as result not_configured (not a block)
            acts["notify"] = NotifyAction(s.notify_url, s.notify_timeout_seconds)
        if ex.scheduler is not None:
            acts["drain"] = DrainAction(ex.scheduler, s.slurm.checkpoint_signal)
        if ex.link_isolate and ex.link_read:
            acts["isolate_link"] = IsolateLinkAction(ex.link_isolate, ex.link_read,
                                                     {p.name for p in self.inventory.ports if p.isolatable})
        if ex.cdu_write and ex.cdu_read:
            acts["cdu_write"] = CduWriteAction(ex.cdu_write, ex.cdu_read)
        if ex.pdu_set and ex.pdu_get:
            acts["pdu_outlet"] = PduOutletAction(ex.pdu_set, ex.pdu_get)
        if ex.tray_power_set and ex.tray_power_get:
            acts["tray_power"] = TrayPowerAction(ex.tray_power_set, ex.tray_power_get)
        return acts

    # -- lifecycle ---------------------------------------------------------------

    async def start(self) -> None:
        """Reconcile the journal against real state, restore open incidents, then accept work.

        The journal is opened (a corrupt one moved aside) and read on a thread: the event loop also
        serves /metrics and pings the watchdog, and a slow disk must hold neither.
        """
        self.loop = asyncio.get_running_loop()
        await asyncio.to_thread(self.journal.open)
        await self.reconcile()
        self._rebuild_effects(await asyncio.to_thread(self.journal.entries))
        restored = await asyncio.to_thread(self.incidents.restore)
        await asyncio.to_thread(self.maintenance.restore)
        self.maintenance.publish_all()  # rack-wide: what a person set here holds on every agent
        # Resume the world, not only the journal: restored incidents are active in the fresh detectors,
        # so the first snapshots that no longer show their condition clear (and undo) them.
        seed_restored(self.detectors, self.incidents.open_incidents())
        self.journal.append("engine", result="started", detail={"mode": self.mode, "restored_incidents": restored})
        self.started = True
        self._undo_orphans()
        self._spawn(self._recheck_unknown())
        for inc in self.incidents.open_incidents():
            book = self._playbook_for(inc)
            if book is not None and inc.state in ("open", "mitigating"):
                self._spawn(self.run_playbook(inc, book))

    async def stop(self, close_journal: bool = True) -> None:
        """Stop acting; the journal is flushed and closed on a thread unless a successor engine adopts it."""
        self.started = False
        for p in list(self.pending.values()):
            if not p.future.done():
                p.future.cancel()
        for t in list(self.tasks):
            t.cancel()
        if self.tasks:
            await asyncio.gather(*self.tasks, return_exceptions=True)
        self.journal.append("engine", result="stopped")
        if close_journal:
            await asyncio.to_thread(self.journal.close)

    def adopt_journal(self, journal: Journal) -> None:
        """Use a predecessor's journal (a reload): its queued rows and sequence carry on, no second writer."""
        self.journal = journal
        self.incidents.journal = journal
        self.maintenance.journal = journal

    def _spawn(self, coro) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("remediation task failed: %r", task.exception(), exc_info=task.exception())

    async def reconcile(self) -> int:
        """Intents without results: read the real state and record what actually happened.

        A device that cannot be read gives `unknown` (not `failed`): the effect may be in place and
        ours, so it is held for undo and re-checked (`_recheck_unknown`) until the device answers.
        """
        n = 0
        for e in await asyncio.to_thread(self.journal.unfinished_intents):
            plan = e.detail.get("plan", {})
            phase = e.detail.get("phase", "apply")
            verdict = await self._verdict(e)
            self.journal.append("result", action_id=e.action_id, incident_id=e.incident_id, playbook=e.playbook,
                                action=e.action, target=e.target, result=verdict_result(verdict, phase),
                                detail={"reconciled": verdict, "phase": phase, "before": plan.get("before", {}),
                                        "after": planned_after(plan) if verdict == "applied" else {},
                                        "plan": plan, "params": e.detail.get("params", {}),
                                        **({"apply_action_id": e.detail["apply_action_id"]}
                                           if "apply_action_id" in e.detail else {})})
            n += 1
        return n

    async def _verdict(self, intent: Any) -> str:
        """applied / not_applied (seen from the intent's phase) or unknown, read from the real device."""
        act = self.actions.get(intent.action or "")
        if act is None:
            return "unknown"
        try:
            verdict = await act.reconcile(parse_target(intent.target or ""), intent.detail.get("params", {}),
                                          intent.detail.get("plan", {}))
        except Exception as exc:  # a reconcile must never stop the start
            return f"unknown ({exc})"
        return flip_for_undo(verdict, intent.detail.get("phase", "apply"))

    async def _recheck_unknown(self) -> None:
        """Re-read every action reconciled as `unknown` until its device answers; then journal what it found."""
        while True:
            entries = await asyncio.to_thread(self.journal.entries)
            intents = {e.action_id: e for e in entries if e.kind == "intent"}
            unknown = [e for e in entries if e.kind == "result" and e.result == "unknown"
                       and self.journal.last_result(e.action_id or "") is not None
                       and self.journal.last_result(e.action_id or "").seq == e.seq]
            if not unknown:
                return
            await asyncio.sleep(self.unknown_recheck_seconds)
            for e in unknown:
                intent = intents.get(e.action_id)
                verdict = await self._verdict(intent) if intent is not None else "unknown"
                if verdict_result(verdict, e.detail.get("phase", "apply")) == "unknown":
                    continue
                phase = e.detail.get("phase", "apply")
                self.journal.append("result", action_id=e.action_id, incident_id=e.incident_id,
                                    playbook=e.playbook, action=e.action, target=e.target,
                                    result=verdict_result(verdict, phase),
                                    detail={**e.detail, "reconciled": verdict,
                                            "after": e.detail.get("after") or planned_after(e.detail.get("plan", {}))})
                if verdict == "not_applied" and phase == "apply":
                    eff = self.effects.get((e.action or "", e.target or ""))
                    if eff is not None and eff["holders"].get(e.incident_id) == e.action_id:
                        del eff["holders"][e.incident_id]
                        if not eff["holders"]:
                            self.effects.pop((e.action or "", e.target or ""), None)
            async with self._reconciled:
                self._reconciled.notify_all()

    def _rebuild_effects(self, entries: list[Any]) -> None:
        """Effects still in place (applied, owned, not undone) from the journal: undo must know them after a restart."""
        self.effects.update(rebuild_effects(entries))

    def _undo_orphans(self) -> None:
        """Effects held by incidents that resolved before their undo finished (a crash during undo): undo again."""
        open_ids = {i.id for i in self.incidents.open_incidents()}
        seen: set[str] = set()
        for eff in list(self.effects.values()):
            for iid, book_name in eff.get("playbooks", {}).items():
                book = next((b for b in self.playbooks if b.name == book_name), None)
                if iid in open_ids or iid in seen or book is None or iid not in eff["holders"]:
                    continue
                seen.add(iid)
                ghost = Incident(id=iid, detector="", targets={}, severity="", source="", opened_at=0.0,
                                 state="resolved")
                self._spawn(self.run_undo(ghost, book))

    # -- detection ---------------------------------------------------------------

    def on_snapshot(self, snap: Snapshot, origin: str) -> None:
        """Store listener (any thread): hand the snapshot to the loop; never blocks."""
        loop = self.loop
        if loop is None or not self.started or loop.is_closed():
            return
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:  # a source's poll publishes on the loop: no wake-up through the loop's self-pipe
            loop.call_soon(self._evaluate, snap, origin)
        else:
            loop.call_soon_threadsafe(self._evaluate, snap, origin)

    def _evaluate(self, snap: Snapshot, origin: str = "") -> None:
        # Only the detectors this source feeds: a leak poll twice a second does not re-run the NVLink rates.
        for ev in self.detectors.evaluate(snap, snap.families_of(origin) if origin else None):
            if ev.kind == "fire":
                self.fire(ev.detector, ev.targets, ev.severity, "local", ev.detail)
            else:
                self.clear(ev.detector, ev.targets)
        # A first wet reading is confirmed by an immediate re-read of the same source rather than
        # a whole poll interval later: two consecutive polls, within one interval plus a few ms.
        # Any source of leak inputs (a Modbus leak controller, a Redfish tray BMC) is confirmed the same way.
        if self.repoll is not None and origin.split("/", 1)[0] in LEAK_SOURCES \
                and self.detectors.leak_awaiting_confirmation():
            self.repoll(origin)

    def fire(self, detector: str, targets: Mapping[str, str], severity: str, source: str = "local",
             detail: Mapping[str, Any] | None = None) -> Incident | None:
        if detector == "pdu_outlet_off" and ("pdu_outlet", target_str(targets)) in self.effects:
            return None  # the agent switched it off itself (a pdu_outlet step): not a failure
        failure = None
        if self.incidents.find(detector, targets) is None:
            failure = classify(detector, targets, detail or {}, self.identity.node,
                               {z.name: z.nodes for z in self.inventory.leak_zones})
            if failure is not None:
                detail = {**(detail or {}), "component": failure.as_dict()}
        inc, new = self.incidents.fire(detector, targets, severity, source, detail)
        if new and failure is not None:
            self.component_failures[failure.cls] = self.component_failures.get(failure.cls, 0) + 1
        if new:
            book = find_playbook(self.playbooks, detector, dict(targets))
            if book is not None:
                inc.playbook = book.name
                self._spawn(self.run_playbook(inc, book))
        return inc

    def clear(self, detector: str, targets: Mapping[str, str]) -> Incident | None:
        inc = self.incidents.find(detector, targets)
        if inc is None:
            return None
        self._close(inc, undo=True)
        return inc

    def _close(self, inc: Incident, undo: bool) -> None:
        was_open = inc.state != "resolved"
        self.incidents.transition(inc, "resolved")
        component = inc.detail.get("component")
        if was_open and inc.state == "resolved" and isinstance(component, dict) and component.get("class"):
            self._count_repair(str(component["class"]), inc.duration())
        self.rack.incident_closed(inc)
        for p in list(self.pending.values()):
            if p.incident_id == inc.id and (p.phase == "apply" or not undo) and not p.future.done():
                p.future.set_result(False)
        book = self._playbook_for(inc)
        if undo and book is not None and book.undo_on_resolve:
            self._spawn(self.run_undo(inc, book))

    def close_by_person(self, ident: str, who: str, reject: bool = False) -> Incident | None:
        """A person closes an open incident: `resolve` undoes its actions as the playbook says (approvals
        still apply); `reject` (a false alarm, or the person takes over) stops it and undoes nothing: its
        effects are released, never undone later. Journaled with who."""
        inc = self.incidents.get(ident)
        if inc is None or inc.state == "resolved":
            return None
        inc.detail = {**inc.detail, "closed_by": who, "resolution": "rejected" if reject else "resolved_by_person"}
        if reject:
            for (kind, tgt), eff in list(self.effects.items()):
                apply_id = eff["holders"].pop(inc.id, None)
                eff.get("playbooks", {}).pop(inc.id, None)
                if apply_id is None:
                    continue
                self.journal.append("result", action_id=action_id(inc.id, -1, tgt, "release"), incident_id=inc.id,
                                    playbook=inc.playbook, action=kind, target=tgt, result="released",
                                    detail={"phase": "undo", "apply_action_id": apply_id, "by": who,
                                            "why": "incident rejected: left as it is, for a person"})
                if not eff["holders"]:
                    del self.effects[(kind, tgt)]
        self._close(inc, undo=not reject)
        return inc

    @property
    def is_rack_leader(self) -> bool:
        """The agent that drives shared rack devices (CDU valves, PDU outlets): static, `rack_leader` or the first
        inventory node; etcd, the elected one (agent.coordination)."""
        return self.rack.is_leader()

    def use_rack(self, rack: Any) -> None:
        """Answer rack questions (leader, rack-wide guardrails, approvals) through coordination."""
        self.rack = rack
        self.maintenance.bind_rack(getattr(rack, "maintenance", None))  # rack-wide maintenance (both backends)
        rack.bind(self)  # one engine at a time (a reload binds its new one)

    def carry_on_as_leader(self) -> None:
        """Just elected: run the shared steps (valves, outlets) of open incidents that the old leader may have
        left half done; action ids and the rack's approval records keep each from running twice."""
        if not self.started or self.loop is None:
            return
        for inc in self.incidents.open_incidents():
            book = self._playbook_for(inc)
            if book is None:
                continue
            for idx, step in enumerate(book.steps):
                if step.targets in SHARED_TARGETS:
                    self._spawn(self._run_step_targets(inc, book, idx, step))

    def coordination_back(self) -> None:
        """Coordination returned: steps queued while degraded go to whoever leads now (its carry-on)."""
        for p in list(self.pending.values()):
            if p.approval == COORDINATION_LOST and not p.future.done():
                p.future.set_result(False)

    def _playbook_for(self, inc: Incident) -> Playbook | None:
        return next((b for b in self.playbooks if b.name == inc.playbook), None)

    # -- targets -----------------------------------------------------------------

    async def resolve_targets(self, kind: str, inc: Incident) -> list[dict[str, str]]:
        t, inv = inc.targets, self.inventory
        zone = next((z for z in inv.leak_zones if z.name == t.get("zone")), None)
        if kind == "none":
            return [{}]
        if kind == "nodes":
            nodes = list(zone.nodes) if zone is not None else ([t["node"]] if "node" in t else [])
            if inc.source == "local" or self.rack.role() == "degraded":
                # Every agent sees a rack-wide fault (a leak, the CDU); each drains only its own
                # node, so no two agents act on one node for one fault. Degraded (coordination lost),
                # an agent acts on its own node only, whatever the trigger.
                nodes = [n for n in nodes if n == self.identity.node]
            return [{"node": n} for n in nodes]
        if kind == "port":
            return [{"port": t["port"]}] if "port" in t else []
        if kind == "leaking_trays":
            return self._leaking_trays(inc)
        if kind in SHARED_TARGETS:
            role = self.rack.role()
            if role == "follower":
                return []  # shared rack devices are driven by one agent only: the rack leader
            if role == "degraded" and self.identity.node not in (zone.nodes if zone is not None else [t.get("node")]):
                return []  # degraded: only the endangered nodes' agents queue the shared step (for a person)
        if kind in ("valve", "rack_valve"):
            ref = getattr(inv, "rack_valve", None) if kind == "rack_valve" else (zone.valve if zone else None)
            if ref and ":" in ref:
                cdu, point = ref.split(":", 1)
                return [{"cdu": cdu, "point": point}]
            return []
        if kind == "outlets":
            nodes = set(zone.nodes) if zone is not None else {t.get("node")}
            return [{"pdu": p.name, "outlet": o} for p in inv.pdus for o, n in p.outlets.items() if n in nodes]
        if kind in ("gpus", "rack_gpus"):
            out = []
            for node, lib in self.executors.gpu_libs.items():
                if kind == "gpus" and zone is not None:
                    if node not in zone.nodes:
                        continue
                    indices = zone.gpus
                elif kind == "gpus":
                    if t.get("node", self.identity.node) != node:
                        continue
                    indices = [int(t["gpu"])] if t.get("gpu", "").isdigit() else None
                else:
                    indices = None
                if indices is None:
                    count = inv.gpus.count or await self._gpu_count(lib)
                    indices = list(range(count))
                out += [{"node": node, "gpu": str(i)} for i in indices]
            return out
        return []

    def _leaking_trays(self, inc: Incident) -> list[dict[str, str]]:
        """The trays whose own BMC detectors are wet in this leak (their sensor label starts with the BMC's
        inventory name); a local incident, or any while coordination is lost, acts only on this agent's own tray."""
        sensors = inc.detail.get("sensors") or ([inc.targets["sensor"]] if "sensor" in inc.targets else [])
        bmcs = {s.split("/", 1)[0] for s in sensors if isinstance(s, str)}
        trays = [e for e in getattr(self.inventory, "redfish", []) if e.kind == "tray" and e.name in bmcs]
        if inc.source == "local" or self.rack.role() == "degraded":
            trays = [e for e in trays if e.node == self.identity.node]
        return [{"bmc": e.name, "node": e.node} for e in trays]

    async def _gpu_count(self, lib: Any) -> int:
        """nvmlDeviceGetCount with a timeout on NVML's own pool: a hung driver fails the step, not the loop."""
        try:
            return int(await NVML(lib.nvmlDeviceGetCount, timeout=self.settings.device_timeout_seconds,
                                  key=(id(lib), "count")))
        except Exception as exc:  # DeviceCallTimeout, NVMLError
            raise ActionError(f"NVML device count: {type(exc).__name__}: {exc}") from None

    # -- playbooks ---------------------------------------------------------------

    async def run_playbook(self, inc: Incident, book: Playbook) -> None:
        """All steps at once in urgency order (`after:` waits), then the truthful outcome (steps.outcome)."""
        self.incidents.transition(inc, "mitigating")
        results = await run_graph(book.steps, lambda idx, step: self._run_step_targets(inc, book, idx, step))
        if inc.state != "resolved":
            inc.detail["steps"] = {f"{i}:{s.action}": r for i, (s, r) in enumerate(zip(book.steps, results))}
            self.incidents.transition(inc, outcome(book.steps, results, book.effective_mode(self.mode)))

    async def _run_step_targets(self, inc: Incident, book: Playbook, idx: int, step: Step) -> list[str]:
        """One step on each of its targets; a target list that cannot be read is a failed step, said why."""
        if inc.state == "resolved":
            return []
        if step.targets in SHARED_TARGETS and self.rack.role() == "follower" and self.rack.leader_node() is None:
            # Followers leave shared devices to the leader; with none, nobody would drive them: say so.
            self._block(inc, book, step, action_id(inc.id, idx, ""), "", "no_leader",
                        "the rack has no leader now: the agent elected next carries this step on")
            return ["blocked"]
        try:
            targets = await self.resolve_targets(step.targets, inc)
        except Exception as exc:  # ActionError (a device count), or a bug: this step fails, said why; no other
            return [self._result(inc, book, step, action_id(inc.id, idx, ""), "", "failed",
                                 {"phase": "apply", "error": f"targets: {_error_text(exc)}"})]
        return list(await asyncio.gather(*(self._run_step_isolated(inc, book, idx, step, tgt) for tgt in targets)))

    async def _run_step_isolated(self, inc: Incident, book: Playbook, idx: int, step: Step,
                                 target: Mapping[str, str]) -> str:
        """One step on one target, ending in its own recorded outcome whatever goes wrong inside it.

        Why: the steps of a playbook run together (a leak drains and caps at once); an exception from
        coordination (a value read from etcd), a device adapter or a bug in one of them used to propagate and
        cancel its siblings, so a bad record in etcd took the leak's GPU caps with the drain."""
        try:
            return await self.run_step(inc, book, idx, step, target)
        except Exception as exc:
            tgt = target_str(target)
            log.exception("remediation step failed", extra={"incident": inc.id, "action": step.action,
                                                             "target": tgt})
            return self._result(inc, book, step, action_id(inc.id, idx, tgt), tgt, "failed",
                                {"phase": "apply", "error": _error_text(exc), "exception": type(exc).__name__})

    def _count_repair(self, cls: str, seconds: float) -> None:
        buckets, total, count = self.repairs.get(cls, ([0] * len(DURATION_BUCKETS), 0.0, 0))
        for i, b in enumerate(DURATION_BUCKETS):
            if seconds <= b:
                buckets[i] += 1
        self.repairs[cls] = (buckets, total + seconds, count + 1)

    def _count(self, book: str, action: str, result: str) -> None:
        key = (book, action, result)
        self.actions_total[key] = self.actions_total.get(key, 0) + 1

    def _block(self, inc: Incident, book: Playbook, step: Step, aid: str, tgt: str, guardrail: str,
               why: str = "", phase: str = "apply") -> None:
        self.journal.append("blocked", action_id=aid, incident_id=inc.id, playbook=book.name, action=step.action,
                            target=tgt, result="blocked", detail={"guardrail": guardrail, "why": why, "phase": phase})
        self.blocked_total[(book.name, guardrail)] = self.blocked_total.get((book.name, guardrail), 0) + 1
        self._count(book.name, step.action, "blocked")

    def _node_of(self, target: Mapping[str, str]) -> str | None:
        """The node a step acts on (a GPU's, a drain's, an outlet's), for maintenance."""
        if "node" in target:
            return target["node"]
        pdu = next((p for p in self.inventory.pdus if p.name == target.get("pdu")), None)
        return pdu.outlets.get(target.get("outlet", "")) if pdu is not None else None

    async def _reserve(self, inc: Incident, book: Playbook, step: Step,
                       target: Mapping[str, str]) -> Reservation | tuple[str, str]:
        """The step's place in the guardrails when it may run now, else (guardrail, why in words).

        Why a place is held: the checks that await (the scheduler's count, etcd) and everything after them
        (plan, approval, the intent on disk) let other steps be checked meanwhile; they count this one."""
        g, tgt = self.guard, target_str(target)
        name = g.check_breaker() or g.check_rate(step.action) or g.check_cooldown(step.action, tgt)
        if name:
            return name, g.why(name, step.action, tgt)
        node = self._node_of(target)
        if self.maintenance.active(node):
            return "maintenance", self.maintenance.why(node)
        held = g.reserve(step.action, tgt)  # no await since the checks above
        try:
            blocked = None
            if step.action == "drain" and self.executors.scheduler is not None:
                blocked = await check_drain(self.executors.scheduler, g, self.inventory.nodes, target["node"],
                                            self.rack, held)
            blocked = blocked or await self.rack.reserve_action(step.action, g)  # rack-wide breaker, rates (etcd)
        except BaseException:
            held.release()
            raise
        if blocked:
            held.release()
            return blocked
        return held

    def _retry_later(self, inc: Incident, book: Playbook, idx: int, step: Step, target: Mapping[str, str]) -> float:
        """Run a step blocked by an unreachable scheduler again after a doubling delay, until it runs or the
        incident resolves; the playbook's other steps do not wait for it."""
        aid = action_id(inc.id, idx, target_str(target))
        n = self.retries.get(aid, 0)
        self.retries[aid] = n + 1
        g = self.settings.guardrails
        delay = min(g.retry_backoff_seconds * 2 ** n, g.scheduler_retry_max_seconds)

        async def again() -> None:
            await asyncio.sleep(delay)
            if self.started and inc.state != "resolved":
                await self._run_step_isolated(inc, book, idx, step, target)
        self._spawn(again())
        return delay

    def _xid_active(self, node: str) -> bool:
        tracker = self.detectors.trackers.get("gpu_xid_critical")
        return tracker is not None and (("node", node),) in tracker.active()

    async def _approve(self, inc: Incident, book: Playbook, step: Step, aid: str, tgt: str, phase: str,
                       key: str) -> bool:
        now = self.clock()  # shown to people as a time of day; the wait itself runs on the loop's monotonic clock
        fut = asyncio.get_running_loop().create_future()
        p = Pending(aid, inc.id, book.name, step.action, tgt, phase, key, now,
                    now + self.settings.guardrails.approval_expiry_seconds, fut)
        self.pending[aid] = p
        self.journal.append("approval", action_id=aid, incident_id=inc.id, playbook=book.name, action=step.action,
                            target=tgt, result="pending", detail={"approval": key, "phase": phase})
        ok = False
        if key != COORDINATION_LOST:
            self.rack.pending_added(p, inc)  # etcd: rack state, so any agent can approve and a new leader carries on
        try:
            async with asyncio.timeout(self.settings.guardrails.approval_expiry_seconds):
                ok = await fut
        except asyncio.TimeoutError:
            ok = False
            self.journal.append("approval", action_id=aid, incident_id=inc.id, result="expired")
        finally:
            self.pending.pop(aid, None)
            self.rack.pending_removed(p, bool(ok))
        return bool(ok)

    async def approve_anywhere(self, ident: str, who: str = "api", all_: bool = False,
                               token: str | None = None) -> list[str]:
        """Approve here, and in the rack's state (etcd) for a step the leader waits on, wherever it runs.

        `ident`: a step's id (action id or rack id) approves that step; an incident id approves its one pending
        step, and only with `all_` several (else AmbiguousApproval lists them). An incident id names one
        episode: this agent's incident, or the leader's (rack steps of an earlier episode of the same fault are
        never approved by it). `who`: the person as the API saw them (the token's name, or the certificate
        subject under mTLS); `token`: the admin token's name, which keys the rack approval's proof."""
        person = token or who
        subject = who if who != person else None
        local = [p for p in self.pending.values() if ident in (p.id, p.rack_id) and not p.future.done()]
        exact, rack = self.rack.approval_candidates(ident, list(self.incidents.all()))
        if local or exact:
            rack = [] if local else rack
        else:
            local = [p for p in self.pending.values() if p.incident_id == ident and not p.future.done()]
            waiting_here = {p.rack_id for p in self.pending.values() if p.rack_id}
            rack = [r for r in rack if r["id"] not in waiting_here]
        if len(local) + len(rack) > 1 and not all_:
            raise AmbiguousApproval([p.as_dict() for p in local] + rack)
        done = [self._approve_local(p, person, subject, all_) for p in local]
        for rid in await self.rack.approve([r["id"] for r in rack], person, subject, all_):
            self.journal.append("approval", action_id=rid, result="approved",
                                detail={"approved_by": person, "approved_via": self.identity.node, "rack": True,
                                        "all": all_, **({"subject": subject} if subject else {})})
            done.append(rid)
        return done

    def approve(self, ident: str, who: str = "api", all_: bool = False) -> list[str]:
        """Approve a pending step of this agent by its id, or an incident's one pending step (all of them only
        with `all_`: else AmbiguousApproval); returns what was approved."""
        live = [p for p in self.pending.values() if not p.future.done()]
        steps = [p for p in live if ident in (p.id, p.rack_id)] or [p for p in live if p.incident_id == ident]
        if len(steps) > 1 and not all_:
            raise AmbiguousApproval([p.as_dict() for p in steps])
        return [self._approve_local(p, who, None, all_) for p in steps]

    def _approve_local(self, p: Pending, who: str, subject: str | None, all_: bool) -> str:
        """Journal who approved (before the step acts on it), then let the step go on."""
        self.journal.append("approval", action_id=p.id, incident_id=p.incident_id, playbook=p.playbook,
                            action=p.action, target=p.target, result="approved",
                            detail={"approved_by": who, "approved_via": self.identity.node, "phase": p.phase,
                                    "all": all_, **({"subject": subject} if subject else {}),
                                    **({"rack_id": p.rack_id} if p.rack_id else {})})
        p.future.get_loop().call_soon_threadsafe(p.future.set_result, True)
        return p.id

    def reset_breaker(self, who: str = "api") -> bool:
        was = self.guard.reset_breaker()
        if self.rack.shared and self.loop is not None:
            self._spawn(self.rack.reset_breaker(who))
        self.journal.append("breaker", result="reset", detail={"by": who, "was_open": was})
        return was

    async def run_step(self, inc: Incident, book: Playbook, idx: int, step: Step, target: Mapping[str, str]) -> str:
        tgt = target_str(target)
        aid = action_id(inc.id, idx, tgt)
        last = self.journal.last_result(aid)
        if last is not None and last.result == "unknown":
            # reconciled as unknown (device unreadable at start): acting again blind could take over an
            # effect we cannot see; wait until _recheck_unknown has read the device
            async with self._reconciled:
                await self._reconciled.wait_for(lambda: self.journal.last_result(aid).result != "unknown")
            last = self.journal.last_result(aid)
        if last is not None and last.result in ("done", "dry_run"):
            return "duplicate"
        act = self.actions.get(step.action)
        mode = book.effective_mode(self.mode)
        ctx = {"incident_id": inc.id, "detector": inc.detector, **inc.targets,
               **{k: v for k, v in inc.detail.items() if isinstance(v, (int, float, str))}}
        if act is None and step.action == "notify":  # nobody to tell is a configuration fact, not a guardrail
            return self._result(inc, book, step, aid, tgt, "not_configured",
                                {"phase": "apply", "why": "no remediation.notify_url configured"})
        if act is None:
            self._block(inc, book, step, aid, tgt, "not_configured",
                        f"no executor for {step.action} on this agent (inventory or remediation settings)")
            return "blocked"
        if mode == "observe":
            self._block(inc, book, step, aid, tgt, "mode", "observe mode: the agent records what it would do")
            return "blocked"
        held = await self._reserve(inc, book, step, target)
        if not isinstance(held, Reservation):
            return self._blocked_step(inc, book, idx, step, aid, target, *held)
        try:
            return await self._act(inc, book, idx, step, aid, target, act, mode, ctx, held)
        finally:
            held.release()

    async def _act(self, inc: Incident, book: Playbook, idx: int, step: Step, aid: str, target: Mapping[str, str],
                   act: Any, mode: str, ctx: Mapping[str, Any], held: Reservation) -> str:
        """A step past the guardrails: approval, plan, intent on disk, the write, its result."""
        tgt = target_str(target)
        person_took_it = False
        if step.targets in SHARED_TARGETS and self.rack.role() == "degraded" and mode == "enforce":
            # Coordination lost: no agent can prove it leads. Queue the shared step: it runs here if a
            # person approves it, or goes to the leader when coordination returns.
            if not await self._approve(inc, book, step, aid, tgt, "apply", COORDINATION_LOST):
                self._block(inc, book, step, aid, tgt, COORDINATION_LOST,
                            "coordination lost: queued for a person or the rack leader; not approved here")
                return "blocked"
            person_took_it = True
        if self.guard.needs_approval(step.approval) and mode == "enforce" and not person_took_it:
            if not await self._approve(inc, book, step, aid, tgt, "apply", step.approval or ""):
                self._block(inc, book, step, aid, tgt, "approval", "not approved (expired or resolved)")
                return "blocked"
            if inc.state == "resolved":
                return "blocked"
        try:
            plan = await self._plan(act, target, step.params, ctx)
        except ActionError as exc:
            if exc.guardrail:
                return self._blocked_step(inc, book, idx, step, aid, target, exc.guardrail, str(exc))
            return self._result(inc, book, step, aid, tgt, "failed", {"error": str(exc), "phase": "apply"})
        plan = carry_ownership(plan, self.journal.intent(aid))
        if mode == "dry-run":
            return self._result(inc, book, step, aid, tgt, "dry_run", {"plan": plan, "phase": "apply"})
        seq = self.journal.append("intent", action_id=aid, incident_id=inc.id, playbook=book.name,
                                  action=step.action, target=tgt,
                                  detail={"plan": plan, "params": step.params, "phase": "apply"})
        on_disk = await self._intent_on_disk(seq, aid)
        if self.first_action_at is None:
            self.first_action_at = self.clock()
        token = UNFENCED.set(person_took_it)
        try:
            res = await self._attempt(lambda: act.apply(target, step.params, ctx, plan))
        except ActionError as exc:  # a guardrail only the write itself can check: the leader's fence
            self.blocked_total[(book.name, exc.guardrail or "")] = self.blocked_total.get((book.name, exc.guardrail or ""), 0) + 1
            return self._result(inc, book, step, aid, tgt, "blocked", {"phase": "apply", "guardrail": exc.guardrail,
                                                                       "why": str(exc), "not_applied": True,
                                                                       "intent_on_disk": on_disk})
        finally:
            UNFENCED.reset(token)
        held.commit()
        if isinstance(res, ActionResult):
            if not res.skipped or res.before.get("owned") is False:
                self._hold(step.action, tgt, inc.id, aid, res, step.params)
            return self._result(inc, book, step, aid, tgt, "done",
                                {"phase": "apply", "message": res.message, "before": res.before, "after": res.after,
                                 "skipped": res.skipped, "params": step.params, "intent_on_disk": on_disk})
        return self._result(inc, book, step, aid, tgt, "failed", {"phase": "apply", "error": res, "escalated": True,
                                                                  "intent_on_disk": on_disk})

    async def _intent_on_disk(self, seq: int, aid: str) -> bool:
        """Wait (bounded) until the intent row is committed, so a crash after the write still leaves the
        intent for the restart to reconcile. Why bounded: a slow or full state disk must delay a safety step
        by at most `intent_commit_wait_seconds`, never stop it; past that the step acts and its result says
        `intent_on_disk: false`."""
        if await self.journal.committed(seq, self.settings.intent_commit_wait_seconds):
            return True
        log.warning("acting before the intent reached the disk", extra={
            "action_id": aid, "journal_error": self.journal.last_error,
            "wait_seconds": self.settings.intent_commit_wait_seconds})
        return False

    def _blocked_step(self, inc: Incident, book: Playbook, idx: int, step: Step, aid: str,
                      target: Mapping[str, str], guardrail: str, why: str) -> str:
        if guardrail == SCHEDULER_UNREACHABLE:
            why = f"{why}; retry in {self._retry_later(inc, book, idx, step, target):g} s"
        self._block(inc, book, step, aid, target_str(target), guardrail, why)
        return "blocked"

    def _hold(self, kind: str, tgt: str, incident_id: str, aid: str, res: ActionResult, params: Mapping) -> None:
        eff = self.effects.get((kind, tgt))
        if eff is None:
            if not res.before.get("owned"):
                return  # not ours and nobody of ours holds it: nothing to undo later
            eff = self.effects[(kind, tgt)] = {"before": res.before, "after": res.after, "params": dict(params),
                                               "holders": {}}
        eff["holders"][incident_id] = aid

    async def _plan(self, act: Any, target: Mapping[str, str], params: Mapping[str, Any], ctx: Mapping[str, Any]) -> dict:
        """The step's plan (a read of the device's state), tried like the action itself: a dropped connection
        or one unanswered read before a valve close is retried within the attempt budget, not the end."""
        delay = self.settings.guardrails.retry_backoff_seconds
        for attempt in range(self.settings.guardrails.attempts_per_incident):
            try:
                return await act.plan(target, params, ctx)
            except ActionError as exc:
                if exc.permanent or attempt + 1 >= self.settings.guardrails.attempts_per_incident:
                    raise
            await asyncio.sleep(delay)
            delay *= 2
        raise ActionError("plan: no attempt left")

    async def _attempt(self, call) -> ActionResult | str:
        """Run with retries and backoff inside the attempt budget; returns the result or the last error."""
        delay = self.settings.guardrails.retry_backoff_seconds
        error = ""
        for attempt in range(self.settings.guardrails.attempts_per_incident):
            try:
                return await call()
            except ActionError as exc:
                if exc.guardrail is not None:
                    raise  # refused by a rule of ours at the write (fencing): a block, never retried
                error = str(exc)
                if exc.permanent:
                    break
            except Exception as exc:  # device libraries raise their own types
                error = f"{type(exc).__name__}: {exc}"
            if attempt + 1 < self.settings.guardrails.attempts_per_incident:
                await asyncio.sleep(delay)
                delay *= 2
        return error or "failed"

    def _result(self, inc: Incident, book: Playbook, step: Step, aid: str, tgt: str, result: str,
                detail: dict[str, Any]) -> str:
        self.journal.append("result", action_id=aid, incident_id=inc.id, playbook=book.name, action=step.action,
                            target=tgt, result=result, detail=detail)
        self._count(book.name, step.action, result)
        return result

    # -- undo --------------------------------------------------------------------

    async def run_undo(self, inc: Incident, book: Playbook) -> None:
        for idx in book.undo_sequence():
            step = book.steps[idx]
            if not step.undo:
                continue
            todo = [(kind, tgt, eff, eff["holders"][inc.id]) for (kind, tgt), eff in list(self.effects.items())
                    if kind == step.action and eff["holders"].get(inc.id) == action_id(inc.id, idx, tgt)]
            await asyncio.gather(*(self.undo_one(inc, book, idx, step, kind, tgt, eff, aid)
                                   for kind, tgt, eff, aid in todo))

    async def undo_one(self, inc: Incident, book: Playbook, idx: int, step: Step, kind: str, tgt: str,
                       eff: dict[str, Any], apply_id: str) -> str:
        aid = action_id(inc.id, idx, tgt, "undo")
        others = [i for i in eff["holders"] if i != inc.id]
        if others:
            del eff["holders"][inc.id]
            self.journal.append("result", action_id=aid, incident_id=inc.id, playbook=book.name, action=kind,
                                target=tgt, result="kept", detail={"phase": "undo", "apply_action_id": apply_id,
                                                                   "held_by": others})
            return "kept"
        mode = book.effective_mode(self.mode)
        if mode != "enforce":
            self._block(inc, book, step, aid, tgt, "mode", f"{mode} mode", phase="undo")
            return "blocked"
        target = parse_target(tgt)
        node = self._node_of(target)
        if self.maintenance.active(node):
            self._block(inc, book, step, aid, tgt, "maintenance", self.maintenance.why(node), phase="undo")
            return "blocked"
        approval = step.undo_approval
        if step.resume_check and kind == "drain":
            passed, why = await self.resume_check.run(target["node"])
            self.journal.append("health_check", action_id=aid, incident_id=inc.id, playbook=book.name, action=kind,
                                target=tgt, result="passed" if passed else "failed",
                                detail={"check": self.settings.resume_health_check, "why": why})
            if not passed and approval is None:
                approval = "resume_after_check"
        if self.guard.needs_approval(approval):
            if not await self._approve(inc, book, step, aid, tgt, "undo", approval or ""):
                self._block(inc, book, step, aid, tgt, "approval", f"undo not approved ({approval}): expired, "
                            "rejected or the agent stopped", phase="undo")
                return "blocked"
        act = self.actions[kind]
        seq = self.journal.append("intent", action_id=aid, incident_id=inc.id, playbook=book.name, action=kind,
                                  target=tgt, detail={
                                      "phase": "undo", "apply_action_id": apply_id, "params": eff["params"],
                                      # the apply's plan: reconcile asks "is the apply still in effect?"
                                      "plan": {"before": eff["before"], "want_watts": eff["after"].get("limit_watts"),
                                               "reason": eff["after"].get("reason", "")}})
        on_disk = await self._intent_on_disk(seq, aid)
        try:
            res = await self._attempt(lambda: act.undo(target, eff["before"], eff["after"], eff["params"]))
        except ActionError as exc:  # refused at the write (fencing): kept, for the leader or a person
            self.blocked_total[(book.name, exc.guardrail or "")] = self.blocked_total.get((book.name, exc.guardrail or ""), 0) + 1
            self.journal.append("result", action_id=aid, incident_id=inc.id, playbook=book.name, action=kind,
                                target=tgt, result="blocked", detail={"phase": "undo", "apply_action_id": apply_id,
                                                                      "guardrail": exc.guardrail, "why": str(exc)})
            return "blocked"
        if isinstance(res, ActionResult):
            self.effects.pop((kind, tgt), None)  # a failed undo keeps it: a restart undoes it again
            self.journal.append("result", action_id=aid, incident_id=inc.id, playbook=book.name, action=kind,
                                target=tgt, result="undone", detail={"phase": "undo", "apply_action_id": apply_id,
                                                                     "message": res.message, "after": res.after,
                                                                     "skipped": res.skipped,
                                                                     "intent_on_disk": on_disk})
            self._count(book.name, kind, "undone")
            return "undone"
        self.journal.append("result", action_id=aid, incident_id=inc.id, playbook=book.name, action=kind, target=tgt,
                            result="failed", detail={"phase": "undo", "apply_action_id": apply_id, "error": res})
        self._count(book.name, kind, "failed")
        return "failed"

    # -- views -------------------------------------------------------------------

    def incidents_view(self) -> dict[str, Any]:
        now = self.clock()
        return {"open": [i.as_dict(now) for i in self.incidents.open_incidents()],
                "recent": [i.as_dict(now) for i in self.incidents.recent()][-50:],
                "pending_approvals": self.pending_view(),
                "breaker_open": self.guard.breaker_open or self.rack.breaker_open(), "mode": self.mode,
                "maintenance": self.maintenance.view()}

    def pending_view(self) -> list[dict[str, Any]]:
        """This agent's pending steps, then the rack's (etcd) that the leader waits on elsewhere."""
        local = [dict(p.as_dict(), **({"rack_id": p.rack_id} if p.rack_id else {})) for p in self.pending.values()]
        mine = {p.get("rack_id") for p in local}
        return local + [r for r in self.rack.pending_view() if r["id"] not in mine]

    def count_webhook(self, result: str) -> None:
        self.webhook_total[result] = self.webhook_total.get(result, 0) + 1

    def count_webhook_ignored(self, reason: str) -> None:
        self.webhook_ignored[reason] = self.webhook_ignored.get(reason, 0) + 1

    def collector(self):
        from .metrics import RemediationCollector
        return RemediationCollector(self)
