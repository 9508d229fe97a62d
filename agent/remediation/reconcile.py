"""Reconcile and undo: what the journal says was begun, checked against the devices; effects taken back.

Why apart from the step runner: these paths run at start (intents without a result, read from the real
device: applied, not applied or unknown) and when an incident clears (each effect undone by the agent that
holds it, in the playbook's undo order, with its own approvals); they share the effects table with the step
runner and nothing else. Part of RemediationEngine (agent/remediation/engine.py), which holds the state.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from .actions import ActionError, ActionResult, parse_target
from .incidents import Incident
from .ownership import flip_for_undo, planned_after, rebuild_effects, verdict_result
from .playbooks import Playbook, Step
from .steps import action_id

log = logging.getLogger("supernode.remediation")


class Reconciler:
    """Part of RemediationEngine: see the module docstring."""

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

    async def run_undo(self, inc: Incident, book: Playbook) -> None:
        await self.replans_settled(inc.id)  # a derate's re-plan in flight lands first, then is undone with the rest
        for idx in book.undo_sequence():
            step = book.steps[idx]
            if not step.undo:
                continue
            todo = [(kind, tgt, eff, eff["holders"][inc.id]) for (kind, tgt), eff in list(self.effects.items())
                    if kind == step.action and eff["holders"].get(inc.id) == action_id(inc.id, idx, tgt)]
            await asyncio.gather(*(self.undo_one(inc, book, idx, step, kind, tgt, eff, aid)
                                   for kind, tgt, eff, aid in todo))

    def _keep(self, inc: Incident, book: Playbook, kind: str, tgt: str, eff: dict[str, Any], aid: str,
              apply_id: str) -> str:
        """Another open incident holds this effect too: it stays, and that incident's undo decides."""
        others = [i for i in eff["holders"] if i != inc.id]
        eff["holders"].pop(inc.id, None)
        self.journal.append("result", action_id=aid, incident_id=inc.id, playbook=book.name, action=kind,
                            target=tgt, result="kept", detail={"phase": "undo", "apply_action_id": apply_id,
                                                               "held_by": others})
        return "kept"

    async def undo_one(self, inc: Incident, book: Playbook, idx: int, step: Step, kind: str, tgt: str,
                       eff: dict[str, Any], apply_id: str) -> str:
        aid = action_id(inc.id, idx, tgt, "undo")
        if any(i != inc.id for i in eff["holders"]):
            return self._keep(inc, book, kind, tgt, eff, aid, apply_id)
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

        async def health(key: str | None) -> str | None:
            """The resume health check (resume.py): a failed one asks a person when nobody else would."""
            if not (step.resume_check and kind == "drain"):
                return key
            passed, why = await self.resume_check.run(target["node"])
            self.journal.append("health_check", action_id=aid, incident_id=inc.id, playbook=book.name, action=kind,
                                target=tgt, result="passed" if passed else "failed",
                                detail={"check": self.settings.resume_health_check, "why": why})
            return "resume_after_check" if not passed and key is None else key

        if book.leak_scope is not None:  # after a leak: the scope dry for the hold, then a person (leak_resume.py)
            gate = await self.leak_undo_gate(inc, book, step, aid, tgt, eff, approval, health)
            if gate == "kept":
                return self._keep(inc, book, kind, tgt, eff, aid, apply_id)
            if gate != "go":
                self._block(inc, book, step, aid, tgt, "approval", f"undo not approved ({approval}) after the dry "
                            "hold: expired, rejected or the agent stopped", phase="undo")
                return "blocked"
        else:
            approval = await health(approval)
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
