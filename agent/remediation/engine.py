"""The remediation engine: detectors -> incidents -> playbooks -> guarded, journaled actions.

Why one object holding the state, in parts by job: the order matters and must hold under crashes and
concurrency, so the incidents, the pending approvals, the effects held for undo and the journal live in one
place (this class), while each job is written in a module of its own that the class is made of:

- `lifecycle.py` (IncidentLifecycle): detection on each snapshot, incidents opened and closed, playbooks started;
- `step_runner.py` (StepRunner): every step on each target, through the guardrails, intent before the write;
- `approvals.py` (ApprovalDesk): steps waiting for a person, approved here or rack-wide, with who approved;
- `reconcile.py` (Reconciler): intents without a result checked against the devices at start; undo;
- `targets.py` (TargetResolver): which devices a step acts on (own node, leader, degraded).

`start()` reconciles unfinished intents against real device state before anything else; `on_snapshot` only
hands work to the asyncio loop (it runs on the publishing source's thread); each playbook runs as a task;
every decision (done, dry-run, blocked and by which guardrail, failed, undone) lands in the journal before it
is counted in metrics. What it acts through (`Executors`) is typed in `executors.py`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path
from typing import Any, Callable

from agent.goodput_metrics import OutOfServiceTracker

from .approvals import AmbiguousApproval, ApprovalDesk, Pending  # noqa: F401  (re-exported)
from .decisions import LoggedJournal
from .detectors import Context, Detectors
from .executors import Executors  # noqa: F401  (re-exported: the runtime builds it)
from .guardrails import MONOTONIC, Guardrails
from .incidents import DURATION_BUCKETS, Incident, IncidentBook
from .journal import Journal, Retention
from .lifecycle import IncidentLifecycle
from .maintenance import Maintenance
from .playbooks import Playbook, load_playbooks
from .reconcile import Reconciler
from .recovery_ledger import RecoveryLedger
from .restored import seed_restored
from .resume import ResumeCheck
from .settings import RemediationSettings
from .step_runner import COORDINATION_LOST, SHARED_TARGETS, UNFENCED, StepRunner  # noqa: F401  (re-exported)
from .steps import action_id, error_text  # noqa: F401  (action_id: re-exported)
from .targets import TargetResolver

log = logging.getLogger("supernode.remediation")
UNKNOWN_RECHECK_SECONDS = 5.0  # how often an action reconciled as `unknown` is read again
MODES = ("observe", "dry-run", "enforce")


class RemediationEngine(IncidentLifecycle, StepRunner, ApprovalDesk, Reconciler, TargetResolver):
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
        self.recoveries = RecoveryLedger()  # what gpu_reset / node_reboot steps did: the GPU fault judge reads it
        self.detectors = Detectors(settings.detectors, Context(
            node=identity.node, rack=identity.rack, expected_gpus=inventory.gpus.count,
            power_budget_watts=inventory.power_budget_watts,
            outlet_feeds={(p.name, o): n for p in inventory.pdus for o, n in p.outlets.items()},
            recoveries=self.recoveries, xid_overrides=settings.xid_overrides,
            leads=lambda: self.rack.is_leader()), clock)
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
        self.out_of_service = OutOfServiceTracker(identity.node, clock)  # goodput counters (agent.goodput)

    # -- construction ------------------------------------------------------------

    def _build_actions(self) -> dict[str, Any]:
        from .actions.device_adapters import CduWriteAction, IsolateLinkAction, PduOutletAction, TrayPowerAction
        from .actions.drain import DrainAction
        from .actions.exec import ExecAction
        from .actions.gpu_power_cap import GpuPowerCapAction
        from .actions.gpu_reset import GpuResetAction
        from .actions.job_notify import JobNotifyAction
        from .actions.node_reboot import NodeRebootAction
        from .actions.notify import NotifyAction

        ex, s = self.executors, self.settings
        acts: dict[str, Any] = {
            "gpu_power_cap": GpuPowerCapAction(ex.gpu_libs, s.device_timeout_seconds),
            "exec": ExecAction(s.exec_allow),
        }
        if ex.gpu_libs:  # the recovery ladder's reset rung: only where this agent reads its node's GPUs
            acts["gpu_reset"] = GpuResetAction(ex.gpu_libs, s.gpu_recovery, s.device_timeout_seconds,
                                               ex.gpu_reset_command)
        if s.notify_url:  # without a URL, notify steps are journaled as result not_configured (not a block)
            acts["notify"] = NotifyAction(s.notify_url, s.notify_timeout_seconds)
        if ex.scheduler is not None:
            acts["drain"] = DrainAction(ex.scheduler, s.slurm.checkpoint_signal)
            rec = s.gpu_recovery  # the ladder's Slurm steps; a reboot is proven by the NVML health read after it
            acts["job_notify"] = JobNotifyAction(ex.scheduler, rec.job_notify)
            acts["node_reboot"] = NodeRebootAction(ex.scheduler, lambda node: self.resume_check.gpus_healthy(node),
                                                   rec.reboot_timeout_seconds, rec.verify_seconds,
                                                   checkpoint_signal=s.slurm.checkpoint_signal)
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
        self.journal.on_append = self.out_of_service.feed  # before the read: a row in both counts once (seq)
        entries = await asyncio.to_thread(self.journal.entries)
        self._rebuild_effects(entries)
        self.out_of_service.load(entries)
        restored = await asyncio.to_thread(self.incidents.restore)
        await asyncio.to_thread(self.maintenance.restore)
        self.maintenance.publish_all()  # rack-wide: what a person set here holds on every agent
        # Resume the world, not only the journal: restored incidents are active in the fresh detectors,
        # so the first snapshots that no longer show their condition clear (and undo) them.
        seed_restored(self.detectors, self.incidents.open_incidents())
        self.journal.append("engine", result="started", detail={"mode": self.mode, "restored_incidents": restored,
                                                             "node": self.identity.node, "rack": self.identity.rack})
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

    # -- detection ---------------------------------------------------------------

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

    # -- playbooks ---------------------------------------------------------------

    def _count_repair(self, cls: str, seconds: float) -> None:
        buckets, total, count = self.repairs.get(cls, ([0] * len(DURATION_BUCKETS), 0.0, 0))
        for i, b in enumerate(DURATION_BUCKETS):
            if seconds <= b:
                buckets[i] += 1
        self.repairs[cls] = (buckets, total + seconds, count + 1)

    def _count(self, book: str, action: str, result: str) -> None:
        key = (book, action, result)
        self.actions_total[key] = self.actions_total.get(key, 0) + 1

    def _xid_active(self, node: str) -> bool:
        """A GPU of the node has an outstanding fault (reset, reboot or service) the ladder has not proven recovered."""
        return self.detectors.gpu_faults.node_fault(node) is not None

    def gpu_faults_view(self) -> dict[str, dict[str, Any]]:
        """Per "node/gpu": last XID with its catalogue text, recommended class and rule, last recovery (status page)."""
        return self.detectors.gpu_faults.view()

    def reset_breaker(self, who: str = "api") -> bool:
        was = self.guard.reset_breaker()
        if self.rack.shared and self.loop is not None:
            self._spawn(self.rack.reset_breaker(who))
        self.journal.append("breaker", result="reset", detail={"by": who, "was_open": was})
        return was

    # -- views -------------------------------------------------------------------

    def incidents_view(self) -> dict[str, Any]:
        now = self.clock()
        return {"open": [i.as_dict(now) for i in self.incidents.open_incidents()],
                "recent": [i.as_dict(now) for i in self.incidents.recent()][-50:],
                "pending_approvals": self.pending_view(),
                "breaker_open": self.guard.breaker_open or self.rack.breaker_open(), "mode": self.mode,
                "maintenance": self.maintenance.view()}

    def count_webhook(self, result: str) -> None:
        self.webhook_total[result] = self.webhook_total.get(result, 0) + 1

    def count_webhook_ignored(self, reason: str) -> None:
        self.webhook_ignored[reason] = self.webhook_ignored.get(reason, 0) + 1

    def collector(self):
        from .metrics import RemediationCollector
        return RemediationCollector(self)
